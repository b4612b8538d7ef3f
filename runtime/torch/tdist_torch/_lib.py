"""libtdist through ctypes, for tdist_torch's Python group: the library and its prototypes,
and its dtype and reduce-op codes with the checks that choose them. Holds no process-group logic
(_group.py has it), no store (_store.py bridges a torch Store) and never loads the C++ group
(_ext.py does)."""

import ctypes
import os

import torch
import torch.distributed as dist

_OK, _ERR_REMOTE, _ERR_TIMEOUT, _ERR_INTERNAL = 0, -4, -5, -9

# ---------------------------------------------------------------------------------------------
# libtdist


def _find_library():
    tried = []
    env = os.environ.get("TDIST_LIBRARY")
    if env:
        return env, ["$TDIST_LIBRARY=" + env]
    here = os.path.dirname(os.path.abspath(__file__))
    for cand in (
        os.path.join(here, "libtdist.so"),
        os.path.join(os.path.dirname(os.path.dirname(here)), "lib", "libtdist.so"),
    ):
        tried.append(cand)
        if os.path.exists(cand):
            return cand, tried
    tried.append("libtdist.so (dynamic linker search path)")
    return "libtdist.so", tried


def _load():
    path, tried = _find_library()
    try:
        lib = ctypes.CDLL(path)
    except OSError as e:
        raise ImportError(
            "tdist_torch: cannot load libtdist (%s); tried %s. Set TDIST_LIBRARY to the path of "
            "libtdist.so (bazel build //runtime:libtdist.so, or /opt/tdist/lib/libtdist.so in "
            "the image)" % (e, ", ".join(tried))
        ) from None
    return lib, path


_L, library_path = _load()

_vp, _sz, _i, _i64 = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int64
_szp = ctypes.POINTER(ctypes.c_size_t)


class _PgOptions(ctypes.Structure):
    _fields_ = [
        ("size", ctypes.c_size_t),
        ("version", ctypes.c_int),
        ("backend", ctypes.c_char_p),
        ("init_method", ctypes.c_char_p),
        ("store", ctypes.c_void_p),
        ("rank", ctypes.c_int),
        ("world_size", ctypes.c_int),
        ("timeout_ms", ctypes.c_int64),
        ("group_name", ctypes.c_char_p),
        ("socket_ifname", ctypes.c_char_p),
    ]


_REPLY = ctypes.c_void_p
_SET_T = ctypes.CFUNCTYPE(_i, _vp, ctypes.c_char_p, _vp, _sz, _REPLY)
_GET_T = ctypes.CFUNCTYPE(_i, _vp, ctypes.c_char_p, _i64, _REPLY)
_ADD_T = ctypes.CFUNCTYPE(_i, _vp, ctypes.c_char_p, _i64, ctypes.POINTER(_i64), _REPLY)
_WAIT_T = ctypes.CFUNCTYPE(_i, _vp, ctypes.POINTER(ctypes.c_char_p), _sz, _i64, _REPLY)
_CHECK_T = ctypes.CFUNCTYPE(_i, _vp, ctypes.POINTER(ctypes.c_char_p), _sz, ctypes.POINTER(_i), _REPLY)
_DEL_T = ctypes.CFUNCTYPE(_i, _vp, ctypes.c_char_p, ctypes.POINTER(_i), _REPLY)
_NUM_T = ctypes.CFUNCTYPE(_i, _vp, ctypes.POINTER(_i64), _REPLY)
_CAS_T = ctypes.CFUNCTYPE(_i, _vp, ctypes.c_char_p, _vp, _sz, _vp, _sz, _REPLY)
_DESTROY_T = ctypes.CFUNCTYPE(None, _vp)


class _StoreCallbacks(ctypes.Structure):
    _fields_ = [
        ("size", ctypes.c_size_t),
        ("version", ctypes.c_int),
        ("ctx", ctypes.c_void_p),
        ("set", _SET_T),
        ("get", _GET_T),
        ("add", _ADD_T),
        ("wait", _WAIT_T),
        ("check", _CHECK_T),
        ("delete_key", _DEL_T),
        ("num_keys", _NUM_T),
        ("compare_set", _CAS_T),
        ("destroy", _DESTROY_T),
    ]


def _proto(name, res, *args):
    f = getattr(_L, name)
    f.restype, f.argtypes = res, list(args)
    return f


_proto("tdist_last_error", ctypes.c_char_p)
_proto("tdist_strerror", ctypes.c_char_p, _i)
_proto("tdist_pg_last_error", ctypes.c_char_p, _vp)
_proto("tdist_init_process_group", _i, ctypes.POINTER(_PgOptions), ctypes.POINTER(_vp))
_proto("tdist_pg_finalize", _i, _vp)
_proto("tdist_pg_abort", None, _vp)
_proto("tdist_pg_destroy", None, _vp)
_proto("tdist_callback_store_create", _i, ctypes.POINTER(_StoreCallbacks), _i64, ctypes.POINTER(_vp))
_proto("tdist_store_destroy", None, _vp)
_proto("tdist_store_reply_value", _i, _REPLY, ctypes.c_char_p, _sz)
_proto("tdist_store_reply_error", None, _REPLY, ctypes.c_char_p)
_proto("tdist_work_wait", _i, _vp, _i64)
_proto("tdist_work_test", _i, _vp, ctypes.POINTER(_i))
_proto("tdist_work_destroy", None, _vp)

