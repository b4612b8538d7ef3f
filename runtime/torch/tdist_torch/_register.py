"""Registration of the backend name "tdist" with torch.distributed: the creator PyTorch calls
(the Python group, inside the C++ group where one is loaded, and on 2.x a ProcessGroup named
"tdist"), and python_group, which finds the Python group behind any "tdist" group."""

import datetime
import sys

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import ProcessGroup as _ProcessGroup

from tdist_torch._ext import _EXT
from tdist_torch._group import BACKEND, ProcessGroupTdist


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
