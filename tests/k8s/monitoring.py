#!/usr/bin/python3
"""Helpers of the k8s/monitoring tests (monitoring_rules_test.sh, monitoring_live_test.sh).

  monitoring.py rules RENDERED.yaml OUT.yml       the PrometheusRule's groups as a rules file
  monitoring.py names RULES.yml                   metric names the rules read, one per line
  monitoring.py snapshot URL PHASE NAME...        the series of NAMEs Prometheus holds now, as
                                                  recording lines (stdout)
  monitoring.py compare COMMITTED FRESH           the series (name and labels, per phase) of a
                                                  fresh recording are those of the committed one
  monitoring.py gen SERIES CASES RULES.yml OUT    a `promtool test rules` file: every case of
                                                  CASES built on the recorded series
  monitoring.py selftest RULES.yml TESTS.yml      each alert made never to fire, then always:
                                                  its firing, then its quiet cases must fail
  monitoring.py panels RENDERED.yaml              the dashboard's (panel, expr) pairs, checked
  monitoring.py query URL RENDERED.yaml VAR=VALUE...  each panel query, $variables substituted,
                                                  must return data; an empty one names the panel
                                                  and the series absent from the scrape
The recording (monitoring_series.txt) holds, for each phase of the live job ("steady0" and
"steady1" a few seconds apart while it trains, "stalled" while one rank is stopped), the
seconds since the job's first phase and every series the rules read, as Prometheus stored it.
Series names the lead fixed for issue 37 that other branches add are listed in ADDED_BY so a
missing one says where it should come from.
"""
import json
import os
import re
import subprocess
import sys
import tempfile
import urllib.parse
import urllib.request

import yaml

# Series of issue 37's fixed list that this branch does not export itself: who adds them.
ADDED_BY = {
    "tdist_rank_cpu_seconds_total": "obs1", "tdist_rank_resident_memory_bytes": "obs1",
    "tdist_rank_threads": "obs1", "tdist_rank_process_state": "obs1",
    "tdist_rank_context_switches_total": "obs1", "tdist_rank_io_bytes_total": "obs1",
    "tdist_rank_gpu_utilization_ratio": "obs1 (NVML)", "tdist_rank_gpu_memory_bytes": "obs1 (NVML)",
    "tdist_rank_stalled": "obs1", "tdist_agent_sample_seconds_total": "obs1",
    "tdist_rank_wait_caused_seconds_total": "strag", "tdist_straggler_rank": "strag",
}
COUNTER_SUFFIXES = ("_total", "_count", "_sum", "_bucket")
# Series whose labels may differ from run to run (which waiting ranks the hang detector reports
# beside the stopped one depends on timing): recordings are compared on their names only.
VARIABLE = ("tdist_rank_stalled",)
NAME_RE = re.compile(r"\b(tdist_[a-z0-9_]+|up)\b")
SERIES_RE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)\{(.*)\}$')
LABEL_RE = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def die(msg):
    print(f"monitoring.py: {msg}", file=sys.stderr)
    sys.exit(1)


def load_docs(path):
    return [d for d in yaml.safe_load_all(open(path)) if d]


def one_kind(path, kind):
    got = [d for d in load_docs(path) if d.get("kind") == kind]
    if len(got) != 1:
        die(f"{path}: {len(got)} objects of kind {kind}, expected 1")
    return got[0]


def cmd_rules(rendered, out):
    rule = one_kind(rendered, "PrometheusRule")
    yaml.safe_dump({"groups": rule["spec"]["groups"]}, open(out, "w"), sort_keys=False)


def rule_names(rules_file):
    names = set()
    for g in yaml.safe_load(open(rules_file))["groups"]:
        for r in g["rules"]:
            names.update(NAME_RE.findall(r["expr"]))
    return sorted(names)


def fmt_series(name, labels):
    inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return f"{name}{{{inner}}}"


def parse_series(text):
    m = SERIES_RE.match(text)
    if not m:
        die(f"not a series: {text}")
    return m.group(1), {k: v for k, v in LABEL_RE.findall(m.group(2))}


def prom_get(url, path, **params):
    q = urllib.parse.urlencode(params)
    with urllib.request.urlopen(f"{url}{path}?{q}", timeout=10) as r:
        d = json.load(r)
    if d.get("status") != "success":
        die(f"{path} {params}: {d}")
    return d["data"]


