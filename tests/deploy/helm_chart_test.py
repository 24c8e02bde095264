#!/usr/bin/env python3
"""The Helm chart (deploy/helm/lazykv) against its real consumers.

  1. `helm lint --strict` passes, and `helm template` renders each
     configuration below; values that cannot work fail, saying why.
  2. kubernetes-validate checks every rendered object against the Kubernetes
     API schema of the chart's lowest supported version (strict: an unknown
     or misspelt field fails).
  3. Every LAZYKV_* variable and --flag the chart gives a lazykv container is
     a flag of the subcommand that container runs (`lazykv <cmd> --help`),
     so no setting is silently ignored.
  4. The pieces fit: Services and NetworkPolicies select the pods they are
     for, Services name ports those pods have; the coordinator's --worker
     list names the worker ranks' DNS names in rank order; probes, scrape
     annotations and volumes point at what the containers serve and mount.
  5. The settings work: `lazykv serve` and `lazykv kvstore` start with the
     environment the chart renders for them (policies of every shape, and
     numbers too large for Helm's default float formatting, from a values
     file).

usage: helm_chart_test.py LAZYKV_BINARY
Run with the python of the end-to-end venv (tests/e2e/requirements.txt pins
helm-binary, which puts helm beside it, and kubernetes-validate);
tests/deploy/with_e2e_python.sh does.
"""

import os
import re
import signal
import subprocess
import sys
import tempfile
import time

import kubernetes_validate
import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
CHART = os.path.join(HERE, "..", "..", "deploy", "helm", "lazykv")
HELM = os.path.join(os.path.dirname(sys.executable), "helm")
KUBE_VERSION = "1.28.0"  # Chart.yaml: kubeVersion >= 1.28 (the pod-index label)
RELEASE = "t"
FULLNAME = "t-lazykv"

failures = 0


def check(ok, what):
    global failures
    print(("ok: " if ok else "FAIL: ") + what)
    if not ok:
        failures += 1


def helm(*args):
    return subprocess.run([HELM, *args], capture_output=True, text=True)


def render(values, values_file=None, release=RELEASE):
    """The objects of `helm template` with --set values (a dict) and an
    optional values file (YAML numbers arrive as floats that way)."""
    args = ["template", release, CHART]
    for key, value in values.items():
        args += ["--set", f"{key}={value}"]
    if values_file is not None:
        path = os.path.join(tempfile.mkdtemp(prefix="lazykv-helm."), "values.yaml")
        with open(path, "w") as f:
            yaml.safe_dump(values_file, f)
        args += ["-f", path]
    r = helm(*args)
    if r.returncode != 0:
        raise RuntimeError(f"helm template {values}: {r.stderr.strip()}")
    return [d for d in yaml.safe_load_all(r.stdout) if d]


def by_kind(objects, kind):
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == kind}


def pod_spec(workload):
    return workload["spec"]["template"]["spec"]


def env_of(container):
    return {e["name"]: e for e in container.get("env", [])}


def env_value(container, name):
    return env_of(container)[name].get("value")


_help_cache = {}


def lazykv_flags(binary, command):
    """(flags, env names) of `lazykv COMMAND --help`."""
    if command not in _help_cache:
        out = subprocess.run([binary, command, "--help"], capture_output=True, text=True, check=True).stdout
        _help_cache[command] = (set(re.findall(r"^\s+(--[a-z0-9-]+) ", out, re.M)),
                                set(re.findall(r"\[env (LAZYKV_[A-Z0-9_]+)\]", out)))
    return _help_cache[command]


