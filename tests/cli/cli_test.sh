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
# A worker's tensor-parallel collective: an unknown name lists the valid ones;
# NCCL where it cannot run fails at start-up, before the model loads, saying why.
expect_exit 2 "unknown collective" "$lazykv" worker --model "$model" --world 2 --collective mpi
expect_in "$tmp/err" "unknown collective 'mpi' (valid: gloo, nccl)" "unknown collective lists the valid ones"
if nvidia-smi -L >/dev/null 2>&1; then
  pass "nccl without a CUDA device: skipped (this machine has one)"
else
  # (bounded and on a free port, in case CUDA sees a device after all)
  expect_exit 1 "nccl without a CUDA device" timeout 60 "$lazykv" worker --model "$model" --world 2 --collective nccl \
    --listen 127.0.0.1:0
  if grep -qE -- "--collective nccl: (no CUDA device is usable|this lazykv was built without NCCL)" \
    "$tmp/err"; then pass "nccl without a CUDA device says why"; else fail "nccl without a CUDA device: $(cat "$tmp/err")"; fi
fi
# Where the forward pass runs: an unknown device lists the valid ones; CUDA
# where it cannot run fails before the model loads, saying why.
expect_exit 2 "unknown device" "$lazykv" serve --model "$model" --device tpu --port 0
expect_in "$tmp/err" "unknown device 'tpu': use cpu or cuda" "unknown device lists the valid ones"
if nvidia-smi -L >/dev/null 2>&1; then
  pass "cuda without a CUDA device: skipped (this machine has one)"
else
  for cmd in serve worker bench; do
    expect_exit 1 "$cmd --device cuda without a CUDA device" timeout 60 "$lazykv" $cmd --model "$model" --device cuda \
      $([ $cmd = worker ] && echo --listen 127.0.0.1:0) $([ $cmd = serve ] && echo --port 0)
    if grep -qE -- "--device cuda: (no CUDA device is usable|this lazykv was built without the CUDA backend)" \
      "$tmp/err"; then pass "$cmd: cuda without a device says why"; else fail "$cmd --device cuda: $(cat "$tmp/err")"; fi
  done
fi
# Synthetic models: any command takes synth:<shape>:<type>; bench measures it
# without a file, synth-model writes the same model as GGUF for llama.cpp.
expect_exit 0 "bench a synthetic model" "$lazykv" bench --model synth:smollm2-135m:q4_1 --prefill-tokens 8 \
  --decode-contexts 8 --decode-batches 2 --decode-steps 2 --reps 1
if python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
assert d["model"] == "synth-smollm2-135m-q4_1" and d["model_path"] == "synth:smollm2-135m:q4_1", d
assert d["prefill8_tok_s"] > 0 and d["decode_ctx8_tok_s"] > 0 and d["decode_batch2_ctx128_tok_s"] > 0, d
assert 0 < d["memory"]["decode_ctx8_fraction_of_read"] < 2, d["memory"]
' "$tmp/out"; then pass "synthetic bench JSON"; else fail "synthetic bench JSON: $(head -c 400 "$tmp/out")"; fi
expect_exit 0 "synth-model writes a GGUF" "$lazykv" synth-model --model synth:smollm2-135m:q8_0 --out "$tmp/synth.gguf"
expect_exit 0 "generate from the written synthetic model" "$lazykv" generate --model "$tmp/synth.gguf" --prompt "Hi" \
  --max-tokens 4
expect_in "$tmp/err" "4 generated" "the written synthetic model generates"
expect_exit 2 "an unknown synthetic shape" "$lazykv" generate --model synth:gpt5:q4_0 --prompt "Hi"
expect_in "$tmp/err" "unknown shape 'gpt5'" "an unknown synthetic shape is named"

expect_exit 0 "help" "$lazykv" generate --help
expect_in "$tmp/out" "--max-tokens" "help lists flags"
expect_in "$tmp/out" "KV eviction policy: full, lazy, lazy+tiers, streaming, h2o, tova, snapkv, rkv, raas, caote, obcache" \
  "help lists every policy of the catalog"
expect_in "$tmp/out" "snapkv, rkv, skipkv: observation window" "a shared policy flag says what each policy means by it"

# lazykv eval: a tiny accuracy run on the GSM8K fixtures and a tiny fidelity
# run; both write JSON with the documented fields and a PNG plot.
eval_data="$(cd "$(dirname "$0")/../data/eval" && pwd)"
expect_exit 0 "eval accuracy" "$lazykv" eval accuracy --model "$model" --dataset gsm8k --data-dir "$eval_data" \
  --limit 2 --max-tokens 24 --policies lazy --budgets 0.5 --output "$tmp/acc.json" --records "$tmp/acc.jsonl"
