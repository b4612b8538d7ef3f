"""A PyTorch job on the "tdist" backend for the agent tests: STEPS all_reduces of a small tensor;
rank STALL_RANK sleeps STALL_S seconds before all_reduce #STALL_AT (1-based) while the others
wait in it. Each rank checks every sum.
    stall_train.py STEPS STALL_RANK STALL_AT STALL_S
Nothing tdist-specific but the import and the backend name: env:// from the launcher."""
import sys
import time

import torch
import torch.distributed as dist

import tdist_torch  # noqa: F401  (registers "tdist"; the agent puts it on PYTHONPATH)

steps, stall_rank, stall_at, stall_s = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
dist.init_process_group("tdist")
rank, world = dist.get_rank(), dist.get_world_size()
print("rank %d of %d on %s, tdist_torch from %s, implementation %s"
      % (rank, world, dist.get_backend(), tdist_torch.__file__, tdist_torch.implementation), flush=True)
for i in range(1, steps + 1):
    if rank == stall_rank and i == stall_at:
        time.sleep(stall_s)
    t = torch.full((64,), float(rank + i))
    dist.all_reduce(t)
    want = float(sum(r + i for r in range(world)))
    if not torch.equal(t, torch.full((64,), want)):
        sys.exit("rank %d: all_reduce #%d gave %s, want %s" % (rank, i, t[0].item(), want))
    time.sleep(0.02)
dist.destroy_process_group()
print("rank %d done" % rank, flush=True)