# Collectives: the blocking form's arguments after the group; the _async form adds the work.
_COLL = {
    "tdist_all_reduce": (_vp, _sz, _i, _i),
    "tdist_broadcast": (_vp, _sz, _i, _i),
    "tdist_reduce": (_vp, _sz, _i, _i, _i),
    "tdist_all_gather": (_vp, _vp, _sz, _i),
    "tdist_all_gather_v": (_vp, _szp, _szp, _vp, _i),
    "tdist_gather": (_vp, _vp, _sz, _i, _i),
    "tdist_scatter": (_vp, _vp, _sz, _i, _i),
    "tdist_reduce_scatter": (_vp, _vp, _sz, _i, _i),
    "tdist_all_to_all_v": (_vp, _szp, _szp, _vp, _szp, _szp, _i),
    "tdist_barrier": (),
    "tdist_send": (_vp, _sz, _i, _i, _i),
    "tdist_recv": (_vp, _sz, _i, _i, _i),
}
_BLOCKING, _ASYNC = {}, {}
for _n, _a in _COLL.items():
    _BLOCKING[_n] = _proto(_n, _i, _vp, *_a)
    _ASYNC[_n] = _proto(_n + "_async", _i, _vp, *(_a + (ctypes.POINTER(_vp),)))
_proto("tdist_monitored_barrier", _i, _vp, _i64)
_ALL_REDUCE = _BLOCKING["tdist_all_reduce"]

# ---------------------------------------------------------------------------------------------
# dtypes and reduce ops

_DTYPES = {
    torch.float16: 0,
    torch.bfloat16: 1,
    torch.float32: 2,
    torch.float64: 3,
    torch.int8: 4,
    torch.uint8: 5,
    torch.int32: 6,
    torch.int64: 7,
}
_UINT8 = 5
_INTEGER = {torch.int8, torch.uint8, torch.int32, torch.int64}

_RO = dist.ReduceOp
_OPS = [
    (_RO.SUM, 0, "SUM"),
    (_RO.PRODUCT, 1, "PRODUCT"),
    (_RO.MIN, 2, "MIN"),
    (_RO.MAX, 3, "MAX"),
    (_RO.AVG, 4, "AVG"),
    (_RO.BAND, 5, "BAND"),
    (_RO.BOR, 6, "BOR"),
    (_RO.BXOR, 7, "BXOR"),
]
_SUPPORTED = "float16, bfloat16, float32, float64, int8, uint8, int32, int64"


def _error_class():
    return getattr(dist, "DistBackendError", RuntimeError)


def _op_key(op):
    """The RedOpType's integer of a ReduceOp (opts.reduceOp is a ReduceOp object holding one)."""
    try:
        return int(getattr(op, "op", op))
    except (TypeError, ValueError):
        return None


# RedOpType integer -> (libtdist code, name): one dict lookup per call (comparing ReduceOp
# objects costs about 0.4 to 0.9 us each).
_OP_BY_KEY = {_op_key(ro): (code, name) for ro, code, name in _OPS}
# hash(ReduceOp) -> libtdist code, for allreduce's fast path: PyTorch's ReduceOp hashes to its
# RedOpType's integer (1.13 and 2.x), and hash() costs 0.3 us where reading opts.reduceOp.op
# and looking it up costs 0.7 to 1.4. Checked here for every op; if a PyTorch hashed otherwise
# the fast path would look up nothing and the general path would run.
def _codes_by_hash():
    table = {}
    try:
        opts = dist.AllreduceOptions()
        for ro, code, _name in _OPS:
            opts.reduceOp = ro
            if hash(opts.reduceOp) != _op_key(ro):
                return {}
            table[hash(opts.reduceOp)] = code
    except (TypeError, AttributeError, RuntimeError):
        return {}  # not hashable, or no such options here: the general path runs
    return table


_CODE_BY_HASH = _codes_by_hash()


def _reduce_op(op, dtype, what):
    hit = _OP_BY_KEY.get(_op_key(op))
    if hit is None:
        raise ValueError(
            "tdist %s: ReduceOp %s is not supported by the tdist backend (supported: SUM, PRODUCT, "
            "MIN, MAX, AVG, BAND, BOR, BXOR)" % (what, op)
        )
    code, name = hit
    if code >= 5 and dtype not in _INTEGER:
        raise ValueError("tdist %s: ReduceOp.%s needs an integer tensor, got %s" % (what, name, dtype))
    return code




def _reduce_dtype(t, what):
    d = _DTYPES.get(t.dtype)
    if d is None:
        raise TypeError(
            "tdist %s: %s tensors cannot be reduced by the tdist backend (supported: %s)"
            % (what, t.dtype, _SUPPORTED)
        )
    return d


def _bytes_view(t):
    """A contiguous tensor's storage as uint8 elements: (pointer, count)."""
    return t.data_ptr(), t.numel() * t.element_size()


def _contig(t):
    return t if t.is_contiguous() else t.contiguous()


def _sizes(values):
    return (ctypes.c_size_t * len(values))(*values)
