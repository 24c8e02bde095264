#!/usr/bin/env python3
"""Independent reference implementation of lazykv's eviction policies.

Writes golden traces for `lazykv replay-policy` (worker/policy/trace_replay.cc)
to tests/data/policy/<policy>_<case>.json:
  {"trace": {...}, "expected": {"peak_slots": N, "steps": [{"t", "kept", "state"}, ...]}}
tests/unit/policy/golden_traces_test.cc replays every trace and compares.

Regenerate (deterministic: fixed seeds; numpy only):
  /tmp/refvenv/bin/python scripts/reference/policy_reference.py [--out tests/data/policy]

Written from the stated semantics, not from the C++ bodies: docs/architecture.md
("Eviction: exact semantics of LazyEviction"), the header comment of each
worker/policy/<name>.cc, worker/policy/policy.h and trace_replay.h. Where the
semantics are ambiguous the code was consulted; each such place says so
("consulted the code").

The replay model: one layer, H KV heads with one query each, head_dim D.
Keys are rounded to float16 exactly as the cache stores them (JSON number ->
float32 -> float16); values are the keys. Attention is float32
softmax(q . k / sqrt(D)) over the head's cached slots after the step's key is
appended. Decode step t's token is at position P + t - 1.

Floating-point decisions (which slots survive) must not depend on rounding
differences between numpy and the C++ kernels, so every selection is checked:
if a kept and a dropped candidate have distinct scores closer than a relative
tolerance, or (for lazy and raas) a probability lies within 1e-3 relative of
alpha, the generator rejects the trace and tries the next seed.

Pins (same as the reference venv): numpy==2.4.6.
"""

import argparse
import json
import math
import os
import sys

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
F32 = np.float32

# Defaults and names from policy_catalog (common/policy_config.cc).
DEFAULTS = {
    "full": {},
    "lazy": {"budget": 512, "window": 128, "alpha": 1e-4, "per_query_head": 0, "keep_prompt": 0},
    "streaming": {"budget": 512, "sinks": 4, "keep_prompt": 0},
    "h2o": {"budget": 512, "recent": 0, "keep_prompt": 0},
    "tova": {"budget": 512, "keep_prompt": 0},
    "snapkv": {"budget": 512, "window": 32, "kernel": 5, "period": 128, "keep_prompt": 0},
    "rkv": {"budget": 512, "period": 128, "window": 8, "kernel": 7, "lambda": 0.1, "keep_prompt": 0},
    "raas": {"budget": 512, "alpha": 1e-4},
    "caote": {"budget": 512, "recent": 32, "keep_prompt": 0},
    "obcache": {"budget": 512, "recent": 32, "accumulate": 1, "keep_prompt": 0},
    "vase": {"budget": 512, "window": 64, "large": 0.25, "sinks": 4, "kernel": 5, "sketch": 0, "rank": 20, "seed": 0, "keep_prompt": 0},
    "triattention": {"budget": 512, "period": 128, "keep_prompt": 1},
    "laq": {"budget": 512, "lookahead": 8, "recent": 8, "window": 32, "kernel": 7, "period": 128, "keep_prompt": 0},
    "skipkv": {"budget": 512, "period": 128, "window": 8, "kernel": 7, "lambda": 0.1, "tau": 0.95, "penalty": 1.0,
               "min_sentence": 4, "max_sentence": 256, "steer": 0, "steer_step": 0.25, "steer_max": 2, "keep_prompt": 0},
    "trimkv": {"budget": 512, "period": 1, "keep_prompt": 0},
    "epicache": {"budget": 512, "block": 512, "sinks": 4, "uniform": 0},
}
RKV_LIKE = ("rkv", "skipkv")


class Ambiguous(Exception):
    """A float decision too close to call across implementations."""


def as_cached_key(values):
    """JSON numbers -> float32 -> float16 (the cache) -> float32."""
    return np.asarray(values, dtype=np.float64).astype(F32).astype(np.float16).astype(F32)


def softmax_f32(logits):
    logits = logits.astype(F32)
    e = np.exp(logits - logits.max()).astype(F32)
    return (e / e.sum(dtype=F32)).astype(F32)


def check_margin(values, kept, what, rel=1e-4, abs_tol=1e-7, infinite_apart=False):
    """Rejects a selection where a kept and a dropped candidate differ by a
    nonzero amount smaller than the tolerance (exact ties are fine: both sides
    then break them by position). infinite_apart: an infinite value is never
    near a finite one (values pinned to +-inf by rule, not by rounding)."""
    if infinite_apart:
        values = np.where(np.isinf(values), np.sign(values) * 1e30, values)
    kept = set(kept)
    dropped = [i for i in range(len(values)) if i not in kept]
    if not kept or not dropped:
        return
    hi = max(float(values[i]) for i in dropped)
    for a in (float(values[i]) for i in kept):
        if a - hi > 3 * (rel * max(abs(a), abs(hi)) + abs_tol):
            continue
        for b in (float(values[i]) for i in dropped):
            if a != b and abs(a - b) <= rel * max(abs(a), abs(b)) + abs_tol:
                raise Ambiguous(f"{what}: near tie {a!r} vs {b!r}")


def top_k_older_first(scores, k):
    """Indices of the k highest scores, ties broken by the lower index, sorted."""
    k = max(0, min(k, len(scores)))
    order = sorted(range(len(scores)), key=lambda i: (-float(scores[i]), i))
    return sorted(order[:k])


def max_pool1d(x, kernel):
    """Same-length max pooling, window centred, cut at the ends."""
    n, r = len(x), kernel // 2
    return np.array([x[max(0, i - r):min(n, i + r + 1)].max() for i in range(n)], dtype=F32) if n else x


def avg_pool1d(x, kernel):
    """Same-length average pooling, window centred, zero-padded: sums over kernel."""
    n, r = len(x), kernel // 2
    return np.array([x[max(0, i - r):min(n, i + r + 1)].sum(dtype=F32) / F32(kernel) for i in range(n)], dtype=F32)


MASK64 = (1 << 64) - 1


def splitmix64_at(seed, i):
    """Output i (from 0) of SplitMix64 started at seed: state seed + (i + 1) * golden, then the finaliser."""
    z = (seed + (i + 1) * 0x9E3779B97F4A7C15) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def uniform_open(bits):
    """The top 52 bits plus a half step: a double strictly inside (0, 1)."""
    return ((bits >> 12) + 0.5) * 2.0 ** -52


def vase_stream(seed, layer, head, step):
    """The random stream of one (layer, head, eviction step)."""
    return splitmix64_at(splitmix64_at(splitmix64_at(seed, layer), head), step)


def gaussian_sketch(stream, D, rank):
    """G [D][rank]: Box-Muller normals from draws (2j, 2j + 1), over sqrt(rank), in float32."""
    g = np.empty(D * rank, dtype=F32)
    scale = 1.0 / math.sqrt(rank)
    for j in range(D * rank):
        u1 = uniform_open(splitmix64_at(stream, 2 * j))
        u2 = uniform_open(splitmix64_at(stream, 2 * j + 1))
        g[j] = F32(math.sqrt(-2.0 * math.log(u1)) * math.cos(2.0 * math.pi * u2) * scale)
    return g.reshape(D, rank)


def lazy_scores(last, mri, t):
    """I = 2/(1+exp(1 + (t-last)/(mri+1e-5))) + (mri == 0 ? 0 : 2/(1+exp(mri-1))), in float32."""
    last = np.asarray(last, dtype=np.int64)
    mri = np.asarray(mri, dtype=np.int64)
    with np.errstate(over="ignore"):
        ratio = (t - last).astype(F32) / (mri.astype(F32) + F32(1e-5))
        first = F32(2) / (F32(1) + np.exp(F32(1) + ratio))
        second = np.where(mri == 0, F32(0), F32(2) / (F32(1) + np.exp(mri.astype(F32) - F32(1))))
    return (first + second.astype(F32)).astype(F32)


