#!/usr/bin/env bash
# End to end: `lazykv serve` on the default model, on loopback, driven by real
# clients: curl, the official OpenAI Python client (LAZYKV_E2E_PYTHON, a venv
# made by scripts/setup.sh), promtool and a real Prometheus server.
#   usage: serve_test.sh LAZYKV_BINARY [GRPC_TEST_BINARY]
# With GRPC_TEST_BINARY (lazykv_grpc_tests) its GrpcE2e client also checks
# the gRPC API and health service of the same server.
# Needs LAZYKV_DEFAULT_MODEL (set by scripts/test.sh). Exits 77 (skipped) when
# the default model is not there.
set -uo pipefail
bin=$1
grpc_tests=${2:-}
source "$(dirname "$0")/lib.sh"

# Starts a server with extra flags; sets $url, $server_pid and $server_log.
start_server() {
  start_http serve serve --model "$LAZYKV_DEFAULT_MODEL" --port 0 --threads 2 --kv-cache-mib 256 "$@"
  server_pid=$http_pid
  server_log=$http_log
}

# stream_to FILE BODY [CURL ARGS...]: a streamed completion in the background
# into FILE; sets $stream_pid and returns once its first event arrived.
stream_to() {
  local file=$1 body=$2
  shift 2
  curl -sN "$url/v1/completions" -H 'Content-Type: application/json' "$@" -d "$body" >"$file" &
  stream_pid=$!
  for _ in $(seq 1 100); do grep -q '^data: {' "$file" 2>/dev/null && break; sleep 0.1; done
}

start_server --grpc-port 0
model=$(curl -sf "$url/v1/models" | json_get 'd["data"][0]["id"]')
check "GET /v1/models names a model ($model)" test -n "$model"
check "GET /health" test "$(status_of "$url/health")" = 200
check "GET /ready" test "$(status_of "$url/ready")" = 200
check "unknown path -> 404" test "$(status_of "$url/v1/nope")" = 404
check "GET on a POST endpoint -> 405" test "$(status_of "$url/v1/completions")" = 405

# Generation with curl, whole and streamed.
chat_body='{"model": "'$model'", "messages": [{"role": "user", "content": "What is 12*7?"}], "max_tokens": 24, "temperature": 0}'
code=$(status_of "$url/v1/chat/completions" -H 'Content-Type: application/json' -d "$chat_body")
check "chat completion -> 200" test "$code" = 200
whole=$(json_get 'd["choices"][0]["message"]["content"]' <"$work/body")
check "chat completion has content" test -n "$whole"
curl -sN "$url/v1/chat/completions" -H 'Content-Type: application/json' \
  -d "${chat_body%\}}, \"stream\": true}" >"$work/stream"
check "stream ends with [DONE]" test "$(grep '^data: ' "$work/stream" | tail -1)" = "data: [DONE]"
streamed=$(grep '^data: {' "$work/stream" | sed 's/^data: //' |
  /usr/bin/python3 -c "import json,sys; print(''.join((c['choices'][0]['delta'].get('content') or '') for c in map(json.loads, sys.stdin) if c['choices']))")
check "streamed text equals the whole response" test "$streamed" = "$whole"
code=$(status_of "$url/v1/completions" -H 'Content-Type: application/json' \
  -d '{"model": "'$model'", "prompt": "Once upon a time", "max_tokens": 8, "kv_policy": {"name": "lazy", "budget": 16, "window": 4}}')
check "completion with kv_policy -> 200" test "$code" = 200

