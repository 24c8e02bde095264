#!/usr/bin/env bash
# Trains TRIM-KV retention gates for a GGUF model (--kv-policy trimkv,
# docs/policies.md): scripts/train_trimkv.py in a Python environment of its own,
# made on the first run from the pins of scripts/trimkv/requirements.txt.
#
# usage: scripts/train_trimkv.sh MODEL.gguf [train_trimkv.py options]
#   e.g. scripts/train_trimkv.sh ~/.cache/lazykv/models/SmolLM2-135M-Instruct.Q4_1.gguf --minutes 20
#        scripts/train_trimkv.sh MODEL.gguf --check data/trimkv/MODEL.gguf.trimkv.safetensors
# The gates go to data/trimkv/<model file>.trimkv.safetensors unless --out says
# otherwise; `train_trimkv.py --help` lists the options.
#
#   LAZYKV_CACHE_DIR  holds the environment, venv-trimkv (default ~/.cache/lazykv)
#   LAZYKV_DATA_DIR   holds math500_test.jsonl (default ../shared/datasets)
#   PYTHON            interpreter that makes the environment (default python3)
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '[train-trimkv] %s\n' "$*" >&2; }

model=${1:?usage: $0 MODEL.gguf [train_trimkv.py options]}
shift
[ -f "$model" ] || { log "error: $model not found"; exit 1; }

venv="${LAZYKV_CACHE_DIR:-$HOME/.cache/lazykv}/venv-trimkv"
requirements=scripts/trimkv/requirements.txt
# The PyPI torch wheel is the CUDA build and needs its nvidia-* libraries even
# on the CPU (it does not import without them), so the first install fetches
# about 3 GB and takes a minute or two on a fast link. The copy of the pins
# inside the environment tells a later run whether it is up to date.
if ! cmp -s "$requirements" "$venv/requirements.txt" 2>/dev/null; then
  log "making the Python environment $venv"
  "${PYTHON:-python3}" -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --only-binary=:all: \
    -r "$requirements"
  cp "$requirements" "$venv/requirements.txt"
fi

# Everything the script reads is local: the GGUF carries config and tokenizer.
HF_HUB_OFFLINE=1 exec "$venv/bin/python" scripts/train_trimkv.py "$model" "$@"
