"""tdist-agent's reader of PyTorch's NCCL flight-recorder dumps: names the rank that is behind.

    python3 tdist_frtrace.py [--brief] PREFIX [WORLD_SIZE]

reads every file PREFIX<rank> (the names ProcessGroupNCCL's DebugInfoWriter gives the dumps it
writes on a watchdog timeout: TORCH_NCCL_DEBUG_INFO_TEMP_FILE + global rank) and prints one JSON
object on stdout (schema below). Needs no torch: the dumps are pickles of plain dicts, lists,
tuples, strings and numbers (c10d's pickle_str of the dict built by NCCLTraceBuffer::dump in
torch/csrc/distributed/c10d/NCCLUtils.hpp, 2.5/2.6; FlightRecorder.hpp in later versions), read
here by an unpickler that refuses every global except the list builders torch's pickler may
name, so a crafted file cannot run code.

Fields read (as PyTorch writes them; tools/flight_recorder/components/types.py is the upstream
reader): top level "version", "pg_config" {pg: {name, desc, ranks}}, "pg_status" {pg_id:
{last_enqueued_collective, last_started_collective, last_completed_collective}}, "entries"
[{record_id, pg_id, process_group (name, desc), collective_seq_id, p2p_seq_id, op_id,
profiling_name, time_created_ns, state "scheduled"|"started"|"completed", retired, timeout_ms,
is_p2p, input_sizes, ...}].

The rule (per process group, the default group "0" first): the ranks whose last enqueued
collective is the lowest are behind when others enqueued more: they never called the collective
the others wait in (torchfrtrace's "missing ranks"). When every rank enqueued the same, the ranks
whose last completed collective is the lowest are behind (stuck inside it). A rank of
0..WORLD_SIZE-1 with no dump is listed as missing. Output:
  {"dumps": N, "ranks": [...], "missing": [...], "errors": ["FILE: why", ...],
   "pg": "0", "behind": [ranks], "waiting_in": {"seq": S, "op": "nccl:all_reduce", "ranks": [...]}
   or null, "per_rank": {"R": [enqueued, started, completed]}, "summary": "one sentence"}
--brief prints one line instead, for tdist-agent: the behind ranks (comma-separated, "-" for
none), a tab, the summary (tabs and line breaks replaced by spaces).
Exit status 0 (even with no dump: "dumps": 0), 2 on bad arguments.
"""
import glob
import io
import json
import os
import pickle
import sys

MAX_DUMP_BYTES = 64 << 20


class _SafeUnpickler(pickle.Unpickler):
    _ALLOWED = {
        ("torch.jit._pickle", "build_intlist"),
        ("torch.jit._pickle", "build_doublelist"),
        ("torch.jit._pickle", "build_boollist"),
        ("torch.jit._pickle", "build_list"),
    }

    def find_class(self, module, name):
        if (module, name) in self._ALLOWED:
            return list
        raise pickle.UnpicklingError("global %s.%s refused" % (module, name))


def load_dump(path):
    with open(path, "rb") as f:
        data = f.read(MAX_DUMP_BYTES + 1)
    if len(data) > MAX_DUMP_BYTES:
        raise ValueError("over %d bytes" % MAX_DUMP_BYTES)
    d = _SafeUnpickler(io.BytesIO(data)).load()
    if not isinstance(d, dict):
        raise ValueError("not a dict but %s" % type(d).__name__)
    return d


def _int(v, default=-1):
    try:
        return int(v)
    except (TypeError, ValueError):
        return default


def _entry_pg(e):
    if "pg_id" in e:
        return str(e["pg_id"])
    pg = e.get("process_group")
    return str(pg[0]) if isinstance(pg, (list, tuple)) and pg else "0"


def rank_status(d, pg):
    """(enqueued, started, completed) of process group pg in dump d, from pg_status, else from
    the entries' states."""
    st = (d.get("pg_status") or {}).get(pg)
    if isinstance(st, dict):
        return (_int(st.get("last_enqueued_collective")), _int(st.get("last_started_collective")),
                _int(st.get("last_completed_collective")))
    enq = sta = com = -1
    for e in d.get("entries") or []:
        if not isinstance(e, dict) or _entry_pg(e) != pg or e.get("is_p2p"):
            continue
        s = _int(e.get("collective_seq_id"))
        enq = max(enq, s)
        if e.get("state") in ("started", "completed"):
            sta = max(sta, s)
        if e.get("state") == "completed":
            com = max(com, s)
    return (enq, sta, com)