class Head:
    def __init__(self):
        self.pos = []     # positions in slot order
        self.keys = []    # float32 [D] each
        self.last = []    # lazy last / raas timestamp
        self.mri = []
        self.attn = []    # h2o / tova / caote
        self.score = []   # obcache; trimkv: log beta

    def keep(self, idx):
        for name in ("pos", "keys", "last", "mri", "attn", "score"):
            arr = getattr(self, name)
            if arr:
                setattr(self, name, [arr[i] for i in idx])


def near(a, b, rel=1e-4, abs_tol=1e-7):
    return abs(a - b) <= rel * max(abs(a), abs(b)) + abs_tol


class Sentences:
    """SkipKV's sentences (worker/policy/skipkv.cc's header): generated tokens
    cut at sentence-end tokens (after min_sentence tokens) or at max_sentence
    tokens; each closed sentence's unit mean hidden state; the penalty of an
    earlier sentence is its largest cosine >= tau with a later one (compared
    with the newest 256 sentences only)."""

    def __init__(self, P, p, ends):
        self.P, self.p, self.ends = P, p, ends
        self.first = P            # the open sentence's first position
        self.sum = None
        self.ends_at = []         # exclusive end of each closed sentence
        self.penalty = []
        self.emb = []             # float32 unit embeddings, one per closed sentence

    def observe(self, pos, token, hidden):
        h = np.asarray(hidden, dtype=np.float64).astype(F32).astype(np.float64)
        self.sum = h if self.sum is None else self.sum + h
        length = pos + 1 - self.first
        if (token in self.ends and length >= self.p["min_sentence"]) or length >= self.p["max_sentence"]:
            norm = math.sqrt(float(np.dot(self.sum, self.sum)))
            v = (self.sum / norm if norm > 0 else np.zeros_like(self.sum)).astype(F32)
            start = max(0, len(self.emb) - 256)
            for j in range(start, len(self.emb)):
                c = float(np.dot(self.emb[j].astype(np.float64), v.astype(np.float64)))
                # Both sides compute the cosine in double from the same float32
                # embeddings: only summation order differs.
                if near(c, self.p["tau"], rel=0, abs_tol=1e-6):
                    raise Ambiguous("sentence cosine within 1e-6 of tau")
                if c >= self.p["tau"]:
                    self.penalty[j] = max(self.penalty[j], F32(c))
            self.emb.append(v)
            self.penalty.append(F32(0))
            self.ends_at.append(pos + 1)
            self.first = pos + 1
            self.sum = np.zeros_like(self.sum)

    def sentence_of(self, pos):
        if pos < self.P or pos >= self.first:
            return -1
        return next(i for i, e in enumerate(self.ends_at) if pos < e)

    def keep(self, positions, rkv, lead, nc, n, k, what):
        """Slot indices kept: the lowest units (closed sentences, or single
        slots) of [lead, nc) dropped whole until nc - k are gone, ties newer
        first; the unit crossing the line drops its lowest slots only."""
        lead = min(lead, nc)
        to_drop = nc - max(lead, min(k, nc))
        sid = [self.sentence_of(pos) for pos in positions[:nc]]
        w = F32(self.p["penalty"])
        scores = [F32(rkv[i] - w * self.penalty[sid[i]]) if sid[i] >= 0 else F32(rkv[i]) for i in range(nc)]
        units, i = [], lead
        while i < nc:
            j = i + 1
            if sid[i] >= 0:
                while j < nc and sid[j] == sid[i]:
                    j += 1
            units.append((sum(float(scores[a]) for a in range(i, j)) / (j - i), i, j))
            i = j
        means = sorted(u[0] for u in units)
        if any(near(a, b) for a, b in zip(means, means[1:])):
            raise Ambiguous(f"{what}: two sentence scores too close")
        units.sort(key=lambda u: (u[0], -u[1]))
        dropped = set()
        for _, a, b in units:
            if to_drop == 0:
                break
            slots = list(range(a, b))
            if len(slots) > to_drop:
                vals = sorted(float(scores[x]) for x in slots)
                if any(near(x, y) for x, y in zip(vals, vals[1:])):
                    raise Ambiguous(f"{what}: two slot scores too close in the cut sentence")
                slots = sorted(slots, key=lambda x: (float(scores[x]), -x))[:to_drop]
            dropped.update(slots)
            to_drop -= len(slots)
        return [i for i in range(n) if i not in dropped]


