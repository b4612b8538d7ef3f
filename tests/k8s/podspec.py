#!/usr/bin/python3
"""podspec.py: turns the rendered manifests (kubectl kustomize output) into what the kubelet would
run for one pod of the Indexed Job, for tests/k8s: everything comes from the YAML, nothing is
repeated here. Needs python3-yaml.

  podspec.py summary RENDERED
      Shell assignments (eval them): job, svc (the pods' subdomain), namespace (empty if the
      objects name none), completions, container, and probes: "PATH PORT" lines of the
      container's HTTP probes, the named ports resolved to numbers.
  podspec.py same A.yaml B.yaml
      Exit 0 if the two renderings hold the same objects in the same order (empty
      metadata.labels/annotations maps count as absent: older kustomize writes `labels: {}`).
  podspec.py pod RENDERED --index I --namespace NS --pod-ip IP --root DIR --image-prefix P
                 --bin NAME=FILE... [--gpus N]
      Lays out pod <job>-<I> under DIR/<pod>/ and prints the path of DIR/<pod>.sh, a script that
      runs the container's entrypoint as the kubelet would. Run it as root in a private mount
      namespace (pods.sh's pods_exec gives one; else `unshare --mount --propagation private`);
      arguments given to the script are appended to the container's args (--check-config).

What the script reproduces, and how:
  - entrypoint: the Job sets only args, so the image's ENTRYPOINT runs: tdist-agent, found at
    P/bin/tdist-agent, as the files the image would have at P/bin/NAME (the --bin FILEs, copied).
  - paths that do not exist on this machine (the image prefix P, configMap volume mountPaths,
    emptyDir mountPaths that are not directories here) live under DIR/<pod>/ and every string
    that starts with one of them is rewritten by prefixing DIR/<pod>: the container's command,
    args and env values, and the text of the ConfigMap files. Nothing else is changed.
  - emptyDir volumes whose mountPath exists here (/tmp, /dev/shm) are fresh tmpfs mounts there
    (medium Memory: size = sizeLimit); the container gets a fresh /dev (null, zero, full, random,
    urandom, tty, shm) and, with nvidia.com/gpu: N, the device files /dev/nvidia0..N-1 and
    /dev/nvidiactl as the NVIDIA device plugin injects them (empty files: only names are read).
  - readOnlyRootFilesystem: / is remounted read-only in the pod's mount namespace.
  - securityContext: runAsUser/runAsGroup/fsGroup, allowPrivilegeEscalation false (no_new_privs),
    capabilities (bounding set): setpriv.
  - environment: exactly what the kubelet injects (env -i): PATH, HOSTNAME=<pod hostname>, the
    container's env with the downward API resolved (metadata.name = <job>-<I>-<5 random chars>,
    metadata.namespace, status.podIP, the Job controller's labels and annotations), then
    JOB_COMPLETION_INDEX=I; $(VAR) references in args and env are expanded as the kubelet does.
Not reproduced: the PID namespace (the agent is not PID 1 here), seccomp, cgroup limits.
"""
import argparse
import os
import random
import re
import shlex
import shutil
import sys

import yaml

# The PATH of a Debian-based image (the agent and its workers are called by absolute path anyway).
IMAGE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Kubernetes' random name suffixes use this alphabet (apimachinery util/rand, no vowels).
RAND_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"


def die(msg):
    sys.stderr.write("podspec: %s\n" % msg)
    sys.exit(1)


def load(path):
    with open(path) as f:
        docs = [d for d in yaml.safe_load_all(f) if d is not None]
    by_kind = {}
    for d in docs:
        by_kind.setdefault(d.get("kind"), []).append(d)
    jobs = by_kind.get("Job", [])
    if len(jobs) != 1:
        die("%s: expected exactly one Job, found %d" % (path, len(jobs)))
    return by_kind, jobs[0]


def the_container(job):
    cs = job["spec"]["template"]["spec"].get("containers") or []
    if len(cs) != 1:
        die("the Job's pod has %d containers; the simulation runs exactly one (the agent)" % len(cs))
    return cs[0]


def named_port(container, port):
    if isinstance(port, int):
        return port
    for p in container.get("ports") or []:
        if p.get("name") == port:
            return p["containerPort"]
    die("container %s has no port named %r" % (container["name"], port))


def probes(container):
    out = []
    for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
        p = container.get(kind)
        if not p:
            continue
        g = p.get("httpGet")
        if not g:
            die("%s is not an httpGet probe; the simulation probes HTTP only" % kind)
        if g.get("scheme", "HTTP") != "HTTP":
            die("%s uses scheme %s; the agent serves plain HTTP" % (kind, g.get("scheme")))
        out.append("%s %d" % (g.get("path", "/"), named_port(container, g["port"])))
    return out


