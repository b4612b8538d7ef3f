"""The PyTorch 1.13 gloo peer of the collectives benchmark.

Mirrors bench_common.c's sweep (same plan, data pattern, correctness check and timing: the 0.3 s
start-up warm-up, then per cell warm-up iterations, one checked iteration, then each timed
iteration measured on its own; all_reduce runs on zeros)
with torch.distributed over the gloo backend, initialised with env:// exactly as torchrun would
(RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT; rank 0 hosts the TCPStore). coll_bench starts one
process per rank with /usr/bin/python3 and OMP_NUM_THREADS=1 (torchrun's default).

Gloo in PyTorch 1.13 has no reduce_scatter (ProcessGroupGloo::reduce_scatter throws) and no
all_gather_into_tensor: reduce_scatter is emulated the way users do it (clone, all_reduce of the
whole array, copy out this rank's block; the clone and copy are timed, they are part of the
cost), all_gather uses the list form into views of one tensor, all_to_all is all_to_all_single.

Each rank writes OUT/IMPL.RANK.tsv lines:
  impl nranks rank coll bytes total_count median_ns min_ns wrong iters
"""

import argparse
import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

COLLS = ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all"]
SALT = {"all_reduce": 1, "broadcast": 2, "all_gather": 3, "reduce_scatter": 4, "all_to_all": 5}
SENTINEL = 1.0e9
WARMUP_S = 0.3


def parse_sizes(s):
    out = []
    for tok in s.split(","):
        mult = 1
        if tok[-1] in "kK":
            mult, tok = 1 << 10, tok[:-1]
        elif tok[-1] in "mM":
            mult, tok = 1 << 20, tok[:-1]
        elif tok[-1] in "gG":
            mult, tok = 1 << 30, tok[:-1]
        out.append(int(tok) * mult)
    return out


class Scratch:
    """Buffers allocated once per process at the largest size of the plan and reused through
    views, like bench_common.c does: on this kind of VM the first touch of fresh memory costs
    ~20 us per 4 KiB page, which would otherwise dominate the set-up between timed iterations.
    (What torch allocates inside a collective is torch's own cost and stays in the timing.)"""

    def __init__(self, max_in, max_out, max_total):
        self.inp = torch.empty(max(max_in, 1))
        self.out = torch.empty(max(max_out, 1))
        self.i64 = torch.empty(max_total, dtype=torch.int64)
        self.want = torch.empty(max_total)
        self.tmp = torch.empty(max_total)
        self.ne = torch.empty(max_total, dtype=torch.bool)
        for t in (self.inp, self.out, self.i64, self.want, self.tmp, self.ne):
            t.zero_()  # touch every page now, outside any timing

    def val_into(self, dst, salt, rank, lo, hi):
        """dst[:] = bench_val(salt, rank, i) for i in [lo, hi) (bench_common.h), in place."""
        t = self.i64[:hi - lo]
        torch.arange(lo, hi, out=t)
        t.mul_(2654435761).add_(rank * 40503 + salt * 97)
        torch.bitwise_right_shift(t, 5, out=t)
        t.bitwise_and_(127).sub_(64)
        dst.copy_(t)


def total_count(coll, nbytes, n):
    t = nbytes // 4
    if coll in ("all_reduce", "broadcast"):
        return max(t, 1)
    t -= t % n
    return t if t else n


def buf_counts(coll, total, n):
    blk = total // n
    return {"all_reduce": (0, total), "broadcast": (0, total), "all_gather": (blk, total),
            "reduce_scatter": (total, blk)}.get(coll, (total, total))


