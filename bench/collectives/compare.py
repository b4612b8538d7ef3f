#!/usr/bin/env python3
"""Compares two outputs of bench/collectives/run.sh (with Open MPI peers): one markdown table per
world size, a row per collective and size, with tdist's time and its ratio to Open MPI before and
after, for each transport (tdist-tcp against ompi-tcp, tdist-shm against ompi-shm).

    python3 bench/collectives/compare.py before.log after.log [--only-over 1.0]

--only-over R keeps the rows where a ratio after is above R (what is still slower). Ratios are
each run's own (the peer ran in the same run), so machine noise between runs cancels out."""
import re
import sys


def parse(path):
    """{(ranks, coll, size): {'tcp': (us, ratio), 'shm': (us, ratio)}}"""
    out, coll, ranks = {}, None, None
    head = re.compile(r"^# (\w+), (\d+) ranks")
    for line in open(path, encoding="utf-8", errors="replace"):
        m = head.match(line)
        if m:
            coll, ranks = m.group(1), int(m.group(2))
            continue
        if coll is None or not re.match(r"^ +\d+ +\d+ ", line):
            continue
        cells = [c.split() for c in line.split("|")]
        size = int(cells[0][0])
        row = {}

        def num(s):
            try:
                return float(s)
            except ValueError:
                return None

        if len(cells) >= 5:
            row["tcp"] = (num(cells[1][0]), num(cells[2][1]) if len(cells[2]) > 1 else None)
            row["shm"] = (num(cells[3][0]), num(cells[4][1]) if len(cells[4]) > 1 else None)
        out[(ranks, coll, size)] = row
    return out


def fmt_size(b):
    for unit, n in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= n and b % n == 0:
            return f"{b // n} {unit}"
    return f"{b} B"


def cell(v):
    if not v or v[0] is None:
        return "-"
    us, ratio = v
    return f"{us:.2f} ({ratio:.2f}x)" if ratio is not None else f"{us:.2f}"


def main(argv):
    if len(argv) < 3 or argv[1] in ("-h", "--help"):
        print(__doc__)
        return 0 if len(argv) > 1 and argv[1] in ("-h", "--help") else 2
    before, after = parse(argv[1]), parse(argv[2])
    only = float(argv[argv.index("--only-over") + 1]) if "--only-over" in argv else None
    for ranks in sorted({k[0] for k in after}):
        print(f"\n{ranks} ranks: tdist us (ratio to Open MPI), before -> after\n")
        print("| collective | size | tcp before | tcp after | shm before | shm after |")
        print("|---|---|---|---|---|---|")
        for key in sorted(k for k in after if k[0] == ranks):
            a, b = after[key], before.get(key, {})
            ratios = [v[1] for v in a.values() if v and v[1] is not None]
            if only is not None and not any(r > only for r in ratios):
                continue
            print(f"| {key[1]} | {fmt_size(key[2])} | {cell(b.get('tcp'))} | {cell(a.get('tcp'))}"
                  f" | {cell(b.get('shm'))} | {cell(a.get('shm'))} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
