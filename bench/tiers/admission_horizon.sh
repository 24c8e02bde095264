#!/usr/bin/env bash
# The tier-2 admission rule measured (docs/results.md § 4): one `lazykv
# kvstore` (1 MiB host tier over RocksDB) per --nvme-admit-horizon, and the
# same greedy `lazykv generate` with lazy+tiers demoting to it; prints the
# generate summary and the kvstore's admission and request counters.
#   usage: bench/tiers/admission_horizon.sh [LAZYKV_BINARY] [MODEL]
set -uo pipefail
bin=${1:-build/cli/lazykv}
model=${2:-${LAZYKV_DEFAULT_MODEL:-$HOME/.cache/lazykv/models/SmolLM2-135M-Instruct.Q4_1.gguf}}
for horizon in 4096 256 32 0; do
  dir=$(mktemp -d)
  "$bin" kvstore --listen 127.0.0.1:0 --metrics-port 0 --host-capacity-mib 1 --alloc-unit-kib 4 \
    --nvme-path "$dir/nvme" --nvme-admit-horizon "$horizon" --transports tcp >"$dir/kvstore.log" 2>&1 &
  kvstore=$!
  for _ in $(seq 1 100); do grep -q /metrics "$dir/kvstore.log" && break; sleep 0.1; done
  port=$(grep -o 'control (gRPC) on [0-9.]*:[0-9]*' "$dir/kvstore.log" | sed 's/.*://')
  metrics=$(grep -o 'http://[0-9.:]*/metrics' "$dir/kvstore.log")
  "$bin" generate --model "$model" --chat --max-tokens 1000 --ignore-eos --threads 2 \
    --prompt "Explain step by step why the sum of two odd numbers is always even, with three examples." \
    --kv-policy lazy+tiers --kv-budget 64 --kv-window 8 --kv-alpha 0.001 \
    --kvstore "127.0.0.1:$port" --kvstore-transports tcp >/dev/null 2>"$dir/generate.err"
  echo "== --nvme-admit-horizon $horizon"
  grep '^\[tier' "$dir/generate.err"
  curl -s "$metrics" | grep -E '^lazykv_kvstore_(nvme_admissions|requests)_total'
  kill "$kvstore"
  wait "$kvstore" 2>/dev/null
  rm -rf "$dir"
done
