"""A torch Store as a libtdist store (a callback store whose operations call the torch Store),
and the TCPStore fallback for a PyTorch built without libuv. Holds no process-group logic."""

import ctypes
import datetime

import torch

from tdist_torch._lib import (
    _ADD_T, _CAS_T, _CHECK_T, _DEL_T, _ERR_REMOTE, _ERR_TIMEOUT, _GET_T, _L, _NUM_T, _OK, _SET_T,
    _WAIT_T, _StoreCallbacks, _vp,
)


def _timedelta_ms(ms):
    return datetime.timedelta(milliseconds=max(int(ms), 1))


class _StoreBridge:
    """A libtdist callback store whose operations call a torch Store."""

    def __init__(self, store, timeout_ms):
        self.store = store
        self.last_exc = None
        cb = _StoreCallbacks()
        cb.size = ctypes.sizeof(_StoreCallbacks)
        cb.version = 1
        cb.set = _SET_T(self._set)
        cb.get = _GET_T(self._get)
        cb.add = _ADD_T(self._add)
        cb.wait = _WAIT_T(self._wait)
        cb.check = _CHECK_T(self._check)
        cb.delete_key = _DEL_T(self._delete)
        cb.num_keys = _NUM_T(self._num_keys)
        cb.compare_set = _CAS_T(self._compare_set)
        self.cb = cb  # the function objects must live as long as the C store
        handle = _vp()
        st = _L.tdist_callback_store_create(ctypes.byref(cb), int(timeout_ms), ctypes.byref(handle))
        if st != _OK:
            raise RuntimeError("tdist: " + _L.tdist_last_error().decode(errors="replace"))
        self.handle = handle

    def _fail(self, reply, e):
        self.last_exc = e
        text = "%s: %s" % (type(e).__name__, e)
        _L.tdist_store_reply_error(reply, text.encode(errors="replace")[:500])
        low = str(e).lower()
        return _ERR_TIMEOUT if "timeout" in low or "timed out" in low else _ERR_REMOTE

    @staticmethod
    def _key(k):
        return k.decode("utf-8", "surrogateescape")

    def _set(self, ctx, key, value, n, reply):
        try:
            self.store.set(self._key(key), ctypes.string_at(value, n) if n else b"")
            return _OK
        except BaseException as e:  # noqa: B902 - a C caller cannot take an exception
            return self._fail(reply, e)

    def _get(self, ctx, key, timeout_ms, reply):
        try:
            k = self._key(key)
            self.store.wait([k], _timedelta_ms(timeout_ms))
            v = self.store.get(k)
            return _L.tdist_store_reply_value(reply, v, len(v))
        except BaseException as e:  # noqa: B902
            return self._fail(reply, e)

    def _add(self, ctx, key, delta, result, reply):
        try:
            result[0] = int(self.store.add(self._key(key), int(delta)))
            return _OK
        except BaseException as e:  # noqa: B902
            return self._fail(reply, e)

    def _wait(self, ctx, keys, n, timeout_ms, reply):
        try:
            self.store.wait([self._key(keys[i]) for i in range(n)], _timedelta_ms(timeout_ms))
            return _OK
        except BaseException as e:  # noqa: B902
            return self._fail(reply, e)

    def _check(self, ctx, keys, n, ready, reply):
        try:
            ready[0] = 1 if self.store.check([self._key(keys[i]) for i in range(n)]) else 0
            return _OK
        except BaseException as e:  # noqa: B902
            return self._fail(reply, e)

    def _delete(self, ctx, key, deleted, reply):
        try:
            deleted[0] = 1 if self.store.delete_key(self._key(key)) else 0
            return _OK
        except BaseException as e:  # noqa: B902
            return self._fail(reply, e)

    def _num_keys(self, ctx, n, reply):
        try:
            n[0] = int(self.store.num_keys())
            return _OK
        except BaseException as e:  # noqa: B902
            return self._fail(reply, e)

    def _compare_set(self, ctx, key, exp, en, des, dn, reply):
        try:
            v = self.store.compare_set(
                self._key(key),
                ctypes.string_at(exp, en) if en else b"",
                ctypes.string_at(des, dn) if dn else b"",
            )
            return _L.tdist_store_reply_value(reply, v, len(v))
        except BaseException as e:  # noqa: B902
            return self._fail(reply, e)


def tcpstore_libuv_fallback():
    """Where this PyTorch is built without libuv (Debian's 2.x) a TCPStore made without use_libuv
    falls back to the other implementation instead of failing.

    TCPStore(...) asks for libuv by default, and PyTorch's own rendezvous passes nothing (env://
    with the agent's store: every rank is a client), so a job under tdist-agent or torchrun failed
    in init_process_group with "use_libuv was requested but PyTorch was build without libuv
    support". The client is the same code either way; an explicit use_libuv=True still fails."""
    cls = getattr(torch._C._distributed_c10d, "TCPStore", None)
    if cls is None or getattr(cls, "_tdist_libuv_fallback", False):
        return
    init = cls.__init__

    def __init__(self, *args, **kwargs):
        try:
            init(self, *args, **kwargs)
        except RuntimeError as e:
            if "use_libuv" in kwargs or "without libuv support" not in str(e):
                raise
            init(self, *args, use_libuv=False, **kwargs)

    cls.__init__ = __init__
    cls._tdist_libuv_fallback = True
