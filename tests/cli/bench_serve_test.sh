#!/usr/bin/env bash
# `lazykv bench-serve` against a real `lazykv serve` on loopback: a small load
# run must complete every request with tokens and a measured TTFT, an open-loop
# run must follow its seeded arrival schedule, and a run
# against a closed port must count every request as an error and exit 1.
# Usage: bench_serve_test.sh LAZYKV_BINARY (needs LAZYKV_DEFAULT_MODEL; exit 77 skips).
set -uo pipefail
lazykv=$1
if [ -z "${LAZYKV_DEFAULT_MODEL:-}" ]; then
  echo "skip: LAZYKV_DEFAULT_MODEL is not set"
  exit 77
fi
tmp=$(mktemp -d)
server_pid=""
cleanup() {
  if [ -n "$server_pid" ] && kill -0 "$server_pid" 2>/dev/null; then kill -KILL "$server_pid"; fi
  rm -rf "$tmp"
}
trap cleanup EXIT
failures=0
pass() { echo "ok: $1"; }
fail() { echo "FAIL: $1"; failures=$((failures + 1)); }
# check NAME FILE PYTHON-EXPRESSION: the expression over the JSON in FILE (as d) is true.
check() {
  if /usr/bin/python3 -c "import json,sys; d=json.load(open(sys.argv[1])); sys.exit(0 if ($3) else 1)" "$2" 2>/dev/null; then
    pass "$1"
  else
    fail "$1: $(head -c 600 "$2")"
  fi
}

"$lazykv" serve --model "$LAZYKV_DEFAULT_MODEL" --port 0 --threads 2 >"$tmp/serve.out" 2>"$tmp/serve.err" &
server_pid=$!
url=""
for _ in $(seq 1 600); do  # up to 60 s for the model to load
  url=$(grep -o 'listening on http://127\.0\.0\.1:[0-9]*' "$tmp/serve.out" 2>/dev/null | head -1 | sed 's/^listening on //')
  [ -n "$url" ] && break
  kill -0 "$server_pid" 2>/dev/null || break
  sleep 0.1
done
if [ -z "$url" ]; then
  echo "FAIL: lazykv serve did not start: $(head -c 600 "$tmp/serve.err")"
  exit 1
fi
pass "server listening at $url"

model=$(curl -sf "$url/v1/models" | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["data"][0]["id"])')
if [ -n "$model" ]; then pass "model id '$model'"; else fail "GET /v1/models gave no model id"; fi

# A small streaming load: every request completes with tokens and a TTFT.
"$lazykv" bench-serve --url "$url" --model "$model" --concurrency 4 --requests 8 --max-tokens 16 \
  >"$tmp/run.json" 2>"$tmp/run.err"
code=$?
if [ "$code" -eq 0 ]; then pass "bench-serve exit 0"; else fail "bench-serve exit $code: $(head -c 600 "$tmp/run.err")"; fi
check "8 requests" "$tmp/run.json" 'd["requests"] == 8'
check "no errors" "$tmp/run.json" 'd["errors"] == 0 and d["error_samples"] == []'
check "output tokens counted" "$tmp/run.json" 'd["output_tokens"] > 0 and d["output_tokens"] <= 8 * 16'
check "TTFT measured" "$tmp/run.json" 'd["ttft_s"]["p50"] > 0 and d["ttft_s"]["p50"] <= d["ttft_s"]["p99"]'
check "e2e >= TTFT" "$tmp/run.json" 'd["e2e_s"]["p99"] >= d["ttft_s"]["p50"]'
check "worst inter-token gap reported" "$tmp/run.json" 'd["itl_s"]["max"] >= d["itl_s"]["p99"] > 0'
check "prompt tokens from usage" "$tmp/run.json" 'd["prompt_tokens_mean"] is not None and d["prompt_tokens_mean"] > 50'
check "throughput" "$tmp/run.json" 'd["output_tokens_per_s"] > 0 and d["requests_per_s"] > 0'

# The completions endpoint with a per-request kv_policy and ignore_eos (exactly max_tokens each).
"$lazykv" bench-serve --url "$url" --model "$model" --endpoint completions --concurrency 2 --requests 2 \
  --max-tokens 8 --kv-policy '{"name":"streaming","budget":64}' --ignore-eos >"$tmp/completions.json" 2>"$tmp/c.err"
code=$?
if [ "$code" -eq 0 ]; then pass "completions exit 0"; else fail "completions exit $code: $(head -c 600 "$tmp/c.err")"; fi
check "completions with ignore_eos give exactly max_tokens each" "$tmp/completions.json" 'd["requests"] == 2 and d["errors"] == 0 and d["output_tokens"] == 16'

# A policy the server rejects: every request fails with its HTTP status, exit 1.
"$lazykv" bench-serve --url "$url" --model "$model" --concurrency 1 --requests 2 --max-tokens 4 \
  --kv-policy '{"name":"no-such-policy"}' >"$tmp/rejected.json" 2>/dev/null
