"""Many PyTorch client processes (1.13 or 2.x: whichever runs this) hammering one TCPStore server
at once.

Phase "add": N forked processes, each with its own TCPStore, start together (a barrier on the
store) and add random deltas to a few shared keys. The final totals must equal the sum computed
here independently from the seed; on keys that only get positive deltas every reply must be
distinct and chain back to 0 (each add saw exactly the previous state: no lost or torn update).

Phase "wait": N forked processes block in wait(["rel/go"]); a single set releases them. Every one
must return after the set and promptly (well within the store timeout).

Workers are forked before the parent creates any TCPStore, so they inherit no store threads or
sockets. Exit status 0 all checks passed, 1 a check failed, 3 watchdog fired.
"""

import argparse
import datetime
import json
import os
import random
import sys
import threading
import time
import warnings

STORE_TIMEOUT_S = 30
POS_KEYS = ["conc/a", "conc/b", "conc/c"]
SIGNED_KEY = "conc/signed"


def worker_plan(seed, i, adds):
    """The (key, delta) list of worker i: computed identically by the worker and the checker."""
    rng = random.Random(seed * 7919 + i)
    plan = []
    for _ in range(adds):
        if rng.random() < 0.25:
            plan.append((SIGNED_KEY, rng.randrange(-10 ** 12, 10 ** 12)))
        else:
            plan.append((rng.choice(POS_KEYS), rng.randrange(1, 10 ** 6)))
    return plan


ALL_PIDS = []


def fork_workers(n, fn, gate=None, close_in_child=()):
    """Forks n workers running fn(i). With a gate (the read end of a pipe) they first block until
    the parent writes to or closes the pipe."""
    import select
    pids = []
    for i in range(n):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                for fd in close_in_child:
                    os.close(fd)
                if gate is not None:
                    ready, _, _ = select.select([gate], [], [], 90)
                    if not ready or os.read(gate, 1) != b"g":
                        os._exit(4)
                code = fn(i)
            except BaseException as e:  # report, never return into the parent's code
                print("worker %d: %r" % (i, e), file=sys.stderr, flush=True)
            os._exit(code)
        pids.append(pid)
        ALL_PIDS.append(pid)
    return pids


def reap(pids, timeout_s):
    """Returns {pid: exit code or 'timeout'}; kills stragglers."""
    left, codes = set(pids), {}
    deadline = time.monotonic() + timeout_s
    while left and time.monotonic() < deadline:
        for pid in list(left):
            got, status = os.waitpid(pid, os.WNOHANG)
            if got:
                codes[pid] = os.waitstatus_to_exitcode(status)
                left.discard(pid)
        time.sleep(0.02)
    for pid in left:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        codes[pid] = "timeout"
    return codes


