"""Checks that every TDIST_* environment variable read in the tree is in a parameter table.

usage: param_tree_check.py ROOT NAMES_FILE

ROOT is a checkout; NAMES_FILE lists, one per line, every TDIST_* name of the tables
(`param_doc --names`: libtdist's runtime/common/param.h, the agent's operator-agent/common/param.h
and the agent's TDIST_<FLAG> names). Scans every .c
and .h file under ROOT/runtime, ROOT/operator-agent and ROOT/include and fails (exit 1, one line
per finding) on:
  - a TDIST_* name inside a string literal (adjacent literals joined) that is not in the tables
    and is not a C identifier of the tree (TDIST_PG_OPTIONS_INIT in a message is not a variable);
  - a string literal that builds a TDIST_* name at run time ("TDIST_%s"), outside the two places
    that derive names from a table (DYNAMIC_OK);
  - getenv()/secure_getenv() of anything but a string literal, outside GETENV_OK;
  - a row of either param.h (TABLES) that no code outside that table's param.{c,h} uses.
"""
import os
import re
import sys

DIRS = ("runtime", "operator-agent", "include")
NAME = re.compile(r"TDIST_[A-Z0-9_]*[A-Z0-9]")
IDENT = re.compile(r"\b(TDIST_[A-Z0-9_]*[A-Z0-9])\b")
DYNAMIC = re.compile(r"TDIST_(?![A-Z0-9])")
GETENV = re.compile(r"\b(?:secure_)?getenv\s*\(\s*")
# (path, literal text): where a TDIST_ name is built from a table, by design.
DYNAMIC_OK = {
    ("runtime/common/param.c", 'TDIST_'),  # "TDIST_" #id: the table's names
    ("operator-agent/common/param.c", 'TDIST_'),  # the same in the agent's table
    ("operator-agent/config/config.c", "TDIST_%s"),  # TDIST_<FLAG> of the option table
    ("operator-agent/config/config.c", "TDIST_"),  # agent_cfg_tdist_env_name(): the same names
    ("operator-agent/config/config_usage.c", None),  # --help text: "TDIST_<FLAG>"
}
# Literal TDIST_* names that are not variables nor identifiers, each with its reason.
NOT_VARIABLES = {
    "TDIST_UNKNOWN": "tdist_status_name() of a status outside the list",
}
# Variables tdist-agent sets for its workers and no C code reads (its sitecustomize.py does, in
# the worker: operator-agent/pystack/; docs/agent.md documents them), each with its reader.
WORKER_ONLY = {
    "TDIST_PY_STACKS_FILE": "operator-agent/pystack/sitecustomize.py",
    "TDIST_PY_STACKS_SIGNAL": "operator-agent/pystack/sitecustomize.py",
}
# (path prefix, argument; None: any): getenv of a variable name, each reviewed.
GETENV_OK = {
    ("envparam/envparam.c", None),  # the engine of both tables (libtdist's and the agent's)
    ("runtime/pg/", "name"),  # env_nonempty(): RANK, WORLD_SIZE, MASTER_ADDR, ... (literals)
    ("runtime/mpi/loader.c", "name"),  # parse_env_int(): RANK, WORLD_SIZE (literals)
    ("operator-agent/pmix/pmix_env.c", "name"),  # put(): mpirun's OMPI_* names (literals)
}
# (header, the prefix of its row ids in code, its implementation): the parameter tables.
TABLES = (
    ("runtime/common/param.h", "TDIST__P_", "runtime/common/param.c"),
    ("operator-agent/common/param.h", "AGENT_P_", "operator-agent/common/param.c"),
)
WHERE = "runtime/common/param.h, or operator-agent/common/param.h for the agent"


