#!/usr/bin/env bash
# Two builds of `lazykv serve` under the same load, alternately (A B A B ...,
# ROUNDS times), so that a change to the serving path can be shown not to
# cost throughput or latency: output tokens/s, TTFT and inter-token latency
# from `lazykv bench-serve` (streamed chat, ignore_eos) at each concurrency.
# Prints one JSON object: per build, per concurrency, one bench-serve result
# per round.
#   usage: bench/serve/compare_builds.sh LAZYKV_BEFORE LAZYKV_AFTER MODEL.gguf
#   env:   THREADS (2), CONCURRENCY ("1 8 32"), MAX_TOKENS (64), PROMPT_TOKENS (128), ROUNDS (2)
set -euo pipefail
shopt -s inherit_errexit
before=$1 after=$2 model=$3
threads=${THREADS:-2}
levels=${CONCURRENCY:-"1 8 32"}
max_tokens=${MAX_TOKENS:-64}
prompt_tokens=${PROMPT_TOKENS:-128}
rounds=${ROUNDS:-2}
max_level=$(tr ' ' '\n' <<<"$levels" | sort -n | tail -1)
work=$(mktemp -d)
server=""
trap '[ -n "$server" ] && kill "$server" 2>/dev/null; rm -rf "$work"' EXIT

# run BINARY LEVEL OUT: a fresh server of BINARY, one bench-serve at LEVEL into OUT.
run() {
  local binary=$1 c=$2 out=$3 port=$((20000 + RANDOM % 20000))
  "$binary" serve --model "$model" --port "$port" --threads "$threads" --max-batch "$max_level" >"$work/serve.log" 2>&1 &
  server=$!
  for _ in $(seq 1 600); do
    curl -sf "http://127.0.0.1:$port/v1/models" >/dev/null 2>&1 && break
    sleep 0.2
  done
  local n=$((c * 4 > 8 ? c * 4 : 8))
  "$after" bench-serve --url "http://127.0.0.1:$port" --concurrency "$c" --requests "$n" --max-tokens "$max_tokens" \
    --prompt-tokens-approx "$prompt_tokens" --temperature 0 --ignore-eos --warmup 1 >"$out"
  kill -TERM "$server"
  wait "$server" || true
  server=""
}

for round in $(seq 1 "$rounds"); do
  for c in $levels; do
    run "$before" "$c" "$work/before.$c.$round.json"
    run "$after" "$c" "$work/after.$c.$round.json"
  done
done

/usr/bin/python3 - "$work" "$levels" "$rounds" "$threads" "$(basename "$model")" <<'PY'
import json, sys
work, levels, rounds, threads, model = sys.argv[1], sys.argv[2].split(), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
out = {"model": model, "threads": threads, "rounds": rounds}
for build in ("before", "after"):
    out[build] = {c: [json.load(open(f"{work}/{build}.{c}.{r}.json")) for r in range(1, rounds + 1)] for c in levels}
print(json.dumps(out))
PY
