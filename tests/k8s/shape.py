#!/usr/bin/python3
"""shape.py: what a controller makes of our manifests before any pod runs, as objects the pod
harness (podspec.py, podman_pod.py, cluster.py) runs: Kubeflow Trainer v2 (TrainJob + runtime ->
JobSet), JobSet (JobSet -> its child Job and headless Service) and Volcano (Volcano Job -> its
pods). Every name, label, annotation and injected variable comes from tests/k8s/controllers.yaml,
which cites the controllers' source lines. Needs python3-yaml.

  shape.py trainer RENDERED TRAINJOB OUT [--namespace NS]
      RENDERED: kubectl kustomize k8s/trainer (the runtime, ConfigMap, NetworkPolicy, PodMonitor);
      TRAINJOB: a TrainJob naming the runtime. OUT: the JobSet's child Job and Service, and the
      other objects of RENDERED except the runtimes.
  shape.py jobset RENDERED OUT [--namespace NS]
      The JobSet of RENDERED as its child Job (one replicated job, replicas 1) and Service.
  shape.py volcano RENDERED OUT [--namespace NS]
      The Volcano Job's pods: a stand-in batch/v1 Job carrying the (identical) task template and
      the failure policy (exit codes Volcano aborts on -> FailJob), and a PodShapes object with
      each pod's name, hostname, labels, annotations and the plugins' env (podspec.identity reads
      it); the svc plugin's ConfigMap and Service.
The other objects (ConfigMaps, NetworkPolicy, PodMonitor) pass through unchanged.
"""
import argparse
import copy
import hashlib
import math
import os
import sys

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
UID = "00000000-0000-4000-8000-000000000001"  # the custom resource's uid (labels that carry it)
# On the Services a controller makes: DNS names only, no ports (validate.js checks the ports of
# our own Services only).
MADE_BY = "tdist-test/made-by"


def die(msg):
    sys.stderr.write("shape: %s\n" % msg)
    sys.exit(1)


def facts():
    with open(os.path.join(HERE, "controllers.yaml")) as f:
        return yaml.safe_load(f)


def load(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d]


def one(docs, kind, group=None):
    l = [d for d in docs if d.get("kind") == kind and (group is None or d["apiVersion"].startswith(group + "/"))]
    if len(l) != 1:
        die("expected one %s%s, found %d" % (kind, " of " + group if group else "", len(l)))
    return l[0]


def fill(template, **kw):
    return template.format(**{k: str(v) for k, v in kw.items()})


def upsert_env(env, name, entry):
    for i, e in enumerate(env):
        if e["name"] == name:
            env[i] = entry
            return
    env.append(entry)


def env_entry(name, spec):
    if spec.startswith("fieldRef:"):
        return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": spec[len("fieldRef:"):]}}}
    return {"name": name, "value": spec}


def cpu_count(res):
    """Trainer's getNumCPUPerNode: requests.cpu, else limits.cpu, as an integer (Quantity.Value()
    rounds up), at least 1."""
    for part in ("requests", "limits"):
        q = ((res or {}).get(part) or {}).get("cpu")
        if q is not None:
            s = str(q)
            v = float(s[:-1]) / 1000 if s.endswith("m") else float(s)
            if v > 0:
                return max(1, math.ceil(v))
    return 1


