"""The PyTorch process-group backend "tdist": torch.distributed collectives run by libtdist.

    import tdist_torch                      # registers the backend name "tdist"
    torch.distributed.init_process_group("tdist")

Everything else in a script stays as it is: env:// under tdist-agent or torchrun, an explicit
store, rank and world size, DDP, new_group. Two halves:
  - a torch ProcessGroup subclass in Python (ProcessGroupTdist) whose collectives call
    libtdist.so through ctypes: it works with any PyTorch it is imported into (1.13, 2.x);
  - a C++ group (_tdist_c.cpp, built per PyTorch version by build_ext.py beside this file) that
    runs all_reduce and broadcast of a contiguous CPU tensor (dist.all_reduce, DDP's buckets)
    from C++ and hands every other call to the Python group over the same libtdist group: about
    5 us less per call, and on 2.x a per-device backend, so "cpu:tdist,cuda:nccl" sends CUDA
    tensors to NCCL.
The C++ group is used when a build for this PyTorch and Python is found ($TDIST_TORCH_EXT, else
_tdist_c-torch<version>-<python>.so beside this file); TDIST_TORCH_IMPL=python never uses it,
TDIST_TORCH_IMPL=cpp fails at import without it. `implementation` says which one runs, and why.
_lib.py beside this file holds the ctypes side: libtdist's prototypes, dtype and op codes, and
the bridge that hands libtdist a torch Store.
libtdist is found at $TDIST_LIBRARY, else beside this package in an installed tree
(PREFIX/python/tdist_torch -> PREFIX/lib/libtdist.so), else by the dynamic linker.

What it runs: CPU tensors only (a CUDA tensor is refused with a RuntimeError saying so; use
"nccl" for those). Reductions (all_reduce, reduce, reduce_scatter) take float16, bfloat16,
float32, float64, int8, uint8, int32 and int64 with SUM, PRODUCT, MIN, MAX, AVG, BAND, BOR and
BXOR (bitwise ops on integer dtypes only); moving ops (broadcast, all_gather, gather, scatter,
all_to_all, send/recv) take any dtype. PREMUL_SUM, recv from any source and per-call timeouts
(the group's timeout, init_process_group's `timeout`, applies) are refused or ignored as noted
on each method. A failure raises RuntimeError (torch.distributed.DistBackendError on 2.x) with
libtdist's message, which names the peer rank; the group is then unusable, as in PyTorch.

Messages of at least TDIST_TORCH_ASYNC_BYTES (default 262144) bytes run on libtdist's worker
thread, so DDP overlaps them with the backward pass: the work's wait() waits in libtdist on the
calling thread, and a future asked for (DDP's communication hooks) is completed from this
module's completion thread. Smaller ones run at once on the calling thread. send/recv always run
on the worker thread, which progresses them in any posting order (batch_isend_irecv with irecv
first). Without the
variable, collectives run on the calling thread when the launcher's LOCAL_WORLD_SIZE is more
than half the CPUs this process may use (no core is free to overlap on). Under
tdist-agent each rank fills its stats file, so /metrics and /status cover PyTorch ranks.
"""

import ctypes
import datetime
import importlib.machinery
import importlib.util
import os
import queue
import re
import sys
import threading
import weakref

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import ProcessGroup as _ProcessGroup
from torch._C._distributed_c10d import Work as _Work
from torch._C._distributed_c10d import _create_work_from_future

from tdist_torch._lib import (  # noqa: F401 - _L and library_path are the package's surface too
    _ALL_REDUCE, _ASYNC, _BLOCKING, _CODE_BY_HASH, _DTYPES, _ERR_TIMEOUT, _L, _OK, _RO, _UINT8,
    _PgOptions,
    _StoreBridge, _bytes_view, _contig, _error_class, _reduce_dtype, _reduce_op, _sizes, _vp,
    library_path, tcpstore_libuv_fallback,
)

__all__ = ["ProcessGroupTdist", "BACKEND", "library_path", "implementation", "python_group"]

BACKEND = "tdist"

# ---------------------------------------------------------------------------------------------
# The C++ group (_tdist_c.cpp): loaded when built for this PyTorch and Python.


def _ext_name():
    # = build_ext.ext_name (not imported: build_ext is a script, run without this package)
    return "_tdist_c-torch%s-%s.so" % (torch.__version__.split("+")[0], sys.implementation.cache_tag)


def _torch_release():
    """torch.__version__'s major.minor.patch ("1.13.0a0" -> "1.13.0", "2.6.0+cpu" -> "2.6.0")."""
    m = re.match(r"(\d+)\.(\d+)\.(\d+)", torch.__version__)
    return ".".join(m.groups()) if m else torch.__version__


