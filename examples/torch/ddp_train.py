#!/usr/bin/env python3
"""A small PyTorch DistributedDataParallel (gloo) training script, unmodified torchrun style: it
reads nothing but the environment a launcher (torchrun or tdist-agent) sets and calls
init_process_group("gloo"). Under tdist-agent, TORCHELASTIC_USE_AGENT_STORE=True makes every rank
a client of the agent's store.

Each rank trains a linear regression on its own shard; DDP averages the gradients. At the end it
checks that the loss went down and that every rank holds identical parameters (all_gather).

Options (for tests):
  --steps N               training steps (default 60)
  --fail-rank R           this global rank raises an exception ...
  --fail-attempt A        ... only while TORCHELASTIC_RESTART_COUNT == A (default 0)
  --fail-code C           exit with code C instead of raising
  --env-dump DIR          write the worker's environment to DIR/env.<rank>.json
  --wait-file PATH        block before training until PATH exists (lets a test inspect the agent)
  --step-sleep S          sleep S seconds after each step (a longer job to disturb)
Exit status: 0 success, 1 exception (the error file names it), 2 a check failed.
"""
import argparse
import gc
import json
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel as DDP


@record
def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--fail-rank", type=int, default=-1)
    p.add_argument("--fail-attempt", type=int, default=0)
    p.add_argument("--fail-code", type=int, default=0)
    p.add_argument("--env-dump", default="")
    p.add_argument("--wait-file", default="")
    p.add_argument("--step-sleep", type=float, default=0.0)
    args = p.parse_args()

    rank = int(os.environ["RANK"])
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if args.env_dump:
        with open(os.path.join(args.env_dump, f"env.{rank}.json"), "w") as f:
            json.dump(dict(os.environ), f)
    if args.wait_file:
        while not os.path.exists(args.wait_file):
            time.sleep(0.05)

    dist.init_process_group("gloo")
    world = dist.get_world_size()
    assert dist.get_rank() == rank

    if rank == args.fail_rank and attempt == args.fail_attempt:
        if args.fail_code:
            sys.exit(args.fail_code)
        raise ValueError(f"deliberate failure of rank {rank} on attempt {attempt}")

    torch.manual_seed(1234)  # same model on every rank; DDP also broadcasts rank 0's
    true_w = torch.randn(16, 1)
    model = DDP(torch.nn.Linear(16, 1))
    g = torch.Generator().manual_seed(100 + rank)
    x = torch.randn(256, 16, generator=g)
    y = x @ true_w + 0.01 * torch.randn(256, 1, generator=g)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    first = last = None
    for step in range(args.steps):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        t = loss.detach().clone()
        dist.all_reduce(t)
        t /= world
        first = t.item() if first is None else first
        last = t.item()
        if rank == 0 and step % 20 == 0:
            print(f"step {step:3d} loss {last:.5f}", flush=True)
        if args.step_sleep:
            time.sleep(args.step_sleep)

    flat = torch.cat([q.detach().flatten() for q in model.parameters()])
    gathered = [torch.empty_like(flat) for _ in range(world)]
    dist.all_gather(gathered, flat)
    same = all(torch.equal(gathered[0], t) for t in gathered)
    # Free DDP before the process group. Otherwise its C++ Reducer holds the group's last
    # reference after destroy_process_group(), and freeing the model (GIL held) runs
    # ~ProcessGroupGloo, which joins a gloo worker thread that may be waiting for the GIL to free
    # a tensor: a deadlock at exit in PyTorch 1.13, seen as a rank that never exits.
    model = opt = loss = None
    gc.collect()
    dist.destroy_process_group()
    if rank == 0:
        print(f"done: world {world} attempt {attempt} loss {first:.5f} -> {last:.5f} "
              f"params identical: {same}", flush=True)
    if not same or not last < first * 0.5:
        sys.exit(2)


if __name__ == "__main__":
    main()
