"""Checks the "tdist" PyTorch backend (runtime/torch/tdist_torch) against PyTorch's own gloo.

Run as `backend_check.py WORLD` (a launcher: hosts a TCPStore, starts WORLD ranks of itself and
checks how they exit) or `backend_check.py WORLD PORT RANK` (one rank). Every rank joins one TCPStore and creates:
  - the default group on "tdist" (messages >= 256 KiB run asynchronously),
  - a second "tdist" group with TDIST_TORCH_ASYNC_BYTES=0 (every message asynchronous),
  - a "gloo" group: the reference.
Inputs are random, drawn from a generator seeded by (case, rank), so each rank also knows every
other rank's input and computes an independent local reference in float64. For each collective
x dtype x op (x two sizes, one small and one over 256 KiB) on both tdist groups the result must
equal gloo's on the same inputs where gloo runs that combination, and the local reference
always (exactly for integers and moving ops, within float tolerance for float reductions); every
rank's all_reduce result must be bitwise the same. Then: unsupported combinations raise a clear
error, works and futures behave, DDP on tdist trains like DDP on gloo (same losses within float
tolerance, bitwise identical parameters on every rank), and a rank killed with SIGKILL makes the
others raise within the timeout with a message naming it.
"""

import datetime
import math
import os
import signal
import sys
import time

WORLD = int(sys.argv[1])

if len(sys.argv) == 2:
    import rank_launcher

    # The last rank kills itself with SIGKILL at the end (the failure case).
    rank_launcher.run(__file__, WORLD, 600, want=[0] * (WORLD - 1) + [-signal.SIGKILL])

PORT = int(sys.argv[2])
RANK = int(sys.argv[3])

import warnings  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import tdist_torch  # noqa: E402,F401

warnings.filterwarnings("ignore", message=".*deprecated.*")
TIMEOUT = datetime.timedelta(seconds=20)
V2 = int(torch.__version__.split(".")[0]) >= 2
checked = {"gloo": 0, "local": 0}


def log(msg):
    print("rank %d: %s" % (RANK, msg), flush=True)


def fail(msg):
    log("FAIL: " + msg)
    sys.stdout.flush()
    os._exit(1)


store = dist.TCPStore("127.0.0.1", PORT, WORLD + 1, False, timeout=TIMEOUT)
dist.init_process_group("tdist", store=store, rank=RANK, world_size=WORLD, timeout=TIMEOUT)
if dist.get_backend() != "tdist":
    fail("get_backend() = %r" % dist.get_backend())
TD = dist.group.WORLD
os.environ["TDIST_TORCH_ASYNC_BYTES"] = "0"
TD_ASYNC = dist.new_group(backend="tdist")
del os.environ["TDIST_TORCH_ASYNC_BYTES"]
GLOO = dist.new_group(backend="gloo")
# Which half runs: the test sets TDIST_TORCH_IMPL (cpp: the C++ group built for this PyTorch;
# python: the Python group alone) and both must be what runs.
IMPL = os.environ.get("TDIST_TORCH_IMPL", "auto")
if IMPL in ("cpp", "python") and not tdist_torch.implementation.startswith(IMPL):
    fail("TDIST_TORCH_IMPL=%s but tdist_torch.implementation = %r" % (IMPL, tdist_torch.implementation))
CPP = tdist_torch.implementation.startswith("cpp")
for grp, gname in ((TD, "default"), (TD_ASYNC, "all-async")):
    py_group = tdist_torch.python_group(grp)
    if not isinstance(py_group, tdist_torch.ProcessGroupTdist):
        fail("the %s group's Python half is %s" % (gname, type(py_group).__name__))
    if CPP == (py_group is grp):
        fail("the %s group is %s with tdist_torch.implementation %r" % (gname, type(grp).__name__,
                                                                         tdist_torch.implementation))
log("tdist_torch.implementation: " + tdist_torch.implementation)

FLOATS = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
INTS = [torch.int8, torch.uint8, torch.int32, torch.int64]
R = dist.ReduceOp
OPS = [("SUM", R.SUM), ("PRODUCT", R.PRODUCT), ("MIN", R.MIN), ("MAX", R.MAX), ("AVG", R.AVG),
       ("BAND", R.BAND), ("BOR", R.BOR), ("BXOR", R.BXOR)]
