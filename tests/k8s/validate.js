// validate.js: checks rendered manifests (kubectl kustomize output) of k8s/ against the
// Kubernetes OpenAPI schemas and against tdist's deployment rules.
//
//   node validate.js NAME:cpu|gpu RENDERED.yaml EFFECTIVE.yaml [NAME:... ...]
//   node validate.js --self-test NAME:cpu|gpu RENDERED.yaml EFFECTIVE.yaml
//
// RENDERED is one kustomization's output; EFFECTIVE is what `tdist-agent --check-config` printed
// for its ConfigMap's agent.yaml in the pod's environment (so the rules compare the manifests
// with the agent's own reading of its configuration, durations in seconds and all). cpu|gpu is
// what the kustomization is for. Per object:
//   1. schema: the kubernetes-models class for apiVersion/kind (prometheus-operator's for
//      monitoring.coreos.com) validates it; an apiVersion/kind without a class is a failure;
//   2. unknown fields: none, as the API server's strict field validation demands
//      (strict_fields.js; the schemas themselves allow any extra key);
// then the rules of policy() over the whole set. --self-test applies mutations that each break
// one rule to a copy of a valid set and fails unless every one of them is caught: the checks
// cannot pass vacuously. Exit status 0 when everything holds; failures are listed on stdout.
"use strict";

const fs = require("fs");
const path = require("path");
const YAML = require("yaml");
const { unknownFields } = require("./strict_fields.js");

const NODE_MODULES = (process.env.NODE_PATH || "").split(path.delimiter).filter(Boolean)[0] || __dirname;

// The agent's exit status for bad configuration (tdist-agent --help, "Exit status").
const AGENT_EXIT_BAD_CONFIG = 64;

function modelModule(apiVersion, kind) {
  if (!/^[A-Za-z]+$/.test(kind || "") || !/^([a-z0-9.-]+\/)?v[0-9a-z]+$/.test(apiVersion || "")) return null;
  const group = apiVersion.includes("/") ? apiVersion.split("/")[0] : "";
  const pkg = group === "monitoring.coreos.com" ? "@kubernetes-models/prometheus-operator" : "kubernetes-models";
  if (group.endsWith("coreos.com") && pkg === "kubernetes-models") return null;
  return `${pkg}/${apiVersion}/${kind}`;
}

function checkSchema(obj) {
  const where = `${obj.kind || "?"}/${(obj.metadata || {}).name || "?"}`;
  const spec = modelModule(obj.apiVersion, obj.kind);
  let cls = null;
  if (spec) {
    try {
      cls = require(require.resolve(spec, { paths: [NODE_MODULES] }))[obj.kind];
    } catch (e) {
      if (e.code !== "MODULE_NOT_FOUND" && e.code !== "ERR_PACKAGE_PATH_NOT_EXPORTED") throw e;
    }
  }
  if (!cls || cls.kind !== obj.kind || cls.apiVersion !== obj.apiVersion)
    return [`${where}: no schema for apiVersion ${obj.apiVersion} kind ${obj.kind} (unknown kinds fail)`];
  const errs = [];
  try {
    new cls(obj).validate();
  } catch (e) {
    errs.push(`${where}: schema: ${e.message}`);
  }
  for (const f of unknownFields(obj, spec, obj.kind, NODE_MODULES))
    errs.push(`${where}: unknown field ${f} (the API server rejects it)`);
  return errs;
}

// --- label selectors and pods as the Job controller creates them ---

function selects(selector, labels) {
  if (!selector) return false;
  const ml = selector.matchLabels || {};
  const ex = selector.matchExpressions || [];
  if (Object.keys(ml).length === 0 && ex.length === 0) return true;
  for (const [k, v] of Object.entries(ml)) if (labels[k] !== v) return false;
  for (const e of ex) {
    const has = Object.prototype.hasOwnProperty.call(labels, e.key);
    const vals = e.values || [];
    if (e.operator === "In" && !(has && vals.includes(labels[e.key]))) return false;
    if (e.operator === "NotIn" && has && vals.includes(labels[e.key])) return false;
    if (e.operator === "Exists" && !has) return false;
    if (e.operator === "DoesNotExist" && has) return false;
  }
  return true;
}

