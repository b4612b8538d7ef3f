"""PyTorch's own distributed_test.py on "tdist" against the same tests on gloo, with a verdict.

    python3 run_suite.py --world N --expected FILE [--jobs J] [--timeout S] [--shard I/N]
                         [--tests NAME,...] [--out DIR]

Run by the PyTorch whose suite it tests (tests/torch/suite/suite_test.sh picks 1.13 or 2.6).
It lists DistributedTest's tests, keeps this shard's share (--shard, or Bazel's
TEST_SHARD_INDEX/TEST_TOTAL_SHARDS), and runs each test twice: on real gloo (the reference) and
with the groups on "tdist" (suite_worker.py). J worker processes run at a time, each with its own
TEMP_DIR, init files and ports. A test that runs past --timeout is a failure ("hang"), reported
by name: its worker's whole process group is killed and a new worker takes the tests after it.

The verdict (verdict.py): every test gloo passes must pass on tdist, except the tests the expected-
failures file lists for this PyTorch and world size; a listed test that passes is reported too,
so the list stays true. Exit status 0 only if the verdict holds. Per-test results go to
DIR/results-<torch>-w<N>.json (DIR: --out, else $TEST_UNDECLARED_OUTPUTS_DIR, else none).
"""

import argparse
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.realpath(__file__))
sys.path.insert(0, HERE)
import verdict  # noqa: E402

WORKER = os.path.join(HERE, "suite_worker.py")
BACKENDS = ("gloo", "tdist")


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--world", type=int, required=True)
    p.add_argument("--expected", required=True, help="the expected-failures file")
    p.add_argument("--jobs", type=int, default=2, help="worker processes at a time")
    p.add_argument("--timeout", type=float, default=90.0, help="per-test limit, seconds")
    p.add_argument("--shard", help="I/N: run the I-th (0-based) of N shares of the tests")
    p.add_argument("--tests", help="comma-separated test names (default: all of the suite's)")
    p.add_argument("--select", help="file of patterns: run the tests they match")
    p.add_argument("--out", help="directory for the per-test results")
    return p.parse_args()


class Worker:
    """One suite_worker.py process; run_all gives it one task at a time on its stdin."""

    def __init__(self, world, timeout, base):
        self.tmp = tempfile.mkdtemp(prefix="w-", dir=base)
        self.results = os.path.join(self.tmp, "results.jsonl")
        self.log = open(os.path.join(self.tmp, "log"), "wb")
        env = dict(os.environ, TMPDIR=self.tmp, TEMP_DIR=os.path.join(self.tmp, "suite"))
        os.makedirs(env["TEMP_DIR"])
        cmd = [sys.executable, "-u", WORKER, "--world", str(world), "--results", self.results,
               "--timeout", str(timeout)]
        # Its own session: a kill reaches the rank processes it forked, and only them.
        self.proc = subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE, stdout=self.log,
                                     stderr=subprocess.STDOUT, start_new_session=True, text=True)
        self.pos = 0            # bytes of the results file read so far
        self.task = None        # (backend, name) given and not finished
        self.started = False    # its "start" line seen
        self.since = None       # when the task started (its "start" line), else when given

    def give(self, task):
        self.task, self.since = task, time.monotonic()
        self.started = False
        self.proc.stdin.write("%s %s\n" % task)
        self.proc.stdin.flush()

    def poll(self):
        """New results of this worker (a list of dicts)."""
        try:
            with open(self.results) as f:
                f.seek(self.pos)
                chunk = f.read()
        except FileNotFoundError:
            return []
        lines = chunk.split("\n")
        self.pos += len(chunk) - len(lines[-1])  # a partial last line is read again later
        done = []
        for line in lines[:-1]:
            rec = json.loads(line)
            if "start" in rec:
                self.since, self.started = time.monotonic(), True
            elif "test" in rec:
                done.append(rec)
                self.task = None
        return done

    def kill(self):
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()

    def log_tail(self, n=3000):
        self.log.flush()
        with open(self.log.name, "rb") as f:
            return f.read().decode(errors="replace")[-n:]

    def close(self):
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()
        self.log.close()
        shutil.rmtree(self.tmp, ignore_errors=True)


def run_all(tests, args, base):
    """Runs every test on gloo, and on tdist each test gloo passes (the others are not
    compared); returns {backend: {test: result}}."""
    results = {b: {} for b in BACKENDS}
    pending = [("gloo", t) for t in tests]
    workers = []
    # A new worker first imports torch and the suite (seconds, more under load): a task's
    # limit counts from its "start" line, and a worker that never starts its task gets this.
    start_limit = 180.0

    def finish(rec):
        results[rec["backend"]][rec["test"]] = rec
        if rec["backend"] == "gloo" and rec["result"] == "pass":
            pending.insert(0, ("tdist", rec["test"]))  # tdist's may be slow: start them early

    try:
        loop(pending, workers, finish, args, base, start_limit)
    finally:
        for w in workers:
            if w.proc.poll() is None and w.task:
                w.kill()
            w.close()
    return results