def _load_ext():
    """(module or None, what `implementation` says)."""
    mode = os.environ.get("TDIST_TORCH_IMPL", "auto")
    if mode not in ("auto", "cpp", "python"):
        raise ImportError(
            "TDIST_TORCH_IMPL=%r: expected auto (the C++ group when built for this PyTorch, "
            "else Python), cpp or python" % mode
        )
    if mode == "python":
        return None, "python (TDIST_TORCH_IMPL=python)"
    path = os.environ.get("TDIST_TORCH_EXT") or os.path.join(os.path.dirname(os.path.abspath(__file__)), _ext_name())
    why = None
    if not os.path.exists(path):
        why = "no C++ group built for PyTorch %s at %s (build it: python3 %s)" % (
            torch.__version__, path, os.path.join(os.path.dirname(os.path.abspath(__file__)), "build_ext.py"))
    else:
        try:
            loader = importlib.machinery.ExtensionFileLoader("_tdist_c", path)
            spec = importlib.util.spec_from_file_location("_tdist_c", path, loader=loader)
            mod = importlib.util.module_from_spec(spec)
            loader.exec_module(mod)
        except ImportError as e:
            mod, why = None, "cannot load the C++ group %s (%s): rebuild it for this PyTorch with build_ext.py" % (path, e)
        if mod is not None and mod.TORCH_VERSION != _torch_release():
            mod, why = None, "the C++ group %s was built for PyTorch %s, this is %s: rebuild it with build_ext.py" % (
                path, mod.TORCH_VERSION, torch.__version__)
        if mod is not None:
            return mod, "cpp (%s)" % path
    if mode == "cpp":
        raise ImportError("tdist_torch: TDIST_TORCH_IMPL=cpp but " + why)
    return None, "python (" + why + ")"


_EXT, implementation = _load_ext()
# Function addresses handed to the C++ group, in the order of _tdist_c.cpp's struct Api.
_EXT_FUNCTIONS = [
    ctypes.cast(f, ctypes.c_void_p).value
    for f in (_ALL_REDUCE, _ASYNC["tdist_all_reduce"], _BLOCKING["tdist_broadcast"], _ASYNC["tdist_broadcast"],
              _L.tdist_work_wait, _L.tdist_work_test, _L.tdist_work_destroy, _L.tdist_pg_last_error,
              _L.tdist_strerror)
]

def _check_tensor(t, what):
    if isinstance(t, torch.Tensor) and t.is_cpu and not t.is_sparse:
        return  # the common case, in about 0.1 us
    if not isinstance(t, torch.Tensor):
        raise TypeError("tdist %s: expected a torch.Tensor, got %s" % (what, type(t).__name__))
    if t.device.type != "cpu":
        raise RuntimeError(
            "tdist %s: the tensor is on %s; the tdist backend runs collectives on CPU tensors "
            "only. Move it to CPU, or run it on an 'nccl' group (dist.new_group(backend='nccl'))%s"
            % (what, t.device, _DEVICE_MAP_NOTE)
        )
    if t.is_sparse:
        raise RuntimeError("tdist %s: sparse tensors are not supported" % what)


# How a device map reaches nccl, as far as this PyTorch and this build allow.
if _EXT is not None and int(torch.__version__.split(".")[0]) >= 2:
    _DEVICE_MAP_NOTE = ", or create the group with a device map such as 'cpu:tdist,cuda:nccl'"
elif int(torch.__version__.split(".")[0]) >= 2:
    _DEVICE_MAP_NOTE = (
        "; a device map such as 'cpu:tdist,cuda:nccl' does not send it there without the C++ "
        "group (PyTorch gives every device's tensors to a backend written in Python): build it "
        "with build_ext.py beside tdist_torch"
    )
else:
    _DEVICE_MAP_NOTE = ""



# ---------------------------------------------------------------------------------------------
# The process group


_ASYNC_DEFAULT = 262144
_NEVER = 1 << 62


def _cpus():
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _async_min_bytes():
    """(collectives, send/recv): messages at least this large run on libtdist's worker thread.
    send/recv: 0, always (PyTorch cannot tell isend from send, and an irecv that ran on the
    calling thread waited there for its message, so batch_isend_irecv with each rank's irecv
    first deadlocked; libtdist progresses posted sends and receives in any order). Collectives:
    TDIST_TORCH_ASYNC_BYTES, else 262144 unless the launcher says this host runs more ranks
    (LOCAL_WORLD_SIZE) than half its CPUs: then no core is free for the worker thread to overlap
    on, it only takes time from the backward pass (bench/torch: DDP steps up to 20% slower), and
    collectives run on the calling thread."""
    v = os.environ.get("TDIST_TORCH_ASYNC_BYTES")
    if v is not None:
        try:
            n = int(v)
            if n < 0:
                raise ValueError
            return n, 0
        except ValueError:
            raise ValueError(
                "TDIST_TORCH_ASYNC_BYTES=%r: expected a byte count >= 0 (messages at least this "
                "large run asynchronously; default 262144)" % v
            ) from None
    try:
        local = int(os.environ.get("LOCAL_WORLD_SIZE", "0"))
    except ValueError:
        local = 0
    if local > 0 and _cpus() < 2 * local:
        return _NEVER, 0
    return _ASYNC_DEFAULT, 0


def _done_work(result):
    """The Work of a collective that has finished (the blocking path). A C++ Work wrapping a
    completed Future, not a Python Work: C++ callers (DDP's parameter check, broadcast_coalesced)
    wait on works they got from Python after the Python object is gone, and a Python Work's
    overrides are gone with it (the base Work::wait then blocks for ever)."""
    fut = _CFuture(_NO_DEVICES)  # the C++ class: 0.5 us less than torch.futures.Future()
    fut.set_result(result)
    return _create_work_from_future(fut)


_CFuture = torch._C.Future
_NO_DEVICES = []


def _completion_loop(q):
    """Completes the works whose future was asked for (DDP's hooks wait on futures in C++)."""
    while True:
        work = q.get()
        if work is None:
            return
        work._complete()


