"""The C++ group (_tdist_c.cpp, built per PyTorch version by build_ext.py beside this file):
found and loaded when built for this PyTorch and Python ($TDIST_TORCH_EXT, else
_tdist_c-torch<version>-<python>.so beside this file), with the libtdist function addresses it is
handed. TDIST_TORCH_IMPL=python never loads it, TDIST_TORCH_IMPL=cpp fails at import without it;
`implementation` says which group runs, and why."""

import ctypes
import importlib.machinery
import importlib.util
import os
import re
import sys

import torch

from tdist_torch._lib import _ALL_REDUCE, _ASYNC, _BLOCKING, _L


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