class Replay:
    """Drives one policy over a trace, mirroring what `replay-policy` reports."""

    def __init__(self, trace):
        self.trace = trace
        spec = dict(trace["policy"])
        self.name = spec.pop("name")
        self.p = dict(DEFAULTS[self.name])
        self.p.update(spec)
        self.H, self.D = trace["H"], trace["D"]
        self.P = len(trace["prompt_keys"][0])
        self.scale = F32(1.0) / F32(math.sqrt(self.D))
        self.heads = [Head() for _ in range(self.H)]
        self.queries = [[] for _ in range(self.H)]  # (pos, q) of remembered queries
        self.alpha = F32(self.p.get("alpha", 0.0))
        self.near_alpha = False
        self.t = 0
        self.peak = 0
        self.saw_tie_at_cut = False
        self.compressions = 0         # epicache: blocks of history compressed
        self.newest_only = False      # epicache: a head left with its newest slot alone
        if self.name == "skipkv":
            self.sentences = Sentences(self.P, self.p, set(trace.get("sentence_ends", [])))

    # --- attention ---
    def probs(self, h, q, max_pos):
        hd = self.heads[h]
        keys = np.array(hd.keys, dtype=F32)
        logits = (keys @ q.astype(F32)).astype(F32) * self.scale
        mask = np.array(hd.pos) <= max_pos
        out = np.zeros(len(hd.pos), dtype=F32)
        out[mask] = softmax_f32(logits[mask])
        return out

    def check_alpha(self, p):
        if self.name in ("lazy", "raas"):
            if np.any(np.abs(p.astype(np.float64) - float(self.alpha)) <= 1e-3 * float(self.alpha)):
                raise Ambiguous("probability within 1e-3 of alpha")

    def remember(self, h, pos, q):
        w = self.p.get("window", 0)
        if self.name == "obcache":
            # The scored prompt queries: the last max(recent, 1), or the last
            # one alone when not accumulating; decode needs only the newest.
            w = max(self.p["recent"], 1) if self.p["accumulate"] else 1
        elif self.name == "vase":
            if self.p["sketch"]:
                return
        elif self.name == "laq":
            w = max(self.p["window"], self.p["recent"])
        elif self.name not in ("snapkv",) + RKV_LIKE:
            return
        self.queries[h].append((pos, np.asarray(q, dtype=F32)))
        self.queries[h] = sorted(self.queries[h], key=lambda e: e[0])[-w:]

    # --- selection helpers ---
    def kept_prompt(self):
        """Prompt slots a keep_prompt policy never evicts (they lead the slot order)."""
        return self.P if self.p.get("keep_prompt", 0) else 0

    def keep_top(self, scores, n_candidates, n, k, what, ties_by=None, infinite_apart=False):
        # The kept prompt leads and counts in k; the rest compete by score.
        lead = min(self.kept_prompt(), n_candidates)
        scores, ties_by = scores[lead:n_candidates], (ties_by[lead:n_candidates] if ties_by else None)
        m = n_candidates - lead
        kept = top_k_older_first(scores, k - lead)
        check_margin(scores, kept, what, infinite_apart=infinite_apart)
        if 0 < len(kept) < m:
            cut = min(float(scores[i]) for i in kept)
            dropped_max = max(float(scores[i]) for i in range(m) if i not in set(kept))
            if cut == dropped_max:
                self.saw_tie_at_cut = True
                if ties_by is not None:
                    # Equal scores must come from identical integer state, or
                    # the other implementation might not see a tie.
                    ids = {ties_by[i] for i in range(m) if float(scores[i]) == cut}
                    if len(ids) > 1 and cut != 0.0:
                        raise Ambiguous(f"{what}: equal scores from different state")
        return list(range(lead)) + [lead + i for i in kept] + list(range(n_candidates, n))

    def rkv_scores(self, h, nc):
        """R-KV's scores of the older nc slots of head h."""
        hd, p = self.heads[h], self.p
        # Each remembered query's softmax over the older slots only (R-KV
        # normalises over the candidates; one query per head here, so the
        # group max is the logit itself).
        keys_c = np.array(hd.keys[:nc], dtype=F32)
        acc = np.zeros(nc, dtype=F32)
        for _, q in self.queries[h]:
            logits = ((keys_c @ q.astype(F32)).astype(F32) * self.scale).astype(F32)
            acc = (acc + softmax_f32(logits)).astype(F32)
        importance = max_pool1d((acc / F32(max(len(self.queries[h]), 1))).astype(F32), p["kernel"])
        khat = (keys_c / (np.linalg.norm(keys_c, axis=1, keepdims=True) + F32(1e-8))).astype(F32)
        total = khat.sum(axis=0, dtype=F32)
        if nc > 1:
            mean_sim = ((khat @ total - 1.0) / F32(nc - 1)).astype(F32)
        else:
            mean_sim = np.zeros(nc, dtype=F32)
        redundancy = np.exp(mean_sim.astype(np.float64) - mean_sim.max())
        redundancy = (redundancy / redundancy.sum()).astype(F32)
        lam = F32(p["lambda"])
        return (lam * importance - (F32(1) - lam) * redundancy).astype(F32)

    def recent_probs(self, h):
        """Probabilities of the remembered queries, each with its own causal mask."""
        return [self.probs(h, q, pos) for pos, q in self.queries[h]]

    # --- passes ---
    def prefill(self):
        if self.name == "epicache":
            self.prefill_episode()
            return
        tr = self.trace
        for h in range(self.H):
            for p in range(self.P):
                self.append(h, p, tr["prompt_keys"][h][p])
        self.peak = max(self.peak, self.H * self.P)
        if "prompt_queries" in tr:
            for h in range(self.H):
                for p in range(self.P):
                    q = np.asarray(tr["prompt_queries"][h][p], dtype=np.float64).astype(F32)
                    if self.name in ("snapkv", "vase") + RKV_LIKE and p >= self.P - self.p["window"]:
                        self.remember(h, p, q)
                    if self.name == "laq" and p >= self.P - max(self.p["window"], self.p["recent"]):
                        self.remember(h, p, q)
                    if self.name == "obcache":
                        self.remember(h, p, q)
                    if self.name == "h2o" or (self.name in ("tova", "caote") and p == self.P - 1):
                        pr = self.probs(h, q, p)
                        hd = self.heads[h]
                        hd.attn = [F32(a + b) for a, b in zip(hd.attn, pr)]
        self.select(prompt_completed=self.P > 0)

    def prefill_episode(self):
        """EpiCache's prompt: the history (its first history_len tokens, all
        when absent) in passes of `block` tokens, each followed, when the
        layer is over budget, by a compression scored by the draft; the rest
        (the question) in one pass, never compressed. The trace's prompt
        queries score nothing here."""
        tr, B = self.trace, self.p["block"]
        history = tr.get("history_len", self.P)
        pos = 0
        while pos < self.P:
            n = min(B, history - pos) if pos < history else self.P - pos
            for h in range(self.H):
                for p in range(pos, pos + n):
                    self.append(h, p, tr["prompt_keys"][h][p])
            self.peak = max(self.peak, sum(len(hd.pos) for hd in self.heads))
            pos += n
            if pos <= history and self.epicache_over_budget():
                self.select_epicache()

    def append(self, h, pos, key):
        hd = self.heads[h]
        hd.pos.append(pos)
        hd.keys.append(as_cached_key(key))
        step = 0 if pos < self.P else pos - self.P + 1
        if self.name == "lazy":
            hd.last.append(0 if step == 0 else step - 1)
            hd.mri.append(0)
        elif self.name == "raas":
            # Timestamp = the step the slot arrives (prompt slots: 0, consulted the code).
            hd.last.append(step)
        elif self.name in ("h2o", "tova", "caote"):
            hd.attn.append(F32(0))
        elif self.name == "obcache":
            hd.score.append(F32(0))
        elif self.name == "trimkv":
            tr = self.trace
            rate = tr["prompt_log_beta"][h][pos] if pos < self.P else tr["steps"][pos - self.P]["log_beta"][h]
            hd.score.append(F32(rate))

    def decode(self, i, step):
        self.t = i + 1
        pos = self.P + i
        for h in range(self.H):
            self.append(h, pos, step["new_key"][h])
        self.peak = max(self.peak, sum(len(hd.pos) for hd in self.heads))
        hits = []
        for h in range(self.H):
            q = np.asarray(step["query"][h], dtype=np.float64).astype(F32)
            self.remember(h, pos, q)
            pr = self.probs(h, q, pos)
            self.check_alpha(pr)
            hits.append(pr >= self.alpha)
            hd = self.heads[h]
            if self.name in ("h2o", "tova", "caote"):
                hd.attn = [F32(a + b) for a, b in zip(hd.attn, pr)]
        if self.name == "skipkv":
            self.sentences.observe(pos, step["token"], step["hidden"])
        self.select(prompt_completed=False, hits=hits)

    def select(self, prompt_completed, hits=None):
        t, p = self.t, self.p
        name = self.name
        if name == "full":
            return
        if name == "lazy":
            if t == 0:
                return  # lazy evicts at decode steps only
            C, W = p["budget"], p["window"]
            for h, hd in enumerate(self.heads):
                for s in np.nonzero(hits[h])[0]:
                    hd.mri[s] = max(hd.mri[s], t - hd.last[s])
                    hd.last[s] = t
                n = len(hd.pos)
                if t % W == 0 and n > C:
                    scores = lazy_scores(hd.last, hd.mri, t)
                    ids = list(zip(hd.last, hd.mri))
                    hd.keep(self.keep_top(scores, n - W, n, C - W, f"lazy t={t}", ties_by=ids))
            return
        if name == "streaming":
            C, S = p["budget"], max(p["sinks"], self.kept_prompt())  # a kept prompt is the sinks
            for hd in self.heads:
                n = len(hd.pos)
                if n > C:
                    hd.keep(list(range(S)) + list(range(n - (C - S), n)))
            return
        if name == "h2o":
            C = p["budget"]
            R = p["recent"] if p["recent"] > 0 else C // 2  # 0: half the budget (integer, consulted the code)
            for hd in self.heads:
                n = len(hd.pos)
                if n > C:
                    hd.keep(self.keep_top(np.array(hd.attn, dtype=F32), n - R, n, C - R, f"h2o t={t}"))
            return
        if name == "tova":
            C = p["budget"]
            n = len(self.heads[0].pos)
            if n > C and (t > 0 or prompt_completed):
                total = np.zeros(n, dtype=F32)
                for hd in self.heads:
                    total = (total + np.array(hd.attn, dtype=F32)).astype(F32)
                kept = self.keep_top(total, n, n, C, f"tova t={t}")
                for hd in self.heads:
                    hd.keep(kept)
            # Only the current query counts: the sums restart every pass, so
            # the reported state is zeros (consulted the code).
            for hd in self.heads:
                hd.attn = [F32(0)] * len(hd.pos)
            return
        if name == "caote":
            # Per head: the R newest slots, then the top of p/(1-p) * |o - v|
            # over the others, with o = sum p v over every slot and p the
            # current query's attention (one query per head in a trace); a
            # trace's values are its keys, as cached (f16).
            C, R = p["budget"], p["recent"]
            if t > 0 or prompt_completed:
                for hd in self.heads:
                    n = len(hd.pos)
                    if n <= C:
                        continue
                    pr = np.array(hd.attn, dtype=F32)
                    values = np.array(hd.keys, dtype=F32)
                    o = (pr[:, None] * values).sum(axis=0, dtype=F32)
                    dist = np.sqrt(((o[None, :] - values) ** 2).sum(axis=1, dtype=F32)).astype(F32)
                    rest = (F32(1) - pr).astype(F32)
                    safe = np.where(rest > 0, rest, F32(1)).astype(F32)
                    scores = np.where(rest > 0, (pr / safe).astype(F32) * dist, np.inf).astype(F32)
                    hd.keep(self.keep_top(scores, n - R, n, C - R, f"caote t={t}"))
            for hd in self.heads:
                hd.attn = [F32(0)] * len(hd.pos)
            return
        if name == "obcache":
            # OBCache's joint score: for each scored query, with z its scaled
            # logits (causal mask at its position), p = softmax(z) and
            # o = sum p v, every slot gains p^2 |(1 + z) v - z o|^2 (the
            # first-order output change of zeroing its key and value). At
            # prefill the remembered prompt queries score; at decode the
            # current one. accumulate 0 restarts the sums every pass. Then the
            # R newest stay and the top C - R of the others by score.
            C, R = p["budget"], p["recent"]
            if t == 0 and not prompt_completed:
                return
            for h, hd in enumerate(self.heads):
                if not p["accumulate"]:
                    hd.score = [F32(0)] * len(hd.pos)
                values = np.array(hd.keys, dtype=F32)
                scored = self.queries[h] if t == 0 else self.queries[h][-1:]
                acc = np.array(hd.score, dtype=F32)
                for pos, q in scored:
                    z = ((values @ q.astype(F32)).astype(F32) * self.scale).astype(F32)
                    mask = np.array(hd.pos) <= pos
                    pr = np.zeros(len(hd.pos), dtype=F32)
                    pr[mask] = softmax_f32(z[mask])
                    o = (pr[:, None] * values).sum(axis=0, dtype=F32)
                    zz = np.where(mask, z, F32(0)).astype(F32)
                    delta = ((F32(1) + zz)[:, None] * values - zz[:, None] * o[None, :]).astype(F32)
                    acc = (acc + (pr * pr * (delta * delta).sum(axis=1, dtype=F32)).astype(F32)).astype(F32)
                hd.score = list(acc)
                n = len(hd.pos)
                if n > C:
                    hd.keep(self.keep_top(np.array(hd.score, dtype=F32), n - R, n, C - R, f"obcache t={t}"))
            return
        if name in ("snapkv",) + RKV_LIKE:
            C, W, K, period = p["budget"], p["window"], p["kernel"], p["period"]
            due = prompt_completed or (t >= 1 and period > 0 and t % period == 0)
            if not due:
                return
            for h, hd in enumerate(self.heads):
                n = len(hd.pos)
                if n <= C:
                    continue
                nc = n - W
                rows = self.recent_probs(h)
                if name == "snapkv":
                    # Average over the window's queries (one query per head here).
                    acc = np.zeros(nc, dtype=F32)
                    for r in rows:
                        acc = (acc + r[:nc]).astype(F32)
                    scores = (acc / F32(max(len(rows), 1))).astype(F32)
                    # Pooling runs over the candidates only (consulted the code).
                    scores = max_pool1d(scores, K)
                else:
                    scores = self.rkv_scores(h, nc)
                if name == "skipkv":
                    hd.keep(self.sentences.keep(hd.pos, scores, self.kept_prompt(), nc, n, C - W, f"skipkv t={t}"))
                    continue
                full = np.concatenate([scores, np.zeros(W, dtype=F32)])
                hd.keep(self.keep_top(full, nc, n, C - W, f"{name} t={t}"))
            return
        if name == "vase":
            self.select_vase()
            return
        if name == "laq":
            self.select_laq(prompt_completed)
            return
        if name == "triattention":
            self.select_triattention()
            return
        if name == "trimkv":
            self.select_trimkv()
            return
        if name == "epicache":
            return  # the history was compressed in the prompt's blocks; nothing after it is evicted
        if name == "raas":
            if t < 1:
                return
            C = p["budget"]
            for h, hd in enumerate(self.heads):
                for s in np.nonzero(hits[h])[0]:
                    hd.last[s] = t
                n = len(hd.pos)
                if n <= C:
                    continue
                n_prompt = sum(1 for q in hd.pos if q < self.P)
                n_decode = n - n_prompt
                k = max(C - n_prompt, 1)
                if n_decode <= k:
                    continue
                stamps = np.array(hd.last[n_prompt:], dtype=F32)
                # Newest timestamps first, ties to the older position, and the
                # newest token always stays (the header's promise): it is kept
                # first and the other k - 1 slots are chosen among the rest.
                kept = top_k_older_first(stamps[:-1], k - 1) + [n_decode - 1]
                if kept != top_k_older_first(stamps, k):
                    # A plain top-k by timestamp with older-first ties would
                    # drop the newest token here (other slots hit this step).
                    self.raas_newest_differs = True
                hd.keep(list(range(n_prompt)) + [n_prompt + i for i in kept])
            return
        raise ValueError(name)

    def select_laq(self, prompt_completed):
        """SnapKV's rule with the trace's draft queries (after the current
        position: no mask) plus the last `recent` real ones. The draft's own
        cache (a SnapKV copy) is the engine's business: the replay takes its
        queries from the trace."""
        t, p = self.t, self.p
        C, R, K, period = p["budget"], p["recent"], p["kernel"], p["period"]
        due = prompt_completed or (t >= 1 and period > 0 and t % period == 0)
        if not due or all(len(hd.pos) <= C for hd in self.heads):
            return
        draft = self.trace["draft_queries"][:p["lookahead"]]
        for h, hd in enumerate(self.heads):
            n = len(hd.pos)
            if n <= C:
                continue
            nc = n - R
            real = self.queries[h][len(self.queries[h]) - min(len(self.queries[h]), R):]
            rows = [self.probs(h, np.asarray(d[h], dtype=np.float64).astype(F32), math.inf) for d in draft]
            rows += [self.probs(h, q, pos) for pos, q in real]
            acc = np.zeros(nc, dtype=F32)
            for r in rows:
                acc = (acc + r[:nc]).astype(F32)
            acc = (acc / F32(max(len(rows), 1))).astype(F32)
            scores = np.concatenate([max_pool1d(acc, K), np.zeros(R, dtype=F32)])
            hd.keep(self.keep_top(scores, nc, n, C - R, f"laq t={t}"))

    def epicache_over_budget(self):
        """Joint: the layer holds more than budget x H slots; uniform: a head more than budget."""
        C = self.p["budget"]
        sizes = [len(hd.pos) for hd in self.heads]
        return any(n > C for n in sizes) if self.p["uniform"] else sum(sizes) > C * self.H

    def select_epicache(self):
        """Every slot scores the most probability any draft query gives it
        (each draft query comes after the block: it sees every slot), the
        first `sinks` slots of a head infinite. Joint: the layer keeps its
        budget x H best (head, slot) entries, ties to the lower slot, then
        the lower head, and a head left with none keeps its newest slot
        (consulted the code, as for the sinks being slots, not positions).
        Uniform: each head over budget keeps its budget best, ties older first."""
        C, S = self.p["budget"], self.p["sinks"]
        self.compressions += 1
        draft = [[np.asarray(q, dtype=np.float64).astype(F32) for q in d] for d in self.trace["draft_queries"]]
        scores = []
        for h, hd in enumerate(self.heads):
            best = np.zeros(len(hd.pos), dtype=F32)
            for d in draft:
                best = np.maximum(best, self.probs(h, d[h], math.inf))
            best[:S] = np.inf
            scores.append(best)
        what = f"epicache block {self.compressions}"
        if self.p["uniform"]:
            for h, hd in enumerate(self.heads):
                n = len(hd.pos)
                if n > C:
                    hd.keep(self.keep_top(scores[h], n, n, C, f"{what} head {h}", infinite_apart=True))
            return
        entries = [(h, j) for h in range(self.H) for j in range(len(self.heads[h].pos))]
        values = np.array([scores[h][j] for h, j in entries], dtype=F32)
        best_first = sorted(range(len(entries)), key=lambda e: (-float(values[e]), entries[e][1], entries[e][0]))
        kept = best_first[:C * self.H]
        check_margin(values, kept, what, infinite_apart=True)
        for h, hd in enumerate(self.heads):
            mine = sorted(entries[e][1] for e in kept if entries[e][0] == h)
            if not mine:
                mine = [len(hd.pos) - 1]
                self.newest_only = True
            hd.keep(mine)

    def select_vase(self):
        """VaSE at decode steps where a head holds more than the budget and a
        multiple of the window: the window's slots stay; of the older
        candidates, budget - window are kept. Attention variant: the widest
        value ranges (sinks infinite) reserved, the rest sampled without
        replacement in proportion to the pooled window attention (each
        remembered query's softmax over the candidates, averaged, then
        average-pooled), by Efraimidis-Spirakis keys log(u)/w. Sketch variant:
        top |kG|^2 |vG|^2 for a fresh Gaussian G per layer and step, sinks
        first. A trace's values are its keys."""
        t, p = self.t, self.p
        C, W, S = p["budget"], p["window"], p["sinks"]
        if t < 1:
            return
        K = C - W
        sketch = None
        for h, hd in enumerate(self.heads):
            n = len(hd.pos)
            if n <= C or n % W != 0:
                continue
            nc = n - W
            values = np.array(hd.keys[:nc], dtype=F32)
            if p["sketch"]:
                if sketch is None:
                    sketch = gaussian_sketch(vase_stream(p["seed"], 0, 0, t), self.D, p["rank"])
                kg = np.zeros((nc, p["rank"]), dtype=F32)
                for d in range(self.D):  # the C++ order: one dimension at a time
                    kg = (kg + values[:, d:d + 1] * sketch[d:d + 1, :]).astype(F32)
                k2 = (kg * kg).sum(axis=1, dtype=F32)
                scores = (k2 * k2).astype(F32)
                scores[:S] = np.inf
                hd.keep(self.keep_top(scores, nc, n, K, f"vase sketch t={t}", infinite_apart=True))
                continue
            acc = np.zeros(nc, dtype=F32)
            for _, q in self.queries[h]:
                logits = ((values @ q.astype(F32)).astype(F32) * self.scale).astype(F32)
                acc = (acc + softmax_f32(logits)).astype(F32)
            weights = avg_pool1d((acc / F32(max(len(self.queries[h]), 1))).astype(F32), p["kernel"])
            spread = (values.max(axis=1) - values.min(axis=1)).astype(F32)
            spread[:S] = np.inf
            # A kept prompt (kept by keep_top) is outside the reserve, which is
            # `large` of what the prompt leaves of the budget.
            lead = min(self.kept_prompt(), nc)
            n_large = min(max(int(math.floor(p["large"] * (C - lead))), S - lead), K - lead)  # the sinks always fit
            reserved = top_k_older_first(spread[lead:], n_large)
            check_margin(spread[lead:], reserved, f"vase range t={t}", infinite_apart=True)
            reserved = [lead + i for i in reserved]
            stream = vase_stream(p["seed"], 0, h, t)
            keys = np.empty(nc, dtype=F32)
            for i in range(nc):
                w = float(weights[i])
                u = uniform_open(splitmix64_at(stream, i))
                keys[i] = F32(math.log(u) / w) if w > 0 else -np.inf
            keys[reserved] = np.inf
            hd.keep(self.keep_top(keys, nc, n, K, f"vase t={t}", infinite_apart=True))

    def select_triattention(self):
        """TriAttention (per layer and KV head) at decode steps where a head
        holds budget + period slots: with the trace's query statistics
        (centre c_f = mean_re + i mean_im, a_f = abs_mean) and a key's pairs
        k_f = k[f] + i k[f + D/2] (NeoX), the expected logit at positions
        t + d, d in {1, 2, ..., 2^16}, averaged over d:
          sum_f Re[c_f conj(k_f) e^{i w_f (t + d)}] + (a_f - |c_f|) |k_f|,
        t the next token's position and w_f = theta^(-2f/D); z-scored over
        the candidates (one query per head here, so the group max is the
        score itself); the prompt kept when keep_prompt. Trigonometry through
        math.cos / math.sin, the C library's, as the C++ uses."""
        t, p = self.t, self.p
        C, period = p["budget"], p["period"]
        if t < 1:
            return
        D, F = self.D, self.D // 2
        theta = float(self.trace.get("rope_theta", 10000.0))
        stats = self.trace["query_stats"]
        t_next = self.P + t
        for h, hd in enumerate(self.heads):
            n = len(hd.pos)
            if n < C + period:
                continue
            n_kept = min(self.P, n) if p["keep_prompt"] else 0
            m, k = n - n_kept, max(C - n_kept, 0)
            if m <= k:
                continue
            keys = np.array(hd.keys[n_kept:], dtype=np.float64)
            score = np.zeros(m)
            for f in range(F):
                w_f = float(F32(1.0 / theta ** (2.0 * f / D)))
                mean_d = sum(complex(math.cos(w_f * 2 ** j), math.sin(w_f * 2 ** j)) for j in range(17)) / 17.0
                i = h * F + f  # one layer: (head, frequency)
                centre = complex(float(F32(stats["mean_re"][i])), float(F32(stats["mean_im"][i])))
                w = centre * complex(math.cos(w_f * t_next), math.sin(w_f * t_next)) * mean_d
                b = float(F32(F32(stats["abs_mean"][i]) - F32(abs(centre))))
                re, im = keys[:, f], keys[:, f + F]
                score += float(F32(w.real)) * re + float(F32(w.imag)) * im + b * np.sqrt(re * re + im * im)
            z = (score - score.mean()) / max(score.std(), 1e-6)
            kept = top_k_older_first(z, k)
            # The C++ sums in float32: z-scores near 0 carry absolute errors
            # of about 1e-6, so near ties are judged on an absolute scale.
            check_margin(z, kept, f"triattention t={t}", abs_tol=1e-4)
            hd.keep(list(range(n_kept)) + [n_kept + i for i in kept])

    def select_trimkv(self):
        """TRIM-KV after any pass (the prefill too) that leaves a head holding
        budget + period slots: each slot scores (t - j) * log beta_j in
        float32, t the newest slot's position, and the head keeps its budget
        highest (the kept prompt leading)."""
        C, period = self.p["budget"], self.p["period"]
        for hd in self.heads:
            n = len(hd.pos)
            if n < C + period:
                continue
            t = hd.pos[-1]
            scores = np.array([F32(t - j) * F32(r) for j, r in zip(hd.pos, hd.score)], dtype=F32)
            hd.keep(self.keep_top(scores, n, n, C, f"trimkv t={self.t}"))

    def state(self, h):
        hd = self.heads[h]
        if self.name == "lazy":
            return {"last": list(map(int, hd.last)), "mri": list(map(int, hd.mri))}
        if self.name == "raas":
            return {"timestamp": list(map(int, hd.last))}
        if self.name in ("h2o", "tova", "caote"):
            return {"attn": [float(a) for a in hd.attn]}
        if self.name in ("obcache", "trimkv"):
            return {"score": [float(a) for a in hd.score]}
        return {}

    def run(self):
        self.raas_newest_differs = False
        self.prefill()
        out = []
        for i, step in enumerate(self.trace["steps"]):
            self.decode(i, step)
            out.append({"t": self.t, "kept": [list(map(int, hd.pos)) for hd in self.heads],
                        "state": [self.state(h) for h in range(self.H)]})
        return {"peak_slots": self.peak, "steps": out}


