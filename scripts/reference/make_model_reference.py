#!/usr/bin/env python3
"""Write the exactness reference data for lazykv's default model.

The reference is Hugging Face transformers running the GGUF model on the CPU
in float32: every quantized tensor is dequantized to fp32 by gguf-py and the
Llama Q/K rows, which the GGUF stores permuted for interleaved RoPE, are put
back into the HF (half-split RoPE) order by transformers' GGUF loader. So the
reference computes the same function as an engine that dequantizes the same
weights exactly and does all arithmetic in fp32; differences come only from
summation order (and from any activation quantization the engine does).

Outputs (JSON, each well under 2 MB):
  tests/data/model/smollm2_teacher_forced.json
      one forward pass over a fixed ~300-token English text: per position the
      next-token top-1 / top-5 (ids and logprobs), the logprob of the actual
      next token, logsumexp of the raw logits, and the full logprob vector at
      a few positions.
  tests/data/model/smollm2_greedy.json
      greedy decoding of exactly 64 new tokens for three prompts (EOS does not
      stop generation; the index of the first end-of-generation token is
      recorded), with the top-1 minus top-2 logit margin at every step. The
      greedy loop is written out (prefill, then one token at a time with the
      KV cache) rather than model.generate(), so no logits processor applies,
      and it is checked against an uncached forward over the whole sequence.

Environment used to produce the committed files (the pins of
scripts/reference/requirements.txt):
  Python 3.11, torch 2.15.0 (+cu132 wheel, run on CPU), transformers 5.23.0,
  tokenizers 0.23.3, gguf 0.19.0, numpy 2.4.6.
Only torch, transformers, tokenizers, gguf and numpy are imported. The model is
loaded without `accelerate`: the config and tokenizer come from the GGUF via
transformers, the model is built from that config and filled with the tensors
returned by transformers.modeling_gguf_pytorch_utils.load_gguf_checkpoint
(the same routine `from_pretrained(..., gguf_file=...)` uses). As a cross
check, one Q and one K projection are dequantized here independently and
un-permuted with our own code and must match bit for bit.

Run:  HF_HUB_OFFLINE=1 /tmp/refvenv/bin/python scripts/reference/make_model_reference.py
      [--model PATH] [--out DIR]
"""

import argparse
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

DEFAULT_MODEL = os.path.expanduser("~/.cache/lazykv/models/SmolLM2-135M-Instruct.Q4_1.gguf")
REPO_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DEFAULT_OUT = os.path.join(REPO_ROOT, "tests", "data", "model")

# Mixes narrative, dates, numbers and a short arithmetic word problem with
# step-by-step reasoning; about 300 tokens with the SmolLM2 tokenizer.
TEACHER_FORCED_TEXT = (
    "The lighthouse keeper on Marrow Island kept a careful log. On the morning of "
    "March 14, 1923, she wrote that the wind had turned to the northeast and that "
    "three fishing boats had left the harbour before dawn. By noon the sea was grey "
    "and restless, and only two of the boats had come back. She climbed the 117 "
    "steps of the tower, lit the great lamp early, and watched the horizon until "
    "the third boat finally appeared, its sail torn but its crew safe.\n\n"
    "Years later, her grandson found the log in a trunk and decided to work out how "
    "much oil the lamp had used. The entries said the lamp burned 2 litres of oil "
    "every hour, and that on a long winter night it stayed lit for 14 hours.\n\n"
    "Question: How many litres of oil did the lamp burn in one week of long winter "
    "nights, and how much did that oil cost if one litre cost 3 shillings?\n"
    "Answer: Each night the lamp burned 2 x 14 = 28 litres. A week has 7 nights, "
    "so the lamp burned 28 x 7 = 196 litres in a week. At 3 shillings per litre, "
    "the oil cost 196 x 3 = 588 shillings. Since there are 20 shillings in a pound, "
    "that is 29 pounds and 8 shillings. The answer is 196 litres, costing 588 "
    "shillings.\n\n"
    "The grandson closed the log and thought about how much work it took to keep "
    "one light burning through the dark."
)

