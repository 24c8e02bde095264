#!/usr/bin/env bash
# What prompt KV reuse (`--prefix-cache-mib`) saves, on one machine: two
# `lazykv serve` of the same model, one with a prefix cache and one without,
# measured in turn on the same requests (streamed, one token out, so the time
# is the time to first token):
#   document: a prompt of about DOC_TOKENS tokens sent once, then QUESTIONS
#             prompts that start with its first ~95% and end with a question
#             of their own;
#   chat:     a conversation of TURNS turns over a system prompt of
#             SYSTEM_SENTENCES sentences (~17 tokens each), each prompt the
#             previous one plus the reply and a new user message; with the
#             defaults it grows to about 4,000 tokens.
# Prints one JSON object: per workload and server the TTFT of each request
# (median of the reused ones), the speed-up, whether both servers' greedy
# replies were the same, and the prefix cache's counters from /metrics.
#   usage: bench/serve/prompt_reuse.sh LAZYKV_BINARY MODEL.gguf
#   env:   THREADS (2), DOC_TOKENS (2000), QUESTIONS (5), TURNS (10), SYSTEM_SENTENCES (210), PREFIX_MIB (256),
#          LLAMA_SERVER (llama.cpp's llama-server binary: the same workloads on it, the peer)
set -euo pipefail
shopt -s inherit_errexit
bin=$1 model=$2
threads=${THREADS:-2}
doc_tokens=${DOC_TOKENS:-2000}
questions=${QUESTIONS:-5}
turns=${TURNS:-10}
system_sentences=${SYSTEM_SENTENCES:-210}
prefix_mib=${PREFIX_MIB:-256}
source "$(dirname "$0")/servers.sh"

start cached serve --model "$model" --threads "$threads" --ctx 8192 --prefix-cache-mib "$prefix_mib"
start plain serve --model "$model" --threads "$threads" --ctx 8192
# The peer: llama.cpp's server (one slot, which keeps its last prompt's KV: cache_prompt).
llama=""
if [ -n "${LLAMA_SERVER:-}" ]; then
  port=$((20000 + RANDOM % 20000))
  "$LLAMA_SERVER" -m "$model" -t "$threads" -c 8192 -np 1 --port "$port" >"$work/llama.log" 2>&1 &
  pids+=($!)
  llama="http://127.0.0.1:$port"
  for _ in $(seq 1 600); do curl -sf "$llama/health" >/dev/null && break; sleep 0.1; done
  curl -sf "$llama/health" >/dev/null || { cat "$work/llama.log" >&2; exit 1; }
fi

python3 - "$cached" "$plain" "$doc_tokens" "$questions" "$turns" "$llama" "$system_sentences" <<'PY'
import json, statistics, sys, time, urllib.request

cached, plain, llama = sys.argv[1], sys.argv[2], sys.argv[6]
doc_tokens, questions, turns = int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
system_sentences = int(sys.argv[7])

def model_id(url):
    return json.load(urllib.request.urlopen(url + "/v1/models", timeout=30))["data"][0]["id"]

MODEL = model_id(plain)

