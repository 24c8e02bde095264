#!/usr/bin/env bash
# Runs `lazykv bench` (f32 and int8 activations) and llama.cpp's llama-bench /
# llama-batched-bench on the same GGUF with the same thread count, one after
# the other, and prints one JSON object with the numbers, the ratios (lazykv /
# llama.cpp) and each decode figure's fraction of the measured memory read
# rate.
# llama.cpp is built beside the project from a fetched snapshot (never
# committed); pass its build/bin folder.
#   usage: bench/compare_llama_cpp.sh LLAMA_CPP_BIN_DIR [MODEL] [THREADS]
# (LAZYKV_BIN overrides the lazykv binary, default build/cli/lazykv)
set -euo pipefail
bin=${1:?usage: $0 LLAMA_CPP_BIN_DIR [MODEL] [THREADS]}
root=$(cd "$(dirname "$0")/.." && pwd)
model=${2:-${LAZYKV_CACHE_DIR:-$HOME/.cache/lazykv}/models/SmolLM2-135M-Instruct.Q4_1.gguf}
threads=${3:-$(nproc)}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# Both activation modes: f32 (exact, the default) and int8 (llama.cpp's kind of arithmetic).
"${LAZYKV_BIN:-$root/build/cli/lazykv}" bench --model "$model" --threads "$threads" >"$tmp/lazykv.json"
"${LAZYKV_BIN:-$root/build/cli/lazykv}" bench --model "$model" --threads "$threads" --activations int8 \
  >"$tmp/lazykv_int8.json"
# pp512 and tg128 (llama-bench's standard tests), 5 repetitions.
"$bin/llama-bench" -m "$model" -t "$threads" -p 512 -n 128 -r 5 -o json >"$tmp/bench.json" 2>/dev/null
# Decode at depth: 2048 tokens of context, then 128 generated; and batch 8.
"$bin/llama-batched-bench" -m "$model" -t "$threads" -c 4096 -npp 2048 -ntg 128 -npl 1 >"$tmp/bb2048.txt" 2>/dev/null
"$bin/llama-batched-bench" -m "$model" -t "$threads" -c 4096 -npp 128 -ntg 128 -npl 8 >"$tmp/bb8.txt" 2>/dev/null

python3 - "$tmp" <<'PY'
import json, sys
tmp = sys.argv[1]
ours = json.load(open(f"{tmp}/lazykv.json"))
ours_int8 = json.load(open(f"{tmp}/lazykv_int8.json"))
bench = json.load(open(f"{tmp}/bench.json"))
def s_tg(path):  # S_TG t/s column of the last table row
    rows = [l for l in open(path) if l.startswith("|") and l.split("|")[1].strip().isdigit()]
    return float(rows[-1].split("|")[8])
peer = {
    "prefill_tok_s": next(e["avg_ts"] for e in bench if e["n_prompt"] == 512 and e["n_gen"] == 0),
    "decode_ctx128_tok_s": next(e["avg_ts"] for e in bench if e["n_prompt"] == 0 and e["n_gen"] == 128),
    "decode_ctx2048_tok_s": s_tg(f"{tmp}/bb2048.txt"),
    "decode_batch8_ctx128_tok_s": s_tg(f"{tmp}/bb8.txt"),
}
keys = list(peer)
print(json.dumps({
    "threads": ours["threads"],
    "lazykv": {k: round(ours[k], 1) for k in keys} | {"peak_rss_bytes": ours["peak_rss_bytes"]},
    "lazykv_int8": {k: round(ours_int8[k], 1) for k in keys},
    "llama_cpp": {k: round(v, 1) for k, v in peer.items()},
    "ratio_lazykv_over_llama_cpp": {k: round(ours[k] / peer[k], 2) for k in keys},
    "ratio_lazykv_int8_over_llama_cpp": {k: round(ours_int8[k] / peer[k], 2) for k in keys},
    # Decode weight reads against this machine's measured memory read rate
    # (lazykv bench's "memory"), for lazykv's two modes and llama.cpp.
    "memory": {"read_gb_s": round(ours["memory"]["read_gb_s"], 1), "copy_gb_s": round(ours["memory"]["copy_gb_s"], 1)},
    "fraction_of_read_bandwidth": {
        name: {k: round(ours["memory"]["decode_weight_bytes"] * fig[k] / (8 if "batch8" in k else 1)
                        / (ours["memory"]["read_gb_s"] * 1e9), 2)
               for k in keys if k.startswith("decode")}
        for name, fig in (("lazykv", ours), ("lazykv_int8", ours_int8), ("llama_cpp", peer))},
    "llama_cpp_notes": "prefill/decode_ctx128: llama-bench pp512/tg128 (-r 5); ctx2048 and batch8: llama-batched-bench S_TG",
}, indent=2))
PY
