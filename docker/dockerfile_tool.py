#!/usr/bin/env python3
"""What docker/check_build.sh cannot do well in bash: read a Dockerfile and a .dockerignore the way
Docker (BuildKit's default frontend) does.

  dockerfile_tool.py parse DOCKERFILE [--build-arg NAME=VALUE]...
      One instruction per line, fields separated by tabs (a value with a tab or newline is an
      error), variables substituted where Docker substitutes them (FROM with the global ARGs;
      COPY, ENV, WORKDIR, USER, EXPOSE, LABEL, STOPSIGNAL with the stage's ARGs and ENVs; RUN is
      left to the shell, which sees the ARGs and ENVs as environment variables):
        stage NAME BASE | arg STAGE NAME VALUE | env STAGE NAME VALUE | workdir STAGE ABSPATH |
        copy STAGE FROM|- DEST SRC... | run STAGE COMMAND | user STAGE VALUE |
        expose STAGE PORT... | stopsignal STAGE SIG | entrypoint STAGE JSON | cmd STAGE JSON |
        label STAGE KEY VALUE
      STAGE is "-" for the ARGs before the first FROM; DEST is absolute (WORKDIR applied).
  dockerfile_tool.py copy-context CONTEXT DEST [--dereference]
      Copies CONTEXT to DEST leaving out what CONTEXT/.dockerignore excludes; prints
      "FILES BYTES". Symbolic links are copied as links (as Docker sends them) unless
      --dereference (for a Bazel runfiles tree, which is made of links).
  dockerfile_tool.py ignored CONTEXT PATH...
      Prints "excluded PATH" or "included PATH" for each path (relative to CONTEXT).
  dockerfile_tool.py apt-packages COMMAND
      The package names of every `apt-get install` in a shell command.

It never runs anything from the Dockerfile. Exit status 2 on bad usage or an unreadable file."""

import json
import os
import re
import shlex
import shutil
import sys

# ------------------------------------------------------------------------------------------
# Dockerfile


def die(msg):
    sys.stderr.write("dockerfile_tool: %s\n" % msg)
    sys.exit(2)


def logical_lines(text):
    """Joins continuation lines (backslash at the end) and drops comments and blank lines, as
    Docker's parser does (a comment line inside a continued instruction is dropped too)."""
    out, cur, cur_no = [], None, 0
    for no, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if line.startswith("#"):
            continue
        if cur is None:
            if not line:
                continue
            cur, cur_no = "", no
        cont = re.search(r"\\[ \t]*$", raw)
        if cont:
            cur += raw[: cont.start()]
            continue
        cur += raw
        out.append((cur_no, cur.strip()))
        cur = None
    if cur is not None and cur.strip():
        out.append((cur_no, cur.strip()))
    return out


# \$ (a literal $), ${NAME}, ${NAME:-WORD}, ${NAME:+WORD}, $NAME
VAR = re.compile(r"\\\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?::([-+])([^}]*))?\}|\$([A-Za-z_][A-Za-z0-9_]*)")


def substitute(s, env):
    def rep(m):
        if m.group(0) == "\\$":
            return "$"
        if m.group(4) is not None:
            return env.get(m.group(4), "")
        val = env.get(m.group(1), "")
        if m.group(2) == "-":
            return val if val else m.group(3)
        if m.group(2) == "+":
            return m.group(3) if val else ""
        return val

    return VAR.sub(rep, s)


def key_values(args, env, what, line):
    """ENV/LABEL/ARG arguments: NAME=VALUE pairs (shell-like quoting) or the legacy NAME VALUE."""
    words = shlex.split(args, posix=True)
    if words and "=" not in words[0]:
        if what == "ARG":
            return [(words[0], None)]
        if len(words) < 2:
            die("line %d: %s %s needs a value" % (line, what, args))
        return [(words[0], substitute(args.split(None, 1)[1], env))]
    pairs = []
    for w in words:
        if "=" not in w:
            die("line %d: %s: '%s' is not NAME=VALUE" % (line, what, w))
        k, v = w.split("=", 1)
        pairs.append((k, substitute(v, env)))
    return pairs


def emit(*fields):
    for f in fields:
        if "\t" in f or "\n" in f:
            die("a value has a tab or newline, which the line format cannot carry: %r" % f)
    print("\t".join(fields))


DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def parse(path, build_args):
    try:
        text = open(path, encoding="utf-8").read()
    except OSError as e:
        die("cannot read %s: %s" % (path, e.strerror))
    global_args = {}
    stage, env, workdir, nstage = None, {}, "/", 0
    for line, instr in logical_lines(text):
        word, _, args = instr.partition(" ")
        kw, args = word.upper(), args.strip()
        if kw == "FROM":
            m = re.match(r"^(?:--platform=\S+\s+)?(\S+)(?:\s+AS\s+(\S+))?$", args, re.I)
            if not m:
                die("line %d: cannot read FROM %s" % (line, args))
            base = substitute(m.group(1), global_args)
            stage = m.group(2) or str(nstage)
            nstage += 1
            # What the base image's config is assumed to hold: Docker's default PATH.
            env, workdir = {"PATH": DEFAULT_PATH}, "/"
            emit("stage", stage, base)
        elif kw == "ARG":
            for k, v in key_values(args, env if stage else global_args, "ARG", line):
                if k in build_args:
                    v = build_args[k]
                elif v is None:
                    v = global_args.get(k, "") if stage else ""
                if stage:
                    env[k] = v
                else:
                    global_args[k] = v
                emit("arg", stage or "-", k, v)
        elif stage is None:
            die("line %d: %s before the first FROM" % (line, kw))
        elif kw == "ENV":
            for k, v in key_values(args, env, "ENV", line):
                env[k] = v
                emit("env", stage, k, v)
        elif kw == "LABEL":
            for k, v in key_values(args, env, "LABEL", line):
                emit("label", stage, k, v)
        elif kw == "WORKDIR":
            workdir = os.path.normpath(os.path.join(workdir, substitute(args, env)))
            emit("workdir", stage, workdir)
        elif kw in ("COPY", "ADD"):
            if kw == "ADD":
                die("line %d: ADD is not supported by check_build.sh; use COPY" % line)
            words = [substitute(w, env) for w in args.split()]
            src_from = "-"
            while words and words[0].startswith("--"):
                flag = words.pop(0)
                if flag.startswith("--from="):
                    src_from = flag.split("=", 1)[1]
                elif not flag.startswith(("--chown=", "--chmod=", "--link")):
                    die("line %d: unsupported COPY flag %s" % (line, flag))
            if args.lstrip().startswith("[") or len(words) < 2:
                die("line %d: COPY needs SRC... DEST in shell form" % line)
            dest = words[-1]
            absdest = os.path.normpath(os.path.join(workdir, dest))
            if dest.endswith("/") or dest in (".", "./"):
                absdest = absdest.rstrip("/") + "/"
            emit("copy", stage, src_from, absdest, *words[:-1])
        elif kw == "RUN":
            if args.startswith("--"):
                die("line %d: RUN flags (--mount, ...) are not supported by check_build.sh" % line)
            if args.startswith("["):
                args = " ".join(shlex.quote(a) for a in json.loads(args))
            emit("run", stage, args)
        elif kw in ("USER", "STOPSIGNAL"):
            emit(kw.lower(), stage, substitute(args, env))
        elif kw == "EXPOSE":
            emit("expose", stage, *substitute(args, env).split())
        elif kw in ("ENTRYPOINT", "CMD"):
            try:
                val = json.loads(args)
                if not isinstance(val, list) or not all(isinstance(x, str) for x in val):
                    raise ValueError
            except ValueError:
                die("line %d: %s must be in exec (JSON array) form, got %s" % (line, kw, args))
            emit(kw.lower(), stage, json.dumps(val))
        elif kw in ("HEALTHCHECK", "SHELL", "VOLUME", "ONBUILD", "MAINTAINER"):
            die("line %d: %s is not supported by check_build.sh" % (line, kw))
        else:
            die("line %d: unknown instruction %s" % (line, kw))


# ------------------------------------------------------------------------------------------
# .dockerignore (the semantics of moby/patternmatcher, which BuildKit uses)


def read_ignore(context):
    pats = []
    try:
        lines = open(os.path.join(context, ".dockerignore"), encoding="utf-8").read().splitlines()
    except FileNotFoundError:
        return pats
    for raw in lines:
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        neg = line.startswith("!")
        if neg:
            line = line[1:].strip()
        line = os.path.normpath(line).lstrip("/")
        if line in ("", "."):
            continue
        pats.append((neg, re.compile(pattern_regex(line)), line))
    return pats


