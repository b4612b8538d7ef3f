"""tdist test root (PyTorch 2.6 from Debian 13): make TCPStore's use_libuv default to False.

Debian's python3-torch 2.6 is built without libuv, but TCPStore(...) defaults to use_libuv=True
and PyTorch's own rendezvous code (env://, tcp://, torchrun's c10d and static backends) starts
servers without passing it, which fails with "use_libuv was requested but PyTorch was build
without libuv support". Only the server implementation differs; the client is the same code.

torch is not imported here (that would slow every interpreter start): the class is patched right
after torch.distributed is first imported. An explicit use_libuv=... is passed through unchanged.
"""
import importlib.abc
import importlib.util
import os
import sys

os.environ.setdefault("USE_LIBUV", "0")  # env:// and tcp:// read it


def _patch():
    try:
        from torch._C._distributed_c10d import TCPStore
    except Exception:
        return
    if getattr(TCPStore, "_tdist_no_libuv", False):
        return
    init = TCPStore.__init__

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("use_libuv", False)
        init(self, *args, **kwargs)

    TCPStore.__init__ = __init__
    TCPStore._tdist_no_libuv = True


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "torch.distributed":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        real_exec = loader.exec_module

        def exec_module(module):
            real_exec(module)
            _patch()

        loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _Finder())
