/* See kube.h. The Kubernetes API over HTTPS on libcurl: the in-cluster configuration, one JobSet's
 * GET and WATCH, the merge PATCH of the pod's attempt annotation. Answers are bounded
 * (AGENT_KUBE_MAX_JSON) while they arrive; the token is read before each request. Never logs:
 * callers get the message. */
#define _GNU_SOURCE
#include "operator-agent/kube/kube.h"

#include <curl/curl.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "operator-agent/common/param.h"

#define RBAC_HINT                                                                                \
  "the pod's service account needs patch on pods and get/list/watch on jobsets.jobset.x-k8s.io " \
  "in its namespace (see k8s/jobset-in-place/rbac.yaml)"

/* A Kubernetes object name (DNS subdomain): 1..253 of [a-z0-9.-]. */
static int valid_name(const char *s) {
  size_t n = strlen(s);
  if (n < 1 || n > 253) return 0;
  for (; *s; s++)
    if (!((*s >= 'a' && *s <= 'z') || (*s >= '0' && *s <= '9') || *s == '.' || *s == '-')) return 0;
  return 1;
}

/* Reads a small file whole into out (cap bytes), trailing blanks and newlines cut. */
static int read_small(const char *path, char *out, size_t cap, char *err, size_t ecap) {
  FILE *f = fopen(path, "r");
  if (!f) {
    snprintf(err, ecap, "cannot read %s: %s", path, strerror(errno));
    return -1;
  }
  size_t n = fread(out, 1, cap - 1, f);
  int big = n == cap - 1 && fgetc(f) != EOF;
  fclose(f);
  if (big) {
    snprintf(err, ecap, "%s is over %zu bytes", path, cap - 1);
    return -1;
  }
  out[n] = 0;
  while (n && (out[n - 1] == '\n' || out[n - 1] == '\r' || out[n - 1] == ' ')) out[--n] = 0;
  return 0;
}

/* v: the value of the variable var (read by the caller: a literal getenv, see
 * //tests/common:param_tree_test). */
static int env_name(const char *var, const char *v, const char *how, char *out, size_t cap,
                    char *err, size_t ecap) {
  if (!v || !*v) {
    snprintf(err, ecap, "%s is not set: %s", var, how);
    return -1;
  }
  if (!valid_name(v)) {
    snprintf(err, ecap, "%s='%.80s' is not a Kubernetes object name (1..253 of a-z 0-9 . -)", var,
             v);
    return -1;
  }
  snprintf(out, cap, "%s", v);
  return 0;
}

int agent_kube_cfg_load(agent_kube_cfg_t *c, char *err, size_t cap) {
  memset(c, 0, sizeof *c);
  curl_global_init(CURL_GLOBAL_DEFAULT);
  const char *url = agent_param_str(AGENT_P_KUBE_API_URL);
  if (url && *url) {
    snprintf(c->api_url, sizeof c->api_url, "%s", url);
  } else {
    const char *h = getenv("KUBERNETES_SERVICE_HOST"), *p = getenv("KUBERNETES_SERVICE_PORT");
    if (!h || !*h || !p || !*p) {
      snprintf(err, cap,
               "KUBERNETES_SERVICE_HOST/KUBERNETES_SERVICE_PORT are not set: not in a pod? (the "
               "kubelet sets them; TDIST_KUBE_API_URL names the API server otherwise)");
      return -1;
    }
    snprintf(c->api_url, sizeof c->api_url, strchr(h, ':') ? "https://[%s]:%s" : "https://%s:%s", h,
             p);
  }
  size_t n = strlen(c->api_url);
  while (n && c->api_url[n - 1] == '/') c->api_url[--n] = 0;
  snprintf(c->sa_dir, sizeof c->sa_dir, "%s", agent_param_str(AGENT_P_KUBE_SA_DIR));
  char path[600];
  snprintf(path, sizeof path, "%s/namespace", c->sa_dir);
  char e2[400];
  if (read_small(path, c->namespace_, sizeof c->namespace_, e2, sizeof e2)) {
    snprintf(err, cap,
             "%s (the service account's namespace: is automountServiceAccountToken false? "
             "TDIST_KUBE_SA_DIR names another directory)",
             e2);
    return -1;
  }
  if (!valid_name(c->namespace_)) {
    snprintf(err, cap, "%s: '%.80s' is not a namespace name", path, c->namespace_);
    return -1;
  }
  if (env_name("JOBSET_NAME", getenv("JOBSET_NAME"),
               "set it from the pod annotation jobset.sigs.k8s.io/jobset-name (downward API, "
               "k8s/jobset-in-place)",
               c->jobset, sizeof c->jobset, err, cap) ||
      env_name("POD_NAME", getenv("POD_NAME"), "set it from metadata.name (downward API)", c->pod,
               sizeof c->pod, err, cap))
    return -1;
  return 0;
}

