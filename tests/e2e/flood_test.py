#!/usr/bin/env python3
"""A connection flood against `lazykv serve` on loopback, with its default
HTTP limits and an API key:

- 2,000 slow connections, each sending its request header one byte every
  2 s (spread over 10 client addresses of 127.0.0.0/8, 200 each, under the
  per-address cap);
- 200 unauthenticated connections announcing 4 MiB bodies and sending them
  slowly;
- 300 silent connections from one address, past its cap of 256;

while a normal client (its own address) keeps sending short generation
requests and /health probes, each on a new connection. Passes when every
normal request succeeds and /health stays 200 throughout, the slow
connections are closed by the header deadline (408), the unauthenticated
ones get 401 before sending their bodies, the address past its cap is
turned away, the server's resident memory stays within a bound, and every
answer the server gave itself is counted in lazykv_requests_total.

Prints JSON: connections held, memory per idle connection, the normal
client's latency p50/p99 during the flood against before it.

  usage: flood_test.py LAZYKV_BINARY       (LAZYKV_DEFAULT_MODEL: the model)
"""
import asyncio
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import time
import urllib.request

KEY = "flood-test-key"
SLOW_ADDRESSES = [f"127.0.1.{i}" for i in range(1, 11)]
SLOW_PER_ADDRESS = 200
UNAUTHENTICATED = 200
CAPPED_ADDRESS, CAPPED_CONNECTIONS, PER_ADDRESS_CAP = "127.0.3.1", 300, 256
NORMAL_ADDRESS = "127.0.0.2"
BODY_ADDRESS = "127.0.2.1"
HEADER_TIMEOUT = 10.0  # the server's default --http-header-timeout-seconds
BASELINE_SECONDS = 8
OPEN = {"now": 0}  # flood connections open on the client side
# What the flood may add to the server's resident memory: 2,500 connections
# at a few KiB each, with room for the allocator's slack.
RSS_BOUND_MIB = 64


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def percentile(values, q):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


async def read_status(reader, timeout):
    """The status code of the response on `reader`, or None if the server
    closed (or stayed silent) without one."""
    try:
        line = await asyncio.wait_for(reader.readline(), timeout)
    except (asyncio.TimeoutError, ConnectionError):
        return None
    match = re.match(rb"HTTP/1\.[01] (\d{3})", line)
    return int(match.group(1)) if match else None


async def request(port, method, path, body=b"", key=KEY, timeout=60):
    """One request on a new connection from NORMAL_ADDRESS: (status, seconds)."""
    start = time.monotonic()
    reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(NORMAL_ADDRESS, 0))
    head = f"{method} {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\nContent-Length: {len(body)}\r\n"
    if key:
        head += f"Authorization: Bearer {key}\r\n"
    if body:
        head += "Content-Type: application/json\r\n"
    writer.write(head.encode() + b"\r\n" + body)
    await writer.drain()
    status = await read_status(reader, timeout)
    await reader.read()  # to the end: the whole answer counts
    writer.close()
    return status, time.monotonic() - start


async def normal_client(port, model, until, results):
    body = json.dumps({"model": model, "prompt": "Twelve times seven is", "max_tokens": 4,
                       "temperature": 0}).encode()
    while time.monotonic() < until:
        status, seconds = await request(port, "POST", "/v1/completions", body)
        results["generate"].append((status, seconds))
        status, seconds = await request(port, "GET", "/health", key=None)
        results["health"].append((status, seconds))


async def slow_header(port, source, outcome):
    """Sends a header one byte every 2 s; records when and how the server ends it."""
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))
    except OSError as e:
        outcome.append(("connect_failed", 0.0, str(e)))
        return
    OPEN["now"] += 1
    start = time.monotonic()
    header = b"GET /v1/models HTTP/1.1\r\nHost: t\r\nX-Slow: " + b"a" * 100
    answer = asyncio.ensure_future(read_status(reader, 60))
    for byte in header:
        if answer.done():
            break
        try:
            writer.write(bytes([byte]))
            await writer.drain()
        except ConnectionError:
            break
        await asyncio.wait([answer], timeout=2.0)
    status = await answer
    outcome.append((status, time.monotonic() - start, ""))
    writer.close()
    OPEN["now"] -= 1


