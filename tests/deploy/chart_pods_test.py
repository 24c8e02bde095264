#!/usr/bin/env python3
"""The Helm chart's deployments, run: the pods of `helm template` (first a
coordinator, two worker ranks and a kvstore; then two serve replicas behind
a router) each started as a lazykv process
in a network namespace of its own, with its own address on a shared bridge,
and with exactly its container's args and environment as Kubernetes would
give them: fieldRef status.podIP and the StatefulSet pod-index label,
$(VAR) expansion, the image's ENV. The Services' and pods' DNS names go into
each namespace's hosts file (`ip netns exec` mounts /etc/netns/NAME/hosts).

Then, from outside every namespace, as a client of the API Service:
  - the coordinator becomes ready and answers a greedy chat completion;
  - a lazy+tiers request demotes through the kvstore pod (its /metrics
    counts puts), so the UCX data plane crosses namespaces: the kvstore,
    bound to every interface, is reached under its Service's name;
  - rank 1 killed and started again with the same pod spec: the coordinator
    re-forms the group and serves again;
  - SIGTERM drains the coordinator, which exits 0;
  - through the router, requests reach both serve pods (by their StatefulSet
    DNS names); a long prompt asked twice lands on one of them, which takes
    it from its prefix cache; one killed, the other answers and the router marks it down;
    started again, the router takes it back; SIGTERM stops the router, exit 0.

What this does not cover: the kubelet, probes, restarts, volumes, images.

usage: chart_pods_test.py LAZYKV_BINARY   (as root, with LAZYKV_DEFAULT_MODEL;
run with the end-to-end venv's python: helm and PyYAML)
"""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
CHART = os.path.join(HERE, "..", "..", "deploy", "helm", "lazykv")
HELM = os.path.join(os.path.dirname(sys.executable), "helm")
TAG = f"lk{os.getpid() % 100000}"  # prefix of every namespace and link of this run


def free_subnet():
    """A /24 of 198.18.0.0/15 (reserved for network tests, RFC 2544) that no
    route of this machine uses, so the bridge shadows nothing."""
    routes = subprocess.run(["ip", "-4", "route", "show"], capture_output=True, text=True).stdout
    for i in range(512):
        n = (os.getpid() + i) % 512
        candidate = f"198.{18 + n // 256}.{n % 256}"
        if candidate + "." not in routes:
            return candidate
    raise RuntimeError("no free /24 in 198.18.0.0/15")


SUBNET = free_subnet() if shutil.which("ip") else "198.18.0"
BRIDGE = f"{TAG}br"
VALUES = {
    "mode": "distributed", "worker.tensorParallel.world": 2, "kvstore.enabled": "true",
    "threads": 1, "kvCacheMiB": 64, "kvstore.hostCapacityMiB": 64,
}
REPLICA_VALUES = {"router.enabled": "true", "serve.replicas": 2, "threads": 1, "kvCacheMiB": 64, "prefixCacheMiB": 16}
GROUP_VALUES = {"mode": "distributed", "router.enabled": "true", "coordinator.replicas": 2, "threads": 1,
                "kvCacheMiB": 64}

failures = 0


def check(ok, what):
    global failures
    print(("ok: " if ok else "FAIL: ") + what, flush=True)
    if not ok:
        failures += 1
    return ok


def run(*cmd):
    subprocess.run(cmd, check=True, capture_output=True)


class Pod:
    def __init__(self, name, workload, ordinal, ip):
        self.name, self.workload, self.ordinal, self.ip = name, workload, ordinal, ip
        self.netns = ""
        self.process = None
        self.log = None

    @property
    def container(self):
        return self.workload["spec"]["template"]["spec"]["containers"][0]

    def environment(self, image_env):
        """The container's environment as the kubelet builds it."""
        env = dict(image_env)
        for e in self.container.get("env", []):
            if "value" in e:
                # $(VAR) refers to variables defined before it in the list.
                env[e["name"]] = re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                                        lambda m: env.get(m.group(1), m.group(0)), e["value"])
                continue
            path = e["valueFrom"]["fieldRef"]["fieldPath"]
            if path == "status.podIP":
                env[e["name"]] = self.ip
            elif path == "metadata.labels['apps.kubernetes.io/pod-index']":
                env[e["name"]] = str(self.ordinal)
            else:
                raise RuntimeError(f"{self.name}: no emulation of {path}")
        return env

    def start(self, binary, image_env, work):
        env = self.environment(image_env)
        self.log = os.path.join(work, self.name + ".log")
        with open(self.log, "ab") as out:
            self.process = subprocess.Popen(
                ["ip", "netns", "exec", self.netns, "env", "-i", *[f"{k}={v}" for k, v in env.items()],
                 binary, *self.container["args"]], stdout=out, stderr=subprocess.STDOUT)


