"""Point-to-point on the "tdist" PyTorch backend in any posting order (issue 32).

Run as `p2p_check.py WORLD` (a launcher: hosts a TCPStore, starts WORLD ranks of itself, checks
that all exit 0 in time) or `p2p_check.py WORLD PORT RANK` (one rank). With the backend's default
settings (messages under TDIST_TORCH_ASYNC_BYTES used to run on the calling thread):
  - PyTorch's own test_batch_isend_irecv_gloo pattern: for every other rank, an irecv then an
    isend in one dist.batch_isend_irecv, for 32 B (which deadlocked), 400 B, 400 KB and 4 MiB;
  - the same with tags, 6 irecvs posted before 6 isends to each peer;
  - dist.irecv then dist.isend, waited in reverse order;
  - blocking dist.send / dist.recv around a ring, and an isend/irecv pair before a collective;
every received tensor compared with the sender's random data (seeded by sender, receiver, case).
"""

import datetime
import os
import sys

WORLD = int(sys.argv[1])

if len(sys.argv) == 2:
    import rank_launcher

    rank_launcher.run(__file__, WORLD, 240)

PORT = int(sys.argv[2])
RANK = int(sys.argv[3])

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import tdist_torch  # noqa: E402,F401

SEED = int(os.environ.get("TDIST_TEST_SEED", "32"))


def data(sender, receiver, case, numel):
    g = torch.Generator().manual_seed(SEED * 1000003 + sender * 10007 + receiver * 101 + case)
    return torch.randn(numel, generator=g)


def check(got, sender, case, what):
    want = data(sender, RANK, case, got.numel())
    if not torch.equal(got, want):
        bad = (got != want).nonzero()[0].item()
        raise AssertionError("rank %d, %s: element %d from rank %d is %r, want %r"
                             % (RANK, what, bad, sender, got[bad].item(), want[bad].item()))


store = dist.TCPStore("127.0.0.1", PORT, WORLD + 1, False, timeout=datetime.timedelta(seconds=60))
dist.init_process_group("tdist", store=store, rank=RANK, world_size=WORLD,
                        timeout=datetime.timedelta(seconds=30))
peers = [p for p in range(WORLD) if p != RANK]

# PyTorch's test_batch_isend_irecv_gloo: each peer's irecv before its isend.
for case, numel in enumerate([8, 100, 100_000, 1 << 20]):
    recvs = {src: torch.full((numel,), -1.0) for src in peers}
    ops = []
    for src in peers:
        ops.append(dist.P2POp(dist.irecv, recvs[src], src))
        ops.append(dist.P2POp(dist.isend, data(RANK, src, case, numel), src))
    for req in dist.batch_isend_irecv(ops):
        req.wait()
    for src in peers:
        check(recvs[src], src, case, "batch_isend_irecv of %d bytes" % (4 * numel))
    print("rank %d: batch_isend_irecv, irecv first, %d bytes: ok" % (RANK, 4 * numel), flush=True)

# Tags, several in flight: 6 irecvs to each peer posted before the 6 isends.
sizes = [1, 8, 3000, 70_000, 8, 300_000]
recvs, ops = {}, []
for src in peers:
    for k, numel in enumerate(sizes):
        recvs[src, k] = torch.zeros(numel)
        ops.append(dist.P2POp(dist.irecv, recvs[src, k], src, tag=k))
for dst in peers:
    for k, numel in enumerate(sizes):
        ops.append(dist.P2POp(dist.isend, data(RANK, dst, 10 + k, numel), dst, tag=k))
for req in dist.batch_isend_irecv(ops):
    req.wait()
for (src, k), t in recvs.items():
    check(t, src, 10 + k, "tagged batch, tag %d" % k)
print("rank %d: 6 tagged irecvs per peer before the isends: ok" % RANK, flush=True)

# dist.irecv then dist.isend, waited for in reverse order.
reqs, recvs = [], {}
for src in peers:
    recvs[src] = torch.zeros(32)
    reqs.append(dist.irecv(recvs[src], src))
for dst in peers:
    reqs.append(dist.isend(data(RANK, dst, 20, 32), dst))
for req in reversed(reqs):
    req.wait()
for src in peers:
    check(recvs[src], src, 20, "irecv then isend")
print("rank %d: irecv, isend, waits in reverse order: ok" % RANK, flush=True)

# Blocking send/recv around the ring (rank 0 sends first), then an async pair before a collective.
right, left = (RANK + 1) % WORLD, (RANK - 1) % WORLD
got = torch.zeros(1000)
if RANK == 0:
    dist.send(data(RANK, right, 30, 1000), right)
    dist.recv(got, left)
else:
    dist.recv(got, left)
    dist.send(data(RANK, right, 30, 1000), right)
check(got, left, 30, "blocking ring")
got = torch.zeros(16)
r = dist.irecv(got, left)
s = dist.isend(data(RANK, right, 31, 16), right)
total = torch.ones(4)
dist.all_reduce(total)
r.wait()
s.wait()
check(got, left, 31, "irecv/isend before an all_reduce")
assert torch.equal(total, torch.full((4,), float(WORLD))), total
print("rank %d: blocking ring, async pair before all_reduce: ok" % RANK, flush=True)

dist.destroy_process_group()
