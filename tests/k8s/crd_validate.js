// crd_validate.js: checks custom resources (Kubeflow Trainer v2, JobSet, Volcano, and
// prometheus-operator's PrometheusRule of k8s/monitoring) against the
// openAPIV3Schema of their published CustomResourceDefinition (tests/k8s/crds/, data copied from
// those projects), the way the API server does:
//   - the schema's types, enums, patterns, bounds and required fields (ajv, a JSON-schema
//     validator, over the schema translated below);
//   - unknown fields: a structural schema knows exactly the keys in `properties`; any other key
//     is unknown unless the schema says additionalProperties (a map) or
//     x-kubernetes-preserve-unknown-fields. The API server prunes such a field, or rejects the
//     object under strict field validation (kubectl apply's default): either way it is lost, so
//     here it fails;
//   - x-kubernetes-int-or-string, nullable, x-kubernetes-embedded-resource as the API server reads
//     them. CEL rules (x-kubernetes-validations) are not evaluated: listed as such with --cel.
// Embedded core objects are also checked against the Kubernetes schemas (kubernetes-models, with
// strict_fields.js for unknown fields, through validate.js's checkSchema): the Job templates of a
// JobSet's replicated jobs (also inside a (Cluster)TrainingRuntime) and Volcano tasks' pod
// templates, so a core field the CRD copy lacks or loosens is still caught.
//
//   node crd_validate.js CRD_DIR RENDERED.yaml...             objects of the three groups checked
//   node crd_validate.js --self-test CRD_DIR RENDERED.yaml...  mutations that each check catches
// Objects of other groups are left to validate.js. Exit 0 when every object is valid.
"use strict";

const fs = require("fs");
const path = require("path");
const YAML = require("yaml");
const NODE_MODULES = (process.env.NODE_PATH || "").split(path.delimiter).filter(Boolean)[0] || __dirname;
const Ajv = require(require.resolve("ajv", { paths: [NODE_MODULES] }));
const { checkSchema } = require("./validate.js");

const GROUPS = ["trainer.kubeflow.org", "jobset.x-k8s.io", "batch.volcano.sh"];
// Kinds of other groups checked here (the PodMonitor is validate.js's, with kubernetes-models).
const KINDS = ["monitoring.coreos.com/PrometheusRule"];
const isCustom = (obj) => {
  const group = (obj.apiVersion || "").split("/")[0];
  return GROUPS.includes(group) || KINDS.includes(`${group}/${obj.kind}`);
};

// The CRD schema as a JSON schema for ajv, with the API server's structural reading.
function structural(s, embedded) {
  if (s === null || typeof s !== "object") return s;
  const out = {};
  for (const k of ["type", "enum", "pattern", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
    "minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties", "required", "format",
    "uniqueItems", "multipleOf"])
    if (s[k] !== undefined) out[k] = s[k];
  // OpenAPI v3.0's boolean exclusive bounds.
  if (typeof out.exclusiveMinimum === "boolean") {
    if (out.exclusiveMinimum) out.exclusiveMinimum = out.minimum, delete out.minimum;
    else delete out.exclusiveMinimum;
  }
  if (typeof out.exclusiveMaximum === "boolean") {
    if (out.exclusiveMaximum) out.exclusiveMaximum = out.maximum, delete out.maximum;
    else delete out.exclusiveMaximum;
  }
  if (s["x-kubernetes-int-or-string"]) {
    delete out.type;
    out.anyOf = [{ type: "integer" }, { type: "string" }];
  }
  for (const k of ["anyOf", "oneOf", "allOf"])
    if (s[k]) out[k] = (out[k] || []).concat(s[k].map((x) => structural(x, false)));
  if (s.not) out.not = structural(s.not, false);
  if (s.items) out.items = structural(s.items, false);
  if (s.properties) {
    out.properties = {};
    for (const [k, v] of Object.entries(s.properties)) out.properties[k] = structural(v, false);
  }
  const embed = embedded || s["x-kubernetes-embedded-resource"];
  if (embed && out.properties) {
    for (const k of ["apiVersion", "kind"]) out.properties[k] = out.properties[k] || { type: "string" };
    out.properties.metadata = out.properties.metadata || { type: "object" };
  }
  if (s.additionalProperties !== undefined)
    out.additionalProperties = typeof s.additionalProperties === "object" ? structural(s.additionalProperties, false) : s.additionalProperties;
  else if (s.type === "object" && !s["x-kubernetes-preserve-unknown-fields"]) {
    // Structural: only the keys in properties (none if there are none).
    out.additionalProperties = false;
    if (!out.properties) out.properties = {};
  }
  if (s.nullable && typeof out.type === "string") out.type = [out.type, "null"];
  return out;
}