typedef struct {
  char *buf;
  size_t len, cap_limit;
  int over;
  /* watch: lines go to on_line as they complete (when set and the status is 200) */
  CURL *curl;
  int (*on_line)(void *ctx, const char *line, size_t len);
  void *line_ctx;
  int line_stop; /* on_line asked to stop */
  atomic_int *stop;
} body_t;

static int body_append(body_t *b, const char *p, size_t n) {
  if (b->len + n > b->cap_limit) return b->over = 1, -1;
  char *nb = realloc(b->buf, b->len + n + 1);
  if (!nb) return b->over = 1, -1;
  b->buf = nb;
  memcpy(b->buf + b->len, p, n);
  b->len += n;
  b->buf[b->len] = 0;
  return 0;
}

static size_t on_data(char *p, size_t sz, size_t nm, void *ctx) {
  body_t *b = ctx;
  size_t n = sz * nm;
  if (body_append(b, p, n)) return 0;
  long code = 0;
  if (!b->on_line || curl_easy_getinfo(b->curl, CURLINFO_RESPONSE_CODE, &code) != CURLE_OK ||
      code != 200)
    return n;
  /* Watch: each complete line is one event; the rest waits for more data. */
  char *nl;
  while ((nl = memchr(b->buf, '\n', b->len)) != NULL) {
    size_t ll = (size_t)(nl - b->buf);
    if (ll && b->on_line(b->line_ctx, b->buf, ll)) {
      b->line_stop = 1;
      return 0;
    }
    memmove(b->buf, nl + 1, b->len - ll - 1);
    b->len -= ll + 1;
    b->buf[b->len] = 0;
  }
  return n;
}

static int on_progress(void *ctx, curl_off_t a, curl_off_t b_, curl_off_t c, curl_off_t d) {
  (void)a, (void)b_, (void)c, (void)d;
  body_t *b = ctx;
  return b->stop && atomic_load(b->stop) ? 1 : 0;
}

/* The message of a Status answer, if the body is one; else the body's start. Printable only. */
static void answer_text(const body_t *b, char *out, size_t cap) {
  if (!b->buf || agent_kube_parse_status_message(b->buf, b->len, out, cap))
    snprintf(out, cap, "%.200s", b->buf ? b->buf : "");
  for (char *p = out; *p; p++)
    if ((unsigned char)*p < 0x20 || (unsigned char)*p == 0x7f) *p = ' ';
}

/* One request. method GET/PATCH; body NULL or JSON (content type ctype). On 2xx: 0 and *b holds
 * the answer (the caller frees b->buf); else an AGENT_KUBE_* code and err. */
