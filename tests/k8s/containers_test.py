#!/usr/bin/python3
"""containers_test.py SCENARIO K8S_DIR [DDP_TRAIN_PY [NO_LIBUV_PY]]: the rendered overlay (kubectl kustomize K8S_DIR/overlays/X)
run as real podman containers of the built image (tests/k8s/cluster.py: the kubelet and the Job
controller), one scenario per Bazel test (tests/k8s/BUILD, tag "containers"; root and podman).

The image is $TDIST_TEST_IMAGE (default tdist:0.1.0); the test never builds it: without it in the
store the test fails and says how to build it. Each scenario changes only what a user's overlay
would (the ConfigMap's training command, made short; a memory limit) and says so; every other value
comes from the rendered YAML.

Scenarios:
  cpu-gloo     the job trains to the end ("train: OK"), every pod exits 0, and the startup,
               readiness and liveness probes (their paths, ports, periods) passed on every pod.
  delete-1     pod 1 deleted mid-training (SIGTERM, the grace period): exit 143, the Job controller
  delete-0     makes a new pod for the index (new name, new IP), and the job completes on attempt 1
               with every last pod exiting 0. The same with pod 0 (the store's pod).
  spares       cpu-gloo-spares: the spare waits as a standby; a member's pod is deleted, the
               standby takes its group rank, the replacement waits as the new standby; all exit 0.
  mpi          cpu-mpi: the agents serve PMIx to Open MPI ranks; the job trains, every pod exits 0.
  oom          limits.memory 192Mi and workers whose data (~400 MB) does not fit: the kernel's OOM
               killer kills a worker (the kernel log's oom-kill line names the pod's cgroup), its agent says
               so with the limit, and exits 137 (128 + 9, the worker's end), the other pod's agent exits 70.
  policy       a bad ConfigMap: every pod exits 64 and the podFailurePolicy fails the Job, no retry;
               a liveness probe on a missing path stops each container (143), a new pod follows.
  prometheus   Debian's prometheus scrapes every pod's metrics port with the PodMonitor's path and
               interval (pod IPs as targets, as its kubernetes_sd would find them): up == 1 and
               per-rank series (tdist_rank_last_seq) for every rank.
  torch113     the DDP example on tdist-torch113:0.1.0 / tdist-torch26:0.1.0 (TDIST_TORCH_IMAGE
  torch26      overrides), backend "tdist" then gloo: identical parameters on every rank.
"""
import atexit
import os
import random
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cluster as kc  # noqa: E402

FAILS = []
WORKDIR = tempfile.mkdtemp(prefix="tdist-containers-test.", dir=os.environ.get("TEST_TMPDIR"))
atexit.register(shutil.rmtree, WORKDIR, True)


def check(ok, what):
    print("%s: %s" % ("PASS" if ok else "FAIL", what))
    if not ok:
        FAILS.append(what)
    return ok


