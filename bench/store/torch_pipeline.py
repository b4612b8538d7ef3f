"""Pipelined SETs from a real PyTorch TCPStore client against several servers, in one run.

Three roles in one file (bench/store/torch_pipeline.sh runs the driver; see its --help):

  driver  (any python3, no torch): starts every server once, then runs the client against each
          server in turn, interleaved (A B C A B C ...), a fresh client process per run; prints
          SETs/s per run, the server's CPU per run (from /proc/PID/stat), the median per server
          and the ratio of tdist's median to each torch server's median.
  serve   (a torch python): TCPStore(is_master=True) on port 0; prints its port, serves until
          stdin closes. use_libuv is passed on torch >= 2.
  client  (a torch python): TCPStore(is_master=False) to HOST:PORT, N set()s of V-byte values
          (no reply in either wire dialect, so the client pipelines), then get() of the last key,
          which the server answers only after executing every SET before it on the connection;
          the time counted runs from the first set() to that reply. After the clock stops, a
          sample of keys is read back and compared. Prints one JSON line.

Asserts nothing about speed; a wrong value read back is an error (exit 1).
"""

import json
import os
import random
import select
import signal
import statistics
import subprocess
import sys
import time


def cmd_serve(args):
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    use_libuv = args[0] == "libuv" if args else False
    kw = {}
    if int(torch.__version__.split(".")[0]) >= 2:
        kw["use_libuv"] = use_libuv
    elif use_libuv:
        sys.exit("serve: torch %s has no libuv server" % torch.__version__)
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=60), **kw)
    print(store.port, flush=True)
    sys.stdin.read()  # until the driver closes our stdin
    del store


def cmd_client(args):
    from datetime import timedelta

    import torch.distributed as dist

    port, n, vsize, tag = int(args[0]), int(args[1]), int(args[2]), args[3]
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=60))
    keys = ["%s/k%d" % (tag, i) for i in range(n)]
    # Values differ per key (the sample check must catch a value stored under the wrong key).
    base = b"v" * vsize
    vals = [(("%d:" % i).encode() + base)[:vsize] if vsize >= 8 else base for i in range(n)]
    sset = store.set
    c0 = time.process_time()
    t0 = time.perf_counter()
    for i in range(n):
        sset(keys[i], vals[i])
    last = store.get(keys[-1])
    t1 = time.perf_counter()
    c1 = time.process_time()
    bad = 0 if last == vals[-1] else 1
    rnd = random.Random(n)
    for i in rnd.sample(range(n), min(n, 200)):
        if store.get(keys[i]) != vals[i]:
            bad += 1
    print(json.dumps({"sets": n, "seconds": t1 - t0, "cpu": c1 - c0, "bad": bad}), flush=True)
    sys.exit(1 if bad else 0)


