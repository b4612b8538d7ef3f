"""tdist-agent --jobset-in-place-restart against a stand-in API server (jobset_apiserver.py: real
HTTPS, JobSet's controller rule over the pods' annotations), with real agents on this host, one
per pod, and a shell worker; the test is the kubelet: an agent that exits with
IN_PLACE_RESTART_EXIT_CODE is started again for the same pod (restartPolicyRules action Restart).
The protocol's values (annotation key, path, default exit code, env names, bypass annotation and
strategy) come from tests/k8s/controllers.yaml (jobset:), which cites JobSet's source.

  a. 3 pods, --max-restarts 1: each agent PATCHes (merge patch) annotation = "0"; the barrier
     holds (no worker, /barrier-is-down 503) until the controller sets current 0, then 200; a
     worker failing twice uses the restart budget up: every agent exits with the default code 1;
     started again, each PATCHes current+1 = "1", the barrier lifts at 1, the workers run with
     TORCHELASTIC_RESTART_COUNT 2 (attempt 1 * (max_restarts + 1)) and the job ends with 0.
  b. a replaced pod (IN_PLACE_RESTART_EXIT_CODE=42): node 1's agent killed, its pod recreated
     (no annotation), a new agent PATCHes current+1 = "1", the controller sets previous 0, the
     other two agents stop their workers and exit 42; restarted they PATCH "1" and the job ends.
  c. bypass: restartStrategy Recreate, and InPlaceRestart with the disable annotation: no PATCH,
     the worker starts at once, /barrier-is-down 200, /status says bypass.
  e. the watch: an ERROR event with code 410 (re-list), then a line that is not JSON (an error,
     a backoff, a re-list); the agent still sees the barrier lifted and its job ends with 0.
  d. bad answers: 403 and 401 (exit 64, the message names the URL and the RBAC needed), bad JSON
     and an API server that never answers (exit 69 at --rdzv-timeout, the error named), a bad
     IN_PLACE_RESTART_EXIT_CODE (exit 64).
usage: jobset_inplace_test.py AGENT CONTROLLERS_YAML PORTS_SH
"""
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

import yaml

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
import jobset_apiserver  # noqa: E402

AGENT = os.path.realpath(sys.argv[1])
CTL = yaml.safe_load(open(sys.argv[2]))["jobset"]
IPR = CTL["in_place_restart_agent"]
KEY = CTL["in_place_restart_attempt_annotation"]
PATH = IPR["startup_probe_path"]
NS, JS = "team-a", "train"
T = tempfile.mkdtemp(prefix="jip.", dir=os.environ.get("TEST_TMPDIR"))
FAILS = []
PROCS = []

WORKER = """#!/bin/bash
# A worker of jobset_inplace_test: logs its start, then fails or finishes when told.
set -u
echo "$JIP_NODE $TORCHELASTIC_RESTART_COUNT" >>"$JIP_DIR/starts"
while :; do
  [ -e "$JIP_DIR/fail.$JIP_NODE.$TORCHELASTIC_RESTART_COUNT" ] && exit 3
  [ -e "$JIP_DIR/finish" ] && exit 0
  sleep 0.05
done
"""


def check(ok, msg):
    print(("PASS: " if ok else "FAIL: ") + msg, flush=True)
    if not ok:
        FAILS.append(msg)
    return ok


def wait_for(pred, secs=60):
    """Polls pred every 0.1 s until it is true or secs pass: its last value."""
    end = time.monotonic() + secs
    while True:
        v = pred()
        if v or time.monotonic() > end:
            return v
        time.sleep(0.1)


def pod_name(n):
    return "%s-workers-0-%d" % (JS, n)  # controllers.yaml pod_name, without the Job's suffix


