#!/usr/bin/env python3
"""A small PyTorch DistributedDataParallel training script, unmodified torchrun style: it reads
nothing but the environment a launcher (torchrun or tdist-agent) sets and calls
init_process_group("gloo") (or --backend's). Under tdist-agent, TORCHELASTIC_USE_AGENT_STORE=True
makes every rank a client of the agent's store.

Each rank trains a linear regression on its own shard; DDP averages the gradients. At the end it
checks that the loss went down and that every rank holds identical parameters (all_gather).

Options:
  --backend B             init_process_group(B) (default gloo); "tdist" imports tdist_torch first,
                          the one change a script makes to run its collectives in libtdist
  --steps N               training steps (default 60)
  --fail-rank R           this global rank (all: every rank) raises an exception ...
  --fail-attempt A        ... only while TORCHELASTIC_RESTART_COUNT == A (default 0)
  --fail-code C           exit with code C instead of raising
  --fail-before-init      fail before init_process_group instead of after it
  --env-dump DIR          write the worker's environment to DIR/env.<rank>.json and its
                          resource limits (soft, hard) to DIR/limits.<rank>.json
  --wait-file PATH        block before training until PATH exists (lets a test inspect the agent)
  --step-sleep S          sleep S seconds after each step (a longer job to disturb)
  --crash-until-attempt N while TORCHELASTIC_RESTART_COUNT < N, one rank crashes at one step
                          after init_process_group, both picked at random from --seed and the
                          attempt; the way it dies cycles through an exception, os._exit(1)
                          and SIGKILL (restart tests)
  --seed S                seed of those choices (default 1)
  --events FILE           append "EVENT ATTEMPT RANK UNIX_TIME" lines to FILE: "crash" right before
                          a --crash-until-attempt crash, "step0" when step 0 of training starts,
                          "first_step" once its gradients and loss are all-reduced
                          (restart benchmarks: bench/agent/restart.sh)
  --check-fresh-store     before init, add 1 to a key in the launcher's store (MASTER_ADDR/PORT,
                          no prefix) and exit 99 if the count exceeds WORLD_SIZE: a store that
                          still holds an earlier attempt's keys (attempt isolation tests)
Exit status: 0 success, 1 exception (the error file names it), 2 a check failed, 99 the
store held an earlier attempt's keys (--check-fresh-store).
"""
import argparse
import gc
import json
import os
import random
import signal
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel as DDP


def check_fresh_store(rank):
    world = int(os.environ["WORLD_SIZE"])
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                          is_master=False, timeout=timedelta(seconds=60))
    n = store.add("tdist_test/ranks_started", 1)
    if n > world:
        print(f"rank {rank}: the store already counted {n - 1} rank start(s) of a world of "
              f"{world}: it holds keys of an earlier attempt", file=sys.stderr, flush=True)
        os._exit(99)
    del store


def event(path, name, attempt, rank):
    if path:
        with open(path, "a") as f:
            f.write(f"{name} {attempt} {rank} {time.time():.6f}\n")


def crash(attempt, rank, step, events=""):
    event(events, "crash", attempt, rank)
    how = attempt % 3
    print(f"rank {rank}: crashing at step {step} on attempt {attempt} "
          f"({['exception', 'os._exit(1)', 'SIGKILL'][how]})", flush=True)
    if how == 0:
        raise RuntimeError(f"deliberate crash of rank {rank} at step {step} on attempt {attempt}")
    if how == 1:
        os._exit(1)
    os.kill(os.getpid(), signal.SIGKILL)


def fail_if_chosen(args, rank, attempt):
    chosen = args.fail_rank == "all" or int(args.fail_rank) == rank
    if chosen and attempt == args.fail_attempt:
        if args.fail_code:
            sys.exit(args.fail_code)
        raise ValueError(f"deliberate failure of rank {rank} on attempt {attempt}")


@record
def main():
    p = argparse.ArgumentParser()
    p.add_argument("--backend", default="gloo")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--fail-rank", default="-1")
    p.add_argument("--fail-attempt", type=int, default=0)
    p.add_argument("--fail-code", type=int, default=0)
    p.add_argument("--fail-before-init", action="store_true")
    p.add_argument("--env-dump", default="")
    p.add_argument("--wait-file", default="")
    p.add_argument("--step-sleep", type=float, default=0.0)
    p.add_argument("--crash-until-attempt", type=int, default=0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--check-fresh-store", action="store_true")
    p.add_argument("--events", default="")
    args = p.parse_args()

    rank = int(os.environ["RANK"])
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if args.env_dump:
        with open(os.path.join(args.env_dump, f"env.{rank}.json"), "w") as f:
            json.dump(dict(os.environ), f)
        import resource
        lim = {n: list(resource.getrlimit(getattr(resource, n)))
               for n in ("RLIMIT_NOFILE", "RLIMIT_NPROC", "RLIMIT_CORE", "RLIMIT_STACK",
                         "RLIMIT_AS", "RLIMIT_MEMLOCK")}
        with open(os.path.join(args.env_dump, f"limits.{rank}.json"), "w") as f:
            json.dump(lim, f)
    if args.wait_file:
        while not os.path.exists(args.wait_file):
            time.sleep(0.05)

    if args.check_fresh_store:
        check_fresh_store(rank)
    if args.fail_before_init:
        fail_if_chosen(args, rank, attempt)
    if args.backend.startswith("tdist") or ":tdist" in args.backend:
        import tdist_torch  # noqa: F401 - registers the backend name "tdist"
    dist.init_process_group(args.backend)
    world = dist.get_world_size()
    assert dist.get_rank() == rank
    if rank == 0:
        impl = ""
        if "tdist_torch" in sys.modules:
            impl = f" ({sys.modules['tdist_torch'].implementation})"
        print(f"ddp_train: PyTorch {torch.__version__}, world {world}, attempt {attempt}, "
              f"backend {dist.get_backend()}{impl}", flush=True)
    crash_step = -1
    if attempt < args.crash_until_attempt:
        rng = random.Random(args.seed * 1000003 + attempt)
        victim = rng.randrange(world)
        if rank == victim:
            crash_step = rng.randrange(1, max(2, args.steps))
            print(f"rank {rank}: attempt {attempt} will crash at step {crash_step}", flush=True)

    fail_if_chosen(args, rank, attempt)

    torch.manual_seed(1234)  # same model on every rank; DDP also broadcasts rank 0's
    true_w = torch.randn(16, 1)
    model = DDP(torch.nn.Linear(16, 1))
    g = torch.Generator().manual_seed(100 + rank)
    x = torch.randn(256, 16, generator=g)
    y = x @ true_w + 0.01 * torch.randn(256, 1, generator=g)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    first = last = None
    for step in range(args.steps):
        if step == 0:
            event(args.events, "step0", attempt, rank)
        if step == crash_step:
            crash(attempt, rank, step, args.events)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        t = loss.detach().clone()
        dist.all_reduce(t)
        t /= world
        first = t.item() if first is None else first
        last = t.item()
        if step == 0:
            event(args.events, "first_step", attempt, rank)
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