# Bad input: a clear 4xx each, and the server keeps serving.
bad() {  # expected-status what body
  local expected=$1 what=$2 body=$3 code
  code=$(status_of "$url/v1/chat/completions" -H 'Content-Type: application/json' --data-binary "$body")
  if [ "$code" = "$expected" ] && json_get 'd["error"]["message"]' <"$work/body" >/dev/null; then
    pass "$what -> $code: $(json_get 'd["error"]["message"]' <"$work/body" | cut -c1-120)"
  else
    fail "$what: expected $expected, got $code: $(head -c 300 "$work/body")"
  fi
}
bad 400 "malformed JSON" '{"model": '
bad 400 "not an object" '[1, 2]'
bad 400 "wrong type" '{"model": "'$model'", "messages": [{"role": "user", "content": "x"}], "temperature": "hot"}'
bad 400 "out of range" '{"model": "'$model'", "messages": [{"role": "user", "content": "x"}], "temperature": 7}'
bad 400 "empty messages" '{"model": "'$model'", "messages": []}'
bad 400 "empty content" '{"model": "'$model'", "messages": [{"role": "user"}]}'
bad 400 "unknown policy" '{"model": "'$model'", "messages": [{"role": "user", "content": "x"}], "kv_policy": {"name": "magic"}}'
bad 400 "bad policy value" '{"model": "'$model'", "messages": [{"role": "user", "content": "x"}], "kv_policy": {"name": "lazy", "budget": -3}}'
bad 400 "context overflow" '{"model": "'$model'", "messages": [{"role": "user", "content": "x"}], "max_tokens": 100000000}'
bad 404 "unknown model" '{"model": "gpt-17", "messages": [{"role": "user", "content": "x"}]}'
printf '{"model": "%s", "messages": [{"role": "user", "content": "\xff\xfe"}]}' "$model" >"$work/bad_utf8"
bad 400 "invalid UTF-8" "$(cat "$work/bad_utf8")"
head -c 5000000 /dev/zero | tr '\0' 'a' >"$work/huge"
code=$(status_of "$url/v1/completions" -H 'Content-Type: application/json' --data-binary @"$work/huge")
check "oversize body -> 413 ($code)" test "$code" = 413
code=$(status_of "$url/v1/chat/completions" -H 'Content-Type: application/json' \
  -d '{"model": "'$model'", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "some_future_field": 1}')
check "unknown fields are ignored -> 200" test "$code" = 200
check "the unknown field is logged once" test "$(grep -c "some_future_field" "$server_log")" = 1

# Issue 19's crash: a value nested 150,000 levels deep in a member that is
# not the last (300 KB) killed the process; now a 400, whatever member.
for member in prompt extra; do
  /usr/bin/python3 -c "import sys; n = 150000; sys.stdout.write('{\"$member\": ' + '[' * n + ']' * n + ', \"model\": \"m\", \"prompt\": \"p\"}')" >"$work/deep"
  code=$(status_of "$url/v1/completions" -H 'Content-Type: application/json' --data-binary @"$work/deep")
  check "150,000 levels deep in '$member' -> 400 ($(json_get 'd["error"]["message"]' <"$work/body" 2>/dev/null))" test "$code" = 400
done
check "the server survived the deep bodies" test "$(status_of "$url/health")" = 200
# A field name that would forge a log line is logged escaped.
code=$(status_of "$url/v1/completions" -H 'Content-Type: application/json' \
  -d '{"model": "'$model'", "prompt": "x", "max_tokens": 1, "a\nlazykv serve: forged line\u001b[2J": 1}')
check "a field name with a newline and an escape -> 200" test "$code" = 200
check "... is logged escaped, on one line" grep -qF 'a\x0alazykv serve: forged line\x1b[2J' "$server_log"
check "... and forges no line" test "$(grep -c '^lazykv serve: forged line' "$server_log")" = 0
# Unknown field names: 40 requests, each with a new 4 MB name. Kept and
# logged as a short prefix, at most 20 such lines a minute.
log_before=$(stat -c %s "$server_log")
rss_before=$(awk '/^VmRSS:/ {print $2}' "/proc/$server_pid/status")
for i in $(seq 1 40); do
  /usr/bin/python3 -c "import sys; sys.stdout.write('{\"model\": \"$model\", \"prompt\": \"x\", \"max_tokens\": 1, \"f$i' + 'n' * 4000000 + '\": 1}')" >"$work/big_name"
  status_of "$url/v1/completions" -H 'Content-Type: application/json' --data-binary @"$work/big_name" >"$work/big_name.code"
done
check "requests with 4 MB field names -> 200" test "$(cat "$work/big_name.code")" = 200
log_growth=$(( $(stat -c %s "$server_log") - log_before ))
rss_growth=$(( $(awk '/^VmRSS:/ {print $2}' "/proc/$server_pid/status") - rss_before ))
check "40 new 4 MB field names add $log_growth bytes of log (under 4 KB: 20 lines of 64-byte names)" test "$log_growth" -lt 4096
check "... and ${rss_growth} KiB of memory (under 32 MiB; was 160 MiB)" test "$rss_growth" -lt 32768

# A client that goes away cancels its sequence and frees its KV.
stream_to "$work/cut" '{"model": "'$model'", "prompt": "Tell a long story.", "max_tokens": 2000, "ignore_eos": true, "stream": true, "kv_policy": {"name": "full"}}'
kill "$stream_pid" 2>/dev/null; wait "$stream_pid" 2>/dev/null
idle=""
for _ in $(seq 1 300); do
  m=$(curl -s "$url/metrics")
  if grep -q '^lazykv_requests_running 0$' <<<"$m" && grep -q '^lazykv_kv_bytes{tier="device"} 0$' <<<"$m" &&
    grep -q 'lazykv_errors_total{type="cancelled"} [1-9]' <<<"$m"; then idle=1; break; fi
  sleep 0.1