# ---------------------------------------------------------------- generators

def rounded(x, digits=4):
    return [round(float(v), digits) for v in np.ravel(x)]


def random_trace(rng, policy, P, n_steps, H=2, D=8, prompt_queries=False, sharpness=(2.0, 6.0), draft=0,
                 history=None):
    """Keys: a few recurring 'topics' plus noise; each query aims at one or two
    earlier keys with a random sharpness, so some slots pass alpha, many not.
    history: the prompt's first tokens that are history (epicache), at which
    the draft queries aim."""
    n = P + n_steps
    topics = rng.normal(size=(4, D))
    keys = np.empty((H, n, D))
    for h in range(H):
        for i in range(n):
            keys[h, i] = 0.8 * topics[rng.integers(4)] + 0.6 * rng.normal(size=D)
    keys = np.round(keys, 4)

    def query_for(h, pos):
        targets = rng.integers(0, pos + 1, size=rng.integers(1, 3))
        direction = keys[h, targets].sum(axis=0)
        direction = direction / (np.linalg.norm(direction) + 1e-9)
        return direction * rng.uniform(*sharpness) * math.sqrt(D) / 2 + 0.3 * rng.normal(size=D)

    trace = {"policy": policy, "H": H, "D": D,
             "prompt_keys": [[rounded(keys[h, p]) for p in range(P)] for h in range(H)]}
    if prompt_queries:
        trace["prompt_queries"] = [[rounded(query_for(h, p)) for p in range(P)] for h in range(H)]
    trace["steps"] = [{"query": [rounded(query_for(h, P + i)) for h in range(H)],
                       "new_key": [rounded(keys[h, P + i]) for h in range(H)]} for i in range(n_steps)]
    if history is not None:
        trace["history_len"] = history
    if draft:
        aim = (history or n) - 1
        trace["draft_queries"] = [[rounded(query_for(h, aim)) for h in range(H)] for _ in range(draft)]
    return trace