GREEDY_NEW_TOKENS = 64
GREEDY_PROMPTS = [
    {"name": "chat_capital_of_france", "chat": True,
     "content": "What is the capital of France?"},
    {"name": "chat_fibonacci", "chat": True,
     "content": "Write a Python function that returns the n-th Fibonacci number."},
    {"name": "raw_printing_press", "chat": False,
     "content": "The history of the printing press began"},
]
TOP_K_SUMMARY = 5
LOGPROB_DECIMALS = 4  # rounding of stored full logprob vectors (abs error <= 5e-5)


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
    config._attn_implementation = "eager"  # plain softmax(QK^T)V, the most literal reference
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)

    parsed = load_gguf_checkpoint(model_path, return_tensors=True, model_to_load=model,
                                  torch_dtype=torch.float32)
    result = model.load_state_dict(parsed["tensors"], strict=False)
    # Tied embeddings: the GGUF has no output.weight, lm_head shares token_embd.
    missing = set(result.missing_keys) - {"lm_head.weight"}
    if missing or result.unexpected_keys:
        sys.exit(f"weight mismatch: missing={sorted(missing)} unexpected={result.unexpected_keys}")
    model.tie_weights()
    if model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr():
        sys.exit("lm_head is not tied to embed_tokens")
    model.eval()
    return tokenizer, model


