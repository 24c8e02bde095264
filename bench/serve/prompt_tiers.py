#!/usr/bin/env python3
"""What prompt reuse through the tiers (`--prefix-cache-tiers`) saves, on one
machine. DOCS documents of about DOC_TOKENS tokens are prefilled once by a
`lazykv serve` over a `lazykv kvstore`; that server stops, and a new one (its
prefix cache empty, as a replica's or a restarted server's) is sent each
document with a question, streamed, one token out: its prompt blocks come from
the kvstore instead of being computed. Twice: a kvstore whose host tier holds
every block, and one with an 8 MiB host tier (five blocks of SmolLM2), whose
blocks are mostly on its NVMe tier (RocksDB). The same prompts to a server
without a prefix cache give the computed time to first token.

Prints one JSON object: per configuration the TTFT of each prompt, p50 and
p99, the speed-up of p50 over computing, whether the greedy replies equal the
computed ones, the bytes the server fetched and the time it spent on that
(its /metrics), the TTFT of the same prompts once they are in its own prefix
cache, and the fetch rate two ways (bytes over the fetch time, and over the
TTFT difference), next to the peer for a transfer: a memcpy of the bytes.

  usage: bench/serve/prompt_tiers.py LAZYKV_BINARY MODEL.gguf
  env:   THREADS (2), DOC_TOKENS (2000), DOCS (5), TRANSPORTS (UCX_TLS syntax for the kvstore and the
         servers' connections to it; "": UCX chooses, on one machine shared memory)
"""
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

BIN, MODEL_PATH = sys.argv[1], sys.argv[2]
THREADS = os.environ.get("THREADS", "2")
DOC_TOKENS = int(os.environ.get("DOC_TOKENS", "2000"))
DOCS = int(os.environ.get("DOCS", "5"))
TRANSPORTS = os.environ.get("TRANSPORTS", "")
WORK = tempfile.mkdtemp(prefix="lazykv-prompt-tiers.")
procs = []


def launch(args, ready):
    """Starts `lazykv ARGS`; returns (process, the first match of `ready` in its log)."""
    log = open(os.path.join(WORK, f"{len(procs)}.log"), "w+")
    p = subprocess.Popen([BIN] + args, stdout=log, stderr=subprocess.STDOUT)
    procs.append(p)
    for _ in range(1200):
        log.seek(0)
        found = re.search(ready, log.read())
        if found:
            return p, found.group(1)
        if p.poll() is not None:
            break
        time.sleep(0.1)
    log.seek(0)
    sys.exit(f"lazykv {args[0]} did not start:\n{log.read()}")


def stop(p):
    p.terminate()
    p.wait(timeout=60)


def serve(*flags):
    p, url = launch(["serve", "--model", MODEL_PATH, "--threads", THREADS, "--ctx", "8192", "--port", "0", *flags],
                    r"listening on (http://[0-9.:]+)")
    for _ in range(600):
        try:
            urllib.request.urlopen(url + "/ready", timeout=5)
            break
        except OSError:
            time.sleep(0.1)
    return p, url


def post(url, body):
    req = urllib.request.Request(url + "/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"})
    return urllib.request.urlopen(req, timeout=600)


def model_id(url):
    return json.load(urllib.request.urlopen(url + "/v1/models", timeout=30))["data"][0]["id"]


def ttft(url, prompt):
    """Seconds to the first streamed token, and its text."""
    body = {"model": model_id(url), "prompt": prompt, "max_tokens": 1, "temperature": 0, "stream": True}
    start, first, text = time.perf_counter(), None, ""
    with post(url, body) as resp:
        for line in resp:
            line = line.decode().strip()
            if not line.startswith("data: {"):
                continue
            choice = json.loads(line[6:])["choices"][0]
            if first is None and (choice.get("text") or choice.get("finish_reason")):
                first = time.perf_counter() - start
            text += choice.get("text") or ""
    return first, text


def metric(url, name):
    for line in urllib.request.urlopen(url + "/metrics", timeout=30).read().decode().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


def p99(values):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(0.99 * (len(ordered) - 1))))]


def documents(url):
    """DOCS distinct documents of about DOC_TOKENS tokens (numbered sentences)."""
    words = "the courier signs for each parcel by weight and depot while the clerk checks the ledger".split()
    def doc(d, n):
        return " ".join(f"Document {d} entry {i}: " + " ".join(words[(i + d + k) % len(words)] for k in range(12)) + "."
                        for i in range(n))
    with post(url, {"model": model_id(url), "prompt": doc(0, 100), "max_tokens": 1}) as resp:
        per_sentence = json.load(resp)["usage"]["prompt_tokens"] / 100
    n = max(1, int(DOC_TOKENS / per_sentence))
    return [doc(d, n) for d in range(DOCS)]


