"""cluster.py: a one-node "cluster" of real podman containers for the rendered Indexed Job: the
kubelet (podman_pod.py's translation, HTTP probes with their periods and thresholds, a failed
liveness or startup probe kills the container, delete = stop with terminationGracePeriodSeconds)
and the Job controller (one pod per index, a replacement with a new name and IP when a pod fails,
podFailurePolicy and backoffLimitPerIndex applied to exit codes, maxFailedIndexes).

The network is a podman bridge network with its own /24 (aardvark-dns answers the pods' Service
names); pod IPs are handed out in order and never reused, as a new pod gets a new IP. The host
reaches every pod IP (the kubelet and Prometheus probe and scrape from the node).

Everything this creates carries the label tdist-test=pods and tdist-test-owner=<pid>: close()
removes it (atexit and SIGTERM/SIGINT/SIGHUP), and a new Cluster first removes what owners that
are gone (a SIGKILLed test) left behind. Other users' containers and networks are never touched.
"""
import atexit
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

import podman_pod

LABEL = "tdist-test=pods"


def log(msg):
    sys.stdout.write("[%7.2f] %s\n" % (time.monotonic() - T0, msg))
    sys.stdout.flush()


T0 = time.monotonic()
LAST = None  # the last Cluster made (for failure dumps)


def podman(*args, check=True, timeout=120):
    p = subprocess.run(["podman"] + list(args), capture_output=True, text=True, timeout=timeout)
    if check and p.returncode != 0:
        raise RuntimeError("podman %s: exit %d: %s" % (" ".join(args[:3]), p.returncode, p.stderr.strip()))
    return p.stdout


def reap_orphans():
    """Remove containers and networks of earlier instances whose owner process is gone."""
    out = podman("ps", "-a", "--filter", "label=" + LABEL, "--format", "{{.ID}} {{.Labels}}", check=False)
    owners = {}
    for line in out.splitlines():
        cid = line.split()[0]
        owner = line.split("tdist-test-owner:")[1].split()[0].rstrip("]") if "tdist-test-owner:" in line else ""
        owners.setdefault(owner, []).append(cid)
    for owner, cids in owners.items():
        if owner.isdigit() and os.path.exists("/proc/" + owner):
            continue
        podman("rm", "-f", "-t", "0", *cids, check=False)
    for net in podman("network", "ls", "--filter", "label=" + LABEL, "--format", "{{.Name}}", check=False).split():
        owner = net.rsplit("-", 1)[-1]
        if owner.isdigit() and not os.path.exists("/proc/" + owner):
            podman("network", "rm", "-f", net, check=False)