def add_sentences(rng, trace, E=6, n_topics=3):
    """Generated tokens and final hidden states: token 0 ends a sentence
    (about one token in four); the hidden states of the tokens after one
    share a topic with noise, so sentences on the same topic come out
    redundant."""
    topics = rng.normal(size=(n_topics, E))
    topic = rng.integers(n_topics)
    trace["sentence_ends"] = [0]
    for step in trace["steps"]:
        token = 0 if rng.uniform() < 0.25 else int(rng.integers(1, 5))
        step["token"] = token
        step["hidden"] = rounded(topics[topic] + 0.35 * rng.normal(size=E))
        if token == 0:
            topic = rng.integers(n_topics)


def add_rates(rng, trace):
    """TRIM-KV's retention rates, log beta per token and head: -e^N(-3, 1.5),
    from 1e-4 to about 1 (beta from 0.9999 down to 0.4), 4 significant digits."""
    H, P = trace["H"], len(trace["prompt_keys"][0])

    def rate():
        return float(f"{-math.exp(rng.normal(-3.0, 1.5)):.4g}")

    trace["prompt_log_beta"] = [[rate() for _ in range(P)] for _ in range(H)]
    for step in trace["steps"]:
        step["log_beta"] = [rate() for _ in range(H)]


def random_query_stats(rng, H, D):
    """Query centres and mean magnitudes for one layer of H query heads: the
    mean magnitude is the centre's plus a spread, as a measured one is."""
    F = D // 2
    re, im = rng.normal(size=(H, F)), rng.normal(size=(H, F))
    spread = np.abs(re + 1j * im) + rng.uniform(0.05, 1.0, size=(H, F))
    return {"format": "lazykv-query-stats", "version": 1, "model": "trace", "tokens": 1000,
            "n_layer": 1, "n_head": H, "n_freq": F,
            "mean_re": rounded(re), "mean_im": rounded(im), "abs_mean": rounded(spread)}


