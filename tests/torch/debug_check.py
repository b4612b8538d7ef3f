"""The "tdist" backend where PyTorch looks at it from outside the collectives: the backend's name,
TORCH_DISTRIBUTED_DEBUG=DETAIL, and the wording of timeouts and monitored_barrier failures.

Run as `debug_check.py WORLD` (a launcher: hosts a TCPStore, starts WORLD ranks of itself with
TORCH_DISTRIBUTED_DEBUG=DETAIL, and checks that every rank exits 0) or `debug_check.py WORLD PORT
RANK` (one rank). Each rank, on the default group ("tdist") and on subgroups:
  - names: dist.get_backend(), the group's name() (and its CPU backend's on 2.x) and DDP's
    logging data ("backend_name") all say "tdist", on every group that is tdist alone;
  - DETAIL: creating tdist groups works; on 2.x with the C++ group, PyTorch's
    _ProcessGroupWrapper wraps the backend, its sequence number starts at 0 and every call adds
    one (gloo's semantics), collectives and all_gather_object on a subgroup give the right
    results with random data, DDP trains, and a collective that differs between ranks is
    caught by the wrapper with its own error ("Detected mismatch between collectives");
  - wording (gloo's words first, libtdist's detail naming the rank after them): a barrier past
    its group's timeout matches PyTorch's " (Timed out|closed|timeout) " and names the peer,
    and does not end before the timeout; monitored_barrier with a rank missing says "Rank 1
    failed to pass monitoredBarrier" on rank 0 and "Rank 2 successfully reached monitoredBarrier,
    but received errors while waiting for send/recv from rank 0" on the others,
    wait_all_ranks=True "Ranks 1, 2 failed to pass monitoredBarrier", timeout 0 "Rank 0 timed
    out in monitoredBarrier"; Work.wait(timeout) raises past its timeout and the collective
    still completes.
"""

import datetime
import os
import re
import sys
import time

WORLD = int(sys.argv[1])

if len(sys.argv) == 2:
    import rank_launcher

    # As backend_check.py: a hang fails, load only slows it.
    rank_launcher.run(__file__, WORLD, 600, env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"})

PORT = int(sys.argv[2])
RANK = int(sys.argv[3])

import warnings  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import tdist_torch  # noqa: E402

warnings.filterwarnings("ignore")
V2 = int(torch.__version__.split(".")[0]) >= 2
CPP = tdist_torch.implementation.startswith("cpp")
TIMEOUT = datetime.timedelta(seconds=60)


def log(msg):
    print("rank %d: %s" % (RANK, msg), flush=True)


def fail(msg):
    log("FAIL: " + msg)
    os._exit(1)


def expect_error(words, fn, what):
    """fn must raise RuntimeError (DistBackendError is one) whose text matches every regex."""
    try:
        fn()
    except RuntimeError as e:
        for w in words:
            if not re.search(w, str(e)):
                fail("%s: the error %r does not match %r" % (what, str(e), w))
        return str(e)
    fail("%s: no error" % what)


store = dist.TCPStore("127.0.0.1", PORT, WORLD + 1, False, timeout=TIMEOUT)
dist.init_process_group("tdist", store=store, rank=RANK, world_size=WORLD, timeout=TIMEOUT)
if dist.get_debug_level() != dist.DebugLevel.DETAIL:
    fail("TORCH_DISTRIBUTED_DEBUG=DETAIL is not in effect (debug level %s)" % dist.get_debug_level())
log("tdist_torch.implementation: " + tdist_torch.implementation)


def sync(name):
    """Every rank reaches this point (over the store: the tdist groups may be broken)."""
    store.add("sync/" + name, 1)
    deadline = time.time() + TIMEOUT.total_seconds()
    while store.add("sync/" + name, 0) < WORLD:
        if time.time() > deadline:
            fail("the other ranks did not reach %s in %s" % (name, TIMEOUT))
        time.sleep(0.01)


def wrapped(grp):
    """PyTorch's _ProcessGroupWrapper around the group's CPU backend, or None."""
    if not (V2 and CPP):
        return None  # 1.13, and the Python group on 2.x, are ProcessGroups PyTorch never wraps
    b = grp._get_backend(torch.device("cpu"))
    return b if type(b).__name__ == "_ProcessGroupWrapper" else None


def check_names():
    torch.manual_seed(RANK)
    for grp, gname in ((None, "default"), (dist.new_group(backend="tdist"), "subgroup")):
        g = grp if grp is not None else dist.group.WORLD
        if dist.get_backend(grp) != "tdist":
            fail("%s group: dist.get_backend() = %r" % (gname, dist.get_backend(grp)))
        if hasattr(g, "name") and g.name() != "tdist":
            fail("%s group: name() = %r" % (gname, g.name()))
        if V2 and CPP and g._get_backend(torch.device("cpu")).name() != "tdist":
            fail("%s group: the CPU backend's name() = %r" % (gname, g._get_backend(torch.device("cpu")).name()))
        ddp = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 2), process_group=grp)
        ddp(torch.randn(3, 4)).sum().backward()
        data = ddp._get_ddp_logging_data()
        if data.get("backend_name") != "tdist":
            fail("%s group: DDP's logging data names the backend %r" % (gname, data.get("backend_name")))
    log("names: get_backend, name() and DDP's backend_name say 'tdist'")