TOL = {torch.float16: (2e-3, 2e-2), torch.bfloat16: (1.6e-2, 1e-1),
       torch.float32: (1e-5, 1e-5), torch.float64: (1e-12, 1e-12)}
SIZES = [7, 70001]  # 70001 float32 = 273 KiB: over the async threshold


def gen(case, rank, n, dtype, opname="SUM"):
    g = torch.Generator().manual_seed(case * 1000 + rank)
    if dtype in FLOATS:
        if opname == "PRODUCT":
            x = torch.rand(n, generator=g, dtype=torch.float64) + 0.5
        else:
            x = torch.randn(n, generator=g, dtype=torch.float64) * 4
        return x.to(dtype)
    lo, hi = {
        ("SUM", torch.int8): (-40, 40), ("SUM", torch.uint8): (0, 80),
        ("AVG", torch.int8): (-40, 40), ("AVG", torch.uint8): (0, 80),
        ("PRODUCT", torch.int8): (-5, 6), ("PRODUCT", torch.uint8): (0, 7),
        ("PRODUCT", torch.int32): (-50, 50), ("PRODUCT", torch.int64): (-1000, 1000),
    }.get((opname, dtype), (-100, 100) if dtype != torch.uint8 else (0, 256))
    if dtype in (torch.int32, torch.int64) and opname in ("SUM", "AVG"):
        lo, hi = -(1 << 28), 1 << 28  # 3 ranks' sum stays inside int32
    if dtype in (torch.int32, torch.int64) and opname in ("MIN", "MAX", "BAND", "BOR", "BXOR"):
        lo, hi = -(1 << 31), 1 << 31
    if dtype == torch.int8 and opname in ("MIN", "MAX", "BAND", "BOR", "BXOR"):
        lo, hi = -128, 128
    return torch.randint(lo, hi, (n,), generator=g, dtype=torch.int64).to(dtype)


def local_reduce(xs, opname, dtype):
    if dtype in FLOATS:
        s = torch.stack([x.double() for x in xs])
        f = {"SUM": lambda: s.sum(0), "PRODUCT": lambda: s.prod(0), "MIN": lambda: s.min(0)[0],
             "MAX": lambda: s.max(0)[0], "AVG": lambda: s.sum(0) / len(xs)}[opname]
        return f()
    s = torch.stack([x.long() for x in xs])
    if opname == "SUM":
        r = s.sum(0)
    elif opname == "PRODUCT":
        r = s.prod(0)
    elif opname == "MIN":
        r = s.min(0)[0]
    elif opname == "MAX":
        r = s.max(0)[0]
    elif opname == "AVG":
        r = torch.div(s.sum(0), len(xs), rounding_mode="trunc")
    else:
        r = s[0].clone()
        for x in s[1:]:
            r = {"BAND": r & x, "BOR": r | x, "BXOR": r ^ x}[opname]
    return r


def same(got, ref, dtype, what):
    if dtype in FLOATS:
        rtol, atol = TOL[dtype]
        ok = torch.allclose(got.double(), ref.double(), rtol=rtol, atol=atol)
    else:
        ok = torch.equal(got.long(), ref.long())
    if not ok:
        bad = (got.double() - ref.double()).abs().argmax().item()
        fail("%s: element %d is %s, expected %s" % (what, bad, got.reshape(-1)[bad].item(),
                                                   ref.reshape(-1)[bad].item()))


def gloo_try(fn):
    """gloo's result, or None where gloo does not run the combination."""
    try:
        return fn()
    except (RuntimeError, ValueError, TypeError):
        return None


def all_same_across_ranks(t, what):
    raw = t.reshape(-1).view(torch.uint8).clone() if t.dtype != torch.bool else t.to(torch.uint8)
    outs = [torch.empty_like(raw) for _ in range(WORLD)]
    dist.all_gather(outs, raw, group=GLOO)
    for r, o in enumerate(outs):
        if not torch.equal(o, raw):
            fail("%s: rank %d's result differs bitwise from rank %d's" % (what, r, RANK))


case = 0


def next_case():
    global case
    case += 1
    return case


