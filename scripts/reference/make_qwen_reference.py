#!/usr/bin/env python3
"""Write the exactness reference data for lazykv's optional second model.

The model is Qwen2.5-Coder-1.5B-Instruct Q4_K_M (GGUF v3, qwen2 architecture:
Q/K/V biases, 12 query heads and 2 KV heads of 128, an untied Q6_K output
matrix, Q4_K/Q6_K weights, F32 norms and biases), fetched into the lazykv cache
by scripts/fetch_optional_model.sh. It checks the qwen2 code path and the
K-quant formats on a real model, as scripts/reference/make_model_reference.py
does for the default model (same method, same JSON layout; read that script's
docstring for the reasoning).

The reference is Hugging Face transformers running the GGUF model on the CPU in
float32: every Q4_K/Q6_K tensor is dequantized to fp32 by gguf-py. Unlike the
Llama architecture, qwen2 Q/K rows are stored unpermuted in the GGUF (the
engine applies NEOX-style half-split RoPE), so the cross check compares gguf-py's
dequantization with the loaded weights directly.

Outputs (JSON, kept small: together well under 1 MB, since Qwen's vocabulary of
151936 makes one full logprob vector about 1 MB):
  tests/data/model/qwen2.5-coder-1.5b_teacher_forced.json
      one forward pass over a fixed ~200-token text (prose and Python): per
      position the next-token top-1 / top-5 (ids and logprobs), the logprob of
      the actual next token and logsumexp of the raw logits. Full logprob
      vectors (3 decimals) are stored for at most 2 positions, and only while
      the file stays within FULL_LOGPROBS_BUDGET_BYTES; otherwise none.
  tests/data/model/qwen2.5-coder-1.5b_greedy.json
      greedy decoding of exactly 32 new tokens for two chat prompts (EOS does
      not stop generation), with the top-1 minus top-2 logit margin per step.
      The greedy loop is written out (prefill, then one token at a time with the
      KV cache) and checked against an uncached forward over the whole sequence.

Environment (the pins of scripts/reference/requirements.txt): torch 2.15.0 on
CPU, transformers 5.23.0, tokenizers 0.23.3, gguf 0.19.0, numpy 2.4.6. The model
is loaded without `accelerate`, as in make_model_reference.py. Peak memory is
about 13 GB (fp32 model plus the dequantized tensors before they are copied in).

Run:  HF_HUB_OFFLINE=1 /tmp/refvenv/bin/python scripts/reference/make_qwen_reference.py
      [--model PATH] [--out DIR]
"""

import argparse
import gc
import hashlib
import importlib.metadata
import json
import math
import os
import platform
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import gguf  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, DynamicCache  # noqa: E402
from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint  # noqa: E402

DEFAULT_MODEL = os.path.expanduser(
    os.path.join(os.environ.get("LAZYKV_CACHE_DIR", "~/.cache/lazykv"), "models",
                 "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"))
REPO_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DEFAULT_OUT = os.path.join(REPO_ROOT, "tests", "data", "model")
FILE_PREFIX = "qwen2.5-coder-1.5b"

# Prose, a small Python function and a worked number; about 200 Qwen tokens.
TEACHER_FORCED_TEXT = (
    "The warehouse robot kept a log of every box it moved. On Tuesday it moved 48 boxes "
    "in the morning and 37 in the afternoon, so the total for the day was 48 + 37 = 85 "
    "boxes. The engineers wanted a small helper to add up such logs, and wrote it in "
    "Python:\n\n"
    "def total_boxes(entries):\n"
    "    \"\"\"Return the number of boxes moved, given (time, count) pairs.\"\"\"\n"
    "    total = 0\n"
    "    for _, count in entries:\n"
    "        if count < 0:\n"
    "            raise ValueError(\"a count cannot be negative\")\n"
    "        total += count\n"
    "    return total\n\n"
    "print(total_boxes([(\"09:00\", 48), (\"14:30\", 37)]))  # prints 85\n\n"
    "Later they noticed that the robot sometimes logged the same box twice, so they "
    "changed the helper to skip an entry whose time was already seen."
)

GREEDY_NEW_TOKENS = 32
GREEDY_PROMPTS = [
    {"name": "chat_is_prime", "chat": True,
     "content": "Write a Python function that checks whether a number is prime."},
    {"name": "chat_reverse_list", "chat": True,
     "content": "How do I reverse a list in Python? Answer briefly."},
]
TOP_K_SUMMARY = 5
LOGPROB_DECIMALS = 3           # rounding of stored full logprob vectors (abs error <= 5e-4)
MAX_FULL_LOGPROB_POSITIONS = 2
FULL_LOGPROBS_BUDGET_BYTES = 900_000  # the whole teacher-forced file must stay under this


