#!/usr/bin/env bash
# End-to-end checks of the lazykv binary: real model, real process, real exit
# codes and messages. Usage: cli_test.sh LAZYKV_BINARY
set -uo pipefail
lazykv=$1
model="${LAZYKV_DEFAULT_MODEL:?LAZYKV_DEFAULT_MODEL must point at the default model}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0
pass() { echo "ok: $1"; }
fail() { echo "FAIL: $1"; failures=$((failures + 1)); }

# expect_exit CODE NAME CMD...: runs CMD, checks its exit code, keeps output in $tmp/out.
expect_exit() {
  local code=$1 name=$2
  shift 2
  "$@" >"$tmp/out" 2>"$tmp/err"
  local got=$?
  if [ "$got" -eq "$code" ]; then pass "$name"; else fail "$name (exit $got, expected $code): $(head -c 400 "$tmp/err")"; fi
}
expect_in() {  # expect_in FILE TEXT NAME
  if grep -qF -- "$2" "$1"; then pass "$3"; else fail "$3: '$2' not in $(head -c 400 "$1")"; fi
}

# Greedy chat generation from the default model answers the question.
expect_exit 0 "generate --chat" "$lazykv" generate --model "$model" --chat \
  --prompt "What is the capital of France?" --max-tokens 12
expect_in "$tmp/out" "Paris" "greedy chat answer mentions Paris"
expect_in "$tmp/err" "finish: stop" "generation ends at end-of-turn"

# Same seed, same output; sampling flags are accepted.
"$lazykv" generate --model "$model" --prompt "Once upon a time" --max-tokens 16 --temperature 0.9 \
  --top-p 0.95 --top-k 40 --min-p 0.05 --seed 7 >"$tmp/a" 2>/dev/null
"$lazykv" generate --model "$model" --prompt "Once upon a time" --max-tokens 16 --temperature 0.9 \
  --top-p 0.95 --top-k 40 --min-p 0.05 --seed 7 >"$tmp/b" 2>/dev/null
if cmp -s "$tmp/a" "$tmp/b" && [ -s "$tmp/a" ]; then pass "same seed, same output"; else fail "same seed, same output"; fi

# A stop string ends generation before it is printed.
expect_exit 0 "stop string" "$lazykv" generate --model "$model" --chat --prompt "Count from 1 to 10." \
  --max-tokens 60 --stop "5"
if grep -q "5" "$tmp/out"; then fail "stop string not printed"; else pass "stop string not printed"; fi

# Environment variables set flags.
LAZYKV_MAX_TOKENS=3 "$lazykv" generate --model "$model" --prompt "Hello" >"$tmp/out" 2>"$tmp/err"
expect_in "$tmp/err" "3 generated" "LAZYKV_MAX_TOKENS sets --max-tokens"

# Bad input: clear errors, right exit codes, no crash.
expect_exit 2 "unknown flag" "$lazykv" generate --model "$model" --prompt hi --bogus 1
expect_in "$tmp/err" "unknown flag --bogus" "unknown flag is named"
expect_exit 2 "missing prompt" "$lazykv" generate --model "$model"
expect_exit 2 "bad temperature" "$lazykv" generate --model "$model" --prompt hi --temperature -1
expect_in "$tmp/err" "temperature" "bad temperature is named"
expect_exit 2 "bad activations" "$lazykv" generate --model "$model" --prompt hi --activations int4
expect_exit 2 "oversize request" "$lazykv" generate --model "$model" --prompt hi --max-tokens 100000
expect_in "$tmp/err" "exceeds the context" "oversize request explained"
expect_exit 1 "missing model" "$lazykv" generate --model "$tmp/nope.gguf" --prompt hi
expect_in "$tmp/err" "not found" "missing model is named"
head -c 100000 "$model" >"$tmp/truncated.gguf"
expect_exit 1 "truncated model" "$lazykv" generate --model "$tmp/truncated.gguf" --prompt hi
expect_in "$tmp/err" "gguf:" "truncated model is a gguf error"
printf 'not a model at all' >"$tmp/garbage.gguf"
expect_exit 1 "garbage model" "$lazykv" generate --model "$tmp/garbage.gguf" --prompt hi
LAZYKV_CACHE_DIR="$tmp/empty-cache" "$lazykv" generate --model default --prompt hi >"$tmp/out" 2>"$tmp/err"
expect_in "$tmp/err" "run scripts/setup.sh" "missing default model says how to fetch it"
expect_exit 2 "unknown command" "$lazykv" frobnicate
expect_exit 0 "help" "$lazykv" generate --help
expect_in "$tmp/out" "--max-tokens" "help lists flags"

[ "$failures" -eq 0 ]