def render(k8s, overlay, edit=None):
    """kubectl kustomize of the overlay; edit(docs) may change the objects (a user's overlay)."""
    p = subprocess.run(["kubectl", "kustomize", os.path.join(k8s, "overlays", overlay)],
                       capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        raise SystemExit("FAIL: kubectl kustomize %s: %s" % (overlay, p.stderr))
    docs = [d for d in yaml.safe_load_all(p.stdout) if d]
    if edit:
        edit(docs)
    fd, path = tempfile.mkstemp(prefix="rendered.", suffix=".yaml", dir=WORKDIR)
    with os.fdopen(fd, "w") as f:
        yaml.safe_dump_all(docs, f)
    return path


def kind(docs, k):
    return [d for d in docs if d.get("kind") == k]


def set_command(docs, old_re, new):
    """The ConfigMap's agent.yaml `command:` line, as a user's overlay would set it."""
    cm = kind(docs, "ConfigMap")[0]
    text = cm["data"]["agent.yaml"]
    text2 = re.sub(r"(?m)^command: .*$", "command: " + new, text)
    if text2 == text or not re.search(old_re, text):
        raise SystemExit("FAIL: the ConfigMap's agent.yaml has no command matching %r" % old_re)
    cm["data"]["agent.yaml"] = text2


def short_c_job(steps, step_ms):
    def edit(docs):
        set_command(docs, r"/opt/tdist/bin/train", '[/opt/tdist/bin/train, --steps, "%d", --print-every, "200", '
                    '--step-ms, "%d"]' % (steps, step_ms))
    return edit


def finish_job(c, deadline=180):
    ok = c.run_until_done(deadline)
    check(ok, "the job ended within %d s" % deadline)
    check(c.job_failed is None, "the Job did not fail (%s)" % c.job_failed)
    for i in range(c.spec.completions):
        p = c.pods[i]
        check(p.exit_code == 0, "pod %s (index %d) exited %s" % (p.name, i, p.exit_code))
    return ok


def trained(c, pattern=r"^train: OK"):
    logs = "\n".join(p.log_text() for p in c.history)
    m = re.search("(?m)" + pattern + ".*$", logs)
    check(m is not None, "the job trained: %s" % (m.group(0) if m else "no line matching %r" % pattern))


def pod_facts(c, pod):
    """What the kubelet set up, seen from inside the running pod (its PID 1, the agent), against
    the rendered YAML: user and groups, capabilities, no_new_privs, seccomp, read-only root, the
    volumes' mounts, the memory limit, the downward API's env, the entrypoint and args."""
    def sh(cmd):
        p = subprocess.run(["podman", "exec", pod.cname, "/bin/sh", "-c", cmd], capture_output=True,
                           text=True, timeout=30)
        return p.stdout
    spec, ctr = c.spec, c.spec.container
    st = dict(ln.split(":", 1) for ln in sh("cat /proc/1/status").splitlines() if ":" in ln)
    st = {k: v.split() for k, v in st.items()}
    uid, gid = spec.sc("runAsUser"), spec.sc("runAsGroup")
    fsg = (spec.pod.get("securityContext") or {}).get("fsGroup")
    check(st.get("Uid", [""])[0] == str(uid) and st.get("Gid", [""])[0] == str(gid) and
          (fsg is None or str(fsg) in st.get("Groups", [])),
          "%s: PID 1 runs as %s:%s with group %s (Uid %s Gid %s Groups %s)" % (
              pod.name, uid, gid, fsg, st.get("Uid"), st.get("Gid"), st.get("Groups")))
    csc = ctr.get("securityContext") or {}
    if "ALL" in ((csc.get("capabilities") or {}).get("drop") or []) and not (csc.get("capabilities") or {}).get("add"):
        check(st.get("CapEff") == ["0000000000000000"] and st.get("CapBnd") == ["0000000000000000"],
              "%s: no capabilities (CapEff %s CapBnd %s)" % (pod.name, st.get("CapEff"), st.get("CapBnd")))
    if csc.get("allowPrivilegeEscalation") is False:
        check(st.get("NoNewPrivs") == ["1"], "%s: no_new_privs (%s)" % (pod.name, st.get("NoNewPrivs")))
    check(st.get("Seccomp") == ["2"], "%s: a seccomp filter (RuntimeDefault): Seccomp %s" % (pod.name, st.get("Seccomp")))
    mounts = {f[1]: f for f in (ln.split() for ln in sh("cat /proc/mounts").splitlines()) if len(f) > 3}
    ro = "ro" in mounts.get("/", ["", "", "", ""])[3].split(",")
    check(ro == bool(csc.get("readOnlyRootFilesystem")), "%s: root read-only %s" % (pod.name, ro))
    vols = {v["name"]: v for v in spec.pod.get("volumes") or []}
    for vm in ctr.get("volumeMounts") or []:
        m = mounts.get(vm["mountPath"])
        ed = vols[vm["name"]].get("emptyDir") or {}
        ok = m is not None
        if ok and ed.get("medium") == "Memory":
            size = "size=%dk" % (podman_pod_quantity(ed["sizeLimit"]) // 1024) if "sizeLimit" in ed else ""
            ok = m[2] == "tmpfs" and (not size or size in m[3].split(","))
        if ok and (vm.get("readOnly") or "configMap" in vols[vm["name"]]):
            ok = "ro" in m[3].split(",")
        check(ok, "%s: volume %s at %s: %s" % (pod.name, vm["name"], vm["mountPath"], m and " ".join(m[2:4])))
    lim = ((ctr.get("resources") or {}).get("limits") or {}).get("memory")
    if lim:
        got = sh("cat /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null || cat /sys/fs/cgroup/memory.max").strip()
        check(got == str(podman_pod_quantity(lim)), "%s: memory limit %s = %s bytes" % (pod.name, lim, got))
    env = dict(e.split("=", 1) for e in sh("tr '\\0' '\\n' </proc/1/environ").splitlines() if "=" in e)
    want = {"POD_NAME": pod.name, "POD_IP": pod.ip, "POD_NAMESPACE": c.namespace,
            "JOB_COMPLETION_INDEX": str(pod.index), "HOSTNAME": "%s-%d" % (spec.jobname, pod.index)}
    bad = {k: env.get(k) for k, v in want.items() if env.get(k) != v}
    check(not bad, "%s: env %s (wrong: %s)" % (pod.name, " ".join("%s=%s" % kv for kv in want.items()), bad))
    argv = sh("tr '\\0' ' ' </proc/1/cmdline").split()
    check(argv[1:] == [str(a) for a in ctr.get("args") or []], "%s: PID 1 is the entrypoint with the args: %s" % (
        pod.name, " ".join(argv)))


def podman_pod_quantity(q):
    import podman_pod
    return int(podman_pod.quantity(q))


def scenario_cpu_gloo(k8s, image):
    # 2 x 3000 steps of 5 ms: ~15 s, so that the liveness probe (every 10 s after the startup
    # probe passed) runs at least once on each pod.
    c = kc.Cluster(render(k8s, "cpu-gloo", short_c_job(3000, 5)), image)
    c.start()
    for p in c.pods.values():
        check(kc.wait_for(lambda: p.started, 60), "pod %s started (startup probe)" % p.name)
        pod_facts(c, p)
    finish_job(c)
    trained(c)
    for p in c.history:
        for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
            n = p.probes_passed(kind)
            fails = [d for k, ok, d in p.probe_log if k == kind and not ok]
            check(n > 0, "pod %s: %s passed %d times (failures, the last ones as the container ends: %s)" % (p.name, kind, n, fails[:3]))
        check(p.killed_by is None, "pod %s not killed by a probe (%s)" % (p.name, p.killed_by))
    return c


def resolve(pod, name):
    """The address `name` has in pod's resolver (getent in the container), "" if none."""
    p = subprocess.run(["podman", "exec", pod.cname, "getent", "hosts", name], capture_output=True, text=True,
                       timeout=30)
    return p.stdout.split()[0] if p.returncode == 0 and p.stdout.split() else ""


def scenario_delete(k8s, image, index):
    c = kc.Cluster(render(k8s, "cpu-gloo", short_c_job(3000, 5)), image)
    c.start()
    check(kc.wait_for(lambda: re.search(r"(?m)^step", c.pods[0].log_text()), 120), "training started")
    old = c.delete_pod(index)
    check(old.exit_code == 143, "deleted pod %s exited %s (143: SIGTERM)" % (old.name, old.exit_code))
    other = c.pods[1 - index]
    fqdn = "%s-%d.%s" % (c.spec.jobname, index, c.spec.svc)  # through the pods' resolv.conf search
    # The deleted pod's name is gone with it (its replacement may already answer at a new IP).
    got = resolve(other, fqdn)
    check(got != old.ip, "%s no longer resolves to the deleted pod's %s from %s (got %r)" % (
        fqdn, old.ip, other.name, got))
    new = c.replaced(old)
    check(new is not None and new.ip != old.ip and new.name != old.name,
          "index %d has a new pod %s (was %s at %s)" % (index, new and (new.name, new.ip), old.name, old.ip))
    if new is None:
        return c
    check(kc.wait_for(lambda: resolve(other, fqdn) == new.ip, 60, 0.5),
          "%s resolves to the new pod's IP %s from %s" % (fqdn, new.ip, other.name))
    finish_job(c)
    trained(c, r"^train: OK.*\(attempt 1\)")
    return c


def scenario_spares(k8s, image):
    c = kc.Cluster(render(k8s, "cpu-gloo-spares", short_c_job(2000, 5)), image)
    port = c.spec.probes()["readinessProbe"]["port"]
    c.start()

    def status(i):
        return kc.get_json("http://%s:%d/status" % (c.pods[i].ip, port)) or {}

    # The pods start together, as a kubelet starts them: the members are the first nnodes to join
    # (pod 0, the store host, always); the last one waits as a standby, whatever its index.
    def standbys():
        return [i for i in c.pods if status(i).get("state") == "standby" and status(i).get("workers") == []]
    check(kc.wait_for(lambda: len(standbys()) == 1, 120, 0.5), "one pod waits as a standby: %s" % standbys())
    spare = (standbys() or [c.spec.completions - 1])[0]
    member = [i for i in c.pods if i not in (0, spare)][0]
    check(kc.wait_for(lambda: re.search(r"(?m)^step", c.pods[0].log_text()), 120), "training started")
    old = c.delete_pod(member)
    check(old.exit_code == 143, "deleted pod %s exited %s (143)" % (old.name, old.exit_code))
    check(kc.wait_for(lambda: re.search(r"round 1 complete.*group rank 1,", c.pods[spare].log_text()), 120),
          "the standby %s took group rank 1" % c.pods[spare].name)
    new = c.replaced(old)
    check(new is not None and kc.wait_for(lambda: "standby (no workers)" in new.log_text(), 120),
          "the replacement %s waits as the new standby" % (new and (new.name, new.ip),))
    finish_job(c)
    trained(c, r"^train: OK.*\(attempt 1\)")
    return c


def scenario_mpi(k8s, image):
    def edit(docs):
        set_command(docs, r"/opt/tdist/bin/train", '[/opt/tdist/bin/train, --steps, "100", --print-every, "50"]')
    c = kc.Cluster(render(k8s, "cpu-mpi", edit), image)
    c.start()
    finish_job(c)
    trained(c)
    return c


def oom_kills(pod):
    """The kernel's OOM kills in pod's memory cgroup: the names of the tasks its log (dmesg) says
    were killed with the container's cgroup as oom_memcg."""
    cid = kc.podman("inspect", "-f", "{{.Id}}", pod.cname).strip()
    p = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=30)
    if p.returncode != 0:
        raise SystemExit("FAIL: dmesg (the kernel's OOM kill lines): %s" % p.stderr.strip())
    return re.findall(r"oom-kill:.*oom_memcg=[^,]*%s,.*task=([^,]+)," % cid, p.stdout)


def scenario_oom(k8s, image):
    def edit(docs):
        # A user's job whose data does not fit its limit: limits.memory 192Mi, and each worker
        # generates 200000 samples x 512 features of float (~400 MB) before its first step;
        # max_restarts 0, so that the agents give up at the first loss.
        job = kind(docs, "Job")[0]
        res = job["spec"]["template"]["spec"]["containers"][0]["resources"]
        res["limits"]["memory"] = "192Mi"
        res["requests"]["memory"] = "192Mi"
        cm = kind(docs, "ConfigMap")[0]
        cm["data"]["agent.yaml"] = re.sub(r"(?m)^max_restarts: *\d+", "max_restarts: 0", cm["data"]["agent.yaml"])
        set_command(docs, r"/opt/tdist/bin/train", '[/opt/tdist/bin/train, --steps, "100", --samples, "200000", '
                    '--features, "512"]')
    c = kc.Cluster(render(k8s, "cpu-gloo", edit), image)
    c.start(controller=False)  # the pods' own ends, not the Job controller's retries
    codes = {}
    for i, p in c.pods.items():
        codes[i] = p.wait(120)
        text = p.log_text()
        lines = [ln for ln in text.splitlines() if re.search(r"signal|giving up|failed", ln)]
        print("oom: pod %s exit %s; the agent's lines:\n  %s" % (p.name, codes[i], "\n  ".join(lines[:4])))
    kills = {i: oom_kills(p) for i, p in c.pods.items()}
    check(any(kills.values()), "the kernel's OOM killer killed in a pod's memory cgroup: %s" % kills)
    # Every pod's workers are over the limit: each pod whose worker the kernel killed first
    # says so and exits 137; a pod whose peers failed first exits 70 (the job failed elsewhere).
    for i, p in c.pods.items():
        own = re.search(r"worker failed \(root cause\): rank \d+ .*killed by signal 9.*$", p.log_text(), re.M)
        if own:
            check(bool(kills[i]), "pod %s: the worker its agent names as killed by SIGKILL was OOM-killed (%s)" % (
                p.name, kills[i]))
            want = "by the kernel's OOM killer: over the memory limit of %d MiB" % (
                podman_pod_quantity(c.spec.container["resources"]["limits"]["memory"]) >> 20)
            check(want in own.group(0), "pod %s: the agent says the worker was killed %s: %s" % (
                p.name, want, own.group(0)[:300]))
            check(codes[i] == 137, "pod %s exited %s (137: its worker's SIGKILL, 128 + 9)" % (p.name, codes[i]))
        else:
            check(codes[i] == 70, "pod %s exited %s (70: the job failed on another node)" % (p.name, codes[i]))
    return c


def scenario_policy(k8s, image):
    """The kubelet's and the Job controller's rules on real exits: a bad ConfigMap (the agent exits
    64) fails the Job at once by the podFailurePolicy, with no pod retried; a liveness probe that
    fails failureThreshold times in a row stops the container (SIGTERM: 143), and the Job
    controller counts it against backoffLimitPerIndex and makes a new pod for the index."""
    def bad(docs):
        cm = kind(docs, "ConfigMap")[0]
        cm["data"]["agent.yaml"] = re.sub(r"(?m)^nnodes: *\d+", "nnodes: two", cm["data"]["agent.yaml"])
    c = kc.Cluster(render(k8s, "cpu-gloo", bad), image)
    c.start()
    kc.wait_for(c.done, 120)
    check(c.job_failed is not None and "FailJob" in c.job_failed, "bad config: the Job failed: %s" % c.job_failed)
    codes = [p.wait(120) for p in c.history]
    check(all(rc in (64, 143) for rc in codes) and 64 in codes,
          "bad config: the pods exited 64 (or 143: deleted with the failed Job): %s" % codes)
    check(len(c.history) == c.spec.completions, "bad config: no pod retried (%d pods)" % len(c.history))
    c.close()

    def dead_liveness(docs):
        short_c_job(3000, 5)(docs)
        ctr = kind(docs, "Job")[0]["spec"]["template"]["spec"]["containers"][0]
        ctr["livenessProbe"].update({"httpGet": {"path": "/no-such-path", "port": "metrics"},
                                     "periodSeconds": 1, "failureThreshold": 2})
    c = kc.Cluster(render(k8s, "cpu-gloo", dead_liveness), image)
    c.start()
    olds = dict(c.pods)
    for i, old in olds.items():
        new = c.replaced(old, 120)
        check(old.killed_by == "livenessProbe" and old.exit_code == 143,
              "pod %s: stopped by its liveness probe (%s), exit %s (143)" % (old.name, old.killed_by, old.exit_code))
        check(new is not None and c.failures.get(i) == 1, "index %d: a new pod %s, 1 failure counted (%s)" % (
            i, new and new.name, c.failures.get(i)))
    return c


def free_port():
    """A TCP port free on 127.0.0.1 now, below the ephemeral range (as tests/testlib/ports.sh)."""
    lo = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
    for _ in range(1000):
        p = random.randrange(10000, max(10001, lo))
        try:
            with socket.socket() as s:
                s.bind(("127.0.0.1", p))
            return p
        except OSError:
            continue
    raise SystemExit("FAIL: no free port below the ephemeral range")


def scenario_prometheus(k8s, image):
    # 3000 steps of 10 ms (~30 s): two scrapes at the PodMonitor's 15 s interval fit in the run.
    rendered = render(k8s, "cpu-gloo", short_c_job(3000, 10))
    with open(rendered) as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    ep = kind(docs, "PodMonitor")[0]["spec"]["podMetricsEndpoints"][0]
    c = kc.Cluster(rendered, image)
    port = c.spec.port(ep["port"])
    c.start()
    conf = {"global": {"scrape_interval": ep["interval"], "scrape_timeout": ep.get("scrapeTimeout", "10s")},
            "scrape_configs": [{"job_name": "podmonitor/%s" % c.namespace, "metrics_path": ep.get("path", "/metrics"),
                                "static_configs": [{"targets": ["%s:%d" % (p.ip, port) for p in c.pods.values()]}]}]}
    conf_path = os.path.join(c.tmp, "prometheus.yml")
    with open(conf_path, "w") as f:
        yaml.safe_dump(conf, f)
    web = free_port()
    prom = subprocess.Popen(["/usr/bin/prometheus", "--config.file=" + conf_path, "--storage.tsdb.path=" + c.tmp + "/tsdb",
                             "--web.listen-address=127.0.0.1:%d" % web, "--log.level=warn"],
                            stdout=open(c.tmp + "/prometheus.log", "w"), stderr=subprocess.STDOUT)
    try:
        api = "http://127.0.0.1:%d/api/v1/query?query=" % web

        def query(q):
            r = kc.get_json(api + urllib.parse.quote(q))
            return r["data"]["result"] if r and r.get("status") == "success" else []
        world = c.spec.completions * 2
        up = kc.wait_for(lambda: len([r for r in query("up") if r["value"][1] == "1"]) == c.spec.completions, 60, 0.5)
        check(up, "Prometheus: up == 1 for all %d pods: %s" % (c.spec.completions, query("up")))
        ranks = lambda: sorted({r["metric"].get("rank") for r in query("tdist_rank_last_seq")})  # noqa: E731
        check(kc.wait_for(lambda: len(ranks()) == world, 30, 0.5), "per-rank series tdist_rank_last_seq for ranks %s" % ranks())
    finally:
        prom.terminate()
        prom.wait(30)
    finish_job(c)
    return c


def torch_job(script, backend, steps, hook=None):
    """A user's overlay for a PyTorch job: the script in a ConfigMap mounted at /opt/job, tdist's
    Python package on PYTHONPATH (docs/pytorch.md's image recipe puts it in /opt/tdist/python)."""
    def edit(docs):
        with open(script) as f:
            text = f.read()
        docs.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "ddp-job"},
                     "data": {"ddp_train.py": text}})
        pod = kind(docs, "Job")[0]["spec"]["template"]["spec"]
        pod["volumes"].append({"name": "job", "configMap": {"name": "ddp-job", "defaultMode": 0o755}})
        ctr = pod["containers"][0]
        ctr["volumeMounts"].append({"name": "job", "mountPath": "/opt/job", "readOnly": True})
        pypath = "/opt/tdist/python"
        if hook:
            with open(hook) as f:
                docs.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "python-hooks"},
                             "data": {"sitecustomize.py": f.read()}})
            pod["volumes"].append({"name": "pyhooks", "configMap": {"name": "python-hooks"}})
            ctr["volumeMounts"].append({"name": "pyhooks", "mountPath": "/opt/pyhooks", "readOnly": True})
            pypath += ":/opt/pyhooks"
        ctr["env"].append({"name": "PYTHONPATH", "value": pypath})
        set_command(docs, r"/opt/tdist/bin/train",
                    '[/opt/job/ddp_train.py, --backend, %s, --steps, "%d"]' % (backend, steps))
    return edit