function podLabels(job, index) {
  const l = { ...((job.spec.template.metadata || {}).labels || {}) };
  const name = job.metadata.name;
  Object.assign(l, {
    "batch.kubernetes.io/job-name": name,
    "job-name": name,
    "batch.kubernetes.io/controller-uid": "00000000-0000-4000-8000-000000000000",
    "controller-uid": "00000000-0000-4000-8000-000000000000",
    "batch.kubernetes.io/job-completion-index": String(index),
  });
  return l;
}

// A service selector ({k: v}) as a label selector.
function svcSelector(s) {
  return s ? { matchLabels: s } : null;
}

function portNumber(container, port) {
  if (typeof port === "number") return port;
  const p = (container.ports || []).find((x) => x.name === port);
  return p ? p.containerPort : null;
}

// --- the rules ---

function policy(objs, cfg, want) {
  const errs = [];
  const fail = (m) => errs.push(m);
  const of = (kind) => objs.filter((o) => o.kind === kind);
  const one = (kind) => {
    const l = of(kind);
    if (l.length !== 1) fail(`expected exactly one ${kind}, found ${l.length}`);
    return l[0];
  };
  const job = one("Job");
  const svc = one("Service");
  const np = one("NetworkPolicy");
  const pm = one("PodMonitor");
  if (!job || !job.spec || !job.spec.template || !job.spec.template.spec) return errs;
  const spec = job.spec;
  const pod = spec.template.spec;
  const cs = pod.containers || [];
  if (cs.length !== 1) fail(`the pod has ${cs.length} containers; the agent is the only one`);
  const c = cs[0] || {};
  const pods = [];
  for (let i = 0; i < Math.max(1, spec.completions || 1); i++) pods.push(podLabels(job, i));
  const allSelected = (sel) => pods.every((l) => selects(sel, l));

  // The agent's configuration as the agent read it.
  const nnodes = cfg.nnodes;
  if (!Number.isInteger(nnodes)) fail(`agent nnodes is ${JSON.stringify(nnodes)}: an Indexed Job has a fixed size, use one number`);
  const httpPort = cfg.http_port;
  const storePort = cfg.master_port;

  // Job shape.
  if (spec.completionMode !== "Indexed") fail(`Job completionMode is ${spec.completionMode}, not Indexed`);
  // One pod per node and one per warm spare (standbys: node ranks nnodes..nnodes+spares-1).
  const spares = cfg.spares === undefined ? 0 : cfg.spares;
  if (!Number.isInteger(spares) || spares < 0) fail(`agent spares is ${JSON.stringify(cfg.spares)}: want a count >= 0`);
  const npods = nnodes + spares;
  const what = spares ? `agent nnodes ${nnodes} + spares ${spares}` : `agent nnodes ${nnodes}`;
  if (spec.completions !== npods) fail(`Job completions ${spec.completions} != ${what}`);
  if (spec.parallelism !== npods) fail(`Job parallelism ${spec.parallelism} != ${what}`);
  if (pod.restartPolicy !== "Never") fail(`pod restartPolicy is ${pod.restartPolicy}, not Never (backoffLimitPerIndex needs it)`);
  if (!Number.isInteger(spec.backoffLimitPerIndex)) fail("Job has no backoffLimitPerIndex");
  const rules = (spec.podFailurePolicy || {}).rules || [];
  const failJob = rules.find(
    (r) => r.action === "FailJob" && r.onExitCodes && r.onExitCodes.operator === "In" &&
      (r.onExitCodes.values || []).includes(AGENT_EXIT_BAD_CONFIG),
  );
  if (!failJob) fail(`podFailurePolicy has no FailJob rule for the agent's exit code ${AGENT_EXIT_BAD_CONFIG} (bad configuration)`);
  else if (failJob.onExitCodes.containerName !== undefined && failJob.onExitCodes.containerName !== c.name)
    fail(`podFailurePolicy FailJob rule names container ${failJob.onExitCodes.containerName}, the agent is ${c.name}`);
  const ignore = rules.find(
    (r) => r.action === "Ignore" && (r.onPodConditions || []).some((p) => p.type === "DisruptionTarget" && (p.status || "True") === "True"),
  );
  if (!ignore) fail("podFailurePolicy has no Ignore rule for the DisruptionTarget condition (evictions would count as failures)");

  // Headless Service that names the pods.
  if (svc) {
    const s = svc.spec || {};
    if (pod.subdomain !== svc.metadata.name) fail(`pod subdomain ${pod.subdomain} != Service name ${svc.metadata.name}`);
    if (s.clusterIP !== "None") fail(`Service clusterIP is ${s.clusterIP}, not None (headless)`);
    if (s.publishNotReadyAddresses !== true) fail("Service lacks publishNotReadyAddresses: true (pods must resolve each other before Ready)");
    if (!allSelected(svcSelector(s.selector))) fail(`Service selector ${JSON.stringify(s.selector)} does not select every pod of the Job`);
    // A Service that JobSet or Volcano makes (tests/k8s/shape.py marks it) names pods, no ports.
    const madeBy = ((svc.metadata || {}).annotations || {})["tdist-test/made-by"];
    for (const [name, num] of madeBy ? [] : [["store", storePort], ["metrics", httpPort]]) {
      const p = (s.ports || []).find((x) => x.name === name);
      if (!p) {
        fail(`Service has no port named ${name}`);
        continue;
      }
      if (p.port !== num) fail(`Service port ${name} is ${p.port}, the agent uses ${num}`);
      const target = portNumber(c, p.targetPort === undefined ? p.port : p.targetPort);
      if (target !== num) fail(`Service port ${name} targets ${JSON.stringify(p.targetPort)} = container port ${target}, the agent uses ${num}`);
    }
  }

  // Container: ports, probes, downward API, config mount.
  for (const [name, num] of [["store", storePort], ["metrics", httpPort]])
    if (portNumber(c, name) !== num) fail(`container port ${name} is ${portNumber(c, name)}, the agent uses ${num}`);
  const probe = (kind, wantPath, required) => {
    const p = c[kind];
    if (!p) {
      if (required) fail(`container has no ${kind}`);
      return;
    }
    const g = p.httpGet;
    if (!g) return fail(`${kind} is not an httpGet probe`);
    if (g.path !== wantPath) fail(`${kind} path is ${g.path}, expected ${wantPath}`);
    if (portNumber(c, g.port) !== httpPort) fail(`${kind} port ${JSON.stringify(g.port)} is not the agent's HTTP port ${httpPort}`);
  };
  probe("readinessProbe", "/readyz", true);
  probe("livenessProbe", "/healthz", true);
  probe("startupProbe", "/healthz", false);
  const env = Object.fromEntries((c.env || []).map((e) => [e.name, e]));
  for (const [name, fp] of [["POD_NAME", "metadata.name"], ["POD_NAMESPACE", "metadata.namespace"], ["POD_IP", "status.podIP"]]) {
    const got = env[name] && env[name].valueFrom && env[name].valueFrom.fieldRef && env[name].valueFrom.fieldRef.fieldPath;
    if (got !== fp) fail(`env ${name} is not the downward API field ${fp}`);
  }
  const grace = pod.terminationGracePeriodSeconds === undefined ? 30 : pod.terminationGracePeriodSeconds;
  if (!(grace > cfg.stop_grace_period))
    fail(`terminationGracePeriodSeconds ${grace} is not above the agent's stop_grace_period ${cfg.stop_grace_period} s`);
  const volumes = Object.fromEntries((pod.volumes || []).map((v) => [v.name, v]));
  const mounts = c.volumeMounts || [];
  const args = c.args || [];
  const ci = args.findIndex((a) => a === "--config" || a.startsWith("--config="));
  const cfgPath = ci < 0 ? null : args[ci].startsWith("--config=") ? args[ci].slice(9) : args[ci + 1];
  if (!cfgPath) fail("container args have no --config FILE");
  else {
    const m = mounts.find((vm) => cfgPath.startsWith(vm.mountPath.replace(/\/?$/, "/")));
    const v = m && volumes[m.name];
    const cm = v && v.configMap && of("ConfigMap").find((x) => x.metadata.name === v.configMap.name);
    const key = m && cfgPath.slice(m.mountPath.replace(/\/?$/, "/").length);
    if (!cm || !(cm.data || {})[key]) fail(`--config ${cfgPath} is not a key of a rendered ConfigMap mounted at its directory`);
  }

  // Pod security: the "restricted" profile, plus a read-only root with /tmp from an emptyDir.
  const psc = pod.securityContext || {};
  const csc = c.securityContext || {};
  const sc = (k) => (csc[k] !== undefined ? csc[k] : psc[k]);
  if (sc("runAsNonRoot") !== true) fail("runAsNonRoot is not true");
  if (!Number.isInteger(sc("runAsUser")) || sc("runAsUser") === 0) fail(`runAsUser ${sc("runAsUser")} is not a numeric non-root UID`);
  if (csc.allowPrivilegeEscalation !== false) fail("allowPrivilegeEscalation is not false");
  if (csc.privileged) fail("the container is privileged");
  const caps = csc.capabilities || {};
  if (!(caps.drop || []).includes("ALL")) fail("capabilities.drop lacks ALL");
  for (const a of caps.add || []) if (a !== "NET_BIND_SERVICE") fail(`capability ${a} is added (restricted allows NET_BIND_SERVICE only)`);
  const seccomp = (sc("seccompProfile") || {}).type;
  if (seccomp !== "RuntimeDefault" && seccomp !== "Localhost") fail(`seccompProfile is ${seccomp}, not RuntimeDefault`);
  if (csc.readOnlyRootFilesystem !== true) fail("readOnlyRootFilesystem is not true");
  const tmp = mounts.find((vm) => vm.mountPath.replace(/\/$/, "") === "/tmp");
  if (!tmp || !volumes[tmp.name] || !volumes[tmp.name].emptyDir) fail("/tmp is not an emptyDir volume (a read-only root needs one)");
  for (const h of ["hostNetwork", "hostPID", "hostIPC"]) if (pod[h]) fail(`pod sets ${h}`);
  for (const v of pod.volumes || []) if (v.hostPath) fail(`volume ${v.name} is a hostPath`);

  // NetworkPolicy: peers on every port (gloo/NCCL data connections use ephemeral ports), and the
  // metrics port for Prometheus.
  if (np) {
    const s = np.spec || {};
    if (!allSelected(s.podSelector)) fail("NetworkPolicy podSelector does not select every pod of the Job");
    const types = s.policyTypes || ["Ingress"];
    if (!types.includes("Ingress")) fail("NetworkPolicy does not govern Ingress");
    const ingress = s.ingress || [];
    const peersAll = ingress.some(
      (r) => !(r.ports && r.ports.length) && (r.from || []).some((f) => !f.namespaceSelector && !f.ipBlock && allSelected(f.podSelector)),
    );
    if (!peersAll) fail("NetworkPolicy does not admit the job's own pods on all ports");
    const metricsIn = ingress.some(
      (r) => (r.ports || []).some((p) => p.port === "metrics" || p.port === httpPort) && (r.from || []).length > 0,
    );
    if (!metricsIn) fail("NetworkPolicy has no rule for the metrics port");
    if (types.includes("Egress")) fail("NetworkPolicy restricts Egress (DNS, the store and peers need it)");
  }

  // Prometheus: PodMonitor on the named port, and the scrape annotations.
  if (pm) {
    const s = pm.spec || {};
    if (!allSelected(s.selector)) fail("PodMonitor selector does not select every pod of the Job");
    const ep = (s.podMetricsEndpoints || []).find((e) => e.port === "metrics");
    if (!ep) fail("PodMonitor has no endpoint on the named port metrics");
    else if ((ep.path || "/metrics") !== "/metrics") fail(`PodMonitor path is ${ep.path}`);
    if (portNumber(c, "metrics") === null) fail("the container has no port named metrics for the PodMonitor");
  }
  const ann = (spec.template.metadata || {}).annotations || {};
  if (ann["prometheus.io/scrape"] !== "true") fail('pod annotation prometheus.io/scrape is not "true"');
  if (ann["prometheus.io/port"] !== String(httpPort)) fail(`pod annotation prometheus.io/port is ${ann["prometheus.io/port"]}, the agent serves ${httpPort}`);
  if (ann["prometheus.io/path"] !== "/metrics") fail("pod annotation prometheus.io/path is not /metrics");

  // CPU or GPU.
  const res = c.resources || {};
  const gpuLimit = (res.limits || {})["nvidia.com/gpu"];
  if (want === "gpu") {
    const n = Number(gpuLimit);
    if (!(Number.isInteger(n) && n > 0)) fail(`no nvidia.com/gpu limit (found ${gpuLimit})`);
    const req = (res.requests || {})["nvidia.com/gpu"];
    if (req !== undefined && Number(req) !== n) fail(`nvidia.com/gpu request ${req} != limit ${gpuLimit}`);
    if (cfg.backend !== "nccl") fail(`agent backend is ${cfg.backend}, not nccl`);
    if (cfg.nproc_per_node !== n) fail(`agent nproc_per_node is ${cfg.nproc_per_node} with ${n} GPUs (one worker per GPU)`);
  } else {
    if (gpuLimit !== undefined || (res.requests || {})["nvidia.com/gpu"] !== undefined) fail("a CPU kustomization asks for nvidia.com/gpu");
    if (cfg.backend !== "gloo" && cfg.backend !== "mpi") fail(`agent backend is ${cfg.backend}, not gloo or mpi`);
    // mpi: the agents are the PMIx servers; nothing an ssh-based launcher needs may creep in.
    if (cfg.backend === "mpi") {
      const env = c.env || [];
      if (env.some((e) => /^OMPI_MCA_plm/.test(e.name))) fail("an mpi kustomization sets an mpirun launch agent (OMPI_MCA_plm_*): the agents start the ranks");
      if ((c.ports || []).some((p) => p.containerPort === 22)) fail("an mpi kustomization opens port 22 (sshd): no ssh is needed");
    }
  }
  return errs;
}

