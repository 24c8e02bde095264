#!/usr/bin/env bash
# Sets everything up, then streams a chat completion from the default model.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
prompt="${1:-Explain in three sentences why the sky is blue.}"
exec build/cli/lazykv generate --model default --chat --max-tokens 200 --prompt "$prompt"