def check_detail():
    grp = dist.new_group(backend="tdist")
    w = wrapped(grp)
    if V2 and CPP and w is None:
        fail("2.x with the C++ group under DETAIL: the backend is %s, not PyTorch's _ProcessGroupWrapper"
             % type(grp._get_backend(torch.device("cpu"))).__name__)
    seq = w._get_sequence_number_for_group() if w is not None else None
    if seq not in (None, 0):
        fail("a new group's sequence number is %d, expected 0 (gloo's)" % seq)
    g = torch.Generator().manual_seed(1234)
    xs = [torch.randn(1000, generator=g, dtype=torch.float64) for _ in range(WORLD)]
    def counted(group, fn, what):
        """Runs fn; on the wrapped subgroup, its sequence number must have grown by exactly 1."""
        before = w._get_sequence_number_for_group() if (w is not None and group is grp) else None
        fn()
        if before is not None and w._get_sequence_number_for_group() != before + 1:
            fail("%s under DETAIL: the sequence number went from %d to %d (one call adds one)"
                 % (what, before, w._get_sequence_number_for_group()))

    for group in (None, grp):
        t = xs[RANK].clone()
        counted(group, lambda: dist.all_reduce(t, group=group), "all_reduce")
        if not torch.allclose(t, sum(xs), rtol=1e-12, atol=1e-12):
            fail("all_reduce under DETAIL: wrong result")
        b = xs[RANK].clone()
        counted(group, lambda: dist.broadcast(b, 1 % WORLD, group=group), "broadcast")
        if not torch.equal(b, xs[1 % WORLD]):
            fail("broadcast under DETAIL: wrong result")
        outs = [torch.empty(1000, dtype=torch.float64) for _ in range(WORLD)]
        counted(group, lambda: dist.all_gather(outs, xs[RANK], group=group), "all_gather")
        if any(not torch.equal(o, x) for o, x in zip(outs, xs)):
            fail("all_gather under DETAIL: wrong result")
        lists = [[torch.empty(1000, dtype=torch.float64)] for _ in range(WORLD)]
        counted(group, lambda: dist.all_gather_coalesced(lists, [xs[RANK]], group=group), "all_gather_coalesced")
        if any(not torch.equal(o[0], x) for o, x in zip(lists, xs)):
            fail("all_gather_coalesced under DETAIL: wrong result")
        counted(group, lambda: dist.barrier(group=group), "barrier")
        objs = [None] * WORLD
        dist.all_gather_object(objs, {"rank": RANK, "data": xs[RANK][:3].tolist()}, group=group)
        if objs != [{"rank": r, "data": xs[r][:3].tolist()} for r in range(WORLD)]:
            fail("all_gather_object under DETAIL: %s" % objs)
    ddp = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 4), process_group=grp)
    for step in range(3):
        ddp(torch.randn(5, 8, generator=torch.Generator().manual_seed(step * 10 + RANK))).sum().backward()
    log("DETAIL: collectives, all_gather_object and DDP on tdist groups%s" % (
        "; wrapped by PyTorch's _ProcessGroupWrapper, sequence numbers as gloo's" if w is not None else
        " (PyTorch %s does not wrap this group)" % torch.__version__))
    if w is None:
        return
    # A collective that differs between ranks: the wrapper's check catches it before tdist runs it.
    bad = dist.new_group(backend="tdist")
    t = torch.ones(10)
    e = expect_error([r"Detected mismatch between collectives on ranks"],
                     lambda: dist.all_reduce(t, group=bad) if RANK == 0 else dist.broadcast(t, 0, group=bad),
                     "all_reduce on rank 0, broadcast on the others, under DETAIL")
    log("DETAIL: a mismatched collective is caught: " + e.splitlines()[0][:200])


