#!/usr/bin/env bash
# What `lazykv router` costs and what a second replica gives, on one
# machine: (1) one `lazykv serve` (THREADS threads) measured directly and
# through a router, alternately: GET /v1/models (the proxy alone), short
# generations at concurrency 1 (the router's added latency per request: TTFT
# and end to end) and generations at concurrency 32; (2) two
# servers of THREADS/2 threads each behind the router at concurrency 32, the
# same total cores (on a 2-core machine this shows overhead, not gains).
# Load: `lazykv bench-serve`, streamed chat, ignore_eos. Prints one JSON object.
#   usage: bench/serve/router_overhead.sh LAZYKV_BINARY MODEL.gguf
#   env:   THREADS (2), ROUNDS (3), SHORT_REQUESTS (100: ~16-token prompts, 2 tokens out), LONG_REQUESTS (128)
set -euo pipefail
shopt -s inherit_errexit
bin=$1 model=$2
threads=${THREADS:-2}
rounds=${ROUNDS:-3}
short_requests=${SHORT_REQUESTS:-100}
long_requests=${LONG_REQUESTS:-128}
source "$(dirname "$0")/servers.sh"
load() {  # URL CONCURRENCY REQUESTS MAX_TOKENS PROMPT_TOKENS
  "$bin" bench-serve --url "$1" --concurrency "$2" --requests "$3" --max-tokens "$4" --ignore-eos \
    --prompt-tokens-approx "$5" --warmup 2
}

start one serve --model "$model" --threads "$threads" --max-batch 32
start routed router --replica "${one#http://}" --max-requests-per-replica 32
sleep 1.5  # the router's first probe
# The proxy alone: GET /v1/models (no model work), direct and routed in turn, new connection each.
python3 - "$one" "$routed" >"$work/models.json" <<'PY'
import json, statistics, sys, time, urllib.request
direct, routed, times = sys.argv[1], sys.argv[2], {"direct": [], "router": []}
for i in range(600):
    for name, url in (("direct", direct), ("router", routed)):
        t = time.perf_counter()
        urllib.request.urlopen(url + "/v1/models", timeout=10).read()
        times[name].append(time.perf_counter() - t)
q = lambda v, p: sorted(v)[int(p * (len(v) - 1))] * 1000
print(json.dumps({name: {"p50_ms": round(q(v, 0.5), 3), "p99_ms": round(q(v, 0.99), 3)} for name, v in times.items()}))
PY
for ((r = 0; r < rounds; r++)); do
  # Short requests, so the router's share of a request's time is visible.
  load "$one" 1 "$short_requests" 2 16 >"$work/direct_c1_$r.json"
  load "$routed" 1 "$short_requests" 2 16 >"$work/router_c1_$r.json"
done
load "$one" 32 "$long_requests" 32 128 >"$work/direct_c32.json"
load "$routed" 32 "$long_requests" 32 128 >"$work/router_c32.json"
stop_all

half=$(( threads / 2 > 0 ? threads / 2 : 1 ))
start a serve --model "$model" --threads "$half" --max-batch 16
start b serve --model "$model" --threads "$half" --max-batch 16
start pair router --replica "${a#http://}" --replica "${b#http://}" --max-requests-per-replica 16
sleep 1.5
load "$pair" 32 "$long_requests" 32 128 >"$work/two_replicas_c32.json"
stop_all

python3 - "$work" "$rounds" "$threads" <<'PY'
import json, os, statistics, sys
work, rounds, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def read(name):
    with open(os.path.join(work, name + ".json")) as f:
        return json.load(f)
def summary(d):
    return {"output_tokens_per_s": round(d["output_tokens_per_s"], 2), "requests_per_s": round(d["requests_per_s"], 3),
            "ttft_p50_s": d["ttft_s"]["p50"], "ttft_p99_s": d["ttft_s"]["p99"], "e2e_p50_s": d["e2e_s"]["p50"],
            "errors": d["errors"]}
direct = [read(f"direct_c1_{r}") for r in range(rounds)]
routed = [read(f"router_c1_{r}") for r in range(rounds)]
added = lambda key, q: [round(1000 * (x[key][q] - y[key][q]), 3) for x, y in zip(routed, direct)]
print(json.dumps({
    "threads": threads,
    "get_models_600x": read("models"),
    "concurrency_1": {"direct": [summary(d) for d in direct], "router": [summary(d) for d in routed],
                      "router_added_ttft_p50_ms": added("ttft_s", "p50"),
                      "router_added_e2e_p50_ms": added("e2e_s", "p50")},
    "concurrency_32": {"one_server_direct": summary(read("direct_c32")),
                       "one_server_router": summary(read("router_c32")),
                       "two_servers_router": summary(read("two_replicas_c32"))},
}, indent=1))
PY
