#!/usr/bin/python3
"""operator-agent/pystack/tdist_frtrace.py, the agent's reader of PyTorch's NCCL flight-recorder
dumps, on dump files written here in PyTorch's format (no GPU on CI: the NCCL side is tested on
files only). Each file is the pickle of the dict ProcessGroupNCCL's NCCLTraceBuffer::dump builds
(torch/csrc/distributed/c10d/NCCLUtils.hpp in 2.5/2.6: "version", "pg_config", "pg_status" with
last_enqueued/started/completed_collective, "entries" with record_id, pg_id, process_group,
collective_seq_id, p2p_seq_id, op_id, profiling_name, time_created_ns, input/output sizes and
dtypes, state, time_discovered_*, retired, timeout_ms, is_p2p, frames), named
TORCH_NCCL_DEBUG_INFO_TEMP_FILE + rank as DebugInfoWriter names them. Python's pickle protocol 2
gives the same opcodes c10d's pickler writes for these types (dicts, lists, tuples, str, int,
float, bool, None); torch's pickler's one extra, the torch.jit._pickle list builders, is checked
with hand-made opcodes. The analyzer runs as the agent runs it: a separate python3 process.
  args: ANALYZER
"""
import json
import os
import pickle
import subprocess
import sys
import tempfile

ANALYZER = os.path.realpath(sys.argv[1])
fails = 0


def check(ok, msg):
    global fails
    print(("PASS: " if ok else "FAIL: ") + msg, flush=True)
    fails += 0 if ok else 1


def entry(rec, seq, state, op="nccl:all_reduce", pg=0):
    return {
        "frames": [{"name": "train_step", "filename": "train.py", "line": 42}],
        "record_id": rec, "pg_id": pg, "process_group": (str(pg), "default_pg" if pg == 0 else ""),
        "collective_seq_id": seq, "p2p_seq_id": 0, "op_id": seq, "profiling_name": op,
        "time_created_ns": 1700000000000000000 + seq, "duration_ms": None,
        "input_sizes": [[1024]], "input_dtypes": ["Float"], "output_sizes": [[1024]],
        "output_dtypes": ["Float"], "state": state,
        "time_discovered_started_ns": None if state == "scheduled" else 1700000000000000100 + seq,
        "time_discovered_completed_ns": 1700000000000000200 + seq if state == "completed" else None,
        "retired": state == "completed", "timeout_ms": 600000, "is_p2p": False,
    }


def dump(world, enqueued, completed, with_status=True, pgs=(0,)):
    """The dict one rank dumps: collectives 1..enqueued, 1..completed completed, the next one
    started (in flight)."""
    entries, status = [], {}
    for pg in pgs:
        e, c = (enqueued, completed) if isinstance(enqueued, int) else (enqueued[pg], completed[pg])
        for s in range(1, e + 1):
            entries.append(entry(len(entries), s, "completed" if s <= c else "started", pg=pg))
        status[str(pg)] = {"last_enqueued_collective": e, "last_started_collective": -1,
                           "last_completed_collective": c}
    d = {"version": "2.4",
         "pg_config": {str(pg): {"name": str(pg), "desc": "default_pg" if pg == 0 else "",
                                 "ranks": str(list(range(world)))} for pg in pgs},
         "entries": entries}
    if with_status:
        d["pg_status"] = status
    return d


def write(dirname, rank, obj_or_bytes):
    path = os.path.join(dirname, "nccl_trace_rank_%d" % rank)
    with open(path, "wb") as f:
        f.write(obj_or_bytes if isinstance(obj_or_bytes, bytes) else pickle.dumps(obj_or_bytes, 2))


def run(dirname, world=None, brief=False):
    args = [sys.executable, ANALYZER] + (["--brief"] if brief else [])
    args += [os.path.join(dirname, "nccl_trace_rank_")] + ([str(world)] if world else [])
    p = subprocess.run(args, capture_output=True, text=True, timeout=60)
    if p.returncode != 0:
        return {"rc": p.returncode, "stderr": p.stderr}
    return p.stdout if brief else json.loads(p.stdout)


def case(name, files, world=None):
    d = tempfile.mkdtemp(prefix=name + ".", dir=os.environ.get("TEST_TMPDIR"))
    for rank, obj in files.items():
        write(d, rank, obj)
    return d, run(d, world)


# 1. rank 2 never called collective #5; ranks 0,1,3 wait in it.
d, out = case("missing_rank", {r: dump(4, 4 if r == 2 else 5, 4) for r in range(4)}, world=4)
check(out["behind"] == [2], "a rank that did not enqueue #5 is behind: %s" % out["summary"])
check(out["waiting_in"] == {"seq": 5, "op": "nccl:all_reduce", "ranks": [0, 1, 3]},
      "the others wait in all_reduce #5: %s" % out["waiting_in"])
check(out["summary"].startswith("rank 2 behind in process group 0 (last enqueued #4); "
                                "ranks 0,1,3 wait in nccl:all_reduce #5"),
      "summary names rank and collective: " + out["summary"])
