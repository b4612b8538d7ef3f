"""Runs tests of PyTorch's own distributed_test.py (DistributedTest._DistTestBase), one at a time.

    python3 suite_worker.py --world N [--results FILE] [--timeout S]   (tasks on stdin)
    python3 suite_worker.py --world N --list

The suite is imported with BACKEND=gloo, so every test that gloo runs is selected and runs as in
PyTorch's CI (test/distributed/test_distributed_spawn.py: TestDistBackend plus
DistributedTest._DistTestBase, one process per rank, file:// init). Each line on stdin is a
task, "gloo NAME" or "tdist NAME". For a tdist task the groups are created on "tdist" instead:
init_process_group and new_group (and what reaches them, such as new_subgroups) get "tdist"
wherever the suite asks for "gloo". Nothing else of the suite changes, so a test that asserts
gloo's name or gloo's wording fails on tdist. tdist_torch is imported at the first tdist task.

Each test forks its rank processes from this process (torch is imported once; PyTorch's driver
spawns fresh interpreters, a second or more of CPU per rank and test on these machines) and
gets its own TEMP_DIR, init file and MASTER_PORT. Before a test this process writes
{"start": NAME, "backend": B}, after it {"test": NAME, "backend": B, "result":
pass|fail|skip, "secs": S, "detail": ...}, one JSON object a line, flushed, so run_suite.py
knows which test a hang is in. The suite's per-test limit (300 s and more) becomes --timeout: the
suite ends a test whose ranks run longer, and it fails; run_suite.py kills this process past it.

--list prints "# torch VERSION", then the names of the suite's tests, one a line, each with a
tab and the reason it is skipped on this machine whatever the backend (known_skip; empty if
none), and exits.
"""

import argparse
import atexit
import inspect
import io
import json
import os
import random
import shutil
import socket
import sys
import tempfile
import time
import traceback
import unittest

# Which backend the groups of the test in progress are created on ("gloo" or "tdist"); the rank
# processes inherit it (fork).
MODE = {"backend": "gloo"}


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--world", type=int, required=True)
    p.add_argument("--results", help="file to append one JSON line per test to (default stdout)")
    p.add_argument("--timeout", type=float, default=90.0, help="per-test limit in seconds")
    p.add_argument("--list", action="store_true", help="print the suite's test names and exit")
    return p.parse_args()


def free_port():
    """A port free now below the kernel's ephemeral range (where a busy machine's outgoing
    connections cannot take it before the suite's store binds it), for MASTER_PORT."""
    lo = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
    for _ in range(1000):
        port = random.randrange(10000, max(10001, lo))
        with socket.socket() as s:
            try:
                s.bind(("0.0.0.0", port))
            except OSError:
                continue
        return port
    raise RuntimeError("suite_worker: no free port below %d" % lo)


def to_tdist(backend):
    """The backend string a group gets on tdist: "gloo" -> "tdist", also in a device map
    ("cpu:gloo,cuda:nccl"); None (the default group's backend) stays None."""
    if backend is None:
        return None
    parts = []
    for part in str(backend).split(","):
        dev, sep, name = part.rpartition(":")
        parts.append(dev + sep + ("tdist" if name.strip().lower() == "gloo" else name))
    return ",".join(parts)


def redirect(fn):
    """fn (init_process_group, new_group) with its backend argument mapped by to_tdist while
    MODE says tdist."""
    sig = inspect.signature(fn)

    def wrapper(*args, **kwargs):
        if MODE["backend"] != "tdist":
            return fn(*args, **kwargs)
        bound = sig.bind_partial(*args, **kwargs)
        if "backend" in bound.arguments:
            bound.arguments["backend"] = to_tdist(bound.arguments["backend"])
        return fn(*bound.args, **bound.kwargs)

    wrapper.__name__ = fn.__name__
    wrapper.__doc__ = fn.__doc__
    wrapper.__wrapped__ = fn
    return wrapper


_tdist = {}