function celRules(s, where, out) {
  if (s === null || typeof s !== "object") return;
  for (const r of s["x-kubernetes-validations"] || []) out.push(`${where}: ${r.rule}`);
  for (const [k, v] of Object.entries(s.properties || {})) celRules(v, `${where}/${k}`, out);
  if (s.items) celRules(s.items, `${where}/*`, out);
  if (typeof s.additionalProperties === "object") celRules(s.additionalProperties, `${where}/*`, out);
}

function int(bits) {
  const lim = 2 ** (bits - 1);
  return { type: "number", validate: (n) => Number.isInteger(n) && n >= -lim && n < lim };
}

// {"group/version/Kind": {validate, served, cel: [...]}} of every CRD file in DIR.
// Patterns are Go's RE2, as the API server reads them: a (?i) flag at the start (prometheus-operator
// writes ^(?i)...) becomes JavaScript's "i"; the rest of what the CRDs here use reads the same.
function re2(pattern, flags) {
  const m = /^(\^?)\(\?i\)/.exec(pattern);
  return m ? new RegExp(m[1] + pattern.slice(m[0].length), flags + "i") : new RegExp(pattern, flags);
}
re2.code = "new RegExp";

function loadCrds(dir) {
  const ajv = new Ajv({ allErrors: true, strict: false, code: { regExp: re2 }, formats: {
    int32: int(32), int64: int(64), double: true, float: true, byte: true, "date-time": true, duration: true,
    "int-or-string": true, quantity: true, uri: true, email: true,
  } });
  const crds = {};
  for (const f of fs.readdirSync(dir).filter((x) => x.endsWith(".yaml")).sort()) {
    for (const doc of YAML.parseAllDocuments(fs.readFileSync(path.join(dir, f), "utf8"))) {
      const crd = doc.toJS();
      if (!crd || crd.kind !== "CustomResourceDefinition") continue;
      const { group, names } = crd.spec;
      for (const v of crd.spec.versions) {
        const raw = v.schema.openAPIV3Schema;
        const schema = structural(raw, false);
        // The API server validates metadata itself (ObjectMeta); the schema says object only.
        schema.properties.metadata = { type: "object" };
        const cel = [];
        celRules(raw, "", cel);
        // Compiled when first used (seconds each for these schemas).
        let fn = null;
        const validate = (o) => {
          fn = fn || ajv.compile(schema);
          const ok = fn(o);
          validate.errors = fn.errors;
          return ok;
        };
        crds[`${group}/${v.name}/${names.kind}`] = { validate, served: v.served, file: f, cel };
      }
    }
  }
  return crds;
}

function ajvMessage(e) {
  if (e.keyword === "additionalProperties")
    return `unknown field ${e.instancePath}/${e.params.additionalProperty} (not in the CRD schema: the API server prunes or rejects it)`;
  return `${e.instancePath || "/"}: ${e.message}${e.params && e.params.allowedValues ? " " + JSON.stringify(e.params.allowedValues) : ""}`;
}

// A container's restartPolicyRules (Kubernetes 1.34, alpha feature ContainerRestartRules: the
// action the kubelet takes on an exit code, which JobSet's in-place restart uses) is newer than
// the core schemas of kubernetes-models 4.5.1 (no such field there): it is checked by the CRD's own
// copy of the pod schema (JobSet v0.12.0's CRD has it, with its enums), and taken off the copy that
// goes to checkSchema. Nothing else is taken off.
function withoutRestartRules(spec) {
  const copy = JSON.parse(JSON.stringify(spec || {}));
  const pod = ((copy.template || {}).spec) || {};
  for (const c of [...(pod.containers || []), ...(pod.initContainers || [])]) delete c.restartPolicyRules;
  return copy;
}

