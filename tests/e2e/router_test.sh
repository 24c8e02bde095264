#!/usr/bin/env bash
# End to end: two `lazykv serve` replicas behind `lazykv router` on loopback.
# 200 chat requests over 20 long shared prefixes: all answered, both replicas
# used, most requests of a prefix land on the replica that served it first
# (whose prefix cache then holds the prefix).
# Then SIGKILL one replica under load: nothing hangs, the requests waiting in
# the router finish on the other replica, the ones in flight on the dead one
# end with a clear 502, the router reports it down within seconds, and up
# again once it restarts on the same port.
#   usage: router_test.sh LAZYKV_BINARY
# Needs LAZYKV_DEFAULT_MODEL (set by scripts/test.sh); exits 77 (skipped) without it.
set -uo pipefail
bin=$1
source "$(dirname "$0")/lib.sh"
load=$(dirname "$0")/router_load.py
slots=4  # each replica's --max-batch and the router's --max-requests-per-replica

# start_replica I PORT: a `lazykv serve` (PORT 0: any); sets replica_pid[I], replica_port[I].
declare -a replica_pid replica_port
start_replica() {
  local url  # start_http sets this one (the replica's); the script's $url (the router's) stays
  start_http "replica$1" serve --model "$LAZYKV_DEFAULT_MODEL" --port "$2" --threads 1 --kv-cache-mib 128 \
    --prefix-cache-mib 16 --max-batch $slots
  replica_pid[$1]=$http_pid
  replica_port[$1]=${url##*:}
}
# replica_state I FIELD: a field of replica I in the router's /router/replicas.
replica_state() { curl -s --max-time 5 "$url/router/replicas" | json_get "d['replicas'][$1]['$2']"; }
# becomes I FIELD VALUE [TENTHS]: polls replica_state until it equals VALUE (default: up to 10 s).
becomes() {
  local i
  for ((i = 0; i < ${4:-100}; i++)); do
    [ "$(replica_state "$1" "$2")" = "$3" ] && return 0
    sleep 0.1
  done
  return 1
}

start_replica 0 0
start_replica 1 0
start_http router router --replica "127.0.0.1:${replica_port[0]}" --replica "127.0.0.1:${replica_port[1]}" --port 0 \
  --max-requests-per-replica $slots --affinity-wait-ms 2000 --health-interval-ms 300
router_pid=$http_pid router_log=$http_log
pass "router at $url over replicas on ports ${replica_port[*]}"
check "the router is ready once a replica is up" ready_becomes "$url" 200
check "both replicas are up" becomes 1 up True
model=$(curl -sf "$url/v1/models" | json_get "d['data'][0]['id']")
check "GET /v1/models through the router names a model ($model)" test -n "$model"

# A streamed answer is relayed as it arrives, not held until its end.
stream_timing=$(/usr/bin/python3 - "$url" "$model" <<'PY'
import json, sys, time, urllib.request
url, model = sys.argv[1], sys.argv[2]
body = {"model": model, "prompt": "Once upon a time", "max_tokens": 48, "ignore_eos": True, "stream": True}
start = time.monotonic()
first = None
with urllib.request.urlopen(urllib.request.Request(url + "/v1/completions", json.dumps(body).encode(),
                                                   {"Content-Type": "application/json"}), timeout=120) as r:
    for line in r:
        if first is None and line.startswith(b"data: {"):
            first = time.monotonic() - start
print(f"{first:.3f} {time.monotonic() - start:.3f}")
PY
)
check "a streamed answer's first chunk arrives before half its time (first, end: $stream_timing s)" \
  /usr/bin/python3 -c "import sys; a, b = map(float, sys.argv[1:]); sys.exit(0 if a < b / 2 else 1)" $stream_timing

# --- 200 requests, 20 prefixes -------------------------------------------------
started=$SECONDS
/usr/bin/python3 "$load" "$url" "$model" 200 20 8 2 >"$work/load.json"
echo "   200 requests in $((SECONDS - started)) s"
answered=$(json_get "sum(r['status'] == 200 for r in d['requests'])" <"$work/load.json")
affinity=$(json_get "round(d['affinity'], 3)" <"$work/load.json")
check "200 of 200 requests answered ($answered)" test "$answered" = 200
check "both replicas served requests" test "$(json_get "len(d['replicas'])" <"$work/load.json")" = 2
check "prefix affinity: $affinity of a prefix's requests on its replica (>= 0.8)" \
  /usr/bin/python3 -c "import sys; sys.exit(0 if $affinity >= 0.8 else 1)"
metrics=$(curl -s "$url/metrics")
check "lazykv_router_routes_total counts affinity routes" grep -q 'lazykv_router_routes_total{type="affinity"} [1-9]' <<<"$metrics"
echo "   $(grep '^lazykv_router_routes_total' <<<"$metrics" | tr '\n' ' ')"

# --- SIGKILL a replica under load ------------------------------------------------
timeout 180 /usr/bin/python3 "$load" "$url" "$model" 24 8 12 16 >"$work/kill.json" &
load_pid=$!
for _ in $(seq 1 300); do
  [ "$(replica_state 1 in_flight)" = $slots ] && [ "$(curl -s "$url/router/replicas" | json_get "d['waiting']")" -gt 0 ] && break
  sleep 0.05
done
waiting=$(curl -s "$url/router/replicas" | json_get "d['waiting']")
check "at the kill, replica 1 is full and requests wait in the router ($waiting)" test "$waiting" -gt 0
kill -9 "${replica_pid[1]}"
check "the router reports replica 1 down within 3 s" becomes 1 up False 30
grep -q "lazykv_router_replica_up{replica=\"127.0.0.1:${replica_port[1]}\"} 0" <<<"$(curl -s "$url/metrics")"
check "lazykv_router_replica_up of replica 1 is 0" test $? = 0
wait "$load_pid"
check "the load under the kill finished (nothing hung)" test $? = 0
ok=$(json_get "sum(r['status'] == 200 for r in d['requests'])" <"$work/kill.json")
cut=$(json_get "sum(r['status'] == 502 and 'failed during the request' in r['error'] for r in d['requests'])" <"$work/kill.json")
check "every request answered or ended with a clear 502 ($ok answered, $cut cut)" test $((ok + cut)) = 24
check "at most the $slots requests in flight on the dead replica were cut ($cut)" test "$cut" -le $slots
echo "   $(json_get "next((r['error'] for r in d['requests'] if r['status'] == 502), 'no request was cut')" <"$work/kill.json" | cut -c1-200)"

# --- the replica comes back on its port ----------------------------------------------
start_replica 1 "${replica_port[1]}"
check "the router reports replica 1 up again within 10 s of its restart" becomes 1 up True
served_by_1=0
for i in 1 2 3 4; do
  replica=$(curl -s -o /dev/null -D - --max-time 60 "$url/v1/completions" -H 'Content-Type: application/json' \
    -d '{"model": "'$model'", "prompt": "Hello '$i'", "max_tokens": 2}' | awk -F': ' 'tolower($1) == "x-lazykv-replica" {print $2}' | tr -d '\r')
  [ "$replica" = "127.0.0.1:${replica_port[1]}" ] && served_by_1=$((served_by_1 + 1))
done
check "the restarted replica serves requests again ($served_by_1 of 4)" test "$served_by_1" -gt 0

kill -TERM "$router_pid"
wait "$router_pid"
check "the router stops on SIGTERM with status 0" test $? = 0
[ "$failures" = 0 ] || { echo "--- router log" >&2; tail -20 "$router_log" >&2; }
exit $((failures > 0))