def through_tiers(docs, prompts, kvstore_flags):
    kv, address = launch(["kvstore", "--listen", "127.0.0.1:0", "--metrics-port", "0", "--transports", TRANSPORTS,
                          "--alloc-unit-kib", "4", *kvstore_flags], r"control \(gRPC\) on ([0-9.]+:[0-9]+)")
    flags = ["--prefix-cache-mib", "256", "--prefix-cache-tiers", "--kvstore", address, "--kvstore-transports", TRANSPORTS]
    first, url = serve(*flags)
    for d in docs:  # computed once, put to the kvstore
        ttft(url, d)
    stop(first)
    second, url = serve(*flags)
    runs = [ttft(url, p) for p in prompts]
    fetched = metric(url, "lazykv_prefix_cache_fetched_bytes_total")
    fetch_seconds = metric(url, "lazykv_prefix_cache_fetch_seconds_total")
    hit = metric(url, "lazykv_prefix_cache_hit_tokens_total")
    # Again: now from its own prefix cache, so the difference is the fetch.
    local = statistics.median(ttft(url, p)[0] for p in prompts)
    stop(second)
    stop(kv)
    times = [t for t, _ in runs]
    p50 = statistics.median(times)
    return {"ttft_s": [round(t, 4) for t in times], "p50_ttft_s": round(p50, 4), "p99_ttft_s": round(p99(times), 4),
            "p50_ttft_local_hit_s": round(local, 4), "fetched_bytes": int(fetched), "hit_tokens": int(hit),
            "fetch_seconds": round(fetch_seconds, 4),
            # The worker's own fetch time (the step waits for it), and the
            # TTFT it adds over a hit in its own cache (a fresh server's KV
            # pool also grows on its first prompts: page faults).
            "fetch_gb_s": round(fetched / max(fetch_seconds, 1e-9) / 1e9, 3),
            "ttft_gb_s": round(fetched / len(prompts) / max(p50 - local, 1e-6) / 1e9, 3),
            "texts": [text for _, text in runs]}


def memcpy_gb_s(size):
    """The peer for the transfer: one process copying the same bytes (a memcpy under CPython)."""
    src, dst = bytearray(os.urandom(1 << 20) * (size >> 20)), bytearray(size >> 20 << 20)
    best = 0.0
    for _ in range(5):
        start = time.perf_counter()
        dst[:] = src
        best = max(best, len(src) / (time.perf_counter() - start) / 1e9)
    return round(best, 2)


try:
    plain, plain_url = serve()
    docs = documents(plain_url)
    prompts = [d + f" Question: which entry of document {i} names the depot first?" for i, d in enumerate(docs)]
    with post(plain_url, {"model": model_id(plain_url), "prompt": prompts[0], "max_tokens": 1}) as resp:
        prompt_tokens = json.load(resp)["usage"]["prompt_tokens"]
    computed = [ttft(plain_url, p) for p in prompts]
    stop(plain)
    times = [t for t, _ in computed]
    result = {"documents": DOCS, "prompt_tokens": prompt_tokens, "threads": int(THREADS), "transports": TRANSPORTS,
              "computed": {"ttft_s": [round(t, 4) for t in times], "p50_ttft_s": round(statistics.median(times), 4),
                           "p99_ttft_s": round(p99(times), 4)}}
    configurations = {"kvstore_host_tier": ["--host-capacity-mib", "512"],
                      "kvstore_nvme_tier": ["--host-capacity-mib", "8", "--nvme-path", os.path.join(WORK, "nvme")]}
    for name, kvstore_flags in configurations.items():
        run = through_tiers(docs, prompts, kvstore_flags)
        run["same_replies"] = run.pop("texts") == [text for _, text in computed]
        run["p50_speedup"] = round(result["computed"]["p50_ttft_s"] / run["p50_ttft_s"], 2)
        result[name] = run
    result["memcpy_gb_s"] = memcpy_gb_s(result["kvstore_host_tier"]["fetched_bytes"] // DOCS)
    print(json.dumps(result, indent=2))
finally:
    for p in procs:
        if p.poll() is None:
            p.kill()
    shutil.rmtree(WORK, ignore_errors=True)