def check_reductions():
    for dtype in FLOATS + INTS:
        for opname, op in OPS:
            if opname in ("BAND", "BOR", "BXOR") and dtype in FLOATS:
                continue
            for n in SIZES:
                for grp, gname in ((TD, "tdist"), (TD_ASYNC, "tdist-async")):
                    what = "%s %s %s n=%d" % (gname, dtype, opname, n)
                    # all_reduce
                    c = next_case()
                    xs = [gen(c, r, n, dtype, opname) for r in range(WORLD)]
                    ref = local_reduce(xs, opname, dtype)
                    t = xs[RANK].clone()
                    w = dist.all_reduce(t, op=op, group=grp, async_op=True)
                    w.wait()
                    if not w.is_completed():
                        fail(what + ": work not completed after wait()")
                    same(t, ref, dtype, "all_reduce " + what)
                    checked["local"] += 1
                    all_same_across_ranks(t, "all_reduce " + what)
                    g = xs[RANK].clone()
                    if gloo_try(lambda: dist.all_reduce(g, op=op, group=GLOO) or True):
                        same(t, g, dtype, "all_reduce vs gloo " + what)
                        checked["gloo"] += 1
                    # reduce to a root that changes with the case
                    root = c % WORLD
                    t = xs[RANK].clone()
                    dist.reduce(t, root, op=op, group=grp)
                    if RANK == root:
                        same(t, ref, dtype, "reduce " + what)
                    else:
                        same(t, xs[RANK], dtype, "reduce (non-root input left as it was) " + what)
                    # reduce_scatter: list form and tensor form
                    c = next_case()
                    ins = [[gen(c, r * WORLD + j, n, dtype, opname) for j in range(WORLD)] for r in range(WORLD)]
                    ref = local_reduce([ins[r][RANK] for r in range(WORLD)], opname, dtype)
                    out = torch.empty(n, dtype=dtype)
                    dist.reduce_scatter(out, [x.clone() for x in ins[RANK]], op=op, group=grp)
                    same(out, ref, dtype, "reduce_scatter " + what)
                    out2 = torch.empty(n, dtype=dtype)
                    rs = getattr(dist, "reduce_scatter_tensor", None) or dist._reduce_scatter_base
                    rs(out2, torch.cat(ins[RANK]), op=op, group=grp)
                    same(out2, ref, dtype, "reduce_scatter_tensor " + what)
                    go = torch.empty(n, dtype=dtype)
                    if gloo_try(lambda: dist.reduce_scatter(go, [x.clone() for x in ins[RANK]], op=op, group=GLOO) or True):
                        same(out, go, dtype, "reduce_scatter vs gloo " + what)
                        checked["gloo"] += 1
                    if n == SIZES[0] and grp is TD:
                        # all_reduce_coalesced (DDP's coalesced path): three tensors of this dtype
                        c = next_case()
                        parts = [[gen(c, r * 3 + k, 3 + k, dtype, opname) for k in range(3)] for r in range(WORLD)]
                        mine = [p.clone() for p in parts[RANK]]
                        dist.all_reduce_coalesced(mine, op=op, group=grp)
                        for k in range(3):
                            same(mine[k], local_reduce([parts[r][k] for r in range(WORLD)], opname, dtype),
                                 dtype, "all_reduce_coalesced[%d] %s" % (k, what))


MOVE_DTYPES = FLOATS + INTS + [torch.bool, torch.int16, torch.complex64]


def gen_any(c, r, n, dtype):
    if dtype == torch.bool:
        return gen(c, r, n, torch.int64) > 0
    if dtype == torch.complex64:
        return torch.complex(gen(c, r, n, torch.float32), gen(c + 7, r, n, torch.float32))
    return gen(c, r, n, dtype if dtype != torch.int16 else torch.int32).to(dtype)


def exact(got, ref, what):
    if got.dtype != ref.dtype or not torch.equal(got, ref):
        fail("%s: result differs from the reference" % what)