done
check "a disconnected stream is cancelled, counted, and its KV freed" test -n "$idle"

# Metrics: promtool's checks, then a real Prometheus scrape.
curl -s "$url/metrics" >"$work/metrics"
check "promtool check metrics" sh -c "promtool check metrics <'$work/metrics'"
for name in lazykv_time_to_first_token_seconds_bucket lazykv_inter_token_latency_seconds_count \
  lazykv_request_duration_seconds_sum lazykv_requests_waiting lazykv_prompt_tokens_total \
  lazykv_generation_tokens_total 'lazykv_kv_bytes{tier="device"}' \
  'lazykv_kv_pool_bytes{tier="device"}' 'lazykv_step_duration_seconds_count{worker="0"}'; do
  check "metric $name exported" grep -qF "$name" "$work/metrics"
done
prom_port=$((20000 + RANDOM % 20000))
cat >"$work/prometheus.yml" <<EOF
global: {scrape_interval: 1s}
scrape_configs:
  - job_name: lazykv
    static_configs: [{targets: ["${url#http://}"]}]
EOF
prometheus --config.file="$work/prometheus.yml" --storage.tsdb.path="$work/tsdb" \
  --web.listen-address="127.0.0.1:$prom_port" >"$work/prometheus.log" 2>&1 &
pids+=($!)
series=""
for _ in $(seq 1 60); do
  series=$(curl -s "http://127.0.0.1:$prom_port/api/v1/query?query=lazykv_generation_tokens_total" |
    json_get 'd["data"]["result"][0]["value"][1]' 2>/dev/null)
  [ -n "$series" ] && break
  sleep 1
done
check "Prometheus scraped lazykv_generation_tokens_total = $series" test -n "$series" -a "${series:-0}" != 0
up=$(curl -s "http://127.0.0.1:$prom_port/api/v1/query?query=up" | json_get 'd["data"]["result"][0]["value"][1]' 2>/dev/null)
check "Prometheus sees the target up" test "$up" = 1

# The official OpenAI Python client.
if [ -x "${LAZYKV_E2E_PYTHON:-}" ]; then
  check "OpenAI Python client" "$LAZYKV_E2E_PYTHON" "$(dirname "$0")/openai_client_test.py" "$url" "$model"
  check "structured outputs (OpenAI client, jsonschema)" "$LAZYKV_E2E_PYTHON" \
    "$(dirname "$0")/structured_outputs_client.py" "$url" "$model"
  check "reasoning parser off: the text as written (OpenAI client)" "$LAZYKV_E2E_PYTHON" \
    "$(dirname "$0")/reasoning_client.py" "$url" "$model" off
else
  fail "LAZYKV_E2E_PYTHON is not set (scripts/test.sh sets it to the venv of tests/e2e/requirements.txt)"
fi

# The gRPC API (lazykv.v1) and grpc.health.v1 of the same server.
if [ -n "$grpc_tests" ]; then
  grpc_addr=$(sed -n 's/^lazykv serve: gRPC on //p' "$server_log")
  check "gRPC address printed ($grpc_addr)" test -n "$grpc_addr"
  out=$(LAZYKV_GRPC_E2E_ADDRESS="$grpc_addr" LAZYKV_GRPC_E2E_MODEL="$model" "$grpc_tests" --gtest_filter='GrpcE2e.*' 2>&1)
  check "gRPC Generate, ListModels and health against the server" grep -q '\[  PASSED  \] 1 test' <<<"$out" ||
    echo "$out" >&2
fi

# Graceful drain: SIGTERM while a stream runs; the stream completes, the exit status is 0.
stream_to "$work/drain" '{"model": "'$model'", "prompt": "Once upon a time", "max_tokens": 48, "stream": true, "kv_policy": {"name": "full"}}'
kill -TERM "$server_pid"
wait "$stream_pid"
check "the in-flight stream finished during the drain" test "$(grep '^data: ' "$work/drain" | tail -1)" = "data: [DONE]"
wait "$server_pid"
check "SIGTERM exits 0" test $? = 0

# --reasoning-parser think: reasoning_content and content apart.
if [ -x "${LAZYKV_E2E_PYTHON:-}" ]; then
  start_server --reasoning-parser think
  check "reasoning parser on: reasoning_content apart (OpenAI client)" "$LAZYKV_E2E_PYTHON" \
    "$(dirname "$0")/reasoning_client.py" "$url" "$model" split
  kill -TERM "$server_pid"; wait "$server_pid"
fi