if python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
assert d["dataset"] == "gsm8k" and d["n"] == 2 and d["max_tokens"] == 24 and d["wall_s"] > 0, d
r = d["results"]
assert [x["policy"] for x in r] == ["full", "lazy"] and r[1]["budget_ratio"] == 0.5, r
for x in r:
    for k in ("accuracy", "correct", "n", "mean_generated_tokens", "mean_peak_kv_bytes", "max_peak_kv_bytes"):
        assert k in x, k
    assert x["n"] == 2 and 0 <= x["accuracy"] <= 1 and x["max_peak_kv_bytes"] > 0, x
assert r[1]["max_peak_kv_bytes"] < r[0]["max_peak_kv_bytes"], r
lines = [json.loads(l) for l in open(sys.argv[2])]
assert lines[0]["kind"] == "accuracy_records" and lines[0]["max_tokens"] == 24, lines[0]
recs = lines[1:]
assert len(recs) == 4 and all("prediction" in x and "gold" in x for x in recs), recs
' "$tmp/acc.json" "$tmp/acc.jsonl"; then pass "eval accuracy JSON"; else fail "eval accuracy JSON"; fi
# The paper's budgets (a ratio of the answer, the prompt kept on top) and
# policies matched at equal peak KV; every row says where its answers stopped.
expect_exit 0 "eval accuracy, generated base, equal peak" "$lazykv" eval accuracy --model "$model" --dataset gsm8k \
  --data-dir "$eval_data" --limit 1 --max-tokens 24 --policies lazy,h2o --budgets 0.5 --budget-base generated \
  --match peak --loop-window 16 --output "$tmp/acc_peak.json"
if python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
assert d["budget_base"] == "generated" and d["match"] == "peak" and d["loop_window"] == 16, d
r = d["results"]
assert [x["policy"] for x in r] == ["full", "lazy", "h2o"], r
for x in r:
    assert 0 < x["mean_kv_bytes"] <= x["mean_peak_kv_bytes"], x
    assert 0 < x["mean_slots_per_head"] <= x["mean_peak_slots_per_head"], x
    assert x["at_length"] + x["loops"] <= x["n"], x
assert r[1]["mean_peak_kv_bytes"] <= r[0]["mean_peak_kv_bytes"], r
' "$tmp/acc_peak.json"; then pass "eval accuracy at equal peak JSON"; else fail "eval accuracy at equal peak JSON"; fi
expect_exit 2 "eval accuracy bad --match" "$lazykv" eval accuracy --model "$model" --data-dir "$eval_data" --limit 1 \
  --match avg
expect_in "$tmp/err" "--match: 'avg' is not budget, mean or peak" "bad --match explained"

# --resume: a run stopped after one record goes on from the file, runs only
# what is missing and reports what the whole run reported.
head -n 2 "$tmp/acc.jsonl" >"$tmp/part.jsonl"
expect_exit 0 "eval accuracy --resume" "$lazykv" eval accuracy --model "$model" --dataset gsm8k --data-dir "$eval_data" \
  --limit 2 --max-tokens 24 --policies lazy --budgets 0.5 --output "$tmp/acc2.json" --records "$tmp/part.jsonl" --resume
if python3 -c '
import json, sys
a, b = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
assert b["resumed_records"] == 1, b
assert a["results"] == b["results"], (a["results"], b["results"])
lines = open(sys.argv[3]).read().splitlines()
assert len(lines) == 5, lines
' "$tmp/acc.json" "$tmp/acc2.json" "$tmp/part.jsonl"; then pass "resumed run matches"; else fail "resumed run matches"; fi
expect_exit 2 "resume with other settings" "$lazykv" eval accuracy --model "$model" --dataset gsm8k --data-dir "$eval_data" \
  --limit 2 --max-tokens 32 --policies lazy --budgets 0.5 --output "$tmp/acc3.json" --records "$tmp/part.jsonl" --resume
expect_in "$tmp/err" "max_tokens 24, this run has 32" "resume refuses another run's records"
expect_exit 2 "resume without records" "$lazykv" eval accuracy --model "$model" --data-dir "$eval_data" --limit 1 --resume
expect_in "$tmp/err" "--resume needs the --records file" "resume needs records"
if [ "$(head -c 8 "$tmp/acc.png" | od -An -tx1 | tr -d ' \n')" = "89504e470d0a1a0a" ]; then
  pass "eval accuracy PNG"; else fail "eval accuracy PNG"; fi

expect_exit 0 "eval fidelity" "$lazykv" eval fidelity --model "$model" --data-dir "$eval_data" --length 48 \
  --n-prompts 1 --policies lazy,streaming --budgets 0.5 --speed-steps 16 --output "$tmp/fid.json"
