#!/usr/bin/python3
"""orchestrators_containers_test.py CONTROLLER K8S_DIR: the pods that Kubeflow Trainer v2, JobSet or
Volcano would create from k8s/trainer, k8s/jobset or k8s/volcano, run as real podman containers of
the built image (tdist:0.1.0, or $TDIST_TEST_IMAGE; never built here) by the harness of
containers_test.py (cluster.py: kubelet and Job controller; podman_pod.py). shape.py makes the
objects each controller makes (names, labels, annotations, injected env: controllers.yaml, with
the source lines), so the pods are those the controller would start.

For each controller: the job starts (2 pods x 2 workers, the C example made short, as a user's
TrainJob args or ConfigMap would), the environment each pod's agent got is the controller's (seen
in the container's PID 1), pod 1 is deleted mid-training (SIGTERM, exit 143), a new pod takes its
index (JobSet's Job: a new name; Volcano: the same name, a new IP) and the agents re-form the
group: the job trains to the end on attempt 1 and every last pod exits 0.
"""
import os
import re
import subprocess
import sys
import time

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cluster as kc  # noqa: E402
import containers_test as ct  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
SHORT = '[/opt/tdist/bin/train, --steps, "3000", --print-every, "200", --step-ms, "5"]'


def shaped(k8s, controller):
    """kubectl kustomize k8s/CONTROLLER, the training command made short, then shape.py."""
    def edit(docs):
        ct.set_command(docs, r"/opt/tdist/bin/train", SHORT)
    p = subprocess.run(["kubectl", "kustomize", os.path.join(k8s, controller)], capture_output=True, text=True,
                       timeout=120)
    if p.returncode != 0:
        raise SystemExit("FAIL: kubectl kustomize k8s/%s: %s" % (controller, p.stderr))
    docs = [d for d in yaml.safe_load_all(p.stdout) if d]
    edit(docs)
    rendered = os.path.join(ct.WORKDIR, "rendered-%s.yaml" % controller)
    with open(rendered, "w") as f:
        yaml.safe_dump_all(docs, f)
    out = os.path.join(ct.WORKDIR, "shaped-%s.yaml" % controller)
    args = [sys.executable, os.path.join(HERE, "shape.py"), controller, rendered]
    if controller == "trainer":
        # The sample TrainJob, its command (after "--") made as short.
        with open(os.path.join(k8s, "trainer", "example", "trainjob.yaml")) as f:
            tj = yaml.safe_load(f)
        a = tj["spec"]["trainer"]["args"]
        tj["spec"]["trainer"]["args"] = a[:a.index("--") + 1] + yaml.safe_load(SHORT)
        tjpath = os.path.join(ct.WORKDIR, "trainjob.yaml")
        with open(tjpath, "w") as f:
            yaml.safe_dump(tj, f)
        args.append(tjpath)
    p = subprocess.run(args + [out], capture_output=True, text=True, timeout=60)
    if p.returncode != 0:
        raise SystemExit("FAIL: shape.py %s: %s" % (controller, p.stderr))
    return out


def pod_env(pod):
    p = subprocess.run(["podman", "exec", pod.cname, "/bin/sh", "-c", "tr '\\0' '\\n' </proc/1/environ"],
                       capture_output=True, text=True, timeout=30)
    return dict(e.split("=", 1) for e in p.stdout.splitlines() if "=" in e)


def expected_env(controller, index):
    """What the controller injects into pod index (controllers.yaml's values for our manifests)."""
    if controller == "trainer":
        return {"PET_NNODES": "2", "PET_NPROC_PER_NODE": "2", "PET_NODE_RANK": str(index),
                "PET_MASTER_ADDR": "tdist-example-node-0-0.tdist-example", "PET_MASTER_PORT": "29500",
                "JOB_COMPLETION_INDEX": str(index), "HOSTNAME": "tdist-example-node-0-%d" % index}
    if controller == "jobset":
        return {"JOB_COMPLETION_INDEX": str(index), "HOSTNAME": "tdist-train-node-0-%d" % index}
    name = ["tdist-train-master-0", "tdist-train-worker-0"][index]
    return {"MASTER_ADDR": "tdist-train-master-0.tdist-train", "MASTER_PORT": "29500", "WORLD_SIZE": "2",
            "RANK": str(index), "HOSTNAME": name, "POD_NAME": name, "VC_MASTER_NUM": "1",
            "VC_WORKER_HOSTS": "tdist-train-worker-0.tdist-train"}


def scenario(controller, k8s, image):
    c = kc.Cluster(shaped(k8s, controller), image)
    c.start()
    for i, p in sorted(c.pods.items()):
        ct.check(kc.wait_for(lambda: p.started, 90), "pod %s started (startup probe)" % p.name)
        env = pod_env(p)
        want = expected_env(controller, i)
        bad = {k: env.get(k) for k, v in want.items() if env.get(k) != v}
        ct.check(not bad, "%s pod %s: the controller's env %s (wrong: %s)" % (controller, p.name, want, bad))
    ct.check(kc.wait_for(lambda: re.search(r"(?m)^step", c.pods[0].log_text()), 120), "training started")
    old = c.delete_pod(1)
    ct.check(old.exit_code == 143, "deleted pod %s exited %s (143: SIGTERM)" % (old.name, old.exit_code))
    new = c.replaced(old)
    same_name = controller == "volcano"  # Volcano recreates <job>-<task>-<index>
    ct.check(new is not None and new.ip != old.ip and (new.name == old.name) == same_name,
             "index 1 has a new pod %s (was %s at %s; %s name)" % (
                 new and (new.name, new.ip), old.name, old.ip, "the same" if same_name else "a new"))
    ct.finish_job(c)
    ct.trained(c, r"^train: OK.*\(attempt 1\)")
    return c


def main():
    if len(sys.argv) != 3 or sys.argv[1] not in ("trainer", "jobset", "volcano"):
        raise SystemExit("usage: orchestrators_containers_test.py {trainer,jobset,volcano} K8S_DIR")
    if os.geteuid() != 0:
        raise SystemExit("FAIL: needs root (podman's bridge networks)")
    image = os.environ.get("TDIST_TEST_IMAGE", "tdist:0.1.0")
    t0 = time.monotonic()
    try:
        scenario(sys.argv[1], sys.argv[2], image)
    finally:
        if ct.FAILS and kc.LAST is not None:
            kc.LAST.dump()
    print("orchestrators_containers_test %s: %d failed, %.1f s" % (sys.argv[1], len(ct.FAILS), time.monotonic() - t0))
    sys.exit(1 if ct.FAILS else 0)


if __name__ == "__main__":
    main()