class Pod:
    def __init__(self, cluster, index, attempt):
        self.cluster, self.index, self.attempt = cluster, index, attempt
        spec = cluster.spec
        self.ip = cluster.next_ip()
        self.cname = "tdist-test-pods-%d-%d-%d" % (os.getpid(), index, attempt)
        self.dir = os.path.join(cluster.tmp, self.cname)
        self.name, argv = podman_pod.podman_run(
            spec, index, cluster.namespace, cluster.network, self.ip, cluster.image, self.cname, self.dir,
            labels=[("tdist-test", "pods"), ("tdist-test-owner", str(os.getpid()))])
        self.logpath = os.path.join(cluster.tmp, "%s.log" % self.name)
        self.exit_code = None
        self.deleted = False
        self.killed_by = None  # "liveness", "startup" when the kubelet killed it
        self.started = False   # startup probe passed (or none)
        self.ready = False
        self.probe_log = []    # (kind, ok, detail)
        self.logf = open(self.logpath, "w")
        log("pod %s (index %d, attempt %d): %s, container %s" % (self.name, index, attempt, self.ip, self.cname))
        self.proc = subprocess.Popen(argv, stdout=self.logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.t_start = time.monotonic()
        self.prober = threading.Thread(target=self._probe_loop, daemon=True)
        self.prober.start()

    def running(self):
        return self.proc.poll() is None

    def wait(self, timeout):
        try:
            self.exit_code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        return self.exit_code

    def log_text(self):
        self.logf.flush()
        try:
            with open(self.logpath, errors="replace") as f:
                return f.read()
        except FileNotFoundError:  # the cluster was closed
            return ""

    def stop(self, grace, why):
        """The kubelet's kill: the image's STOPSIGNAL, SIGKILL after grace seconds."""
        log("pod %s: stop (%s), grace %d s" % (self.name, why, grace))
        podman("stop", "-t", str(grace), self.cname, check=False, timeout=grace + 60)

    def delete(self):
        """kubectl delete pod: terminationGracePeriodSeconds, then the container is gone."""
        self.deleted = True
        self.stop(self.cluster.spec.grace, "deleted")
        self.wait(60)

    def get(self, path, port, timeout):
        try:
            with urllib.request.urlopen("http://%s:%d%s" % (self.ip, port, path), timeout=timeout) as r:
                return 200 <= r.status < 400, "HTTP %d" % r.status
        except urllib.error.HTTPError as e:
            return 200 <= e.code < 400, "HTTP %d" % e.code
        except Exception as e:  # connection refused, timeout: a failed probe
            return False, type(e).__name__

    def _probe_loop(self):
        """The kubelet's probe workers: each probe ticks at its period from the pod's start; readiness
        and liveness count only once the startup probe passed; failureThreshold consecutive failures
        of startup or liveness kill the container (restartPolicy Never: it stays dead)."""
        probes = self.cluster.spec.probes()
        # The kubelet's probe workers start with the container (not before: an IP without its pod
        # may route elsewhere).
        while self.running():
            st = podman("inspect", "-f", "{{.State.Running}}", self.cname, check=False).strip()
            if st == "true":
                break
            time.sleep(0.1)
        self.t_start = time.monotonic()
        nxt = {k: self.t_start + p["delay"] for k, p in probes.items()}
        fails = {k: 0 for k in probes}
        self.started = "startupProbe" not in probes
        while self.running():
            now = time.monotonic()
            for kind, p in probes.items():
                if now < nxt[kind]:
                    continue
                nxt[kind] += p["period"]
                if kind != "startupProbe" and not self.started:
                    continue
                if kind == "startupProbe" and self.started:
                    continue
                ok, detail = self.get(p["path"], p["port"], p["timeout"])
                if not self.running():
                    return
                self.probe_log.append((kind, ok, detail))
                fails[kind] = 0 if ok else fails[kind] + 1
                if kind == "startupProbe" and ok:
                    self.started = True
                if kind == "readinessProbe":
                    self.ready = ok
                if not ok and kind != "readinessProbe" and fails[kind] >= p["failures"]:
                    self.killed_by = kind
                    self.stop(p["grace"], "%s failed %d times: %s" % (kind, fails[kind], detail))
                    return
            time.sleep(0.1)

    def probes_passed(self, kind):
        return sum(1 for k, ok, _ in self.probe_log if k == kind and ok)


class Cluster:
    def __init__(self, rendered, image, namespace="default", tmp=None):
        if subprocess.run(["podman", "image", "exists", image]).returncode != 0:
            raise SystemExit("FAIL: image %s is not in podman's image store: build it first "
                             "(bash docker/build.sh, --torch for the PyTorch images), or name another with "
                             "TDIST_TEST_IMAGE / TDIST_TORCH_IMAGE" % image)
        self.spec = podman_pod.PodSpec(rendered)
        self.image = image
        self.namespace = namespace
        self.tmp = tempfile.mkdtemp(prefix="tdist-pods.", dir=tmp)
        os.chmod(self.tmp, 0o755)
        self.network = "tdist-test-pods-%d" % os.getpid()
        self.pods = {}       # index -> current Pod
        self.history = []    # every Pod, in creation order
        self.failures = {}   # index -> failures counted against backoffLimitPerIndex
        self.succeeded = set()
        self.failed_indexes = set()
        self.job_failed = None
        self.closed = False
        self.lock = threading.RLock()
        global LAST
        LAST = self
        reap_orphans()
        atexit.register(self.close)
        for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(s, self._on_signal)
        self._ip = 1
        for attempt in range(10):  # a random /24; another network (another test's) may hold it
            self.subnet = "10.%d.%d" % (random.randint(100, 250), random.randint(0, 255))
            try:
                podman("network", "create", "--label", LABEL, "--subnet", self.subnet + ".0/24", self.network)
                break
            except RuntimeError:
                if attempt == 9:
                    raise
        log("network %s: %s.0/24, image %s, namespace %s" % (self.network, self.subnet, image, namespace))

    def _on_signal(self, signum, _frame):
        self.close()
        sys.exit(128 + signum)

    def next_ip(self):
        self._ip += 1
        if self._ip > 254:
            raise RuntimeError("network %s: no pod IP left" % self.network)
        return "%s.%d" % (self.subnet, self._ip)

    def close(self):
        if self.closed:
            return
        self.closed = True
        for p in self.history:
            if p.running():
                p.proc.kill()
        out = podman("ps", "-a", "-q", "--filter", "label=tdist-test-owner=%d" % os.getpid(), check=False)
        if out.split():
            podman("rm", "-f", "-t", "0", *out.split(), check=False)
        podman("network", "rm", "-f", self.network, check=False)
        shutil.rmtree(self.tmp, ignore_errors=True)

    # ---- the Job controller ----

    def start(self, indexes=None, controller=True):
        """Create the pods (all indexes, or those given) and, with controller, run the Job
        controller in a thread: a failed pod is replaced at once (podReplacementPolicy Failed:
        once it has terminated), as the cluster would."""
        for i in indexes if indexes is not None else range(self.spec.completions):
            self._create(i)
        if controller:
            threading.Thread(target=self._controller, daemon=True).start()

    def _controller(self):
        while not self.closed and not self.done():
            with self.lock:
                self.reconcile()
            time.sleep(0.2)
        if self.job_failed and not self.closed:  # a failed Job's active pods are deleted
            for p in list(self.pods.values()):
                if p.running():
                    p.stop(self.spec.grace, "the Job failed")

    def _create(self, index):
        attempt = sum(1 for p in self.history if p.index == index)
        p = Pod(self, index, attempt)
        self.pods[index] = p
        self.history.append(p)
        return p

    def _policy(self, pod, rc):
        """The podFailurePolicy action for a failed pod: FailJob, FailIndex, Ignore or Count."""
        for rule in (self.job_spec().get("podFailurePolicy") or {}).get("rules") or []:
            on = rule.get("onExitCodes")
            if on:
                if on.get("containerName") not in (None, self.spec.container["name"]):
                    continue
                hit = rc in on["values"]
                if (on["operator"] == "In") == hit:
                    return rule["action"]
            for cond in rule.get("onPodConditions") or []:
                if cond["type"] == "DisruptionTarget" and getattr(pod, "disruption", False):
                    return rule["action"]
        return "Count"

    def job_spec(self):
        return self.spec.job["spec"]

    def reconcile(self):
        """One pass of the Job controller over pods that ended."""
        js = self.job_spec()
        for index, pod in list(self.pods.items()):
            if pod.running() or index in self.succeeded or index in self.failed_indexes:
                continue
            rc = pod.wait(60)
            if rc == 0:
                log("pod %s exited 0: index %d succeeded" % (pod.name, index))
                self.succeeded.add(index)
                continue
            action = self._policy(pod, rc)
            log("pod %s exited %d%s: podFailurePolicy %s" % (pod.name, rc, " (deleted)" if pod.deleted else "", action))
            if action == "FailJob":
                self.job_failed = "pod %s exited %d: podFailurePolicy FailJob" % (pod.name, rc)
                return
            if action == "Count":
                self.failures[index] = self.failures.get(index, 0) + 1
            limit = js.get("backoffLimitPerIndex")
            if action == "FailIndex" or (limit is not None and self.failures.get(index, 0) > limit):
                self.failed_indexes.add(index)
                if len(self.failed_indexes) > js.get("maxFailedIndexes", len(self.pods)):
                    self.job_failed = "index %d failed (%d failures): more than maxFailedIndexes" % (
                        index, self.failures.get(index, 0))
                    return
                continue
            self._create(index)

    def done(self):
        return self.job_failed is not None or len(self.succeeded) + len(self.failed_indexes) >= self.spec.completions

    def run_until_done(self, deadline_s):
        end = time.monotonic() + deadline_s
        while not self.done():
            if time.monotonic() > end:
                return False
            time.sleep(0.2)
        return True

    def delete_pod(self, index):
        """kubectl delete pod; the Job controller replaces it (a later reconcile)."""
        pod = self.pods[index]
        pod.delete()
        return pod

    def replaced(self, old, seconds=60):
        """The pod the Job controller made for old's index after old ended, or None."""
        if not wait_for(lambda: self.pods.get(old.index) is not old, seconds):
            return None
        return self.pods[old.index]

    def dump(self):
        for p in self.history:
            log("== %s (index %d, %s, exit %s, killed by %s): last lines" % (
                p.name, p.index, p.ip, p.exit_code, p.killed_by))
            for line in p.log_text().splitlines()[-15:]:
                sys.stdout.write("   " + line + "\n")


def wait_for(pred, seconds, step=0.1):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(step)
    return pred()


def get_json(url, timeout=2):
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return json.load(r)
    except Exception:
        return None