def check_moves():
    for dtype in MOVE_DTYPES:
        for n in SIZES:
            for grp, gname in ((TD, "tdist"), (TD_ASYNC, "tdist-async")):
                what = "%s %s n=%d" % (gname, dtype, n)
                c = next_case()
                xs = [gen_any(c, r, n, dtype) for r in range(WORLD)]
                root = c % WORLD
                # broadcast, on a non-contiguous view as well
                t = xs[RANK].clone()
                dist.broadcast(t, root, group=grp)
                exact(t, xs[root], "broadcast " + what)
                g = xs[RANK].clone()
                if gloo_try(lambda: dist.broadcast(g, root, group=GLOO) or True):
                    exact(t, g, "broadcast vs gloo " + what)
                    checked["gloo"] += 1
                m = torch.stack([xs[RANK].clone(), xs[RANK].clone()], 1)[:, 1]
                dist.broadcast(m, root, group=grp)
                exact(m, xs[root], "broadcast (strided) " + what)
                # all_gather (list) and all_gather_into_tensor
                outs = [torch.empty(n, dtype=dtype) for _ in range(WORLD)]
                dist.all_gather(outs, xs[RANK], group=grp)
                for r in range(WORLD):
                    exact(outs[r], xs[r], "all_gather[%d] %s" % (r, what))
                flat = torch.empty(n * WORLD, dtype=dtype)
                ag = getattr(dist, "all_gather_into_tensor", None) or dist._all_gather_base
                ag(flat, xs[RANK], group=grp)
                exact(flat, torch.cat(xs), "all_gather_into_tensor " + what)
                # gather and scatter
                gl = [torch.empty(n, dtype=dtype) for _ in range(WORLD)] if RANK == root else None
                dist.gather(xs[RANK], gl, dst=root, group=grp)
                if RANK == root:
                    for r in range(WORLD):
                        exact(gl[r], xs[r], "gather[%d] %s" % (r, what))
                chunks = [gen_any(c + 1, root * WORLD + j, n, dtype) for j in range(WORLD)]
                out = torch.empty(n, dtype=dtype)
                dist.scatter(out, chunks if RANK == root else None, src=root, group=grp)
                exact(out, chunks[RANK], "scatter " + what)
                # all_to_all (list) and all_to_all_single with uneven splits
                blocks = [[gen_any(c + 2, s * WORLD + d, n + d, dtype) for d in range(WORLD)] for s in range(WORLD)]
                outs = [torch.empty(n + RANK, dtype=dtype) for _ in range(WORLD)]
                dist.all_to_all(outs, blocks[RANK], group=grp)
                for s in range(WORLD):
                    exact(outs[s], blocks[s][RANK], "all_to_all[%d] %s" % (s, what))
                in_splits = [1 + (RANK + d) % 3 for d in range(WORLD)]
                out_splits = [1 + (s + RANK) % 3 for s in range(WORLD)]
                rows = [gen_any(c + 3, s, sum(1 + (s + d) % 3 for d in range(WORLD)) * 2, dtype).reshape(-1, 2) for s in range(WORLD)]
                o = torch.empty(sum(out_splits), 2, dtype=dtype)
                dist.all_to_all_single(o, rows[RANK], out_splits, in_splits, group=grp)
                want = []
                for s in range(WORLD):
                    sp = [1 + (s + d) % 3 for d in range(WORLD)]
                    want.append(rows[s][sum(sp[:RANK]):sum(sp[:RANK + 1])])
                exact(o, torch.cat(want), "all_to_all_single " + what)
                # send/recv around a ring
                nxt, prv = (RANK + 1) % WORLD, (RANK - 1) % WORLD
                got = torch.empty(n, dtype=dtype)
                sreq = dist.isend(xs[RANK], nxt, group=grp, tag=5)
                rreq = dist.irecv(got, prv, group=grp, tag=5)
                sreq.wait()
                rreq.wait()
                exact(got, xs[prv], "isend/irecv " + what)
    dist.barrier()
    dist.barrier(group=TD_ASYNC)
    # torch.distributed.monitored_barrier accepts only gloo by name; the group's own method works.
    TD.monitored_barrier(TIMEOUT)