static int request(const agent_kube_cfg_t *c, const char *method, const char *url, const char *body,
                   const char *ctype, double timeout_s, body_t *b, char *err, size_t cap) {
  char token[65536 / 8], path[600], e2[400];
  snprintf(path, sizeof path, "%s/token", c->sa_dir);
  if (read_small(path, token, sizeof token, e2, sizeof e2)) {
    snprintf(err, cap, "%s (the service account token; TDIST_KUBE_SA_DIR names the directory)", e2);
    return AGENT_KUBE_ERR;
  }
  char *auth = NULL;
  if (asprintf(&auth, "Authorization: Bearer %s", token) < 0) {
    snprintf(err, cap, "out of memory");
    return AGENT_KUBE_ERR;
  }
  memset(token, 0, sizeof token);
  CURL *h = curl_easy_init();
  struct curl_slist *hdr = NULL;
  char cterr[CURL_ERROR_SIZE] = "", ctype_h[128];
  snprintf(ctype_h, sizeof ctype_h, "Content-Type: %s", ctype ? ctype : "application/json");
  hdr = curl_slist_append(hdr, auth);
  hdr = curl_slist_append(hdr, "Accept: application/json");
  if (body) hdr = curl_slist_append(hdr, ctype_h);
  if (!h || !hdr) {
    snprintf(err, cap, "out of memory");
    curl_slist_free_all(hdr);
    if (h) curl_easy_cleanup(h);
    free(auth);
    return AGENT_KUBE_ERR;
  }
  snprintf(path, sizeof path, "%s/ca.crt", c->sa_dir);
  b->curl = h;
  curl_easy_setopt(h, CURLOPT_URL, url);
  curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, method);
  curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdr);
  curl_easy_setopt(h, CURLOPT_CAINFO, path);
  curl_easy_setopt(h, CURLOPT_SSL_VERIFYPEER, 1L);
  curl_easy_setopt(h, CURLOPT_SSL_VERIFYHOST, 2L);
  curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "https");
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, 10000L);
  /* A watch is quiet for minutes: keepalive probes find a connection that died without a FIN
   * (an API server or node gone) in about a minute, not at the watch's deadline. */
  curl_easy_setopt(h, CURLOPT_TCP_KEEPALIVE, 1L);
  curl_easy_setopt(h, CURLOPT_TCP_KEEPIDLE, 30L);
  curl_easy_setopt(h, CURLOPT_TCP_KEEPINTVL, 10L);
  curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, (long)(timeout_s * 1000));
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_data);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, b);
  curl_easy_setopt(h, CURLOPT_ERRORBUFFER, cterr);
  curl_easy_setopt(h, CURLOPT_USERAGENT, "tdist-agent");
  if (b->stop) {
    curl_easy_setopt(h, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(h, CURLOPT_XFERINFOFUNCTION, on_progress);
    curl_easy_setopt(h, CURLOPT_XFERINFODATA, b);
  }
  if (body) curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
  CURLcode cr = curl_easy_perform(h);
  long code = 0;
  curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &code);
  curl_slist_free_all(hdr);
  curl_easy_cleanup(h);
  memset(auth, 0, strlen(auth));
  free(auth);
  b->curl = NULL;
  if (b->line_stop) return 0; /* the watch's reader decided: its result stands */
  if (cr == CURLE_ABORTED_BY_CALLBACK) {
    snprintf(err, cap, "%s %s: stopped", method, url);
    return AGENT_KUBE_STOPPED;
  }
  if (cr != CURLE_OK) {
    if (b->over)
      snprintf(err, cap, "%s %s: an answer over %zu bytes", method, url, b->cap_limit);
    else
      snprintf(err, cap, "%s %s: %s%s%s (check the API server address, TDIST_KUBE_API_URL, and %s)",
               method, url, curl_easy_strerror(cr), cterr[0] ? ": " : "", cterr, path);
    return AGENT_KUBE_ERR;
  }
  if (code >= 200 && code < 300) return 0;
  char text[256];
  answer_text(b, text, sizeof text);
  if (code == 401) {
    snprintf(err, cap,
             "%s %s: HTTP 401 (%s): the API server refused the token in %s/token (is the service "
             "account token mounted and current?); and %s",
             method, url, text, c->sa_dir, RBAC_HINT);
    return AGENT_KUBE_DENIED;
  }
  if (code == 403) {
    snprintf(err, cap, "%s %s: HTTP 403 (%s): %s", method, url, text, RBAC_HINT);
    return AGENT_KUBE_DENIED;
  }
  if (code == 404) {
    snprintf(err, cap,
             "%s %s: HTTP 404 (%s): no such object; check JOBSET_NAME, POD_NAME, the namespace, "
             "and that JobSet's CRD (jobset.x-k8s.io/v1alpha2) is installed",
             method, url, text);
    return AGENT_KUBE_NOTFOUND;
  }
  if (code == 410) {
    snprintf(err, cap, "%s %s: HTTP 410 (%s)", method, url, text);
    return AGENT_KUBE_GONE;
  }
  snprintf(err, cap, "%s %s: HTTP %ld (%s)", method, url, code, text);
  return AGENT_KUBE_ERR;
}

