#!/usr/bin/env python3
"""Before/after table of two coll_bench builds run alternately (bench/collectives/before_after.sh).

    python3 bench/collectives/before_after.py DIR

DIR holds before.N.tsv and after.N.tsv (coll_bench --tsv, --peers none). A run's time for a cell
(transport, ranks, collective, size) is the slowest rank's median, as coll_bench prints it. Per
build the table shows the best of its runs; `after/before` is the ratio of those bests; `noise` is
the larger spread (worst/best - 1) among one build's own runs: a ratio within 1 +- noise is a
difference the machine cannot tell from its own variation."""
import collections
import glob
import os
import sys


def load(path):
    """{(impl, nranks, coll, bytes): slowest rank's median ns} of one run."""
    cell = collections.defaultdict(int)
    with open(path, encoding="utf-8") as f:
        head = f.readline().rstrip("\n").split("\t")
        for line in f:
            row = dict(zip(head, line.rstrip("\n").split("\t")))
            key = (row["impl"], int(row["nranks"]), row["coll"], int(row["bytes"]))
            cell[key] = max(cell[key], int(row["median_ns"]))
    return cell


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    runs = {}
    for side in ("before", "after"):
        paths = sorted(glob.glob(os.path.join(sys.argv[1], side + ".*.tsv")))
        if not paths:
            sys.exit("before_after.py: no %s.*.tsv in %s" % (side, sys.argv[1]))
        runs[side] = [load(p) for p in paths]
    keys = sorted(set().union(*runs["before"], *runs["after"]))
    print("| transport | ranks | collective | bytes | before us | after us | after/before | noise |")
    print("|---|---|---|---|---|---|---|---|")
    worse = 0
    for k in keys:
        best, spread = {}, 0.0
        for side in ("before", "after"):
            vals = [r[k] for r in runs[side] if k in r]
            if not vals:
                break
            best[side] = min(vals)
            spread = max(spread, max(vals) / min(vals) - 1)
        if len(best) != 2:
            continue
        ratio = best["after"] / best["before"]
        flag = " **slower**" if ratio > 1 + max(spread, 0.05) else ""
        worse += bool(flag)
        print("| %s | %d | %s | %d | %.2f | %.2f | %.3f%s | %.0f%% |" %
              (k[0].replace("tdist-", ""), k[1], k[2], k[3], best["before"] / 1e3,
               best["after"] / 1e3, ratio, flag, spread * 100))
    print("\n%d of %d cells slower than before beyond max(noise, 5%%)" % (worse, len(keys)))


if __name__ == "__main__":
    main()
