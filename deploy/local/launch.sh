#!/usr/bin/env bash
# A whole lazykv deployment on one machine, on loopback: optionally a kvstore
# (host + NVMe KV tiers), N worker ranks (tensor parallel over Gloo, or
# NCCL with --collective nccl, when N > 1), and a coordinator (HTTP API, tokenizer, scheduler); with
# --replicas R, R such groups (each its ranks and coordinator, the kvstore shared) behind a `lazykv router`.
# Waits until all are ready, prints the URL, and forwards SIGTERM/SIGINT (the router and coordinators
# drain first, then the workers and the kvstore stop). If any process exits,
# the others are stopped and the launcher exits non-zero.
#
#   deploy/local/launch.sh [--bin PATH] [--model M] [--world N] [--replicas R] [--collective gloo|nccl] [--kvstore]
#                          [--nvme-path DIR] [--worker-port P] [--http-port P] [--threads N] [--kv-cache-mib N]
#                          [--prefix-cache-mib N] [-- extra coordinator flags]
#
# --world N       worker ranks per group (default 1); each gets --threads / (N * R) threads when --threads > 0
# --replicas R    groups behind a router (default 1: no router); the router listens on --http-port, the
#                 coordinators on free ports, group g's rank r on --worker-port + g * N + r
# --collective C  the ranks' all-reduce: gloo (default) or nccl (rank r on CUDA device r mod devices)
# --kvstore       start a kvstore and point the workers at it (lazy+tiers demotes there)
# --nvme-path DIR the kvstore's RocksDB tier (default: none)
# --prefix-cache-mib N  prompt KV reuse in each worker rank (docs/tiers.md)
# Environment (flags win): LAZYKV_BIN (default: lazykv on PATH, else build/cli/lazykv),
# LAZYKV_MODEL (default "default"), LAZYKV_WORKER_PORT (7001: rank r listens on 7001 + r),
# LAZYKV_HTTP_PORT (8000), LAZYKV_THREADS (0: all cores), LAZYKV_KV_CACHE_MIB (1024).
# Port 0 picks free ports.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bin=${LAZYKV_BIN:-$(command -v lazykv || echo "$here/../../build/cli/lazykv")}
model=${LAZYKV_MODEL:-default}
worker_port=${LAZYKV_WORKER_PORT:-7001}
http_port=${LAZYKV_HTTP_PORT:-8000}
threads=${LAZYKV_THREADS:-0}
kv_mib=${LAZYKV_KV_CACHE_MIB:-1024}
world=1
replicas=1
collective=gloo
with_kvstore=0
nvme_path=""
prefix_mib=0
extra=()
while [ $# -gt 0 ]; do
  case $1 in
    --bin) bin=$2; shift 2 ;;
    --model) model=$2; shift 2 ;;
    --world) world=$2; shift 2 ;;
    --replicas) replicas=$2; shift 2 ;;
    --collective) collective=$2; shift 2 ;;
    --kvstore) with_kvstore=1; shift ;;
    --nvme-path) nvme_path=$2; shift 2 ;;
    --worker-port) worker_port=$2; shift 2 ;;
    --http-port) http_port=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --kv-cache-mib) kv_mib=$2; shift 2 ;;
    --prefix-cache-mib) prefix_mib=$2; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "launch.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[ -x "$bin" ] || { echo "launch.sh: no lazykv binary at '$bin' (set --bin or LAZYKV_BIN)" >&2; exit 2; }
[[ "$world" =~ ^[1-9][0-9]*$ ]] || { echo "launch.sh: --world must be a positive integer" >&2; exit 2; }
[[ "$replicas" =~ ^[1-9][0-9]*$ ]] || { echo "launch.sh: --replicas must be a positive integer" >&2; exit 2; }
[[ "$prefix_mib" =~ ^[0-9]+$ ]] || { echo "launch.sh: --prefix-cache-mib must be a whole number" >&2; exit 2; }