# API keys and the per-key concurrency limit.
start_server --api-key secret-1 --max-concurrent-per-key 1
check "no key -> 401" test "$(status_of "$url/v1/models")" = 401
check "wrong key -> 401" test "$(status_of "$url/v1/models" -H 'Authorization: Bearer nope')" = 401
check "right key -> 200" test "$(status_of "$url/v1/models" -H 'Authorization: Bearer secret-1')" = 200
check "health needs no key" test "$(status_of "$url/health")" = 200
# (ignore_eos: a sampled end of text must not end the first request before the second arrives)
stream_to "$work/first" '{"model": "'$model'", "prompt": "Once", "max_tokens": 400, "ignore_eos": true, "stream": true, "kv_policy": {"name": "full"}}' \
  -H 'Authorization: Bearer secret-1'
check "a second concurrent request of the key -> 429" test "$(status_of "$url/v1/completions" -H 'Authorization: Bearer secret-1' \
  -H 'Content-Type: application/json' -d '{"model": "'$model'", "prompt": "x", "max_tokens": 1}')" = 429
kill "$stream_pid" 2>/dev/null
kill -TERM "$server_pid"; wait "$server_pid"

# Prompt KV reuse: a server with a prefix cache gives the same greedy text as
# one without on prompts that share a long start, counts the tokens it took
# from the cache, and keeps a grammar's mask on a chunk that ends the prompt
# early (64-token chunks on both: without the cache the prompt spans several).
start_server --max-prefill-tokens 64
plain_url=$url plain_pid=$server_pid
start_server --prefix-cache-mib 64 --max-prefill-tokens 64
doc=$(/usr/bin/python3 -c "print(' '.join(f'Line {i}: the clerk checks the ledger against the manifest.' for i in range(40)))")
for question in "Which line comes first?" "Which line comes last?"; do
  body='{"model": "'$model'", "prompt": "'"$doc $question"'", "max_tokens": 16, "temperature": 0}'
  plain_text=$(curl -sf "$plain_url/v1/completions" -H 'Content-Type: application/json' -d "$body" | json_get 'd["choices"][0]["text"]')
  cached_text=$(curl -sf "$url/v1/completions" -H 'Content-Type: application/json' -d "$body" | json_get 'd["choices"][0]["text"]')
  check "the same text with and without a prefix cache ($question)" test -n "$plain_text" -a "$plain_text" = "$cached_text"
done
hit=$(curl -sf "$url/metrics" | awk '$1 == "lazykv_prefix_cache_hit_tokens_total" {print $2}')
check "the second prompt took its shared start from the cache (${hit:-no} tokens, at least 384)" \
  awk -v h="${hit:-0}" 'BEGIN { exit !(h >= 384) }'
schema='{"type": "object", "properties": {"line": {"type": "integer"}}, "required": ["line"]}'
constrained=$(curl -sf "$url/v1/completions" -H 'Content-Type: application/json' -d '{"model": "'$model'", "prompt": "'"$doc"' The first line, as JSON:", "max_tokens": 64, "temperature": 0, "response_format": {"type": "json_schema", "json_schema": {"name": "l", "schema": '"$schema"'}}}' |
  json_get 'd["choices"][0]["text"]')
check "a reply constrained by a schema after a hit is that JSON ($constrained)" \
  /usr/bin/python3 -c "import json, sys; assert isinstance(json.loads(sys.argv[1])['line'], int)" "$constrained"
kill -TERM "$server_pid" "$plain_pid"; wait "$server_pid" "$plain_pid"

# A second signal during the drain ends it at once: the running stream gets
# the shutdown error, then [DONE], and the process exits 0 well before
# --drain-seconds.
start_server --drain-seconds 60
stream_to "$work/second" '{"model": "'$model'", "prompt": "Once", "max_tokens": 4000, "ignore_eos": true, "stream": true}'
kill -TERM "$server_pid"
sleep 0.5
started=$(date +%s%N)
kill -INT "$server_pid"
wait "$server_pid"
code=$?
elapsed_ms=$(( ($(date +%s%N) - started) / 1000000 ))
wait "$stream_pid"
check "a second signal exits 0 ($code) in ${elapsed_ms} ms (under 3 s)" test "$code" = 0 -a "$elapsed_ms" -lt 3000
check "... the running stream got the shutdown error" grep -q '"message":"the server is shutting down"' "$work/second"
check "... then [DONE]" test "$(grep '^data: ' "$work/second" | tail -1)" = "data: [DONE]"
check "... and the log says why it stopped" grep -q "ended by a second signal" "$server_log"

if [ "$failures" -ne 0 ]; then
  echo "$failures check(s) failed; server log:" >&2
  tail -50 "$server_log" >&2
  exit 1
fi
echo "all end-to-end checks passed"
