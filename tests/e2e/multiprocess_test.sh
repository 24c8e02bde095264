#!/usr/bin/env bash
# End to end: `lazykv worker` and `lazykv coordinator` as separate processes on
# loopback, driven with curl, then the failure path: the worker is killed
# (SIGKILL) in the middle of a stream, the stream must end with an error event
# (not hang), new requests must fail fast naming the worker, the
# lazykv_worker_up metric must drop to 0, and a worker restarted on the same
# port must be used again.
#   usage: multiprocess_test.sh LAZYKV_BINARY
# Needs LAZYKV_DEFAULT_MODEL (set by scripts/test.sh); exits 77 (skipped) without it.
set -uo pipefail
bin=$1
source "$(dirname "$0")/lib.sh"
now() { date +%s.%N; }
elapsed_below() { /usr/bin/python3 -c "import sys; sys.exit(0 if float(sys.argv[2]) - float(sys.argv[1]) < float(sys.argv[3]) else 1)" "$@"; }

# start_worker LISTEN [ARGS...]: sets $worker_pid and $worker_port.
start_worker() {
  local log=$work/worker.$RANDOM.log line
  "$bin" worker --model "$LAZYKV_DEFAULT_MODEL" --listen "$1" --threads 2 --kv-cache-mib 256 "${@:2}" >"$log" 2>&1 &
  worker_pid=$!
  pids+=("$worker_pid")
  line=$(wait_for_line "$log" 'listening on [0-9.]*:[0-9]*' "$worker_pid")
  [ -n "$line" ] || { cat "$log" >&2; echo "FAILED: the worker did not start" >&2; exit 1; }
  worker_port=${line##*:}
  worker_log=$log
}

start_worker 127.0.0.1:0
pass "worker listening on port $worker_port"
coord_log=$work/coordinator.log
"$bin" coordinator --model "$LAZYKV_DEFAULT_MODEL" --worker "127.0.0.1:$worker_port" --port 0 \
  --heartbeat-interval-ms 500 --heartbeat-misses 3 >"$coord_log" 2>&1 &
coord_pid=$!
pids+=("$coord_pid")
url=$(wait_for_line "$coord_log" 'listening on http://[0-9.:]*' "$coord_pid")
url=${url#listening on }
[ -n "$url" ] || { cat "$coord_log" >&2; echo "FAILED: the coordinator did not start" >&2; exit 1; }
pass "coordinator at $url"
model=$(curl -sf "$url/v1/models" | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["data"][0]["id"])')
check "GET /v1/models names a model ($model)" test -n "$model"
check "GET /ready -> 200 with the worker up" test "$(status_of "$url/ready")" = 200
grep -q 'lazykv_worker_up{worker="0"} 1' <<<"$(curl -s "$url/metrics")"
check "lazykv_worker_up{worker=\"0\"} 1" test $? = 0

chat_body='{"model": "'$model'", "messages": [{"role": "user", "content": "What is 12*7?"}], "max_tokens": 24, "temperature": 0}'
check "chat completion -> 200" test "$(status_of "$url/v1/chat/completions" -H 'Content-Type: application/json' -d "$chat_body")" = 200
content=$(/usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["choices"][0]["message"]["content"])' <"$work/body")
check "chat completion has content ($(head -c 60 <<<"$content" | tr '\n' ' '))" test -n "$content"
curl -sN --max-time 60 "$url/v1/completions" -H 'Content-Type: application/json' \
  -d '{"model": "'$model'", "prompt": "Once upon a time", "max_tokens": 16, "stream": true}' >"$work/stream"
check "streamed completion ends with [DONE]" test "$(grep '^data: ' "$work/stream" | tail -1)" = "data: [DONE]"
check "streamed completion has chunks" grep -q '^data: {"id"' "$work/stream"

# FAULT: SIGKILL the worker after the first chunk of a long stream.
curl -sN --max-time 120 "$url/v1/completions" -H 'Content-Type: application/json' \
  -d '{"model": "'$model'", "prompt": "Tell a long story.", "max_tokens": 2000, "ignore_eos": true, "stream": true}' \
  >"$work/cut" &
cut_pid=$!
for _ in $(seq 1 300); do grep -q '^data: {' "$work/cut" 2>/dev/null && break; sleep 0.05; done
check "the long stream started" grep -q '^data: {' "$work/cut"
kill -9 "$worker_pid"
wait "$worker_pid" 2>/dev/null
killed_at=$(now)
wait "$cut_pid"
curl_done=$(now)
check "the stream ended within 15 s of the kill" elapsed_below "$killed_at" "$curl_done" 15
check "the stream carries an error event" grep -q '^data: {"error"' "$work/cut"
echo "   $(grep '^data: {"error"' "$work/cut" | head -1 | cut -c1-200)"
check "GET /health -> 200 with the worker down" test "$(status_of "$url/health")" = 200

down=""
for _ in $(seq 1 150); do
  grep -q 'lazykv_worker_up{worker="0"} 0' <<<"$(curl -s "$url/metrics")" && { down=1; break; }
  sleep 0.1
done
check 'lazykv_worker_up{worker="0"} 0 after the kill' test -n "$down"
check "GET /ready -> 503 with the worker down" test "$(status_of "$url/ready")" = 503
asked_at=$(now)
code=$(status_of "$url/v1/chat/completions" -H 'Content-Type: application/json' -d "$chat_body")
answered_at=$(now)
message=$(/usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["error"]["message"])' <"$work/body" 2>/dev/null)
check "a new request fails with 503/500 ($code: $message)" test "$code" = 503 -o "$code" = 500
check "the error names the worker" grep -q "worker 127.0.0.1:$worker_port" <<<"$message"
check "the failure came within 5 s" elapsed_below "$asked_at" "$answered_at" 5

# The worker comes back on the same port: requests succeed again.
start_worker "127.0.0.1:$worker_port"
pass "worker restarted on port $worker_port"
up=""
for _ in $(seq 1 300); do
  grep -q 'lazykv_worker_up{worker="0"} 1' <<<"$(curl -s "$url/metrics")" && { up=1; break; }
  sleep 0.1
done
check 'lazykv_worker_up{worker="0"} 1 after the restart' test -n "$up"
check "chat completion after the restart -> 200" \
  test "$(status_of "$url/v1/chat/completions" -H 'Content-Type: application/json' -d "$chat_body")" = 200
again=$(/usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["choices"][0]["message"]["content"])' <"$work/body")
check "the restarted worker gives the same greedy answer" test "$again" = "$content"
check "GET /ready -> 200 again" test "$(status_of "$url/ready")" = 200

# Shutdown: SIGTERM each process, exit 0.
kill -TERM "$coord_pid"
wait "$coord_pid"
check "coordinator exits 0 on SIGTERM" test $? = 0
kill -TERM "$worker_pid"
wait "$worker_pid"
check "worker exits 0 on SIGTERM" test $? = 0
check "a worker with --rank outside --world is refused with a clear error" \
  sh -c "'$bin' worker --model '$LAZYKV_DEFAULT_MODEL' --world 2 --rank 2 2>&1 | grep -q 'rank must be in'"
# One rank of a group of two as a coordinator's only --worker: refused at start.
"$bin" worker --model "$LAZYKV_DEFAULT_MODEL" --listen 127.0.0.1:0 --threads 1 --rank 0 --world 2 >"$work/rank.log" 2>&1 &
rank_pid=$!
pids+=("$rank_pid")
line=$(wait_for_line "$work/rank.log" 'listening on [0-9.]*:[0-9]*' "$rank_pid")
"$bin" coordinator --model "$LAZYKV_DEFAULT_MODEL" --worker "127.0.0.1:${line##*:}" --port 0 >"$work/lone.log" 2>&1
check "a coordinator given one rank of a group of two exits non-zero" test $? -ne 0
check "  naming the rank and what to do" grep -q 'is rank 0 of 2: give the coordinator one --worker per rank' "$work/lone.log"
kill -TERM "$rank_pid"; wait "$rank_pid" 2>/dev/null

# --- one coordinator, two groups ---------------------------------------------------
start_worker 127.0.0.1:0 --threads 1 --prefix-cache-mib 16
group_pid=("$worker_pid") group_port=("$worker_port")
start_worker 127.0.0.1:0 --threads 1 --prefix-cache-mib 16
group_pid+=("$worker_pid") group_port+=("$worker_port")
coord_log=$work/groups.log
"$bin" coordinator --model "$LAZYKV_DEFAULT_MODEL" --group "127.0.0.1:${group_port[0]}" \
  --group "127.0.0.1:${group_port[1]}" --port 0 --max-batch 2 --heartbeat-interval-ms 200 >"$coord_log" 2>&1 &
coord_pid=$!
pids+=("$coord_pid")
url=$(wait_for_line "$coord_log" 'listening on http://[0-9.:]*' "$coord_pid")
url=${url#listening on }
[ -n "$url" ] || { cat "$coord_log" >&2; echo "FAILED: the coordinator of two groups did not start" >&2; exit 1; }
load=$(dirname "$0")/router_load.py
/usr/bin/python3 "$load" "$url" "$model" 16 4 6 4 >"$work/groups.json"
check "two groups: 16 of 16 requests answered" test "$(json_get "sum(r['status'] == 200 for r in d['requests'])" <"$work/groups.json")" = 16
metrics=$(curl -s "$url/metrics")
for g in 0 1; do
  check "  group $g ran steps" grep -q "lazykv_step_duration_seconds_count{worker=\"$g.0\"} [1-9]" <<<"$metrics"
done
check "  a prompt's prefix was reused from a group's prefix cache" grep -q '^lazykv_prefix_cache_hit_tokens_total [1-9]' <<<"$metrics"

timeout 120 /usr/bin/python3 "$load" "$url" "$model" 12 4 12 24 >"$work/groups_kill.json" &
load_pid=$!
# The kill comes once the first sequences decode and more wait behind them.
metric() { curl -s "$url/metrics" | awk -v name="$1" '$1 == name {print int($2)}'; }
for _ in $(seq 1 300); do
  [ "$(metric lazykv_generation_tokens_total)" -ge 8 ] 2>/dev/null && [ "$(metric lazykv_requests_waiting)" -ge 4 ] && break
  sleep 0.05
done
waiting=$(metric lazykv_requests_waiting)
check "at the kill, requests wait in the groups' queues ($waiting)" test "$waiting" -ge 4
kill -9 "${group_pid[1]}"
wait "${group_pid[1]}" 2>/dev/null
wait "$load_pid"
check "the load under the kill of group 1's worker finished (nothing hung)" test $? = 0
ok=$(json_get "sum(r['status'] == 200 for r in d['requests'])" <"$work/groups_kill.json")
cut=$(json_get "sum(r['status'] == 503 and 'worker' in r['error'] for r in d['requests'])" <"$work/groups_kill.json")
check "every request answered or ended with a clear 503 ($ok answered, $cut cut)" test $((ok + cut)) = 12
check "at most the 2 requests group 1 was running were cut ($cut)" test "$cut" -le 2
echo "   $(json_get "next((r['error'] for r in d['requests'] if r['status'] != 200), 'no request was cut')" <"$work/groups_kill.json" | cut -c1-160)"
check "GET /ready -> 200 with one group up" test "$(status_of "$url/ready")" = 200
check "a request after the kill -> 200" \
  test "$(status_of "$url/v1/chat/completions" -H 'Content-Type: application/json' -d "$chat_body")" = 200
grep -q 'lazykv_worker_up{worker="1.0"} 0' <<<"$(curl -s "$url/metrics")"
check 'lazykv_worker_up{worker="1.0"} 0' test $? = 0
moved=$(metric lazykv_sequences_moved_total)
check "the queued sequences of group 1 moved to group 0 (lazykv_sequences_moved_total $moved)" test "${moved:-0}" -ge 1
kill -TERM "$coord_pid"
wait "$coord_pid"
check "the coordinator of two groups exits 0 on SIGTERM" test $? = 0
kill -TERM "${group_pid[0]}"; wait "${group_pid[0]}" 2>/dev/null

if [ "$failures" -gt 0 ]; then
  echo "--- coordinator log" >&2; cat "$coord_log" >&2
  echo "$failures check(s) FAILED" >&2
  exit 1
fi
echo "all multiprocess checks passed"
