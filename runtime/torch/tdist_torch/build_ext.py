#!/usr/bin/env python3
"""Builds tdist_torch's C++ process group (_tdist_c.cpp) for the PyTorch this interpreter imports.

    python3 build_ext.py [--out FILE] [--include DIR] [--cxx COMPILER] [--source FILE]

Without it tdist_torch runs every collective through its Python group (about 5 to 10 us more per
call); with it all_reduce and broadcast of a contiguous CPU tensor (dist.all_reduce, DDP's
buckets) run from C++, and on PyTorch 2.x the group is a per-device backend, so a device map such
as "cpu:tdist,cuda:nccl" routes CUDA tensors to NCCL. One build serves one PyTorch version and
one Python: the file is named after both (_tdist_c-torch2.6.0-cpython-313.so) and tdist_torch
loads the one that matches, beside itself, or the file $TDIST_TORCH_EXT names.

Needs a C++17 compiler and the PyTorch C++ headers: a pip wheel of torch has them; Debian's
python3-torch needs libtorch-dev. Nothing of PyTorch's build tooling (setuptools, ninja) is used.
Defaults: the source beside this file, libtdist's headers in ../../include (an installed tree:
PREFIX/python/tdist_torch -> PREFIX/include) or the repository's include/, the output beside this
file. In an image: RUN python3 /opt/tdist/python/tdist_torch/build_ext.py
"""

import argparse
import os
import subprocess
import sys
import sysconfig
import tempfile


def ext_name(torch_version, cache_tag=None):
    """The file name of a build for this PyTorch version (a local suffix such as +cpu dropped)."""
    return "_tdist_c-torch%s-%s.so" % (torch_version.split("+")[0], cache_tag or sys.implementation.cache_tag)


def has_header(cxx, header, dirs):
    """Whether the compiler finds HEADER in its own search path or DIRS (None: the compiler cannot
    run; main's call of it says so)."""
    cmd = [cxx, "-std=c++17", "-E", "-x", "c++", "-", "-o", os.devnull]
    for d in dirs:
        cmd += ["-isystem", d]
    try:
        r = subprocess.run(cmd, input="#include <%s>\n" % header, text=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except OSError:
        return None
    return r.returncode == 0


def main(argv=None):
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--source", default=os.path.join(here, "_tdist_c.cpp"), help="the C++ source (default: beside this file)")
    ap.add_argument("--include", help="the directory holding tdist/tdist.h (default: PREFIX/include or the checkout's include/)")
    ap.add_argument("--out", help="the extension to write (default: beside this file, named for this PyTorch)")
    ap.add_argument("--cxx", default=os.environ.get("CXX", "g++"), help="the C++ compiler (default: $CXX or g++)")
    ap.add_argument("--quiet", action="store_true", help="print only errors")
    a = ap.parse_args(argv)

    try:
        import torch
    except ImportError as e:
        sys.exit("build_ext: this Python (%s) cannot import torch (%s): run it with the Python that runs your training" % (sys.executable, e))
    if not os.path.isfile(a.source):
        sys.exit("build_ext: no source at %s (--source)" % a.source)
    inc = a.include
    if inc is None:
        for cand in (os.path.join(here, "..", "..", "include"), os.path.join(here, "..", "..", "..", "include")):
            if os.path.isfile(os.path.join(cand, "tdist", "tdist.h")):
                inc = os.path.normpath(cand)
                break
        else:
            sys.exit("build_ext: cannot find libtdist's headers (tdist/tdist.h) near %s: pass --include DIR" % here)
    elif not os.path.isfile(os.path.join(inc, "tdist", "tdist.h")):
        sys.exit("build_ext: --include %s has no tdist/tdist.h" % inc)

    tdir = os.path.dirname(torch.__file__)
    tinc = os.path.join(tdir, "include")
    tlib = os.path.join(tdir, "lib")
    if not os.path.isfile(os.path.join(tinc, "torch", "csrc", "distributed", "c10d", "ProcessGroup.hpp")):
        sys.exit(
            "build_ext: PyTorch %s at %s has no C++ headers (%s/torch/csrc/distributed/c10d): install "
            "them (Debian: apt-get install libtorch-dev; pip wheels include them)" % (torch.__version__, tdir, tinc)
        )
    pyinc = sysconfig.get_paths()["include"]
    if has_header(a.cxx, "pybind11/pybind11.h", [tinc, pyinc]) is False:
        sys.exit(
            "build_ext: no pybind11 headers (pybind11/pybind11.h) for %s, which PyTorch's C++ headers "
            "include: install them (Debian: apt-get install pybind11-dev, for python3-torch 1.13 and "
            "2.x alike; pip wheels of torch include them)" % a.cxx
        )
    out = a.out or os.path.join(here, ext_name(torch.__version__))
    cmd = [
        a.cxx, "-O2", "-g0", "-std=c++17", "-fPIC", "-shared", "-fvisibility=hidden", "-w",
        "-DTORCH_EXTENSION_NAME=_tdist_c", "-DTORCH_API_INCLUDE_EXTENSION_H",
        "-D_GLIBCXX_USE_CXX11_ABI=%d" % int(torch._C._GLIBCXX_USE_CXX11_ABI),
    ]
    # pybind11 shares its type registry (torch's Work, options, ProcessGroup) only between modules
    # built with the same ABI tags: take PyTorch's.
    for name in ("COMPILER_TYPE", "STDLIB", "BUILD_ABI"):
        val = getattr(torch._C, "_PYBIND11_" + name, None)
        if val is not None:
            cmd.append('-DPYBIND11_%s="%s"' % (name, val))
    cmd += ["-I", inc, "-isystem", tinc, "-isystem", os.path.join(tinc, "torch", "csrc", "api", "include"),
            "-isystem", pyinc, a.source, "-o", None,
            "-L", tlib, "-Wl,-rpath," + tlib, "-lc10", "-ltorch", "-ltorch_cpu", "-ltorch_python"]
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".build_ext.", suffix=".so", dir=os.path.dirname(os.path.abspath(out)))
    os.close(fd)
    cmd[cmd.index(None)] = tmp
    if not a.quiet:
        print("build_ext: PyTorch %s, Python %s: %s" % (torch.__version__, sys.version.split()[0], out), flush=True)
    try:
        r = subprocess.run(cmd)
    except OSError as e:
        os.unlink(tmp)
        sys.exit("build_ext: cannot run the compiler %s (%s): install g++ or pass --cxx" % (a.cxx, e))
    if r.returncode != 0:
        os.unlink(tmp)
        sys.exit("build_ext: %s exited %d building %s" % (a.cxx, r.returncode, a.source))
    os.chmod(tmp, 0o755)
    os.replace(tmp, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
