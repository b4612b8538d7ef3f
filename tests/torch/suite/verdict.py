"""The verdict over one run of PyTorch's suite: tdist against gloo and the expected failures.

The expected-failures file (expected_failures.txt beside this file) has one test a line:

    NAME  TORCH  WORLD  REASON

TORCH is "*", "1.13", "2.6" or a comma list of them; WORLD is "*" or a comma list of world
sizes; REASON is the rest of the line and starts with its kind: REFUSED (a refusal docs/pytorch.md
documents), NAME (the test asserts gloo's name), WORDING (the test matches gloo's exact words),
or DEFECT (a defect of ours being fixed; the line goes once the fix is merged). A line that
starts with '#' is a comment. A test may have several lines (one per PyTorch or world size);
the first that matches counts.

Rules, per test of the run:
  gloo passes, tdist passes        ok; if listed: "listed but passes" (fails the verdict)
  gloo passes, tdist fails/skips   listed: expected failure; else a failure of the verdict
  gloo skips                       not compared (neither runs it here)
  gloo fails                       not compared; listed in the report as a failing reference
"""

import re

KINDS = ("REFUSED", "NAME", "WORDING", "DEFECT")


def _matches(field, value):
    return field == "*" or value in field.split(",")


def load_expected(path, torch, world):
    """{test: reason} of the lines of path that apply to PyTorch torch ("1.13") and world."""
    out = {}
    with open(path) as f:
        for n, raw in enumerate(f, 1):
            line = "" if raw.lstrip().startswith("#") else raw.strip()
            if not line:
                continue
            parts = line.split(None, 3)
            if len(parts) < 4 or not re.match(r"(%s)\b" % "|".join(KINDS), parts[3]):
                raise SystemExit(
                    "%s:%d: expected 'NAME TORCH WORLD REASON' with REASON starting with one of %s, got: %s"
                    % (path, n, ", ".join(KINDS), raw.rstrip()))
            name, t, w, reason = parts
            if name not in out and _matches(t, torch) and _matches(w, str(world)):
                out[name] = reason
    return out


def judge(tests, results, expected):
    g, d = results["gloo"], results["tdist"]
    rep = {"ok": True, "pass": [], "expected": [], "unexpected": [], "stale": [],
           "gloo_fails": [], "skipped": [], "tdist_only": []}
    for t in tests:
        gr = g.get(t, {}).get("result", "missing")
        dr = d.get(t, {}).get("result", "missing")
        listed = t in expected
        if gr == "skip":
            rep["skipped"].append(t)
            if dr == "pass":
                rep["tdist_only"].append(t)
        elif gr != "pass":
            rep["gloo_fails"].append(t)
        elif dr == "pass":
            (rep["stale"] if listed else rep["pass"]).append(t)
        else:
            (rep["expected"] if listed else rep["unexpected"]).append(t)
    rep["ok"] = not rep["unexpected"] and not rep["stale"]
    rep["expected_reasons"] = expected
    return rep


def _first_line(rec):
    """The most telling line of a failure: run_suite's own summary (a hang, a worker that
    died), else the first exception a rank raised (the suite wraps it in "RuntimeError:
    Process N exited with error code 10 and exception: ..."), else the last line."""
    if (rec or {}).get("summary"):
        return rec["summary"]
    detail = (rec or {}).get("detail") or ""
    lines = [ln.strip() for ln in detail.splitlines() if ln.strip()]
    for ln in lines:
        if re.match(r"^([\w.]+\.)?\w*(Error|Exception|Exit)\b", ln) and not re.match(
                r"^RuntimeError: Process \d+ (exited|terminated)", ln):
            return ln[:400]
    return (lines[-1] if lines else "")[:400]


def counts(results, backend, tests):
    c = {"pass": 0, "fail": 0, "skip": 0}
    for t in tests:
        r = results[backend].get(t, {}).get("result", "fail")
        c[r] = c.get(r, 0) + 1
    return c


def render(rep, results, title):
    tests = rep["pass"] + rep["expected"] + rep["unexpected"] + rep["stale"] + rep["gloo_fails"] + rep["skipped"]
    compared = rep["pass"] + rep["expected"] + rep["unexpected"] + rep["stale"]
    g, d = counts(results, "gloo", tests), counts(results, "tdist", compared)
    out = ["", "=== %s: %d tests" % (title, len(tests)),
           "gloo:  %(pass)d passed, %(fail)d failed, %(skip)d skipped" % g,
           ("tdist: %(pass)d passed, %(fail)d failed, %(skip)d skipped" % d)
           + " (of the %d gloo passes: the others are not run on tdist)" % len(compared),
           "tdist failures: %d listed, %d not listed; listed tests that pass: %d" % (
               len(rep["expected"]), len(rep["unexpected"]), len(rep["stale"]))]
    for t in rep["unexpected"]:
        out.append("FAIL %s: gloo passes, tdist %s: %s" % (
            t, results["tdist"].get(t, {}).get("result", "missing"), _first_line(results["tdist"].get(t))))
    for t in rep["stale"]:
        out.append("FAIL %s: listed in the expected failures (%s) but passes on tdist: remove its line"
                   % (t, rep["expected_reasons"][t]))
    for t in rep["expected"]:
        out.append("expected failure %s (%s): %s" % (
            t, rep["expected_reasons"][t].split(":")[0], _first_line(results["tdist"].get(t))))
    for t in rep["gloo_fails"]:
        out.append("not compared %s: the reference fails on gloo here: %s" % (
            t, _first_line(results["gloo"].get(t))))
    out.append("verdict: %s" % ("PASS" if rep["ok"] else "FAIL"))
    return "\n".join(out)