if python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
assert d["length"] == 48 and d["prompts"] == 1 and d["wall_s"] > 0 and "param_rule" in d, d
c = d["configs"]
assert [x["policy"] for x in c] == ["full", "lazy", "streaming"], c
for x in c:
    for k in ("params", "budget_ratio", "budget_slots", "top1_agreement", "mean_kl", "peak_kv_bytes",
              "full_peak_kv_bytes", "decode_tok_s", "policy_seconds", "mean_kv_bytes", "mean_slots_per_head",
              "peak_slots_per_head"):
        assert k in x, k
    assert 0 <= x["top1_agreement"] <= 1 and x["mean_kl"] >= 0 and x["decode_tok_s"] > 0, x
assert c[0]["top1_agreement"] == 1 and c[0]["mean_kl"] == 0, c[0]
assert c[1]["budget_slots"] == 24 and c[1]["params"]["window"] == 6, c[1]
assert all(x["peak_kv_bytes"] < x["full_peak_kv_bytes"] for x in c[1:]), c
' "$tmp/fid.json"; then pass "eval fidelity JSON"; else fail "eval fidelity JSON"; fi
if [ "$(head -c 8 "$tmp/fid.png" | od -An -tx1 | tr -d ' \n')" = "89504e470d0a1a0a" ]; then
  pass "eval fidelity PNG"; else fail "eval fidelity PNG"; fi
# eval/plot.py draws results of one run split by policy together; it refuses
# to mix accuracy and fidelity results.
plot_py="$(dirname "$0")/../../eval/plot.py"
expect_exit 0 "plot of two results" /usr/bin/python3 "$plot_py" "$tmp/fid.json" "$tmp/fid.json" "$tmp/both.png"
if [ "$(head -c 8 "$tmp/both.png" | od -An -tx1 | tr -d ' \n')" = "89504e470d0a1a0a" ]; then
  pass "plot of two results is a PNG"; else fail "plot of two results is a PNG"; fi
expect_exit 1 "plot of mixed results" /usr/bin/python3 "$plot_py" "$tmp/fid.json" "$tmp/acc.json" "$tmp/mixed.png"
expect_in "$tmp/err" "mixed accuracy and fidelity" "plot names the mix"
expect_exit 1 "eval missing data" "$lazykv" eval accuracy --model "$model" --data-dir "$tmp/none" --limit 1
expect_in "$tmp/err" "$tmp/none/gsm8k_test.jsonl" "eval missing data names the path"
expect_exit 2 "eval unknown policy" "$lazykv" eval accuracy --model "$model" --data-dir "$eval_data" --policies bogus
expect_in "$tmp/err" "valid policies" "eval unknown policy lists the valid ones"

# Eviction policies from the command line: the summary reports the bounded peak.
expect_exit 0 "generate with lazy" "$lazykv" generate --model "$model" --chat --prompt "Count from 1 to 30." \
  --max-tokens 80 --kv-policy lazy --kv-budget 48 --kv-window 16
expect_in "$tmp/err" "kv policy lazy(alpha=0.0001,budget=48,keep_prompt=0,per_query_head=0,window=16)" "lazy policy summary"
expect_exit 0 "generate with caote" "$lazykv" generate --model "$model" --chat --prompt "Count from 1 to 30." \
  --max-tokens 80 --kv-policy caote --kv-budget 48 --kv-recent 8
expect_in "$tmp/err" "kv policy caote(budget=48,keep_prompt=0,recent=8)" "caote policy summary"
expect_exit 2 "caote recent not below budget" "$lazykv" generate --model "$model" --prompt hi --kv-policy caote --kv-budget 16
expect_in "$tmp/err" "recent (32) must be smaller than budget (16)" "caote recent rule explained"
expect_exit 0 "generate with obcache" "$lazykv" generate --model "$model" --chat --prompt "Count from 1 to 30." \
  --max-tokens 80 --kv-policy obcache --kv-budget 48 --kv-recent 8 --kv-accumulate 0
expect_in "$tmp/err" "kv policy obcache(accumulate=0,budget=48,keep_prompt=0,recent=8)" "obcache policy summary"
expect_exit 2 "obcache accumulate out of range" "$lazykv" generate --model "$model" --prompt hi --kv-policy obcache \
  --kv-budget 64 --kv-accumulate 2
expect_in "$tmp/err" "accumulate" "obcache accumulate range named"
# A policy this model cannot run (no query statistics beside this copy) is
# refused when the server starts, not on the first request.
ln -s "$model" "$tmp/no-stats.gguf"
# skipkv's activation steering: lazykv steer measures a vector over a text of
# thoughts (blank lines between them, one re-checking) and writes it where the
# model finds it; generate steers with it; without one, steer > 0 is refused.
ln -s "$model" "$tmp/steered.gguf"
printf 'First add the apples: 3 + 4 = 7.\n\nThen double them: 7 * 2 = 14.\n\nWait, let me check: 7 * 2 is 14.\n\nSo the answer is 14.\n\n' \
  > "$tmp/thoughts.txt"