def install_tdist():
    """Imports tdist_torch (registers "tdist"); returns which half of it runs."""
    if not _tdist:
        import tdist_torch

        _tdist["impl"] = tdist_torch.implementation
    return _tdist["impl"]


def provide_expecttest():
    """PyTorch's test helpers import expecttest (its TestCase is their base class), which
    Debian 12 does not package (Debian 13 does: python3-expecttest). The suite never calls its
    inline-expectation asserts, so without the module a plain unittest.TestCase stands in."""
    try:
        import expecttest  # noqa: F401
    except ImportError:
        import types

        mod = types.ModuleType("expecttest")
        mod.ACCEPT = False

        class TestCase(unittest.TestCase):
            def assertExpectedInline(self, actual, expect, skip=0):
                self.assertEqual(actual, expect)

        mod.TestCase = TestCase
        sys.modules["expecttest"] = mod


def plain_ddp_on_1_13():
    """PyTorch 1.13's suite turns on DDP's experimental ReplicatedTensor mode in every rank,
    which imports torch.distributed._shard; on Debian 12's Python 3.11 that import fails
    ("mutable default ... TensorProperties": a dataclass rule 3.11 enforces), so every DDP test
    failed on gloo too. The ranks run DDP as users do (the mode stays off): a no-op switch."""
    try:
        from torch.nn.parallel import _replicated_tensor_ddp_utils as rt
    except ImportError:  # 2.x has no such mode
        return
    rt._set_ddp_with_replicated_tensor = lambda value: None


def load_suite(args):
    provide_expecttest()
    os.environ["BACKEND"] = "gloo"
    os.environ["WORLD_SIZE"] = str(args.world)
    if not os.environ.get("TEMP_DIR"):  # run_suite.py gives each worker one
        os.environ["TEMP_DIR"] = tempfile.mkdtemp(prefix="tdist-suite-")
        atexit.register(shutil.rmtree, os.environ["TEMP_DIR"], True)
    os.makedirs(os.path.join(os.environ["TEMP_DIR"], "barrier"), exist_ok=True)
    # file:// as in one of PyTorch CI's two runs: the suite's barrier-timeout tests need it.
    os.environ["INIT_METHOD"] = "file://" + os.path.join(os.environ["TEMP_DIR"], "init")
    import torch
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d
    import torch.multiprocessing
    from torch.testing._internal import common_distributed as cd
    from torch.testing._internal.distributed import distributed_test as dt

    plain_ddp_on_1_13()
    # A group's timeout (60 s in the suite) is how long a deadlocked collective hangs before it
    # fails: 30 s is ample for any of the suite's collectives, even on a loaded machine.
    dt.default_pg_timeout = min(dt.default_pg_timeout, 30)
    cd.get_timeout = lambda test_id: args.timeout
    for name in ("init_process_group", "new_group"):
        wrapped = redirect(getattr(c10d, name))
        # The suite calls dist.X; PyTorch's own helpers (new_subgroups, ...) call c10d's global.
        setattr(c10d, name, wrapped)
        setattr(dist, name, wrapped)

    fork = torch.multiprocessing.get_context("fork").Process

    class SuiteTest(dt.TestDistBackend, dt.DistributedTest._DistTestBase):
        def setUp(self):
            super().setUp()
            # Per test: an init file of its own for the tests that init again (INIT_METHOD),
            # a port of its own for env:// (the suite's rendezvous helpers).
            dt.INIT_METHOD = "file://" + os.path.join(os.environ["TEMP_DIR"], "init_method")
            os.environ["MASTER_PORT"] = str(free_port())
            self._start_processes(fork)

    SuiteTest.__name__ = SuiteTest.__qualname__ = "TestDistBackendWithFork"
    return SuiteTest, torch.__version__


def suite_tests(cls):
    return sorted(n for n in dir(cls) if n.startswith("test_") and callable(getattr(cls, n)))