class _AsyncWork(_Work):
    """A torch Work for a libtdist _async collective. wait() waits in libtdist on the calling
    thread (no hand-off: the C call's own cost plus about a microsecond); get_future() hands the
    work to the group's completion thread, which completes the future when libtdist is done.
    The group holds every one until it has ended (waited for, or its future completed), so a C++
    holder (DDP's reducer, broadcast_coalesced) reaches this object's overrides until then: the
    Python object would otherwise be freed on return to C++ and the base Work::wait would block
    for ever. C++ code in PyTorch waits on a work once (or takes its future once), which ends
    it. Shutdown waits for every unfinished one before the connections close."""

    def __init__(self, res, handle, what, finish, result, keep):
        super().__init__()
        self._res = res
        self._h = handle
        self._what = what
        self._finish = finish
        self._result = result
        self._keep = keep  # buffers libtdist reads or writes until the work ends
        self._lock = threading.RLock()  # a future's callbacks may wait on this work again
        self._exc = None
        self._fut = None
        self._ended = False

    def _settle(self):
        fut, exc = self._fut, self._exc
        if fut is not None:
            if exc is None:
                fut.set_result(self._result)
            else:
                fut.set_exception(exc)

    def _complete(self, release=True):
        """Waits for the work (once; later calls return at once); its exception or None.
        release: the group stops holding this object (wait() and the future, not is_completed(),
        after which C++ may still wait)."""
        with self._lock:
            if self._ended:
                if release:
                    self._res.inflight.pop(id(self), None)
                return self._exc
            st = _L.tdist_work_wait(self._h, -1)
            _L.tdist_work_destroy(self._h)
            self._h = None
            if st != _OK:
                self._exc = _make_error(self._res.pg, self._what, st, self._res.timeout_ms)
            elif self._finish is not None:
                try:
                    self._finish()
                except BaseException as e:  # noqa: B902 - handed to the waiter
                    self._exc = e
            self._ended = True
            self._keep = self._finish = None
            if release:
                self._res.inflight.pop(id(self), None)
            self._settle()
            return self._exc

    def wait(self, timeout=None):
        """Waits and raises the collective's error, naming the peer, if it failed. A timeout
        (timedelta; None or 0: none, as PyTorch's kNoTimeout) bounds this wait as gloo's
        Work.wait does: past it the call raises and the work goes on (wait again for it); the
        group's timeout bounds the collective itself."""
        ms = _per_call_ms(timeout)
        if ms is not None:
            self._wait_for(ms)
        exc = self._complete()
        if exc is not None:
            raise exc
        return True

    def _wait_for(self, ms):
        with self._lock:
            if self._ended or _L.tdist_work_wait(self._h, ms) == _OK:
                return
            done = ctypes.c_int(0)
            _L.tdist_work_test(self._h, ctypes.byref(done))
            if done.value:
                return  # it ended, with its own error: _complete raises that
        raise _per_call_timeout(self._what, ms)

    def is_completed(self):
        if self._ended:
            return True
        if not self._lock.acquire(blocking=False):
            return False  # being waited for elsewhere
        try:
            if self._ended:
                return True
            done = ctypes.c_int(0)
            _L.tdist_work_test(self._h, ctypes.byref(done))
        finally:
            self._lock.release()
        if done.value:
            self._complete(release=False)  # finished: runs the copy-back at once
        return bool(done.value)

    def is_success(self):
        return self.is_completed() and self._exc is None

    def exception(self):
        return self._exc

    def result(self):
        return self._result

    def get_future(self):
        with self._lock:
            if self._fut is None:
                self._fut = torch.futures.Future()
                if self._ended:
                    self._settle()
                    self._res.inflight.pop(id(self), None)  # ended; the future is what is held
                else:
                    self._res.queue.put(self)
            return self._fut


def _per_call_ms(timeout):
    """Work.wait's timeout in ms, or None for none (None, or PyTorch's kNoTimeout: 0)."""
    if timeout is None:
        return None
    ms = int(timeout.total_seconds() * 1000) if isinstance(timeout, datetime.timedelta) else int(timeout)
    return ms if ms > 0 else None


def _per_call_timeout(what, ms):
    return _error_class()(
        "tdist %s: Timed out waiting %dms for %s to complete (the timeout given to wait(); the %s "
        "goes on, and wait() again waits for it)" % (what, ms, what, what))


def _detail(pg_handle, st):
    detail = _L.tdist_pg_last_error(pg_handle) or b""
    return detail.decode(errors="replace") or _L.tdist_strerror(st).decode()


def _make_error(pg_handle, what, st, timeout_ms):
    """The error of a failed call: libtdist's message, which names the peer rank. A timeout says
    gloo's words first ("Timed out waiting ...ms for ..."), so log alerts and tests written for
    gloo's wording match it too (_tdist_c.cpp's Core::error_text says the same)."""
    detail = _detail(pg_handle, st)
    if st == _ERR_TIMEOUT:
        return _error_class()("tdist %s failed: Timed out waiting %dms for %s to complete: %s"
                              % (what, timeout_ms, what, detail))
    return _error_class()("tdist %s failed: %s" % (what, detail))


