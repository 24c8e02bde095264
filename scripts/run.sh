#!/usr/bin/env bash
# Sets everything up, then runs `lazykv serve` on the default model: the
# OpenAI-compatible API on http://127.0.0.1:8000 (it prints a curl example).
# Extra arguments go to `lazykv serve` (e.g. --port 9000 --kv-policy lazy --kv-budget 512).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec build/cli/lazykv serve --model default "$@"
