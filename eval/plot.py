#!/usr/bin/env python3
"""Plots a `lazykv eval` result JSON: accuracy (or top-1 agreement) against
the KV budget ratio, one line per policy, full KV as a dashed line.

usage: plot.py RESULT.json OUT.png
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    with open(sys.argv[1]) as f:
        result = json.load(f)
    if "results" in result:  # accuracy
        rows, metric, label = result["results"], "accuracy", "accuracy"
        title = "%s on %s (n=%d, max %d tokens)" % (result.get("model", "?"), result.get("dataset", "?"),
                                                   result.get("n", 0), result.get("max_tokens", 0))
    else:  # fidelity
        rows, metric, label = result["configs"], "top1_agreement", "top-1 agreement with full KV"
        title = "%s fidelity on %s (%d prompts, %d tokens)" % (
            result.get("model", "?"), result.get("source", "?"), result.get("prompts", 0), result.get("length", 0))
    fig, ax = plt.subplots(figsize=(7, 4.5))
    lines = {}
    full_value = None
    for row in rows:
        if row["policy"] == "full":
            full_value = row[metric]
            continue
        lines.setdefault(row["policy"], []).append((row["budget_ratio"], row[metric]))
    for policy, points in lines.items():
        points.sort()
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=policy)
    if full_value is not None:
        ax.axhline(full_value, linestyle="--", color="black", label="full")
    ax.set_xlabel("KV budget (ratio of full length; >= 1: slots)")
    ax.set_ylabel(label)
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=120)


if __name__ == "__main__":
    main()