def proc_cpu_s(pid):
    """utime + stime of a process and all its threads, seconds."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Server:
    def __init__(self, name, argv):
        self.name = name
        self.argv = argv
        self.proc = None
        self.port = None
        self.pid = None

    def start(self, tmp):
        if self.argv[0] == "tdist":
            port_file = os.path.join(tmp, "port.%s" % self.name)
            self.proc = subprocess.Popen(
                [self.argv[1], "serve", "--port", "0", "--port-file", port_file, "--quiet"],
                stdin=subprocess.DEVNULL)
            deadline = time.monotonic() + 30
            while not (os.path.exists(port_file) and open(port_file).read().endswith("\n")):
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("%s: tdist-store did not write its port file" % self.name)
                time.sleep(0.02)
            self.port = int(open(port_file).read())
            self.pid = self.proc.pid
        else:
            py, mode = self.argv
            self.proc = subprocess.Popen([py, os.path.abspath(__file__), "serve", mode],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            ready, _, _ = select.select([self.proc.stdout], [], [], 120)
            line = self.proc.stdout.readline() if ready else ""
            if not line.strip().isdigit():
                raise RuntimeError("%s: no port from the torch server within 120 s (%r)" %
                                   (self.name, line))
            self.port = int(line)
            # The torch python execs through the torch26 wrapper (same PID) or runs directly.
            self.pid = self.proc.pid

    def stop(self):
        if not self.proc:
            return
        if self.argv[0] == "tdist":
            self.proc.terminate()
        else:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def run_client(py, port, n, vsize, tag):
    out = subprocess.run([py, os.path.abspath(__file__), "client", str(port), str(n), str(vsize),
                          tag], capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise RuntimeError("client against port %d failed (rc %d): %s" %
                           (port, out.returncode, out.stderr.strip()[-2000:]))
    return json.loads(out.stdout.strip().splitlines()[-1])


def cmd_driver(args):
    import argparse

    ap = argparse.ArgumentParser(prog="torch_pipeline.sh")
    ap.add_argument("--tdist-store", action="append", required=True,
                    help="PATH or LABEL=PATH of a tdist-store binary; repeat to compare builds")
    ap.add_argument("--clients", default="2.6,1.13")
    ap.add_argument("--py26", required=True)
    ap.add_argument("--py113", default="/usr/bin/python3")
    ap.add_argument("--keys", type=int, default=200000)
    ap.add_argument("--value-bytes", type=int, default=16)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--tmp", required=True)
    ap.add_argument("--tdist-only", action="store_true")
    o = ap.parse_args(args)
    # SIGTERM unwinds like Ctrl-C, so the finally below stops every server we started.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    print("# torch_pipeline: %d SETs of %d B per run, %d runs per server, interleaved" %
          (o.keys, o.value_bytes, o.repeat))
    print("# loadavg at start: %s" % open("/proc/loadavg").read().strip())
    for cl in o.clients.split(","):
        py = {"2.6": o.py26, "1.13": o.py113}[cl]
        servers = []
        for spec in o.tdist_store:
            label, path = spec.split("=", 1) if "=" in spec else ("tdist", spec)
            servers.append(Server(label, ["tdist", path]))
        if not o.tdist_only:
            servers.append(Server("torch%s" % cl, [py, "legacy"]))
            if cl == "2.6":
                # Debian's 2.6 is built without libuv: its server start fails, and we say so.
                probe = subprocess.run([py, "-c", "import torch.distributed as d;"
                                        "d.TCPStore('127.0.0.1',0,is_master=True,use_libuv=True)"],
                                       capture_output=True, text=True)
                if probe.returncode == 0:
                    servers.append(Server("torch2.6-libuv", [py, "libuv"]))
                else:
                    print("# torch 2.6 libuv server: not available (%s)" %
                          probe.stderr.strip().splitlines()[-1][:120])
        print("\n## client: torch %s (%s)" % (cl, py))
        results = {s.name: [] for s in servers}
        try:
            for s in servers:
                s.start(o.tmp)
            print("%-16s %4s %10s %8s %14s %14s %8s" % ("server", "run", "SETs/s", "seconds",
                                                        "srv us CPU/SET", "cli us CPU/SET", "load1"))
            for r in range(o.repeat):
                order = servers if r % 2 == 0 else list(reversed(servers))
                for s in order:
                    c0 = proc_cpu_s(s.pid)
                    res = run_client(py, s.port, o.keys, o.value_bytes, "r%d" % r)
                    c1 = proc_cpu_s(s.pid)
                    rate = res["sets"] / res["seconds"]
                    cpu_us = (c1 - c0) * 1e6 / res["sets"]
                    load1 = open("/proc/loadavg").read().split()[0]
                    cli_us = res["cpu"] * 1e6 / res["sets"]
                    results[s.name].append((rate, cpu_us, cli_us))
                    print("%-16s %4d %10.0f %8.3f %14.2f %14.2f %8s" %
                          (s.name, r, rate, res["seconds"], cpu_us, cli_us, load1), flush=True)
        finally:
            for s in servers:
                s.stop()
        med = {k: statistics.median([x[0] for x in v]) for k, v in results.items()}
        medcpu = {k: statistics.median([x[1] for x in v]) for k, v in results.items()}
        medcli = {k: statistics.median([x[2] for x in v]) for k, v in results.items()}
        print("medians:")
        for k in med:
            print("  %-16s %10.0f SETs/s  server %.2f, client %.2f us CPU/SET" %
                  (k, med[k], medcpu[k], medcli[k]))
        ours = [sv.name for sv in servers if sv.argv[0] == "tdist"]
        for a in ours:
            for k in med:
                if k not in ours:
                    print("  ratio %s/%s: %.2f" % (a, k, med[a] / med[k]))
    print("# loadavg at end: %s" % open("/proc/loadavg").read().strip())


def main():
    if len(sys.argv) < 2 or sys.argv[1] not in ("serve", "client", "driver"):
        sys.exit("usage: torch_pipeline.py driver|serve|client ARGS (run bench/store/torch_pipeline.sh)")
    {"serve": cmd_serve, "client": cmd_client, "driver": cmd_driver}[sys.argv[1]](sys.argv[2:])


if __name__ == "__main__":
    main()