# The suite's decorators that skip a test inside its ranks (sys.exit with a skip code, after each
# rank has created its group), by the name of their wrapper's code. What they test differs
# between versions (skip_if_small_worldsize: world <= 2 on 1.13, < 8 on 2.6), so known_skip
# asks each one itself.
_RANK_SKIPS = ("skip_if_no_gpu", "skip_if_lt_x_gpu", "skip_if_small_worldsize",
               "skip_if_odd_worldsize")


class _Runs(Exception):
    """Raised in place of the test: the decorator would have run it."""


def _decorator_skips(wrapper):
    """Calls a skip decorator's wrapper with the test it wraps replaced by a stand-in (its
    closure cell, for this call only): the wrapper's own check runs, here and now, exactly as
    in a rank (environment: BACKEND, WORLD_SIZE; torch.cuda). Returns the skip's exit code or
    None."""
    inner = getattr(wrapper, "__wrapped__", None)
    cells = [c for c in (wrapper.__closure__ or ()) if c.cell_contents is inner]
    if inner is None or len(cells) != 1:
        return None

    def stand_in(*args, **kwargs):
        raise _Runs()

    cells[0].cell_contents = stand_in
    try:
        wrapper(None)
    except SystemExit as e:
        return e.code
    except _Runs:
        return None
    finally:
        cells[0].cell_contents = inner
    return None


def known_skip(cls, name):
    """Why the test is skipped on this machine whatever the backend, or None: unittest's own
    skip decorators (the suite's sandcastle_skip_if), and the decorators above, which would
    fork the ranks and create their groups only to exit (a second or more a test here). The
    verdict compares neither backend on these, so they are not run."""
    from torch.testing._internal.common_distributed import TEST_SKIPS

    fn = getattr(cls, name)
    if getattr(fn, "__unittest_skip__", False):
        return "skipped by the suite: " + str(getattr(fn, "__unittest_skip_why__", ""))
    while fn is not None:
        code = getattr(fn, "__code__", None)
        deco = getattr(code, "co_qualname", "").split(".<locals>", 1)[0] if code else ""
        if deco in _RANK_SKIPS:
            exit_code = _decorator_skips(fn)
            if exit_code is not None:
                why = [s.message for s in TEST_SKIPS.values() if s.exit_code == exit_code]
                return "skipped by the suite's @%s: %s" % (deco, why[0] if why else exit_code)
        fn = getattr(fn, "__wrapped__", None)
    return None


def run_one(cls, name):
    stream = io.StringIO()
    result = unittest.TextTestRunner(stream=stream, verbosity=0).run(cls(name))
    if result.skipped:
        return "skip", result.skipped[0][1].strip()
    bad = result.errors + result.failures
    bad += [(t, "unexpected success") for t in result.unexpectedSuccesses]
    if bad:
        return "fail", "\n".join(d for _, d in bad)
    return "pass", ""


def main():
    args = parse_args()
    cls, version = load_suite(args)
    names = suite_tests(cls)
    if args.list:
        print("# torch %s" % version)
        for n in names:
            print("%s\t%s" % (n, known_skip(cls, n) or ""))
        return 0
    out = open(args.results, "a") if args.results else sys.stdout

    def emit(obj):
        out.write(json.dumps(obj) + "\n")
        out.flush()

    emit({"worker": os.getpid(), "torch": version})
    for line in sys.stdin:
        if not line.strip():
            continue
        backend, name = line.split()
        emit({"start": name, "backend": backend})
        t0 = time.monotonic()
        try:
            if backend not in ("gloo", "tdist") or name not in names:
                raise ValueError("suite_worker: no task %r on PyTorch %s" % (line.strip(), version))
            MODE["backend"] = backend
            impl = install_tdist() if backend == "tdist" else None
            verdict, detail = run_one(cls, name)
        except Exception:
            verdict, detail, impl = "fail", traceback.format_exc(), None
        emit({"test": name, "backend": backend, "result": verdict, "impl": impl,
              "secs": round(time.monotonic() - t0, 2), "detail": detail[-4000:]})
    return 0


if __name__ == "__main__":
    sys.exit(main())