def trainer_jobset(docs, trainjob, f):
    """The JobSet that Trainer makes from the TrainJob and its runtime."""
    tf = f["trainer"]
    ref = trainjob["spec"]["runtimeRef"]
    rt = [d for d in docs if d.get("kind") == ref.get("kind", "ClusterTrainingRuntime") and d["metadata"]["name"] == ref["name"]]
    if len(rt) != 1:
        die("TrainJob %s: runtime %s/%s is not in the rendered objects" % (trainjob["metadata"]["name"], ref.get("kind"), ref["name"]))
    rt = rt[0]
    name = trainjob["metadata"]["name"]
    tr = trainjob["spec"].get("trainer") or {}
    spec = copy.deepcopy(rt["spec"]["template"]["spec"])
    nnodes = tr.get("numNodes", rt["spec"]["mlPolicy"].get("numNodes", 1))
    found = None
    for rj in spec["replicatedJobs"]:
        labels = (rj["template"].get("metadata") or {}).get("labels") or {}
        if labels.get(tf["ancestor_label"]) != tf["ancestor_value"]:
            continue
        rj["template"]["spec"]["parallelism"] = nnodes
        rj["template"]["spec"]["completions"] = nnodes
        for c in rj["template"]["spec"]["template"]["spec"]["containers"]:
            if c["name"] == tf["container"]:
                found = c
    if found is None:
        die("the runtime has no container %s in a replicated job labelled %s=%s" % (tf["container"], tf["ancestor_label"], tf["ancestor_value"]))
    c = found
    for k in ("image", "command", "args"):
        if k in tr:
            c[k] = tr[k]
    if tr.get("resourcesPerNode"):
        # Merged over the container's, key by key (pkg/runtime/core/trainingruntime.go:199-225).
        res = c.setdefault("resources", {})
        for part in ("limits", "requests"):
            if (tr["resourcesPerNode"].get(part)):
                res.setdefault(part, {}).update(tr["resourcesPerNode"][part])
    c.setdefault("env", [])
    for e in tr.get("env") or []:
        if e["name"] in tf["reserved_env"]:
            die("TrainJob %s sets %s: Trainer's webhook refuses it" % (name, e["name"]))
        upsert_env(c["env"], e["name"], e)
    res = tr.get("resourcesPerNode") or c.get("resources") or {}
    gpus = int(((res.get("limits") or {}).get("nvidia.com/gpu")) or 0)
    nproc = tr.get("numProcPerNode", "auto")
    if nproc == "auto" and gpus == 0:
        nproc = cpu_count(res)
    vals = {"numNodes": nnodes, "numProcPerNode": nproc, "trainjob": name}
    for k, v in tf["env"].items():
        upsert_env(c["env"], k, env_entry(k, fill(v, **vals)))
    ports = c.setdefault("ports", [])
    if not any(p.get("containerPort") == tf["port"] for p in ports):
        ports.append({"containerPort": tf["port"]})
    return {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
            "metadata": {"name": name, "namespace": trainjob["metadata"].get("namespace")}, "spec": spec}


def jobset_children(js, namespace, f):
    """JobSet's webhook defaults, then its child Job (replicas 1) and headless Service."""
    jf = f["jobset"]
    spec = js["spec"]
    net = spec.setdefault("network", {})
    net.setdefault("enableDNSHostnames", jf["defaults"]["enableDNSHostnames"])
    net.setdefault("publishNotReadyAddresses", jf["defaults"]["publishNotReadyAddresses"])
    rjs = spec["replicatedJobs"]
    if len(rjs) != 1 or rjs[0].get("replicas", 1) != 1:
        die("JobSet %s: the harness runs one replicated job of one Job" % js["metadata"]["name"])
    rj = rjs[0]
    name, rjn = js["metadata"]["name"], rj["name"]
    jspec = copy.deepcopy(rj["template"]["spec"])
    jspec.setdefault("completionMode", jf["defaults"]["completionMode"])
    pod = jspec["template"]["spec"]
    pod.setdefault("restartPolicy", jf["defaults"]["restartPolicy"])
    subdomain = net.get("subdomain") or fill(jf["subdomain"], jobset=name)
    if net["enableDNSHostnames"]:
        pod["subdomain"] = subdomain
    jobname = fill(jf["job_name"], jobset=name, replicatedJob=rjn, jobIndex=0)
    group = rj.get("groupName", "default")
    vals = {"jobset": name, "uid": UID, "replicatedJob": rjn, "restarts": 0, "replicas": 1, "globalReplicas": 1,
            "jobIndex": 0, "jobKey": hashlib.sha1(("%s/%s" % (namespace, jobname)).encode()).hexdigest(),
            "jobGlobalIndex": 0, "groupName": group, "groupReplicas": 1, "jobGroupIndex": 0}
    marks = {k: fill(v, **vals) for k, v in jf["labels"].items()}
    meta = copy.deepcopy(rj["template"].get("metadata") or {})
    for m in (meta, jspec["template"].setdefault("metadata", {})):
        m.setdefault("labels", {}).update(marks)
        m.setdefault("annotations", {}).update(marks)
    meta["name"] = jobname
    meta["namespace"] = namespace
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta, "spec": jspec}
    svc = {"apiVersion": "v1", "kind": "Service",
           "metadata": {"name": subdomain, "namespace": namespace, "annotations": {MADE_BY: "JobSet"}},
           "spec": {"clusterIP": "None", "selector": {jf["service_selector"]: name},
                    "publishNotReadyAddresses": net["publishNotReadyAddresses"]}}
    return [job, svc]


