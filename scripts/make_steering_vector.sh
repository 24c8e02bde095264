#!/usr/bin/env bash
# Measures a model's steering vector for skipkv's activation steering
# (docs/policies.md, skipkv): the model answers GSM8K problems (500 on, apart
# from the first 100 that docs/results.md evaluates) with the instruction to
# check its work, and `lazykv steer` measures over its own answers, thoughts
# split at blank lines.
#
# usage: scripts/make_steering_vector.sh MODEL [PROBLEMS] [OUTPUT]
#   MODEL     a GGUF file
#   PROBLEMS  answers to measure over (default 64)
#   OUTPUT    the vector's file (default: beside the model, where it is found)
# LAZYKV_BIN names the lazykv binary (default build/cli/lazykv).
set -euo pipefail
model=${1:?usage: $0 MODEL [PROBLEMS] [OUTPUT]}
problems=${2:-64}
output=${3:-}
lazykv=${LAZYKV_BIN:-build/cli/lazykv}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

"$lazykv" eval accuracy --model "$model" --dataset gsm8k --offset 500 --limit "$problems" --max-tokens 512 \
  --batch 16 --policies full --instruction check --answer-text --records "$work/answers.jsonl" \
  --output "$work/accuracy.json" >&2
# The answers, one after another, a blank line between them.
python3 -c '
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    if r.get("kind") != "accuracy_records" and r.get("text"):
        print(r["text"].strip() + "\n")
' "$work/answers.jsonl" > "$work/answers.txt"
"$lazykv" steer --model "$model" --input "$work/answers.txt" ${output:+--output "$output"}
