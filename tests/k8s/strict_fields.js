// strict_fields.js: finds fields that the Kubernetes API does not know, the way the API server's
// strict field validation (kubectl apply's default since 1.27) rejects them. kubernetes-models'
// JSON-schema validate() checks types, enums and required fields but accepts unknown keys (its
// schemas leave additionalProperties open), so a misspelt `subdomian:` would pass it. The
// packages' TypeScript declarations (*.d.ts) list every field of every type, so this module parses
// those (a small parser for the subset they use: interfaces, object literals, Array<T>, index
// signatures, unions and literals) and walks an object against them.
//
// It only reports unknown keys: types are validate()'s job. A declaration it cannot parse is an
// exception naming the file, never a silent pass.
"use strict";

const fs = require("fs");
const path = require("path");

const PRIMITIVES = new Set([
  "string", "number", "boolean", "any", "unknown", "object", "null", "undefined", "true", "false",
]);

// Tokens of a declaration, read on demand: only the declaration asked for is ever tokenized (the
// rest of a file may use syntax this parser does not need, such as class bodies).
const TOKEN = /\s*(?:("(?:[^"\\]|\\.)*")|([A-Za-z_$][\w$]*)|(-?\d+(?:\.\d+)?)|([{}<>;:?|[\](),=&.]))/y;

class Parser {
  constructor(text, pos, file) {
    this.src = text;
    this.pos = pos;
    this.file = file;
    this.look = null;
  }
  read() {
    TOKEN.lastIndex = this.pos;
    const m = TOKEN.exec(this.src);
    if (!m) throw new Error(`${this.file}: cannot tokenize near '${this.src.slice(this.pos, this.pos + 40)}'`);
    this.pos = TOKEN.lastIndex;
    if (m[1] !== undefined) return { t: "str", v: JSON.parse(m[1]) };
    if (m[2] !== undefined) return { t: "id", v: m[2] };
    if (m[3] !== undefined) return { t: "num", v: m[3] };
    return { t: "p", v: m[4] };
  }
  peek(v) {
    if (this.look === null) this.look = this.read();
    return v === undefined || this.look.v === v ? this.look : null;
  }
  next() {
    const t = this.peek();
    this.look = null;
    return t;
  }
  expect(v) {
    const t = this.next();
    if (t.v !== v) throw new Error(`${this.file}: expected '${v}', found '${t.v}' at offset ${this.pos}`);
    return t;
  }
  type() {
    const members = [this.primary()];
    while (this.peek("|")) {
      this.next();
      members.push(this.primary());
    }
    return members.length === 1 ? members[0] : { k: "union", of: members };
  }
  primary() {
    const t = this.next();
    if (t.t === "str" || t.t === "num") return { k: "prim" };
    if (t.v === "{") return this.members();
    if (t.v === "(") {
      const inner = this.type();
      this.expect(")");
      return inner;
    }
    if (t.t !== "id") throw new Error(`${this.file}: unexpected '${t.v}' in a type`);
    let args = [];
    if (this.peek("<")) {
      this.next();
      args.push(this.type());
      while (this.peek(",")) {
        this.next();
        args.push(this.type());
      }
      this.expect(">");
    }
    let ty;
    if (t.v === "Array" && args.length === 1) ty = { k: "array", of: args[0] };
    else if (t.v === "Record" && args.length === 2) ty = { k: "obj", props: {}, index: args[1] };
    else if (PRIMITIVES.has(t.v)) ty = { k: "prim" };
    else if (args.length) throw new Error(`${this.file}: unsupported generic type ${t.v}<...>`);
    else ty = { k: "ref", name: t.v, file: this.file };
    while (this.peek("[")) {
      this.next();
      this.expect("]");
      ty = { k: "array", of: ty };
    }
    return ty;
  }
  // After '{': properties and index signatures up to the matching '}'.
  members() {
    const props = {};
    let index = null;
    while (!this.peek("}")) {
      const t = this.next();
      if (t.v === "[") {
        this.next(); // key name
        this.expect(":");
        this.next(); // key type
        this.expect("]");
        this.expect(":");
        index = this.type();
      } else if (t.t === "str" || t.t === "id") {
        if (this.peek("?")) this.next();
        if (this.peek("(")) throw new Error(`${this.file}: method '${t.v}' in a data type`);
        this.expect(":");
        props[t.v] = this.type();
      } else {
        throw new Error(`${this.file}: unexpected '${t.v}' in an object type`);
      }
      if (this.peek(";") || this.peek(",")) this.next();
    }
    this.expect("}");
    return { k: "obj", props, index };
  }
}