logs=$(mktemp -d -t lazykv-launch.XXXXXX)
router_pid=""
coord_pids=()
worker_pids=()
kvstore_pid=""
stop_all() {
  [ -n "$router_pid" ] && kill -TERM "$router_pid" 2>/dev/null && wait "$router_pid" 2>/dev/null
  for p in "${coord_pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
  for p in "${coord_pids[@]}"; do wait "$p" 2>/dev/null; done
  for p in "${worker_pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
  for p in "${worker_pids[@]}"; do wait "$p" 2>/dev/null; done
  [ -n "$kvstore_pid" ] && kill -TERM "$kvstore_pid" 2>/dev/null && wait "$kvstore_pid" 2>/dev/null
}
on_signal() {
  echo "launch.sh: stopping (router and coordinators drain, then the workers and the kvstore stop)" >&2
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
fail_start() { echo "launch.sh: $1 did not start (log: $2)" >&2; stop_all; exit 1; }

worker_flags=()
if [ "$with_kvstore" = 1 ]; then
  nvme_flags=()
  [ -n "$nvme_path" ] && nvme_flags=(--nvme-path "$nvme_path")
  "$bin" kvstore --listen 127.0.0.1:0 "${nvme_flags[@]}" > >(tee "$logs/kvstore.log") 2>&1 &
  kvstore_pid=$!
  line=$(wait_for_line "$logs/kvstore.log" 'control (gRPC) on [0-9.]*:[0-9]*' "$kvstore_pid")
  [ -n "$line" ] || fail_start "the kvstore" "$logs/kvstore.log"
  worker_flags=(--kvstore "127.0.0.1:${line##*:}")
fi

rank_threads=$threads
ranks_in_all=$((world * replicas))
[ "$threads" -gt 0 ] && [ "$ranks_in_all" -gt 1 ] && rank_threads=$(( threads / ranks_in_all > 0 ? threads / ranks_in_all : 1 ))
[ "$world" -gt 1 ] && worker_flags+=(--world "$world" --collective "$collective")  # the coordinator forms the group

# start_group G PORT: group G's worker ranks and its coordinator on HTTP port PORT; appends to
# worker_pids and coord_pids and sets group_url.
start_group() {
  local g=$1 rank port line first=${#worker_pids[@]}
  local coord_workers=()
  for ((rank = 0; rank < world; rank++)); do
    port=$worker_port
    [ "$worker_port" != 0 ] && port=$((worker_port + g * world + rank))
    "$bin" worker --model "$model" --listen "127.0.0.1:$port" --threads "$rank_threads" --kv-cache-mib "$kv_mib" \
      --prefix-cache-mib "$prefix_mib" --rank "$rank" "${worker_flags[@]}" > >(tee "$logs/group$g.worker$rank.log") 2>&1 &
    worker_pids+=($!)
  done
  for ((rank = 0; rank < world; rank++)); do
    line=$(wait_for_line "$logs/group$g.worker$rank.log" 'listening on [0-9.]*:[0-9]*' "${worker_pids[$((first + rank))]}")
    [ -n "$line" ] || fail_start "group $g's worker rank $rank" "$logs/group$g.worker$rank.log"
    coord_workers+=(--worker "127.0.0.1:${line##*:}")
  done
  "$bin" coordinator --model "$model" "${coord_workers[@]}" --port "$2" "${extra[@]}" \
    > >(tee "$logs/group$g.coordinator.log") 2>&1 &
  coord_pids+=($!)
  group_url=$(wait_for_line "$logs/group$g.coordinator.log" 'listening on http://[0-9.:]*' "${coord_pids[-1]}")
  [ -n "$group_url" ] || fail_start "group $g's coordinator" "$logs/group$g.coordinator.log"
  group_url=${group_url#listening on }
}

if [ "$replicas" = 1 ]; then
  start_group 0 "$http_port"
  url=$group_url
else
  # A slot per sequence of a group's batch: nothing queues inside a group that may die.
  max_batch=32
  for ((i = 0; i < ${#extra[@]}; i++)); do
    case ${extra[$i]} in
      --max-batch) max_batch=${extra[$((i + 1))]:-32} ;;
      --max-batch=*) max_batch=${extra[$i]#--max-batch=} ;;
    esac
  done
  router_flags=(--max-requests-per-replica "$max_batch")
  for ((g = 0; g < replicas; g++)); do
    start_group "$g" 0
    router_flags+=(--replica "${group_url#http://}")
  done
  "$bin" router "${router_flags[@]}" --port "$http_port" > >(tee "$logs/router.log") 2>&1 &
  router_pid=$!
  url=$(wait_for_line "$logs/router.log" 'listening on http://[0-9.:]*' "$router_pid")
  [ -n "$url" ] || fail_start "the router" "$logs/router.log"
  url=${url#*listening on }
fi
echo "lazykv is ready: $url ($replicas group(s) of $world worker rank(s)$([ "$with_kvstore" = 1 ] && echo ", a kvstore")$([ -n "$router_pid" ] && echo " behind a router"); logs in $logs)"

# Any process ending on its own is a failure: stop the others.
watched=("${coord_pids[@]}" "${worker_pids[@]}")
[ -n "$router_pid" ] && watched+=("$router_pid")
[ -n "$kvstore_pid" ] && watched+=("$kvstore_pid")
wait -n "${watched[@]}"
echo "launch.sh: a process exited unexpectedly; stopping the others" >&2
stop_all
exit 1
