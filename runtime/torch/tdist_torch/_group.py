"""ProcessGroupTdist: the torch.distributed ProcessGroup whose collectives run in libtdist
(the package's doc says what it runs), with the checks of its tensors and the choice of which
messages run on libtdist's worker thread. Registration (_register.py) makes it, and wraps it in
the C++ group where one is loaded (_ext.py)."""

import ctypes
import datetime
import os
import queue
import threading
import weakref

import torch
from torch._C._distributed_c10d import ProcessGroup as _ProcessGroup

from tdist_torch._errors import _make_error, _monitored_barrier_error
from tdist_torch._ext import _DEVICE_MAP_NOTE, _EXT, _EXT_FUNCTIONS
from tdist_torch._lib import (
    _ALL_REDUCE, _ASYNC, _BLOCKING, _CODE_BY_HASH, _DTYPES, _L, _OK, _RO, _UINT8, _PgOptions,
    _bytes_view, _contig, _error_class, _reduce_dtype, _reduce_op, _sizes, _vp,
)
from tdist_torch._store import _StoreBridge
from tdist_torch._work import _AsyncWork, _completion_loop, _done_work, _Resources

BACKEND = "tdist"


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
