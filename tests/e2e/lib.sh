# Shared by the end-to-end scripts (sourced): a scratch folder, processes
# killed on exit, check reporting, and waiting for a process's start line.
# Needs LAZYKV_DEFAULT_MODEL; exits 77 (skipped) without it.
[ -f "${LAZYKV_DEFAULT_MODEL:-}" ] || { echo "skipped: LAZYKV_DEFAULT_MODEL is not set"; exit 77; }
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
  rm -rf "$work"
}
trap cleanup EXIT
failures=0
pass() { echo "ok: $*"; }
fail() { echo "FAILED: $*" >&2; failures=$((failures + 1)); }
check() { local what=$1; shift; if "$@"; then pass "$what"; else fail "$what"; fi; }
# HTTP status of a curl request; the body goes to $work/body.
status_of() { curl -s --max-time 120 -o "$work/body" -w '%{http_code}' "$@"; }
# A Python expression over the JSON on stdin (as d).
# ready_becomes URL CODE [TENTHS]: GET URL/ready until it answers CODE (default: up to 30 s).
ready_becomes() {
  local i
  for ((i = 0; i < ${3:-300}; i++)); do
    [ "$(status_of "$1/ready")" = "$2" ] && return 0
    sleep 0.1
  done
  return 1
}
json_get() { /usr/bin/python3 -c "import json,sys; d=json.load(sys.stdin); print(eval(sys.argv[1], {'d': d}))" "$1"; }

# Waits for a line matching $2 in log $1 while process $3 lives; prints the match.
wait_for_line() {
  local log=$1 pattern=$2 pid=$3 found=""
  for _ in $(seq 1 600); do
    found=$(grep -o "$pattern" "$log" | head -1)
    [ -n "$found" ] && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  echo "$found"
}

# start_http NAME ARGS...: `$bin ARGS` (a lazykv command that serves HTTP) in
# the background, logging to $work/NAME.<random>.log, until it listens; sets
# $url (http://HOST:PORT), $http_pid and $http_log. Exits, failing the test
# with its log, if it does not start.
start_http() {
  local name=$1
  shift
  http_log=$work/$name.$RANDOM.log
  "$bin" "$@" >"$http_log" 2>&1 &
  http_pid=$!
  pids+=("$http_pid")
  url=$(wait_for_line "$http_log" 'listening on http://[0-9.:]*' "$http_pid")
  url=${url#listening on }
  [ -n "$url" ] || { cat "$http_log" >&2; echo "FAILED: $name did not start" >&2; exit 1; }
}

# start_kvstore BIN HOST_MIB [FLAGS...]: a `lazykv kvstore` on loopback (tcp,
# 4 KiB allocation unit, /metrics on a free port); sets $kv_pid, $kv_port,
# $kv_metrics (the URL) and $kv_log.
start_kvstore() {
  local bin=$1 host_mib=$2 line
  shift 2
  kv_log=$work/kvstore.$RANDOM.log
  "$bin" kvstore --listen 127.0.0.1:0 --metrics-port 0 --host-capacity-mib "$host_mib" --alloc-unit-kib 4 \
    --transports tcp --peer-timeout-ms 1500 "$@" >"$kv_log" 2>&1 &
  kv_pid=$!
  pids+=("$kv_pid")
  line=$(wait_for_line "$kv_log" 'control (gRPC) on [0-9.]*:[0-9]*' "$kv_pid")
  [ -n "$line" ] || { cat "$kv_log" >&2; echo "FAILED: the kvstore did not start" >&2; exit 1; }
  kv_port=${line##*:}
  kv_metrics=$(wait_for_line "$kv_log" 'http://[0-9.:]*/metrics' "$kv_pid")
}
# The value of one series (exact name with labels) of the kvstore's /metrics.
kv_metric() { curl -sf "$kv_metrics" | awk -v m="$1" '$1 == m {print $2}'; }
