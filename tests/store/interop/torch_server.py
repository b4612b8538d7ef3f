"""Runs a real PyTorch TCPStore master server (the version of the interpreter running this: 1.13
or 2.x) for the interop tests.

Binds an ephemeral port (`TCPStore("127.0.0.1", 0, is_master=True)`), writes the port number and
a newline to --port-file (tmp file + rename, so readers never see half a number), then idles until
SIGTERM/SIGINT, until its parent dies, or until --max-life-s passes. It creates no keys: with
world_size=None the master adds nothing to `init/`, so the store starts empty (num_keys() == 0).
It must never outlive the test that started it.

On 2.x the server is always the legacy TCPStoreBackend (use_libuv=False, passed explicitly):
Debian's 2.6 has no libuv, and the tests write down the legacy backend's behaviour where the two
differ (reference §1.5).
"""

import argparse
import ctypes
import datetime
import os
import signal
import sys
import time


def die_with_parent():
    # PR_SET_PDEATHSIG = 1: the kernel sends SIGTERM to us when the shell that started us exits.
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM, 0, 0, 0)
    except OSError:
        pass


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port-file", required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--max-life-s", type=float, default=280.0)
    args = ap.parse_args()

    die_with_parent()
    parent = os.getppid()
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    signal.signal(signal.SIGINT, lambda *_: stop.append(1))

    import torch  # slow import: after the signal set-up
    from torch.distributed import TCPStore

    kw = {}
    if int(torch.__version__.split(".")[0]) >= 2:
        kw["use_libuv"] = False
    store = TCPStore(args.host, 0, is_master=True, wait_for_workers=False,
                     timeout=datetime.timedelta(seconds=30), **kw)
    if kw and store.libuvBackend:
        print("torch_server: asked for the legacy backend, got libuv", file=sys.stderr, flush=True)
        os._exit(1)
    tmp = args.port_file + ".tmp"
    with open(tmp, "w") as f:
        f.write("%d\n" % store.port)
    os.rename(tmp, args.port_file)
    print("torch %s TCPStore master (%s backend) listening on port %d" % (
        torch.__version__, "legacy" if kw else "1.13", store.port), file=sys.stderr, flush=True)

    deadline = time.monotonic() + args.max_life_s
    while not stop and time.monotonic() < deadline and os.getppid() == parent:
        time.sleep(0.05)
    print("torch server exiting", file=sys.stderr, flush=True)
    # Skip interpreter teardown: the store's daemon threads make it slow and noisy.
    os._exit(0)


if __name__ == "__main__":
    main()