def _monitored_barrier_error(pg_handle, st, rank, timeout_ms, wait_all_ranks):
    """monitored_barrier's error in gloo's words first (ProcessGroupGloo::monitoredBarrier: what
    PyTorch's tests and users' alerts match), then libtdist's detail, which names the ranks."""
    detail = _detail(pg_handle, st)
    if rank != 0:
        words = ("Rank %d successfully reached monitoredBarrier, but received errors while waiting "
                 "for send/recv from rank 0. Please check rank 0 logs for faulty rank." % rank)
    else:
        m = re.search(r"\(([0-9, ]+)\) did not arrive", detail)
        ranks = [int(x) for x in m.group(1).split(",")] if m else [
            int(x) for x in re.findall(r"\brank (\d+)\b", detail) if int(x) != 0][:1]
        if wait_all_ranks and ranks:
            words = "[Rank 0]: Ranks %s failed to pass monitoredBarrier in %d ms" % (
                ", ".join(str(r) for r in ranks), timeout_ms)
        elif timeout_ms == 0:
            words = "Rank 0 timed out in monitoredBarrier after 0 ms."
        elif ranks:
            words = "[Rank 0]: Rank %d failed to pass monitoredBarrier in %d ms" % (ranks[0], timeout_ms)
        else:
            words = "[Rank 0]: monitoredBarrier failed in %d ms" % timeout_ms
    return _error_class()("%s%s tdist monitored_barrier failed: %s" % (words, "" if words.endswith(".") else ".",
                                                                        detail))


class _Resources:
    """What the C group needs alive; closed by the owner's finalizer, never by a cycle."""

    def __init__(self):
        self.bridge = None
        self.pg = None
        self.queue = None
        self.thread = None
        self.inflight = {}  # id -> _AsyncWork not finished yet
        self.core = None  # the C++ group's share (_tdist_c.Core): its lock and its works
        self.timeout_ms = 0  # the group's: every call's deadline

    def close(self):
        if self.core is not None:
            self.core.close()  # the C++ group's unfinished works end first
        for work in list(self.inflight.values()):
            work._complete()  # libtdist reads and writes their buffers until they end
        if self.thread is not None:
            self.queue.put(None)
            self.thread.join()
            self.thread = None
        if self.pg is not None:
            _L.tdist_pg_finalize(self.pg)
            _L.tdist_pg_destroy(self.pg)
            self.pg = None
        if self.bridge is not None:
            _L.tdist_store_destroy(self.bridge.handle)
            self.bridge = None