def pods_of(objects):
    """The pods the workloads would create: StatefulSet pods by ordinal, one per Deployment."""
    pods = []
    for w in objects:
        if w["kind"] == "StatefulSet":
            for i in range(w["spec"]["replicas"]):
                pods.append(Pod(f"{w['metadata']['name']}-{i}", w, i, ""))
        elif w["kind"] == "Deployment":
            pods.append(Pod(w["metadata"]["name"] + "-pod", w, 0, ""))
    for i, p in enumerate(pods):
        p.ip = f"{SUBNET}.{10 + i}"
        p.netns = f"{TAG}-{i}"
    return pods


def hosts_of(objects, pods):
    """DNS names: a StatefulSet pod's <pod>.<serviceName>; a Service's name,
    its one pod (a ClusterIP forwards to it; a headless Service resolves to it)."""
    names = {}
    for p in pods:
        if p.workload["kind"] == "StatefulSet":
            names[f"{p.name}.{p.workload['spec']['serviceName']}"] = p.ip
    for s in objects:
        if s["kind"] != "Service":
            continue
        sel = s["spec"]["selector"]
        chosen = [p for p in pods
                  if all(p.workload["spec"]["template"]["metadata"]["labels"].get(k) == v for k, v in sel.items())]
        if len(chosen) == 1:
            names[s["metadata"]["name"]] = chosen[0].ip
    return names


def http(url, body=None, timeout=60, with_headers=False):
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        answer = (response.status, response.read().decode())
        return answer + (response.headers,) if with_headers else answer


def wait_ready(url, seconds, process):
    deadline = time.time() + seconds
    while time.time() < deadline:
        if process.poll() is not None:
            return False
        try:
            if http(url + "/ready", timeout=2)[0] == 200:
                return True
        except Exception:
            pass
        time.sleep(0.5)
    return False


def metric(text, name):
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name):
            total += float(line.rsplit(" ", 1)[1])
    return total


def run_pods(binary, model, values, scenario):
    """Renders the chart with `values`, starts its pods each in a network
    namespace of its own on one bridge, runs scenario(pods, start, model_name)
    (start(pod) starts or restarts a pod from its spec), then removes them."""
    args = ["template", "t", CHART]
    for k, v in values.items():
        args += ["--set", f"{k}={v}"]
    objects = [o for o in yaml.safe_load_all(subprocess.run([HELM, *args], check=True, capture_output=True,
                                                            text=True).stdout) if o]
    pods = pods_of(objects)
    hosts = hosts_of(objects, pods)
    # The image's ENV (deploy/docker/Dockerfile): the model cache and every interface.
    image_env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp",
                 "LAZYKV_CACHE_DIR": os.path.dirname(os.path.dirname(model)), "LAZYKV_HOST": "0.0.0.0"}
    work = tempfile.mkdtemp(prefix="lazykv-chart-pods.")
    failures_before = failures
    try:
        run("ip", "link", "add", BRIDGE, "type", "bridge")
        run("ip", "addr", "add", f"{SUBNET}.1/24", "dev", BRIDGE)
        run("ip", "link", "set", BRIDGE, "up")
        for i, p in enumerate(pods):
            host_end, pod_end = f"{TAG}h{i}", f"{TAG}p{i}"
            run("ip", "netns", "add", p.netns)
            run("ip", "link", "add", host_end, "type", "veth", "peer", "name", pod_end)
            run("ip", "link", "set", pod_end, "netns", p.netns)
            run("ip", "link", "set", host_end, "master", BRIDGE, "up")
            run("ip", "netns", "exec", p.netns, "ip", "addr", "add", f"{p.ip}/24", "dev", pod_end)
            run("ip", "netns", "exec", p.netns, "ip", "link", "set", pod_end, "up")
            run("ip", "netns", "exec", p.netns, "ip", "link", "set", "lo", "up")
            os.makedirs(f"/etc/netns/{p.netns}", exist_ok=True)
            with open(f"/etc/netns/{p.netns}/hosts", "w") as f:
                f.write("127.0.0.1 localhost\n" + "".join(f"{ip} {name}\n" for name, ip in hosts.items()))
        check(True, f"{len(pods)} pods in their own network namespaces: "
              + ", ".join(f"{p.name} {p.ip}" for p in pods))
        scenario(pods, lambda p: p.start(binary, image_env, work), os.path.basename(model).rsplit(".gguf", 1)[0])
    finally:
        for p in pods:
            if p.process is not None and p.process.poll() is None:
                p.process.kill()
                p.process.wait()
        for p in pods:
            subprocess.run(["ip", "netns", "del", p.netns], capture_output=True)
            shutil.rmtree(f"/etc/netns/{p.netns}", ignore_errors=True)
        subprocess.run(["ip", "link", "del", BRIDGE], capture_output=True)
        if failures > failures_before:
            for p in pods:
                if p.log and os.path.exists(p.log):
                    print(f"--- {p.name} (last lines)\n" + open(p.log).read()[-1500:])
        shutil.rmtree(work, ignore_errors=True)


