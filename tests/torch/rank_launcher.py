"""The parent half of the rank checks in this folder (backend_check.py, debug_check.py,
p2p_check.py): each is run as `CHECK.py WORLD` (the launcher) or `CHECK.py WORLD PORT RANK` (one
rank). The launcher hosts a TCPStore on a port the kernel picks (parallel tests never collide),
starts WORLD ranks of the same file, waits for all of them under one deadline (a hang fails; a
loaded CI machine is slow, not hung), kills every rank when it passes, compares the exit codes with
the expected ones and exits 0 with "PASS: N ranks" or 1 with a FAIL line.
"""

import datetime
import os
import subprocess
import sys
import time


def run(script, world, limit_s, env=None, want=None):
    """Launches WORLD ranks of SCRIPT and exits the process with the verdict. ENV: extra variables
    for the ranks; WANT: the expected exit codes (default: all 0)."""
    import torch.distributed as dist

    host = dist.TCPStore("127.0.0.1", 0, world + 1, True, timeout=datetime.timedelta(seconds=60),
                         wait_for_workers=False)
    rank_env = dict(os.environ, **(env or {}))
    procs = [subprocess.Popen([sys.executable, "-u", script, str(world), str(host.port), str(r)],
                              env=rank_env)
             for r in range(world)]
    deadline = time.time() + limit_s
    codes = []
    for p in procs:
        try:
            codes.append(p.wait(timeout=max(deadline - time.time(), 1)))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            print("FAIL: ranks did not finish in %d s (a deadlock?)" % limit_s, flush=True)
            sys.exit(1)
    want = want if want is not None else [0] * world
    if codes != want:
        print("FAIL: rank exit codes %s, expected %s" % (codes, want), flush=True)
        sys.exit(1)
    print("PASS: %d ranks" % world, flush=True)
    sys.exit(0)
