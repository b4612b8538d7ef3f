"""tdist-agent's sitecustomize: lets the agent take the Python stacks of every thread of a worker
without stopping it (docs/agent.md, "Python stacks").

tdist-agent writes this file into its run directory and puts that directory first on the workers'
PYTHONPATH. At interpreter start-up it:
  1. if TDIST_PY_STACKS_FILE and TDIST_PY_STACKS_SIGNAL are set (the agent sets them for each
     worker; absent: it does nothing here), opens that file for appending and registers
     faulthandler for that signal (all threads, chain=False): on the signal, CPython's C handler
     writes every thread's stack to the file, even while the main thread is blocked in C (a
     collective) or spinning in Python. Both variables are then removed from os.environ, so the
     worker's own child processes (data loaders, a nested launcher) never write to the rank's file;
  2. runs the next sitecustomize on sys.path (a user's, or the distribution's), as Python would have
     without this one.
It must never fail the interpreter's start: a registration problem is reported on stderr once.
"""
import os
import sys


def _tdist_register():
    path = os.environ.pop("TDIST_PY_STACKS_FILE", None)
    sig = os.environ.pop("TDIST_PY_STACKS_SIGNAL", None)
    if not path or not sig:
        return
    try:
        import _signal
        import faulthandler

        f = open(path, "a", buffering=1)  # faulthandler keeps a reference: open for life
        # faulthandler puts back the handler it found when the interpreter finalizes: make that
        # "ignore", so a signal that arrives while the worker exits cannot kill it (a real-time
        # signal's default action is to terminate).
        _signal.signal(int(sig), _signal.SIG_IGN)
        faulthandler.register(int(sig), file=f, all_threads=True, chain=False)
        # faulthandler installs its handler without SA_RESTART: a blocking call of a library
        # that does not retry on EINTR would fail when the agent asks for the stacks.
        _signal.siginterrupt(int(sig), False)
        f.write("tdist: pid %d registered signal %s\n" % (os.getpid(), sig))
    except Exception as e:  # never stop the worker for this
        print("tdist sitecustomize: Python stacks not available: %r" % (e,), file=sys.stderr)


def _tdist_chain():
    here = os.path.dirname(os.path.realpath(__file__))
    rest = []
    seen = False
    for p in sys.path:
        if not seen and os.path.realpath(p or ".") == here:
            seen = True
            continue
        if seen:
            rest.append(p)
    # importlib.machinery only (frozen, loaded already): importlib.util would import contextlib
    # and collections, tens of milliseconds on a busy machine, into every interpreter.
    import importlib.machinery

    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
        return
    mod = type(sys)(spec.name)
    mod.__spec__, mod.__loader__, mod.__file__ = spec, spec.loader, spec.origin
    sys.modules["sitecustomize"] = mod
    spec.loader.exec_module(mod)  # its errors are reported by site.py, as without us


_tdist_register()
_tdist_chain()