def check_all_gather_coalesced():
    """dist.all_gather_coalesced: output_tensor_lists[r][i] is rank r's input_tensor_list[i]
    (PyTorch's [rank][tensor] layout). As many inputs as ranks (where a [tensor][rank] reading
    returns wrong data without an error), fewer and more than ranks, mixed shapes, a 0-d and an
    empty tensor, a total over the async threshold; against the inputs every rank can compute
    (an independent reference) and against gloo on the same inputs."""
    shapes_cases = [
        [(5,)] * WORLD,
        [(3, 4), (7,)],
        [(2, 3)] * (WORLD + 2),
        [(), (0,), (4, 1, 2)],
        [(70001,), (9,)],  # 280 KiB of float32: the async path on the default group
    ]
    for shapes in shapes_cases:
        for dtype in (torch.float32, torch.int64, torch.bool):
            # The all-async group: float32 (the same code moves bytes for every dtype).
            for grp, gname in ((TD, "tdist"), (TD_ASYNC, "tdist-async"))[: 2 if dtype == torch.float32 else 1]:
                what = "all_gather_coalesced %s %s shapes %s" % (gname, dtype, shapes)
                c = next_case()
                ins = [[gen_any(c, r * 100 + i, max(1, math.prod(sh)), dtype)[: math.prod(sh)].reshape(sh)
                        for i, sh in enumerate(shapes)] for r in range(WORLD)]
                outs = [[torch.full(sh, 7, dtype=dtype) if dtype != torch.bool else torch.zeros(sh, dtype=dtype)
                         for sh in shapes] for _ in range(WORLD)]
                dist.all_gather_coalesced(outs, [x.clone() for x in ins[RANK]], group=grp)
                for r in range(WORLD):
                    for i in range(len(shapes)):
                        exact(outs[r][i], ins[r][i], "%s: output[%d][%d]" % (what, r, i))
                if shapes == shapes_cases[0] and grp is TD:
                    g = [[torch.empty(sh, dtype=dtype) for sh in shapes] for _ in range(WORLD)]
                    if gloo_try(lambda: dist.all_gather_coalesced(g, [x.clone() for x in ins[RANK]], group=GLOO)
                                or True):
                        for r in range(WORLD):
                            for i in range(len(shapes)):
                                exact(outs[r][i], g[r][i], "%s vs gloo: output[%d][%d]" % (what, r, i))
                        checked["gloo"] += 1
                checked["local"] += 1
    # A work whose wait() returns with the outputs filled (async_op; on 2.x a future).
    c = next_case()
    ins = [[gen_any(c, r * 10 + i, 1 << 16, torch.float32) for i in range(WORLD)] for r in range(WORLD)]
    outs = [[torch.empty(1 << 16) for _ in range(WORLD)] for _ in range(WORLD)]
    dist.all_gather_coalesced(outs, ins[RANK], group=TD, async_op=True).wait()
    for r in range(WORLD):
        for i in range(WORLD):
            exact(outs[r][i], ins[r][i], "async all_gather_coalesced output[%d][%d]" % (r, i))
    # A list of lists in the other layout is refused, naming the layout, before anything is sent.
    bad = [[torch.empty(3) for _ in range(WORLD)] for _ in range(WORLD + 1)]
    expect_error((ValueError, RuntimeError), ["output_tensor_lists[rank][tensor]"],
                 lambda: tdist_torch.python_group().allgather_coalesced(bad, [torch.ones(3)] * WORLD),
                 "all_gather_coalesced with [tensor][rank] outputs")
    log("all_gather_coalesced: [rank][tensor] layout checked on %d shape sets" % len(shapes_cases))


def expect_error(exc_types, words, fn, what):
    try:
        fn()
    except exc_types as e:
        for w in words:
            if w not in str(e):
                fail("%s: the error %r does not say %r" % (what, str(e), w))
        return str(e)
    fail("%s: no error" % what)


def check_refusals():
    e = expect_error(TypeError, ["int16", "supported: float16"],
                     lambda: dist.all_reduce(torch.ones(3, dtype=torch.int16)), "all_reduce int16")
    log("refused: " + e)
    expect_error(ValueError, ["BAND", "integer"],
                 lambda: dist.all_reduce(torch.ones(3), op=R.BAND), "BAND on float32")
    if CPP:
        # PyTorch's dispatcher refuses a meta tensor before any group sees it; what reaches the
        # C++ group and is not a contiguous CPU tensor goes to the Python group, which refuses
        # it: a sparse tensor through dist.all_reduce, a meta one through the Python half.
        expect_error(RuntimeError, ["sparse tensors are not supported"],
                     lambda: dist.all_reduce(torch.ones(3).to_sparse()), "a sparse tensor")
        expect_error(RuntimeError, ["meta", "CPU tensors only"],
                     lambda: tdist_torch.python_group().allreduce([torch.ones(3, device="meta")],
                                                                 dist.AllreduceOptions()),
                     "a non-CPU tensor")
    else:
        expect_error(RuntimeError, ["meta", "CPU tensors only"],
                     lambda: dist.all_reduce(torch.ones(3, device="meta")), "a non-CPU tensor")
    if V2:
        expect_error((ValueError, RuntimeError), ["not supported"],
                     lambda: dist.all_reduce(torch.ones(3), op=dist._make_nccl_premul_sum(2.0)),
                     "PREMUL_SUM")
    # The group still works after refusals (they are checked before anything is sent).
    t = torch.ones(4)
    dist.all_reduce(t)
    same(t, torch.full((4,), float(WORLD)), torch.float32, "all_reduce after refusals")