def pattern_regex(p):
    out, i = "^", 0
    while i < len(p):
        c = p[i]
        if c == "*":
            if p.startswith("**", i):
                i += 2
                if p.startswith("/", i):
                    out += "(.*/)?"
                    i += 1
                else:
                    out += ".*"
                continue
            out += "[^/]*"
        elif c == "?":
            out += "[^/]"
        elif c == "[":
            j = p.find("]", i + 1)
            if j < 0:
                out += re.escape(c)
            else:
                cls = p[i + 1 : j]
                out += "[" + ("^" + cls[1:] if cls.startswith("!") else cls) + "]"
                i = j
        elif c == "\\" and i + 1 < len(p):
            i += 1
            out += re.escape(p[i])
        else:
            out += re.escape(c)
        i += 1
    return out + "$"


def excluded(rel, pats):
    """The last pattern that matches the path or one of its parent directories decides."""
    parents = []
    parts = rel.split("/")
    for n in range(1, len(parts)):
        parents.append("/".join(parts[:n]))
    result = False
    for neg, rx, _ in pats:
        if rx.match(rel) or any(rx.match(p) for p in parents):
            result = not neg
    return result


def copy_context(context, dest, dereference=False):
    pats = read_ignore(context)
    may_reinclude = any(neg for neg, _, _ in pats)
    nfiles = nbytes = 0
    os.makedirs(dest, exist_ok=True)
    for root, dirs, files in os.walk(context, followlinks=dereference):
        relroot = os.path.relpath(root, context)
        relroot = "" if relroot == "." else relroot + "/"
        keep = []
        for d in sorted(dirs):
            rel = relroot + d
            full = os.path.join(root, d)
            if os.path.islink(full) and not dereference:
                files.append(d)  # a symlink to a directory is copied as a link
                continue
            if excluded(rel, pats) and not may_reinclude:
                continue
            keep.append(d)
            os.makedirs(os.path.join(dest, rel), exist_ok=True)
        dirs[:] = keep
        for f in sorted(files):
            rel = relroot + f
            if excluded(rel, pats):
                continue
            src, dst = os.path.join(root, f), os.path.join(dest, rel)
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            if os.path.islink(src) and not dereference:
                os.symlink(os.readlink(src), dst)
            else:
                shutil.copy2(src, dst)
                nbytes += os.path.getsize(dst)
            nfiles += 1
    print("%d %d" % (nfiles, nbytes))


# ------------------------------------------------------------------------------------------


def apt_packages(cmd):
    lex = shlex.shlex(cmd, posix=True, punctuation_chars=True)
    lex.whitespace_split = True
    words = list(lex) + [";"]
    ops = ("&&", ";", "||", "|", "&")
    pkgs, i = [], 0
    while i < len(words):
        if words[i] not in ("apt-get", "apt"):
            i += 1
            continue
        j = i + 1  # the command runs to the next shell operator
        while words[j] not in ops:
            j += 1
        cmdwords = words[i + 1 : j]
        if "install" in cmdwords:
            after = cmdwords[cmdwords.index("install") + 1 :]
            pkgs += [w for w in after if not w.startswith("-")]
        i = j
    print("\n".join(pkgs))


def main(argv):
    if len(argv) >= 2 and argv[0] == "parse":
        build_args = {}
        rest = argv[2:]
        while rest:
            if rest[0] != "--build-arg" or len(rest) < 2 or "=" not in rest[1]:
                die("parse: expected --build-arg NAME=VALUE, got %s" % " ".join(rest))
            k, v = rest[1].split("=", 1)
            build_args[k] = v
            rest = rest[2:]
        parse(argv[1], build_args)
    elif len(argv) in (3, 4) and argv[0] == "copy-context":
        if len(argv) == 4 and argv[3] != "--dereference":
            die("copy-context: unknown option %s" % argv[3])
        copy_context(argv[1], argv[2], dereference=len(argv) == 4)
    elif len(argv) >= 3 and argv[0] == "ignored":
        pats = read_ignore(argv[1])
        for p in argv[2:]:
            print("%s %s" % ("excluded" if excluded(os.path.normpath(p), pats) else "included", p))
    elif len(argv) == 2 and argv[0] == "apt-packages":
        apt_packages(argv[1])
    else:
        die("usage: see the top of %s" % __file__)


if __name__ == "__main__":
    main(sys.argv[1:])