def volcano_pods(vj, namespace, f):
    """The Volcano Job's pods as a stand-in Job plus PodShapes, the svc plugin's ConfigMap and Service."""
    vf = f["volcano"]
    spec = vj["spec"]
    name = vj["metadata"]["name"]
    plugins = spec.get("plugins") or {}
    if "pytorch" not in plugins:
        die("Volcano Job %s has no pytorch plugin" % name)
    opts = {"master": "master", "worker": "worker", "port": "23456"}
    for a in plugins["pytorch"]:
        k, _, v = a.lstrip("-").partition("=")
        opts[k] = v
    tasks = {t["name"]: t for t in spec["tasks"]}
    order = [opts["master"], opts["worker"]]
    if set(tasks) != set(order):
        die("Volcano Job %s: tasks %s, the harness runs exactly %s" % (name, sorted(tasks), order))
    if tasks[order[0]]["template"] != tasks[order[1]]["template"]:
        die("Volcano Job %s: the master and worker templates differ; the harness runs one template" % name)
    npods = sum(int(tasks[t].get("replicas", 1)) for t in order)
    tmpl = copy.deepcopy(tasks[order[0]]["template"])
    hosts = {}
    shapes = []
    pub = "--publish-not-ready-addresses=true" in (plugins.get("svc") or [])
    for t in order:
        hl = [fill(vf["pod_name"], job=name, task=t, index=i) + "." + name for i in range(int(tasks[t].get("replicas", 1)))]
        hosts["%s.host" % t] = "\n".join(hl)
        hosts["VC_%s_HOSTS" % t.upper()] = ",".join(hl)
        hosts["VC_%s_NUM" % t.upper()] = str(len(hl))
    cm_name = fill(vf["svc_configmap"], job=name)
    for t in order:
        for i in range(int(tasks[t].get("replicas", 1))):
            rank = 0 if t == opts["master"] else i + 1
            vals = {"job": name, "task": t, "index": i, "namespace": namespace, "queue": spec.get("queue", "default"),
                    "uid": UID, "master": opts["master"], "port": opts["port"], "pods": npods, "rank": rank}
            pod = fill(vf["pod_name"], **vals)
            env = [{"name": "VC_%s_%s" % (tt.upper(), k), "valueFrom": {"configMapKeyRef": {"name": cm_name, "key": "VC_%s_%s" % (tt.upper(), k)}}}
                   for tt in order for k in ("HOSTS", "NUM")]
            env += [{"name": k, "value": fill(v, **vals)} for k, v in vf["env"].items()]
            labels = dict((tmpl.get("metadata") or {}).get("labels") or {})
            labels.update({k: fill(v, **vals) for k, v in vf["labels"].items()})
            ann = dict((tmpl.get("metadata") or {}).get("annotations") or {})
            ann.update({k: fill(v, **vals) for k, v in vf["annotations"].items()})
            shapes.append({"index": len(shapes), "name": pod, "hostname": pod, "labels": labels, "annotations": ann,
                           "env": env, "completionIndex": False})
    # The svc plugin's hostname/subdomain, ConfigMap volume; the pytorch plugin's port.
    pspec = tmpl["spec"]
    pspec["subdomain"] = name
    pspec.setdefault("volumes", []).append({"name": cm_name, "configMap": {"name": cm_name}})
    for c in pspec["containers"]:
        c.setdefault("volumeMounts", []).append({"name": cm_name, "mountPath": vf["svc_mount"]})
        if not any(p.get("containerPort") == int(opts["port"]) for p in c.get("ports") or []):
            c.setdefault("ports", []).append({"name": vf["port_name"], "containerPort": int(opts["port"])})
    # Volcano's policies as the Job controller's: an exit code that aborts or terminates the job
    # fails it; other failures recreate the pod (the harness's replacement).
    # An evicted pod is recreated by Volcano's sync without counting a retry: the Job
    # controller's Ignore of DisruptionTarget.
    codes = [p["exitCode"] for p in spec.get("policies") or [] if "exitCode" in p and p.get("action") in ("AbortJob", "TerminateJob")]
    rules = [{"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}]
    rules += [{"action": "FailJob", "onExitCodes": {"operator": "In", "values": codes}}] if codes else []
    # The labels every pod has (the per-pod ones are in PodShapes), so that validate.js's
    # selector rules see them on the stand-in's template.
    common = {k: fill(v, job=name, namespace=namespace, queue=spec.get("queue", "default"))
              for k, v in vf["labels"].items() if "{index}" not in v and "{task}" not in v}
    tmpl.setdefault("metadata", {}).setdefault("labels", {}).update(common)
    job = {"apiVersion": "batch/v1", "kind": "Job",
           "metadata": {"name": name, "namespace": namespace, "annotations": {"tdist-test/stand-in": "Volcano Job %s" % name}},
           "spec": {"completionMode": "Indexed", "completions": npods, "parallelism": npods,
                    "backoffLimitPerIndex": int(spec.get("maxRetry", 3)), "podFailurePolicy": {"rules": rules},
                    "template": tmpl}}
    return [job,
            {"apiVersion": "tdist.test/v1", "kind": "PodShapes", "metadata": {"name": name}, "pods": shapes},
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": cm_name, "namespace": namespace}, "data": hosts},
            {"apiVersion": "v1", "kind": "Service",
             "metadata": {"name": name, "namespace": namespace, "annotations": {MADE_BY: "Volcano svc plugin"}},
             "spec": {"clusterIP": "None", "publishNotReadyAddresses": pub,
                      "selector": {"volcano.sh/job-name": name, "volcano.sh/job-namespace": namespace}}}]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("controller", choices=["trainer", "jobset", "volcano"])
    ap.add_argument("files", nargs="+")
    ap.add_argument("--namespace", default="default")
    a = ap.parse_args()
    f = facts()
    docs = load(a.files[0])
    if a.controller == "trainer":
        if len(a.files) != 3:
            die("usage: shape.py trainer RENDERED TRAINJOB OUT")
        tj = one(load(a.files[1]), "TrainJob")
        made = jobset_children(trainer_jobset(docs, tj, f), a.namespace, f)
        rest = [d for d in docs if not d["kind"].endswith("TrainingRuntime")]
    elif a.controller == "jobset":
        made = jobset_children(one(docs, "JobSet"), a.namespace, f)
        rest = [d for d in docs if d["kind"] != "JobSet"]
    else:
        made = volcano_pods(one(docs, "Job", "batch.volcano.sh"), a.namespace, f)
        rest = [d for d in docs if not d["apiVersion"].startswith("batch.volcano.sh/")]
    with open(a.files[-1], "w") as out:
        yaml.safe_dump_all(made + rest, out, sort_keys=False)


if __name__ == "__main__":
    main()