def wait_counter(store, key, n, timeout_s):
    deadline = time.monotonic() + timeout_s
    v = 0
    while time.monotonic() < deadline:
        v = store.add(key, 0)
        if v >= n:
            return v
        time.sleep(0.02)
    return v


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--workers", type=int, default=32)
    ap.add_argument("--adds", type=int, default=40)
    ap.add_argument("--tmp", required=True)
    ap.add_argument("--label", default="server")
    args = ap.parse_args()

    wd = threading.Timer(100, lambda: (print("FAIL: watchdog (%s, seed %d)" % (
        args.label, args.seed), file=sys.stderr, flush=True), os._exit(3)))
    wd.daemon = True
    wd.start()

    import torch  # noqa: F401  (imported once, before forking)
    # Python >= 3.12 warns on fork() with other threads alive; the only other thread here is the
    # watchdog timer, which the children neither inherit nor need.
    warnings.filterwarnings("ignore", r"This process .* is multi-threaded", DeprecationWarning)
    from torch.distributed import TCPStore
    td = datetime.timedelta(seconds=STORE_TIMEOUT_S)
    n = args.workers
    failures = []

    def waiter(i):
        s = TCPStore(args.host, args.port, timeout=td)
        s.add("rel/ready", 1)
        t_in = time.monotonic()
        s.wait(["rel/go"])
        t_out = time.monotonic()
        v = s.get("rel/go")
        with open(os.path.join(args.tmp, "waiter.%d.json" % i), "w") as f:
            json.dump([t_in, t_out, v.decode()], f)
        return 0

    # ---- phase "add" ----
    def adder(i):
        s = TCPStore(args.host, args.port, timeout=td)
        s.add("conc/ready", 1)
        s.wait(["conc/go"])
        out = [(k, d, s.add(k, d)) for k, d in worker_plan(args.seed, i, args.adds)]
        with open(os.path.join(args.tmp, "adder.%d.json" % i), "w") as f:
            json.dump(out, f)
        return 0

    # Every worker is forked before this process creates a TCPStore (no inherited store state);
    # the waiters sleep on a pipe until phase "wait".
    gate_r, gate_w = os.pipe()
    waiter_pids = fork_workers(n, waiter, gate_r, close_in_child=(gate_w,))
    os.close(gate_r)
    t0 = time.monotonic()
    pids = fork_workers(n, adder, close_in_child=(gate_w,))
    store = TCPStore(args.host, args.port, timeout=td)
    ready = wait_counter(store, "conc/ready", n, 60)
    if ready != n:
        failures.append("add phase: only %d of %d workers checked in" % (ready, n))
    store.set("conc/go", b"1")
    codes = reap(pids, 60)
    bad = {p: c for p, c in codes.items() if c != 0}
    if bad:
        failures.append("add phase: workers failed: %r" % bad)
    t_add = time.monotonic() - t0

    want = {k: 0 for k in POS_KEYS + [SIGNED_KEY]}
    for i in range(n):
        for k, d in worker_plan(args.seed, i, args.adds):
            want[k] += d
    for k, total in want.items():
        got = store.get(k)
        if got != str(total).encode():
            failures.append("add phase: %s = %r, independent sum %d" % (k, got, total))
    if not bad:
        replies = {k: [] for k in want}
        for i in range(n):
            with open(os.path.join(args.tmp, "adder.%d.json" % i)) as f:
                done = json.load(f)
            if [(k, d) for k, d, _ in done] != worker_plan(args.seed, i, args.adds):
                failures.append("add phase: worker %d did not run its plan" % i)
            for k, d, r in done:
                replies[k].append((d, r))
        for k in POS_KEYS:
            rs = [r for _, r in replies[k]]
            if len(set(rs)) != len(rs):
                failures.append("add phase: %s: duplicate replies (an update was lost)" % k)
            states = set(rs) | {0}
            broken = [(d, r) for d, r in replies[k] if r - d not in states]
            if broken:
                failures.append("add phase: %s: replies that follow no earlier state: %r" % (
                    k, broken[:5]))
            if rs and max(rs) != want[k]:
                failures.append("add phase: %s: last reply %d != total %d" % (k, max(rs), want[k]))
    expected_keys = len(want) + 2  # + conc/ready + conc/go
    if store.num_keys() != expected_keys:
        failures.append("add phase: num_keys %d, want %d" % (store.num_keys(), expected_keys))

    # ---- phase "wait" ----
    t0 = time.monotonic()
    os.write(gate_w, b"g" * n)
    os.close(gate_w)
    pids = waiter_pids
    ready = wait_counter(store, "rel/ready", n, 60)
    if ready != n:
        failures.append("wait phase: only %d of %d waiters checked in" % (ready, n))
    time.sleep(0.5)  # let every waiter's WAIT reach the server
    t_set = time.monotonic()
    store.set("rel/go", b"released")
    codes = reap(pids, 20)
    t_reaped = time.monotonic()
    bad = {p: c for p, c in codes.items() if c != 0}
    if bad:
        failures.append("wait phase: waiters failed: %r" % bad)
    else:
        outs = []
        for i in range(n):
            with open(os.path.join(args.tmp, "waiter.%d.json" % i)) as f:
                outs.append(json.load(f))
        early = [o for o in outs if o[1] < t_set]
        if early:
            failures.append("wait phase: %d waiters returned before the key was set" % len(early))
        if any(o[2] != "released" for o in outs):
            failures.append("wait phase: a waiter read a wrong value")
        latest = max(o[1] for o in outs) - t_set
        if latest > 5:
            failures.append("wait phase: the last waiter returned %.2fs after the set" % latest)
        print("%s: %d waiters released, last %.0f ms after the set (all reaped in %.0f ms)" % (
            args.label, n, latest * 1000, (t_reaped - t_set) * 1000), file=sys.stderr)
    print("%s: add phase %d workers x %d adds in %.1fs; wait phase %.1fs" % (
        args.label, n, args.adds, t_add, time.monotonic() - t0), file=sys.stderr, flush=True)

    if failures:
        for m in failures:
            print("FAIL (%s server): %s" % (args.label, m), file=sys.stderr)
        print("seed=%d" % args.seed, file=sys.stderr, flush=True)
        os._exit(1)
    os._exit(0)


if __name__ == "__main__":
    try:
        main()
    except BaseException:
        import traceback
        traceback.print_exc()
        for pid in ALL_PIDS:
            try:
                os.kill(pid, 9)
            except OSError:
                pass
        os._exit(1)
