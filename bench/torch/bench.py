"""PyTorch on the "tdist" backend against PyTorch's own gloo, in the same processes and run.

    bench.py [--ranks 1,2,4] [--transports tcp,shm] [--sizes 8,1K,...] [--ddp-steps 20]
             [--seconds 0.3] [--skip-ddp]

For each rank count and tdist transport (tcp: TDIST_SHM=0; shm: same-host shared memory, the
default) it starts that many ranks of this script, each with the default group on "tdist" and a
"gloo" group, and prints (rank 0):
  1. all_reduce latency per call from Python (float32 SUM, blocking), median over repeated
     blocks, for tdist, the C API called directly through ctypes on the same libtdist group
     (blocking, and _async + tdist_work_wait), and torch gloo, with ratios; "binding us" is what
     the binding adds over the C call it makes (the blocking one below TDIST_TORCH_ASYNC_BYTES,
     the async one from there up). 1 rank has no peer to wait for: its rows are the per-call
     cost alone, where the binding's share is measured best;
  2. DDP step time (forward, backward with DDP's bucketed all_reduce, SGD step) for a tiny MLP
     (26K parameters, batch 16: the step is mostly the all_reduce's latency), a small MLP
     (batch 16, and batch 1, where the all_reduce's bandwidth dominates), a wider MLP (8.4M parameters, batch
     1: communication is nearly all of the step) and a small conv net on CPU: tdist
     against gloo, models and data identical, medians, with the step's compute alone (no_sync),
     the step with free communication (DDP's own bucket work kept, its all_reduce replaced by a
     comm hook that returns at once), the floor no backend can go under (that step, or where
     ranks outnumber cores, its CPU time summed over the ranks and spread over the cores), and
     the share of gloo's step that is communication.
DDP steps run back to back, as in a training loop, in timed blocks of up to 10. tdist and gloo
alternate block by block so drift of the machine hits both alike. Prints
numbers; asserts nothing (bench/torch/run.sh runs it under PyTorch 1.13 and 2.6).
"""

import argparse
import ctypes
import datetime
import os
import statistics
import subprocess
import sys
import time


def parse_size(s):
    s = s.strip().upper()
    mult = 1
    for suf, m in (("K", 1 << 10), ("M", 1 << 20), ("G", 1 << 30)):
        if s.endswith(suf):
            mult, s = m, s[:-1]
    return int(s) * mult