expect_exit 0 "steer measures a vector" "$lazykv" steer --model "$tmp/steered.gguf" --input "$tmp/thoughts.txt" \
  --min-thoughts 1
expect_in "$tmp/out" '"reflection_thoughts":1' "steer counts the thought that re-checks"
expect_in "$tmp/steered.gguf.steer.json" '"format":"lazykv-steering"' "steer writes the vector beside the model"
expect_exit 0 "generate with skipkv steering" "$lazykv" generate --model "$tmp/steered.gguf" --chat \
  --prompt "Add 3 and 4, then double it. Reason in short steps, a blank line between them." --max-tokens 80 \
  --kv-policy skipkv --kv-budget 48 --kv-window 8 --kv-period 16 --kv-steer 1
expect_in "$tmp/err" "kv policy skipkv(" "skipkv policy summary"
expect_exit 2 "skipkv steering without a vector" "$lazykv" generate --model "$tmp/no-stats.gguf" --prompt hi \
  --kv-policy skipkv --kv-steer 1
expect_in "$tmp/err" "lazykv steer --model" "it says how to measure one"
printf 'First add: 3 + 4 = 7.\n\nThen double: 14.\n\n' > "$tmp/no-reflection.txt"
expect_exit 2 "steer without a thought that re-checks" "$lazykv" steer --model "$tmp/steered.gguf" \
  --input "$tmp/no-reflection.txt" --output "$tmp/none.json"
expect_in "$tmp/err" "at least 8 of each kind are needed" "steer says what the text lacks"
expect_exit 2 "serve a policy the model cannot run" timeout 60 "$lazykv" serve --model "$tmp/no-stats.gguf" \
  --kv-policy triattention --port 0
expect_in "$tmp/err" "--kv-policy triattention cannot run on this model" "the policy the model cannot run is named"
expect_in "$tmp/err" "lazykv calibrate" "it says how to make the statistics"
expect_exit 2 "unknown policy" "$lazykv" generate --model "$model" --prompt hi --kv-policy bogus
expect_in "$tmp/err" "valid policies: full, lazy, lazy+tiers, streaming, h2o, tova, snapkv, rkv, raas, caote, obcache" "unknown policy lists the valid ones"
expect_exit 2 "parameter the policy lacks" "$lazykv" generate --model "$model" --prompt hi --kv-policy streaming --kv-window 8
expect_in "$tmp/err" "policy streaming has no parameter 'window'" "parameter the policy lacks is named"
expect_exit 2 "window not below budget" "$lazykv" generate --model "$model" --prompt hi --kv-policy lazy --kv-budget 8 --kv-window 8
expect_in "$tmp/err" "window (8) must be smaller than budget (8)" "window rule explained"

# replay-policy: the hand-worked LazyEviction trace, from a file and from stdin.
trace_dir="$(cd "$(dirname "$0")/../data/policy" && pwd)"
python3 -c 'import json,sys; json.dump(json.load(open(sys.argv[1]))["trace"], open(sys.argv[2], "w"))' \
  "$trace_dir/lazy_hand.json" "$tmp/trace.json"
expect_exit 0 "replay-policy" "$lazykv" replay-policy --trace "$tmp/trace.json" --output "$tmp/replay.json"
if python3 -c '
import json, sys
got = json.load(open(sys.argv[1]))
want = json.load(open(sys.argv[2]))["expected"]
assert [s["kept"] for s in got["steps"]] == [s["kept"] for s in want["steps"]], got
assert [s["state"] for s in got["steps"]] == [s["state"] for s in want["steps"]], got
' "$tmp/replay.json" "$trace_dir/lazy_hand.json"; then pass "replay-policy matches the hand-worked trace"; else fail "replay-policy matches the hand-worked trace"; fi
expect_exit 0 "replay-policy from stdin" bash -c "'$lazykv' replay-policy --trace - < '$tmp/trace.json'"
expect_in "$tmp/out" '"steps"' "replay-policy from stdin prints the result"
echo '{"policy": {"name": "lazy"}, "H": 1, "D": 2, "prompt_keys": [[[1, 0]]], "steps": [{"query": [[1]], "new_key": [[0, 1]]}]}' > "$tmp/bad.json"
expect_exit 2 "replay-policy malformed trace" "$lazykv" replay-policy --trace "$tmp/bad.json"
expect_in "$tmp/err" "steps[0].query[0] must be an array of 2 numbers" "malformed trace names the field"
echo '{"policy": {' > "$tmp/bad.json"
expect_exit 2 "replay-policy invalid JSON" "$lazykv" replay-policy --trace "$tmp/bad.json"
expect_in "$tmp/err" "is not valid JSON" "invalid JSON is reported"

[ "$failures" -eq 0 ]
