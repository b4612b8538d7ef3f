# Reads what mpi4py_rank.py wrote under each mode's directory (FILE.RANK event lines, FILE.rc
# the launcher's exit status, 124 when the per-file timeout ended it) and compares the modes:
# every test that passes under the reference mode (mpirun) must pass under each other mode,
# unless EXPECTED lists it for that mode with a reason. Prints each mode's counts, every
# difference and why, and exits 1 on an unlisted difference.
#   python3 mpi4py_compare.py EXPECTED NRANKS REF_DIR MODE=DIR...
# EXPECTED: one entry a line, '#' comments:  MODES TEST  REASON
#   MODES: '*' or modes joined by ','; TEST: a test id (test_x.TestY.testZ), a file's tests
#   (test_x.*) or every test (*); REASON: starts with "BY DESIGN:" or "DEFECT:" (a defect to fix, not to keep).
import glob
import os
import sys

FINAL = ("ok", "fail", "error", "skip", "xfail")


def read_mode(d, nranks):
    """{test_id: (status, detail)} over every file run in directory d."""
    out = {}
    for rcfile in sorted(glob.glob(os.path.join(d, "*.rc"))):
        base = rcfile[:-3]
        rc = open(rcfile).read().strip()
        per = {}  # test -> {rank: last event}
        done = 0
        for r in range(nranks):
            try:
                lines = open("%s.%d" % (base, r)).read().splitlines()
            except OSError:
                continue
            for line in lines:
                if line == "done":
                    done += 1
                    continue
                kind, _, test = line.partition(" ")
                ev = per.setdefault(test, {})
                if kind == "start" and r in ev:
                    continue
                ev[r] = kind
        ended = "timed out (per-file timeout)" if rc == "124" else "exit %s" % rc
        for test, ev in per.items():
            kinds = [ev.get(r) for r in range(nranks)]
            bad = [r for r, k in enumerate(kinds) if k in ("fail", "error")]
            unfinished = [r for r, k in enumerate(kinds) if k == "start"]
            missing = [r for r, k in enumerate(kinds) if k is None]
            if bad:
                st, why = "fail", "failed on rank(s) %s" % ",".join(map(str, bad))
            elif unfinished:
                st = "hang" if rc == "124" else "crash"
                why = "rank(s) %s never finished it; launcher %s" % (",".join(map(str, unfinished)), ended)
            elif missing:
                st, why = "notrun", "rank(s) %s never started it; launcher %s" % (",".join(map(str, missing)), ended)
            elif "ok" in kinds:
                st, why = "pass", ""
            else:
                st, why = "skip", ""
            out[test] = (st, why)
        if done < nranks and not per:
            out["%s.<file>" % os.path.basename(base)] = ("crash", "no test started; launcher %s" % ended)
    return out


def read_expected(path):
    entries = []
    for n, line in enumerate(open(path), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split(None, 2)
        if len(parts) < 3 or not (parts[2].startswith("BY DESIGN:") or parts[2].startswith("DEFECT:")):
            sys.exit("%s:%d: want 'MODES TEST BY DESIGN:|DEFECT: reason', got %r" % (path, n, line))
        entries.append((parts[0].split(","), parts[1], parts[2]))
    return entries


def listed(entries, mode, test):
    for modes, pat, reason in entries:
        if "*" not in modes and mode not in modes:
            continue
        if pat in ("*", test) or (pat.endswith(".*") and test.startswith(pat[:-1])):
            return reason
    return None


def main():
    expected, nranks, ref_dir = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    modes = [a.split("=", 1) for a in sys.argv[4:]]
    entries = read_expected(expected)
    ref = read_mode(ref_dir, nranks)
    counts = lambda res: ", ".join(
        "%d %s" % (sum(1 for s, _ in res.values() if s == k), k)
        for k in ("pass", "fail", "hang", "crash", "notrun", "skip"))
    print("mpi4py suite: reference (mpirun): %d tests: %s" % (len(ref), counts(ref)))
    for test, (st, why) in sorted(ref.items()):
        if st not in ("pass", "skip"):
            print("  reference %s: %s %s" % (st, test, why))
    unlisted = 0
    for mode, d in modes:
        res = read_mode(d, nranks)
        print("mpi4py suite: %s: %d tests: %s" % (mode, len(res), counts(res)))
        n_listed = 0
        for test, (rst, _) in sorted(ref.items()):
            if rst != "pass":
                continue
            st, why = res.get(test, ("notrun", "never started"))
            if st == "pass":
                continue
            reason = listed(entries, mode, test)
            if reason:
                n_listed += 1
                print("  listed %s %s: %s %s -- %s" % (mode, st, test, why, reason))
            else:
                unlisted += 1
                print("  FAIL %s: %s passes under mpirun, %s here: %s" % (mode, test, st, why))
        for test, (st, why) in sorted(res.items()):
            if test not in ref and st not in ("pass", "skip"):
                print("  note %s: %s %s %s (not in the reference run)" % (mode, test, st, why))
        for modes_, pat, reason in entries:
            if ("*" in modes_ or mode in modes_) and not pat.endswith(".*") and res.get(pat, ("",))[0] == "pass":
                print("  stale %s: %s passes now; drop it from %s (%s)" % (mode, pat, os.path.basename(expected), reason))
        print("  %s: %d listed difference(s), every other mpirun pass passes" % (mode, n_listed)
              if not unlisted else "  %s: unlisted differences so far: %d" % (mode, unlisted))
    if unlisted:
        print("mpi4py suite: %d unlisted difference(s)" % unlisted)
        return 1
    print("mpi4py suite: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