def unpermute_rows(weight, n_head):
    """Undo llama.cpp's convert permutation: per head, rows were interleaved (pairs) instead of half-split."""
    rows = weight.shape[0]
    head_dim = rows // n_head
    w = weight.reshape(n_head, head_dim // 2, 2, weight.shape[1])
    return w.transpose(0, 2, 1, 3).reshape(weight.shape)


def cross_check_weights(model_path, model):
    reader = gguf.GGUFReader(model_path)
    tensors = {t.name: t for t in reader.tensors}
    cfg = model.config
    layer = model.model.layers[7]
    checks = [
        ("blk.7.attn_q.weight", cfg.num_attention_heads, layer.self_attn.q_proj.weight),
        ("blk.7.attn_k.weight", cfg.num_key_value_heads, layer.self_attn.k_proj.weight),
        ("blk.7.attn_v.weight", None, layer.self_attn.v_proj.weight),
        ("token_embd.weight", None, model.model.embed_tokens.weight),
    ]
    types = {}
    for name, n_head, hf_weight in checks:
        t = tensors[name]
        types[name] = t.tensor_type.name
        w = gguf.dequantize(t.data, t.tensor_type).astype(np.float32)
        if n_head is not None:
            w = unpermute_rows(w, n_head)
        if not np.array_equal(w, hf_weight.detach().numpy()):
            sys.exit(f"independent dequantize/unpermute of {name} differs from the loaded weight")
    return types


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


@torch.no_grad()
def teacher_forced(tokenizer, model, default_adds_bos):
    token_ids = tokenizer(TEACHER_FORCED_TEXT, add_special_tokens=False)["input_ids"]
    if tokenizer.decode(token_ids) != TEACHER_FORCED_TEXT:
        sys.exit("teacher-forced text does not round-trip through the tokenizer")
    n = len(token_ids)
    logits = model(torch.tensor([token_ids])).logits[0].float()  # [n, vocab]
    full_positions = sorted({0, 100, 200, n - 1})

    positions = []
    full_logprobs = []
    for i in range(n):
        target = token_ids[i + 1] if i + 1 < n else None
        entry, logprobs = logprob_summary(logits[i], target)
        if not all(math.isfinite(v) for v in entry["top5_logprobs"]) or not math.isfinite(entry["logsumexp"]):
            sys.exit(f"non-finite logprobs at position {i}")
        entry["position"] = i
        positions.append(entry)
        if i in full_positions:
            full_logprobs.append({
                "position": i,
                "logprobs": [round(v, LOGPROB_DECIMALS) for v in logprobs.tolist()],
            })

    target_lps = [p["target_logprob"] for p in positions[:-1]]
    return {
        "text": TEACHER_FORCED_TEXT,
        "add_bos": False,
        "tokenizer_default_adds_bos": default_adds_bos,
        "n_tokens": n,
        "vocab_size": int(logits.shape[1]),
        "token_ids": token_ids,
        "mean_target_logprob": sum(target_lps) / len(target_lps),
        "top1_matches_target": sum(p["top1"] == token_ids[p["position"] + 1] for p in positions[:-1]),
        "positions": positions,
        "full_logprob_positions": full_positions,
        "full_logprobs_decimals": LOGPROB_DECIMALS,
        "full_logprobs": full_logprobs,
    }


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
    """Plain greedy loop: prefill the prompt, then decode one token at a time with the KV cache.

    Written out instead of model.generate() so that provably no logits processor, EOS stopping
    or EOS suppression applies: token i is the argmax of the raw logits after prompt + generated[:i].
    """
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
def greedy(tokenizer, model):
    eog_ids = end_of_generation_ids(tokenizer)
    results = []
    for prompt in GREEDY_PROMPTS:
        if prompt["chat"]:
            messages = [{"role": "user", "content": prompt["content"]}]
            prompt_text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
            templated_ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True)["input_ids"]
        else:
            prompt_text = prompt["content"]
            templated_ids = None
        prompt_ids = tokenizer(prompt_text, add_special_tokens=False)["input_ids"]
        if templated_ids is not None and list(templated_ids) != prompt_ids:
            sys.exit(f"{prompt['name']}: apply_chat_template ids differ from tokenizing its text")

        generated, logits_per_step = greedy_decode(model, prompt_ids, GREEDY_NEW_TOKENS)
        cache_diff = check_against_full_recompute(model, prompt_ids, generated, logits_per_step, prompt["name"])
        if len(generated) != GREEDY_NEW_TOKENS:
            sys.exit(f"{prompt['name']}: generated {len(generated)} tokens, expected {GREEDY_NEW_TOKENS}")

        margins = []
        for step, row in enumerate(logits_per_step):
            top2 = torch.topk(row, 2)
            if not torch.isfinite(row).all():
                sys.exit(f"{prompt['name']}: non-finite logits at step {step}")
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
        "max_new_tokens": GREEDY_NEW_TOKENS,
        "stops_at_eos": False,
        "end_of_generation_ids": eog_ids,
        "note": ("Exactly max_new_tokens tokens are generated for every prompt; EOS does not stop "
                 "generation. first_end_of_generation_index is the index (into generated_token_ids) of "
                 "the first end_of_generation_ids token, or null. Compare the full sequence, or only up to "
                 "and including that index. Token i is argmax of the raw logits after prompt + generated[:i]; "
                 "top2_logit_margins[i] is best minus second-best logit at that step."),
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

    torch.set_num_threads(2)
    torch.manual_seed(0)
    tokenizer, model = load_model(args.model)
    tensor_types = cross_check_weights(args.model, model)
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
            "n_layer": cfg.num_hidden_layers, "n_embd": cfg.hidden_size, "n_head": cfg.num_attention_heads,
            "n_head_kv": cfg.num_key_value_heads, "head_dim": cfg.head_dim, "n_ff": cfg.intermediate_size,
            "vocab_size": cfg.vocab_size, "rope_theta": cfg.rope_parameters["rope_theta"],
            "rms_norm_eps": cfg.rms_norm_eps, "tie_word_embeddings": cfg.tie_word_embeddings,
        },
        "gguf_tensor_types_checked": tensor_types,
        "script": "scripts/reference/make_model_reference.py",
    }

    os.makedirs(args.out, exist_ok=True)
    write_json(os.path.join(args.out, "smollm2_teacher_forced.json"),
               {"metadata": metadata, **teacher_forced(tokenizer, model, default_adds_bos)})
    write_json(os.path.join(args.out, "smollm2_greedy.json"),
               {"metadata": metadata, **greedy(tokenizer, model)})


if __name__ == "__main__":
    main()