def sha256_of(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def package_versions():
    names = ["torch", "transformers", "tokenizers", "gguf", "numpy"]
    versions = {name: importlib.metadata.version(name) for name in names}
    versions["python"] = platform.python_version()
    return versions


def load_model(model_path):
    model_dir, model_file = os.path.split(model_path)
    tokenizer = AutoTokenizer.from_pretrained(model_dir, gguf_file=model_file)
    config = AutoConfig.from_pretrained(model_dir, gguf_file=model_file)
    if config.model_type != "qwen2":
        sys.exit(f"{model_path}: model_type {config.model_type}, expected qwen2")
    config._attn_implementation = "eager"  # plain softmax(QK^T)V, the most literal reference
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)

    parsed = load_gguf_checkpoint(model_path, return_tensors=True, model_to_load=model,
                                  torch_dtype=torch.float32)
    result = model.load_state_dict(parsed["tensors"], strict=False)
    del parsed
    gc.collect()
    # This GGUF carries its own output.weight (Q6_K), so transformers sets tie_word_embeddings
    # false and lm_head must come from the file; with a tied GGUF lm_head is legitimately missing.
    allowed_missing = {"lm_head.weight"} if config.tie_word_embeddings else set()
    missing = set(result.missing_keys) - allowed_missing
    if missing or result.unexpected_keys:
        sys.exit(f"weight mismatch: missing={sorted(missing)} unexpected={result.unexpected_keys}")
    if config.tie_word_embeddings:
        model.tie_weights()
    elif model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr():
        sys.exit("lm_head is tied to embed_tokens although the GGUF has its own output.weight")
    model.eval()
    return tokenizer, model


def cross_check_weights(model_path, model):
    """Dequantize a few tensors with gguf-py independently; they must equal the loaded weights bit for bit."""
    reader = gguf.GGUFReader(model_path)
    tensors = {t.name: t for t in reader.tensors}
    n_layer = model.config.num_hidden_layers
    # A layer whose attn_v / ffn_down are Q6_K (Q4_K_M mixes Q4_K and Q6_K there).
    q6_layer = next((i for i in range(n_layer)
                     if tensors[f"blk.{i}.attn_v.weight"].tensor_type == gguf.GGMLQuantizationType.Q6_K), 0)
    layer = model.model.layers[q6_layer]
    checks = [
        (f"blk.{q6_layer}.attn_q.weight", layer.self_attn.q_proj.weight),
        (f"blk.{q6_layer}.attn_q.bias", layer.self_attn.q_proj.bias),
        (f"blk.{q6_layer}.attn_k.weight", layer.self_attn.k_proj.weight),
        (f"blk.{q6_layer}.attn_v.weight", layer.self_attn.v_proj.weight),
        (f"blk.{q6_layer}.ffn_down.weight", layer.mlp.down_proj.weight),
        ("token_embd.weight", model.model.embed_tokens.weight),
    ]
    if "output.weight" in tensors:
        checks.append(("output.weight", model.lm_head.weight))
    types = {}
    for name, hf_weight in checks:
        t = tensors[name]
        types[name] = t.tensor_type.name
        w = gguf.dequantize(t.data, t.tensor_type).astype(np.float32)
        w = w.reshape(tuple(hf_weight.shape))
        if not np.array_equal(w, hf_weight.detach().numpy()):
            sys.exit(f"independent dequantize of {name} differs from the loaded weight")
    counts = {}
    for t in reader.tensors:
        counts[t.tensor_type.name] = counts.get(t.tensor_type.name, 0) + 1
    return types, counts


def logprob_summary(logits_row, target):
    """logits_row: float32 [vocab]. Statistics in float64 from the fp32 logits."""
    logits64 = logits_row.double()
    lse = torch.logsumexp(logits64, dim=0)
    logprobs = logits64 - lse
    top = torch.topk(logprobs, TOP_K_SUMMARY)
    entry = {
        "top1": int(top.indices[0]),
        "top5_ids": [int(i) for i in top.indices],
        "top5_logprobs": [float(v) for v in top.values],
        "logsumexp": float(lse),
        "target_logprob": float(logprobs[target]) if target is not None else None,
    }
    return entry, logprobs


def json_size(payload):
    return len(json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode("utf-8")) + 1


