#!/usr/bin/env python3
"""Markdown tables from `lazykv eval` and `lazykv bench` result JSON files, as
pasted into docs/results.md.

usage: tables.py RESULT.json [...]
"""
import json
import sys


def mib(b):
    return "%.2f" % (b / 2**20)


def fidelity(d):
    rows = ["| policy | budget | slots | top-1 agreement | mean KL(full ‖ policy) | mean KV MiB | peak KV MiB | "
            "parameters |",
            "|---|---|---|---|---|---|---|---|"]
    for c in d["configs"]:
        params = ", ".join("%s=%g" % (k, v) for k, v in sorted(c["params"].items()) if k not in ("budget", "name"))
        budget = "—" if c["policy"] == "full" else "%g" % c["budget_ratio"]
        slots = "—" if c["policy"] == "full" else str(c["budget_slots"])
        mean = mib(c["mean_kv_bytes"]) if "mean_kv_bytes" in c else "—"
        rows.append("| %s | %s | %s | %.4f | %.5f | %s | %s | %s |" % (
            c["policy"], budget, slots, c["top1_agreement"], c["mean_kl"], mean, mib(c["peak_kv_bytes"]), params))
    return "\n".join(rows)


def accuracy(d):
    rows = ["Budgets of the %s length, equal %s." % (d.get("budget_base", "total"), d.get("match", "budget")), "",
            "| policy | budget | accuracy | correct / n | mean generated tokens | mean KV MiB | mean peak KV MiB | "
            "max peak KV MiB | slots per head: mean / peak | at the token limit | loops |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in d["results"]:
        budget = "—" if r["policy"] == "full" else "%g" % r["budget_ratio"]
        per_head = ("%.0f / %.0f" % (r["mean_slots_per_head"], r["mean_peak_slots_per_head"])
                    if "mean_slots_per_head" in r else "—")
        rows.append("| %s | %s | %.3f | %d / %d | %.1f | %s | %s | %s | %s | %s | %s |" % (
            r["policy"], budget, r["accuracy"], r["correct"], r["n"], r["mean_generated_tokens"],
            mib(r["mean_kv_bytes"]) if "mean_kv_bytes" in r else "—", mib(r["mean_peak_kv_bytes"]),
            mib(r["max_peak_kv_bytes"]), per_head, r.get("at_length", "—"), r.get("loops", "—")))
    return "\n".join(rows)


def bench(d):
    c = d["policy_cost"]
    return ("| budget | steps | eviction ms / step | eviction share of a step | decode tok/s | stats-only tok/s | "
            "full tok/s | peak KV MiB (full) |\n|---|---|---|---|---|---|---|---|\n"
            "| %d | %d | %.3f | %.2f%% | %.1f | %.1f | %.1f | %s (%s) |" % (
                c["policy"]["budget"], c["steps"], c["eviction_ms_per_step"], 100 * c["eviction_fraction_of_step"],
                c["decode_tok_s"], c["stats_only_decode_tok_s"], c["full_decode_tok_s"], mib(c["peak_kv_bytes"]),
                mib(c["full_peak_kv_bytes"])))


def main():
    for path in sys.argv[1:]:
        with open(path) as f:
            d = json.load(f)
        print("<!-- %s -->" % path)
        if "policy_cost" in d:
            print(bench(d))
        elif "results" in d:
            print(accuracy(d))
        else:
            print(fidelity(d))
        print()


if __name__ == "__main__":
    main()