def scrapes(by_kind, container):
    """ "PATH PORT" of every PodMonitor endpoint (named ports resolved in the container)."""
    out = []
    for pm in by_kind.get("PodMonitor", []):
        for ep in pm["spec"].get("podMetricsEndpoints") or []:
            port = ep.get("port", ep.get("targetPort"))
            out.append("%s %d" % (ep.get("path", "/metrics"), named_port(container, port)))
    return out


def cmd_summary(args):
    by_kind, job = load(args.rendered)
    spec = job["spec"]
    pod = spec["template"]["spec"]
    c = the_container(job)
    ns = job["metadata"].get("namespace", "")
    vals = {
        "job": job["metadata"]["name"],
        "svc": pod.get("subdomain", ""),
        "namespace": ns,
        "completions": str(spec.get("completions", 1)),
        "container": c["name"],
        "probes": "\n".join(probes(c)),
        "scrape": "\n".join(scrapes(by_kind, c)),
        "hostnames": " ".join(identity(by_kind, job, i, "")[0] for i in range(int(spec.get("completions", 1)))),
    }
    for k, v in vals.items():
        print("%s=%s" % (k, shlex.quote(v)))


def cmd_same(args):
    def objs(path):
        with open(path) as f:
            docs = [d for d in yaml.safe_load_all(f) if d is not None]
        for d in docs:
            md = d.get("metadata") or {}
            for k in ("labels", "annotations"):
                if md.get(k) == {}:
                    del md[k]
        return docs
    a, b = objs(args.a), objs(args.b)
    if a == b:
        return
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            die("object %d differs: %s/%s\n%s\n---\n%s" % (i, x.get("kind"), (x.get("metadata") or {}).get("name"),
                                                        yaml.safe_dump(x), yaml.safe_dump(y)))
    die("%s has %d objects, %s has %d" % (args.a, len(a), args.b, len(b)))


def expand(s, env):
    """The kubelet's $(VAR) expansion: $(NAME) of a defined variable is replaced, $$ is $."""
    def rep(m):
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)", rep, s)


def downward_api(fields, labels, annotations, where):
    """The resolver of the downward API's fieldPath values for one pod: FIELDS (a dict of plain
    paths), metadata.labels['k'] and metadata.annotations['k'] from LABELS and ANNOTATIONS; a
    path it does not know ends the program naming WHERE to add it."""
    def field(path):
        m = re.fullmatch(r"metadata\.(labels|annotations)\['([^']+)'\]", path)
        if m:
            return (labels if m.group(1) == "labels" else annotations).get(m.group(2), "")
        if path not in fields:
            die("downward API fieldPath %r is not supported (add it to %s)" % (path, where))
        return fields[path]
    return field


def identity(by_kind, job, idx, uid):
    """Who pod idx is: (hostname, pod name, labels, annotations, extra env entries, whether the
    Job controller's JOB_COMPLETION_INDEX is set). The Job controller's, unless the rendered
    objects hold a PodShapes object (tests/k8s/shape.py, for a controller that makes its pods
    itself, as Volcano does): then its entry for idx, its env appended after the container's."""
    tmpl = job["spec"]["template"]
    jobname = job["metadata"]["name"]
    shapes = by_kind.get("PodShapes") or []
    if shapes:
        pods = {p["index"]: p for p in shapes[0]["pods"]}
        if idx not in pods:
            die("PodShapes has no pod %d" % idx)
        p = pods[idx]
        return (p["hostname"], p["name"], dict(p["labels"]), dict(p["annotations"]), list(p.get("env") or []),
                bool(p.get("completionIndex")))
    hostname = "%s-%d" % (jobname, idx)
    podname = "%s-%s" % (hostname, "".join(random.choice(RAND_ALPHABET) for _ in range(5)))
    labels = dict(tmpl.get("metadata", {}).get("labels") or {})
    labels.update({
        "batch.kubernetes.io/job-name": jobname, "job-name": jobname,
        "batch.kubernetes.io/controller-uid": uid, "controller-uid": uid,
        "batch.kubernetes.io/job-completion-index": str(idx),
    })
    annotations = dict(tmpl.get("metadata", {}).get("annotations") or {})
    annotations["batch.kubernetes.io/job-completion-index"] = str(idx)
    return hostname, podname, labels, annotations, [], True