def generate(seed, policy, P, n_steps, accept=None, want_newest_case=False, **kw):
    """Tries seeds from `seed` until the trace replays without ambiguity."""
    for s in range(seed, seed + 500):
        rng = np.random.default_rng(s)
        trace = random_trace(rng, policy, P, n_steps, **kw)
        if policy["name"] == "triattention":
            trace["rope_theta"] = 500.0
            trace["query_stats"] = random_query_stats(rng, trace["H"], trace["D"])
        if policy["name"] == "skipkv":
            add_sentences(rng, trace)
        if policy["name"] == "trimkv":
            add_rates(rng, trace)
        r = Replay(trace)
        try:
            expected = r.run()
        except Ambiguous:
            continue
        if r.name == "raas" and r.raas_newest_differs != want_newest_case:
            continue
        if accept is not None and not accept(r, expected):
            continue
        return trace, expected
    raise RuntimeError(f"no unambiguous trace for {policy} from seed {seed}")


def evictions(expected):
    """How many steps dropped a slot (in head 0)."""
    count, prev = 0, None
    for st in expected["steps"]:
        kept = st["kept"][0]
        if prev is not None and any(p not in kept for p in prev):
            count += 1
        prev = kept
    return count


def hand_trace():
    """H=1, D=2, W=2, C=4, alpha=0.3. Keys are unit vectors A=(1,0), B=(0,1),
    C=(-1,0), E=(0,-1); a query of length 40 aimed at a label gives its slots
    (one or two in the cache) probability ~1 or ~1/2 and every other slot
    < 1e-12, so the hits are exactly the slots of the aimed label.

    Prompt: pos0 A, pos1 B.  (last, mri) per slot after each step:
    t=1 key C(pos2), aim A: hit pos0: mri=max(0,1-0)=1,last=1. pos2 starts (0,0).
    t=2 key E(pos3), aim C: hit pos2: mri=2,last=2. pos3 starts (1,0). n=4 = C: no eviction.
    t=3 key A(pos4), aim B: hit pos1: mri=3,last=3. pos4 starts (2,0).
    t=4 key B(pos5), aim A: hits pos0: mri=max(1,4-1)=3,last=4; pos4: mri=max(0,4-2)=2,last=4.
        pos5 starts (3,0). n=6 > 4 and 4 mod 2 = 0: score pos0..pos3, keep top 2 + pos4,pos5:
        pos0 (4,3): 2/(1+e^1) + 2/(1+e^2)                  = 0.5379 + 0.2384 = 0.7763
        pos1 (3,3): 2/(1+e^(1+1/3)) + 2/(1+e^2)            = 0.4172 + 0.2384 = 0.6556
        pos2 (2,2): 2/(1+e^(1+2/2)) + 2/(1+e^1)            = 0.2384 + 0.5379 = 0.7763
        pos3 (1,0): mri = 0: (3/1e-5) sends the first term to 0, the second is 0 -> 0
        kept [0, 2, 4, 5].
    t=5 key C(pos6), aim C: hits pos2: mri=max(2,5-2)=3,last=5; pos6: mri=max(0,5-4)=1,last=5.
    t=6 key E(pos7), aim B: hit pos5: mri=max(0,6-3)=3,last=6. pos7 starts (5,0). n=6: evict:
        pos0 (4,3): 2/(1+e^(1+2/3)) + 0.2384 = 0.3177 + 0.2384 = 0.5561
        pos2 (5,3): 0.4172 + 0.2384 = 0.6556
        pos4 (4,2): 2/(1+e^2) + 2/(1+e^1) = 0.7763
        pos5 (6,3): 2/(1+e^1) + 2/(1+e^2) = 0.7763
        kept [4, 5, 6, 7].
    t=7 key A(pos8), aim E: hit pos7: mri=max(0,7-5)=2,last=7. pos8 starts (6,0).
    t=8 key B(pos9), aim A: hits pos4: mri=max(2,8-4)=4,last=8; pos8: mri=max(0,8-6)=2,last=8.
        pos9 starts (7,0). n=6: evict:
        pos4 (8,4): 2/(1+e^1) + 2/(1+e^3)     = 0.5379 + 0.0949 = 0.6327
        pos5 (6,3): 2/(1+e^(1+2/3)) + 0.2384 = 0.5561
        pos6 (5,1): 2/(1+e^(1+3/1)) + 2/(1+e^0) = 0.0360 + 1 = 1.0360
        pos7 (7,2): 2/(1+e^(1+1/2)) + 2/(1+e^1) = 0.3649 + 0.5379 = 0.9027
        kept [6, 7, 8, 9]: pos6, hit once after one step, outranks pos4, hit twice.
    """
    unit = {"A": [1, 0], "B": [0, 1], "C": [-1, 0], "E": [0, -1]}
    aim = lambda label: [40 * v for v in unit[label]]  # noqa: E731
    plan = [("C", "A"), ("E", "C"), ("A", "B"), ("B", "A"), ("C", "C"), ("E", "B"), ("A", "E"), ("B", "A")]
    trace = {"policy": {"name": "lazy", "budget": 4, "window": 2, "alpha": 0.3}, "H": 1, "D": 2,
             "prompt_keys": [[unit["A"], unit["B"]]],
             "steps": [{"query": [aim(q)], "new_key": [unit[k]]} for k, q in plan]}
    hand = {
        1: ([0, 1, 2], [1, 0, 0], [1, 0, 0]),
        2: ([0, 1, 2, 3], [1, 0, 2, 1], [1, 0, 2, 0]),
        3: ([0, 1, 2, 3, 4], [1, 3, 2, 1, 2], [1, 3, 2, 0, 0]),
        4: ([0, 2, 4, 5], [4, 2, 4, 3], [3, 2, 2, 0]),
        5: ([0, 2, 4, 5, 6], [4, 5, 4, 3, 5], [3, 3, 2, 0, 1]),
        6: ([4, 5, 6, 7], [4, 6, 5, 5], [2, 3, 1, 0]),
        7: ([4, 5, 6, 7, 8], [4, 6, 5, 7, 6], [2, 3, 1, 2, 0]),
        8: ([6, 7, 8, 9], [5, 7, 8, 7], [1, 2, 2, 0]),
    }
    expected = Replay(trace).run()
    for st in expected["steps"]:
        kept, last, mri = hand[st["t"]]
        got = (st["kept"][0], st["state"][0]["last"], st["state"][0]["mri"])
        assert got == (kept, last, mri), f"hand-worked lazy trace differs at t={st['t']}: {got}"
    assert expected["peak_slots"] == 6  # C + W
    return trace, expected