def scenario_torch(k8s, _image, tag):
    image = os.environ.get("TDIST_TORCH_IMAGE", "tdist-%s:0.1.0" % tag)
    script = sys.argv[3] if len(sys.argv) > 3 else ""
    if not os.path.isfile(script):
        raise SystemExit("FAIL: %s needs the DDP example's path as its third argument" % tag)
    version = {"torch113": "1.13", "torch26": "2.6"}[tag]
    for backend in ("tdist", "gloo"):
        # Debian 13's PyTorch 2.6 is built without libuv, which its TCPStore asks for by default
        # (a TORCHELASTIC_USE_AGENT_STORE client too: USE_LIBUV=0 is not read there): the hook the
        # host's 2.6 root uses (tests/testlib/torch26/no_libuv.py) as the pods' sitecustomize.
        hook = sys.argv[4] if tag == "torch26" and len(sys.argv) > 4 else None
        if tag == "torch26" and not hook:
            raise SystemExit("FAIL: torch26 needs tests/testlib/torch26/no_libuv.py as its fourth argument")
        c = kc.Cluster(render(k8s, "cpu-gloo", torch_job(script, backend, 40, hook)), image)
        c.start()
        finish_job(c)
        trained(c, r"^done: world 4 .*params identical: True")
        logs = "\n".join(p.log_text() for p in c.history)
        m = re.search(r"(?m)^ddp_train: PyTorch (\S+),.*$", logs)
        check(m is not None and m.group(1).startswith(version),
              "the workers ran PyTorch %s, backend %s: %s" % (version, backend, m and m.group(0)))
        if FAILS:
            return c  # main() dumps its pods' logs
        c.close()
    return c


