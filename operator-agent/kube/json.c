/* The JSON the API server sends (a JobSet, a watch event, a Status), read with libyaml's
 * document loader: JSON is YAML 1.2's flow style, libyaml is already the agent's YAML reader and
 * has seen more hostile input than a parser written here would. The input is bounded
 * (AGENT_KUBE_MAX_JSON) before it is parsed; a document that is not one JSON object, or a field of
 * the wrong kind, is an error naming the field, never a crash. Pure: no I/O, no globals. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

#include "operator-agent/kube/kube.h"

typedef struct {
  yaml_document_t doc;
  int loaded;
} jdoc_t;

static int jdoc_load(jdoc_t *d, const char *json, size_t len, char *err, size_t cap) {
  d->loaded = 0;
  if (len > AGENT_KUBE_MAX_JSON) {
    snprintf(err, cap, "a JSON document of %zu bytes, over the %u-byte limit", len,
             AGENT_KUBE_MAX_JSON);
    return -1;
  }
  yaml_parser_t p;
  if (!yaml_parser_initialize(&p)) {
    snprintf(err, cap, "out of memory");
    return -1;
  }
  yaml_parser_set_input_string(&p, (const unsigned char *)json, len);
  int ok = yaml_parser_load(&p, &d->doc);
  if (!ok) {
    snprintf(err, cap, "bad JSON at byte %zu: %s", p.problem_mark.index,
             p.problem ? p.problem : "parse error");
    yaml_parser_delete(&p);
    return -1;
  }
  yaml_parser_delete(&p);
  d->loaded = 1;
  yaml_node_t *root = yaml_document_get_root_node(&d->doc);
  if (!root || root->type != YAML_MAPPING_NODE) {
    snprintf(err, cap, "not a JSON object");
    return -1;
  }
  return 0;
}

static void jdoc_free(jdoc_t *d) {
  if (d->loaded) yaml_document_delete(&d->doc);
  d->loaded = 0;
}

/* The value of key in mapping m, or NULL (also when m is not a mapping). */
static yaml_node_t *jget(yaml_document_t *doc, yaml_node_t *m, const char *key) {
  if (!m || m->type != YAML_MAPPING_NODE) return NULL;
  for (yaml_node_pair_t *p = m->data.mapping.pairs.start; p < m->data.mapping.pairs.top; p++) {
    yaml_node_t *k = yaml_document_get_node(doc, p->key);
    if (k && k->type == YAML_SCALAR_NODE && k->data.scalar.length == strlen(key) &&
        !memcmp(k->data.scalar.value, key, k->data.scalar.length))
      return yaml_document_get_node(doc, p->value);
  }
  return NULL;
}

/* A plain (unquoted) null scalar: JSON null. */
static int jnull(const yaml_node_t *n) {
  return n && n->type == YAML_SCALAR_NODE && n->data.scalar.style == YAML_PLAIN_SCALAR_STYLE &&
         n->data.scalar.length == 4 && !memcmp(n->data.scalar.value, "null", 4);
}

/* A string scalar into out (cap bytes, NUL-terminated). 0; 1 absent or null; -1 wrong kind or
 * too long (err names field). */
static int jstr(yaml_node_t *n, const char *field, char *out, size_t cap, char *err, size_t ecap) {
  out[0] = 0;
  if (!n || jnull(n)) return 1;
  if (n->type != YAML_SCALAR_NODE) {
    snprintf(err, ecap, "%s is not a string", field);
    return -1;
  }
  if (n->data.scalar.length >= cap || memchr(n->data.scalar.value, 0, n->data.scalar.length)) {
    snprintf(err, ecap, "%s: a value of %zu bytes, over %zu", field, n->data.scalar.length,
             cap - 1);
    return -1;
  }
  memcpy(out, n->data.scalar.value, n->data.scalar.length);
  out[n->data.scalar.length] = 0;
  return 0;
}

/* A non-negative int32 (JobSet's attempts are int32). 0; 1 absent or null; -1 (err). */
static int jcount(yaml_node_t *n, const char *field, int64_t *out, char *err, size_t ecap) {
  char buf[32];
  int r = jstr(n, field, buf, sizeof buf, err, ecap);
  if (r) return r;
  char *end;
  errno = 0;
  long long v = strtoll(buf, &end, 10);
  if (n->data.scalar.style != YAML_PLAIN_SCALAR_STYLE || !buf[0] || *end || errno || v < 0 ||
      v > 2147483647LL) {
    snprintf(err, ecap, "%s: '%s' is not an integer in 0..2147483647", field, buf);
    return -1;
  }
  *out = v;
  return 0;
}