function checkSet(name, want, objs, cfg) {
  const errs = [];
  for (const o of objs) errs.push(...checkSchema(o));
  errs.push(...policy(objs, cfg, want));
  return errs.map((e) => `${name}: ${e}`);
}

function loadSet(rendered, effective) {
  const docs = YAML.parseAllDocuments(fs.readFileSync(rendered, "utf8"));
  const objs = [];
  for (const d of docs) {
    if (d.errors.length) throw new Error(`${rendered}: ${d.errors[0].message}`);
    const o = d.toJS();
    if (o !== null) objs.push(o);
  }
  const cfg = YAML.parse(fs.readFileSync(effective, "utf8"));
  return { objs, cfg };
}

// Each mutation breaks one rule; the checks must notice every one, with the message of that rule
// (a mutation caught only by some other rule would hide a rule that never fires).
const MUTATIONS = {
  "unknown field": ["unknown field /spec/template/spec/subdomian", (o) => (job(o).spec.template.spec.subdomian = "x")],
  "wrong type": ["must be integer", (o) => (job(o).spec.completions = "2")],
  "unknown kind": ["no schema for apiVersion example.com/v1", (o) => o.objs.push({ apiVersion: "example.com/v1", kind: "Widget", metadata: { name: "w" } })],
  "completions != nnodes": ["Job completions", (o) => (job(o).spec.completions += 1)],
  "parallelism != nnodes": ["Job parallelism", (o) => (job(o).spec.parallelism += 1)],
  "not Indexed": ["completionMode", (o) => (job(o).spec.completionMode = "NonIndexed")],
  "restartPolicy OnFailure": ["restartPolicy", (o) => (job(o).spec.template.spec.restartPolicy = "OnFailure")],
  "no backoffLimitPerIndex": ["backoffLimitPerIndex", (o) => delete job(o).spec.backoffLimitPerIndex],
  "FailJob without 64": ["no FailJob rule", (o) => rule(o, "FailJob").onExitCodes.values.splice(0)],
  "no DisruptionTarget": ["DisruptionTarget", (o) => (rule(o, "Ignore").onPodConditions[0].type = "ConfigIssue")],
  "subdomain != Service": ["subdomain", (o) => (job(o).spec.template.spec.subdomain = "other")],
  "not headless": ["clusterIP", (o) => delete kind(o, "Service").spec.clusterIP],
  "not publishNotReady": ["publishNotReadyAddresses", (o) => (kind(o, "Service").spec.publishNotReadyAddresses = false)],
  "Service port renamed": ["no port named store", (o) => (kind(o, "Service").spec.ports[0].name = "rdzv")],
  "Service selects nothing": ["Service selector", (o) => (kind(o, "Service").spec.selector = { app: "none" })],
  "readiness path": ["readinessProbe path", (o) => (ctr(o).readinessProbe.httpGet.path = "/healthz2")],
  "liveness port": ["livenessProbe port", (o) => (ctr(o).livenessProbe.httpGet.port = "store")],
  "no POD_IP": ["env POD_IP", (o) => (ctr(o).env = ctr(o).env.filter((e) => e.name !== "POD_IP"))],
  "grace <= stop_grace_period": ["terminationGracePeriodSeconds", (o) => (job(o).spec.template.spec.terminationGracePeriodSeconds = o.cfg.stop_grace_period)],
  "root": ["runAsUser", (o) => (job(o).spec.template.spec.securityContext.runAsUser = 0)],
  "privilege escalation": ["allowPrivilegeEscalation", (o) => (ctr(o).securityContext.allowPrivilegeEscalation = true)],
  "caps not dropped": ["drop lacks ALL", (o) => (ctr(o).securityContext.capabilities.drop = [])],
  "no seccomp": ["seccompProfile", (o) => delete job(o).spec.template.spec.securityContext.seccompProfile],
  "writable root": ["readOnlyRootFilesystem", (o) => (ctr(o).securityContext.readOnlyRootFilesystem = false)],
  "no /tmp": ["/tmp is not an emptyDir", (o) => (ctr(o).volumeMounts = ctr(o).volumeMounts.filter((m) => m.mountPath !== "/tmp"))],
  "config not mounted": ["--config /nowhere", (o) => (ctr(o).args = ["--config", "/nowhere/agent.yaml"])],
  "NetworkPolicy selects nothing": ["NetworkPolicy podSelector", (o) => (kind(o, "NetworkPolicy").spec.podSelector = { matchLabels: { app: "none" } })],
  "NetworkPolicy peers on one port": ["own pods on all ports", (o) => (kind(o, "NetworkPolicy").spec.ingress[0].ports = [{ port: 29500 }])],
  "PodMonitor on a number": ["PodMonitor has no endpoint", (o) => (kind(o, "PodMonitor").spec.podMetricsEndpoints[0].port = "http")],
  "scrape port": ["prometheus.io/port", (o) => (job(o).spec.template.metadata.annotations["prometheus.io/port"] = "1")],
  "second container": ["2 containers", (o) => job(o).spec.template.spec.containers.push({ name: "side", image: "x" })],
  "GPU expectation flipped": ["nvidia.com/gpu", (o) => (o.want = o.want === "gpu" ? "cpu" : "gpu")],
  "backend flipped": ["agent backend", (o) => (o.cfg.backend = o.cfg.backend === "nccl" ? "gloo" : "nccl")],
  "GPU request != limit": ["request", (o) => (ctr(o).resources.requests["nvidia.com/gpu"] = 1), "gpu"],
  "a worker per GPU": ["nproc_per_node", (o) => (o.cfg.nproc_per_node += 1), "gpu"],
};
const kind = (o, k) => o.objs.find((x) => x.kind === k);
const job = (o) => kind(o, "Job");
const ctr = (o) => job(o).spec.template.spec.containers[0];
const rule = (o, action) => job(o).spec.podFailurePolicy.rules.find((r) => r.action === action);

