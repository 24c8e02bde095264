#!/usr/bin/env bash
# Output tokens/s, TTFT and inter-token latency of `lazykv serve` and of
# llama.cpp's llama-server on the same GGUF, same machine, same load generator
# (`lazykv bench-serve`, streamed chat, ignore_eos so every request produces
# exactly --max-tokens), at several concurrencies (closed loop: each stream
# sends its next request when the last ends) and, when RATES is set, at
# several open-loop request rates (Poisson arrivals, the same seeded schedule
# for both servers, up to the largest concurrency in flight). Prints one JSON
# object.
#   usage: bench/serve/compare_servers.sh LAZYKV_BINARY LLAMA_SERVER_BINARY MODEL.gguf
#   env:   THREADS (2), CONCURRENCY ("1 8 32"), MAX_TOKENS (64), PROMPT_TOKENS (128),
#          RATES (requests/s, e.g. "0.5 1"; none by default), RATE_REQUESTS (32)
# llama-server is not part of lazykv: build it beside the project from a
# llama.cpp checkout (cmake --build build --target llama-server).
set -euo pipefail
shopt -s inherit_errexit  # a failing bench-serve inside $(...) stops the script too
lazykv=$1 llama=$2 model=$3
threads=${THREADS:-2}
levels=${CONCURRENCY:-"1 8 32"}
max_tokens=${MAX_TOKENS:-64}
prompt_tokens=${PROMPT_TOKENS:-128}
rates=${RATES:-}
rate_requests=${RATE_REQUESTS:-32}
max_level=$(tr ' ' '\n' <<<"$levels" | sort -n | tail -1)
work=$(mktemp -d)
server=""
trap '[ -n "$server" ] && kill "$server" 2>/dev/null; rm -rf "$work"' EXIT

wait_ready() {  # url
  for _ in $(seq 1 600); do
    curl -sf "$1/v1/models" >/dev/null 2>&1 && return 0
    sleep 0.2
  done
  echo "server at $1 did not come up" >&2
  return 1
}

run_levels() {  # name url
  local name=$1 url=$2 first=1
  printf '"%s": [' "$name"
  for c in $levels; do
    local n=$((c * 4 > 8 ? c * 4 : 8))
    [ $first = 1 ] || printf ','
    first=0
    "$lazykv" bench-serve --url "$url" --concurrency "$c" --requests "$n" --max-tokens "$max_tokens" \
      --prompt-tokens-approx "$prompt_tokens" --temperature 0 --ignore-eos --warmup 1
  done
  printf ']'
}

run_rates() {  # name url (open loop; client pool of the largest concurrency)
  local name=$1 url=$2 first=1
  printf '"%s": [' "$name"
  for r in $rates; do
    [ $first = 1 ] || printf ','
    first=0
    "$lazykv" bench-serve --url "$url" --concurrency "$max_level" --requests "$rate_requests" --request-rate "$r" \
      --max-tokens "$max_tokens" --prompt-tokens-approx "$prompt_tokens" --temperature 0 --ignore-eos --warmup 1
  done
  printf ']'
}

port=$((20000 + RANDOM % 20000))
"$lazykv" serve --model "$model" --port "$port" --threads "$threads" --max-batch "$max_level" >"$work/lazykv.log" 2>&1 &
server=$!
wait_ready "http://127.0.0.1:$port"
printf '{"model": "%s", "threads": %s, "max_tokens": %s, "prompt_tokens_approx": %s, ' \
  "$(basename "$model")" "$threads" "$max_tokens" "$prompt_tokens"
run_levels lazykv "http://127.0.0.1:$port"
open_loop_lazykv=$(run_rates lazykv "http://127.0.0.1:$port")
kill -TERM "$server"; wait "$server" || true
server=""

# llama-server gets one slot per concurrent stream at each level (its best
# configuration for that load), each slot with room for prompt + output.
printf ', "llama_server": ['
first=1
for c in $levels; do
  port=$((port + 1))
  "$llama" -m "$model" --port "$port" -t "$threads" -np "$c" -c $((c * 1024)) >"$work/llama.log" 2>&1 &
  server=$!
  wait_ready "http://127.0.0.1:$port"
  [ $first = 1 ] || printf ','
  first=0
  n=$((c * 4 > 8 ? c * 4 : 8))
  "$lazykv" bench-serve --url "http://127.0.0.1:$port" --concurrency "$c" --requests "$n" --max-tokens "$max_tokens" \
    --prompt-tokens-approx "$prompt_tokens" --temperature 0 --ignore-eos --warmup 1
  kill "$server"; wait "$server" 2>/dev/null || true
  server=""
done
printf ']'

if [ -n "$rates" ]; then
  port=$((port + 1))
  "$llama" -m "$model" --port "$port" -t "$threads" -np "$max_level" -c $((max_level * 1024)) >"$work/llama.log" 2>&1 &
  server=$!
  wait_ready "http://127.0.0.1:$port"
  open_loop_llama=$(run_rates llama_server "http://127.0.0.1:$port")
  kill "$server"; wait "$server" 2>/dev/null || true
  server=""
  printf ', "open_loop": {%s, %s}' "$open_loop_lazykv" "$open_loop_llama"
fi
printf '}\n'
