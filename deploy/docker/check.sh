#!/usr/bin/env bash
# Builds the container image (deploy/docker/Dockerfile) and checks that it
# serves: /health, /v1/models, a greedy chat completion, and a drain that
# exits 0 on SIGTERM. Uses docker where a daemon answers, else buildah (no
# daemon: chroot isolation, vfs storage, the host's network).
#
#   deploy/docker/check.sh [--tag lazykv:check] [--port 18000]
#
# LAZYKV_EXTRA_CA: a PEM bundle passed as the build secret extra_ca (the CA
# of a TLS-inspecting proxy between the build and PyPI).
#
# Not part of ctest: building the image compiles the project from scratch
# (about 15 minutes on 2 cores).
set -euo pipefail
cd "$(dirname "$0")/../.."
tag=lazykv:check
port=18000
while (($#)); do
  case $1 in
    --tag) tag=$2; shift 2 ;;
    --port) port=$2; shift 2 ;;
    *) echo "usage: $0 [--tag TAG] [--port PORT]" >&2; exit 2 ;;
  esac
done
log() { printf '[docker-check] %s\n' "$*" >&2; }
die() { printf '[docker-check] FAIL: %s\n' "$*" >&2; exit 1; }
secret=()
[ -z "${LAZYKV_EXTRA_CA:-}" ] || secret=(--secret "id=extra_ca,src=$LAZYKV_EXTRA_CA")
! curl -s -o /dev/null "http://127.0.0.1:$port/" || die "port $port is already in use (--port)"
server_log=$(mktemp -t lazykv-docker-check.XXXXXX)

if docker info >/dev/null 2>&1; then
  engine=docker
  DOCKER_BUILDKIT=1 docker build "${secret[@]}" -f deploy/docker/Dockerfile -t "$tag" .
  cid=$(docker run -d -p "127.0.0.1:$port:8000" "$tag")
  cleanup() { docker rm -f "$cid" >/dev/null 2>&1 || true; }
  in_image() { docker exec "$cid" "$@"; }
  # docker stop sends SIGTERM (the image's STOPSIGNAL), then waits.
  stop() {
    docker stop -t 45 "$cid" >/dev/null
    docker logs "$cid" >"$server_log" 2>&1
    [ "$(docker inspect -f '{{.State.ExitCode}}' "$cid")" = 0 ]
  }
else
  command -v buildah >/dev/null || die "neither a docker daemon nor buildah (Debian package buildah)"
  engine=buildah
  b=(buildah --storage-driver vfs)
  "${b[@]}" bud --isolation chroot --layers=false "${secret[@]}" -f deploy/docker/Dockerfile -t "$tag" .
  ctr=$("${b[@]}" from "$tag")
  # buildah run keeps the image's user, environment and working directory
  # and runs the image's command, `lazykv serve`; as with `docker run -e`,
  # the environment moves it to loopback and --port.
  "${b[@]}" run --isolation chroot --env LAZYKV_HOST=127.0.0.1 --env "LAZYKV_PORT=$port" "$ctr" -- lazykv serve \
    >"$server_log" 2>&1 &
  server=$!
  # The lazykv process that `buildah run` started (a few processes down).
  lazykv_pid() {
    local pid p
    for pid in $(pgrep -f '^/usr/local/bin/lazykv serve$'); do
      p=$pid
      while [ "${p:-1}" -gt 1 ]; do
        [ "$p" = "$server" ] && { echo "$pid"; return 0; }
        p=$(awk '{print $4}' "/proc/$p/stat" 2>/dev/null)
      done
    done
    return 1
  }
  cleanup() {
    local pid
    pid=$(lazykv_pid) && kill -KILL "$pid" 2>/dev/null
    "${b[@]}" rm "$ctr" >/dev/null 2>&1 || true
  }
  in_image() { "${b[@]}" run --isolation chroot "$ctr" -- "$@"; }
  # SIGTERM to lazykv itself (buildah run answers a signal by killing its
  # child, which would not test the drain); buildah's own exit status is not
  # lazykv's, so the drain is read from the server's last words.
  stop() {
    local pid
    pid=$(lazykv_pid) || return 1
    kill -TERM "$pid"
    for _ in $(seq 45); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 1
    done
    ! kill -0 "$pid" 2>/dev/null && grep -aq 'stopped (all requests finished)' "$server_log"
  }
fi
trap 'cleanup; rm -f "$server_log"' EXIT
log "built $tag with $engine; waiting for the server"
for _ in $(seq 120); do
  curl -fsS "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break
  sleep 1
done
curl -fsS "http://127.0.0.1:$port/health" >/dev/null || die "no /health within 120 s: $(tail -c 400 "$server_log")"
if [ "$engine" = docker ]; then
  in_image curl -fsS http://127.0.0.1:8000/health >/dev/null || die "the image's health check fails"
fi
models=$(curl -fsS "http://127.0.0.1:$port/v1/models")
grep -q '"SmolLM2-135M-Instruct.Q4_1"' <<<"$models" || die "/v1/models: $models"
answer=$(curl -fsS "http://127.0.0.1:$port/v1/chat/completions" -H 'Content-Type: application/json' \
  -d '{"model": "SmolLM2-135M-Instruct.Q4_1", "messages": [{"role": "user", "content": "What is the capital of France?"}], "max_tokens": 16, "temperature": 0}')
grep -q 'Paris' <<<"$answer" || die "chat completion: $answer"
in_image lazykv worker --help >/dev/null || die "lazykv worker does not run in the image"
stop || die "the server did not drain and exit 0 on SIGTERM: $(tail -c 400 "$server_log")"
log "ok: $tag serves /health, /v1/models and a greedy chat completion, and drains on SIGTERM"
