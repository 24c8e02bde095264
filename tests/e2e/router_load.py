"""Load for tests/e2e/router_test.sh: N chat requests over P distinct long
shared prefixes, C at a time, through the router (standard library only).

Prints one JSON line: per request its prefix, HTTP status, the replica that
served it (the router's x-lazykv-replica header) and the error message, plus
the affinity: for each prefix, the share of its answered requests that went to
the replica that served it most, averaged over prefixes.

  usage: router_load.py URL MODEL N PREFIXES CONCURRENCY MAX_TOKENS
"""
import collections
import json
import sys
import threading
import urllib.error
import urllib.request


def prefix_text(p):
    # 348-368 bytes, distinct from the first characters on, so prefixes share no block.
    words = " ".join(f"fact{p}-{i} is worth {(p * 31 + i * 7) % 97}." for i in range(16))
    return f"Context {p}: {words}"


def one_request(url, model, prefix, index, max_tokens):
    body = {"model": model, "max_tokens": max_tokens, "temperature": 0,
            "messages": [{"role": "system", "content": prefix_text(prefix)},
                         {"role": "user", "content": f"Question {index}: what is fact{prefix}-{index % 16} worth?"}]}
    req = urllib.request.Request(url + "/v1/chat/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            json.load(r)
            return r.status, r.headers.get("x-lazykv-replica", ""), ""
    except urllib.error.HTTPError as e:
        text = e.read().decode(errors="replace")
        try:
            message = json.loads(text)["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = text[:200]
        return e.code, e.headers.get("x-lazykv-replica", ""), message
    except Exception as e:  # noqa: BLE001 -- a broken connection is a result here
        return 0, "", repr(e)


def main():
    url, model = sys.argv[1], sys.argv[2]
    n, n_prefixes, concurrency, max_tokens = (int(a) for a in sys.argv[3:7])
    results = [None] * n
    next_index = iter(range(n))
    lock = threading.Lock()

    def client():
        while True:
            with lock:
                i = next(next_index, None)
            if i is None:
                return
            status, replica, error = one_request(url, model, i % n_prefixes, i, max_tokens)
            results[i] = {"prefix": i % n_prefixes, "status": status, "replica": replica, "error": error}

    threads = [threading.Thread(target=client) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    by_prefix = collections.defaultdict(collections.Counter)
    for r in results:
        if r["status"] == 200:
            by_prefix[r["prefix"]][r["replica"]] += 1
    shares = [c.most_common(1)[0][1] / sum(c.values()) for c in by_prefix.values()]
    print(json.dumps({"requests": results, "affinity": sum(shares) / len(shares) if shares else 0.0,
                      "replicas": sorted({r["replica"] for r in results if r["replica"]})}))


if __name__ == "__main__":
    main()