static int read_jobset(yaml_document_t *doc, yaml_node_t *obj, agent_kube_jobset_t *js, char *err,
                       size_t cap) {
  memset(js, 0, sizeof *js);
  if (!obj || obj->type != YAML_MAPPING_NODE) {
    snprintf(err, cap, "the JobSet is not a JSON object");
    return -1;
  }
  yaml_node_t *md = jget(doc, obj, "metadata");
  yaml_node_t *ann = jget(doc, md, "annotations");
  js->disabled = jget(doc, ann, AGENT_KUBE_DISABLE_KEY) != NULL;
  if (jstr(jget(doc, md, "resourceVersion"), "metadata.resourceVersion", js->resource_version,
           sizeof js->resource_version, err, cap) < 0)
    return -1;
  yaml_node_t *fp = jget(doc, jget(doc, obj, "spec"), "failurePolicy");
  if (jstr(jget(doc, fp, "restartStrategy"), "spec.failurePolicy.restartStrategy",
           js->restart_strategy, sizeof js->restart_strategy, err, cap) < 0)
    return -1;
  yaml_node_t *status = jget(doc, obj, "status");
  int r = jcount(jget(doc, status, "currentInPlaceRestartAttempt"),
                 "status.currentInPlaceRestartAttempt", &js->current, err, cap);
  if (r < 0) return -1;
  js->has_current = r == 0;
  r = jcount(jget(doc, status, "previousInPlaceRestartAttempt"),
             "status.previousInPlaceRestartAttempt", &js->previous, err, cap);
  if (r < 0) return -1;
  js->has_previous = r == 0;
  return 0;
}

int agent_kube_jobset_bypass(const agent_kube_jobset_t *js) {
  return js->disabled || strcmp(js->restart_strategy, AGENT_KUBE_IN_PLACE) != 0;
}

int agent_kube_parse_jobset(const char *json, size_t len, agent_kube_jobset_t *out, char *err,
                            size_t cap) {
  jdoc_t d;
  int rc = -1;
  if (jdoc_load(&d, json, len, err, cap) == 0)
    rc = read_jobset(&d.doc, yaml_document_get_root_node(&d.doc), out, err, cap);
  jdoc_free(&d);
  return rc;
}

int agent_kube_parse_event(const char *json, size_t len, char *type, size_t type_cap,
                           agent_kube_jobset_t *js, int *code, char *err, size_t cap) {
  jdoc_t d;
  int rc = -1;
  *code = 0;
  if (jdoc_load(&d, json, len, err, cap)) goto out;
  yaml_node_t *root = yaml_document_get_root_node(&d.doc);
  int r = jstr(jget(&d.doc, root, "type"), "the watch event's type", type, type_cap, err, cap);
  if (r) {
    if (r > 0) snprintf(err, cap, "a watch event without a type");
    goto out;
  }
  yaml_node_t *obj = jget(&d.doc, root, "object");
  if (!strcmp(type, "ERROR")) {
    int64_t c = 0;
    if (jcount(jget(&d.doc, obj, "code"), "the watch ERROR's code", &c, err, cap) < 0) goto out;
    *code = (int)c;
    rc = 0;
  } else if (!strcmp(type, "ADDED") || !strcmp(type, "MODIFIED") || !strcmp(type, "DELETED")) {
    rc = read_jobset(&d.doc, obj, js, err, cap);
  } else if (!strcmp(type, "BOOKMARK")) {
    /* only metadata.resourceVersion: where the next watch starts */
    memset(js, 0, sizeof *js);
    rc = jstr(jget(&d.doc, jget(&d.doc, obj, "metadata"), "resourceVersion"),
              "the bookmark's metadata.resourceVersion", js->resource_version,
              sizeof js->resource_version, err, cap) < 0
             ? -1
             : 0;
  } else {
    snprintf(err, cap, "a watch event of unknown type '%.40s'", type);
  }
out:
  jdoc_free(&d);
  return rc;
}

int agent_kube_parse_status_message(const char *json, size_t len, char *out, size_t cap) {
  jdoc_t d;
  char err[200];
  int rc = -1;
  out[0] = 0;
  if (jdoc_load(&d, json, len, err, sizeof err) == 0 &&
      jstr(jget(&d.doc, yaml_document_get_root_node(&d.doc), "message"), "message", out, cap, err,
           sizeof err) == 0)
    rc = 0;
  jdoc_free(&d);
  if (rc) out[0] = 0;
  return rc;
}