def cmd_snapshot(url, phase, t, names):
    print(f"@{phase} {t}")
    for name in names:
        res = prom_get(url, "/api/v1/query", query=f'{{__name__="{name}"}}')["result"]
        for r in sorted(res, key=lambda r: fmt_series(name, r["metric"])):
            labels = {k: v for k, v in r["metric"].items() if k != "__name__"}
            print(f"{fmt_series(name, labels)} {r['value'][1]}")


def load_recording(path):
    """{phase: (seconds, {series: value})} in file order."""
    phases, cur = {}, None
    for line in open(path):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("@"):
            p, t = line[1:].split()
            cur = phases.setdefault(p, (float(t), {}))[1]
            continue
        if cur is None:
            die(f"{path}: a series before the first @phase line")
        s, v = line.rsplit(" ", 1)
        cur[s] = float(v)
    return phases


def identities(series):
    out = set()
    for s in series:
        name, labels = parse_series(s)
        out.add(f"{name}{{...}}" if name in VARIABLE else fmt_series(name, labels))
    return out


def cmd_compare(committed, fresh):
    a, b = load_recording(committed), load_recording(fresh)
    bad = 0
    for phase in sorted(set(a) | set(b)):
        ia, ib = identities(a.get(phase, (0, {}))[1]), identities(b.get(phase, (0, {}))[1])
        for s in sorted(ib - ia):
            print(f"FAIL: phase {phase}: {s} is exported now but not in the committed recording")
            bad += 1
        for s in sorted(ia - ib):
            print(f"FAIL: phase {phase}: {s} is in the committed recording but no longer exported")
            bad += 1
    if bad:
        print("The recording is out of date: regenerate it (tests/k8s/monitoring_live_test.sh --record,"
              " see the header of tests/k8s/monitoring_series.txt) and review the rules' cases.")
    else:
        print(f"ok: the fresh recording has the committed series in every phase ({len(a)} phases)")
    return 1 if bad else 0


def values_for(name, phase_vals, rate_per_min, minutes):
    """A promtool values string: gauges constant, counters growing at their recorded rate."""
    v = phase_vals
    if name.endswith(COUNTER_SUFFIXES) and rate_per_min:
        return f"{v:g}+{rate_per_min:g}x{minutes}"
    return f"{v:g}+0x{minutes}"


def target_labels(series, pod):
    for s in series:
        _, labels = parse_series(s)
        if labels.get("pod") == pod and "job" in labels:
            return {k: labels[k] for k in ("namespace", "job", "pod", "instance", "container", "endpoint")
                    if k in labels}
    die(f"no recorded series of pod {pod}")


def case_series(rec, case, minutes):
    """({series: values}, [series the overrides set]) of one case: its phase's recorded series,
    less the names in "drop", then its overrides ("set": a series selector, matched as a subset
    of the labels, and its values; one that matches nothing is added, with the target labels of
    its pod)."""
    phase = case.get("phase", "steady1")
    if phase not in rec:
        die(f"case {case['name']}: no phase {phase} in the recording")
    t1, vals = rec[phase]
    t0, v0 = rec.get("steady0", (t1, {}))
    ts, vs = rec.get("steady1", (t1, vals))
    out, touched = {}, []
    for s, v in vals.items():
        name = parse_series(s)[0]
        rate = 0.0
        if phase.startswith("steady") and s in v0 and ts > t0:
            rate = round(max(vs.get(s, v) - v0[s], 0) / (ts - t0) * 60, 3)
        out[s] = values_for(name, v, rate, minutes)
    for s in [s for s in out if parse_series(s)[0] in case.get("drop", [])]:
        del out[s]
    for ov in case.get("set", []):
        name, labels = parse_series(ov["series"])
        hit = [s for s in out if parse_series(s)[0] == name and
               labels.items() <= parse_series(s)[1].items()]
        if not hit:
            full = dict(target_labels(vals, labels["pod"]), **labels) if "pod" in labels else labels
            full.update(ov.get("add_labels", {}))
            hit = [fmt_series(name, full)]
        for s in hit:
            out[s] = ov["values"]
            touched.append(s)
    return out, touched


def fill_labels(exp, series):
    """exp_labels values '@NAME.LABEL' take LABEL of the (one) series NAME the case set."""
    out = {}
    for k, v in exp.items():
        m = re.match(r"^@(\w+)\.(\w+)$", str(v))
        if m:
            got = {parse_series(s)[1].get(m.group(2)) for s in series if parse_series(s)[0] == m.group(1)}
            if len(got) != 1:
                die(f"{v}: {len(got)} values in the case's series")
            v = got.pop()
        out[k] = str(v)
    return out