code=$?
if [ "$code" -eq 1 ]; then pass "rejected requests exit 1"; else fail "rejected requests exit $code"; fi
check "rejected requests are errors with their status" "$tmp/rejected.json" \
  'd["errors"] == 2 and d["error_samples"][0].startswith("HTTP 400")'

check "closed loop by default" "$tmp/run.json" 'd["arrival"] == "closed" and d["request_rate"] is None'

# Open loop: Poisson arrivals at 4 requests/s from a seed. The run cannot end
# before its last arrival, and the same seed gives the same schedule (checked
# against a closed port, where the schedule is all that is left).
"$lazykv" bench-serve --url "$url" --model "$model" --concurrency 2 --requests 6 --max-tokens 4 \
  --request-rate 4 --arrival-seed 7 >"$tmp/open.json" 2>"$tmp/open.err"
code=$?
if [ "$code" -eq 0 ]; then pass "open loop exit 0"; else fail "open loop exit $code: $(head -c 600 "$tmp/open.err")"; fi
check "open loop: 6 requests, no errors" "$tmp/open.json" 'd["requests"] == 6 and d["errors"] == 0'
check "open loop: Poisson at 4/s" "$tmp/open.json" 'd["arrival"] == "poisson" and d["request_rate"] == 4 and d["arrival_seed"] == 7'
check "open loop: requests paced by their arrivals" "$tmp/open.json" \
  'd["last_arrival_s"] > 0 and d["duration_s"] >= d["last_arrival_s"] and d["e2e_s"]["p99"] > 0'
# One client against 50 arrivals a second: requests wait for it, and that
# wait is part of their latency.
"$lazykv" bench-serve --url "$url" --model "$model" --concurrency 1 --requests 6 --max-tokens 4 \
  --request-rate 50 >"$tmp/queued.json" 2>"$tmp/queued.err"
code=$?
if [ "$code" -eq 0 ]; then pass "queued open loop exit 0"; else fail "queued open loop exit $code: $(head -c 600 "$tmp/queued.err")"; fi
check "open loop: a busy client delays later arrivals" "$tmp/queued.json" 'd["start_delay_s"]["p99"] > 0.05'
check "open loop: latency counts from arrival" "$tmp/queued.json" \
  'd["e2e_s"]["p99"] >= d["start_delay_s"]["p99"] and d["ttft_s"]["p99"] >= d["start_delay_s"]["p99"]'
closed_port=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
for seed in 7 8; do
  "$lazykv" bench-serve --url "http://127.0.0.1:$closed_port" --model "$model" --concurrency 2 --requests 6 \
    --request-rate 4 --arrival-seed "$seed" >"$tmp/schedule$seed.json" 2>/dev/null
done
if /usr/bin/python3 - "$tmp/open.json" "$tmp/schedule7.json" "$tmp/schedule8.json" <<'PY'
import json, sys
a, same, other = (json.load(open(f))["last_arrival_s"] for f in sys.argv[1:])
sys.exit(0 if a == same and a != other else 1)
PY
then pass "open loop: a seed fixes the schedule"; else fail "open loop schedules: $(cat "$tmp/schedule7.json" | head -c 300)"; fi

# Bad flags exit 2.
"$lazykv" bench-serve --url "$url" --concurrency 0 >/dev/null 2>&1
code=$?
if [ "$code" -eq 2 ]; then pass "bad flag exit 2"; else fail "bad flag exit $code, expected 2"; fi
for rate in -1 1e-9 nan; do
  "$lazykv" bench-serve --url "$url" --request-rate "$rate" >/dev/null 2>&1
  code=$?
  if [ "$code" -eq 2 ]; then pass "request rate $rate exit 2"; else fail "request rate $rate exit $code, expected 2"; fi
done

# A closed port: every request is a connection error, exit 1.
"$lazykv" bench-serve --url "http://127.0.0.1:$closed_port" --model "$model" --concurrency 2 --requests 4 \
  >"$tmp/closed.json" 2>/dev/null
code=$?
if [ "$code" -eq 1 ]; then pass "closed port exit 1"; else fail "closed port exit $code, expected 1"; fi
check "closed port: every request an error" "$tmp/closed.json" \
  'd["requests"] == 4 and d["errors"] == 4 and d["output_tokens"] == 0 and len(d["error_samples"]) == 4'

# SIGTERM: the server drains and exits 0.
kill -TERM "$server_pid"
wait "$server_pid"
code=$?
server_pid=""
if [ "$code" -eq 0 ]; then pass "server exit 0 on SIGTERM"; else fail "server exit $code on SIGTERM: $(tail -c 400 "$tmp/serve.err")"; fi

if [ "$failures" -ne 0 ]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "all bench-serve checks passed"