def human(n):
    for suf, m in (("M", 1 << 20), ("K", 1 << 10)):
        if n >= m and n % m == 0:
            return "%d %siB" % (n // m, suf)
    return "%d B" % n


p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
p.add_argument("--ranks", default="1,2,4",
               help="rank counts; 1 rank measures the per-call cost alone (no peer to wait for)")
p.add_argument("--transports", default="tcp,shm")
p.add_argument("--sizes", default="8,1K,64K,1M,16M,64M")
p.add_argument("--seconds", type=float, default=0.3, help="measured time per cell and library")
p.add_argument("--ddp-steps", type=int, default=20,
               help="DDP steps per model and kind at least (cheap models run up to 10 times as many)")
p.add_argument("--skip-ddp", action="store_true")
p.add_argument("--rank", type=int, default=-1, help=argparse.SUPPRESS)
p.add_argument("--world", type=int, default=0, help=argparse.SUPPRESS)
p.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
a = p.parse_args()

if a.rank < 0:
    import torch
    import torch.distributed as dist

    print("PyTorch %s (%s), %d CPUs" % (torch.__version__, sys.executable, os.cpu_count()), flush=True)
    for world in [int(x) for x in a.ranks.split(",")]:
        trs = a.transports.split(",")
        for tr in trs:
            if tr not in ("tcp", "shm"):
                sys.exit("--transports: %r is not tcp or shm" % tr)
        for tr in trs[:1] if world == 1 else trs:
            host = dist.TCPStore("127.0.0.1", 0, world + 1, True, timeout=datetime.timedelta(seconds=120),
                                 wait_for_workers=False)
            # LOCAL_WORLD_SIZE as torchrun and tdist-agent set it (tdist_torch's async default
            # reads it).
            env = dict(os.environ, TDIST_SHM="0" if tr == "tcp" else "1", OMP_NUM_THREADS="1",
                       LOCAL_WORLD_SIZE=str(world))
            base = [sys.executable, "-u", __file__, "--world", str(world), "--port", str(host.port),
                    "--sizes", a.sizes, "--seconds", str(a.seconds), "--ddp-steps", str(a.ddp_steps)]
            if a.skip_ddp:
                base.append("--skip-ddp")
            procs = [subprocess.Popen(base + ["--rank", str(r), "--transports", tr], env=env)
                     for r in range(world)]
            codes = [q.wait() for q in procs]
            if any(codes):
                sys.exit("ranks exited %s" % codes)
            del host
    sys.exit(0)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import tdist_torch  # noqa: E402

RANK, WORLD = a.rank, a.world
store = dist.TCPStore("127.0.0.1", a.port, WORLD + 1, False, timeout=datetime.timedelta(seconds=120))
dist.init_process_group("tdist", store=store, rank=RANK, world_size=WORLD,
                        timeout=datetime.timedelta(seconds=120))
GLOO = dist.new_group(backend="gloo")
TD = dist.group.WORLD
# The Python group alone (what runs where no C++ group is built for the PyTorch), as a second
# backend name: the default group runs the C++ group when one is loaded.
CPP = tdist_torch.implementation.startswith("cpp")
if CPP:
    def _python_only(store, rank, size, timeout):
        return tdist_torch.ProcessGroupTdist(store, rank, size, timeout)

    try:
        dist.Backend.register_backend("tdistpy", _python_only, devices=["cpu"])
    except TypeError:  # 1.13
        dist.Backend.register_backend("tdistpy", _python_only)
    PYG = dist.new_group(backend="tdistpy")
else:
    PYG = None
torch.set_num_threads(1)
try:
    CPUS = len(os.sched_getaffinity(0))
except (AttributeError, OSError):
    CPUS = os.cpu_count() or 1


def out(s=""):
    if RANK == 0:
        print(s, flush=True)


def iters_for(fn):
    """Iterations that take about a.seconds, agreed by all ranks (the slowest's count). Every
    rank makes the same calls: blocks of 1, 2, 4, ... until the slowest rank's block took 50 ms."""
    n = 1
    while True:
        spent = med_across(timed(fn, n) * n)
        if spent >= 0.05 or n >= 4096:
            return int(min(max(3, a.seconds / (spent / n)), 20000))
        n *= 2


def timed(fn, n):
    dist.barrier(group=GLOO)
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n


def med_across(x):
    """The slowest rank's figure (a collective ends for all when the last rank ends)."""
    t = torch.tensor([x], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=GLOO)
    return t.item()


L = tdist_torch._L
c_allreduce = tdist_torch._BLOCKING["tdist_all_reduce"]
c_allreduce_async = tdist_torch._ASYNC["tdist_all_reduce"]
ASYNC_MIN = tdist_torch.python_group(TD)._async_min
pg_handle = tdist_torch.python_group(TD)._pg

out()
out("tdist_torch: " + tdist_torch.implementation)
if WORLD > 1:
    out("(tdist_torch runs collectives of %s on libtdist's worker thread)"
        % ("no size" if ASYNC_MIN >= tdist_torch._NEVER else ">= %d bytes" % ASYNC_MIN))
if WORLD == 1:
    out("== all_reduce float32 SUM per call from Python, 1 rank: the per-call cost alone ==")
else:
    out("== all_reduce float32 SUM per call from Python, %d ranks, tdist over %s (torch gloo: TCP) =="
        % (WORLD, a.transports))
out("(tdist: the default group, %s; py: the Python group alone; binding: tdist - the C call it makes)"
    % ("the C++ group" if CPP else "the Python group: no C++ group built for this PyTorch"))
out("%10s %9s %9s %9s %10s %9s %10s %10s %10s" % ("size", "tdist us", "py us", "C API us", "C async us", "gloo us",
                                                 "gloo/tdist", "binding us", "py bind us"))
for size in [parse_size(s) for s in a.sizes.split(",")]:
    n = max(size // 4, 1)
    x = torch.ones(n)
    ptr = x.data_ptr()

    def f_td():
        dist.all_reduce(x)

    def f_c():
        st = c_allreduce(pg_handle, ptr, n, 2, 0)
        if st:
            raise RuntimeError(L.tdist_pg_last_error(pg_handle))

    def f_ca():
        w = ctypes.c_void_p()
        st = c_allreduce_async(pg_handle, ptr, n, 2, 0, ctypes.byref(w))
        if st == 0:
            st = L.tdist_work_wait(w, -1)
            L.tdist_work_destroy(w)
        if st:
            raise RuntimeError(L.tdist_pg_last_error(pg_handle))

    def f_gl():
        dist.all_reduce(x, group=GLOO)

    def f_py():
        dist.all_reduce(x, group=PYG)

    k = iters_for(f_td)
    kg = iters_for(f_gl)
    res = {"td": [], "c": [], "ca": [], "gl": [], "py": []}
    for _ in range(3):
        res["td"].append(timed(f_td, k))
        res["c"].append(timed(f_c, k))
        res["ca"].append(timed(f_ca, k))
        res["gl"].append(timed(f_gl, kg))
        res["py"].append(timed(f_py, k) if PYG is not None else 0.0)
    td, c, ca, gl, py = (med_across(statistics.median(res[key])) * 1e6 for key in ("td", "c", "ca", "gl", "py"))
    if PYG is None:
        py = td
    # The binding calls the blocking C function below TDIST_TORCH_ASYNC_BYTES, the _async one
    # (completed on its own thread) from there up: its cost is measured against that call.
    base = c if size < ASYNC_MIN else ca
    out("%10s %9.1f %9.1f %9.1f %10.1f %9.1f %10.2f %10.1f %10.1f" % (human(size), td, py, c, ca, gl, gl / td,
                                                                   td - base, py - base))

if not a.skip_ddp and WORLD > 1:
    def free_comm(state, bucket):
        fut = torch.futures.Future()
        fut.set_result(bucket.buffer())
        return fut

    def tiny():
        return torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 128),
                                   torch.nn.ReLU(), torch.nn.Linear(128, 10))

    def mlp():
        return torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024),
                                   torch.nn.ReLU(), torch.nn.Linear(1024, 10))

    def wide():
        return torch.nn.Sequential(torch.nn.Linear(1024, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 2048),
                                   torch.nn.ReLU(), torch.nn.Linear(2048, 1024), torch.nn.ReLU(),
                                   torch.nn.Linear(1024, 10))

    def conv():
        return torch.nn.Sequential(torch.nn.Conv2d(3, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
                                   torch.nn.Conv2d(32, 64, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
                                   torch.nn.Flatten(), torch.nn.Linear(64 * 8 * 8, 256), torch.nn.ReLU(),
                                   torch.nn.Linear(256, 10))

    out()
    out("== DDP step time on CPU, %d ranks, tdist over %s (median over blocks of back-to-back steps, slowest rank) =="
        % (WORLD, a.transports))
    out("%-34s %9s %6s %9s %9s %9s %9s %9s %10s %10s %10s %10s" % (
        "model, batch per rank", "params", "steps", "no-comm", "free ms", "floor ms", "tdist ms", "gloo ms",
        "tdist/gloo", "floor/gloo", "comm share", "comm ratio"))
    for name, make, shape, batch in (("MLP 64-128-128-10, 16", tiny, (64,), 16),
                                     ("MLP 256-1024-1024-10, 16", mlp, (256,), 16),
                                     ("MLP 256-1024-1024-10, 1", mlp, (256,), 1),
                                     ("MLP 1024-2048-2048-1024-10, 1", wide, (1024,), 1),
                                     ("conv net 3x32x32 (2 conv), 8", conv, (3, 32, 32), 8)):
        torch.manual_seed(0)
        base = make()
        models, optim = {}, {}
        for key, grp in (("td", None), ("gl", GLOO), ("fr", None)):
            m = make()
            m.load_state_dict(base.state_dict())
            models[key] = torch.nn.parallel.DistributedDataParallel(m, process_group=grp)
            optim[key] = torch.optim.SGD(models[key].parameters(), lr=0.01)
        # "fr": free communication. DDP still copies gradients into its buckets, calls the hook
        # per bucket and copies the results back; the hook hands the bucket back at once.
        models["fr"].register_comm_hook(None, free_comm)
        g = torch.Generator().manual_seed(RANK)
        xb = torch.randn((batch,) + shape, generator=g)
        yb = torch.randint(0, 10, (batch,), generator=g)
        times = {"td": [], "gl": [], "nc": [], "fr": []}
        cpu_fr = []

        def step(key):
            optim[key].zero_grad()
            loss = torch.nn.functional.cross_entropy(models[key](xb), yb)
            loss.backward()
            optim[key].step()

        # Steps: at least --ddp-steps, more for cheap models (up to 10 times as many, about 0.5 s
        # of each kind of step), so that a median of sub-millisecond steps is not one burst of
        # the machine's noise. Every rank runs the slowest rank's count. They run back to back
        # as a training loop runs them, in blocks of about 5 ms (at most 10 steps) timed whole:
        # the barrier before a block, which the ranks leave up to tens of microseconds apart,
        # is then paid once a block, not inside every step whose all_reduce waits for the last
        # rank to arrive.
        t0 = time.perf_counter()
        for _ in range(3):
            step("td")
        per = med_across((time.perf_counter() - t0) / 3)
        steps = min(max(a.ddp_steps, int(0.5 / per)), 10 * a.ddp_steps)
        block = max(1, min(10, int(0.005 / per)))
        blocks = max(1, steps // block)
        warm = (3 + block - 1) // block
        for i in range(blocks + warm):
            # "nc": the same step with DDP's gradient all_reduce skipped (no_sync): the compute.
            for key in (("td", "gl", "nc", "fr") if i % 2 == 0 else ("fr", "nc", "gl", "td")):
                dist.barrier(group=GLOO)
                t0 = time.perf_counter()
                c0 = time.process_time()
                for _ in range(block):
                    if key == "nc":
                        with models["td"].no_sync():
                            step("td")
                    else:
                        step(key)
                if i >= warm:
                    times[key].append((time.perf_counter() - t0) / block)
                    if key == "fr":
                        cpu_fr.append((time.process_time() - c0) / block)
        steps = blocks * block
        td, gl, nc, fr = (med_across(statistics.median(times[k])) * 1e3
                          for k in ("td", "gl", "nc", "fr"))
        # The floor: the free step, or where the ranks outnumber the cores, the CPU time of the
        # ranks' free steps summed and spread over the cores (a step ends when every rank's
        # compute has run, on cores the ranks share). No backend's step can go under it.
        cpu = torch.tensor([statistics.median(cpu_fr) * 1e3], dtype=torch.float64)
        dist.all_reduce(cpu, group=GLOO)
        floor = max(fr, cpu.item() / min(WORLD, CPUS))
        nparam = sum(p.numel() for p in base.parameters())
        out("%-34s %9d %6d %9.2f %9.2f %9.2f %9.2f %9.2f %10.2f %10.2f %9.0f%% %10.2f" % (
            name, nparam, steps, nc, fr, floor, td, gl, td / gl, floor / gl, 100.0 * max(gl - nc, 0.0) / gl,
            max(td - fr, 0.0) / max(gl - fr, 1e-9)))
    out("(no-comm: the step under DDP's no_sync(), no gradient all_reduce; free: DDP's bucket work"
        " with an all_reduce that costs nothing; floor: free, or with more ranks than cores the"
        " ranks' CPU time per free step summed over the %d cores, what no backend can go under;"
        " comm share: (gloo - no-comm) / gloo; comm ratio: (tdist - free) / (gloo - free), what"
        " each backend adds to the step)" % CPUS)

dist.barrier(group=GLOO)
dist.destroy_process_group()