// One .d.ts file: its imports (local name -> module) and declarations (name -> type, parsed lazily).
class DeclFile {
  constructor(file) {
    this.file = file;
    // Comments blanked out (not removed: offsets found in the text stay valid for the parser).
    this.text = fs
      .readFileSync(file, "utf8")
      .replace(/\/\*[\s\S]*?\*\//g, (c) => c.replace(/[^\n]/g, " "))
      .replace(/\/\/[^\n]*/g, (c) => " ".repeat(c.length));
    this.imports = {};
    const imp = /import\s*{([^}]*)}\s*from\s*"([^"]+)"/g;
    let m;
    while ((m = imp.exec(this.text))) {
      for (const part of m[1].split(",")) {
        const [orig, local] = part.trim().split(/\s+as\s+/);
        if (orig) this.imports[(local || orig).trim()] = { module: m[2], name: orig.trim() };
      }
    }
    this.aliases = {};
    const exp = /export\s*{([^}]*)}/g;
    while ((m = exp.exec(this.text))) {
      for (const part of m[1].split(",")) {
        const [orig, pub] = part.trim().split(/\s+as\s+/);
        if (orig && pub) this.aliases[pub.trim()] = orig.trim();
      }
    }
    this.cache = {};
  }
  decl(name) {
    const own = this.aliases[name] || name;
    if (this.cache[own]) return this.cache[own];
    const iface = new RegExp(`export\\s+(?:declare\\s+)?interface\\s+${own}\\s*(?:extends[^{]*)?{`);
    const alias = new RegExp(`export\\s+(?:declare\\s+)?type\\s+${own}\\s*=`);
    let m;
    let ty;
    if ((m = iface.exec(this.text))) {
      ty = new Parser(this.text, m.index + m[0].length, this.file).members();
    } else if ((m = alias.exec(this.text))) {
      ty = new Parser(this.text, m.index + m[0].length, this.file).type();
    } else {
      return null;
    }
    this.cache[own] = ty;
    return ty;
  }
}

const files = {};
function declFile(file) {
  if (!files[file]) files[file] = new DeclFile(file);
  return files[file];
}

// The .d.ts beside the module that `require` would load for SPEC, from directory FROM.
function dtsOf(spec, from) {
  const js = require.resolve(spec, { paths: [from] });
  const dts = js.replace(/\.(c|m)?js$/, ".d.ts");
  if (!fs.existsSync(dts)) throw new Error(`no declarations ${dts} for ${spec}`);
  return dts;
}

function resolveRef(ref) {
  const df = declFile(ref.file);
  const own = df.decl(ref.name);
  if (own) return own;
  const imp = df.imports[ref.name];
  if (!imp) throw new Error(`${ref.file}: type ${ref.name} is neither declared nor imported`);
  const spec = imp.module.startsWith(".") ? path.resolve(path.dirname(ref.file), imp.module) : imp.module;
  const target = dtsOf(spec, path.dirname(ref.file));
  const ty = declFile(target).decl(imp.name);
  if (!ty) throw new Error(`${target}: no declaration of ${imp.name}`);
  return ty;
}

function isPlainObject(v) {
  return v !== null && typeof v === "object" && !Array.isArray(v);
}

// Unknown keys of VALUE under type TY, as JSON-pointer-like paths appended to OUT.
function walk(value, ty, where, out) {
  if (ty.k === "ref") return walk(value, resolveRef(ty), where, out);
  if (ty.k === "array") {
    if (Array.isArray(value)) value.forEach((v, i) => walk(v, ty.of, `${where}/${i}`, out));
    return;
  }
  if (ty.k === "union") {
    if (!isPlainObject(value) && !Array.isArray(value)) return;
    let best = null;
    for (const m of ty.of) {
      const r = [];
      walk(value, m, where, r);
      if (r.length === 0) return;
      if (best === null || r.length < best.length) best = r;
    }
    out.push(...best);
    return;
  }
  if (ty.k !== "obj" || !isPlainObject(value)) return;
  for (const [key, v] of Object.entries(value)) {
    if (Object.prototype.hasOwnProperty.call(ty.props, key)) walk(v, ty.props[key], `${where}/${key}`, out);
    else if (ty.index) walk(v, ty.index, `${where}/${key}`, out);
    else out.push(`${where}/${key}`);
  }
}

// unknownFields(OBJ, MODULE_SPEC, KIND, FROM): the paths of OBJ's fields that the declaration
// I<KIND> of module MODULE_SPEC (e.g. "kubernetes-models/batch/v1/Job") does not have.
function unknownFields(obj, moduleSpec, kind, from) {
  const dts = dtsOf(moduleSpec, from);
  const ty = declFile(dts).decl(`I${kind}`);
  if (!ty) throw new Error(`${dts}: no interface I${kind}`);
  const out = [];
  walk(obj, ty, "", out);
  return out;
}

module.exports = { unknownFields };