def check_futures():
    t = torch.full((1 << 17,), float(RANK + 1))  # 512 KiB: asynchronous
    w = dist.all_reduce(t, async_op=True)
    fut = w.get_future()
    doubled = fut.then(lambda f: f.value()[0] * 2)
    v = doubled.wait()
    same(v, torch.full((1 << 17,), float(WORLD * (WORLD + 1))), torch.float32, "future.then")
    if not w.is_completed():
        fail("work not completed after its future")
    small = torch.ones(2)
    w = dist.all_reduce(small, async_op=True)
    if not w.get_future().wait()[0].equal(torch.full((2,), float(WORLD))):
        fail("small all_reduce future value")


def check_ddp():
    """DDP on tdist (blocking calls), on the all-async tdist group (DDP's reducer waits on the
    futures of our Python works from C++) and on gloo: the same losses, identical parameters."""
    torch.manual_seed(0)
    base = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    models = {}
    for name, grp in (("tdist", None), ("tdist-async", TD_ASYNC), ("gloo", GLOO)):
        m = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
        m.load_state_dict(base.state_dict())
        models[name] = torch.nn.parallel.DistributedDataParallel(m, process_group=grp, bucket_cap_mb=0.001)
    opts = {k: torch.optim.SGD(v.parameters(), lr=0.05) for k, v in models.items()}
    losses = {k: [] for k in models}
    for step in range(20):
        g = torch.Generator().manual_seed(step * 100 + RANK)
        x, y = torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)
        for k in models:
            opts[k].zero_grad()
            loss = torch.nn.functional.mse_loss(models[k](x), y)
            loss.backward()
            opts[k].step()
            losses[k].append(loss.item())
    for k in ("tdist", "tdist-async"):
        for a, b in zip(losses[k], losses["gloo"]):
            if abs(a - b) > 1e-5 * max(1.0, abs(b)):
                fail("DDP losses differ: %s %s, gloo %s" % (k, losses[k], losses["gloo"]))
        for p in models[k].parameters():
            all_same_across_ranks(p.detach(), "DDP parameter (%s)" % k)
    log("DDP: 20 steps, losses %.5f -> %.5f on tdist, tdist-async and gloo"
        % (losses["tdist"][0], losses["tdist"][-1]))


