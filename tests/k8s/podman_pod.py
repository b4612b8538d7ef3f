"""podman_pod.py: one pod of the rendered Indexed Job as a `podman run` command line, doing what the
kubelet does with the pod spec and nothing it would not. Every value comes from the rendered YAML
(kubectl kustomize output); tests/k8s/cluster.py runs the result. Needs python3-yaml.

What is translated, and how:
  - image, command (--entrypoint) and args; the image's ENTRYPOINT, USER, PATH, STOPSIGNAL stay;
    $(VAR) references in command, args and env are expanded as the kubelet does.
  - env: the container's env in order, with the downward API (metadata.name = <job>-<i>-<5 random>,
    metadata.namespace, metadata.uid, labels and annotations of the Job controller, status.podIP,
    status.hostIP, spec.nodeName, spec.serviceAccountName), envFrom configMapRef, configMapKeyRef,
    then JOB_COMPLETION_INDEX, which the Job controller appends. HOSTNAME is the pod's hostname.
    A PodShapes object (tests/k8s/shape.py) names each pod instead, for a controller that makes
    its pods itself (Volcano): name, hostname, labels, annotations, env it appends, no
    JOB_COMPLETION_INDEX.
  - hostname <job>-<i> (the Job controller sets it for Indexed Jobs), the subdomain's FQDN in
    /etc/hosts, and resolv.conf search "<ns>.svc.<domain> svc.<domain> <domain>", ndots 5.
  - DNS: on the cluster's podman network, aardvark-dns answers the aliases
    <hostname>.<subdomain>.<ns>.svc.<domain> and <subdomain>.<ns>.svc.<domain> (the headless
    Service, publishNotReadyAddresses): only while the container exists, at its current IP.
  - securityContext (container over pod): runAsUser/runAsGroup (--user), fsGroup and
    supplementalGroups (--group-add), runAsNonRoot (refused here when the UID is 0, as the kubelet
    refuses to start it), readOnlyRootFilesystem (--read-only, without podman's extra tmpfs on
    /tmp, /var/tmp and /run), allowPrivilegeEscalation false (no-new-privileges), capabilities
    (--cap-drop/--cap-add), seccompProfile RuntimeDefault (the runtime's default profile; podman's)
    or Unconfined.
  - volumes: configMap (the ConfigMap's files, read-only, mode defaultMode), emptyDir (a fresh
    directory, mode 0777), emptyDir medium Memory (a tmpfs, size = sizeLimit).
  - resources: limits.memory (--memory, no swap), limits.cpu (--cpus), requests.cpu (--cpu-shares).
Not translated: image pulls (the image must be in the store: --pull never), service account
tokens (the Job sets automountServiceAccountToken: false), the KUBERNETES_SERVICE_* variables.
"""
import json
import os
import random
import re
import shutil

import podspec

RAND_ALPHABET = podspec.RAND_ALPHABET


def die(msg):
    raise SystemExit("podman_pod: %s" % msg)