def starts(binary, container, overrides, ready_line, seconds=60):
    """Runs the container's command with its rendered environment (literal
    values; the overrides stand in for what only a cluster provides) until it
    prints ready_line; returns (started, output)."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    for e in container.get("env", []):
        if "value" in e:
            env[e["name"]] = e["value"]
    env.update(overrides)
    with tempfile.TemporaryFile() as out:
        p = subprocess.Popen([binary, *container["args"]], env=env, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.time() + seconds
        started = False
        while time.time() < deadline and p.poll() is None:
            out.seek(0)
            if ready_line in out.read().decode(errors="replace"):
                started = True
                break
            time.sleep(0.2)
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        out.seek(0)
        return started, out.read().decode(errors="replace")


def selects(selector, workload):
    labels = workload["spec"]["template"]["metadata"]["labels"]
    return all(labels.get(k) == v for k, v in selector.items())


def check_objects(name, objects, binary, extra_env=()):
    # 2. The Kubernetes API schema, strict.
    for o in objects:
        try:
            kubernetes_validate.validate(o, KUBE_VERSION, strict=True)
            valid = True
        except Exception as e:  # ValidationError, or an unknown kind/version
            valid = False
            print(f"  {o['kind']} {o['metadata']['name']}: {str(e).splitlines()[0]}")
        check(valid, f"{name}: {o['kind']} {o['metadata']['name']} is valid Kubernetes {KUBE_VERSION} (strict)")

    workloads = [o for o in objects if o["kind"] in ("Deployment", "StatefulSet")]
    for w in workloads:
        spec = pod_spec(w)
        labels = w["spec"]["template"]["metadata"]["labels"]
        check(all(labels.get(k) == v for k, v in w["spec"]["selector"]["matchLabels"].items()),
              f"{name}: {w['metadata']['name']} selects its own pods")
        check(spec["securityContext"].get("runAsNonRoot") is True,
              f"{name}: {w['metadata']['name']} runs as non-root")
        for c in spec["containers"]:
            # 3. Every setting is a flag of the subcommand.
            command = c["args"][0]
            flags, env_names = lazykv_flags(binary, command)
            given = [n for n in env_of(c) if n.startswith("LAZYKV_") and n not in extra_env]
            unknown = [n for n in given if n not in env_names]
            check(not unknown, f"{name}: {c['name']} ({command}) sets only its own variables {sorted(given)}"
                  + (f"; unknown: {unknown}" if unknown else ""))
            bad_flags = [a for a in c["args"][1:] if a.startswith("--") and a not in flags]
            check(not bad_flags, f"{name}: {c['name']} ({command}) passes only its own flags"
                  + (f"; unknown: {bad_flags}" if bad_flags else ""))
            ports = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
            for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
                p = c.get(probe)
                if p is None:
                    continue
                port = (p.get("httpGet") or p.get("tcpSocket"))["port"]
                check(port in ports, f"{name}: {c['name']} {probe} uses a port it declares ({port})")
            mounts = {m["name"]: m["mountPath"] for m in c.get("volumeMounts", [])}
            volumes = {v["name"] for v in spec.get("volumes", [])}
            claims = {t["metadata"]["name"] for t in w["spec"].get("volumeClaimTemplates", [])}
            check(set(mounts) <= volumes | claims, f"{name}: {c['name']} mounts only volumes it has")
            annotations = w["spec"]["template"]["metadata"].get("annotations", {})
            if "prometheus.io/port" in annotations:
                check(int(annotations["prometheus.io/port"]) in ports.values(),
                      f"{name}: {w['metadata']['name']} is scraped on a port it declares")

    # NetworkPolicies select pods of this release, and admit pods of it.
    for np in by_kind(objects, "NetworkPolicy").values():
        targets = [w for w in workloads if selects(np["spec"]["podSelector"]["matchLabels"], w)]
        check(len(targets) == 1, f"{name}: NetworkPolicy {np['metadata']['name']} selects one workload's pods")
        for rule in np["spec"]["ingress"]:
            for peer in rule.get("from", []):
                check(any(selects(peer["podSelector"]["matchLabels"], w) for w in workloads),
                      f"{name}: NetworkPolicy {np['metadata']['name']} admits pods that exist "
                      f"({peer['podSelector']['matchLabels']['app.kubernetes.io/component']})")

    # Services front pods that have the ports they name.
    for s in by_kind(objects, "Service").values():
        sel = s["spec"]["selector"]
        fronted = [w for w in workloads
                   if all(w["spec"]["template"]["metadata"]["labels"].get(k) == v for k, v in sel.items())]
        check(len(fronted) == 1, f"{name}: Service {s['metadata']['name']} selects one workload's pods")
        if len(fronted) != 1:
            continue
        c = pod_spec(fronted[0])["containers"][0]
        names = {p["name"] for p in c.get("ports", [])}
        numbers = {p["containerPort"] for p in c.get("ports", [])}
        for p in s["spec"]["ports"]:
            target = p.get("targetPort", p["port"])
            check(target in names or target in numbers,
                  f"{name}: Service {s['metadata']['name']} port {p['name']} reaches a container port")


def main():
    binary = sys.argv[1]

    # 1. Lint, and the values that must fail.
    r = helm("lint", "--strict", CHART)
    check(r.returncode == 0, "helm lint --strict" + ("" if r.returncode == 0 else ": " + r.stdout + r.stderr))
    for values, message in [
        ({"mode": "bogus"}, 'mode must be serve or distributed, not "bogus"'),
        ({"worker.tensorParallel.world": 0}, "worker.tensorParallel.world must be a whole number >= 1"),
        ({"worker.tensorParallel.world": 1.5}, "worker.tensorParallel.world must be a whole number >= 1"),
        ({"mode": "distributed", "worker.tensorParallel.collective": "mpi"},
         'collective must be gloo or nccl, not "mpi"'),
        ({"mode": "distributed", "worker.tensorParallel.collective": "nccl"}, "needs a GPU per rank"),
        ({"worker.tensorParallel.world": 2}, "needs mode: distributed"),
        ({"model": "/models/r1.gguf"}, "mount the volume that holds it with modelVolume"),
        ({"extraEnv.LAZYKV_THREADS": 2}, "extraEnv.LAZYKV_THREADS: the chart sets it from its own value"),
        ({"extraEnv.LAZYKV_KV_BUDGET": 64}, "extraEnv.LAZYKV_KV_BUDGET: the chart sets it"),
        ({"mode": "distributed", "coordinator.replicas": 2}, "coordinator.replicas > 1 needs mode: distributed and router.enabled"),
        ({"mode": "distributed", "router.enabled": "true", "coordinator.replicas": 1.5},
         "coordinator.replicas must be a whole number >= 1"),
        ({"mode": "distributed", "router.enabled": "true", "coordinator.replicas": 2, "fullnameOverride": "a" * 44},
         "at most 52 fit"),
        ({"prefixCacheTiers": "true", "kvstore.enabled": "true"}, "prefixCacheTiers needs a prefix cache"),
        ({"prefixCacheTiers": "true", "prefixCacheMiB": 64}, "prefixCacheTiers needs a prefix cache (prefixCacheMiB > 0) and the kvstore"),
    ]:
        try:
            render(values)
            check(False, f"{values} is refused")
        except RuntimeError as e:
            check(message in str(e), f"{values} is refused saying '{message}'" +
                  ("" if message in str(e) else f": {e}"))

    # 2-4. Configurations.
    serve = render({})
    check_objects("serve", serve, binary)
    check(sorted(o["kind"] for o in serve) == ["Deployment", "Service"], "serve: one Deployment and its Service")
    c = pod_spec(by_kind(serve, "Deployment")[FULLNAME])["containers"][0]
    check(c["args"] == ["serve"] and env_value(c, "LAZYKV_KV_POLICY") == "lazy"
          and [n for n in env_of(c) if n.startswith("LAZYKV_KV_") and n != "LAZYKV_KV_CACHE_MIB"] == ["LAZYKV_KV_POLICY"]
          and env_value(c, "LAZYKV_HOST") == "0.0.0.0",
          "serve: runs `lazykv serve` on every interface with the default policy lazy at its own defaults")
    model = os.environ.get("LAZYKV_DEFAULT_MODEL", "")
    # What only a cluster provides, or what would collide here: loopback, free ports, the model's path.
    local = {"LAZYKV_HOST": "127.0.0.1", "LAZYKV_PORT": "0", "LAZYKV_GRPC_PORT": "-1", "LAZYKV_MODEL": model,
             "LAZYKV_THREADS": "1", "LAZYKV_KVSTORE": ""}
    if model:
        ok, out = starts(binary, c, local, "listening on http")
        check(ok, "serve: `lazykv serve` starts with the rendered environment" + ("" if ok else ": " + out[-300:]))
    else:
        print("skipped: starting the rendered containers (LAZYKV_DEFAULT_MODEL is not set)")
    check(c["readinessProbe"]["httpGet"]["path"] == "/ready" and c["livenessProbe"]["httpGet"]["path"] == "/health",
          "serve: ready on /ready, alive on /health")
    grace = pod_spec(by_kind(serve, "Deployment")[FULLNAME])["terminationGracePeriodSeconds"]
    check(grace > int(env_value(c, "LAZYKV_DRAIN_SECONDS")), "serve: the pod's grace period outlasts the drain")

    extra = {"LAZYKV_MAX_BATCH": "64"}
    custom = render({"kvstore.enabled": "true", "api.apiKeySecret": "keys", "api.grpcPort": -1,
                     "model": "/models/r1.gguf", "modelVolume.persistentVolumeClaim.claimName": "models",
                     "extraEnv.LAZYKV_MAX_BATCH": "64", "kvPolicy.name": "h2o", "kvPolicy.params.recent": 32})
    check_objects("serve+kvstore", custom, binary, extra_env=extra)
    c = pod_spec(by_kind(custom, "Deployment")[FULLNAME])["containers"][0]
    check(env_of(c)["LAZYKV_API_KEY"]["valueFrom"]["secretKeyRef"] == {"name": "keys", "key": "api-key"},
          "serve+kvstore: the API key comes from the Secret")
    check(env_value(c, "LAZYKV_KVSTORE") == f"{FULLNAME}-kvstore:7100" and f"{FULLNAME}-kvstore" in by_kind(custom, "Service"),
          "serve+kvstore: serve points at the kvstore's Service")
    check(env_value(c, "LAZYKV_KVSTORE_TRANSPORTS") == "^shm", "serve+kvstore: no shared memory to the kvstore's pod")
    check(env_value(c, "LAZYKV_MODEL") == "/models/r1.gguf" and c["volumeMounts"][0]["mountPath"] == "/models",
          "serve+kvstore: the model is read from the mounted volume")
    check(env_value(c, "LAZYKV_KV_RECENT") == "32" and env_value(c, "LAZYKV_MAX_BATCH") == "64",
          "serve+kvstore: policy parameters and extraEnv reach the container")
    check(all(p["name"] != "grpc" for p in by_kind(custom, "Service")[FULLNAME]["spec"]["ports"]),
          "serve+kvstore: grpcPort -1 exposes no gRPC port")
    check("LAZYKV_KV_WINDOW" not in env_of(c), "serve+kvstore: h2o gets no parameter it lacks")
    if model:
        ok, out = starts(binary, c, dict(local, LAZYKV_API_KEY="k"), "listening on http")
        check(ok, "serve+kvstore: `lazykv serve` starts with h2o(recent=32)" + ("" if ok else ": " + out[-300:]))
    kv_np = by_kind(custom, "NetworkPolicy")[f"{FULLNAME}-kvstore"]
    check(kv_np["spec"]["ingress"][0]["from"][0]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "api"
          and kv_np["spec"]["ingress"][1]["ports"][0]["port"] == 9100,
          "serve+kvstore: only serve pods reach the kvstore; its metrics port stays open")

    # Numbers from a values file are floats to Helm: whole ones must still reach the flags as integers.
    big = render({}, values_file={"kvPolicy": {"name": "lazy", "params": {"budget": 2000000, "window": 1000000,
                                                                          "alpha": 0.0001}},
                                  "kvCacheMiB": 1048576, "threads": 3,
                                  "kvstore": {"enabled": True, "hostCapacityMiB": 64,
                                              "nvme": {"size": "2Ti", "capacityMiB": 2097152}}})
    check_objects("big numbers", big, binary)
    c = pod_spec(by_kind(big, "Deployment")[FULLNAME])["containers"][0]
    kv = pod_spec(by_kind(big, "StatefulSet")[f"{FULLNAME}-kvstore"])["containers"][0]
    check((env_value(c, "LAZYKV_KV_BUDGET"), env_value(c, "LAZYKV_KV_WINDOW"), env_value(c, "LAZYKV_KV_ALPHA"),
           env_value(c, "LAZYKV_KV_CACHE_MIB"), env_value(c, "LAZYKV_THREADS"),
           env_value(kv, "LAZYKV_NVME_CAPACITY_MIB")) == ("2000000", "1000000", "0.0001", "1048576", "3", "2097152"),
          "big numbers: 2000000, 1048576 and 2097152 arrive as integers, 0.0001 as it is")
    if model:
        ok, out = starts(binary, c, local, "listening on http")
        check(ok, "big numbers: `lazykv serve` starts with them" + ("" if ok else ": " + out[-300:]))
        with tempfile.TemporaryDirectory() as nvme:
            ok, out = starts(binary, kv, {"LAZYKV_LISTEN": "127.0.0.1:0", "LAZYKV_DATA_PORT": "0",
                                          "LAZYKV_METRICS_PORT": "0", "LAZYKV_NVME_PATH": nvme}, "host tier")
        check(ok, "big numbers: `lazykv kvstore` starts with a 2 TiB NVMe budget" + ("" if ok else ": " + out[-300:]))

    reuse = render({"prefixCacheMiB": 512})
    c = pod_spec(by_kind(reuse, "Deployment")[FULLNAME])["containers"][0]
    check(env_value(c, "LAZYKV_PREFIX_CACHE_MIB") == "512", "prefixCacheMiB: a serve pod keeps 512 MiB of prompt pages")
    if model:
        ok, out = starts(binary, c, local, "listening on http")
        check(ok, "prefixCacheMiB: `lazykv serve` starts with it" + ("" if ok else ": " + out[-300:]))
    check("LAZYKV_PREFIX_CACHE_TIERS" not in env_of(c), "prefixCacheTiers is off unless asked for")
    shared = render({"prefixCacheMiB": 512, "prefixCacheTiers": "true", "kvstore.enabled": "true"})
    c = pod_spec(by_kind(shared, "Deployment")[FULLNAME])["containers"][0]
    check(env_value(c, "LAZYKV_PREFIX_CACHE_TIERS") == "true" and "LAZYKV_KVSTORE" in env_of(c),
          "prefixCacheTiers: a serve pod puts and fetches prompt blocks through the kvstore")
    ranks = render({"mode": "distributed", "worker.tensorParallel.world": 2, "prefixCacheMiB": 128,
                    "prefixCacheTiers": "true", "kvstore.enabled": "true"})
    c = pod_spec(by_kind(ranks, "StatefulSet")[f"{FULLNAME}-worker"])["containers"][0]
    check(env_value(c, "LAZYKV_PREFIX_CACHE_MIB") == "128" and env_value(c, "LAZYKV_PREFIX_CACHE_TIERS") == "true",
          "prefixCacheMiB and prefixCacheTiers reach each worker rank")

    limited = render({"serve.resources.limits.cpu": 2})
    c = pod_spec(by_kind(limited, "Deployment")[FULLNAME])["containers"][0]
    check(env_of(c)["LAZYKV_THREADS"].get("valueFrom", {}).get("resourceFieldRef", {}).get("resource") == "limits.cpu",
          "threads 0 with a CPU limit: the model's threads follow the limit, not the node's cores")

    routed = render({"router.enabled": "true", "serve.replicas": 3, "router.maxRequestsPerReplica": 16})
    check_objects("router", routed, binary)
    check(sorted(o["kind"] for o in routed) == ["Deployment", "Service", "Service", "StatefulSet"],
          "router: a router Deployment, the servers' StatefulSet, the API Service and the servers' headless one")
    router = by_kind(routed, "Deployment")[f"{FULLNAME}-router"]
    servers = by_kind(routed, "StatefulSet")[f"{FULLNAME}-serve"]
    r = pod_spec(router)["containers"][0]
    listed = [r["args"][i + 1] for i, a in enumerate(r["args"]) if a == "--replica"]
    expected = [f"{FULLNAME}-serve-{i}.{servers['spec']['serviceName']}:8000" for i in range(3)]
    check(r["args"][0] == "router" and listed == expected, f"router: lists the servers' DNS names {expected}")
    check(by_kind(routed, "Service")[servers["spec"]["serviceName"]]["spec"]["clusterIP"] == "None",
          "router: the servers' Service is headless (a name per server)")
    api_service = by_kind(routed, "Service")[FULLNAME]
    check(api_service["spec"]["selector"]["app.kubernetes.io/component"] == "router"
          and [p["name"] for p in api_service["spec"]["ports"]] == ["http"],
          "router: the API Service selects the routers, HTTP only")
    check(env_value(r, "LAZYKV_MAX_REQUESTS_PER_REPLICA") == "16" and router["spec"]["replicas"] == 2,
          "router: two routers, 16 requests in flight per server")
    if model:
        ok, out = starts(binary, r, {"LAZYKV_HOST": "127.0.0.1", "LAZYKV_PORT": "0"}, "listening on http")
        check(ok, "router: `lazykv router` starts with the rendered arguments" + ("" if ok else ": " + out[-300:]))

    # The longest base name fits every derived name; a longer one is refused, not cut.
    named = render({"mode": "distributed", "kvstore.enabled": "true"}, release="r" * 37)  # r...r-lazykv: 44
    check(all(len(o["metadata"]["name"]) <= (52 if o["kind"] == "StatefulSet" else 63) for o in named),
          "a 44-character name keeps StatefulSet names within 52 characters and the others within 63")
    try:
        render({}, release="r" * 38)
        check(False, "a 45-character name is refused")
    except RuntimeError as e:
        check("at most 44 fit: set fullnameOverride" in str(e), "a 45-character name is refused, saying what to do")
    short = render({"fullnameOverride": "lkv"}, release="r" * 53)
    check(by_kind(short, "Deployment").keys() == {"lkv"}, "fullnameOverride names the objects of a long release")

    dist = render({"mode": "distributed", "worker.tensorParallel.world": 3, "kvstore.enabled": "true",
                   "kvstore.nvme.size": "50Gi"})
    check_objects("distributed", dist, binary)
    coordinator = pod_spec(by_kind(dist, "Deployment")[f"{FULLNAME}-coordinator"])["containers"][0]
    workers = by_kind(dist, "StatefulSet")[f"{FULLNAME}-worker"]
    headless = by_kind(dist, "Service")[workers["spec"]["serviceName"]]
    check(headless["spec"]["clusterIP"] == "None" and headless["spec"]["publishNotReadyAddresses"] is True,
          "distributed: the workers' Service is headless and publishes ranks before they are ready")
    args = coordinator["args"]
    listed = [args[i + 1] for i, a in enumerate(args) if a == "--worker"]
    port = pod_spec(workers)["containers"][0]["ports"][0]["containerPort"]
    expected = [f"{workers['metadata']['name']}-{r}.{workers['spec']['serviceName']}:{port}" for r in range(3)]
    check(listed == expected, f"distributed: the coordinator lists the ranks' DNS names in rank order {expected}")
    check(workers["spec"]["replicas"] == 3 and workers["spec"]["podManagementPolicy"] == "Parallel",
          "distributed: three ranks, started together")
    w = pod_spec(workers)["containers"][0]
    check(env_of(w)["LAZYKV_RANK"]["valueFrom"]["fieldRef"]["fieldPath"]
          == "metadata.labels['apps.kubernetes.io/pod-index']" and env_value(w, "LAZYKV_WORLD") == "3",
          "distributed: each rank's --rank is its pod index, --world 3")
    check(env_value(w, "LAZYKV_TP_HOST") == "$(POD_IP)" and env_value(w, "LAZYKV_COLLECTIVE") == "gloo",
          "distributed: ranks reach each other on their pod IPs over Gloo")
    kvstore = by_kind(dist, "StatefulSet")[f"{FULLNAME}-kvstore"]
    kv = pod_spec(kvstore)["containers"][0]
    kv_service = by_kind(dist, "Service")[f"{FULLNAME}-kvstore"]
    control = next(p["port"] for p in kv_service["spec"]["ports"] if p["name"] == "control")
    check(env_value(w, "LAZYKV_KVSTORE") == f"{FULLNAME}-kvstore:{control}",
          "distributed: the ranks point at the kvstore's control port")
    check(env_value(kv, "LAZYKV_LISTEN") == f"0.0.0.0:{control}" and kv_service["spec"]["clusterIP"] == "None",
          "distributed: the kvstore listens on every interface behind a headless Service (its name is the pod)")
    # Shared memory's wake-ups do not cross the pods' network namespaces (chart_pods_test measures it).
    check(env_value(kv, "LAZYKV_TRANSPORTS") == "^shm" and env_value(w, "LAZYKV_KVSTORE_TRANSPORTS") == "^shm",
          "distributed: the kvstore's data plane leaves shared memory out on both sides")
    check(kvstore["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"] == "50Gi"
          and env_value(kv, "LAZYKV_NVME_PATH") == kv["volumeMounts"][0]["mountPath"],
          "distributed: the NVMe tier lives on its 50Gi claim")
    drain = int(env_value(coordinator, "LAZYKV_DRAIN_SECONDS"))
    check(w["lifecycle"]["preStop"]["exec"]["command"] == ["sleep", str(drain)]
          and pod_spec(workers)["terminationGracePeriodSeconds"] > drain,
          "distributed: ranks outlive the coordinator's drain on a shutdown")
    admitted = {p["podSelector"]["matchLabels"]["app.kubernetes.io/component"]
                for p in by_kind(dist, "NetworkPolicy")[f"{FULLNAME}-worker"]["spec"]["ingress"][0]["from"]}
    check(admitted == {"api", "worker", "kvstore"},
          "distributed: only the coordinator, the ranks and the kvstore reach a rank")

    # Distributed replicas: a coordinator and its ranks per group, behind the routers.
    groups = render({"mode": "distributed", "router.enabled": "true", "coordinator.replicas": 2,
                     "worker.tensorParallel.world": 2, "kvstore.enabled": "true", "networkPolicy.enabled": "true"})
    check_objects("groups", groups, binary)
    deployments, sets, services = by_kind(groups, "Deployment"), by_kind(groups, "StatefulSet"), by_kind(groups, "Service")
    check({f"{FULLNAME}-coordinator-0", f"{FULLNAME}-coordinator-1", f"{FULLNAME}-router"} <= deployments.keys()
          and {f"{FULLNAME}-worker-0", f"{FULLNAME}-worker-1"} <= sets.keys(),
          "groups: two coordinators, two StatefulSets of ranks and the routers")
    for g in range(2):
        c = pod_spec(deployments[f"{FULLNAME}-coordinator-{g}"])["containers"][0]
        ranks = sets[f"{FULLNAME}-worker-{g}"]
        listed = [c["args"][i + 1] for i, a in enumerate(c["args"]) if a == "--worker"]
        expected = [f"{FULLNAME}-worker-{g}-{r}.{ranks['spec']['serviceName']}:7001" for r in range(2)]
        check(listed == expected, f"groups: coordinator {g} lists its own ranks {expected}")
        check(ranks["spec"]["replicas"] == 2 and services[ranks["spec"]["serviceName"]]["spec"]["clusterIP"] == "None",
              f"groups: group {g} has two ranks behind a headless Service of its own")
    r = pod_spec(deployments[f"{FULLNAME}-router"])["containers"][0]
    listed = [r["args"][i + 1] for i, a in enumerate(r["args"]) if a == "--replica"]
    check(listed == [f"{FULLNAME}-coordinator-{g}:8000" for g in range(2)] and
          all(f"{FULLNAME}-coordinator-{g}" in services for g in range(2)),
          f"groups: the router lists each coordinator's Service {listed}")
    check(services[FULLNAME]["spec"]["selector"]["app.kubernetes.io/component"] == "router",
          "groups: the API Service selects the routers")
    check(len(by_kind(groups, "NetworkPolicy")) == 3, "groups: a NetworkPolicy per group's ranks, and the kvstore's")

    nccl = render({"mode": "distributed", "worker.tensorParallel.world": 2,
                   "worker.tensorParallel.collective": "nccl", "worker.gpusPerRank": 1,
                   "worker.resources.limits.memory": "16Gi"})
    check_objects("nccl", nccl, binary)
    w = pod_spec(by_kind(nccl, "StatefulSet")[f"{FULLNAME}-worker"])["containers"][0]
    check(w["resources"]["limits"] == {"memory": "16Gi", "nvidia.com/gpu": 1} and
          env_value(w, "LAZYKV_COLLECTIVE") == "nccl",
          "nccl: each rank asks for one GPU besides its own limits")

    print(f"{failures} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