def render(template, labels, value):
    """The rule's annotation with {{ $labels.X }} and {{ $value ... }} (any pipeline) replaced: the
    case says how Prometheus prints its value ("value"), the labels come from its expectation."""
    t = re.sub(r"\{\{ *\$labels\.(\w+) *\}\}", lambda m: labels.get(m.group(1), "<no value>"), template)
    return re.sub(r"\{\{[^}]*\$value[^}]*\}\}", value, t)


def expected(e, rule, touched):
    labels = fill_labels(e["labels"], touched)
    ann = e.get("annotations")
    if ann is None:
        if "value" not in e:
            die(f"{rule['alert']}: an expected alert needs 'value' (as the annotations print it) or 'annotations'")
        ann = {k: render(v, labels, str(e["value"])) for k, v in rule.get("annotations", {}).items()}
    return {"exp_labels": labels, "exp_annotations": ann}


def cmd_gen(series_file, cases_file, rules_file, out):
    rec = load_recording(series_file)
    cases = yaml.safe_load(open(cases_file))
    rules = {r["alert"]: r for g in yaml.safe_load(open(rules_file))["groups"] for r in g["rules"] if "alert" in r}
    alerts = list(rules)
    recorded = {parse_series(s)[0] for p in rec.values() for s in p[1]}
    missing = [n for n in rule_names(rules_file) if n not in recorded]
    for n in missing:
        print(f"NOTE: {n} is read by the rules but absent from the recording (added by branch "
              f"{ADDED_BY.get(n, '?')}): its cases use series written by hand until the recording is regenerated")
    firing, quiet, tests = {a: [] for a in alerts}, {a: [] for a in alerts}, []
    minutes = cases.get("minutes", 90)
    for case in cases["cases"]:
        series, touched = case_series(rec, case, minutes)
        t = {"name": case["name"], "interval": "1m",
             "input_series": [{"series": s, "values": v} for s, v in sorted(series.items())],
             "alert_rule_test": []}
        for a in case.get("quiet", []):
            quiet[a].append(case["name"])
            t["alert_rule_test"].append({"eval_time": case.get("eval_time", "60m"), "alertname": a, "exp_alerts": []})
        for f in case.get("fires", []):
            firing[f["alert"]].append(case["name"])
            if f["alert"] not in rules:
                die(f"case {case['name']}: no alert {f['alert']} in the rules")
            t["alert_rule_test"].append({"eval_time": case.get("eval_time", "60m"), "alertname": f["alert"],
                                         "exp_alerts": [expected(e, rules[f["alert"]], touched) for e in f["alerts"]]})
        tests.append(t)
    bad = [f"{a}: no firing case" for a in alerts if not firing[a]] + \
          [f"{a}: no quiet case" for a in alerts if not quiet[a]] + \
          [f"{a}: cases name an alert the rules lack" for a in set(firing) | set(quiet) if a not in alerts]
    yaml.safe_dump({"rule_files": [rules_file], "evaluation_interval": "1m", "tests": tests},
                   open(out, "w"), sort_keys=False, width=1000)
    for a in alerts:
        print(f"{a}: fires in {', '.join(firing[a]) or '-'}; quiet in {', '.join(quiet[a]) or '-'}")
    for b in bad:
        print(f"FAIL: {b}")
    return 1 if bad else 0


def promtool_test(rules, tests, expr, firing, out_dir):
    """promtool test rules with every alert's expr replaced by expr, on the checks where an alert
    fires (firing) or stays quiet; returns the alerts whose checks failed."""
    r = yaml.safe_load(open(rules))
    for g in r["groups"]:
        for rule in g["rules"]:
            if "alert" in rule:
                rule["expr"] = expr
    t = yaml.safe_load(open(tests))
    t["rule_files"] = [os.path.join(out_dir, "rules.yml")]
    for x in t["tests"]:
        x["alert_rule_test"] = [a for a in x["alert_rule_test"] if bool(a["exp_alerts"]) == firing]
    t["tests"] = [x for x in t["tests"] if x["alert_rule_test"]]
    yaml.safe_dump(r, open(t["rule_files"][0], "w"))
    yaml.safe_dump(t, open(os.path.join(out_dir, "tests.yml"), "w"), width=1000)
    p = subprocess.run(["promtool", "test", "rules", os.path.join(out_dir, "tests.yml")],
                       capture_output=True, text=True)
    return set(re.findall(r"alertname: (\w+),", p.stdout + p.stderr))