def cases():
    """(file stem, trace, expected) for every golden trace."""
    out = []

    def add(stem, pair, min_evictions=0):
        trace, expected = pair
        if min_evictions:
            assert evictions(expected) >= min_evictions, f"{stem}: only {evictions(expected)} evictions"
        if trace["policy"].get("keep_prompt"):
            P = len(trace["prompt_keys"][0])
            assert all(set(range(P)) <= set(kept) for st in expected["steps"] for kept in st["kept"]), stem
        out.append((stem, trace, expected))

    add("full_random1", generate(100, {"name": "full"}, 8, 40))
    add("full_random2", generate(110, {"name": "full"}, 11, 50, prompt_queries=True))

    lazy = {"name": "lazy", "budget": 12, "window": 4, "alpha": 0.05}
    add("lazy_random1", generate(200, lazy, 8, 70), 10)
    add("lazy_random2", generate(210, dict(lazy, budget=14, window=3, alpha=0.04), 12, 80), 10)
    # Ties at the cut (many never-hit slots score exactly 0), broken by older position.
    add("lazy_ties", generate(220, dict(lazy, budget=10, window=2, alpha=0.3), 6, 60,
                              accept=lambda r, e: r.saw_tie_at_cut), 10)
    add("lazy_hand", hand_trace())
    add("lazy_per_query_head", generate(230, dict(lazy, per_query_head=1), 9, 60), 10)

    add("streaming_random1", generate(300, {"name": "streaming", "budget": 10, "sinks": 2}, 8, 50), 10)
    add("streaming_random2", generate(310, {"name": "streaming", "budget": 12, "sinks": 4}, 14, 45), 10)

    add("h2o_random1", generate(400, {"name": "h2o", "budget": 12, "recent": 3}, 8, 60), 10)
    add("h2o_prefill", generate(410, {"name": "h2o", "budget": 10, "recent": 0}, 12, 50, prompt_queries=True), 10)

    add("tova_random1", generate(500, {"name": "tova", "budget": 12}, 8, 60), 10)
    add("tova_prefill", generate(510, {"name": "tova", "budget": 10}, 12, 50, prompt_queries=True), 10)

    snap = {"name": "snapkv", "budget": 10, "window": 4, "kernel": 3, "period": 6}
    add("snapkv_random1", generate(600, snap, 16, 60, prompt_queries=True), 5)
    add("snapkv_random2", generate(610, dict(snap, budget=12, window=3, kernel=5, period=8), 18, 70,
                                   prompt_queries=True), 5)

    rkv = {"name": "rkv", "budget": 10, "window": 4, "kernel": 3, "period": 6, "lambda": 0.1}
    add("rkv_random1", generate(700, rkv, 16, 60, prompt_queries=True), 5)
    add("rkv_random2", generate(710, dict(rkv, budget=12, window=3, kernel=5, period=5, **{"lambda": 0.6}), 14, 70,
                                prompt_queries=True), 5)

    raas = {"name": "raas", "budget": 12, "alpha": 0.05}
    add("raas_random1", generate(800, raas, 8, 60), 10)
    add("raas_long_prompt", generate(810, dict(raas, budget=10, alpha=0.6), 11, 45), 10)
    # Steps where older decode slots are hit along with the newest token: the
    # newest token must still stay (a plain older-first top-k would drop it).
    add("raas_newest_kept", generate(820, dict(raas, budget=10), 8, 45, want_newest_case=True), 10)

    add("caote_random1", generate(900, {"name": "caote", "budget": 12, "recent": 3}, 8, 60), 10)
    # recent 0: the paper's criterion alone (the newest token competes too).
    add("caote_prefill", generate(910, {"name": "caote", "budget": 10, "recent": 0}, 12, 50, prompt_queries=True), 10)

    add("obcache_random1", generate(1000, {"name": "obcache", "budget": 12, "recent": 3}, 8, 60), 10)
    add("obcache_prefill", generate(1010, {"name": "obcache", "budget": 10, "recent": 4}, 12, 50,
                                    prompt_queries=True), 10)
    # The TOVA base: the current query alone, no recent window.
    add("obcache_current", generate(1020, {"name": "obcache", "budget": 10, "recent": 0, "accumulate": 0}, 12, 50,
                                    prompt_queries=True), 10)

    vase = {"name": "vase", "budget": 12, "window": 4, "large": 0.25, "sinks": 2, "kernel": 3, "seed": 7}
    add("vase_random1", generate(1100, vase, 8, 70), 10)
    # A prompt over budget: the first eviction's window holds prompt queries.
    add("vase_long_prompt", generate(1110, dict(vase, budget=10, window=4, large=0.5, kernel=5, seed=3), 14, 50,
                                     prompt_queries=True), 8)
    add("vase_sketch", generate(1120, dict(vase, sketch=1, rank=4, seed=5), 8, 70), 10)

    # keep_prompt=1: the prompt stays whatever its scores, the rest compete
    # for what the prompt and the recent slots leave of the budget.
    add("lazy_keep_prompt", generate(1300, {"name": "lazy", "budget": 14, "window": 3, "alpha": 0.05,
                                            "keep_prompt": 1}, 6, 60), 10)
    add("streaming_keep_prompt", generate(1310, {"name": "streaming", "budget": 12, "sinks": 2, "keep_prompt": 1},
                                          7, 40), 10)
    add("h2o_keep_prompt", generate(1320, {"name": "h2o", "budget": 14, "recent": 3, "keep_prompt": 1}, 6, 50,
                                    prompt_queries=True), 10)
    add("tova_keep_prompt", generate(1330, {"name": "tova", "budget": 12, "keep_prompt": 1}, 7, 50,
                                     prompt_queries=True), 10)
    add("snapkv_keep_prompt", generate(1340, dict(snap, budget=14, keep_prompt=1), 6, 60, prompt_queries=True), 5)
    add("rkv_keep_prompt", generate(1350, dict(rkv, budget=14, keep_prompt=1), 6, 60, prompt_queries=True), 5)
    add("caote_keep_prompt", generate(1360, {"name": "caote", "budget": 12, "recent": 3, "keep_prompt": 1}, 6, 50),
        10)
    add("obcache_keep_prompt", generate(1370, {"name": "obcache", "budget": 12, "recent": 3, "keep_prompt": 1}, 6, 50,
                                        prompt_queries=True), 10)
    add("vase_keep_prompt", generate(1380, dict(vase, budget=14, keep_prompt=1), 6, 70), 10)

    laq = {"name": "laq", "budget": 10, "lookahead": 3, "recent": 2, "window": 4, "kernel": 3, "period": 6}
    add("laq_random1", generate(1400, laq, 16, 60, prompt_queries=True, draft=4), 5)
    # Plain LAQ (the draft's queries alone), a longer draft than the trace gives.
    add("laq_plain", generate(1410, dict(laq, recent=0, lookahead=8, kernel=5, period=8), 14, 60,
                              prompt_queries=True, draft=5), 5)
    add("laq_keep_prompt", generate(1420, dict(laq, budget=14, keep_prompt=1), 6, 60, prompt_queries=True, draft=3), 5)

    tri = {"name": "triattention", "budget": 12, "period": 4, "keep_prompt": 1}
    add("triattention_random1", generate(1200, tri, 6, 70), 10)
    # The prompt competes too.
    add("triattention_prompt_evicted", generate(1210, dict(tri, keep_prompt=0, period=3), 10, 50), 8)

    skip = {"name": "skipkv", "budget": 12, "window": 3, "kernel": 3, "period": 5, "lambda": 0.1, "tau": 0.9,
            "min_sentence": 2, "max_sentence": 6}
    redundant = lambda r, e: any(pen > 0 for pen in r.sentences.penalty)
    add("skipkv_random1", generate(1500, skip, 8, 70, accept=redundant), 8)
    add("skipkv_random2", generate(1510, dict(skip, budget=14, window=4, kernel=5, period=6, penalty=0.05,
                                              **{"lambda": 0.6}), 12, 80, prompt_queries=True, accept=redundant), 8)
    add("skipkv_keep_prompt", generate(1520, dict(skip, budget=16, keep_prompt=1, tau=0.8), 6, 70,
                                       prompt_queries=True, accept=redundant), 8)
    # A sentence per token, past the 256 whose embeddings stay compared.
    add("skipkv_many_sentences", generate(1540, dict(skip, max_sentence=1, tau=0.5, budget=16, window=3), 6, 290,
                                          accept=lambda r, e: len(r.sentences.emb) > 256), 20)
    # No sentence ever ends: single slots only, R-KV's ranking.
    add("skipkv_no_sentences", generate(1530, dict(skip, min_sentence=4096, max_sentence=4096), 8, 50), 5)

    trim = {"name": "trimkv", "budget": 12, "period": 1}
    add("trimkv_random1", generate(1600, trim, 8, 60), 10)
    # A prompt past budget + period, compressed by its own pass; then every 3 steps.
    add("trimkv_prompt_evicted", generate(1610, dict(trim, budget=8, period=3), 14, 50), 8)
    add("trimkv_keep_prompt", generate(1620, dict(trim, budget=14, keep_prompt=1), 6, 60), 10)

    # EpiCache compresses the history between its blocks; the question and
    # the steps go on unevicted, so each step's kept sets show the history's.
    epi = {"name": "epicache", "budget": 6, "block": 5, "sinks": 2}
    compressed = lambda at_least: lambda r, e: r.compressions >= at_least  # noqa: E731

    def history_kept(e, history):
        return [sum(1 for pos in kept if pos < history) for kept in e["steps"][0]["kept"]]

    # Joint budget: the heads end up holding different shares of it; blocks
    # of 5, 5, 5 and 2 history tokens, then a question of 7.
    add("epicache_random1", generate(1700, epi, 24, 10, prompt_queries=True, draft=3, history=17,
                                     accept=lambda r, e: r.compressions >= 3 and len(set(history_kept(e, 17))) > 1))
    add("epicache_uniform", generate(1710, dict(epi, budget=5, block=4, sinks=1, uniform=1), 20, 8, draft=4,
                                     history=14, accept=compressed(3)))
    # Budget 1 over three heads and no sinks: a head the best three entries
    # all miss keeps its newest slot alone.
    add("epicache_sinks0", generate(1720, dict(epi, budget=1, block=3, sinks=0), 12, 8, H=3, draft=2, history=10,
                                    accept=lambda r, e: r.compressions >= 3 and r.newest_only))
    # No "history_len": the whole prompt is history, its last block compressed too.
    add("epicache_no_question", generate(1730, dict(epi, budget=5, block=6, sinks=2), 20, 8, draft=5,
                                         accept=compressed(4)))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(REPO, "tests", "data", "policy"))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    for stem, trace, expected in cases():
        path = os.path.join(args.out, stem + ".json")
        with open(path, "w") as f:
            json.dump({"trace": trace, "expected": expected}, f, separators=(",", ":"))
            f.write("\n")
        print(f"{path}: {len(trace['steps'])} steps, {evictions(expected)} evicting steps, "
              f"peak {expected['peak_slots']}", file=sys.stderr)


if __name__ == "__main__":
    main()