def distributed_scenario(pods, start, model_name):
    coordinator = next(p for p in pods if p.name.endswith("-coordinator-pod"))
    kvstore = next(p for p in pods if p.name.endswith("-kvstore-0"))
    rank1 = next(p for p in pods if p.name.endswith("-worker-1"))
    for p in pods:
        start(p)
    api = f"http://{coordinator.ip}:{coordinator.container['ports'][0]['containerPort']}"
    if not check(wait_ready(api, 180, coordinator.process), f"the coordinator is ready at {api}"):
        return

    ask = capital_question(model_name)
    status, body = http(api + "/v1/chat/completions", ask)
    check(status == 200 and "Paris" in body, f"a greedy chat completion through two ranks answers Paris: {body[:200]}")

    tiers = {"model": model_name, "temperature": 0, "max_tokens": 120,
             "kv_policy": {"name": "lazy+tiers", "budget": 48, "window": 8, "alpha": 0.001},
             "messages": [{"role": "user", "content":
                           "Explain step by step why the sum of two odd numbers is always even."}]}
    status, body = http(api + "/v1/chat/completions", tiers, timeout=120)
    check(status == 200, "a lazy+tiers request completes")
    kv_port = next(p["containerPort"] for p in kvstore.container["ports"] if p["name"] == "metrics")
    _, text = http(f"http://{kvstore.ip}:{kv_port}/metrics")
    puts = metric(text, 'lazykv_kvstore_requests_total{endpoint="put",code="ok"}')
    check(puts > 0, f"the ranks demoted blocks to the kvstore pod across namespaces ({puts:.0f} puts)")

    rank1.process.kill()
    rank1.process.wait()
    time.sleep(1)
    start(rank1)
    check(answers_paris(api, ask, 120), "rank 1 killed and started again from its pod spec: the group serves again")

    coordinator.process.send_signal(signal.SIGTERM)
    check(exit_code(coordinator.process) == 0, "SIGTERM drains the coordinator, exit 0")


def start_behind_router(pods, start, what):
    """Starts every pod; the router's pod and API URL once it sees two replicas up (None if not ready)."""
    router = next(p for p in pods if p.name.endswith("-router-pod"))
    for p in pods:
        start(p)
    api = f"http://{router.ip}:{router.container['ports'][0]['containerPort']}"
    if not check(wait_ready(api, 180, router.process), f"the router is ready at {api}"):
        return None, None
    check(replicas_up(api, [True, True], 180), f"the router sees both {what} up by their DNS names")
    return router, api


def capital_question(model_name):
    return {"model": model_name, "temperature": 0, "max_tokens": 12,
            "messages": [{"role": "user", "content": "What is the capital of France?"}]}


def replicas_answering(api, ask, requests=4):
    """The x-lazykv-replica of each answer that says Paris ("failed" for one that does not)."""
    served = set()
    for _ in range(requests):
        status, body, headers = http(api + "/v1/chat/completions", ask, with_headers=True)
        served.add(headers.get("x-lazykv-replica", "") if status == 200 and "Paris" in body else "failed")
    return served


def replicas_scenario(pods, start, model_name):
    servers = sorted((p for p in pods if p.workload["kind"] == "StatefulSet"), key=lambda p: p.ordinal)
    router, api = start_behind_router(pods, start, "serve pods")
    if router is None:
        return
    ask = capital_question(model_name)
    served = replicas_answering(api, ask)
    names = {f"{p.name}.{p.workload['spec']['serviceName']}:{p.container['ports'][0]['containerPort']}"
             for p in servers}
    check(served == names, f"requests through the router answer Paris from both serve pods ({sorted(served)})")

    # Prompt reuse behind the router: a long shared start asked twice lands on
    # one replica (prefix affinity), which takes it from its prefix cache.
    doc = " ".join(f"Line {i}: the clerk checks the ledger against the manifest." for i in range(40))
    long_ask = dict(ask, messages=[{"role": "system", "content": doc},
                                   {"role": "user", "content": "Which line comes first?"}])
    homes = []
    for _ in range(2):
        status, _, headers = http(api + "/v1/chat/completions", long_ask, with_headers=True)
        homes.append(headers.get("x-lazykv-replica", "") if status == 200 else "failed")
    home = next((p for p in servers
                 if f"{p.name}.{p.workload['spec']['serviceName']}:{p.container['ports'][0]['containerPort']}" == homes[1]),
                None)
    hits = metric_value(f"http://{home.ip}:{home.container['ports'][0]['containerPort']}",
                        "lazykv_prefix_cache_hit_tokens_total") if home else 0
    check(homes[0] == homes[1] and home is not None and hits >= 384,
          f"a long prompt asked twice through the router: the same replica both times ({homes}), "
          f"which took {hits:.0f} of its tokens from its prefix cache (at least 384)")

    servers[1].process.kill()
    servers[1].process.wait()
    check(answers_paris(api, ask, 30) and replicas_up(api, [True, False], 10),
          "serve pod 1 killed: the router answers from pod 0 and marks pod 1 down")
    start(servers[1])
    check(replicas_up(api, [True, True], 180), "serve pod 1 started again from its spec: the router takes it back")

    router.process.send_signal(signal.SIGTERM)
    check(exit_code(router.process) == 0, "SIGTERM stops the router, exit 0")


