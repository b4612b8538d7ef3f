"""Async work of tdist_torch's Python group: the Work of a finished (blocking) call, the Work
of a libtdist _async collective with its future, the completion thread that completes futures
asked for (DDP's communication hooks), and what a group holds alive until it closes."""

import ctypes
import threading

import torch
from torch._C._distributed_c10d import Work as _Work
from torch._C._distributed_c10d import _create_work_from_future

from tdist_torch._errors import _make_error, _per_call_ms, _per_call_timeout
from tdist_torch._lib import _L, _OK


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
