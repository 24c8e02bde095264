#!/usr/bin/env bash
# End to end: a tensor-parallel group of two `lazykv worker` ranks (--world 2,
# Gloo over loopback, or NCCL) behind one `lazykv coordinator` (--worker per rank), which
# arranges the ranks' rendezvous; both ranks demote to one `lazykv kvstore`. A
# greedy completion must match `lazykv serve` on the same model word for word;
# a lazy+tiers request moves blocks through the kvstore; the kvstore is killed
# in the middle of a request, which still completes (the ranks go on without
# tiers); then one rank is killed and new requests must fail fast with an
# error naming that worker (not hang); restarted, the rank is taken back into
# a new group and the greedy text is the same again.
#   usage: tensor_parallel_test.sh LAZYKV_BINARY [gloo|nccl]
# The second argument is the ranks' --collective (default gloo); nccl needs
# two CUDA devices (NCCL refuses two ranks on one) and a build with NCCL.
# Needs LAZYKV_DEFAULT_MODEL (set by scripts/test.sh); exits 77 (skipped) without it.
set -uo pipefail
bin=$1
collective=${2:-gloo}
if [ "$collective" = nccl ]; then
  gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
  if [ -n "${CUDA_VISIBLE_DEVICES+set}" ]; then  # what CUDA shows this process
    visible=$(tr ',' '\n' <<<"$CUDA_VISIBLE_DEVICES" | grep -c .)
    [ "$visible" -lt "$gpus" ] && gpus=$visible
  fi
  if [ "$gpus" -lt 2 ]; then
    echo "skipped: --collective nccl needs two CUDA devices ($gpus visible)"
    exit 77
  fi
fi
source "$(dirname "$0")/lib.sh"
now() { date +%s.%N; }
elapsed_below() { /usr/bin/python3 -c "import sys; sys.exit(0 if float(sys.argv[2]) - float(sys.argv[1]) < float(sys.argv[3]) else 1)" "$@"; }
model=$(/usr/bin/python3 -c 'import os,sys; print(os.path.basename(sys.argv[1]).rsplit(".gguf", 1)[0])' "$LAZYKV_DEFAULT_MODEL")
body='{"model": "'$model'", "prompt": "The capital of France is Paris. The capital of Germany is", "max_tokens": 32, "temperature": 0, "ignore_eos": true}'
# completion URL: the greedy text in $work/text, "TOKENS SECONDS" on stdout.
completion() {
  local start end code
  start=$(now)
  code=$(status_of "$1/v1/completions" -H 'Content-Type: application/json' -d "$body")
  end=$(now)
  [ "$code" = 200 ] || { echo "completion -> $code: $(cat "$work/body")" >&2; return 1; }
  json_get 'd["choices"][0]["text"]' <"$work/body" >"$work/text"
  echo "$(json_get 'd["usage"]["completion_tokens"]' <"$work/body") $(/usr/bin/python3 -c "print(float('$end') - float('$start'))")"
}
# A structured output (json_schema, greedy): its text into FILE.
schema='{"type": "object", "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer", "minimum": 0, "maximum": 99}}, "required": ["name", "age"]}'
structured() {
  local code
  code=$(status_of "$1/v1/completions" -H 'Content-Type: application/json' -d '{"model": "'$model'", "prompt": "A person, as JSON:", "max_tokens": 48, "temperature": 0, "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": '"$schema"'}}}')
  [ "$code" = 200 ] || { echo "structured completion -> $code: $(cat "$work/body")" >&2; return 1; }
  json_get 'd["choices"][0]["text"]' <"$work/body" >"$2"
}