class Agent:
    """One pod's agent. start() as the kubelet starts the container; the same pod keeps its
    directory (starts, logs)."""

    def __init__(self, sc, n, srv, args, env=None, sa=None):
        self.sc, self.n, self.srv, self.args, self.env = sc, n, srv, args, env or {}
        self.dir = os.path.join(T, sc)
        os.makedirs(self.dir, exist_ok=True)
        self.sa = sa or srv.sa_dir(os.path.join(self.dir, "sa"))
        self.p = None
        self.port_file = os.path.join(self.dir, "port.%d" % n)
        self.err = os.path.join(self.dir, "agent.%d.err" % n)

    def start(self):
        if os.path.exists(self.port_file):
            os.unlink(self.port_file)
        env = dict(os.environ, TDIST_KUBE_API_URL=self.srv.url, TDIST_KUBE_SA_DIR=self.sa,
                   JIP_DIR=self.dir, JIP_NODE=str(self.n), TDIST_LOG_LEVEL="info")
        env[IPR["jobset_name_env"]] = JS
        env[IPR["pod_name_env"]] = pod_name(self.n)
        env.pop(IPR["exit_code_env"], None)
        env.update(self.env)
        cmd = [AGENT, "--nproc-per-node", "1", "--run-id", "jip-%s-%d" % (self.sc, os.getpid()),
               "--http-port", "0",
               "--http-port-file", self.port_file, "--monitor-interval", "0.05",
               "--stop-grace-period", "5", "--log-dir", self.dir, "--jobset-in-place-restart"]
        cmd += self.args + ["--", os.path.join(T, "worker.sh")]
        with open(self.err, "a") as e:
            self.p = subprocess.Popen(cmd, env=env, stdout=e, stderr=e)
        PROCS.append(self.p)

    def http(self, path):
        """(code, body) of GET path on the agent's port; (None, why) when it does not answer."""
        port = wait_for(lambda: os.path.exists(self.port_file) and open(self.port_file).read(), 30)
        if not port:
            return None, "no port file"
        try:
            with urllib.request.urlopen("http://127.0.0.1:%s%s" % (port.strip(), path),
                                        timeout=10) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()
        except OSError as e:
            return None, str(e)

    def wait(self, secs=90):
        try:
            return self.p.wait(secs)
        except subprocess.TimeoutExpired:
            return "running"

    def kill(self):
        """SIGKILL to the agent under its guard (the pod is lost), then waits for the guard."""
        try:
            kids = open("/proc/%d/task/%d/children" % (self.p.pid, self.p.pid)).read().split()
        except OSError:
            kids = []
        for k in kids:
            try:
                if open("/proc/%s/comm" % k).read().strip() == "tdist-agent":
                    os.kill(int(k), signal.SIGKILL)
            except OSError:
                pass
        self.wait(30)

    def log(self, n=4):
        try:
            return " | ".join(open(self.err).read().splitlines()[-n:])
        except OSError:
            return "(no log)"


def starts(sc):
    try:
        return [tuple(map(int, ln.split())) for ln in open(os.path.join(T, sc, "starts"))]
    except OSError:
        return []


def touch(sc, name):
    open(os.path.join(T, sc, name), "w").close()


def patch_values(srv, since=0):
    """[(pod, content type, {annotations})] of the PATCHes from index since."""
    return [(p, c, (b.get("metadata") or {}).get("annotations")) for p, c, b in srv.patches[since:]]


def check_patches(srv, since, pods, value, what):
    got = sorted(patch_values(srv, since))
    want = sorted((p, "application/merge-patch+json", {KEY: value}) for p in pods)
    check(got == want, "%s: each agent's PATCH sets %s=%r as a merge patch (got %s)"
          % (what, KEY, value, got))


def free_port():
    """A free port for the agents' store (tests/testlib/ports.sh: below the ephemeral range)."""
    ports = sys.argv[3]
    return int(subprocess.run(["bash", "-c", '. "$1"; free_port', "-", ports], check=True,
                              capture_output=True, text=True).stdout)


def multi(n, mp, max_restarts):
    """The flags of node n of a 3-node job on this host."""
    return ["--node-rank", str(n), "--master-addr", "127.0.0.1", "--nnodes", "3", "--master-port",
            str(mp), "--max-restarts", str(max_restarts), "--rdzv-timeout", "60"]


def jip_status(a):
    """/status's jobset_in_place_restart object of agent a, or None."""
    code, body = a.http("/status")
    return json.loads(body).get("jobset_in_place_restart") if code == 200 else None