@torch.no_grad()
def teacher_forced(tokenizer, model, default_adds_bos, metadata):
    token_ids = tokenizer(TEACHER_FORCED_TEXT, add_special_tokens=False)["input_ids"]
    if tokenizer.decode(token_ids) != TEACHER_FORCED_TEXT:
        sys.exit("teacher-forced text does not round-trip through the tokenizer")
    n = len(token_ids)
    logits = model(torch.tensor([token_ids])).logits[0].float()  # [n, vocab]
    candidate_positions = sorted({0, n - 1})[:MAX_FULL_LOGPROB_POSITIONS]

    positions = []
    candidate_vectors = []
    for i in range(n):
        target = token_ids[i + 1] if i + 1 < n else None
        entry, logprobs = logprob_summary(logits[i], target)
        if not all(math.isfinite(v) for v in entry["top5_logprobs"]) or not math.isfinite(entry["logsumexp"]):
            sys.exit(f"non-finite logprobs at position {i}")
        entry["position"] = i
        positions.append(entry)
        if i in candidate_positions:
            candidate_vectors.append({
                "position": i,
                "logprobs": [round(v, LOGPROB_DECIMALS) for v in logprobs.tolist()],
            })

    target_lps = [p["target_logprob"] for p in positions[:-1]]
    payload = {
        "metadata": metadata,
        "text": TEACHER_FORCED_TEXT,
        "add_bos": False,
        "tokenizer_default_adds_bos": default_adds_bos,
        "n_tokens": n,
        "vocab_size": int(logits.shape[1]),
        "token_ids": token_ids,
        "mean_target_logprob": sum(target_lps) / len(target_lps),
        "top1_matches_target": sum(p["top1"] == token_ids[p["position"] + 1] for p in positions[:-1]),
        "positions": positions,
        "full_logprob_positions": [],
        "full_logprobs_decimals": LOGPROB_DECIMALS,
        "full_logprobs": [],
    }
    # Add full vectors one at a time while the file stays within budget (with a 152k vocabulary
    # one vector alone is about 1 MB, so usually none fits and only the top-5 summaries remain).
    for vector in candidate_vectors:
        trial = dict(payload, full_logprob_positions=payload["full_logprob_positions"] + [vector["position"]],
                     full_logprobs=payload["full_logprobs"] + [vector])
        if json_size(trial) > FULL_LOGPROBS_BUDGET_BYTES:
            break
        payload = trial
    payload["full_logprobs_note"] = (
        f"full logprob vectors are stored only while the file stays under {FULL_LOGPROBS_BUDGET_BYTES} bytes; "
        "positions[] has top-5 ids/logprobs, target logprob and logsumexp for every position")
    return payload


def end_of_generation_ids(tokenizer):
    ids = {tokenizer.eos_token_id}
    for token in ("<|im_end|>", "<|endoftext|>"):
        token_id = tokenizer.convert_tokens_to_ids(token)
        if token_id is not None and token_id != tokenizer.unk_token_id:
            ids.add(token_id)
    return sorted(i for i in ids if i is not None)


@torch.no_grad()
def check_against_full_recompute(model, prompt_ids, generated, logits_per_step, name):
    """The cached decode must agree with one uncached forward pass over prompt + generated."""
    full = model(torch.tensor([prompt_ids + generated]), use_cache=False).logits[0].float()
    start = len(prompt_ids) - 1
    worst = 0.0
    for step, row in enumerate(logits_per_step):
        diff = float((full[start + step] - row).abs().max())
        if diff > 1e-3:
            sys.exit(f"{name}: step {step} cached vs uncached logits differ by {diff}")
        worst = max(worst, diff)
    return worst


@torch.no_grad()
def greedy_decode(model, prompt_ids, n_new):
    """Plain greedy loop: token i is the argmax of the raw logits after prompt + generated[:i]."""
    cache = DynamicCache(config=model.config)
    inputs = torch.tensor([prompt_ids])
    generated, step_logits = [], []
    for _ in range(n_new):
        past = cache.get_seq_length()
        positions = torch.arange(past, past + inputs.shape[1]).unsqueeze(0)
        out = model(input_ids=inputs, past_key_values=cache, position_ids=positions, use_cache=True)
        cache = out.past_key_values
        row = out.logits[0, -1].float()
        token = int(torch.argmax(row))
        generated.append(token)
        step_logits.append(row)
        inputs = torch.tensor([[token]])
    return generated, step_logits


