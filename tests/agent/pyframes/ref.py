"""The reference side of pyframes_test.c: a Python process that writes what its own interpreter
says about itself, for the agent's memory reader to be compared against.

  ref.py OUT SEED

OUT.lines: a generated function's location table (co_linetable, hex, after its first line) and
CPython's own co_lines() ranges "START END LINE" (-1: no line). The function has random gaps
between its lines (0 to 300 blank lines), loops (negative line deltas) and starts up to 5,000
lines into its file, so every entry form of the table shows up.
OUT: the stacks of two threads as traceback sees them ("T 0x<thread id>", then "F file|line|name"
lines, most recent call first), written just before the main thread blocks in time.sleep on the
same line; then the process sleeps until killed.
"""
import os
import random
import sys
import threading
import time
import traceback

OUT, SEED = sys.argv[1], int(sys.argv[2])


def gen_function(rnd):
    lines = ["def gen(a):", "    x = 0"]
    for i in range(60):
        lines += [""] * rnd.choice([0, 0, 1, 3, 70, 300])
        if i % 5 == 0:
            lines.append("    for j in range(%d):" % (i % 3))
            lines.append("        x -= a * j + %d" % i)
        else:
            lines.append("    x += a * %d" % i)
    lines.append("    return x")
    src = "\n" * rnd.randint(0, 5000) + "\n".join(lines) + "\n"
    code = compile(src, "gen.py", "exec")
    return [c for c in code.co_consts if hasattr(c, "co_lines")][0]


def write_lines(co):
    with open(OUT + ".lines", "w") as f:
        f.write("%d %s\n" % (co.co_firstlineno, co.co_linetable.hex()))
        for start, end, line in co.co_lines():
            f.write("%d %d %d\n" % (start, end, -1 if line is None else line))


def frames(summary):
    return ["F %s|%d|%s" % (x.filename, x.lineno, x.name) for x in reversed(summary)]


ev = threading.Event()


def blocked_in_thread():
    ev.wait()


def publish(waiter):
    """Both threads' stacks, the main one as its caller's line (the one that sleeps) sees it."""
    out = ["T 0x%x" % waiter.ident] + frames(traceback.extract_stack(sys._current_frames()[waiter.ident]))
    out += ["T 0x%x" % threading.get_ident()] + frames(traceback.extract_stack()[:-1])
    with open(OUT + ".tmp", "w") as f:
        f.write("\n".join(out) + "\n")
    os.rename(OUT + ".tmp", OUT)


def inner():
    t = threading.Thread(target=blocked_in_thread, daemon=True)
    t.start()
    while sys._current_frames().get(t.ident) is None or \
            sys._current_frames()[t.ident].f_code.co_name != "wait":
        time.sleep(0.01)
    time.sleep(0.2)  # into the lock's acquire, where it stays
    publish(t); time.sleep(100000)  # noqa: E702 (one line: the reference's line is the sleep's)


def outer():
    inner()


write_lines(gen_function(random.Random(SEED)))
outer()