async def unauthenticated_body(port, source, outcome):
    """Announces a 4 MiB body without a key and sends it 64 KiB a second."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))
    OPEN["now"] += 1
    start = time.monotonic()
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
                 b"Content-Length: 4194304\r\n\r\n")
    answer = asyncio.ensure_future(read_status(reader, 60))
    sent = 0
    while sent < 4194304 and not answer.done():
        try:
            writer.write(b"x" * 65536)
            await writer.drain()
        except ConnectionError:
            break
        sent += 65536
        await asyncio.wait([answer], timeout=1.0)
    outcome.append((await answer, time.monotonic() - start, sent))
    writer.close()
    OPEN["now"] -= 1


async def capped_address(port, outcome):
    """Silent connections from one address past its cap: how many the server ends within 3 s."""
    connections = []
    for _ in range(CAPPED_CONNECTIONS):
        connections.append(await asyncio.open_connection("127.0.0.1", port, local_addr=(CAPPED_ADDRESS, 0)))
        OPEN["now"] += 1
    async def ended(reader):
        try:
            await asyncio.wait_for(reader.read(1024), 3.0)
            return True  # a 503, or EOF at a probe slot's deadline
        except asyncio.TimeoutError:
            return False
        except ConnectionError:
            return True
    outcome["ended_within_3s"] = sum(await asyncio.gather(*(ended(reader) for reader, _ in connections)))
    await asyncio.sleep(HEADER_TIMEOUT)  # held to the end of the slow headers' deadline
    for _, writer in connections:
        writer.close()
        OPEN["now"] -= 1


def metric(url, name, labels):
    text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    want = name + "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"
    for line in text.splitlines():
        if line.startswith(want + " "):
            return float(line.split()[1])
    return 0.0


async def flood(port, pid, model):
    results = {"generate": [], "health": []}
    baseline_end = time.monotonic() + BASELINE_SECONDS
    await normal_client(port, model, baseline_end, results)
    baseline = {k: list(v) for k, v in results.items()}
    results = {"generate": [], "health": []}

    rss_before = rss_kib(pid)
    slow_outcome, body_outcome, capped = [], [], {}
    tasks = [slow_header(port, source, slow_outcome) for source in SLOW_ADDRESSES for _ in range(SLOW_PER_ADDRESS)]
    tasks += [unauthenticated_body(port, BODY_ADDRESS, body_outcome)
              for _ in range(UNAUTHENTICATED)]
    flood_tasks = [asyncio.ensure_future(t) for t in tasks]
    capped_task = asyncio.ensure_future(capped_address(port, capped))
    peak, most_open, rss_most_open = rss_before, 0, rss_before
    client = asyncio.ensure_future(normal_client(port, model, time.monotonic() + HEADER_TIMEOUT + 4, results))
    while not client.done():
        await asyncio.sleep(0.2)
        rss = rss_kib(pid)
        peak = max(peak, rss)
        if OPEN["now"] > most_open:
            most_open, rss_most_open = OPEN["now"], rss
    await asyncio.gather(*flood_tasks, capped_task)
    held = {"most_open": most_open, "rss_kib_then": rss_most_open}
    return baseline, results, slow_outcome, body_outcome, capped, rss_before, peak, held


def summary(samples):
    seconds = [s for status, s in samples]
    return {"requests": len(samples), "ok": sum(1 for status, _ in samples if status == 200),
            "p50_ms": round(1000 * percentile(seconds, 0.5), 1), "p99_ms": round(1000 * percentile(seconds, 0.99), 1)}


def main():
    binary = sys.argv[1]
    model_path = os.environ.get("LAZYKV_DEFAULT_MODEL", "")
    if not os.path.isfile(model_path):
        print("skipped: LAZYKV_DEFAULT_MODEL is not set")
        return 77
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 4000:
        print(f"skipped: the open-file hard limit is {hard}, too low for 2,500 connections")
        return 77
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard if hard != resource.RLIM_INFINITY else 65536, hard))
    log = open(os.path.join(os.environ.get("TMPDIR", "/tmp"), f"flood_test.{os.getpid()}.log"), "w+")
    server = subprocess.Popen([binary, "serve", "--model", model_path, "--port", "0", "--threads", "2",
                               "--api-key", KEY], stdout=log, stderr=subprocess.STDOUT)
    try:
        url = None
        for _ in range(600):
            log.seek(0)
            found = re.search(r"listening on (http://[0-9.:]+)", log.read())
            if found:
                url = found.group(1)
                break
            if server.poll() is not None:
                break
            time.sleep(0.1)
        if url is None:
            log.seek(0)
            print(log.read())
            print("FAILED: the server did not start")
            return 1
        port = int(url.rsplit(":", 1)[1])
        model = json.load(urllib.request.urlopen(urllib.request.Request(
            url + "/v1/models", headers={"Authorization": "Bearer " + KEY}), timeout=10))["data"][0]["id"]
        (baseline, during, slow, bodies, capped, rss_before, peak, held) = asyncio.run(flood(port, server.pid, model))
        rss_after = rss_kib(server.pid)

        failures = []
        def check(ok, what):
            print(("ok: " if ok else "FAILED: ") + what)
            if not ok:
                failures.append(what)

        for phase, samples in (("before the flood", baseline), ("during the flood", during)):
            for kind in ("generate", "health"):
                bad = [s for s in samples[kind] if s[0] != 200]
                check(samples[kind] and not bad, f"{kind} {phase}: {len(samples[kind])} requests, {len(bad)} failed")
        slow_408 = [t for status, t, _ in slow if status == 408]
        check(len(slow) == len(SLOW_ADDRESSES) * SLOW_PER_ADDRESS and len(slow_408) == len(slow),
              f"slow headers: {len(slow_408)} of {len(slow)} ended by 408")
        check(slow_408 and max(slow_408) < HEADER_TIMEOUT + 3,
              f"slow headers closed by the {HEADER_TIMEOUT:g} s header deadline (last after "
              f"{max(slow_408) if slow_408 else float('nan'):.1f} s)")
        refused = [sent for status, _, sent in bodies if status == 401]
        check(len(refused) == UNAUTHENTICATED, f"unauthenticated bodies: {len(refused)} of {UNAUTHENTICATED} got 401")
        check(capped.get("ended_within_3s", 0) >= CAPPED_CONNECTIONS - PER_ADDRESS_CAP,
              f"one address past its cap: {capped.get('ended_within_3s')} of {CAPPED_CONNECTIONS} ended within 3 s "
              f"(at least {CAPPED_CONNECTIONS - PER_ADDRESS_CAP})")
        added_mib = (peak - rss_before) / 1024
        check(added_mib < RSS_BOUND_MIB, f"peak resident memory +{added_mib:.1f} MiB (bound {RSS_BOUND_MIB} MiB)")
        counted_408 = metric(url, "lazykv_requests_total", {"endpoint": "http", "code": "408"})
        counted_401 = metric(url, "lazykv_requests_total", {"endpoint": "chat_completions", "code": "401"})
        check(counted_408 == len(slow_408), f"408s counted in lazykv_requests_total: {counted_408:g}")
        check(counted_401 == len(refused), f"401s counted in lazykv_requests_total: {counted_401:g}")
        held_connections = len(SLOW_ADDRESSES) * SLOW_PER_ADDRESS + UNAUTHENTICATED + CAPPED_CONNECTIONS
        report = {
            "slow_connections": len(slow), "unauthenticated_bodies": len(bodies),
            "connections_opened": held_connections, "most_open_at_once": held["most_open"],
            "slow_closed_by_408": len(slow_408),
            "slow_closed_after_s": {"p50": round(percentile(slow_408, 0.5), 2), "max": round(max(slow_408), 2)}
            if slow_408 else None,
            "unauthenticated_answered_401": len(refused),
            "unauthenticated_bytes_sent_p50": percentile(refused, 0.5) if refused else None,
            "rss_mib": {"before": round(rss_before / 1024, 1), "peak": round(peak / 1024, 1),
                        "after": round(rss_after / 1024, 1)},
            # The resident memory the open connections add, each (the 300
            # past the cap included, most of them held; the server keeps
            # about 256 of them, the probe slots and the refusals ending).
            "bytes_per_open_connection": round((held["rss_kib_then"] - rss_before) * 1024 / held["most_open"])
            if held["most_open"] else None,
            "normal_client": {"before": {k: summary(v) for k, v in baseline.items()},
                              "during": {k: summary(v) for k, v in during.items()}},
        }
        print(json.dumps(report, indent=1))
        server.terminate()
        check(server.wait(60) == 0, "the server drained and exited 0 after the flood")
        return 1 if failures else 0
    finally:
        if server.poll() is None:
            server.kill()
        log.close()
        os.unlink(log.name)


if __name__ == "__main__":
    sys.exit(main())