// Core objects embedded in a custom resource, as [where, object] for validate.js's checkSchema.
function embeddedCore(obj) {
  const out = [];
  const jobTemplates = (rjs, where) => (rjs || []).forEach((rj, i) => {
    const t = rj.template || {};
    out.push([`${where}/replicatedJobs/${i}/template`, { apiVersion: "batch/v1", kind: "Job",
      metadata: { name: rj.name || "x", ...(t.metadata || {}) }, spec: withoutRestartRules(t.spec) }]);
  });
  const spec = obj.spec || {};
  if (obj.kind === "JobSet") jobTemplates(spec.replicatedJobs, "/spec");
  if (/TrainingRuntime$/.test(obj.kind)) jobTemplates(((spec.template || {}).spec || {}).replicatedJobs, "/spec/template/spec");
  if (obj.apiVersion.startsWith("batch.volcano.sh/") && obj.kind === "Job")
    (spec.tasks || []).forEach((t, i) => out.push([`/spec/tasks/${i}/template`,
      { apiVersion: "v1", kind: "PodTemplate", metadata: { name: t.name || "x" }, template: t.template || {} }]));
  return out;
}

// Failures of one object (an empty list when it is valid, or not of the three groups).
function checkCustom(obj, crds) {
  if (!isCustom(obj)) return [];
  const where = `${obj.kind}/${(obj.metadata || {}).name || "?"}`;
  const crd = crds[`${obj.apiVersion}/${obj.kind}`];
  if (!crd) return [`${where}: no CRD for apiVersion ${obj.apiVersion} kind ${obj.kind} in tests/k8s/crds`];
  if (!crd.served) return [`${where}: ${obj.apiVersion} is not a served version of ${crd.file}`];
  const errs = [];
  if (!crd.validate(obj)) for (const e of crd.validate.errors) errs.push(`${where}: ${ajvMessage(e)}`);
  for (const [at, core] of embeddedCore(obj))
    for (const e of checkSchema(core)) errs.push(`${where}${at}: ${e.replace(/^[^:]*: /, "")}`);
  return errs;
}

function load(file) {
  const objs = [];
  for (const d of YAML.parseAllDocuments(fs.readFileSync(file, "utf8"))) {
    if (d.errors.length) throw new Error(`${file}: ${d.errors[0].message}`);
    const o = d.toJS();
    if (o !== null) objs.push(o);
  }
  return objs;
}