def groups_scenario(pods, start, model_name):
    """Distributed replicas: two coordinators, each with its own worker, behind the router."""
    worker1 = next(p for p in pods if p.name.endswith("-worker-1-0"))
    router, api = start_behind_router(pods, start, "coordinators")
    if router is None:
        return
    ask = capital_question(model_name)
    served = replicas_answering(api, ask)
    check(len(served) == 2 and all("-coordinator-" in s for s in served),
          f"requests through the router answer Paris from both coordinators ({sorted(served)})")
    worker1.process.kill()
    worker1.process.wait()
    check(replicas_up(api, [True, False], 30) and answers_paris(api, ask, 30),
          "group 1's worker killed: its coordinator turns unready, the router marks it down and answers from group 0")
    start(worker1)
    check(replicas_up(api, [True, True], 180), "the worker started again from its spec: the router takes group 1 back")
    router.process.send_signal(signal.SIGTERM)
    check(exit_code(router.process) == 0, "SIGTERM stops the router, exit 0")


def metric_value(url, name):
    _, text = http(url + "/metrics", timeout=10)
    values = [float(line.split()[-1]) for line in text.splitlines() if line.split(" ")[0] == name]
    return values[0] if values else 0.0


def answers_paris(api, ask, seconds):
    deadline = time.time() + seconds
    while time.time() < deadline:
        try:
            status, body = http(api + "/v1/chat/completions", ask, timeout=30)
            if status == 200 and "Paris" in body:
                return True
        except Exception:
            time.sleep(1)
    return False


def replicas_up(api, expected, seconds):
    deadline = time.time() + seconds
    while time.time() < deadline:
        try:
            _, body = http(api + "/router/replicas", timeout=5)
            if [r["up"] for r in json.loads(body)["replicas"]] == expected:
                return True
        except Exception:
            pass
        time.sleep(0.5)
    return False


def exit_code(process, seconds=60):
    try:
        return process.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        return None


def main():
    binary = os.path.abspath(sys.argv[1])
    model = os.environ.get("LAZYKV_DEFAULT_MODEL", "")
    if os.geteuid() != 0 or shutil.which("ip") is None or not model:
        print("skipped: needs root, iproute2 and LAZYKV_DEFAULT_MODEL")
        return 77
    # Everything the pods need, tried once: a bridge, a namespace, a veth pair into it.
    probe = [("ip", "link", "add", f"{TAG}pb", "type", "bridge"), ("ip", "netns", "add", f"{TAG}-probe"),
             ("ip", "link", "add", f"{TAG}ph", "type", "veth", "peer", "name", f"{TAG}pp"),
             ("ip", "link", "set", f"{TAG}pp", "netns", f"{TAG}-probe"),
             ("ip", "link", "set", f"{TAG}ph", "master", f"{TAG}pb", "up")]
    try:
        for cmd in probe:
            run(*cmd)
        missing = None
    except subprocess.CalledProcessError as e:
        missing = f"{' '.join(e.cmd)}: {e.stderr.decode().strip()}"
    finally:
        for cmd in (("ip", "link", "del", f"{TAG}ph"), ("ip", "netns", "del", f"{TAG}-probe"),
                    ("ip", "link", "del", f"{TAG}pb")):
            subprocess.run(cmd, capture_output=True)
    if missing:
        print(f"skipped: this machine cannot make the pods' network ({missing})")
        return 77

    run_pods(binary, model, VALUES, distributed_scenario)
    run_pods(binary, model, REPLICA_VALUES, replicas_scenario)
    run_pods(binary, model, GROUP_VALUES, groups_scenario)
    print(f"{failures} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
