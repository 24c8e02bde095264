#!/usr/bin/env python3
"""Train TRIM-KV retention gates for a GGUF model (lazykv's --kv-policy trimkv).

TRIM-KV (Bui et al., "Cache What Lasts", arXiv 2512.03324) gives every layer a
small retention gate. When token j is written to the KV cache, the gate reads
the layer's attention input x_j (the hidden state after the layer's input
RMSNorm, weight included: exactly what the Q/K/V projections read) and returns
one retention rate per KV head:

    log_beta_j = logsigmoid(W2 @ silu(W1 @ x_j + b1) + bias)

with W1 [H, n_embd], b1 [H], W2 [n_head_kv, H] (no bias) and bias [n_head_kv].
At query position t the token's retention score is beta_j^(t-j), i.e.
log score = (t - j) * log_beta_j; the engine keeps the tokens with the highest
scores. Initialisation as in the authors' code: W1, W2 ~ N(0, 0.02), b1 = 0,
bias = 10 (beta ~ 0.99995: at first everything is kept). H is 512 in the paper;
here --hidden, 64 by default, so that the committed files stay small.

Training. The LLM is frozen; only the gates learn. The student is the model
with retention-gated attention (the authors' eager attention,
src/trimkv/attn/eager_attn.py, retention_gated_attention_forward): the
attention logit of query t on key j <= t is multiplied by beta_j^(t-j) (per KV
head, shared by the head's query group; beta_j^0 = 1 on the diagonal) before
the causal mask and the softmax. The teacher is the same model without gates,
run under no_grad on the same batch. The authors have not released their
training code; the paper describes the loss as a quality term plus a capacity
term that penalises the expected number of retained tokens above the memory
budget M. The form used here, derived from that description:

    loss = KL + lambda * capacity
    KL       = mean over positions of KL(p_teacher || p_student)
               (next-token distributions over the whole vocabulary)
    capacity = mean over layers, KV heads and positions t of
               relu(sum_{j<=t} beta_j^(t-j) - M) / M

sum_{j<=t} beta_j^(t-j) is the expected occupancy of a head at step t (the
authors' code returns it as summarized_retention_weights). The next-token
cross-entropy the paper adds to the KL is left out: the teacher is the model
itself, so the KL alone asks the gated model to behave like the full-cache one.

Optimisation: AdamW (no weight decay) on the gates only, gradient norm clipped
at 1, one sequence per step. The learning rate is 1e-2, decayed by a cosine to
0.1x at the end of the budget (--minutes or --steps). 1e-2 rather than the usual
1e-3 because a CPU run of 20 minutes is a few hundred steps: with bias 10 the
sigmoid is saturated, Adam moves each parameter by about lr per step, and at
1e-3 the gates had hardly changed after 15 steps (mean log_beta -5e-5, bias
9.987), while at 1e-2 the capacity loss fell from 1.1 to 0.13 within 60 steps
with a KL of 0.05 and log_beta varying between tokens. The bias keeps nearly
its initial value: the retention level comes through W2 and W1.

Data: MATH-500 problems with their reference solutions
($LAZYKV_DATA_DIR/math500_test.jsonl, else <repo>/../shared/datasets/), each
formatted by the model's chat template (user = problem, assistant = solution)
and truncated to --max-len tokens, in an order shuffled by --seed. GSM8K is the
evaluation set and is never read here.

Output: a safetensors file, by default <repo>/data/trimkv/<model file>.trimkv.safetensors,
with tensors layers.{l}.w1 (F16 [H, n_embd]), layers.{l}.b1 (F32 [H]),
layers.{l}.w2 (F16 [n_head_kv, H]) and layers.{l}.bias (F32 [n_head_kv]) and
string metadata (format "lazykv-trimkv", version "1", model, n_layer, n_embd,
n_head_kv, hidden, activation "silu", memory, lambda, steps, tokens_seen,
final_kl, final_capacity, command). At the end one JSON line sums the run up.

--check FILE loads a gate file and prints (JSON) log_beta per KV head of the
first 4 tokens of the first MATH-500 sequence for layer 0 and the last layer,
for comparison with the engine.

The model is read as scripts/reference/make_model_reference.py does (config and
tokenizer from the GGUF through transformers, weights dequantized to fp32 by
transformers' load_gguf_checkpoint, HF layout with half-split RoPE); the
forward pass is this script's own (llama and qwen2 architectures), checked once
against transformers' logits at the start.

Run through scripts/train_trimkv.sh, which makes the Python environment:
    scripts/train_trimkv.sh MODEL.gguf [--minutes 20] [--steps N] [--out FILE] ...
"""

