#!/usr/bin/env bash
# Tool calls end to end with the OpenAI Python client, on the optional
# Qwen2.5-Coder-1.5B model (its chat template teaches <tool_call>):
# skipped (77) when that model is not cached (scripts/fetch_optional_model.sh).
#   usage: tool_calls_test.sh LAZYKV_BINARY
set -uo pipefail
bin=$1
model=${LAZYKV_CACHE_DIR:-$HOME/.cache/lazykv}/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
[ -f "$model" ] || { echo "skipped: the optional model is not cached ($model)"; exit 77; }
[ -x "${LAZYKV_E2E_PYTHON:-}" ] || { echo "skipped: LAZYKV_E2E_PYTHON is not set"; exit 77; }
. "$(dirname "$0")/lib.sh"
"$bin" serve --model "$model" --port 0 --ctx 4096 >"$work/serve.log" 2>&1 &
pids+=($!)
url=$(wait_for_line "$work/serve.log" 'listening on http://[0-9.:]*' "${pids[0]}")
[ -n "$url" ] || { cat "$work/serve.log" >&2; exit 1; }
"$LAZYKV_E2E_PYTHON" "$(dirname "$0")/tool_calls_client.py" "${url#listening on }" "$(basename "$model" .gguf)"