@torch.no_grad()
def greedy(tokenizer, model, metadata):
    eog_ids = end_of_generation_ids(tokenizer)
    results = []
    for prompt in GREEDY_PROMPTS:
        messages = [{"role": "user", "content": prompt["content"]}]
        prompt_text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        templated_ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True)["input_ids"]
        prompt_ids = tokenizer(prompt_text, add_special_tokens=False)["input_ids"]
        if list(templated_ids) != prompt_ids:
            sys.exit(f"{prompt['name']}: apply_chat_template ids differ from tokenizing its text")

        generated, logits_per_step = greedy_decode(model, prompt_ids, GREEDY_NEW_TOKENS)
        cache_diff = check_against_full_recompute(model, prompt_ids, generated, logits_per_step, prompt["name"])
        if len(generated) != GREEDY_NEW_TOKENS:
            sys.exit(f"{prompt['name']}: generated {len(generated)} tokens, expected {GREEDY_NEW_TOKENS}")

        margins = []
        for step, row in enumerate(logits_per_step):
            if not torch.isfinite(row).all():
                sys.exit(f"{prompt['name']}: non-finite logits at step {step}")
            top2 = torch.topk(row, 2)
            margins.append(float(top2.values[0] - top2.values[1]))

        first_eog = next((i for i, t in enumerate(generated) if t in eog_ids), None)
        results.append({
            "name": prompt["name"],
            "chat_template": prompt["chat"],
            "user_content": prompt["content"],
            "prompt_text": prompt_text,
            "prompt_token_ids": prompt_ids,
            "generated_token_ids": generated,
            "generated_text": tokenizer.decode(generated),
            "first_end_of_generation_index": first_eog,
            "generated_text_until_end": tokenizer.decode(generated[:first_eog] if first_eog is not None else generated),
            "top2_logit_margins": margins,
            "min_top2_logit_margin": min(margins),
            "min_top2_logit_margin_step": margins.index(min(margins)),
            "max_abs_logit_diff_cached_vs_uncached": cache_diff,
        })
    return {
        "metadata": metadata,
        "max_new_tokens": GREEDY_NEW_TOKENS,
        "stops_at_eos": False,
        "end_of_generation_ids": eog_ids,
        "note": ("Exactly max_new_tokens tokens are generated for every prompt; EOS does not stop "
                 "generation. first_end_of_generation_index is the index (into generated_token_ids) of "
                 "the first end_of_generation_ids token, or null. Compare the full sequence, or only up to "
                 "and including that index. Token i is argmax of the raw logits after prompt + generated[:i]; "
                 "top2_logit_margins[i] is best minus second-best logit at that step. The chat prompts use "
                 "the GGUF's own chat template with no system message (so its default system prompt)."),
        "prompts": results,
    }


def write_json(path, payload):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(payload, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {path} ({os.path.getsize(path)} bytes)")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--out", default=DEFAULT_OUT)
    args = parser.parse_args()
    if not os.path.isfile(args.model):
        sys.exit(f"{args.model} not found: run scripts/fetch_optional_model.sh first")

    torch.set_num_threads(2)
    torch.manual_seed(0)
    tokenizer, model = load_model(args.model)
    tensor_types, tensor_type_counts = cross_check_weights(args.model, model)
    default_adds_bos = tokenizer("x")["input_ids"][0] == tokenizer.bos_token_id

    cfg = model.config
    metadata = {
        "model_file": os.path.basename(args.model),
        "model_sha256": sha256_of(args.model),
        "reference": "Hugging Face transformers, CPU, weights dequantized to float32, eager attention",
        "dtype": "float32",
        "torch_num_threads": torch.get_num_threads(),
        "versions": package_versions(),
        "config": {
            "architecture": cfg.model_type,
            "n_layer": cfg.num_hidden_layers, "n_embd": cfg.hidden_size, "n_head": cfg.num_attention_heads,
            "n_head_kv": cfg.num_key_value_heads,
            "head_dim": getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads,
            "n_ff": cfg.intermediate_size, "vocab_size": cfg.vocab_size,
            "rope_theta": cfg.rope_parameters["rope_theta"], "rms_norm_eps": cfg.rms_norm_eps,
            "tie_word_embeddings": cfg.tie_word_embeddings,
        },
        "gguf_tensor_types_checked": tensor_types,
        "gguf_tensor_type_counts": tensor_type_counts,
        "script": "scripts/reference/make_qwen_reference.py",
    }

    os.makedirs(args.out, exist_ok=True)
    write_json(os.path.join(args.out, f"{FILE_PREFIX}_teacher_forced.json"),
               teacher_forced(tokenizer, model, default_adds_bos, metadata))
    write_json(os.path.join(args.out, f"{FILE_PREFIX}_greedy.json"), greedy(tokenizer, model, metadata))


if __name__ == "__main__":
    main()