import argparse
import json
import math
import os
import random
import shlex
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer  # noqa: E402
from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint  # noqa: E402

REPO_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
CACHE_DIR = os.environ.get("LAZYKV_CACHE_DIR") or os.path.expanduser("~/.cache/lazykv")
DEFAULT_MODEL = os.path.join(CACHE_DIR, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
FORMAT = "lazykv-trimkv"
FORMAT_VERSION = "1"
SANITY_TEXT = "The lighthouse keeper climbed the 117 steps of the tower and lit the great lamp early."
SANITY_TOLERANCE = 1e-3  # max abs logit difference against transformers (fp32 both sides)
CHECK_TOKENS = 4


def log(msg):
    print(f"[train-trimkv] {msg}", file=sys.stderr, flush=True)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("model", nargs="?", default=DEFAULT_MODEL, help="GGUF file (llama or qwen2)")
    p.add_argument("--out", help="gate file (default <repo>/data/trimkv/<model file>.trimkv.safetensors)")
    p.add_argument("--data", help="MATH-500 jsonl (default $LAZYKV_DATA_DIR or <repo>/../shared/datasets)")
    p.add_argument("--hidden", type=int, default=64, help="gate hidden size H")
    p.add_argument("--memory", type=int, default=128, help="memory budget M of the capacity loss")
    p.add_argument("--lam", "--lambda", dest="lam", type=float, default=1.0, help="weight of the capacity loss")
    p.add_argument("--lr", type=float, default=1e-2, help="AdamW learning rate of W1, b1 and W2")
    p.add_argument("--bias-lr", type=float, default=None, help="AdamW learning rate of the gate bias (default --lr)")
    p.add_argument("--schedule", choices=("cosine", "constant"), default="cosine",
                   help="learning rate over the run: cosine decays to 0.1x at the end of the budget (time or steps)")
    p.add_argument("--weight-decay", type=float, default=0.0, help="AdamW weight decay")
    p.add_argument("--bias-init", type=float, default=10.0, help="initial gate bias (beta = sigmoid of it)")
    p.add_argument("--max-len", type=int, default=512, help="tokens per sequence (longer ones are cut)")
    p.add_argument("--batch", type=int, default=1, help="sequences per step (right-padded)")
    p.add_argument("--minutes", type=float, default=20.0, help="training time budget")
    p.add_argument("--steps", type=int, default=0, help="stop after this many steps (0: only the time budget)")
    p.add_argument("--log-every", type=int, default=10, help="log (averages over the window) every N steps")
    p.add_argument("--eval-seqs", type=int, default=4, help="sequences of the final measurement (the longest)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    p.add_argument("--check", metavar="FILE", help="print the gates' log_beta on the first MATH-500 sequence and exit")
    return p.parse_args()


# --- the model ----------------------------------------------------------------

class Model:
    """The frozen LLM: fp32 weights in HF layout and a plain forward pass."""

    def __init__(self, hf, config):
        if config.model_type not in ("llama", "qwen2"):
            sys.exit(f"model_type {config.model_type}: only llama and qwen2 are supported")
        rope = getattr(config, "rope_parameters", None) or {}
        if rope.get("rope_type", "default") != "default":
            sys.exit(f"rope_type {rope.get('rope_type')}: only the default RoPE is supported")
        if config.hidden_act != "silu":
            sys.exit(f"hidden_act {config.hidden_act}: only silu is supported")
        self.n_layer = config.num_hidden_layers
        self.n_embd = config.hidden_size
        self.n_head = config.num_attention_heads
        self.n_head_kv = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or self.n_embd // self.n_head
        self.eps = config.rms_norm_eps
        self.theta = rope.get("rope_theta", getattr(config, "rope_theta", 10000.0))

        def t(x):
            return None if x is None else x.detach().requires_grad_(False)

        m = hf.model
        self.embed = t(m.embed_tokens.weight)
        self.norm = t(m.norm.weight)
        self.lm_head = t(hf.lm_head.weight)
        self.layers = []
        for layer in m.layers:
            a, mlp = layer.self_attn, layer.mlp
            self.layers.append({
                "attn_norm": t(layer.input_layernorm.weight),
                "wq": t(a.q_proj.weight), "bq": t(a.q_proj.bias),
                "wk": t(a.k_proj.weight), "bk": t(a.k_proj.bias),
                "wv": t(a.v_proj.weight), "bv": t(a.v_proj.bias),
                "wo": t(a.o_proj.weight),
                "ffn_norm": t(layer.post_attention_layernorm.weight),
                "gate": t(mlp.gate_proj.weight), "up": t(mlp.up_proj.weight), "down": t(mlp.down_proj.weight),
            })
        self._rope_cache = {}

    def rmsnorm(self, x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * w

    def rope(self, n):
        if n not in self._rope_cache:
            inv = 1.0 / (self.theta ** (torch.arange(0, self.head_dim, 2, dtype=torch.float32) / self.head_dim))
            ang = torch.arange(n, dtype=torch.float32)[:, None] * inv[None, :]
            ang = torch.cat([ang, ang], dim=-1)  # half-split (NEOX) layout, as HF
            self._rope_cache[n] = (ang.cos(), ang.sin())
        return self._rope_cache[n]

    @staticmethod
    def rotate(x, cos, sin):
        half = x.shape[-1] // 2
        return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin

    def forward(self, ids, gates=None, want_logits=True, collect_x=False):
        """ids [B, T]. With gates, attention is retention-gated and the expected
        occupancy [B, n_head_kv, T] and log_beta [B, T, n_head_kv] of every layer
        are returned as well. collect_x returns every layer's attention input."""
        B, T = ids.shape
        nh, nkv, hd = self.n_head, self.n_head_kv, self.head_dim
        group = nh // nkv
        cos, sin = self.rope(T)
        scale = 1.0 / math.sqrt(hd)
        if gates is not None:
            pos = torch.arange(T)
            dist = (pos[:, None] - pos[None, :]).clamp(min=0).float()  # t - j, 0 above the diagonal
            causal = pos[None, :] <= pos[:, None]                       # [t, j]
        x = F.embedding(ids, self.embed)
        occupancy, log_betas, xs = [], [], []
        for li, w in enumerate(self.layers):
            h = self.rmsnorm(x, w["attn_norm"])
            if collect_x:
                xs.append(h)
            q = F.linear(h, w["wq"], w["bq"]).view(B, T, nh, hd).transpose(1, 2)
            k = F.linear(h, w["wk"], w["bk"]).view(B, T, nkv, hd).transpose(1, 2)
            v = F.linear(h, w["wv"], w["bv"]).view(B, T, nkv, hd).transpose(1, 2)
            q, k = self.rotate(q, cos, sin), self.rotate(k, cos, sin)
            if gates is None:
                o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            else:
                lb = gates.log_beta(li, h)                                    # [B, T, nkv]
                decay = torch.exp(dist * lb.transpose(1, 2)[:, :, None, :])   # [B, nkv, t, j]
                decay = decay * causal                                        # 0 above the diagonal
                occupancy.append(decay.sum(-1))                               # [B, nkv, T]
                log_betas.append(lb)
                qg = q.view(B, nkv, group, T, hd)
                scores = torch.matmul(qg, k[:, :, None].transpose(-1, -2)) * scale  # [B, nkv, g, T, T]
                scores = (scores * decay[:, :, None]).masked_fill(~causal, float("-inf"))
                o = torch.matmul(torch.softmax(scores, dim=-1), v[:, :, None]).view(B, nh, T, hd)
            x = x + F.linear(o.transpose(1, 2).reshape(B, T, nh * hd), w["wo"])
            h = self.rmsnorm(x, w["ffn_norm"])
            x = x + F.linear(F.silu(F.linear(h, w["gate"])) * F.linear(h, w["up"]), w["down"])
        out = {}
        if want_logits:
            out["logits"] = F.linear(self.rmsnorm(x, self.norm), self.lm_head)
        if gates is not None:
            out["occupancy"] = torch.stack(occupancy, 1)  # [B, L, nkv, T]
            out["log_beta"] = torch.stack(log_betas, 1)   # [B, L, T, nkv]
        if collect_x:
            out["x"] = xs
        return out


def load(model_path):
    """Tokenizer, config and the transformers model (its weights dequantized to fp32)."""
    model_dir, model_file = os.path.split(os.path.abspath(model_path))
    tokenizer = AutoTokenizer.from_pretrained(model_dir, gguf_file=model_file)
    config = AutoConfig.from_pretrained(model_dir, gguf_file=model_file)
    config._attn_implementation = "eager"
    # Built on the meta device and then handed the dequantized tensors themselves
    # (assign=True): the fp32 weights exist once, not twice (the 1.5B model is 7 GB).
    with torch.device("meta"):
        hf = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    parsed = load_gguf_checkpoint(model_path, return_tensors=True, model_to_load=hf, torch_dtype=torch.float32)
    result = hf.load_state_dict(parsed["tensors"], strict=False, assign=True)
    del parsed
    allowed_missing = {"lm_head.weight"} if config.tie_word_embeddings else set()
    missing = set(result.missing_keys) - allowed_missing
    if missing or result.unexpected_keys:
        sys.exit(f"weight mismatch: missing={sorted(missing)} unexpected={result.unexpected_keys}")
    if config.tie_word_embeddings:
        hf.tie_weights()
        if hf.lm_head.weight.data_ptr() != hf.model.embed_tokens.weight.data_ptr():
            sys.exit("lm_head is not tied to embed_tokens")
    # The rotary tables are buffers computed at construction: make them on the CPU.
    hf.model.rotary_emb = type(hf.model.rotary_emb)(config=config)
    left = [n for n, p in list(hf.named_parameters()) + list(hf.named_buffers()) if p.is_meta]
    if left:
        sys.exit(f"tensors left on the meta device: {left[:5]}")
    hf.eval()
    return tokenizer, config, hf


@torch.no_grad()
def sanity_check(hf, model, tokenizer):
    ids = torch.tensor([tokenizer(SANITY_TEXT, add_special_tokens=False)["input_ids"]])
    ref = hf(ids).logits.float()
    ours = model.forward(ids)["logits"]
    diff = float((ref - ours).abs().max())
    log(f"sanity check: {ids.shape[1]} tokens, max |logit(ours) - logit(transformers)| = {diff:.3g}")
    if not diff < SANITY_TOLERANCE:
        sys.exit(f"the forward pass differs from transformers by {diff} (tolerance {SANITY_TOLERANCE})")
    return diff


# --- the gates ----------------------------------------------------------------

class Gates(torch.nn.Module):
    """One retention gate per layer, stacked: log_beta = logsigmoid(W2 silu(W1 x + b1) + bias)."""

    def __init__(self, n_layer, n_embd, n_head_kv, hidden, bias_init, generator=None):
        super().__init__()
        self.w1 = torch.nn.Parameter(torch.randn(n_layer, hidden, n_embd, generator=generator) * 0.02)
        self.b1 = torch.nn.Parameter(torch.zeros(n_layer, hidden))
        self.w2 = torch.nn.Parameter(torch.randn(n_layer, n_head_kv, hidden, generator=generator) * 0.02)
        self.bias = torch.nn.Parameter(torch.full((n_layer, n_head_kv), float(bias_init)))

    def log_beta(self, layer, x):
        return F.logsigmoid(F.linear(F.silu(F.linear(x, self.w1[layer], self.b1[layer])), self.w2[layer])
                            + self.bias[layer])

    def tensors(self):
        out = {}
        for l in range(self.w1.shape[0]):
            out[f"layers.{l}.w1"] = self.w1[l].detach().to(torch.float16).contiguous()
            out[f"layers.{l}.b1"] = self.b1[l].detach().float().contiguous()
            out[f"layers.{l}.w2"] = self.w2[l].detach().to(torch.float16).contiguous()
            out[f"layers.{l}.bias"] = self.bias[l].detach().float().contiguous()
        return out

    @classmethod
    def from_file(cls, path, model):
        tensors = load_file(path)
        n_layer = model.n_layer
        hidden = tensors["layers.0.w1"].shape[0]
        gates = cls(n_layer, model.n_embd, model.n_head_kv, hidden, 0.0)
        with torch.no_grad():
            for l in range(n_layer):
                gates.w1[l] = tensors[f"layers.{l}.w1"].float()
                gates.b1[l] = tensors[f"layers.{l}.b1"].float()
                gates.w2[l] = tensors[f"layers.{l}.w2"].float()
                gates.bias[l] = tensors[f"layers.{l}.bias"].float()
        return gates


# --- data ---------------------------------------------------------------------

def data_path(arg):
    if arg:
        return arg
    data_dir = os.environ.get("LAZYKV_DATA_DIR") or os.path.join(REPO_ROOT, "..", "shared", "datasets")
    return os.path.join(data_dir, "math500_test.jsonl")


def load_sequences(path, tokenizer, max_len):
    """MATH-500, each problem with its solution in the chat template, as token id lists (file order)."""
    if not os.path.isfile(path):
        sys.exit(f"{path} not found (set LAZYKV_DATA_DIR or --data)")
    seqs = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            r = json.loads(line)
            messages = [{"role": "user", "content": r["problem"]}, {"role": "assistant", "content": r["solution"]}]
            text = tokenizer.apply_chat_template(messages, tokenize=False)
            seqs.append(tokenizer(text, add_special_tokens=False)["input_ids"][:max_len])
    return seqs


def make_batch(seqs):
    """Right-padded ids [B, T] and a mask of the real positions [B, T]."""
    T = max(len(s) for s in seqs)
    ids = torch.zeros(len(seqs), T, dtype=torch.long)
    mask = torch.zeros(len(seqs), T, dtype=torch.bool)
    for i, s in enumerate(seqs):
        ids[i, :len(s)] = torch.tensor(s)
        mask[i, :len(s)] = True
    return ids, mask


# --- training -----------------------------------------------------------------

def losses(model, gates, ids, mask, memory):
    """KL(teacher || student) per position and the capacity loss, both averaged over real positions."""
    with torch.no_grad():
        teacher = F.log_softmax(model.forward(ids)["logits"], dim=-1)
    out = model.forward(ids, gates)
    student = F.log_softmax(out["logits"], dim=-1)
    kl = (teacher.exp() * (teacher - student)).sum(-1)              # [B, T]
    n = mask.sum()
    kl = (kl * mask).sum() / n
    occ = out["occupancy"]                                           # [B, L, nkv, T]
    m4 = mask[:, None, None, :]
    over = F.relu(occ - memory) / memory
    capacity = (over * m4).sum() / (n * occ.shape[1] * occ.shape[2])
    lb = out["log_beta"]                                             # [B, L, T, nkv]
    lbd = lb.detach()
    mean_lb = (lbd * mask[:, None, :, None]).sum(2, keepdim=True) / mask.sum(1)[:, None, None, None]
    spread = (((lbd - mean_lb) ** 2 * mask[:, None, :, None]).sum(2) / mask.sum(1)[:, None, None]).sqrt()
    stats = {
        "mean_log_beta": float((lbd * mask[:, None, :, None]).sum() / (n * lb.shape[1] * lb.shape[3])),
        # how much log_beta varies between the tokens of one (layer, head): 0 for a gate that ignores x
        "std_log_beta": float(spread.mean()),
        "mean_occupancy": float((occ.detach() * m4).sum() / (n * occ.shape[1] * occ.shape[2])),
    }
    return kl, capacity, stats, out


@torch.no_grad()
def measure(model, gates, seqs, memory):
    """Per layer: mean beta and the expected occupancy at the last position, over seqs."""
    kls, caps, betas, occ_last, all_lb = [], [], [], [], []
    for s in seqs:
        ids, mask = make_batch([s])
        kl, cap, _, out = losses(model, gates, ids, mask, memory)
        kls.append(float(kl))
        caps.append(float(cap))
        betas.append(out["log_beta"][0].exp().mean(dim=(1, 2)))      # [L]
        occ_last.append(out["occupancy"][0, :, :, -1].mean(-1))      # [L]
        all_lb.append(out["log_beta"].flatten())
    beta = torch.stack(betas).mean(0)
    occ = torch.stack(occ_last).mean(0)
    q = torch.quantile(torch.cat(all_lb)[:1 << 24], torch.tensor([0.01, 0.1, 0.5, 0.9, 0.99]))
    return {
        "log_beta_quantiles": {p: float(f"{float(v):.4g}") for p, v in zip(("p1", "p10", "p50", "p90", "p99"), q)},
        "kl": sum(kls) / len(kls), "capacity": sum(caps) / len(caps),
        "mean_beta_per_layer": [round(float(b), 6) for b in beta],
        "occupancy_last_per_layer": [round(float(o), 2) for o in occ],
        "positions": [len(s) for s in seqs],
    }


def train(args, model, tokenizer, model_file, sanity_diff):
    seqs = load_sequences(data_path(args.data), tokenizer, args.max_len)
    lengths = sorted(len(s) for s in seqs)
    log(f"{len(seqs)} MATH-500 sequences, tokens: median {lengths[len(lengths) // 2]}, "
        f"{sum(l == args.max_len for l in lengths)} cut at {args.max_len}, total {sum(lengths)}")
    rng = random.Random(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    gates = Gates(model.n_layer, model.n_embd, model.n_head_kv, args.hidden, args.bias_init, gen)
    bias_lr = args.lr if args.bias_lr is None else args.bias_lr
    opt = torch.optim.AdamW([{"params": [gates.w1, gates.b1, gates.w2], "lr": args.lr},
                             {"params": [gates.bias], "lr": bias_lr, "weight_decay": 0.0}],
                            lr=args.lr, weight_decay=args.weight_decay)
    base_lrs = [group["lr"] for group in opt.param_groups]

    def order():
        while True:
            idx = list(range(len(seqs)))
            rng.shuffle(idx)
            yield from idx

    it = order()
    start = time.monotonic()
    budget = args.minutes * 60.0
    step, tokens, last_step_s = 0, 0, 0.0
    history, window = [], []
    while True:
        if args.steps and step >= args.steps:
            break
        if time.monotonic() - start + last_step_s > budget:
            break
        t0 = time.monotonic()
        batch = [seqs[next(it)] for _ in range(args.batch)]
        ids, mask = make_batch(batch)
        kl, cap, stats, _ = losses(model, gates, ids, mask, args.memory)
        loss = kl + args.lam * cap
        opt.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = float(torch.nn.utils.clip_grad_norm_(gates.parameters(), 1.0))
        if args.schedule == "cosine":
            progress = (time.monotonic() - start) / budget
            if args.steps:
                progress = max(progress, step / args.steps)
            mult = 0.1 + 0.45 * (1.0 + math.cos(math.pi * min(progress, 1.0)))
            for group, base in zip(opt.param_groups, base_lrs):
                group["lr"] = base * mult
        opt.step()
        step += 1
        tokens += int(mask.sum())
        last_step_s = time.monotonic() - t0
        row = {"step": step, "loss": float(loss.detach()), "kl": float(kl.detach()), "capacity": float(cap.detach()),
               "grad_norm": grad_norm, **stats}
        history.append(row)
        window.append(row)
        if step == 1 or step % args.log_every == 0:
            avg = {k: sum(r[k] for r in window) / len(window) for k in window[0] if k != "step"}
            log(f"step {step} ({time.monotonic() - start:.0f} s, {last_step_s:.1f} s/step, {tokens} tokens): "
                f"loss {avg['loss']:.4f} kl {avg['kl']:.4f} capacity {avg['capacity']:.4f} "
                f"log_beta mean {avg['mean_log_beta']:.3g} std {avg['std_log_beta']:.3g} occupancy {avg['mean_occupancy']:.1f} (M {args.memory}) "
                f"|grad| {avg['grad_norm']:.3g} bias {float(gates.bias.detach().mean()):.3f} lr {opt.param_groups[0]['lr']:.2g}")
            window = []
    train_s = time.monotonic() - start
    if not history:
        sys.exit("no training step fitted in the time budget")

    def mean_of(rows, key):
        return sum(r[key] for r in rows) / len(rows)

    tail = history[-max(1, min(args.log_every, len(history))):]
    head = history[:max(1, min(args.log_every, len(history)))]
    final_kl, final_cap = mean_of(tail, "kl"), mean_of(tail, "capacity")

    # The final measurement: the gates as written (fp16 W1/W2) on the longest sequences.
    saved = gates.tensors()
    eval_seqs = sorted(seqs, key=len, reverse=True)[:args.eval_seqs]
    with torch.no_grad():
        for l in range(model.n_layer):
            gates.w1[l] = saved[f"layers.{l}.w1"].float()
            gates.w2[l] = saved[f"layers.{l}.w2"].float()
    final = measure(model, gates, eval_seqs, args.memory)

    out_path = args.out or os.path.join(REPO_ROOT, "data", "trimkv", f"{model_file}.trimkv.safetensors")
    metadata = {
        "format": FORMAT, "version": FORMAT_VERSION, "model": model_file,
        "n_layer": str(model.n_layer), "n_embd": str(model.n_embd), "n_head_kv": str(model.n_head_kv),
        "hidden": str(args.hidden), "activation": "silu", "memory": str(args.memory), "lambda": f"{args.lam:g}",
        "steps": str(step), "tokens_seen": str(tokens),
        "final_kl": f"{final_kl:.6g}", "final_capacity": f"{final_cap:.6g}",
        "command": shlex.join(sys.argv),
    }
    os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
    save_file(saved, out_path, metadata=metadata)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(out_path, 0o666 & ~umask)  # safetensors writes it 0600
    log(f"wrote {out_path} ({os.path.getsize(out_path)} bytes)")

    summary = {
        "model": model_file, "out": os.path.relpath(out_path, REPO_ROOT) if out_path.startswith(REPO_ROOT) else out_path,
        "steps": step, "tokens": tokens, "minutes": round(train_s / 60.0, 2),
        "seconds_per_step": round(train_s / step, 2), "batch": args.batch, "max_len": args.max_len,
        "hidden": args.hidden, "memory": args.memory, "lambda": args.lam, "lr": args.lr, "bias_lr": bias_lr,
        "schedule": args.schedule,
        "sanity_max_abs_logit_diff": sanity_diff,
        "initial": {k: round(mean_of(head, k), 6) for k in ("loss", "kl", "capacity", "mean_log_beta", "std_log_beta")},
        "final": {k: round(mean_of(tail, k), 6) for k in ("loss", "kl", "capacity", "mean_log_beta", "std_log_beta")},
        "window_steps": [len(head), len(tail)],
        "eval": {
            "sequences": len(eval_seqs), "positions": final["positions"],
            "kl": round(final["kl"], 6), "capacity": round(final["capacity"], 6),
            "log_beta_quantiles": final["log_beta_quantiles"],
            "mean_beta_per_layer_min": min(final["mean_beta_per_layer"]),
            "mean_beta_per_layer_max": max(final["mean_beta_per_layer"]),
            "mean_beta_per_layer": final["mean_beta_per_layer"],
            "occupancy_at_last_position_per_layer": final["occupancy_last_per_layer"],
            "occupancy_at_last_position_mean": round(
                sum(final["occupancy_last_per_layer"]) / len(final["occupancy_last_per_layer"]), 2),
        },
    }
    print(json.dumps(summary), flush=True)


@torch.no_grad()
def check(args, model, tokenizer, model_file):
    gates = Gates.from_file(args.check, model)
    seq = load_sequences(data_path(args.data), tokenizer, args.max_len)[0]
    ids = torch.tensor([seq[:CHECK_TOKENS]])
    xs = model.forward(ids, want_logits=False, collect_x=True)["x"]
    result = {"model": model_file, "file": args.check, "token_ids": seq[:CHECK_TOKENS], "log_beta": {}}
    for l in (0, model.n_layer - 1):
        lb = gates.log_beta(l, xs[l])[0]  # [T, nkv]
        result["log_beta"][str(l)] = [[float(v) for v in row] for row in lb]
    print(json.dumps(result), flush=True)


def main():
    args = parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    if not os.path.isfile(args.model):
        sys.exit(f"{args.model} not found")
    model_file = os.path.basename(args.model)
    t0 = time.monotonic()
    tokenizer, config, hf = load(args.model)
    model = Model(hf, config)
    log(f"loaded {model_file} ({config.model_type}, {model.n_layer} layers, n_embd {model.n_embd}, "
        f"{model.n_head}/{model.n_head_kv} heads of {model.head_dim}) in {time.monotonic() - t0:.0f} s")
    if args.check:
        del hf
        check(args, model, tokenizer, model_file)
        return
    diff = sanity_check(hf, model, tokenizer)
    del hf  # the weights live on in `model`
    train(args, model, tokenizer, model_file, diff)


if __name__ == "__main__":
    main()