def scenario_a():
    srv = jobset_apiserver.ApiServer(os.path.join(T, "ca-a"), NS, JS, [pod_name(n) for n in range(3)])
    srv.hold = True
    try:
        mp = free_port()
        ags = [Agent("a", n, srv, multi(n, mp, 1)) for n in range(3)]
        for a in ags:
            a.start()
        wait_for(lambda: len(srv.patches) >= 3, 60)
        check_patches(srv, 0, [pod_name(n) for n in range(3)], "0", "a. start")
        codes = [a.http(PATH)[0] for a in ags]
        check(codes == [503] * 3 and starts("a") == [],
              "a. barrier held (every pod annotated, current unset): %s %s, workers started: %s"
              % (PATH, codes, starts("a")))
        want = {"bypass": False, "barrier_down": False, "attempt": 0, "current": None,
                "previous": None}
        jip = wait_for(lambda: jip_status(ags[1]) == want and want, 30) or jip_status(ags[1])
        check(jip == want, "a. /status while held: %s" % jip)
        srv.release()
        check(srv.status().get("currentInPlaceRestartAttempt") == 0,
              "a. the controller sets current 0 once released: %s" % srv.status())
        ok = wait_for(lambda: len(starts("a")) >= 3, 60)
        check(ok and sorted(starts("a")) == [(0, 0), (1, 0), (2, 0)],
              "a. barrier lifted: the workers start with count 0: %s" % starts("a"))
        codes = [a.http(PATH)[0] for a in ags]
        check(codes == [200] * 3, "a. %s answers %s" % (PATH, codes))
        touch("a", "fail.2.0")
        wait_for(lambda: len(starts("a")) >= 6, 60)
        touch("a", "fail.2.1")  # past --max-restarts 1
        rcs = [a.wait(90) for a in ags]
        check(rcs == [IPR["exit_code"]] * 3,
              "a. a worker failure past --max-restarts: every agent exits %s (the default "
              "IN_PLACE_RESTART_EXIT_CODE): %s" % (IPR["exit_code"], rcs))
        check(all("giving the restart to JobSet" in open(a.err).read() for a in ags),
              "a. each agent says it gives the restart to JobSet: %s" % ags[0].log(2))
        n0 = len(srv.patches)
        for a in ags:  # the kubelet restarts each container in place
            a.start()
        wait_for(lambda: len(srv.patches) >= n0 + 3, 60)
        check_patches(srv, n0, [pod_name(n) for n in range(3)], "1", "a. restarted in place")
        ok = wait_for(lambda: len(starts("a")) >= 9, 90)
        check(ok and sorted(starts("a")[6:]) == [(0, 2), (1, 2), (2, 2)],
              "a. current 1: the workers start again with TORCHELASTIC_RESTART_COUNT 2: %s"
              % starts("a")[6:])
        touch("a", "finish")
        rcs = [a.wait(90) for a in ags]
        check(rcs == [0, 0, 0], "a. the job trains to the end: exit %s" % rcs)
        check(srv.failed is None and srv.status().get("currentInPlaceRestartAttempt") == 1,
              "a. JobSet status %s, failed %s" % (srv.status(), srv.failed))
    finally:
        srv.stop()


def scenario_b():
    srv = jobset_apiserver.ApiServer(os.path.join(T, "ca-b"), NS, JS, [pod_name(n) for n in range(3)])
    try:
        mp = free_port()
        env = {IPR["exit_code_env"]: "42"}
        ags = [Agent("b", n, srv, multi(n, mp, 3), env) for n in range(3)]
        for a in ags:
            a.start()
        ok = wait_for(lambda: len(starts("b")) >= 3, 90)
        check(ok and sorted(starts("b")) == [(0, 0), (1, 0), (2, 0)],
              "b. 3 pods train at attempt 0: %s" % starts("b"))
        ags[1].kill()
        srv.replace_pod(pod_name(1))
        n0 = len(srv.patches)
        ags[1].start()
        wait_for(lambda: len(srv.patches) > n0, 60)
        check_patches(srv, n0, [pod_name(1)], "1", "b. the replaced pod's new agent")
        check(srv.status().get("previousInPlaceRestartAttempt") == 0,
              "b. the controller sets previous 0: %s" % srv.status())
        rcs = [ags[0].wait(90), ags[2].wait(90)]
        check(rcs == [42, 42], "b. nodes 0 and 2 see previous >= their attempt and exit with "
              "IN_PLACE_RESTART_EXIT_CODE 42: %s (%s)" % (rcs, ags[0].log(2)))
        n0 = len(srv.patches)
        ags[0].start()
        ags[2].start()
        wait_for(lambda: len(srv.patches) >= n0 + 2, 60)
        check_patches(srv, n0, [pod_name(0), pod_name(2)], "1", "b. restarted in place")
        ok = wait_for(lambda: len(starts("b")) >= 6, 90)
        check(ok and sorted(starts("b")[3:]) == [(0, 4), (1, 4), (2, 4)],
              "b. current 1: all three train again, TORCHELASTIC_RESTART_COUNT 4: %s"
              % starts("b")[3:])
        touch("b", "finish")
        rcs = [a.wait(90) for a in ags]
        check(rcs == [0, 0, 0], "b. the job trains to the end: exit %s" % rcs)
    finally:
        srv.stop()