def entry_op(d, pg, seq):
    for e in d.get("entries") or []:
        if (isinstance(e, dict) and _entry_pg(e) == pg and not e.get("is_p2p")
                and _int(e.get("collective_seq_id")) == seq):
            return str(e.get("profiling_name") or "?")
    return None


def _ranks(rs):
    return ",".join(str(r) for r in sorted(rs))


def analyze(dumps, world_size=None):
    """dumps: {rank: dict}. Returns the output object."""
    out = {"dumps": len(dumps), "ranks": sorted(dumps), "missing": [], "pg": None, "behind": [],
           "waiting_in": None, "per_rank": {}, "summary": ""}
    if world_size:
        out["missing"] = [r for r in range(world_size) if r not in dumps]
    if not dumps:
        out["summary"] = "no flight-recorder dump"
        return out
    pgs = set()
    for d in dumps.values():
        pgs.update(str(k) for k in (d.get("pg_status") or {}))
        pgs.update(_entry_pg(e) for e in d.get("entries") or [] if isinstance(e, dict))
    order = sorted(pgs, key=lambda p: (p != "0", _int(p, 1 << 30), p)) or ["0"]
    for pg in order:
        per = {r: rank_status(d, pg) for r, d in dumps.items()}
        enq = {r: s[0] for r, s in per.items()}
        com = {r: s[2] for r, s in per.items()}
        if max(enq.values()) > min(enq.values()):
            low = min(enq.values())
            behind = [r for r in per if enq[r] == low]
            seq = low + 1
            waiting = [r for r in per if enq[r] >= seq and com[r] < seq]
        elif max(com.values()) > min(com.values()):
            low = min(com.values())
            behind = [r for r in per if com[r] == low]
            seq = low + 1
            waiting = [r for r in per if r not in behind]
        else:
            continue
        op = None
        for r in waiting + behind:
            op = entry_op(dumps[r], pg, seq)
            if op:
                break
        out.update(pg=pg, behind=sorted(behind),
                   per_rank={str(r): list(per[r]) for r in sorted(per)})
        out["waiting_in"] = {"seq": seq, "op": op, "ranks": sorted(waiting)}
        how = ("last enqueued #%d" % enq[behind[0]] if max(enq.values()) > min(enq.values())
               else "last completed #%d" % com[behind[0]])
        out["summary"] = "rank%s %s behind in process group %s (%s)%s" % (
            "s" if len(behind) > 1 else "", _ranks(behind), pg, how,
            "; rank%s %s wait%s in %s #%d" % ("s" if len(waiting) > 1 else "", _ranks(waiting),
                                             "" if len(waiting) > 1 else "s", op or "collective",
                                             seq)
            if waiting else "")
        break
    else:
        pg = order[0]
        out["pg"] = pg
        out["per_rank"] = {str(r): list(rank_status(d, pg)) for r, d in sorted(dumps.items())}
        out["summary"] = "all %d dumped rank(s) at the same collective in every process group" % (
            len(dumps))
    if out["missing"]:
        out["summary"] += "; no dump from rank%s %s" % (
            "s" if len(out["missing"]) > 1 else "", _ranks(out["missing"]))
    return out


def main(argv):
    brief = len(argv) > 1 and argv[1] == "--brief"
    if brief:
        argv = argv[:1] + argv[2:]
    if len(argv) not in (2, 3):
        print("usage: tdist_frtrace.py [--brief] PREFIX [WORLD_SIZE]", file=sys.stderr)
        return 2
    prefix = argv[1]
    world = _int(argv[2], 0) if len(argv) == 3 else 0
    dumps, errors = {}, []
    for path in sorted(glob.glob(glob.escape(prefix) + "*")):
        tail = path[len(prefix):]
        if not tail.isdigit():
            continue
        try:
            dumps[int(tail)] = load_dump(path)
        except Exception as e:  # a torn or hostile file is reported, never fatal
            errors.append("%s: %s" % (os.path.basename(path), e))
    out = analyze(dumps, world or None)
    out["errors"] = errors
    if brief:
        text = out["summary"] + ("; unreadable: " + "; ".join(errors) if errors else "")
        print("%s\t%s" % (_ranks(out["behind"]) or "-", " ".join(text.split())))
        return 0
    json.dump(out, sys.stdout, sort_keys=True)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