def cmd_pod(args):
    by_kind, job = load(args.rendered)
    tmpl = job["spec"]["template"]
    pod = tmpl["spec"]
    c = the_container(job)
    jobname = job["metadata"]["name"]
    idx = args.index
    uid = "%08x-0000-4000-8000-%012x" % (random.getrandbits(32), random.getrandbits(48))
    hostname, podname, labels, annotations, extra_env, completion_index = identity(by_kind, job, idx, uid)
    root = os.path.join(os.path.abspath(args.root), hostname)
    if os.path.exists(root):
        shutil.rmtree(root)
    os.makedirs(root)
    os.chmod(root, 0o755)

    fields = {
        "metadata.name": podname, "metadata.namespace": args.namespace, "metadata.uid": uid,
        "status.podIP": args.pod_ip, "status.podIPs": args.pod_ip,
        "spec.nodeName": "node-%d" % idx, "spec.serviceAccountName": pod.get("serviceAccountName", "default"),
    }

    field = downward_api(fields, labels, annotations, "podspec.py")

    configmaps = {cm["metadata"]["name"]: cm for cm in by_kind.get("ConfigMap", [])}

    # Paths that live under the pod's directory, and the rewrite of strings that start with one.
    mapped = [args.image_prefix.rstrip("/")]
    volumes = {v["name"]: v for v in pod.get("volumes") or []}
    setup = []  # shell lines, run as root before the entrypoint
    for vm in c.get("volumeMounts") or []:
        v = volumes.get(vm["name"])
        if v is None:
            die("volumeMount %s names no volume" % vm["name"])
        mp = vm["mountPath"].rstrip("/") or "/"
        if "configMap" in v:
            cm = configmaps.get(v["configMap"]["name"])
            if cm is None:
                die("volume %s: ConfigMap %s is not in the rendered output" % (v["name"], v["configMap"]["name"]))
            mapped.append(mp)
        elif "emptyDir" in v:
            ed = v["emptyDir"] or {}
            size = ed.get("sizeLimit") if ed.get("medium") == "Memory" else None
            opts = "mode=1777" + (",size=%s" % str(size).replace("i", "") if size else "")
            if os.path.isdir(mp) or mp.startswith("/dev/"):
                setup.append("mkdir -p %s && mount -t tmpfs -o %s tmpfs %s" % (shlex.quote(mp), opts, shlex.quote(mp)))
            else:
                mapped.append(mp)
                setup.append("mount -t tmpfs -o %s tmpfs %s" % (opts, shlex.quote(root + mp)))
        else:
            die("volume %s: only configMap and emptyDir volumes are simulated" % v["name"])
    mapped.sort(key=len, reverse=True)
    prefix_re = re.compile(r"(?<![\w./-])(%s)(?=/|$|[\s\"',\]\}])" % "|".join(re.escape(m) for m in mapped))

    def rewrite(s):
        return prefix_re.sub(lambda m: root + m.group(1), s)

    # Files: the image, the ConfigMap volumes (rewritten), the mount points of mapped emptyDirs.
    for b in args.bin:
        name, _, src = b.partition("=")
        dst = root + args.image_prefix.rstrip("/") + "/bin/" + name
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        shutil.copy(src, dst)
        os.chmod(dst, 0o755)
    for vm in c.get("volumeMounts") or []:
        v = volumes[vm["name"]]
        d = root + (vm["mountPath"].rstrip("/") or "/")
        os.makedirs(d, exist_ok=True)
        if "configMap" in v:
            cm = configmaps[v["configMap"]["name"]]
            items = v["configMap"].get("items")
            data = cm.get("data") or {}
            pairs = [(it["path"], data[it["key"]]) for it in items] if items else data.items()
            for fname, text in pairs:
                with open(os.path.join(d, fname), "w") as f:
                    f.write(rewrite(text))
                os.chmod(os.path.join(d, fname), v["configMap"].get("defaultMode", 0o644))
    for dirpath, dirnames, _ in os.walk(root):
        for dn in dirnames:
            os.chmod(os.path.join(dirpath, dn), 0o755)

    # Environment: the container's env in order (later entries may use earlier ones), then
    # JOB_COMPLETION_INDEX, which the Job controller appends.
    env = {"PATH": IMAGE_PATH, "HOSTNAME": hostname}
    for e in c.get("envFrom") or []:
        if "configMapRef" not in e:
            die("envFrom other than configMapRef is not simulated")
        cm = configmaps[e["configMapRef"]["name"]]
        for k, v in (cm.get("data") or {}).items():
            env[e.get("prefix", "") + k] = rewrite(v)
    for e in (c.get("env") or []) + extra_env:
        if "value" in e:
            env[e["name"]] = rewrite(expand(str(e["value"]), env))
        elif "valueFrom" in e and "fieldRef" in e["valueFrom"]:
            env[e["name"]] = field(e["valueFrom"]["fieldRef"]["fieldPath"])
        elif "valueFrom" in e and "configMapKeyRef" in e["valueFrom"]:
            ref = e["valueFrom"]["configMapKeyRef"]
            env[e["name"]] = rewrite(configmaps[ref["name"]]["data"][ref["key"]])
        elif "valueFrom" in e:
            die("env %s: valueFrom %s is not simulated" % (e["name"], list(e["valueFrom"])))
        else:
            env[e["name"]] = ""
    if completion_index:
        env["JOB_COMPLETION_INDEX"] = str(idx)
    argv = [rewrite(expand(a, env)) for a in (c.get("command") or [])]
    if argv:
        die("the container sets command %r; the simulation runs the image's entrypoint" % c["command"])
    argv = [root + args.image_prefix.rstrip("/") + "/bin/tdist-agent"]
    argv += [rewrite(expand(str(a), env)) for a in c.get("args") or []]

    psc = pod.get("securityContext") or {}
    csc = c.get("securityContext") or {}

    def sc(key, default=None):
        return csc.get(key, psc.get(key, default))

    ruid = sc("runAsUser")
    if not isinstance(ruid, int):
        die("no numeric runAsUser in the pod or container securityContext")
    rgid = sc("runAsGroup", 0)
    groups = [str(g) for g in ([psc["fsGroup"]] if "fsGroup" in psc else []) + list(psc.get("supplementalGroups") or [])]
    setpriv = ["setpriv", "--reuid=%d" % ruid, "--regid=%d" % rgid]
    setpriv += ["--groups=" + ",".join(groups)] if groups else ["--clear-groups"]
    if csc.get("allowPrivilegeEscalation") is False:
        setpriv.append("--no-new-privs")
    caps = csc.get("capabilities") or {}
    bset = "-all" if "ALL" in (caps.get("drop") or []) else ""
    for cap in caps.get("add") or []:
        bset += ",+" + cap.lower()
    if bset:
        setpriv += ["--bounding-set=" + bset.lstrip(","), "--inh-caps=-all"]

    gpus = 0
    lim = (c.get("resources") or {}).get("limits") or {}
    if "nvidia.com/gpu" in lim:
        gpus = int(lim["nvidia.com/gpu"])

    q = shlex.quote
    lines = [
        "#!/bin/bash",
        "# Generated by tests/k8s/podspec.py: pod %s (hostname %s) of Job %s. Run as root in a" % (podname, hostname, jobname),
        "# private mount namespace; extra arguments are appended to the container's args.",
        "set -euo pipefail",
        "R=%s" % q(root),
        "# A container's /dev: a fresh tmpfs with the usual character devices bound from the host.",
        "mkdir -p \"$R/.hostdev\" && mount --bind /dev \"$R/.hostdev\"",
        "mount -t tmpfs -o mode=755,size=1m tmpfs /dev",
        "for d in null zero full random urandom tty; do touch /dev/$d; mount --bind \"$R/.hostdev/$d\" /dev/$d; done",
        "umount -l \"$R/.hostdev\"",
        "ln -s /proc/self/fd /dev/fd; ln -s /proc/self/fd/0 /dev/stdin; ln -s /proc/self/fd/1 /dev/stdout; ln -s /proc/self/fd/2 /dev/stderr",
        "mkdir -p /dev/shm /dev/pts",
    ]
    if gpus:
        lines.append("# nvidia.com/gpu: %d, as the NVIDIA device plugin exposes them." % gpus)
        lines.append("for ((i = 0; i < %d; i++)); do touch /dev/nvidia$i; done; touch /dev/nvidiactl" % gpus)
    lines.append("# The emptyDir volumes.")
    lines += setup
    if csc.get("readOnlyRootFilesystem"):
        lines.append("mount -o remount,bind,ro /")
    lines.append("cd /")
    cmd = setpriv + ["--", "env", "-i"] + ["%s=%s" % kv for kv in env.items()] + argv
    lines.append("exec " + " ".join(q(a) for a in cmd) + ' "$@"')
    script = root + ".sh"
    with open(script, "w") as f:
        f.write("\n".join(lines) + "\n")
    os.chmod(script, 0o755)
    print(script)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("summary")
    s.add_argument("rendered")
    s = sub.add_parser("same")
    s.add_argument("a")
    s.add_argument("b")
    p = sub.add_parser("pod")
    p.add_argument("rendered")
    p.add_argument("--index", type=int, required=True)
    p.add_argument("--namespace", required=True)
    p.add_argument("--pod-ip", required=True)
    p.add_argument("--root", required=True)
    p.add_argument("--image-prefix", required=True)
    p.add_argument("--bin", action="append", default=[], help="NAME=FILE: FILE is the image's PREFIX/bin/NAME")
    args = ap.parse_args()
    {"summary": cmd_summary, "same": cmd_same, "pod": cmd_pod}[args.cmd](args)


if __name__ == "__main__":
    main()