def quantity(q):
    """A Kubernetes quantity as a number (bytes for memory, cores for cpu)."""
    s = str(q)
    m = re.fullmatch(r"([0-9.]+)(Ki|Mi|Gi|Ti|k|M|G|T|m)?", s)
    if not m:
        die("resource quantity %r is not understood (use e.g. 4Gi, 500m, 2)" % s)
    mult = {None: 1, "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40,
            "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "m": 0.001}[m.group(2)]
    return float(m.group(1)) * mult


class PodSpec:
    """The rendered objects (podspec.load) and what every pod of the Job shares."""

    def __init__(self, rendered, domain="cluster.local"):
        self.by_kind, self.job = podspec.load(rendered)
        self.tmpl = self.job["spec"]["template"]
        self.pod = self.tmpl["spec"]
        self.container = podspec.the_container(self.job)
        self.jobname = self.job["metadata"]["name"]
        self.svc = self.pod.get("subdomain", "")
        self.domain = domain
        self.completions = int(self.job["spec"].get("completions", 1))
        self.grace = int(self.pod.get("terminationGracePeriodSeconds", 30))
        self.configmaps = {cm["metadata"]["name"]: cm for cm in self.by_kind.get("ConfigMap", [])}

    def port(self, p):
        return podspec.named_port(self.container, p)

    def probes(self):
        """{kind: probe dict with port resolved} of the container's probes (httpGet only)."""
        out = {}
        for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
            p = self.container.get(kind)
            if not p:
                continue
            g = p.get("httpGet")
            if not g:
                die("%s is not an httpGet probe; only HTTP probes are run" % kind)
            out[kind] = {
                "path": g.get("path", "/"), "port": self.port(g["port"]),
                "period": int(p.get("periodSeconds", 10)), "delay": int(p.get("initialDelaySeconds", 0)),
                "timeout": int(p.get("timeoutSeconds", 1)), "failures": int(p.get("failureThreshold", 3)),
                "successes": int(p.get("successThreshold", 1)),
                "grace": int(p.get("terminationGracePeriodSeconds", self.grace)),
            }
        return out

    def sc(self, key, default=None):
        csc = self.container.get("securityContext") or {}
        psc = self.pod.get("securityContext") or {}
        return csc.get(key, psc.get(key, default))


def _env(spec, field, extra=()):
    """The container's env (envFrom, then env in order), then extra: what a controller appends."""
    env = {}
    for e in spec.container.get("envFrom") or []:
        if "configMapRef" not in e:
            die("envFrom other than configMapRef is not supported")
        cm = spec.configmaps[e["configMapRef"]["name"]]
        for k, v in (cm.get("data") or {}).items():
            env[e.get("prefix", "") + k] = v
    for e in list(spec.container.get("env") or []) + list(extra):
        if "value" in e:
            env[e["name"]] = podspec.expand(str(e["value"]), env)
        elif "valueFrom" in e and "fieldRef" in e["valueFrom"]:
            env[e["name"]] = field(e["valueFrom"]["fieldRef"]["fieldPath"])
        elif "valueFrom" in e and "configMapKeyRef" in e["valueFrom"]:
            ref = e["valueFrom"]["configMapKeyRef"]
            env[e["name"]] = spec.configmaps[ref["name"]]["data"][ref["key"]]
        elif "valueFrom" in e:
            die("env %s: valueFrom %s is not supported" % (e["name"], list(e["valueFrom"])))
        else:
            env[e["name"]] = ""
    return env


def _volumes(spec, poddir):
    """--mount options of the container's volumeMounts; files laid out under poddir."""
    vols = {v["name"]: v for v in spec.pod.get("volumes") or []}
    out = []
    for vm in spec.container.get("volumeMounts") or []:
        v = vols.get(vm["name"])
        if v is None:
            die("volumeMount %s names no volume" % vm["name"])
        mp = vm["mountPath"]
        ro = ",ro=true" if vm.get("readOnly") else ""
        if "configMap" in v:
            cm = spec.configmaps.get(v["configMap"]["name"])
            if cm is None:
                die("volume %s: ConfigMap %s is not in the rendered output" % (v["name"], v["configMap"]["name"]))
            d = os.path.join(poddir, "configmap-" + v["name"])
            os.makedirs(d)
            os.chmod(d, 0o755)
            data = cm.get("data") or {}
            items = v["configMap"].get("items")
            pairs = [(it["path"], data[it["key"]]) for it in items] if items else data.items()
            for fname, text in pairs:
                with open(os.path.join(d, fname), "w") as f:
                    f.write(text)
                os.chmod(os.path.join(d, fname), v["configMap"].get("defaultMode", 0o644))
            out.append("type=bind,src=%s,dst=%s,ro=true" % (d, mp))  # configMap volumes are read-only
        elif "emptyDir" in v:
            ed = v["emptyDir"] or {}
            if ed.get("medium") == "Memory":
                size = ",tmpfs-size=%d" % quantity(ed["sizeLimit"]) if "sizeLimit" in ed else ""
                out.append("type=tmpfs,dst=%s,tmpfs-mode=1777%s%s" % (mp, size, ro))
            else:
                d = os.path.join(poddir, "emptydir-" + v["name"])
                os.makedirs(d)
                os.chmod(d, 0o777)
                out.append("type=bind,src=%s,dst=%s%s" % (d, mp, ro))
        else:
            die("volume %s: only configMap and emptyDir volumes are supported" % v["name"])
    return out


def _security(spec):
    args = []
    uid = spec.sc("runAsUser")
    if uid is None:
        die("no runAsUser in the pod or container securityContext: the image's USER would run, "
            "which this harness does not check against runAsNonRoot")
    if spec.sc("runAsNonRoot") and int(uid) == 0:
        die("runAsNonRoot with runAsUser 0: the kubelet refuses to start this container")
    gid = spec.sc("runAsGroup")
    args += ["--user", "%d:%d" % (uid, gid) if gid is not None else str(uid)]
    psc = spec.pod.get("securityContext") or {}
    for g in ([psc["fsGroup"]] if "fsGroup" in psc else []) + list(psc.get("supplementalGroups") or []):
        args += ["--group-add", str(g)]
    csc = spec.container.get("securityContext") or {}
    if csc.get("privileged"):
        die("privileged containers are not run by this harness")
    if csc.get("readOnlyRootFilesystem"):
        args += ["--read-only", "--read-only-tmpfs=false"]
    if csc.get("allowPrivilegeEscalation") is False:
        args += ["--security-opt", "no-new-privileges"]
    caps = csc.get("capabilities") or {}
    for c in caps.get("drop") or []:
        args += ["--cap-drop", c]
    for c in caps.get("add") or []:
        args += ["--cap-add", c]
    seccomp = (spec.sc("seccompProfile") or {}).get("type", "RuntimeDefault")
    if seccomp == "Unconfined":
        args += ["--security-opt", "seccomp=unconfined"]
    elif seccomp != "RuntimeDefault":
        die("seccompProfile %s is not supported (RuntimeDefault or Unconfined)" % seccomp)
    return args


def _resources(spec):
    res = spec.container.get("resources") or {}
    lim, req = res.get("limits") or {}, res.get("requests") or {}
    args = []
    if "memory" in lim:
        b = int(quantity(lim["memory"]))
        args += ["--memory", "%db" % b, "--memory-swap", "%db" % b]
    if "cpu" in lim:
        args += ["--cpus", "%g" % quantity(lim["cpu"])]
    if "cpu" in req:
        args += ["--cpu-shares", str(max(2, int(quantity(req["cpu"]) * 1024)))]
    return args


def podman_run(spec, index, namespace, network, ip, image, name, poddir, labels=()):
    """(pod name, argv of `podman run`) for pod index `index` at `ip` on podman network `network`."""
    uid = "%08x-0000-4000-8000-%012x" % (random.getrandbits(32), random.getrandbits(48))
    hostname, podname, lbl, ann, extra_env, completion_index = podspec.identity(spec.by_kind, spec.job, index, uid)
    fields = {
        "metadata.name": podname, "metadata.namespace": namespace, "metadata.uid": uid,
        "status.podIP": ip, "status.podIPs": ip, "status.hostIP": ip.rsplit(".", 1)[0] + ".1",
        "spec.nodeName": "node-%d" % index,
        "spec.serviceAccountName": spec.pod.get("serviceAccountName", "default"),
    }

    env = _env(spec, podspec.downward_api(fields, lbl, ann, "podman_pod.py"), extra_env)
    if completion_index:
        env["JOB_COMPLETION_INDEX"] = str(index)
    if os.path.exists(poddir):
        shutil.rmtree(poddir)
    os.makedirs(poddir)
    os.chmod(poddir, 0o755)
    dom = spec.domain
    argv = ["podman", "run", "--pull", "never", "--name", name, "--hostname", hostname,
            "--network", network, "--ip", ip]
    for k, v in labels:
        argv += ["--label", "%s=%s" % (k, v)]
    if spec.svc:
        fqdn = "%s.%s.%s.svc.%s" % (hostname, spec.svc, namespace, dom)
        argv += ["--network-alias", fqdn, "--network-alias", "%s.%s.svc.%s" % (spec.svc, namespace, dom),
                 "--add-host", "%s:%s" % (fqdn, ip)]
    for s in ("%s.svc.%s" % (namespace, dom), "svc." + dom, dom):
        argv += ["--dns-search", s]
    argv += ["--dns-option", "ndots:5"]
    argv += _security(spec) + _resources(spec)
    for m in _volumes(spec, poddir):
        argv += ["--mount", m]
    for k, v in env.items():
        argv += ["--env", "%s=%s" % (k, v)]
    cmd = [podspec.expand(a, env) for a in spec.container.get("command") or []]
    if cmd:
        argv += ["--entrypoint", json.dumps(cmd)]
    argv.append(image if image else spec.container["image"])
    argv += [podspec.expand(str(a), env) for a in spec.container.get("args") or []]
    return podname, argv