SCENARIOS = {
    "cpu-gloo": scenario_cpu_gloo,
    "delete-1": lambda k, i: scenario_delete(k, i, 1),
    "delete-0": lambda k, i: scenario_delete(k, i, 0),
    "spares": scenario_spares,
    "mpi": scenario_mpi,
    "oom": scenario_oom,
    "prometheus": scenario_prometheus,
    "policy": scenario_policy,
    "torch113": lambda k, i: scenario_torch(k, i, "torch113"),
    "torch26": lambda k, i: scenario_torch(k, i, "torch26"),
}


def main():
    if len(sys.argv) not in (3, 4, 5) or sys.argv[1] not in SCENARIOS:
        raise SystemExit("usage: containers_test.py {%s} K8S_DIR [DDP_TRAIN_PY [NO_LIBUV_PY]]" % ",".join(SCENARIOS))
    if os.geteuid() != 0:
        raise SystemExit("FAIL: containers_test needs root (podman's bridge networks)")
    image = os.environ.get("TDIST_TEST_IMAGE", "tdist:0.1.0")
    t0 = time.monotonic()
    try:
        SCENARIOS[sys.argv[1]](sys.argv[2], image)
    finally:
        if FAILS and kc.LAST is not None:
            kc.LAST.dump()
    print("containers_test %s: %d failed, %.1f s" % (sys.argv[1], len(FAILS), time.monotonic() - t0))
    sys.exit(1 if FAILS else 0)


if __name__ == "__main__":
    main()