class ProcessGroupTdist(_ProcessGroup):
    """A torch.distributed ProcessGroup whose collectives run in libtdist (see the module doc)."""

    def __init__(self, store, rank, size, timeout=datetime.timedelta(minutes=30)):
        super().__init__(rank, size)
        timeout_ms = max(int(timeout.total_seconds() * 1000), 1)
        self._timeout_ms = timeout_ms
        self._async_min, self._p2p_async_min = _async_min_bytes()
        self._lock = threading.Lock()  # libtdist: one thread at a time per group
        res = _Resources()
        res.bridge = _StoreBridge(store, timeout_ms)
        opts = _PgOptions()
        opts.size = ctypes.sizeof(_PgOptions)
        opts.version = 1
        opts.backend = b"gloo"
        opts.store = res.bridge.handle
        opts.rank = rank
        opts.world_size = size
        opts.timeout_ms = timeout_ms
        handle = _vp()
        st = _L.tdist_init_process_group(ctypes.byref(opts), ctypes.byref(handle))
        if st != _OK:
            msg = _L.tdist_last_error().decode(errors="replace")
            exc = res.bridge.last_exc
            res.close()
            raise _error_class()("tdist init_process_group (rank %d of %d): %s" % (rank, size, msg)) from exc
        res.pg = handle
        res.timeout_ms = timeout_ms
        if _EXT is not None:
            # One lock for both halves: libtdist takes one thread at a time per group.
            res.core = _EXT.Core(handle.value, _EXT_FUNCTIONS, self._async_min, timeout_ms)
            self._lock = res.core
        res.queue = queue.Queue()
        res.thread = threading.Thread(
            target=_completion_loop, args=(res.queue,), name="tdist-completion", daemon=True
        )
        res.thread.start()
        self._res = res
        self._pg = handle
        self._finalizer = weakref.finalize(self, res.close)

    # -- plumbing ------------------------------------------------------------------------------

    def getBackendName(self):
        return BACKEND

    def shutdown(self):
        """Waits for queued work, then closes the connections (destroy_process_group does it)."""
        self._finalizer()

    def abort(self):
        _L.tdist_pg_abort(self._pg)

    def _run(self, what, fn, args, nbytes, result, finish=None, keep=None, p2p=False):
        """Runs collective `fn`; returns a Work whose future's value is `result`."""
        if self._res.pg is None:
            raise RuntimeError("tdist %s: the process group was shut down" % what)
        if nbytes < (self._p2p_async_min if p2p else self._async_min):
            with self._lock:
                st = _BLOCKING[fn](self._pg, *args)
            if st != _OK:
                raise _make_error(self._pg, what, st, self._timeout_ms)
            if finish is not None:
                finish()
            return _done_work(result)
        work = _vp()
        with self._lock:
            st = _ASYNC[fn](self._pg, *args, ctypes.byref(work))
        if st != _OK:
            raise _make_error(self._pg, what, st, self._timeout_ms)
        res = self._res
        if len(res.inflight) >= 1024:
            # Works nobody waits for (async ops fired and forgotten) would hold their tensors
            # for ever: end the finished ones.
            for w in list(res.inflight.values()):
                if w.is_completed():
                    res.inflight.pop(id(w), None)
        w = _AsyncWork(res, work, what, finish, result, (args, keep))
        res.inflight[id(w)] = w
        return w

    def _one(self, tensors, what):
        if len(tensors) != 1:
            raise ValueError(
                "tdist %s: expected one tensor per call, got %d (one device per process)"
                % (what, len(tensors))
            )
        _check_tensor(tensors[0], what)
        return tensors[0]

    def _in_place(self, t):
        """(buffer, finish) for an in-place op on t: a contiguous copy is copied back."""
        if t.is_contiguous():
            return t, None
        c = t.contiguous()
        return c, lambda: t.copy_(c)

    # -- reductions ----------------------------------------------------------------------------

    def allreduce(self, tensors, opts=None):
        # The hot path (dist.all_reduce, DDP's buckets): one contiguous CPU tensor, an op its
        # dtype takes, below the async threshold. It is allreduce's general path below with the
        # checks that pass folded together (measured: 1 to 1.5 us of Python less per call).
        if _CODE_BY_HASH and opts is not None and len(tensors) == 1:
            t = tensors[0]
            code = _CODE_BY_HASH.get(hash(opts.reduceOp))
            d = _DTYPES.get(t.dtype) if isinstance(t, torch.Tensor) else None
            if (
                code is not None
                and d is not None
                and (code < 5 or d >= 4)  # BAND, BOR, BXOR: integer dtypes only
                and t.is_cpu
                and not t.is_sparse
                and t.is_contiguous()
            ):
                n = t.numel()
                if n * t.element_size() < self._async_min and self._res.pg is not None:
                    with self._lock:
                        st = _ALL_REDUCE(self._pg, t.data_ptr(), n, d, code)
                    if st != _OK:
                        raise _make_error(self._pg, "all_reduce", st, self._timeout_ms)
                    return _done_work(tensors)
        what = "all_reduce"
        t = self._one(tensors, what)
        op = _reduce_op(opts.reduceOp if opts is not None else _RO.SUM, t.dtype, what)
        d = _reduce_dtype(t, what)
        buf, finish = self._in_place(t)
        return self._run(
            what, "tdist_all_reduce", (buf.data_ptr(), buf.numel(), d, op),
            buf.numel() * buf.element_size(), tensors, finish, buf,
        )

    def allreduce_coalesced(self, tensors, opts=None):
        """One all_reduce over the tensors flattened together (per dtype), as gloo does."""
        what = "all_reduce_coalesced"
        if not tensors:
            return _done_work([])
        for t in tensors:
            _check_tensor(t, what)
        dt = tensors[0].dtype
        if any(t.dtype != dt for t in tensors):
            raise TypeError("tdist %s: all tensors must have one dtype" % what)
        op = _reduce_op(opts.reduceOp if opts is not None else _RO.SUM, dt, what)
        d = _reduce_dtype(tensors[0], what)
        flat = torch.cat([t.reshape(-1) for t in tensors])

        def finish():
            off = 0
            for t in tensors:
                n = t.numel()
                t.copy_(flat[off : off + n].view_as(t))
                off += n

        return self._run(
            what, "tdist_all_reduce", (flat.data_ptr(), flat.numel(), d, op),
            flat.numel() * flat.element_size(), tensors, finish, flat,
        )

    def reduce(self, tensors, opts=None):
        what = "reduce"
        t = self._one(tensors, what)
        op = _reduce_op(opts.reduceOp, t.dtype, what)
        d = _reduce_dtype(t, what)
        root = int(opts.rootRank)
        # libtdist may use a non-root's buffer as scratch; torch leaves it as it was.
        buf = t.contiguous().clone() if root != self.rank() else None
        if buf is None:
            buf, finish = self._in_place(t)
        else:
            finish = None
        return self._run(
            what, "tdist_reduce", (buf.data_ptr(), buf.numel(), d, op, root),
            buf.numel() * buf.element_size(), tensors, finish, buf,
        )

    def _reduce_scatter_into(self, what, out, flat_in, op_opt):
        op = _reduce_op(op_opt, out.dtype, what)
        d = _reduce_dtype(out, what)
        buf, finish = self._in_place(out)
        return self._run(
            what, "tdist_reduce_scatter", (buf.data_ptr(), flat_in.data_ptr(), buf.numel(), d, op),
            flat_in.numel() * flat_in.element_size(), [out], finish, (buf, flat_in),
        )

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        what = "reduce_scatter"
        out = self._one(output_tensors, what)
        if len(input_tensors) != 1 or len(input_tensors[0]) != self.size():
            raise ValueError("tdist %s: expected one list of %d input tensors" % (what, self.size()))
        ins = input_tensors[0]
        for x in ins:
            _check_tensor(x, what)
            if x.numel() != out.numel() or x.dtype != out.dtype:
                raise ValueError(
                    "tdist %s: every input must match the output (%d elements of %s), got %d of %s"
                    % (what, out.numel(), out.dtype, x.numel(), x.dtype)
                )
        flat = torch.cat([x.reshape(-1) for x in ins])
        w = self._reduce_scatter_into(what, out, flat, opts.reduceOp)
        return w

    def _reduce_scatter_base(self, output, input, opts=None):
        what = "reduce_scatter_tensor"
        _check_tensor(output, what)
        _check_tensor(input, what)
        if input.numel() != output.numel() * self.size() or input.dtype != output.dtype:
            raise ValueError(
                "tdist %s: the input must hold world_size (%d) x the output's %d elements of %s, "
                "got %d of %s" % (what, self.size(), output.numel(), output.dtype, input.numel(), input.dtype)
            )
        return self._reduce_scatter_into(what, output, _contig(input), opts.reduceOp)

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=None):
        works = [self._reduce_scatter_base(o, i, opts) for o, i in zip(outputs, inputs)]
        for w in works:
            w.wait()
        return _done_work(outputs)

    # -- moving data ---------------------------------------------------------------------------

    def broadcast(self, tensors, opts=None):
        what = "broadcast"
        t = self._one(tensors, what)
        root = int(opts.rootRank) if opts is not None else 0
        buf, finish = self._in_place(t)
        p, n = _bytes_view(buf)
        return self._run(what, "tdist_broadcast", (p, n, _UINT8, root), n, tensors, finish, buf)

    def _allgather_base(self, output, input, opts=None):
        what = "all_gather_into_tensor"
        _check_tensor(output, what)
        _check_tensor(input, what)
        if output.numel() != input.numel() * self.size() or output.dtype != input.dtype:
            raise ValueError(
                "tdist %s: the output must hold world_size (%d) x the input's %d elements of %s, "
                "got %d of %s" % (what, self.size(), input.numel(), input.dtype, output.numel(), output.dtype)
            )
        inp = _contig(input)
        buf, finish = self._in_place(output)
        p, n = _bytes_view(inp)
        return self._run(
            what, "tdist_all_gather", (buf.data_ptr(), p, n, _UINT8), n * self.size(),
            [output], finish, (buf, inp),
        )

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        works = [self._allgather_base(o, i, opts) for o, i in zip(outputs, inputs)]
        for w in works:
            w.wait()
        return _done_work(outputs)

    def allgather(self, output_tensors, input_tensors, opts=None):
        what = "all_gather"
        inp = _contig(self._one(input_tensors, what))
        if len(output_tensors) != 1 or len(output_tensors[0]) != self.size():
            raise ValueError("tdist %s: expected one list of %d output tensors" % (what, self.size()))
        outs = output_tensors[0]
        for o in outs:
            _check_tensor(o, what)
            if o.dtype != inp.dtype:
                raise TypeError("tdist %s: output %s differs from input %s" % (what, o.dtype, inp.dtype))
        counts = [o.numel() * o.element_size() for o in outs]
        if counts[self.rank()] != inp.numel() * inp.element_size():
            raise ValueError(
                "tdist %s: output %d has %d elements, the input %d"
                % (what, self.rank(), outs[self.rank()].numel(), inp.numel())
            )
        flat = torch.empty(sum(counts), dtype=torch.uint8)
        displs, off = [], 0
        for c in counts:
            displs.append(off)
            off += c
        cs, ds = _sizes(counts), _sizes(displs)

        def finish():
            for o, c, dsp in zip(outs, counts, displs):
                o.copy_(flat[dsp : dsp + c].view(o.dtype).view_as(o))

        return self._run(
            what, "tdist_all_gather_v", (flat.data_ptr(), cs, ds, inp.data_ptr(), _UINT8),
            sum(counts), output_tensors, finish, (flat, inp, cs, ds),
        )

    def allgather_coalesced(self, output_lists, input_list, opts=None):
        """dist.all_gather_coalesced: output_lists[r][i] receives rank r's input_list[i] (PyTorch's
        layout, [rank][tensor], as gloo's AllgatherCoalesced). One all_gather of every input's
        bytes laid end to end; each rank's block is then cut back into its tensors."""
        what = "all_gather_coalesced"
        w = self.size()
        if not input_list:
            raise ValueError("tdist %s: the input tensor list is empty" % what)
        for x in input_list:
            _check_tensor(x, what)
        if len(output_lists) != w:
            raise ValueError(
                "tdist %s: expected one output list per rank (%d), got %d (the layout is "
                "output_tensor_lists[rank][tensor])" % (what, w, len(output_lists))
            )
        for r, outs in enumerate(output_lists):
            if len(outs) != len(input_list):
                raise ValueError(
                    "tdist %s: output list %d holds %d tensors, the input list %d"
                    % (what, r, len(outs), len(input_list))
                )
            for i, (o, x) in enumerate(zip(outs, input_list)):
                _check_tensor(o, what)
                if o.shape != x.shape or o.dtype != x.dtype:
                    raise ValueError(
                        "tdist %s: output_tensor_lists[%d][%d] is %s %s, input_tensor_list[%d] is "
                        "%s %s: they must match" % (what, r, i, o.dtype, tuple(o.shape), i, x.dtype,
                                                     tuple(x.shape))
                    )
        counts = [x.numel() * x.element_size() for x in input_list]
        n = sum(counts)
        flat_in = torch.cat([x.reshape(-1).view(torch.uint8) for x in input_list]) if n else torch.empty(0, dtype=torch.uint8)
        flat_out = torch.empty(n * w, dtype=torch.uint8)

        def finish():
            off = 0
            for outs in output_lists:
                for o, c in zip(outs, counts):
                    o.copy_(flat_out[off : off + c].view(o.dtype).view_as(o))
                    off += c

        return self._run(
            what, "tdist_all_gather", (flat_out.data_ptr(), flat_in.data_ptr(), n, _UINT8), n * w,
            output_lists, finish, (flat_out, flat_in),
        )

    def gather(self, output_tensors, input_tensors, opts=None):
        what = "gather"
        inp = _contig(self._one(input_tensors, what))
        root = int(opts.rootRank)
        p, n = _bytes_view(inp)
        if self.rank() == root:
            if len(output_tensors) != 1 or len(output_tensors[0]) != self.size():
                raise ValueError("tdist %s: the root needs one list of %d output tensors" % (what, self.size()))
            outs = output_tensors[0]
            for o in outs:
                _check_tensor(o, what)
                if o.numel() * o.element_size() != n:
                    raise ValueError("tdist %s: every output must match the input's size" % what)
            flat = torch.empty(n * self.size(), dtype=torch.uint8)

            def finish():
                for i, o in enumerate(outs):
                    o.copy_(flat[i * n : (i + 1) * n].view(o.dtype).view_as(o))

            out_p = flat.data_ptr()
        else:
            if output_tensors and any(len(x) for x in output_tensors):
                raise ValueError("tdist %s: only the root (rank %d) takes output tensors" % (what, root))
            flat, finish, out_p = None, None, None
        return self._run(
            what, "tdist_gather", (out_p, p, n, _UINT8, root), n * self.size(),
            output_tensors, finish, (flat, inp),
        )

    def scatter(self, output_tensors, input_tensors, opts=None):
        what = "scatter"
        out = self._one(output_tensors, what)
        root = int(opts.rootRank)
        buf, finish = self._in_place(out)
        p, n = _bytes_view(buf)
        flat = None
        if self.rank() == root:
            if len(input_tensors) != 1 or len(input_tensors[0]) != self.size():
                raise ValueError("tdist %s: the root needs one list of %d input tensors" % (what, self.size()))
            for x in input_tensors[0]:
                _check_tensor(x, what)
                if x.numel() * x.element_size() != n:
                    raise ValueError("tdist %s: every input must match the output's size" % what)
            flat = torch.cat([x.reshape(-1).view(torch.uint8) for x in input_tensors[0]])
        elif input_tensors and any(len(x) for x in input_tensors):
            raise ValueError("tdist %s: only the root (rank %d) takes input tensors" % (what, root))
        return self._run(
            what, "tdist_scatter", (p, flat.data_ptr() if flat is not None else None, n, _UINT8, root),
            n * self.size(), output_tensors, finish, (buf, flat),
        )

    def _all_to_all_bytes(self, what, out_buf, out_counts, in_buf, in_counts, result, finish, keep):
        def displs(cs):
            d, off = [], 0
            for c in cs:
                d.append(off)
                off += c
            return d

        oc, od = _sizes(out_counts), _sizes(displs(out_counts))
        ic, idd = _sizes(in_counts), _sizes(displs(in_counts))
        return self._run(
            what, "tdist_all_to_all_v", (out_buf.data_ptr(), oc, od, in_buf.data_ptr(), ic, idd, _UINT8),
            sum(in_counts) + sum(out_counts), result, finish, (keep, oc, od, ic, idd),
        )

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        what = "all_to_all_single"
        _check_tensor(output, what)
        _check_tensor(input, what)
        if output.dtype != input.dtype:
            raise TypeError("tdist %s: output %s differs from input %s" % (what, output.dtype, input.dtype))
        w = self.size()

        def rows(t, splits, name):
            per_row = (t.numel() // t.shape[0]) if t.dim() and t.shape[0] else 0
            if not splits:
                if t.dim() == 0 or t.shape[0] % w:
                    raise ValueError(
                        "tdist %s: the %s's first dimension (%s) must divide by world_size %d"
                        % (what, name, tuple(t.shape), w)
                    )
                splits = [t.shape[0] // w] * w
            if len(splits) != w or sum(splits) != (t.shape[0] if t.dim() else 0):
                raise ValueError(
                    "tdist %s: %s split sizes %s must be %d sizes summing to %s"
                    % (what, name, list(splits), w, t.shape[0] if t.dim() else 0)
                )
            return [s * per_row * t.element_size() for s in splits]

        oc = rows(output, list(output_split_sizes), "output")
        ic = rows(input, list(input_split_sizes), "input")
        inp = _contig(input)
        buf, finish = self._in_place(output)
        return self._all_to_all_bytes(what, buf, oc, inp, ic, [output], finish, (buf, inp))

    def alltoall(self, output_tensors, input_tensors, opts=None):
        what = "all_to_all"
        w = self.size()
        if len(output_tensors) != w or len(input_tensors) != w:
            raise ValueError("tdist %s: expected %d output and %d input tensors" % (what, w, w))
        for t in list(output_tensors) + list(input_tensors):
            _check_tensor(t, what)
        ic = [t.numel() * t.element_size() for t in input_tensors]
        oc = [t.numel() * t.element_size() for t in output_tensors]
        inp = torch.cat([t.reshape(-1).view(torch.uint8) for t in input_tensors]) if sum(ic) else torch.empty(0, dtype=torch.uint8)
        flat = torch.empty(sum(oc), dtype=torch.uint8)

        def finish():
            off = 0
            for o, c in zip(output_tensors, oc):
                o.copy_(flat[off : off + c].view(o.dtype).view_as(o))
                off += c

        return self._all_to_all_bytes(what, flat, oc, inp, ic, output_tensors, finish, (flat, inp))

    # -- synchronisation and point-to-point ----------------------------------------------------

    def barrier(self, opts=None):
        return self._run("barrier", "tdist_barrier", (), 0, [])

    def monitored_barrier(self, timeout=None, wait_all_ranks=False):
        """Rank 0 names the ranks that did not arrive within `timeout` (default: the group's),
        in gloo's words ("Rank 1 failed to pass monitoredBarrier"; with wait_all_ranks, every
        such rank: "Ranks 1, 2 failed ..."); the others say they reached it but rank 0 failed."""
        ms = self._timeout_ms if timeout is None else max(int(timeout.total_seconds() * 1000), 0)
        with self._lock:
            st = _L.tdist_monitored_barrier(self._pg, max(ms, 1))
        if st != _OK:
            raise _monitored_barrier_error(self._pg, st, self.rank(), ms, wait_all_ranks)

    def send(self, tensors, dst, tag=0):
        what = "send"
        t = _contig(self._one(tensors, what))
        p, n = _bytes_view(t)
        return self._run(what, "tdist_send", (p, n, _UINT8, int(dst), int(tag)), n, tensors, None, t, p2p=True)

    def recv(self, tensors, src, tag=0):
        what = "recv"
        t = self._one(tensors, what)
        buf, finish = self._in_place(t)
        p, n = _bytes_view(buf)
        return self._run(what, "tdist_recv", (p, n, _UINT8, int(src), int(tag)), n, tensors, finish, buf,
                         p2p=True)

    def recv_anysource(self, tensors, tag=0):
        raise RuntimeError("tdist recv: receiving from any source is not supported; name the source rank")


def _device_map_being_created():
    """{device: backend name} of the group PyTorch 2.x is creating (_new_process_group_helper,
    which calls the backend's creator, holds it in its local `backend_config`), or None where
    that cannot be seen (another PyTorch, or a creator called from elsewhere)."""
    f = sys._getframe(1)
    for _ in range(4):
        if f is None:
            return None
        if f.f_code.co_name == "_new_process_group_helper":
            try:
                return {str(d): str(b) for d, b in f.f_locals["backend_config"].get_device_backend_map().items()}
            except (KeyError, AttributeError, TypeError):
                return None
        f = f.f_back
    return None


def _named_group(group, store, rank, size, timeout, devices):
    """(2.x) A ProcessGroup named "tdist" whose backend for `devices` is the C++ group: what
    PyTorch would build around the backend, but with the name PyTorch reports (DDP's logging
    data, ProcessGroup.name()) instead of "custom". PyTorch wraps a backend it registers in
    _ProcessGroupWrapper under TORCH_DISTRIBUTED_DEBUG=DETAIL and a ProcessGroup returned by a
    creator it does not touch, so the wrapper is made here, as PyTorch makes it."""
    backend = group
    if dist.get_debug_level() == dist.DebugLevel.DETAIL:
        # The wrapper's own gloo group bootstraps under its prefix of this group's store.
        backend = dist.distributed_c10d._create_process_group_wrapper(group, BACKEND, store, rank, size, timeout)
    named = _EXT.NamedGroup(store, rank, size)
    kind = _ProcessGroup.BackendType.CUSTOM
    named._set_default_backend(kind)
    for d in devices:
        named._register_backend(torch.device(d), kind, backend)
    return named


def _create(store, rank, size, timeout=datetime.timedelta(minutes=30)):
    pg = ProcessGroupTdist(store, rank, size, timeout)
    if _EXT is None:
        return pg  # a ProcessGroup (1.13 and 2.x): its getBackendName says "tdist"
    group = _EXT.Group(rank, size, pg._res.core, pg)
    if not hasattr(_EXT, "NamedGroup"):
        return group  # 1.13: the C++ group is the ProcessGroup
    devices = _device_map_being_created()
    if devices is None or set(devices.values()) != {BACKEND}:
        # A device map ("cpu:tdist,cuda:nccl"): PyTorch's ProcessGroup holds every device's
        # backend, and calls itself "custom".
        return group
    return _named_group(group, store, rank, size, timeout, devices)


def python_group(group=None):
    """The ProcessGroupTdist behind a "tdist" group (default: the default group): the group
    itself, the Python half of the C++ group, or the CPU backend of a 2.x ProcessGroup. Its
    _pg is libtdist's group handle. ValueError if the group is not on tdist."""
    g = dist.group.WORLD if group is None else group
    if isinstance(g, ProcessGroupTdist):
        return g
    if _EXT is not None and not isinstance(g, _EXT.Group) and hasattr(g, "_get_backend"):
        try:
            g = g._get_backend(torch.device("cpu"))
        except RuntimeError:
            pass
    wrapped = getattr(g, "wrapped_pg", None)  # TORCH_DISTRIBUTED_DEBUG=DETAIL's _ProcessGroupWrapper
    if wrapped is not None:
        g = wrapped
    if _EXT is not None and isinstance(g, _EXT.Group):
        return g.delegate
    raise ValueError("tdist_torch.python_group: %s is not a tdist group" % type(g).__name__)


def _register():
    if hasattr(dist.Backend, BACKEND.upper()):
        return
    try:
        dist.Backend.register_backend(BACKEND, _create, devices=["cpu"])
    except TypeError:  # PyTorch 1.13: no devices argument
        dist.Backend.register_backend(BACKEND, _create)


_register()
tcpstore_libuv_fallback()