int agent_kube_get_jobset(const agent_kube_cfg_t *c, double timeout_s, agent_kube_jobset_t *out,
                          char *err, size_t cap) {
  char url[1200];
  snprintf(url, sizeof url, "%s" AGENT_KUBE_JOBSET_API "/namespaces/%s/jobsets/%s", c->api_url,
           c->namespace_, c->jobset);
  body_t b = {.cap_limit = AGENT_KUBE_MAX_JSON};
  int rc = request(c, "GET", url, NULL, NULL, timeout_s, &b, err, cap);
  if (rc == 0) {
    char e2[400];
    if (agent_kube_parse_jobset(b.buf ? b.buf : "", b.len, out, e2, sizeof e2)) {
      snprintf(err, cap, "GET %s: %s", url, e2);
      rc = AGENT_KUBE_ERR;
    }
  }
  free(b.buf);
  return rc;
}

int agent_kube_patch_attempt(const agent_kube_cfg_t *c, int64_t attempt, double timeout_s,
                             char *err, size_t cap) {
  char url[1200], body[256];
  snprintf(url, sizeof url, "%s/api/v1/namespaces/%s/pods/%s", c->api_url, c->namespace_, c->pod);
  snprintf(body, sizeof body, "{\"metadata\":{\"annotations\":{\"%s\":\"%lld\"}}}",
           AGENT_KUBE_ATTEMPT_KEY, (long long)attempt);
  body_t b = {.cap_limit = AGENT_KUBE_MAX_JSON};
  int rc = request(c, "PATCH", url, body, "application/merge-patch+json", timeout_s, &b, err, cap);
  free(b.buf);
  return rc;
}

typedef struct {
  void (*on_object)(void *ctx, const agent_kube_jobset_t *js);
  void *ctx;
  int rc;
  char *err;
  size_t cap;
  char rv[64]; /* the last resourceVersion seen */
} watch_t;

static int on_event(void *ctx, const char *line, size_t len) {
  watch_t *w = ctx;
  char type[16], e2[400];
  agent_kube_jobset_t js;
  int code = 0;
  if (agent_kube_parse_event(line, len, type, sizeof type, &js, &code, e2, sizeof e2)) {
    snprintf(w->err, w->cap, "watch event: %s", e2);
    w->rc = AGENT_KUBE_ERR;
    return 1;
  }
  if (!strcmp(type, "ERROR")) {
    snprintf(w->err, w->cap, "watch ERROR event, code %d", code);
    w->rc = code == 410 ? AGENT_KUBE_GONE : AGENT_KUBE_ERR;
    return 1;
  }
  if (js.resource_version[0]) snprintf(w->rv, sizeof w->rv, "%s", js.resource_version);
  if (!strcmp(type, "ADDED") || !strcmp(type, "MODIFIED")) w->on_object(w->ctx, &js);
  return 0;
}

int agent_kube_watch_jobset(const agent_kube_cfg_t *c, char rv[64], int watch_s,
                            void (*on_object)(void *ctx, const agent_kube_jobset_t *js), void *ctx,
                            atomic_int *stop, char *err, size_t cap) {
  char url[1400];
  snprintf(url, sizeof url,
           "%s" AGENT_KUBE_JOBSET_API
           "/namespaces/%s/jobsets?fieldSelector=metadata.name%%3D%s&watch=1"
           "&allowWatchBookmarks=true&timeoutSeconds=%d&resourceVersion=%s",
           c->api_url, c->namespace_, c->jobset, watch_s, rv);
  watch_t w = {.on_object = on_object, .ctx = ctx, .err = err, .cap = cap};
  body_t b = {.cap_limit = AGENT_KUBE_MAX_JSON, .on_line = on_event, .line_ctx = &w, .stop = stop};
  int rc = request(c, "GET", url, NULL, NULL, watch_s + 30.0, &b, err, cap);
  free(b.buf);
  if (w.rv[0]) snprintf(rv, 64, "%s", w.rv);
  if (b.line_stop) return w.rc;
  return rc;
}