def loop(pending, workers, finish, args, base, start_limit):
    while pending or any(w.task for w in workers):
        while len(workers) < args.jobs and len(workers) < len(pending) + sum(1 for w in workers if w.task):
            workers.append(Worker(args.world, args.timeout, base))
        for w in workers:
            if w.task is None and pending:
                w.give(pending.pop(0))
        time.sleep(0.1)
        for w in list(workers):
            for rec in w.poll():
                finish(rec)
            if w.task is None:
                continue
            now = time.monotonic()
            why = None
            if w.proc.poll() is not None:
                why = "the worker exited %s during it" % w.proc.returncode
            elif w.started and now - w.since > args.timeout + 30:
                why = "hang: still running after %.0f s (limit %.0f s); its processes were killed" % (
                    now - w.since, args.timeout)
            elif not w.started and now - w.since > start_limit:
                why = "the worker did not start it within %.0f s" % start_limit
            if why is None:
                continue
            w.kill()
            for rec in w.poll():  # finished just now after all
                finish(rec)
            if w.task:
                backend, name = w.task
                finish({"test": name, "backend": backend, "result": "fail", "secs": None,
                        "summary": why, "detail": why + "\n--- worker output:\n" + w.log_tail()})
            workers.remove(w)
            w.close()


def list_tests(world):
    """(torch.__version__, [(name, why it is skipped here whatever the backend, or "")])"""
    out = subprocess.run([sys.executable, WORKER, "--world", str(world), "--list"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=300)
    lines = out.stdout.splitlines()
    if out.returncode != 0 or not lines or not lines[0].startswith("# torch "):
        sys.exit("run_suite: listing the suite's tests failed:\n" + out.stderr[-3000:])
    return lines[0].split()[2], [tuple((ln + "\t").split("\t")[:2]) for ln in lines[1:] if ln]


def shard_of(args):
    if args.shard:
        i, n = args.shard.split("/")
        return int(i), int(n)
    n = int(os.environ.get("TEST_TOTAL_SHARDS", "1"))
    i = int(os.environ.get("TEST_SHARD_INDEX", "0"))
    if os.environ.get("TEST_SHARD_STATUS_FILE"):
        open(os.environ["TEST_SHARD_STATUS_FILE"], "w").close()  # we do shard
    return i, n


def select(listing, args, version):
    """The tests this run covers: all of the suite's, or --tests, or those --select's patterns
    (one regular expression a line, matching a whole name; '#' comments) match."""
    names = [name for name, _ in listing]
    if args.tests:
        wanted = args.tests.split(",")
        unknown = [t for t in wanted if t not in names]
        if unknown:
            sys.exit("run_suite: not in the suite on PyTorch %s: %s" % (version, " ".join(unknown)))
        return [x for x in listing if x[0] in wanted]
    if args.select:
        with open(args.select) as f:
            pats = [ln.split("#", 1)[0].strip() for ln in f]
        pats = [re.compile(p) for p in pats if p]
        unused = [p.pattern for p in pats if not any(p.fullmatch(n) for n in names)]
        if unused:
            sys.exit("run_suite: %s: patterns that match no test of PyTorch %s's suite: %s"
                     % (args.select, version, " ".join(unused)))
        return [x for x in listing if any(p.fullmatch(x[0]) for p in pats)]
    return listing


def main():
    args = parse_args()
    # bounded (suite_test.sh) or Bazel ends a run with SIGTERM: the workers' sessions go too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    t0 = time.monotonic()
    version, listing = list_tests(args.world)
    major_minor = ".".join(version.split(".")[:2])
    expected = verdict.load_expected(args.expected, major_minor, args.world)
    chosen = select(listing, args, version)
    # Known skips are not run (suite_worker.known_skip); the shards share the others.
    skips = {name: why for name, why in chosen if why}
    runnable = [name for name, why in chosen if not why]
    i, n = shard_of(args)
    mine = [t for k, t in enumerate(runnable) if k % n == i]
    if i == 0:
        mine += sorted(skips)
    print("run_suite: PyTorch %s, world %d, shard %d/%d: %d tests (%d skipped here whatever the "
          "backend), on gloo and, where gloo passes, on tdist; %d workers, %.0f s per test"
          % (version, args.world, i, n, len(mine), len(skips) if i == 0 else 0, args.jobs,
             args.timeout), flush=True)
    base = tempfile.mkdtemp(prefix="tdist-suite-")
    try:
        results = run_all([t for t in mine if t not in skips], args, base)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    for t in mine:
        if t in skips:
            results["gloo"][t] = {"test": t, "backend": "gloo", "result": "skip", "secs": 0,
                                  "detail": skips[t] + " (not run)"}
    wall = time.monotonic() - t0
    report = verdict.judge(mine, results, expected)
    tag = "torch%s-w%d" % (major_minor, args.world)
    out_dir = args.out or os.environ.get("TEST_UNDECLARED_OUTPUTS_DIR")
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
        suffix = "" if n == 1 else "-shard%d" % i
        with open(os.path.join(out_dir, "results-%s%s.json" % (tag, suffix)), "w") as f:
            json.dump({"torch": version, "world": args.world, "wall_s": round(wall, 1),
                       "results": results}, f, indent=1)
    print(verdict.render(report, results, "PyTorch %s, world %d, shard %d/%d" % (
        version, args.world, i, n)))
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    print("run_suite: wall time %.0f s, CPU time %.0f s (user+sys of the run's processes; "
          "load average %.1f)" % (wall, ru.ru_utime + ru.ru_stime, os.getloadavg()[0]))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