def lex(text):
    """Yields (kind, value, offset) for 'str' literals (adjacent ones joined) and 'code' runs."""
    i, n = 0, len(text)
    code = []
    pending = None  # (joined literal, offset) waiting for a possible adjacent literal
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
            continue
        if text.startswith("/*", i):
            j = text.find("*/", i + 2)
            i = n if j < 0 else j + 2
            continue
        if c in "\"'":
            j = i + 1
            buf = []
            while j < n and text[j] != c:
                if text[j] == "\\" and j + 1 < n:
                    buf.append(text[j:j + 2])
                    j += 2
                    continue
                if text[j] == "\n":
                    break
                buf.append(text[j])
                j += 1
            lit = "".join(buf)
            if c == '"':
                if code and "".join(code).strip() == "" and pending:
                    pending = (pending[0] + lit, pending[1])
                else:
                    if pending:
                        yield ("str", pending[0], pending[1])
                    if code:
                        yield ("code", "".join(code), i)
                    pending = (lit, i)
                code = []
            else:
                code.append("'x'")
            i = j + 1
            continue
        code.append(c)
        i += 1
    if pending:
        yield ("str", pending[0], pending[1])
    if code:
        yield ("code", "".join(code), n)


def strip_for_code(text):
    """The text with comments and literals blanked (for identifier and getenv scans)."""
    out, i, n = [], 0, len(text)
    while i < n:
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
            continue
        if text.startswith("/*", i):
            j = text.find("*/", i + 2)
            i = n if j < 0 else j + 2
            out.append(" ")
            continue
        c = text[i]
        if c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            out.append(c + "S" + c)  # a literal stays a literal, empty
            i = j + 1
            continue
        out.append(c)
        i += 1
    return "".join(out)


def sources(root):
    for d in DIRS:
        for base, _, files in os.walk(os.path.join(root, d)):
            for f in sorted(files):
                if f.endswith((".c", ".h")):
                    p = os.path.join(base, f)
                    yield os.path.relpath(p, root), open(p, encoding="utf-8", errors="replace").read()


def main():
    root, names_file = sys.argv[1], sys.argv[2]
    names = set(l.strip() for l in open(names_file) if l.strip())
    files = list(sources(root))
    if not any(p == "runtime/common/param.c" for p, _ in files):
        print("param_tree_check: %s has no runtime/common/param.c: not a checkout" % root)
        return 1
    idents, code_of = set(), {}
    for path, text in files:
        code_of[path] = strip_for_code(text)
        idents.update(IDENT.findall(code_of[path]))
    bad = []
    for path, text in files:
        for kind, lit, off in lex(text):
            if kind != "str":
                continue
            line = text.count("\n", 0, off) + 1
            for m in NAME.finditer(lit):
                if m.group(0) not in names and m.group(0) not in idents and \
                        m.group(0) not in NOT_VARIABLES and m.group(0) not in WORKER_ONLY:
                    bad.append("%s:%d: %s is read or named here but is not in the parameter "
                               "tables (%s)" % (path, line, m.group(0), WHERE))
            if DYNAMIC.search(lit) and (path, lit) not in DYNAMIC_OK and (path, None) not in DYNAMIC_OK:
                bad.append("%s:%d: \"%s\" builds a TDIST_* name at run time; read variables "
                           "through the parameter tables (%s)" % (path, line, lit, WHERE))
        code = code_of[path]
        for m in GETENV.finditer(code):
            j, depth = m.end(), 1
            while j < len(code) and depth:
                depth += {"(": 1, ")": -1}.get(code[j], 0)
                j += 1
            arg = code[m.end():j - 1].strip()
            if arg.startswith('"'):
                continue  # a literal: checked above
            if not any(path.startswith(p) and a in (None, arg) for p, a in GETENV_OK):
                line = code.count("\n", 0, m.start()) + 1
                bad.append("%s:%d: getenv(%s) reads a variable not named by a literal; read "
                           "TDIST_* variables through the parameter tables (%s)" % (path, line, arg, WHERE))
    texts = dict(files)
    for header_path, prefix, impl in TABLES:
        if header_path not in texts:
            if header_path == "runtime/common/param.h":
                bad.append("runtime/common/param.h: not found")
            continue  # a scratch tree without the agent's table
        ids = re.findall(r"^\s*X\((\w+),", texts[header_path], re.M)
        if not ids:
            bad.append("%s: no X( rows found" % header_path)
        for pid in ids:
            use = prefix + pid
            if not any(use in code_of[p] for p, _ in files if p not in (impl, header_path)):
                bad.append("%s: TDIST_%s is in the table but nothing reads it" % (header_path, pid))
    for b in bad:
        print(b)
    print("param_tree_check: %d files, %d names in the tables, %d findings"
          % (len(files), len(names), len(bad)))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
