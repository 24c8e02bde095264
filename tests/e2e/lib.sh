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