def check_wording():
    # A barrier past its group's timeout: rank 0 calls it alone.
    to = datetime.timedelta(seconds=5)
    grp = dist.new_group(backend="tdist", timeout=to)
    sync("barrier-timeout-created")
    if RANK == 0:
        t0 = time.time()
        # Straight to tdist's group: under DETAIL, PyTorch's wrapper (where there is one) runs
        # its own gloo monitored barrier first, and that reports the missing ranks in gloo's words.
        e = expect_error([r" (Timed out|closed|timeout) ", r"rank [12]"],
                         lambda: tdist_torch.python_group(grp).barrier().wait(), "a barrier past its timeout")
        if time.time() - t0 < to.total_seconds() - 0.1:
            fail("the barrier raised after %.2f s, before its %s timeout" % (time.time() - t0, to))
        log("barrier timeout: " + e)
    sync("barrier-timeout")
    # monitored_barrier with rank 1 missing.
    grp = dist.new_group(backend="tdist")
    mb = grp.monitored_barrier  # PyTorch's ProcessGroup method (dist.monitored_barrier takes gloo only)
    if RANK == 0:
        e = expect_error([r"Rank 1 failed to pass monitoredBarrier", r"rank.*\b1\b.*did not arrive"],
                         lambda: mb(datetime.timedelta(seconds=2)), "monitored_barrier, rank 1 missing")
        log("monitored_barrier on rank 0: " + e)
    elif RANK != 1:
        e = expect_error([r"Rank %d successfully reached monitoredBarrier, but received errors while waiting "
                          r"for send/recv from rank 0" % RANK, "rank 0"],
                         lambda: mb(datetime.timedelta(seconds=2)), "monitored_barrier on rank %d" % RANK)
        log("monitored_barrier on rank %d: %s" % (RANK, e))
    sync("monitored-1")
    # wait_all_ranks: every missing rank named, in gloo's words.
    grp = dist.new_group(backend="tdist")
    if RANK == 0:
        missing = ", ".join(str(r) for r in range(1, WORLD))
        e = expect_error([r"Ranks %s failed to pass monitoredBarrier" % missing],
                         lambda: grp.monitored_barrier(datetime.timedelta(seconds=1), wait_all_ranks=True),
                         "monitored_barrier(wait_all_ranks=True), ranks %s missing" % missing)
        log("monitored_barrier, wait_all_ranks: " + e)
    sync("monitored-all")
    # A timeout of 0 on rank 0.
    grp = dist.new_group(backend="tdist")
    if RANK == 0:
        e = expect_error([r"Rank 0 timed out in monitoredBarrier"],
                         lambda: grp.monitored_barrier(datetime.timedelta(seconds=0)),
                         "monitored_barrier(timeout=0)")
        log("monitored_barrier, timeout 0: " + e)
    sync("monitored-0")


def check_wait_timeout():
    """Work.wait(timeout) bounds that wait, as gloo's does: rank 0's asynchronous all_reduce
    (512 KiB) waits 1 s for ranks that have not called it yet and raises in gloo's words; the
    work goes on, and once they call it (after rank 0 has raised: no timing involved), wait()
    returns with the right sum. Straight on the tdist group, without DETAIL's wrapper, whose
    checks before the collective would wait for the other ranks."""
    grp = dist.new_group(backend="tdist")
    w = wrapped(grp)
    target = w.wrapped_pg if w is not None else grp
    n = 1 << 17
    t = torch.full((n,), float(RANK + 1))
    if RANK == 0:
        work = target.allreduce([t])
        e = expect_error([r"Timed out waiting 1000ms for all_reduce to complete"],
                         lambda: work.wait(datetime.timedelta(seconds=1)), "wait(timeout=1 s) on rank 0 alone")
        store.set("wait-timeout/raised", "1")
        work.wait()
        log("wait(timeout): " + e)
    else:
        store.wait(["wait-timeout/raised"], TIMEOUT)
        target.allreduce([t]).wait()
    if not torch.equal(t, torch.full((n,), float(WORLD * (WORLD + 1) // 2))):
        fail("the all_reduce that outlived wait()'s timeout: wrong sum")
    sync("wait-timeout")


check_names()
check_detail()
check_wording()
check_wait_timeout()
log("PASS")
sys.stdout.flush()
os._exit(0)