function main(argv) {
  const selfTest = argv[0] === "--self-test";
  if (selfTest) argv = argv.slice(1);
  if (argv.length === 0 || argv.length % 3 !== 0) {
    console.error("usage: validate.js [--self-test] NAME:cpu|gpu RENDERED.yaml EFFECTIVE.yaml ...");
    return 2;
  }
  let failures = 0;
  let checked = 0;
  for (let i = 0; i < argv.length; i += 3) {
    const [name, want] = argv[i].split(":");
    if (want !== "cpu" && want !== "gpu") throw new Error(`${argv[i]}: say NAME:cpu or NAME:gpu`);
    const set = loadSet(argv[i + 1], argv[i + 2]);
    const errs = checkSet(name, want, set.objs, set.cfg);
    for (const e of errs) console.log(`FAIL: ${e}`);
    failures += errs.length;
    if (errs.length === 0)
      console.log(`ok: ${name}: ${set.objs.length} objects (${set.objs.map((o) => o.kind).join(", ")}) valid, all rules hold`);
    if (!selfTest) continue;
    for (const [mname, [expect, mutate, only]] of Object.entries(MUTATIONS)) {
      if (only && only !== want) continue;
      const o = JSON.parse(JSON.stringify({ ...set, want }));
      mutate(o);
      const caught = checkSet(name, o.want, o.objs, o.cfg);
      checked++;
      const hit = caught.find((m) => m.includes(expect));
      if (!hit) {
        console.log(`FAIL: self-test: mutation '${mname}' of ${name} was not caught by its rule ('${expect}'): ${caught.join("; ") || "nothing failed"}`);
        failures++;
      } else {
        console.log(`ok: self-test: '${mname}' caught: ${hit}`);
      }
    }
  }
  if (selfTest) console.log(`self-test: ${checked} mutations`);
  return failures === 0 ? 0 : 1;
}

// crd_validate.js checks the core objects embedded in custom resources with checkSchema.
module.exports = { checkSchema };
if (require.main === module) process.exitCode = main(process.argv.slice(2));