brief = run(d, 4, brief=True)
check(brief.split("\t")[0] == "2" and brief.endswith("\n") and brief.count("\n") == 1,
      "--brief: one line, behind ranks first: %r" % brief)

# 2. every rank enqueued #7; rank 1 stuck inside #6 (its last completed is #5).
d, out = case("stuck_inside", {r: dump(2, 7, 5 if r == 1 else 6) for r in range(2)})
check(out["behind"] == [1] and out["waiting_in"]["seq"] == 6,
      "same enqueued, lowest completed is behind: %s" % out["summary"])

# 3. no pg_status (an older dump): the same verdict from the entries' states.
d, out = case("entries_only", {r: dump(3, 3 if r == 0 else 4, 3, with_status=False)
                               for r in range(3)})
check(out["behind"] == [0] and out["waiting_in"]["ranks"] == [1, 2],
      "from entries alone: %s" % out["summary"])

# 4. a subgroup holds the job, the default group is level.
files = {r: dump(2, {0: 9, 1: 3 if r == 1 else 4}, {0: 9, 1: 3}, pgs=(0, 1)) for r in range(2)}
d, out = case("subgroup", files)
check(out["pg"] == "1" and out["behind"] == [1], "the subgroup that differs: %s" % out["summary"])

# 5. a rank's dump missing (world 3, ranks 0 and 1 dumped, level): named as missing.
d, out = case("no_dump", {r: dump(3, 5, 4) for r in range(2)}, world=3)
check(out["missing"] == [2] and out["behind"] == [] and "no dump from rank 2" in out["summary"],
      "missing dump named: %s" % out["summary"])

# 6. torch's pickler's list builder (GLOBAL torch.jit._pickle build_intlist) is read; a global
#    that would run code is refused, the file reported and nothing run; torn and odd files too.
marker = os.path.join(os.environ.get("TEST_TMPDIR", "/tmp"), "frtrace_pwned.%d" % os.getpid())
evil = (b"\x80\x02cposix\nsystem\nq\x00X" + len("touch " + marker).to_bytes(4, "little") +
        ("touch " + marker).encode() + b"\x85R.")


def intlist_dump():
    """A dump whose last_completed_collective is written as torch's pickler writes an int list
    (GLOBAL torch.jit._pickle build_intlist), made by pickling through a stand-in module."""
    import types
    mods = {n: types.ModuleType(n) for n in ("torch", "torch.jit", "torch.jit._pickle")}
    saved = {n: sys.modules.get(n) for n in mods}

    def build_intlist(x):
        return x

    build_intlist.__module__, build_intlist.__qualname__ = "torch.jit._pickle", "build_intlist"
    mods["torch.jit._pickle"].build_intlist = build_intlist
    mods["torch"].jit = mods["torch.jit"]
    mods["torch.jit"]._pickle = mods["torch.jit._pickle"]

    class IntList:
        def __reduce__(self):
            return (build_intlist, ([4],))

    sys.modules.update(mods)
    try:
        d = dump(4, 5, 4)
        d["entries"][0]["input_sizes"] = IntList()
        return pickle.dumps(d, 2)
    finally:
        for n, m in saved.items():
            if m is None:
                sys.modules.pop(n, None)
            else:
                sys.modules[n] = m


intlist = intlist_dump()
check(b"ctorch.jit._pickle\nbuild_intlist\n" in intlist, "the stand-in pickle names the builder")
good = pickle.dumps(dump(4, 5, 4), 2)
d, out = case("hostile", {0: good, 1: evil, 2: good[: len(good) // 2], 3: pickle.dumps([1], 2),
                          4: intlist})
errs = " | ".join(out["errors"])
check(not os.path.exists(marker), "a pickle naming posix.system ran nothing")
check("nccl_trace_rank_1: global posix.system refused" in errs, "the hostile file is named: " + errs)
check("nccl_trace_rank_2:" in errs and "nccl_trace_rank_3: not a dict" in errs,
      "torn and non-dict files are named")
check(out["ranks"] == [0, 4], "the good dump and the build_intlist one are read: %s" % out["ranks"])

# 7. no dump at all; a file without a rank suffix is not a dump.
d, out = case("none", {})
open(os.path.join(d, "nccl_trace_rank_x"), "w").write("not a dump")
out = run(d, 2)
check(out["dumps"] == 0 and out["missing"] == [0, 1] and out["summary"].startswith("no flight"),
      "no dump: %s" % out["summary"])
check(run(d, None, brief=False) and run("/nonexistent-dir") ["dumps"] == 0, "a missing directory")
bad = subprocess.run([sys.executable, ANALYZER], capture_output=True, text=True)
check(bad.returncode == 2 and "usage" in bad.stderr, "no argument: usage, exit 2")

print("frtrace_test: %d failure(s)" % fails)
sys.exit(1 if fails else 0)