def check_async_policy():
    """Which collectives run on libtdist's worker thread (tdist_torch._async_min_bytes)."""
    saved = {k: os.environ.pop(k, None) for k in ("TDIST_TORCH_ASYNC_BYTES", "LOCAL_WORLD_SIZE")}
    try:
        cpus = tdist_torch._cpus()
        # send/recv: always async (0), whatever the variables say (issue 32: an irecv on the
        # calling thread deadlocked batch_isend_irecv).
        cases = [({}, (262144, 0)),
                 ({"LOCAL_WORLD_SIZE": str(cpus)}, (tdist_torch._NEVER, 0)),
                 ({"TDIST_TORCH_ASYNC_BYTES": "4096", "LOCAL_WORLD_SIZE": str(cpus)}, (4096, 0))]
        if cpus >= 2:
            cases.append(({"LOCAL_WORLD_SIZE": str(cpus // 2)}, (262144, 0)))
        for env, want in cases:
            os.environ.update(env)
            got = tdist_torch._async_min_bytes()
            for k in env:
                del os.environ[k]
            if got != want:
                fail("async thresholds with %s (%d CPUs): %s, expected %s" % (env, cpus, got, want))
        os.environ["TDIST_TORCH_ASYNC_BYTES"] = "-1"
        expect_error(ValueError, ["TDIST_TORCH_ASYNC_BYTES='-1'", "byte count"], tdist_torch._async_min_bytes,
                     "TDIST_TORCH_ASYNC_BYTES=-1")
        del os.environ["TDIST_TORCH_ASYNC_BYTES"]
    finally:
        for k, v in saved.items():
            if v is not None:
                os.environ[k] = v


def check_device_map():
    """2.x: "cpu:tdist,cuda:nccl" is accepted and CPU tensors run on tdist.
    With the C++ group it is a per-device backend: PyTorch sends each device's tensors to the
    backend mapped to it (no CUDA PyTorch here: "cpu:tdist,cuda:gloo" shows the routing, the CUDA
    device's backend is gloo's, and "cpu:tdist,cuda:nccl" gets as far as PyTorch's own NCCL
    check). With the Python group PyTorch hands every device's tensors to it, so a non-CPU
    tensor is refused with a message saying how to reach nccl (a meta tensor stands in)."""
    if not V2:
        return
    g = torch.Generator().manual_seed(77 + RANK)
    t = torch.randn(1000, generator=g, dtype=torch.float64)
    want = t.clone()
    dist.all_reduce(want, group=GLOO)
    if CPP:
        grp = dist.new_group(backend="cpu:tdist,cuda:gloo")
        cpu_backend = grp._get_backend(torch.device("cpu"))
        cuda_backend = grp._get_backend(torch.device("cuda"))
        tdist_torch.python_group(grp)  # raises unless tdist is the group's CPU backend
        if type(cpu_backend).__name__ != "Group":
            fail("cpu:tdist,cuda:gloo: the CPU backend is %s" % type(cpu_backend).__name__)
        if not isinstance(cuda_backend, dist.ProcessGroupGloo):
            fail("cpu:tdist,cuda:gloo: the CUDA backend is %s" % type(cuda_backend).__name__)
        dist.all_reduce(t, group=grp)
        same(t, want, torch.float64, "all_reduce on cpu:tdist,cuda:gloo")
        if not dist.is_nccl_available():
            e = expect_error(RuntimeError, ["NCCL"], lambda: dist.new_group(backend="cpu:tdist,cuda:nccl"),
                             "cpu:tdist,cuda:nccl without NCCL in this PyTorch")
            log("cpu:tdist,cuda:gloo: CPU tensors run on tdist, CUDA's backend is gloo; "
                "cpu:tdist,cuda:nccl stops at PyTorch's own check: " + e)
        return
    grp = dist.new_group(backend="cpu:tdist,cuda:nccl")
    if not isinstance(grp, tdist_torch.ProcessGroupTdist):
        fail("cpu:tdist,cuda:nccl: the group is %s" % type(grp).__name__)
    dist.all_reduce(t, group=grp)
    same(t, want, torch.float64, "all_reduce on cpu:tdist,cuda:nccl")
    e = expect_error(RuntimeError, ["CPU tensors only", "new_group(backend='nccl')", "cpu:tdist,cuda:nccl"],
                     lambda: dist.all_reduce(torch.ones(3, device="meta"), group=grp),
                     "a non-CPU tensor on cpu:tdist,cuda:nccl")
    log("cpu:tdist,cuda:nccl: CPU tensors run on tdist; others refused: " + e)


def check_peer_death():
    victim = WORLD - 1
    dist.barrier()
    if RANK == victim:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(0.5)
    t0 = time.time()
    e = expect_error(RuntimeError, ["rank %d" % victim], lambda: dist.all_reduce(torch.ones(1 << 10)),
                     "all_reduce with rank %d killed" % victim)
    took = time.time() - t0
    if took > TIMEOUT.total_seconds():
        fail("the error took %.1f s, past the %s timeout" % (took, TIMEOUT))
    log("peer killed: raised in %.2f s: %s" % (took, e))
    # Stay until every survivor has raised: a survivor that exits early is a second failure.
    store.add("raised", 1)
    while store.add("raised", 0) < WORLD - 1:
        time.sleep(0.01)
    # Later calls fail fast too.
    expect_error(RuntimeError, ["rank %d" % victim], lambda: dist.broadcast(torch.ones(2), 0), "after the failure")
    # The all-async group (its own connections) raises from the work's wait(), naming it too.
    expect_error(RuntimeError, ["rank %d" % victim],
                 lambda: dist.all_reduce(torch.ones(1 << 10), group=TD_ASYNC, async_op=True).wait(),
                 "an async all_reduce's wait() with rank %d killed" % victim)


t0 = time.time()
check_reductions()
check_moves()
check_all_gather_coalesced()
check_refusals()
check_futures()
check_ddp()
check_async_policy()
check_device_map()
log("%d cases against gloo, %d against the local reference, in %.1f s (PyTorch %s)"
    % (checked["gloo"], checked["local"], time.time() - t0, torch.__version__))
check_peer_death()
log("PASS")
sys.stdout.flush()
os._exit(0)
