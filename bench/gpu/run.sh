#!/usr/bin/env bash
# Every GPU check and benchmark of the CUDA engine, on a machine with a GPU:
# the CUDA tests, the decode matmul and attention against the GPU's own copy
# rate (cuda_matmul_bandwidth, cuda_attention_bandwidth), `lazykv bench
# --device cuda` on each model (CUDA graphs on, and once off), and
# llama.cpp's CUDA build on the same files when its bin folder is given.
# Builds nothing; writes each step's output to OUT_DIR as it finishes (so a
# run cut short keeps what it did) and OUT_DIR/summary.json with the ratios.
#
#   usage: bench/gpu/run.sh OUT_DIR MODEL... [-- LLAMA_CPP_BIN_DIR]
#   MODEL: a GGUF file, or a synthetic model (synth:llama3-8b:q4_1), written
#   once to OUT_DIR/models by `lazykv synth-model` so both engines read it
#   env:   LAZYKV_BIN (build/cli/lazykv), LAZYKV_CUDA_TESTS
#          (build/tests/lazykv_cuda_tests), LAZYKV_MATMUL_BENCH
#          (build/bench/cuda_matmul_bandwidth), LAZYKV_ATTENTION_BENCH
#          (build/bench/cuda_attention_bandwidth), BENCH_FLAGS (extra `lazykv
#          bench` flags, e.g. "--reps 1"), INT8_BENCH_FLAGS (the same for the
#          run with --activations int8; default BENCH_FLAGS), SKIP_INT8=1 (no
#          int8 run), SKIP_KERNELS=1 (no tests and no
#          matmul benchmark: models only), LLAMA_BENCH (llama-bench, default
#          in LLAMA_CPP_BIN_DIR; llama-batched-bench there gives the peer's
#          decode at depth), NCU (an ncu binary: a per-kernel profile of the
#          first model's decode)
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:?usage: $0 OUT_DIR MODEL... [-- LLAMA_CPP_BIN_DIR]}
shift
models=()
llama=""
while [ $# -gt 0 ]; do
  if [ "$1" = "--" ]; then llama=${2:-}; break; fi
  models+=("$1")
  shift
done
lazykv=${LAZYKV_BIN:-$root/build/cli/lazykv}
tests=${LAZYKV_CUDA_TESTS:-$root/build/tests/lazykv_cuda_tests}
matmul=${LAZYKV_MATMUL_BENCH:-$root/build/bench/cuda_matmul_bandwidth}
attention=${LAZYKV_ATTENTION_BENCH:-$root/build/bench/cuda_attention_bandwidth}
mkdir -p "$out"
for i in "${!models[@]}"; do
  m=${models[$i]}
  case $m in synth:*)
    file="$out/models/$(echo "${m#synth:}" | tr ':' '-').gguf"
    mkdir -p "$out/models"
    [ -f "$file" ] || "$lazykv" synth-model --model "$m" --out "$file" || exit 1
    models[$i]=$file
  esac
done

step() {  # step NAME COMMAND...: stdout to NAME.out, stderr to NAME.err, status to status.txt
  local name=$1
  shift
  local start=$SECONDS
  "$@" >"$out/$name.out" 2>"$out/$name.err"
  echo "$name rc=$? seconds=$((SECONDS - start))" | tee -a "$out/status.txt"
}

command -v nvidia-smi >/dev/null && nvidia-smi >"$out/nvidia-smi.txt" 2>&1
if [ -z "${SKIP_KERNELS:-}" ]; then
  step cuda_tests "$tests" --gtest_output=json:"$out/cuda_tests.json"
  step matmul_bandwidth "$matmul" 50
  step attention_bandwidth "$attention" 50
fi
for m in "${models[@]}"; do
  name=$(basename "$m" .gguf)
  # shellcheck disable=SC2086  # BENCH_FLAGS is a list of flags
  step "lazykv_$name" "$lazykv" bench --device cuda --model "$m" ${BENCH_FLAGS:-}
  # int8 activations (llama.cpp's arithmetic) on the types that have them
  # shellcheck disable=SC2086
  [ -n "${SKIP_INT8:-}" ] || step "lazykv_${name}_int8" "$lazykv" bench --device cuda --model "$m" --activations int8 \
    ${INT8_BENCH_FLAGS:-${BENCH_FLAGS:-}}
  # The same decode launching kernel by kernel: what the CUDA graphs save.
  step "lazykv_${name}_no_graphs" "$lazykv" bench --device cuda --model "$m" --no-cuda-graphs --reps 2 \
    --prefill-tokens 16 --decode-contexts 128 --decode-batches 8
  if [ -n "$llama" ]; then
    # pp512, pp4096 and tg128 with every layer on the GPU and flash attention (its fastest);
    # decode after 2048 and 8192 tokens of context (batched-bench: S_TG).
    # shellcheck disable=SC2086  # PEER_PROMPTS: llama-bench's comma list
    step "llama_$name" "${LLAMA_BENCH:-$llama/llama-bench}" -m "$m" -ngl 99 -fa 1 -p "${PEER_PROMPTS:-512,4096}" \
      -n 128 -r 3 -o json
    if [ -x "$llama/llama-batched-bench" ]; then
      for ctx in 2048 8192; do
        step "llama_${name}_ctx$ctx" "$llama/llama-batched-bench" -m "$m" -ngl 99 -fa -c $((ctx + 256)) \
          -npp $ctx -ntg 64 -npl 1
      done
      step "llama_${name}_batch8" "$llama/llama-batched-bench" -m "$m" -ngl 99 -fa -c 2048 -npp 128 -ntg 64 -npl 8
    fi
  fi
done
if [ -n "${NCU:-}" ] && [ ${#models[@]} -gt 0 ]; then
  # Decode kernels only: past the prefill's launches, a few hundred of the decode's.
  step ncu_decode "$NCU" --metrics gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed \
    --print-summary per-kernel --launch-skip 2000 --launch-count 300 \
    "$lazykv" bench --device cuda --model "${models[0]}" --prefill-tokens 8 --decode-contexts 128 \
    --decode-batches 1 --reps 1 --decode-steps 16
fi

python3 - "$out" "${models[@]}" <<'PY'
import json, os, sys
out, models = sys.argv[1], sys.argv[2:]
def load(path):
    try:
        return json.load(open(path))
    except (OSError, ValueError):
        return None
def s_tg(path):  # llama-batched-bench: S_TG t/s of the last table row
    try:
        rows = [l for l in open(path) if l.startswith("|") and l.split("|")[1].strip().isdigit()]
        return float(rows[-1].split("|")[8])
    except (OSError, IndexError, ValueError):
        return None
summary = {"matmul": load(f"{out}/matmul_bandwidth.out"), "attention": load(f"{out}/attention_bandwidth.out"),
           "models": {}}
tests = load(f"{out}/cuda_tests.json")
if tests:
    summary["cuda_tests"] = {k: tests.get(k) for k in ("tests", "failures", "disabled", "errors")}
for m in models:
    name = os.path.basename(m)[: -len(".gguf")] if m.endswith(".gguf") else os.path.basename(m)
    ours = load(f"{out}/lazykv_{name}.out") or {}
    ours_int8 = load(f"{out}/lazykv_{name}_int8.out") or {}
    entry = {"lazykv": ours, "lazykv_int8": ours_int8, "lazykv_no_graphs": load(f"{out}/lazykv_{name}_no_graphs.out")}
    bench = load(f"{out}/llama_{name}.out")
    if bench:
        peer = {}
        for e in bench:
            if e.get("n_gen") == 0:
                peer[f"prefill{e['n_prompt']}_tok_s"] = e["avg_ts"]
            elif e.get("n_prompt") == 0:
                peer["decode_ctx128_tok_s"] = e["avg_ts"]
        for ctx in (2048, 8192):
            peer[f"decode_ctx{ctx}_tok_s"] = s_tg(f"{out}/llama_{name}_ctx{ctx}.out")
        peer["decode_batch8_ctx128_tok_s"] = s_tg(f"{out}/llama_{name}_batch8.out")
        peer = {k: v for k, v in peer.items() if v is not None}
        entry["llama_cpp"] = peer
        for key, run in (("ratio_lazykv_over_llama_cpp", ours), ("ratio_lazykv_int8_over_llama_cpp", ours_int8)):
            entry[key] = {k: round(run[k] / v, 3) for k, v in peer.items() if v and isinstance(run.get(k), (int, float))}
    summary["models"][name] = entry
json.dump(summary, open(f"{out}/summary.json", "w"), indent=2)
print(json.dumps({n: {k: v for k, v in e.items() if k.startswith("ratio")} for n, e in summary["models"].items()},
                 indent=2))
PY