def scenario_c():
    for name, strategy, ann in (("c1", "Recreate", {}),
                                ("c2", IPR["restart_strategy"], {IPR["disable_annotation"]: ""})):
        srv = jobset_apiserver.ApiServer(os.path.join(T, "ca-" + name), NS, JS, [pod_name(0)],
                                         strategy=strategy, annotations=ann)
        try:
            a = Agent(name, 0, srv, ["--standalone"])
            a.start()
            ok = wait_for(lambda: starts(name), 60)
            code, _ = a.http(PATH)
            jip = jip_status(a)
            touch(name, "finish")
            rc = a.wait(60)
            what = "restartStrategy %s%s" % (strategy, ", disable annotation" if ann else "")
            check(ok and rc == 0 and srv.patches == [] and code == 200 and jip and jip["bypass"],
                  "c. %s: bypass: worker started at once, exit %s, PATCHes %s, %s %s, /status %s"
                  % (what, rc, srv.patches, PATH, code, jip))
        finally:
            srv.stop()


def scenario_d():
    def one(name, mode=None, token=None, env=None, want_rc=64, want=()):
        srv = jobset_apiserver.ApiServer(os.path.join(T, "ca-" + name), NS, JS, [pod_name(0)])
        try:
            srv.mode = mode or ""
            a = Agent(name, 0, srv, ["--standalone", "--rdzv-timeout", "3"], env,
                      sa=srv.sa_dir(os.path.join(T, name, "sa"), token))
            a.start()
            rc = a.wait(60)
            text = open(a.err).read()
            missing = [w for w in want if w not in text]
            check(rc == want_rc and not missing and starts(name) == [],
                  "d. %s: exit %s (want %s), no worker; message %s (missing %s)"
                  % (name, rc, want_rc, a.log(1)[:400], missing))
        finally:
            srv.stop()

    url = "/apis/jobset.x-k8s.io/v1alpha2/namespaces/%s/jobsets/%s" % (NS, JS)
    rbac = "needs patch on pods and get/list/watch on jobsets"
    one("forbidden", mode="deny", want=("HTTP 403", url, rbac))
    one("unauthorized", token="wrong", want=("HTTP 401", url, rbac))
    one("badjson", mode="badjson", want_rc=69, want=("bad JSON", url, "--rdzv-timeout"))
    one("hang", mode="hang", want_rc=69, want=("timed out", url, "--rdzv-timeout"))
    one("badcode", env={IPR["exit_code_env"]: "0"},
        want=("IN_PLACE_RESTART_EXIT_CODE='0'", "1..255"))


def scenario_e():
    srv = jobset_apiserver.ApiServer(os.path.join(T, "ca-e"), NS, JS, [pod_name(0)])
    srv.hold = True
    srv.watch_faults = ["gone", "badevent"]
    try:
        a = Agent("e", 0, srv, ["--standalone"])
        a.start()
        js_get = ("GET", "/apis/jobset.x-k8s.io/v1alpha2/namespaces/%s/jobsets/%s" % (NS, JS))
        # the first GET, one after the 410, one after the bad event; then a third watch waits
        ok = wait_for(lambda: srv.requests.count(js_get) >= 3 and not srv.watch_faults, 60)
        # released before or after the third watch connects: either way it gets the new version
        srv.release()
        started = wait_for(lambda: starts("e"), 60)
        touch("e", "finish")
        rc = a.wait(60)
        log = open(a.err).read()
        check(ok and started and rc == 0 and "watch event: bad JSON" in log,
              "e. a 410 and a bad watch event: re-listed (%d GETs of the JobSet), the barrier "
              "lifted, exit %s; the bad event logged: %s" % (srv.requests.count(js_get), rc,
                                                             "watch event: bad JSON" in log))
    finally:
        srv.stop()


def main():
    with open(os.path.join(T, "worker.sh"), "w") as f:
        f.write(WORKER)
    os.chmod(os.path.join(T, "worker.sh"), 0o755)
    try:
        for sc in (scenario_a, scenario_b, scenario_c, scenario_e, scenario_d):
            t0 = time.monotonic()
            sc()
            print("(%s: %.0f s)" % (sc.__name__, time.monotonic() - t0), flush=True)
    finally:
        for p in PROCS:
            if p.poll() is None:
                p.kill()
                p.wait()
    print("jobset_inplace_test: %d failure(s)" % len(FAILS))
    sys.exit(1 if FAILS else 0)


if __name__ == "__main__":
    main()
