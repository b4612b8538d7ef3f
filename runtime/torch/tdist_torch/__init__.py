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
The package's modules, by concern: _lib.py (libtdist through ctypes: prototypes, dtype and op
codes), _store.py (the bridge that hands libtdist a torch Store), _ext.py (the C++ group's
loader), _errors.py (errors in gloo's words), _work.py (async work and the completion thread),
_group.py (ProcessGroupTdist), _register.py (the backend name and python_group). This file keeps
the names users import.
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

# The package's surface: every name it had before its modules were split stays importable
# from tdist_torch (scripts, tests and bench/torch use some of the private ones too).
from torch._C._distributed_c10d import ProcessGroup as _ProcessGroup  # noqa: F401
from torch._C._distributed_c10d import Work as _Work  # noqa: F401
from torch._C._distributed_c10d import _create_work_from_future  # noqa: F401

from tdist_torch._lib import (  # noqa: F401
    _ALL_REDUCE, _ASYNC, _BLOCKING, _CODE_BY_HASH, _DTYPES, _ERR_TIMEOUT, _L, _OK, _RO, _UINT8,
    _PgOptions, _bytes_view, _contig, _error_class, _reduce_dtype, _reduce_op, _sizes, _vp,
    library_path,
)
from tdist_torch._store import _StoreBridge, tcpstore_libuv_fallback  # noqa: F401
from tdist_torch._ext import (  # noqa: F401
    _DEVICE_MAP_NOTE, _EXT, _EXT_FUNCTIONS, _ext_name, _load_ext, _torch_release, implementation,
)
from tdist_torch._errors import (  # noqa: F401
    _detail, _make_error, _monitored_barrier_error, _per_call_ms, _per_call_timeout,
)
from tdist_torch._work import (  # noqa: F401
    _AsyncWork, _CFuture, _NO_DEVICES, _Resources, _completion_loop, _done_work,
)
from tdist_torch._group import (  # noqa: F401
    _ASYNC_DEFAULT, _NEVER, BACKEND, ProcessGroupTdist, _async_min_bytes, _check_tensor, _cpus,
)
from tdist_torch._register import (  # noqa: F401
    _create, _device_map_being_created, _named_group, _register, python_group,
)

__all__ = ["ProcessGroupTdist", "BACKEND", "library_path", "implementation", "python_group"]

_register()
tcpstore_libuv_fallback()