// Each mutation of a valid object must be caught with the given text. [kind, text, mutate]
const ctrOf = (pod) => pod.containers[0];
const podOf = (o) => {
  if (o.kind === "JobSet") return o.spec.replicatedJobs[0].template.spec.template.spec;
  if (/TrainingRuntime$/.test(o.kind)) return o.spec.template.spec.replicatedJobs[0].template.spec.template.spec;
  if (o.kind === "TrainJob") return null;
  return o.spec.tasks[0].template.spec;
};
const MUTATIONS = [
  ["any", "unknown field /spec/bogus", (o) => (o.spec.bogus = 1)],
  ["any", "no CRD for apiVersion", (o) => (o.apiVersion = o.apiVersion.replace(/\/v[0-9a-z]+$/, "/v9"))],
  ["JobSet", "unknown field /spec/network/subdomian", (o) => (o.spec.network.subdomian = "x")],
  ["JobSet", "must be integer", (o) => (o.spec.replicatedJobs[0].replicas = "1")],
  ["JobSet", "must be equal to one of the allowed values", (o) => (o.spec.failurePolicy.rules[0].action = "Retry")],
  ["JobSet", "unknown field /spec/replicatedJobs/0/template/spec/template/spec/containers/0/imagePullPolcy",
    (o) => (ctrOf(podOf(o)).imagePullPolcy = "Never")],
  ["JobSet", "/spec/replicatedJobs/0/template: schema:", (o) => (podOf(o).containers[0].ports[0].containerPort = "29500")],
  ["JobSet", "unknown field /spec/replicatedJobs/0/template/spec/template/spec/containers/0/restartPolicyRules/0/exitCode",
    (o) => (ctrOf(podOf(o)).restartPolicyRules = [{ action: "Restart", exitCode: 1 }])],
  ["ClusterTrainingRuntime", "unknown field /spec/mlPolicy/torch/elasticPolicy", (o) => (o.spec.mlPolicy.torch.elasticPolicy = { maxNodes: 3 })],
  ["ClusterTrainingRuntime", "must have required property 'name'", (o) => delete o.spec.template.spec.replicatedJobs[0].name],
  ["ClusterTrainingRuntime", "/spec/template/spec/replicatedJobs/0/template: schema:",
    (o) => (podOf(o).containers[0].ports[0].containerPort = "29500")],
  ["TrainingRuntime", "unknown field /spec/template/spec/replicatedJobs/0/template/spec/template/spec/subdomian",
    (o) => (podOf(o).subdomian = "x")],
  ["TrainJob", "unknown field /spec/trainer/nprocPerNode", (o) => (o.spec.trainer.nprocPerNode = 2)],
  ["TrainJob", "must be integer", (o) => (o.spec.trainer.numNodes = "2")],
  ["Job", "unknown field /spec/tasks/0/template/spec/containers/0/argz", (o) => (ctrOf(podOf(o)).argz = [])],
  ["Job", "must be integer", (o) => (o.spec.minAvailable = "2")],
  ["Job", "/spec/tasks/0/template: schema:", (o) => (podOf(o).containers[0].ports[0].containerPort = "29500")],
  ["PrometheusRule", "unknown field /spec/groups/0/rules/0/expression", (o) => (o.spec.groups[0].rules[0].expression = "up")],
  ["PrometheusRule", "/spec/groups/0/rules/0/for: must match pattern", (o) => (o.spec.groups[0].rules[0].for = "1 minute")],
  ["PrometheusRule", "must have required property 'expr'", (o) => delete o.spec.groups[0].rules[0].expr],
];

function main(argv) {
  const selfTest = argv[0] === "--self-test";
  if (selfTest) argv = argv.slice(1);
  const cel = argv[0] === "--cel";
  if (cel) argv = argv.slice(1);
  if (argv.length < (cel ? 1 : 2)) {
    console.error("usage: crd_validate.js [--self-test|--cel] CRD_DIR RENDERED.yaml...");
    return 2;
  }
  const crds = loadCrds(argv[0]);
  if (cel) {
    for (const [k, c] of Object.entries(crds)) for (const r of c.cel) console.log(`${k}${r}`);
    return 0;
  }
  let failures = 0;
  let checked = 0;
  let mutations = 0;
  for (const file of argv.slice(1)) {
    for (const obj of load(file)) {
      if (!isCustom(obj)) continue;
      checked++;
      const errs = checkCustom(obj, crds);
      for (const e of errs) console.log(`FAIL: ${path.basename(file)}: ${e}`);
      failures += errs.length;
      if (!errs.length) console.log(`ok: ${path.basename(file)}: ${obj.apiVersion} ${obj.kind}/${obj.metadata.name} valid (${crds[`${obj.apiVersion}/${obj.kind}`].file})`);
      if (!selfTest) continue;
      for (const [k, expect, mutate] of MUTATIONS) {
        if (k !== "any" && k !== obj.kind) continue;
        const o = JSON.parse(JSON.stringify(obj));
        mutate(o);
        mutations++;
        const caught = checkCustom(o, crds);
        const hit = caught.find((m) => m.includes(expect));
        if (!hit) {
          failures++;
          console.log(`FAIL: self-test: ${obj.kind}/${obj.metadata.name}: mutation for '${expect}' not caught: ${caught.join("; ") || "nothing failed"}`);
        } else {
          console.log(`ok: self-test: ${obj.kind}: caught: ${hit}`);
        }
      }
    }
  }
  if (checked === 0) {
    console.log("FAIL: no Trainer, JobSet, Volcano or PrometheusRule object in the files given");
    failures++;
  }
  if (selfTest) console.log(`self-test: ${mutations} mutations`);
  return failures === 0 ? 0 : 1;
}

module.exports = { loadCrds, checkCustom };
if (require.main === module) process.exitCode = main(process.argv.slice(2));