def cmd_selftest(rules, tests):
    """Every alert rewritten never to fire must fail one of its firing checks, and rewritten always
    to fire one of its quiet checks (two promtool runs, all alerts rewritten at once: each check
    names its alert)."""
    alerts = [r["alert"] for g in yaml.safe_load(open(rules))["groups"] for r in g["rules"] if "alert" in r]
    bad = 0
    with tempfile.TemporaryDirectory() as d:
        for what, expr, firing in (("never fires", "absent(vector(1))", True), ("always fires", "vector(1)", False)):
            caught = promtool_test(rules, tests, expr, firing, d)
            for a in alerts:
                if a not in caught:
                    print(f"FAIL: self-test: {a} rewritten so that it {what}: its cases still pass")
                    bad += 1
    print(f"self-test: {2 * len(alerts) - bad} of {2 * len(alerts)} rewritten alerts caught by their cases")
    return 1 if bad else 0


def panel_queries(rendered):
    cm = one_kind(rendered, "ConfigMap")
    if cm["metadata"].get("labels", {}).get("grafana_dashboard") != "1":
        die("the dashboard ConfigMap lacks the label grafana_dashboard: \"1\" the Grafana sidecar loads")
    (key, text), = cm["data"].items()
    d = json.loads(text)
    out = []
    for p in d["panels"]:
        for sub in [p] + p.get("panels", []):
            if sub["type"] == "row":
                continue
            if not sub.get("targets"):
                die(f"panel '{sub['title']}' has no query")
            for t in sub["targets"]:
                if t["datasource"]["uid"] != "${datasource}":
                    die(f"panel '{sub['title']}': a datasource other than the $datasource variable")
                out.append((sub["title"], t["expr"]))
    return d, out


def cmd_panels(rendered):
    d, qs = panel_queries(rendered)
    names = [v["name"] for v in d["templating"]["list"]]
    for title, expr in qs:
        for v in re.findall(r"\$(\w+)", expr):
            if v not in names and not v.startswith("__"):
                die(f"panel '{title}': ${v} is not a dashboard variable ({names})")
    print(f"ok: {len(qs)} queries in {len({t for t, _ in qs})} panels, variables {names}")


def cmd_query(url, rendered, subst):
    _, qs = panel_queries(rendered)
    sel = {}
    for kv in subst:
        k, v = kv.split("=", 1)
        sel[k] = v
    bad = 0
    for title, expr in qs:
        q = re.sub(r"\$(\w+)", lambda m: sel.get(m.group(1), m.group(0)), expr)
        if "$" in q:
            die(f"panel '{title}': unsubstituted variable in {q}")
        res = prom_get(url, "/api/v1/query", query=q)["result"]
        if res:
            print(f"ok: '{title}': {q} -> {len(res)} series")
            continue
        bad += 1
        absent = []
        for n in sorted(set(NAME_RE.findall(q))):
            base = n
            if not prom_get(url, "/api/v1/query", query=f'count({{__name__="{base}"}})')["result"]:
                absent.append(f"{base} (added by branch {ADDED_BY[base]})" if base in ADDED_BY else base)
        why = f"series absent from the scrape: {', '.join(absent)}" if absent else \
            "every series it reads is scraped, yet the query is empty"
        print(f"FAIL: panel '{title}': {q} returned nothing; {why}")
    print(f"{len(qs) - bad} of {len(qs)} dashboard queries returned data")
    return 1 if bad else 0


def main(argv):
    if len(argv) < 2:
        die(__doc__)
    cmd, a = argv[1], argv[2:]
    if cmd == "rules":
        return cmd_rules(*a)
    if cmd == "names":
        print("\n".join(rule_names(a[0])))
        return 0
    if cmd == "snapshot":
        return cmd_snapshot(a[0], a[1], a[2], a[3:])
    if cmd == "compare":
        return cmd_compare(*a)
    if cmd == "gen":
        return cmd_gen(*a)
    if cmd == "selftest":
        return cmd_selftest(*a)
    if cmd == "panels":
        return cmd_panels(*a)
    if cmd == "query":
        return cmd_query(a[0], a[1], a[2:])
    die(f"unknown command {cmd}")


if __name__ == "__main__":
    sys.exit(main(sys.argv) or 0)