class Cell:
    """Views of the scratch buffers and the call for one (collective, size)."""

    def __init__(self, sc, coll, total, n, rank):
        self.sc, self.coll, self.total, self.n, self.rank = sc, coll, total, n, rank
        self.blk = total // n
        nin, nout = buf_counts(coll, total, n)
        self.inp = sc.inp[:nin] if nin else None
        self.out = sc.out[:nout]
        if coll == "all_gather":
            self.outs = list(self.out.chunk(n))

    def fill(self):
        salt = SALT[self.coll]
        if self.inp is None:
            self.sc.val_into(self.out, salt, self.rank, 0, self.total)
        else:
            self.sc.val_into(self.inp, salt, self.rank, 0, self.inp.numel())
            self.out.fill_(SENTINEL)

    def run(self):
        c = self.coll
        if c == "all_reduce":
            dist.all_reduce(self.out)
        elif c == "broadcast":
            dist.broadcast(self.out, 0)
        elif c == "all_gather":
            dist.all_gather(self.outs, self.inp)
        elif c == "reduce_scatter":
            work = self.inp.clone()
            dist.all_reduce(work)
            self.out.copy_(work[self.rank * self.blk:(self.rank + 1) * self.blk])
        else:
            dist.all_to_all_single(self.out, self.inp)

    def wrong(self):
        c, n, r, blk, sc = self.coll, self.n, self.rank, self.blk, self.sc
        salt = SALT[c]
        m = self.out.numel()
        want, tmp = sc.want[:m], sc.tmp[:m]
        if c in ("all_reduce", "reduce_scatter"):
            lo = 0 if c == "all_reduce" else r * blk
            want.zero_()
            for k in range(n):
                sc.val_into(tmp, salt, k, lo, lo + m)
                want.add_(tmp)
        elif c == "broadcast":
            sc.val_into(want, salt, 0, 0, m)
        else:  # all_gather: block j = rank j's input; all_to_all: block j = rank j's block r
            lo = 0 if c == "all_gather" else r * blk
            for j in range(n):
                sc.val_into(want[j * blk:(j + 1) * blk], salt, j, lo, lo + blk)
        ne = sc.ne[:m]
        torch.ne(self.out, want, out=ne)
        return int(ne.sum().item())


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--impl", default="torch-gloo")
    ap.add_argument("--out", required=True)
    ap.add_argument("--colls", required=True)
    ap.add_argument("--sizes", required=True)
    ap.add_argument("--iters", required=True)
    ap.add_argument("--warmup", required=True)
    ap.add_argument("--timeout-s", type=int, default=300)
    a = ap.parse_args()
    colls = a.colls.split(",")
    sizes = parse_sizes(a.sizes)
    iters = [int(x) for x in a.iters.split(",")]
    warmup = [int(x) for x in a.warmup.split(",")]
    if any(c not in COLLS for c in colls) or not (len(sizes) == len(iters) == len(warmup)):
        sys.exit("torch_peer: bad plan")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="env://",
                            timeout=timedelta(seconds=a.timeout_s))
    rank, n = dist.get_rank(), dist.get_world_size()
    max_in = max_out = max_total = 1
    for c in colls:
        for nbytes in sizes:
            total = total_count(c, nbytes, n)
            nin, nout = buf_counts(c, total, n)
            max_in, max_out, max_total = max(max_in, nin), max(max_out, nout), max(max_total, total)
    sc = Scratch(max_in, max_out, max_total)
    # Start-up warm-up, as bench_common.c: one-float all_reduces until rank 0 has spent
    # WARMUP_S in them (rank 0 adds 1 while time is left, so all ranks stop together).
    one, t0 = torch.zeros(1), time.perf_counter()
    for _ in range(1000000):
        one[0] = 1.0 if rank == 0 and time.perf_counter() - t0 < WARMUP_S else 0.0
        dist.all_reduce(one)
        if one[0].item() == 0.0:
            break
    with open(os.path.join(a.out, "%s.%d.tsv" % (a.impl, rank)), "w") as f:
        for c in colls:
            for nbytes, it, wu in zip(sizes, iters, warmup):
                total = total_count(c, nbytes, n)
                cell = Cell(sc, c, total, n, rank)
                cell.fill()
                if c == "all_reduce":
                    cell.out.zero_()
                for _ in range(wu):
                    cell.run()
                cell.fill()
                cell.run()
                wrong = cell.wrong()
                if c == "all_reduce":
                    cell.out.zero_()
                t = []
                for _ in range(it):
                    t0 = time.perf_counter_ns()
                    cell.run()
                    t.append(time.perf_counter_ns() - t0)
                t.sort()
                med = t[it // 2] if it % 2 else (t[it // 2 - 1] + t[it // 2]) // 2
                f.write("%s\t%d\t%d\t%s\t%d\t%d\t%d\t%d\t%d\t%d\n"
                        % (a.impl, n, rank, c, total * 4, total, med, t[0], wrong, it))
                f.flush()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
