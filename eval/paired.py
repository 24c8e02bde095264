#!/usr/bin/env python3
"""Problem-by-problem comparison of two configurations of an `eval accuracy`
records file: how many problems only the first got right, how many only the
second, and McNemar's exact two-sided p on those counts.

usage: paired.py RECORDS.jsonl POLICY@BUDGET POLICY@BUDGET [POLICY@BUDGET POLICY@BUDGET ...]
  e.g. paired.py docs/results/gsm8k_qwen1.5b.records.jsonl lazy@0.5 h2o@0.5 full@1 lazy@0.5
Only problems answered under both configurations count.
"""
import json
import math
import sys


def mcnemar_p(a, b):
    """Exact two-sided binomial test of a against a + b at one half."""
    n = a + b
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(0, min(a, b) + 1)) / 2 ** n
    return min(1.0, 2 * tail)


def load(path):
    answers = {}
    for line in open(path):
        r = json.loads(line)
        if r.get("kind") == "accuracy_records":
            continue
        answers[(r["policy"], float(r["budget_ratio"]), r["id"])] = bool(r["correct"])
    return answers


def compare(answers, first, second):
    (pa, ba), (pb, bb) = first, second
    ids = {i for (p, b, i) in answers if (p, b) == (pa, ba)} & {i for (p, b, i) in answers if (p, b) == (pb, bb)}
    only_a = sum(1 for i in ids if answers[(pa, ba, i)] and not answers[(pb, bb, i)])
    only_b = sum(1 for i in ids if answers[(pb, bb, i)] and not answers[(pa, ba, i)])
    return only_a, only_b, len(ids)


def parse(spec):
    policy, _, budget = spec.rpartition("@")
    return policy, float(budget)


def main():
    if len(sys.argv) < 4 or len(sys.argv) % 2:
        sys.exit(__doc__)
    answers = load(sys.argv[1])
    for first, second in zip(sys.argv[2::2], sys.argv[3::2]):
        a, b, n = compare(answers, parse(first), parse(second))
        p = mcnemar_p(a, b)
        print("%s vs %s: %d / %d of %d problems, p %s" % (first, second, a, b, n,
                                                         "< 0.001" if p < 0.001 else "= %.2g" % p))


if __name__ == "__main__":
    main()
