#!/usr/bin/env bash
# lazykv on one machine as two processes: a worker (the model) and a
# coordinator (HTTP API, tokenizer, scheduler) on loopback. Waits until both
# are ready, prints the URL, and forwards SIGTERM/SIGINT to both (the
# coordinator drains first, then the worker stops). If either process exits,
# the other is stopped and the launcher exits non-zero.
#
#   deploy/local/launch.sh [--bin PATH] [--model M] [--worker-port P] [--http-port P]
#                          [--threads N] [--kv-cache-mib N] [-- extra coordinator flags]
#
# Environment (flags win): LAZYKV_BIN (default: lazykv on PATH, else build/cli/lazykv),
# LAZYKV_MODEL (default "default"), LAZYKV_WORKER_PORT (7001), LAZYKV_HTTP_PORT (8000),
# LAZYKV_THREADS (0: all cores), LAZYKV_KV_CACHE_MIB (1024). Port 0 picks a free port.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bin=${LAZYKV_BIN:-$(command -v lazykv || echo "$here/../../build/cli/lazykv")}
model=${LAZYKV_MODEL:-default}
worker_port=${LAZYKV_WORKER_PORT:-7001}
http_port=${LAZYKV_HTTP_PORT:-8000}
threads=${LAZYKV_THREADS:-0}
kv_mib=${LAZYKV_KV_CACHE_MIB:-1024}
extra=()
while [ $# -gt 0 ]; do
  case $1 in
    --bin) bin=$2; shift 2 ;;
    --model) model=$2; shift 2 ;;
    --worker-port) worker_port=$2; shift 2 ;;
    --http-port) http_port=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --kv-cache-mib) kv_mib=$2; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "launch.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[ -x "$bin" ] || { echo "launch.sh: no lazykv binary at '$bin' (set --bin or LAZYKV_BIN)" >&2; exit 2; }

logs=$(mktemp -d -t lazykv-launch.XXXXXX)
worker_pid=""
coord_pid=""
stop_all() {
  [ -n "$coord_pid" ] && kill -TERM "$coord_pid" 2>/dev/null && wait "$coord_pid" 2>/dev/null
  [ -n "$worker_pid" ] && kill -TERM "$worker_pid" 2>/dev/null && wait "$worker_pid" 2>/dev/null
}
on_signal() {
  echo "launch.sh: stopping (coordinator drains, then the worker stops)" >&2
  stop_all
  exit 0
}
trap on_signal TERM INT

# Waits for a line matching $2 in $1 while $3 runs; prints it.
wait_for_line() {
  local found=""
  for _ in $(seq 1 1200); do
    found=$(grep -o "$2" "$1" | head -1)
    [ -n "$found" ] && break
    kill -0 "$3" 2>/dev/null || break
    sleep 0.1
  done
  echo "$found"
}

"$bin" worker --model "$model" --listen "127.0.0.1:$worker_port" --threads "$threads" --kv-cache-mib "$kv_mib" \
  > >(tee "$logs/worker.log") 2>&1 &
worker_pid=$!
line=$(wait_for_line "$logs/worker.log" 'listening on [0-9.]*:[0-9]*' "$worker_pid")
[ -n "$line" ] || { echo "launch.sh: the worker did not start (log: $logs/worker.log)" >&2; stop_all; exit 1; }
worker_port=${line##*:}

"$bin" coordinator --model "$model" --worker "127.0.0.1:$worker_port" --port "$http_port" "${extra[@]}" \
  > >(tee "$logs/coordinator.log") 2>&1 &
coord_pid=$!
url=$(wait_for_line "$logs/coordinator.log" 'listening on http://[0-9.:]*' "$coord_pid")
[ -n "$url" ] || { echo "launch.sh: the coordinator did not start (log: $logs/coordinator.log)" >&2; stop_all; exit 1; }
url=${url#listening on }
echo "lazykv is ready: $url (worker 127.0.0.1:$worker_port; logs in $logs)"

# Either process ending on its own is a failure: stop the other.
wait -n "$worker_pid" "$coord_pid"
echo "launch.sh: a process exited unexpectedly; stopping the other" >&2
stop_all
exit 1
