"""Send/recv latency of the "tdist" PyTorch backend between 2 ranks of this host. Prints;
asserts nothing about speed.

    PYTHONPATH=runtime/torch TDIST_LIBRARY=bazel-bin/runtime/libtdist.so \\
        /usr/bin/python3 bench/torch/p2p_bench.py [ITERS] [BACKEND]

Rows: one-way time (half a round trip, median of 7 passes) of dist.send/dist.recv ping-pong,
and of a round of dist.batch_isend_irecv with irecv first (P2P_BENCH_BATCH=0 leaves that row
out, for a tdist_torch where it deadlocks). BACKEND: tdist (default) or gloo, for reference.
"""

import datetime
import os
import subprocess
import sys
import time

ITERS = int(sys.argv[1]) if len(sys.argv) > 1 else 500
BACKEND = sys.argv[2] if len(sys.argv) > 2 else "tdist"

if len(sys.argv) <= 3:
    import torch.distributed as dist

    host = dist.TCPStore("127.0.0.1", 0, 3, True, timeout=datetime.timedelta(seconds=60),
                         wait_for_workers=False)
    procs = [subprocess.Popen([sys.executable, "-u", __file__, str(ITERS), BACKEND,
                               str(host.port), str(r)]) for r in range(2)]
    sys.exit(max(p.wait() for p in procs))

PORT, RANK = int(sys.argv[3]), int(sys.argv[4])
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

if BACKEND == "tdist":
    import tdist_torch  # noqa: E402,F401

store = dist.TCPStore("127.0.0.1", PORT, 3, False, timeout=datetime.timedelta(seconds=60))
dist.init_process_group(BACKEND, store=store, rank=RANK, world_size=2,
                        timeout=datetime.timedelta(seconds=60))
peer = 1 - RANK


def ping_pong(t, r):
    if RANK == 0:
        dist.send(t, peer)
        dist.recv(r, peer)
    else:
        dist.recv(r, peer)
        dist.send(t, peer)


def batch(t, r):
    for w in dist.batch_isend_irecv([dist.P2POp(dist.irecv, r, peer), dist.P2POp(dist.isend, t, peer)]):
        w.wait()


rows = [("send/recv", ping_pong, 2)]
if os.environ.get("P2P_BENCH_BATCH", "1") != "0":
    rows.append(("batch irecv-first", batch, 1))
if RANK == 0:
    print("%s, PyTorch %s, %d round trips per pass" % (BACKEND, torch.__version__, ITERS))
    print("%-18s %10s %12s" % ("row", "bytes", "one-way us"))
for name, fn, legs in rows:
    for nbytes in (4, 1024, 65536):
        t, r = torch.ones(nbytes // 4), torch.zeros(nbytes // 4)
        for _ in range(ITERS // 10 + 1):
            fn(t, r)
        passes = []
        for _ in range(7):
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(ITERS):
                fn(t, r)
            passes.append((time.perf_counter() - t0) / ITERS / legs * 1e6)
        passes.sort()
        if RANK == 0:
            print("%-18s %10d %12.1f" % (name, nbytes, passes[3]), flush=True)
dist.destroy_process_group()
