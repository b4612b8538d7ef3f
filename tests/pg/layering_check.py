#!/usr/bin/env python3
"""The runtime's layering, checked on a source tree (issue 34, item 2):

  1. no cycle between the folders of runtime/ in the #include graph ("runtime/X/..." includes),
  2. no cycle between the Bazel packages of runtime/ in their BUILD files' labels
     (//runtime/X..., the assembling package //runtime itself left out),
  3. the group's private header (runtime/pg/group.h) included only from runtime/pg/,
  4. no backend (runtime/gloo, runtime/nccl, runtime/mpi) reading the group struct (`pg->`,
     struct tdist_pg_s): they see the backend context of runtime/pg/backend.h.

Usage: layering_check.py ROOT. Prints every finding and exits 1 if there is one.
"""
import os
import re
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s+"runtime/([A-Za-z0-9_]+)/([^"]+)"', re.M)
LABEL = re.compile(r'"//runtime/([A-Za-z0-9_]+)[:"]')
BACKENDS = ("gloo", "nccl", "mpi")
PRIVATE = ("pg", "group.h")  # (folder, header) that only its own folder may include


def sources(root):
    """Yields (folder under runtime/, path relative to root) of every C/C++ file."""
    base = os.path.join(root, "runtime")
    for dirpath, _, files in os.walk(base):
        rel = os.path.relpath(dirpath, base)
        folder = rel.split(os.sep)[0]
        if folder == ".":
            continue
        for f in sorted(files):
            if f.endswith((".c", ".h", ".cc", ".cpp")):
                yield folder, os.path.relpath(os.path.join(dirpath, f), root)


def strip_comments(text):
    """The code without its comments, lines kept where they were."""
    return re.sub(r"/\*.*?\*/|//[^\n]*", lambda m: "\n" * m.group(0).count("\n") or " ", text,
                  flags=re.S)


def cycles(edges):
    """Every edge (a, b) that lies on a cycle of the graph, as 'a -> b -> ... -> a' texts."""
    found = []
    for a in sorted(edges):
        for b in sorted(edges[a]):
            # a path back from b to a closes a cycle through the edge a -> b
            stack, seen = [(b, [a, b])], {b}
            while stack:
                node, path = stack.pop()
                if node == a:
                    found.append(" -> ".join(path))
                    break
                for n in sorted(edges.get(node, ())):
                    if n not in seen or n == a:
                        seen.add(n)
                        stack.append((n, path + [n]))
    return found


def check(root):
    findings = []
    inc_edges, why = {}, {}
    for folder, path in sources(root):
        with open(os.path.join(root, path), encoding="utf-8", errors="replace") as f:
            text = f.read()
        for m in INCLUDE.finditer(text):
            to, header = m.group(1), m.group(2)
            line = text.count("\n", 0, m.start()) + 1
            if to != folder:
                inc_edges.setdefault(folder, set()).add(to)
                why.setdefault((folder, to), "%s:%d" % (path, line))
            if (to, header) == PRIVATE and folder != PRIVATE[0]:
                findings.append("%s:%d: includes runtime/%s/%s, private to runtime/%s/"
                                % (path, line, to, header, to))
        if folder in BACKENDS:
            code = strip_comments(text)
            for m in re.finditer(r"\bpg->|\bstruct\s+tdist_pg_s\b", code):
                line = code.count("\n", 0, m.start()) + 1
                findings.append("%s:%d: a backend reads the group (%s): use the context "
                                "(runtime/pg/backend.h)" % (path, line, m.group(0)))
    for c in cycles(inc_edges):
        hops = c.split(" -> ")
        first = why[(hops[0], hops[1])]
        findings.append("include cycle between folders: %s (%s, ...)" % (c, first))
    build_edges = {}
    base = os.path.join(root, "runtime")
    for folder in sorted(os.listdir(base)):
        build = os.path.join(base, folder, "BUILD")
        if not os.path.isfile(build):
            continue
        with open(build, encoding="utf-8") as f:
            text = re.sub(r"#[^\n]*", " ", f.read())
        for m in LABEL.finditer(text):
            if m.group(1) != folder:
                build_edges.setdefault(folder, set()).add(m.group(1))
    for c in cycles(build_edges):
        findings.append("Bazel dependency cycle between packages: //runtime/%s"
                        % " -> //runtime/".join(c.split(" -> ")))
    return findings


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: layering_check.py ROOT")
    findings = check(sys.argv[1])
    for f in findings:
        print(f)
    print("layering_check: %d findings" % len(findings))
    sys.exit(1 if findings else 0)


if __name__ == "__main__":
    main()
