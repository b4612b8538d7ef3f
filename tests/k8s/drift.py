#!/usr/bin/python3
"""drift.py BASE.yaml RENDERED.yaml...: exit 0 when the pod templates and the agent's settings of
each rendered kustomization (k8s/trainer, k8s/jobset, k8s/volcano) are those of k8s/base's Job,
but for what each way must change: the container's name (Trainer's torch plugin acts on "node"),
args past --config FILE (Volcano's --node-rank/--nnodes), the ConfigMap's name (the runtime's
own), the component label; and in agent.yaml the discovery section and what the controller sets
(spares), and the subdomain, which the controller sets. Differences are printed. Needs python3-yaml."""
import difflib
import sys

import yaml

# agent.yaml settings that must be k8s/base's everywhere.
SAME = ["max_restarts", "master_port", "http_port", "rdzv_timeout", "heartbeat_interval", "heartbeat_timeout",
        "stop_grace_period", "log_format", "backend", "nnodes", "nproc_per_node", "command"]


def objs(p):
    with open(p) as f:
        return [d for d in yaml.safe_load_all(f) if d]


def pods(docs):
    for d in docs:
        if d["kind"] == "Job" and d["apiVersion"] == "batch/v1":
            yield d["spec"]["template"]
        elif d["kind"] == "ClusterTrainingRuntime":
            for rj in d["spec"]["template"]["spec"]["replicatedJobs"]:
                yield rj["template"]["spec"]["template"]
        elif d["kind"] == "JobSet":
            for rj in d["spec"]["replicatedJobs"]:
                yield rj["template"]["spec"]["template"]
        elif d["apiVersion"].startswith("batch.volcano.sh/"):
            for t in d["spec"]["tasks"]:
                yield t["template"]


def normal(t):
    t = yaml.safe_load(yaml.safe_dump(t))
    c = t["spec"]["containers"][0]
    c["name"] = "agent"
    c["args"] = c["args"][:2]
    for v in t["spec"]["volumes"]:
        if "configMap" in v:
            v["configMap"]["name"] = "tdist-agent-config"
    t["metadata"]["labels"]["app.kubernetes.io/component"] = "training"
    t["spec"].pop("subdomain", None)  # the controller sets it (JobSet's, Volcano's svc plugin)
    return t


def agent(docs):
    for d in docs:
        if d["kind"] == "ConfigMap":
            return yaml.safe_load(list(d["data"].values())[0])
    return {}


def main():
    base = objs(sys.argv[1])
    bpod = normal(next(pods(base)))
    bcfg = agent(base)
    bad = 0
    for p in sys.argv[2:]:
        docs = objs(p)
        n = 0
        for t in pods(docs):
            n += 1
            if normal(t) != bpod:
                bad += 1
                diff = difflib.unified_diff(yaml.safe_dump(bpod).splitlines(), yaml.safe_dump(normal(t)).splitlines(),
                                            "k8s/base", p, lineterm="")
                print("%s: a pod template differs from k8s/base's Job's:\n%s" % (p, "\n".join(diff)))
        if n == 0:
            bad += 1
            print("%s: no pod template found" % p)
        cfg = agent(docs)
        for k in SAME:
            if cfg.get(k) != bcfg.get(k):
                bad += 1
                print("%s: agent.yaml %s is %r, k8s/base has %r" % (p, k, cfg.get(k), bcfg.get(k)))
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