# Reference: the whole model in one process.
"$bin" serve --model "$LAZYKV_DEFAULT_MODEL" --port 0 --threads 2 --kv-cache-mib 256 >"$work/serve.log" 2>&1 &
serve_pid=$!
pids+=("$serve_pid")
url=$(wait_for_line "$work/serve.log" 'listening on http://[0-9.:]*' "$serve_pid")
url=${url#listening on }
[ -n "$url" ] || { cat "$work/serve.log" >&2; echo "FAILED: serve did not start" >&2; exit 1; }
completion "$url" >/dev/null  # warm-up
read -r serve_tokens serve_seconds < <(completion "$url")
cp "$work/text" "$work/serve_text"
structured "$url" "$work/serve_json"
check "serve: a structured output ($(tr -s "\n " "  " <"$work/serve_json"))" /usr/bin/python3 -c "import json,sys; v = json.load(open(sys.argv[1])); assert set(v) == {'name', 'age'} and 0 <= v['age'] <= 99" "$work/serve_json"
check "serve: greedy completion of $serve_tokens tokens ($(head -c 60 "$work/serve_text" | tr '\n' ' '))" test -s "$work/serve_text"
kill -TERM "$serve_pid"; wait "$serve_pid" 2>/dev/null

# The node's kvstore.
start_kvstore "$bin" 64
kv_puts() { kv_metric 'lazykv_kvstore_requests_total{endpoint="put",code="ok"}'; }
pass "kvstore on port $kv_port"

# The group: two ranks, each with one thread (2 threads in all, like serve).
ports=()
rank_pids=()
# start_rank RANK LISTEN: a rank in the background, its pid in rank_pids[RANK].
start_rank() {
  "$bin" worker --model "$LAZYKV_DEFAULT_MODEL" --listen "$2" --threads 1 --kv-cache-mib 256 \
    --rank "$1" --world 2 --collective "$collective" --kvstore "127.0.0.1:$kv_port" --kvstore-transports tcp \
    >>"$work/rank$1.log" 2>&1 &
  rank_pids[$1]=$!
  pids+=($!)
}
for rank in 0 1; do start_rank "$rank" 127.0.0.1:0; done
for rank in 0 1; do
  line=$(wait_for_line "$work/rank$rank.log" 'listening on [0-9.]*:[0-9]*' "${rank_pids[$rank]}")
  [ -n "$line" ] || { cat "$work/rank$rank.log" >&2; echo "FAILED: rank $rank did not start" >&2; exit 1; }
  ports+=("${line##*:}")
done
pass "ranks 0 and 1 listening on ports ${ports[*]}"
coord_log=$work/coordinator.log
"$bin" coordinator --model "$LAZYKV_DEFAULT_MODEL" --worker "127.0.0.1:${ports[0]}" --worker "127.0.0.1:${ports[1]}" \
  --port 0 --heartbeat-interval-ms 300 --heartbeat-misses 2 --tp-timeout 10 >"$coord_log" 2>&1 &
coord_pid=$!
pids+=("$coord_pid")
url=$(wait_for_line "$coord_log" 'listening on http://[0-9.:]*' "$coord_pid")
url=${url#listening on }
[ -n "$url" ] || { cat "$coord_log" >&2; echo "FAILED: the coordinator did not start" >&2; exit 1; }
pass "coordinator at $url"
check "the coordinator formed the ranks' group" grep -q 'the tensor-parallel group formed' "$coord_log"
check "GET /ready -> 200 with both ranks up" test "$(status_of "$url/ready")" = 200
completion "$url" >/dev/null  # warm-up
read -r tp_tokens tp_seconds < <(completion "$url")
check "two ranks: the same greedy text as serve" cmp -s "$work/text" "$work/serve_text"
structured "$url" "$work/tp_json"
check "two ranks: the same structured output as serve (token masks in the plan to both ranks)" cmp -s "$work/tp_json" "$work/serve_json"
cmp -s "$work/text" "$work/serve_text" || { echo "serve: $(cat "$work/serve_text")"; echo "tp:    $(cat "$work/text")"; }
/usr/bin/python3 -c "print('   informative: serve %.1f tok/s, two ranks %.1f tok/s (%s tokens, prompt included in the time)' % ($serve_tokens / $serve_seconds, $tp_tokens / $tp_seconds, $tp_tokens))"
for rank in 0 1; do
  check "rank $rank served steps" grep -q "rank $rank of 2" "$work/rank$rank.log"
  check "rank $rank all-reduces over $collective" grep -q "all-reduce over $collective" "$work/rank$rank.log"
done

# The official OpenAI Python client (streaming and not, chat and completions)
# against the two-rank group, and promtool over the coordinator's /metrics.
if [ -x "${LAZYKV_E2E_PYTHON:-}" ]; then
  check "OpenAI Python client against two ranks" "$LAZYKV_E2E_PYTHON" "$(dirname "$0")/openai_client_test.py" "$url" "$model"
else
  fail "LAZYKV_E2E_PYTHON is not set (scripts/test.sh sets it to the venv of tests/e2e/requirements.txt)"
fi
curl -sf "$url/metrics" >"$work/metrics"
check "promtool check metrics (two ranks)" sh -c "promtool check metrics <'$work/metrics'"
check "lazykv_worker_up for both ranks" sh -c "grep -q 'lazykv_worker_up{worker=\"0\"} 1' '$work/metrics' && grep -q 'lazykv_worker_up{worker=\"1\"} 1' '$work/metrics'"

# lazy+tiers through the kvstore: both ranks demote their KV heads' blocks.
tiers_body='{"model": "'$model'", "prompt": "Count slowly from one to one hundred, one number per line:", "max_tokens": 200, "temperature": 0, "ignore_eos": true, "kv_policy": {"name": "lazy+tiers", "budget": 48, "window": 8, "alpha": 0.001}}'
code=$(status_of "$url/v1/completions" -H 'Content-Type: application/json' -d "$tiers_body")
check "a lazy+tiers request over two ranks -> $code" test "$code" = 200
check "  with 200 tokens" test "$(json_get 'd["usage"]["completion_tokens"]' <"$work/body")" = 200
puts=$(kv_puts)
check "the ranks demoted blocks to the kvstore ($puts puts)" test "${puts:-0}" -gt 0
check "lazykv_demotions_total counts them at the coordinator" \
  sh -c "curl -sf '$url/metrics' | awk '\$1 == \"lazykv_demotions_total\" && \$2 > 0 {found=1} END {exit !found}'"

# FAULT: SIGKILL the kvstore in the middle of a lazy+tiers request.
long_body=${tiers_body/\"max_tokens\": 200/\"max_tokens\": 500}
curl -s --max-time 300 -o "$work/long.json" -w '%{http_code}' "$url/v1/completions" \
  -H 'Content-Type: application/json' -d "$long_body" >"$work/long.code" &
long_pid=$!
before=$(kv_puts)
for _ in $(seq 1 400); do
  [ "$(kv_puts)" -gt "$((before + 20))" ] 2>/dev/null && break
  sleep 0.05
done
kill -9 "$kv_pid"
wait "$long_pid"
check "the request in flight when the kvstore died completed ($(cat "$work/long.code"))" test "$(cat "$work/long.code")" = 200
check "  with all 500 tokens" test "$(json_get 'd["usage"]["completion_tokens"]' <"$work/long.json")" = 500
for rank in 0 1; do
  check "rank $rank reported the kvstore gone and went on without tiers" grep -q 'continuing without tiers' "$work/rank$rank.log"
done
check "GET /ready -> 200: the ranks serve on without the kvstore" test "$(status_of "$url/ready")" = 200

# FAULT: SIGKILL rank 1; requests must fail fast naming it.
kill -9 "${rank_pids[1]}"
wait "${rank_pids[1]}" 2>/dev/null
asked_at=$(now)
code=$(status_of "$url/v1/completions" -H 'Content-Type: application/json' -d "$body")
answered_at=$(now)
message=$(json_get 'd["error"]["message"]' <"$work/body" 2>/dev/null)
check "a request after the kill fails with 503/500 ($code: $(head -c 300 <<<"$message"))" test "$code" = 503 -o "$code" = 500
check "the error names the killed worker" grep -q "127.0.0.1:${ports[1]}" <<<"$message"
check "the failure came within 15 s" elapsed_below "$asked_at" "$answered_at" 15
check "GET /ready -> 503 with a rank down" ready_becomes "$url" 503 100
asked_at=$(now)
code=$(status_of "$url/v1/completions" -H 'Content-Type: application/json' -d "$body")
answered_at=$(now)
check "a later request fails at once ($code)" test "$code" = 503 -o "$code" = 500
check "  within 5 s" elapsed_below "$asked_at" "$answered_at" 5

# Rank 1 restarted on its port: the coordinator forms the group again and the
# same greedy text comes back. The kvstore is still dead: no tiers.
start_rank 1 "127.0.0.1:${ports[1]}"
check "GET /ready -> 200 once rank 1 is back" ready_becomes "$url" 200
completion "$url" >/dev/null
check "after the restart: the same greedy text as serve" cmp -s "$work/text" "$work/serve_text"
check "the coordinator formed the group again" \
  sh -c "test \$(grep -c 'the tensor-parallel group formed' '$coord_log') -ge 2"
check "rank 0 joined a second group" grep -q 'joined group 2' "$work/rank0.log"
# Once formed with the new process, the group stays: more requests run on it
# without a third formation (which would drop the sequences again).
for n in 2 3; do
  rm -f "$work/text"
  check "request $n after the restart succeeds" completion "$url"
  check "  with the same text" cmp -s "$work/text" "$work/serve_text"
done
check "  and the group formed exactly twice" \
  sh -c "test \$(grep -c 'the tensor-parallel group formed' '$coord_log') -eq 2"

kill -TERM "$coord_pid"
wait "$coord_pid"
check "coordinator exits 0 on SIGTERM" test $? = 0

if [ "$failures" -gt 0 ]; then
  echo "--- coordinator log" >&2; cat "$coord_log" >&2
  echo "--- rank 0 log" >&2; cat "$work/rank0.log" >&2
  echo "$failures check(s) FAILED" >&2
  exit 1
fi
echo "all tensor-parallel checks passed"