def post(url, path, body):
    body = dict(body, model=MODEL)
    req = urllib.request.Request(url + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
    return urllib.request.urlopen(req, timeout=600)

def ttft(url, path, body):
    """Seconds to the first streamed chunk that carries text, and the reply's text."""
    body = dict(body, stream=True, max_tokens=body.get("max_tokens", 1), temperature=0)
    if url == llama:
        body["cache_prompt"] = True  # its default too; said so the comparison does not depend on it
    start, first, text = time.perf_counter(), None, ""
    with post(url, path, body) as resp:
        for line in resp:
            line = line.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            choice = chunk["choices"][0] if chunk.get("choices") else {}
            piece = choice.get("text") or (choice.get("delta") or {}).get("content") or ""
            if first is None and (piece or choice.get("finish_reason")):
                first = time.perf_counter() - start
            text += piece
    return first, text

def prompt_tokens(url, text):
    with post(url, "/v1/completions", {"prompt": text, "max_tokens": 1}) as resp:
        return json.load(resp)["usage"]["prompt_tokens"]

# A document of about doc_tokens tokens: numbered sentences, deterministic.
words = "the ledger lists each shipment by weight and port while the clerk checks totals against the manifest".split()
sentences = [f"Entry {i}: " + " ".join(words[(i + k) % len(words)] for k in range(12)) + "." for i in range(4000)]
lo, hi = 1, doc_tokens // 8 + 1  # a sentence is more than 8 tokens
while lo < hi:  # the fewest sentences reaching doc_tokens
    mid = (lo + hi) // 2
    if prompt_tokens(plain, " ".join(sentences[:mid])) < doc_tokens: lo = mid + 1
    else: hi = mid
document = " ".join(sentences[:lo])
shared = " ".join(sentences[: int(lo * 0.95)])
doc_prompt_tokens = prompt_tokens(plain, document)
shared_tokens = prompt_tokens(plain, shared)

def document_run(url):
    first, _ = ttft(url, "/v1/completions", {"prompt": document})
    runs = [ttft(url, "/v1/completions", {"prompt": shared + f" Question {q}: which entry lists port number {q}?"})
            for q in range(questions)]
    reused = [t for t, _ in runs]
    return {"first_ttft_s": round(first, 4), "ttft_s": [round(t, 4) for t in reused],
            "median_ttft_s": round(statistics.median(reused), 4), "texts": [text for _, text in runs]}

def chat_run(url):
    messages = [{"role": "system", "content": " ".join(sentences[:system_sentences])}]
    times = []
    for t in range(turns):
        messages.append({"role": "user", "content": f"Turn {t}: summarise entry {t} in a few words."})
        first, reply = ttft(url, "/v1/chat/completions", {"messages": messages, "max_tokens": 24})
        times.append(round(first, 4))
        messages.append({"role": "assistant", "content": reply})
    with post(plain, "/v1/chat/completions", {"messages": messages[:-1], "max_tokens": 1}) as resp:
        last_prompt_tokens = json.load(resp)["usage"]["prompt_tokens"]
    return {"ttft_s": times, "median_ttft_s": round(statistics.median(times[1:]), 4),
            "total_ttft_s": round(sum(times), 3), "last_prompt_tokens": last_prompt_tokens,
            "texts": [m["content"] for m in messages if m["role"] == "assistant"]}

def metrics(url):
    out = {}
    for line in urllib.request.urlopen(url + "/metrics", timeout=30).read().decode().splitlines():
        if line.startswith("lazykv_prefix_cache_"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out

result = {"document_tokens": doc_prompt_tokens, "shared_tokens": shared_tokens}
for name, run in (("document", document_run), ("chat", chat_run)):
    with_cache, without = run(cached), run(plain)
    # Greedy replies of both servers, compared (a reused prefix is the same KV up to rounding).
    same = with_cache.pop("texts") == without.pop("texts")
    result[name] = {"prefix_cache": with_cache, "no_prefix_cache": without,
                    "ttft_speedup": round(without["median_ttft_s"] / with_cache["median_ttft_s"], 2),
                    "same_replies": same}
    if "total_ttft_s" in with_cache:  # the whole conversation's prefill time
        result[name]["total_ttft_speedup"] = round(without["total_ttft_s"] / with_cache["total_ttft_s"], 2)
    if llama:
        peer = run(llama)
        peer.pop("texts")
        result[name]["llama_server"] = peer
        result[name]["ttft_vs_llama_server"] = round(peer["median_ttft_s"] / with_cache["median_ttft_s"], 2)
        if "total_ttft_s" in peer:
            result[name]["total_ttft_vs_llama_server"] = round(peer["total_ttft_s"] / with_cache["total_ttft_s"], 2)
result["prefix_cache_metrics"] = metrics(cached)
print(json.dumps(result, indent=2))
PY
