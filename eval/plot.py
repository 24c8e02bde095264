#!/usr/bin/env python3
"""Plots a `lazykv eval` result JSON against the KV budget ratio, one line per
policy, full KV as a dashed line: for `eval accuracy`, accuracy against the
budget ratio, the mean (time-averaged) KV MiB and the peak KV MiB, side by
side (full KV a star on the memory axes); top-1 agreement and mean
KL(full || policy) side by side for `eval fidelity`. Several results of one
run split by policy (the same prompts and full-KV reference) are drawn
together.

usage: plot.py RESULT.json [MORE.json ...] OUT.png
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


MIB = 2.0 ** 20
X_LABELS = {"budget_ratio": "KV budget (ratio of full length; >= 1: slots)",
            "mean_kv_bytes": "mean KV MiB (time-averaged over the answer)",
            "mean_peak_kv_bytes": "peak KV MiB (mean over answers)"}


def draw(ax, rows, metric, label, log_scale=False, x="budget_ratio"):
    scale = 1.0 if x == "budget_ratio" else MIB
    lines = {}
    full = None
    for row in rows:
        if row["policy"] == "full":
            full = row
            continue
        lines.setdefault(row["policy"], []).append((row[x] / scale, row[metric]))
    for i, (policy, points) in enumerate(lines.items()):
        points.sort()
        # Past ten lines the default colours repeat: twenty colours, dashed after the first ten.
        style = {} if len(lines) <= 10 else {"color": plt.cm.tab20.colors[i % 20], "linestyle": "-" if i < 10 else "--"}
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=policy, **style)
    if full is not None and not (log_scale and full[metric] <= 0):
        if x == "budget_ratio":
            ax.axhline(full[metric], linestyle="--", color="black", label="full")
        else:
            ax.plot([full[x] / scale], [full[metric]], marker="*", markersize=12, color="black", linestyle="",
                    label="full")
    if log_scale:
        ax.set_yscale("log")
    ax.set_xlabel(X_LABELS[x])
    ax.set_ylabel(label)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    results = []
    for path in sys.argv[1:-1]:
        with open(path) as f:
            results.append(json.load(f))
    result = results[0]
    key = "results" if "results" in result else "configs"
    if any(key not in r for r in results):
        sys.exit("plot.py: mixed accuracy and fidelity results")
    rows = [row for r in results for row in r[key]]
    if "results" in result:  # accuracy
        # Results written before the mean KV was kept have no memory axes but the peak.
        xs = [x for x in ("budget_ratio", "mean_kv_bytes", "mean_peak_kv_bytes") if all(x in row for row in rows)]
        fig, axes = plt.subplots(1, len(xs), figsize=(6 * len(xs), 4.5), squeeze=False)
        for ax, x in zip(axes[0], xs):
            draw(ax, rows, "accuracy", "accuracy", x=x)
        title = "%s on %s (n=%d, max %d tokens; budgets of the %s length, equal %s)" % (
            result.get("model", "?"), result.get("dataset", "?"), result.get("n", 0), result.get("max_tokens", 0),
            result.get("budget_base", "total"), result.get("match", "budget"))
    else:  # fidelity
        fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
        draw(left, rows, "top1_agreement", "top-1 agreement with full KV")
        draw(right, rows, "mean_kl", "mean KL(full || policy) per token", log_scale=True)
        title = "%s: fidelity on %s (%d prompts, %d tokens)" % (
            result.get("model", "?"), result.get("source", "?"), result.get("prompts", 0), result.get("length", 0))
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(sys.argv[-1], dpi=110)


if __name__ == "__main__":
    main()
