/* Discovery inside Kubernetes (see discovery.h): this pod's node rank, the DNS name of node rank 0
 * built from one of four naming schemes, and name resolution that waits for that name to appear.
 * Everything but agent_resolve and agent_local_ip reads only local state (the environment given,
 * the hostname, resolv.conf, the service-account namespace file). agent_resolve must never wait
 * past its deadline except inside one getaddrinfo call (the resolver's own timeout), and must
 * never hold the caller longer than ~100 ms between polls of its cancel callback. */
#define _GNU_SOURCE
#include "operator-agent/discovery/discovery.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <inttypes.h>
#include <limits.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "operator-agent/common/log.h"

#define SA_NAMESPACE_FILE "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
#define DEFAULT_RESOLV_CONF "/etc/resolv.conf"
#define DEFAULT_DOMAIN "cluster.local"
#define NAME_CAP 256 /* a DNS name is at most 253 characters */
#define MAX_SEARCH 64

static void errf(char *err, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void errf(char *err, size_t cap, const char *fmt, ...) {
  if (err == NULL || cap == 0) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, cap, fmt, ap);
  va_end(ap);
}

static const char *env_get(char **envp, const char *name) {
  if (envp == NULL) return NULL;
  size_t n = strlen(name);
  for (char **e = envp; *e; e++)
    if (strncmp(*e, name, n) == 0 && (*e)[n] == '=') return *e + n + 1;
  return NULL;
}

static int given(const char *s) { return s != NULL && s[0] != 0; }

/* Strict non-negative decimal that fits an int: digits only, no sign, no spaces. */
static int parse_index(const char *s, size_t n, int *out) {
  if (n == 0 || n > 10) return -1;
  long long v = 0;
  for (size_t i = 0; i < n; i++) {
    if (s[i] < '0' || s[i] > '9') return -1;
    v = v * 10 + (s[i] - '0');
  }
  if (v > INT_MAX) return -1;
  *out = (int)v;
  return 0;
}

/* The short hostname (up to the first '.'): `hostname` or gethostname(). */
static void short_host(const char *hostname, char *buf, size_t cap) {
  if (hostname != NULL) {
    snprintf(buf, cap, "%s", hostname);
  } else if (gethostname(buf, cap) != 0) {
    buf[0] = 0;
  }
  buf[cap - 1] = 0;
  char *dot = strchr(buf, '.');
  if (dot) *dot = 0;
}

/* Length of s without a trailing "-<digits>", or 0 when there is none. */
static size_t strip_index(const char *s, size_t n) {
  size_t i = n;
  while (i > 0 && s[i - 1] >= '0' && s[i - 1] <= '9') i--;
  if (i == n || i < 2 || s[i - 1] != '-') return 0;
  return i - 1;
}

/* Length of s[0..n) without a trailing "-<word>", or 0 when it does not end that way. */
static size_t strip_word(const char *s, size_t n, const char *word) {
  size_t w = strlen(word);
  if (w == 0 || n < w + 2 || s[n - w - 1] != '-' || memcmp(s + n - w, word, w) != 0) return 0;
  return n - w - 1;
}

static const char *or_default(const char *v, const char *def) { return given(v) ? v : def; }

int agent_discover_node_rank(const agent_cfg_t *cfg, char **envp, const char *hostname, char *err,
                             size_t cap) {
  if (cfg != NULL && cfg->node_rank >= 0) return cfg->node_rank;
  int v;
  const char *jci = env_get(envp, "JOB_COMPLETION_INDEX");
  if (jci != NULL) {
    if (parse_index(jci, strlen(jci), &v) == 0) return v;
    errf(err, cap,
         "env JOB_COMPLETION_INDEX: '%.64s' is not a non-negative integer (Kubernetes sets it "
         "for Indexed Jobs); fix or unset it, or pass --node-rank",
         jci);
    return -1;
  }
  char host[NAME_CAP];
  short_host(hostname, host, sizeof host);
  const char *dash = strrchr(host, '-');
  if (dash != NULL && parse_index(dash + 1, strlen(dash + 1), &v) == 0) {
    /* Kubeflow v1 pods are <job>-master-0 (node 0) and <job>-worker-<i> (node i+1): both end
     * in an index, and worker-0 must not also claim node 0 (the store host). */
    if (cfg != NULL && cfg->scheme == AGENT_SCHEME_KUBEFLOW &&
        strip_word(host, (size_t)(dash - host), "worker") != 0) {
      if (v == INT_MAX) goto fail;
      return v + 1;
    }
    return v;
  }
fail:
  errf(err, cap,
       "node rank: --node-rank not given, env JOB_COMPLETION_INDEX not set, and hostname '%s' "
       "has no numeric -<index> suffix; pass --node-rank or run the pods as an Indexed Job",
       host);
  return -1;
}

/* ---- resolv.conf ---- */

/* glibc's MATCH(): the keyword, then a space or a tab. */
static int keyword(const char *line, const char *kw) {
  size_t n = strlen(kw);
  return strncmp(line, kw, n) == 0 && (line[n] == ' ' || line[n] == '\t');
}

static void put(char *out, size_t cap, const char *s, size_t n) {
  if (out == NULL || cap == 0) return;
  if (n >= cap) n = 0; /* a cut-off name is worse than none */
  memcpy(out, s, n);
  out[n] = 0;
}

int agent_resolv_conf_k8s(const char *path, char *ns, size_t ns_cap, char *domain,
                          size_t domain_cap) {
  put(ns, ns_cap, "", 0);
  put(domain, domain_cap, "", 0);
  FILE *f = fopen(path ? path : DEFAULT_RESOLV_CONF, "re");
  if (f == NULL) return -1;
  char *line = NULL, *list = NULL;
  size_t lcap = 0, max_tok = MAX_SEARCH;
  /* Like glibc, the last "search" or "domain" line wins ("domain" is a one-entry list). */
  while (getline(&line, &lcap, f) >= 0) {
    int is_search = keyword(line, "search");
    if (!is_search && !keyword(line, "domain")) continue;
    free(list);
    list = strdup(line + 6);
    if (list == NULL) break;
    max_tok = is_search ? MAX_SEARCH : 1;
  }
  free(line);
  fclose(f);
  if (list == NULL) return 0;

  char *tok[MAX_SEARCH], *save = NULL;
  size_t ntok = 0;
  for (char *t = strtok_r(list, " \t\r\n", &save); t != NULL && ntok < max_tok;
       t = strtok_r(NULL, " \t\r\n", &save)) {
    size_t n = strlen(t);
    if (n > 1 && t[n - 1] == '.') t[n - 1] = 0; /* "svc.cluster.local." */
    for (char *c = t; *c; c++)
      if (*c >= 'A' && *c <= 'Z') *c = (char)(*c - 'A' + 'a');
    tok[ntok++] = t;
  }
  const char *dom = NULL;
  for (size_t i = 0; i < ntok && dom == NULL; i++)
    if (strncmp(tok[i], "svc.", 4) == 0 && tok[i][4] != 0 && tok[i][4] != '.') dom = tok[i] + 4;
  const char *nsp = NULL;
  size_t nslen = 0;
  for (size_t i = 0; i < ntok && nsp == NULL; i++) {
    const char *s = strstr(tok[i], ".svc.");
    if (s == NULL || s == tok[i] || memchr(tok[i], '.', (size_t)(s - tok[i])) != NULL) continue;
    const char *rest = s + 5;
    if (*rest == 0 || *rest == '.' || (dom != NULL && strcmp(rest, dom) != 0)) continue;
    nsp = tok[i];
    nslen = (size_t)(s - tok[i]);
    if (dom == NULL) dom = rest;
  }
  if (nsp != NULL) put(ns, ns_cap, nsp, nslen);
  if (dom != NULL) put(domain, domain_cap, dom, strlen(dom));
  free(list);
  return 0;
}

/* ---- master name ---- */

static const struct {
  const char *name, *tmpl;
} schemes[] = {
    [AGENT_SCHEME_INDEXED_JOB] = {"indexed-job", "{job}-0.{service}.{namespace}.svc.{domain}."},
    [AGENT_SCHEME_KUBEFLOW] = {"kubeflow", "{job}-master-0.{namespace}.svc.{domain}."},
    [AGENT_SCHEME_JOBSET] = {"jobset",
                             "{job}-{replicated_job}-0-0.{service}.{namespace}.svc.{domain}."},
    [AGENT_SCHEME_VOLCANO] = {"volcano", "{job}-{task}-0.{job}.{namespace}.svc.{domain}."},
};

/* Why s is not a DNS label (RFC 1123, as Kubernetes checks names), or NULL when it is one. */
static const char *label_problem(const char *s, size_t n) {
  if (n == 0) return "is empty";
  if (n > 63) return "is longer than 63 characters";
  for (size_t i = 0; i < n; i++) {
    char c = s[i];
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-'))
      return "has a character other than a-z, 0-9 and '-'";
  }
  if (s[0] == '-' || s[n - 1] == '-') return "starts or ends with '-'";
  return NULL;
}

static const char *domain_problem(const char *s) {
  size_t n = strlen(s);
  if (n == 0) return "is empty";
  if (n > 200) return "is longer than 200 characters";
  for (const char *p = s;;) {
    const char *dot = strchr(p, '.');
    size_t len = dot ? (size_t)(dot - p) : strlen(p);
    const char *why = label_problem(p, len);
    if (why != NULL) return len == 0 ? "has an empty label" : why;
    if (dot == NULL) return NULL;
    p = dot + 1;
  }
}

typedef struct {
  const agent_cfg_t *cfg;
  char **envp;
  const char *hostname, *resolv_conf;
  int have_rc, rc_read; /* resolv.conf looked at / could be read */
  char rc_ns[NAME_CAP], rc_domain[NAME_CAP];
  char val[NAME_CAP]; /* the value being substituted */
  char src[NAME_CAP + 64];
  char *err;
  size_t cap;
} mctx_t;

static void load_rc(mctx_t *m) {
  if (m->have_rc) return;
  m->have_rc = 1;
  m->rc_read = agent_resolv_conf_k8s(m->resolv_conf, m->rc_ns, sizeof m->rc_ns, m->rc_domain,
                                     sizeof m->rc_domain) == 0;
}

static int set_val(mctx_t *m, const char *v, size_t n) {
  if (n >= sizeof m->val) n = sizeof m->val - 1;
  memcpy(m->val, v, n);
  m->val[n] = 0;
  return 0;
}

/* The job name: --job-name, else the hostname without the parts the scheme adds. */
static int job_value(mctx_t *m) {
  const agent_cfg_t *cfg = m->cfg;
  if (given(cfg->job_name)) {
    snprintf(m->src, sizeof m->src, "--job-name");
    return set_val(m, cfg->job_name, strlen(cfg->job_name));
  }
  char host[NAME_CAP];
  short_host(m->hostname, host, sizeof host);
  size_t n = strlen(host), k = strip_index(host, n);
  if (k == 0) {
    errf(m->err, m->cap, "job name: hostname '%s' has no -<index> suffix; pass --job-name", host);
    return -1;
  }
  const char *shape = NULL, *what = NULL;
  switch (cfg->scheme) {
    case AGENT_SCHEME_KUBEFLOW: { /* <job>-master-0, <job>-worker-<i> */
      size_t j = strip_word(host, k, "master");
      if (j == 0) j = strip_word(host, k, "worker");
      k = j;
      shape = "<job>-master-<index> or <job>-worker-<index>";
      break;
    }
    case AGENT_SCHEME_JOBSET: { /* <jobset>-<replicated job>-<job index>-<pod index> */
      what = or_default(cfg->replicated_job, "node");
      k = strip_index(host, k);
      if (k != 0) k = strip_word(host, k, what);
      shape = "<jobset>-<replicated_job>-<job index>-<pod index>";
      break;
    }
    case AGENT_SCHEME_VOLCANO: { /* <job>-<task>-<index> */
      what = or_default(cfg->task, "worker");
      size_t j = strip_word(host, k, what);
      if (j == 0) j = strip_word(host, k, "master");
      if (j == 0) j = strip_word(host, k, "worker");
      k = j;
      shape = "<job>-<task>-<index>";
      break;
    }
    default: break;
  }
  if (k == 0) {
    errf(m->err, m->cap,
         "job name: hostname '%s' does not look like %s (scheme %s%s%s%s); pass --job-name", host,
         shape, schemes[cfg->scheme].name, what ? ", '" : "", what ? what : "", what ? "'" : "");
    return -1;
  }
  snprintf(m->src, sizeof m->src, "hostname '%s' (pass --job-name to override)", host);
  return set_val(m, host, k);
}

static int read_sa_namespace(char *out, size_t cap) {
  int fd = open(SA_NAMESPACE_FILE, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  ssize_t n = read(fd, out, cap - 1);
  close(fd);
  if (n <= 0) return -1;
  out[n] = 0;
  while (n > 0 && (out[n - 1] == '\n' || out[n - 1] == ' ' || out[n - 1] == '\r')) out[--n] = 0;
  return n > 0 ? 0 : -1;
}

static int namespace_value(mctx_t *m) {
  const char *v;
  if (given(m->cfg->namespace_)) {
    snprintf(m->src, sizeof m->src, "--namespace");
    return set_val(m, m->cfg->namespace_, strlen(m->cfg->namespace_));
  }
  if (given(v = env_get(m->envp, "POD_NAMESPACE"))) {
    snprintf(m->src, sizeof m->src, "env POD_NAMESPACE");
    return set_val(m, v, strlen(v));
  }
  char sa[NAME_CAP];
  if (read_sa_namespace(sa, sizeof sa) == 0) {
    snprintf(m->src, sizeof m->src, "%s", SA_NAMESPACE_FILE);
    return set_val(m, sa, strlen(sa));
  }
  load_rc(m);
  const char *rc = m->resolv_conf ? m->resolv_conf : DEFAULT_RESOLV_CONF;
  if (m->rc_ns[0]) {
    snprintf(m->src, sizeof m->src, "the search list of %s", rc);
    return set_val(m, m->rc_ns, strlen(m->rc_ns));
  }
  errf(m->err, m->cap,
       "namespace: --namespace not given, env POD_NAMESPACE not set, %s not readable, and %s %s; "
       "pass --namespace",
       SA_NAMESPACE_FILE, rc,
       m->rc_read ? "has no '<namespace>.svc.<domain>' search entry" : "could not be read");
  return -1;
}

static int domain_value(mctx_t *m) {
  const char *d = m->cfg->cluster_domain;
  if (given(d)) {
    size_t n = strlen(d);
    if (n > 1 && d[n - 1] == '.') n--;
    snprintf(m->src, sizeof m->src, "--cluster-domain");
    return set_val(m, d, n);
  }
  load_rc(m);
  if (m->rc_domain[0]) {
    snprintf(m->src, sizeof m->src, "the search list of %s",
             m->resolv_conf ? m->resolv_conf : DEFAULT_RESOLV_CONF);
    return set_val(m, m->rc_domain, strlen(m->rc_domain));
  }
  snprintf(m->src, sizeof m->src, "the default");
  return set_val(m, DEFAULT_DOMAIN, strlen(DEFAULT_DOMAIN));
}

/* Fills m->val for placeholder `key` and checks it. */
static int placeholder(mctx_t *m, const char *key, size_t n) {
  const agent_cfg_t *cfg = m->cfg;
  const char *what = NULL;
  int rc = 0, is_domain = 0;
#define IS(k) (n == sizeof(k) - 1 && memcmp(key, k, n) == 0)
  if (IS("job")) {
    what = "job name";
    rc = job_value(m);
  } else if (IS("service")) {
    what = "service";
    if (given(cfg->service)) {
      snprintf(m->src, sizeof m->src, "--service");
      rc = set_val(m, cfg->service, strlen(cfg->service));
    } else {
      rc = job_value(m); /* the service defaults to the job name */
    }
  } else if (IS("namespace")) {
    what = "namespace";
    rc = namespace_value(m);
  } else if (IS("domain")) {
    what = "cluster domain";
    is_domain = 1;
    rc = domain_value(m);
  } else if (IS("replicated_job")) {
    what = "replicated job";
    snprintf(m->src, sizeof m->src,
             given(cfg->replicated_job) ? "--replicated-job" : "the default");
    const char *v = or_default(cfg->replicated_job, "node");
    rc = set_val(m, v, strlen(v));
  } else if (IS("task")) {
    what = "task";
    snprintf(m->src, sizeof m->src, given(cfg->task) ? "--task" : "the default");
    const char *v = or_default(cfg->task, "worker");
    rc = set_val(m, v, strlen(v));
  } else {
    return 1;
  }
#undef IS
  if (rc != 0) return -1;
  const char *why = is_domain ? domain_problem(m->val) : label_problem(m->val, strlen(m->val));
  if (why != NULL) {
    errf(m->err, m->cap,
         "%s '%.80s' (from %s) %s: it must be a DNS %s (lowercase letters, digits and '-', "
         "1..63 characters, starting and ending with a letter or digit); fix it",
         what, m->val, m->src, why, is_domain ? "name whose labels are each" : "label");
    return -1;
  }
  return 0;
}

/* A host name: labels of [A-Za-z0-9-] of 1..63 characters, 253 in all, an optional final dot. */
static const char *hostname_problem(const char *s) {
  size_t n = strlen(s);
  if (n > 1 && s[n - 1] == '.') n--;
  if (n == 0) return "is empty";
  if (n > 253) return "is longer than 253 characters";
  size_t label = 0;
  for (size_t i = 0; i < n; i++) {
    char c = s[i];
    if (c == '.') {
      if (label == 0) return "has an empty label";
      label = 0;
    } else if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
               c == '-') {
      if (++label > 63) return "has a label longer than 63 characters";
    } else {
      return "has a character other than letters, digits, '-' and '.'";
    }
  }
  return label == 0 ? "has an empty label" : NULL;
}

int agent_master_name(const agent_cfg_t *cfg, char **envp, const char *hostname,
                      const char *resolv_conf, char *out, size_t out_cap, char *err, size_t cap) {
  if (out != NULL && out_cap > 0) out[0] = 0;
  if (cfg == NULL || out == NULL || out_cap == 0) {
    errf(err, cap, "master name: no configuration or output buffer (internal error)");
    return -1;
  }
  const char *tmpl, *tsrc;
  if (given(cfg->master_template)) {
    tmpl = cfg->master_template;
    tsrc = "--master-template";
  } else if ((unsigned)cfg->scheme < sizeof schemes / sizeof schemes[0]) {
    tmpl = schemes[cfg->scheme].tmpl;
    tsrc = schemes[cfg->scheme].name;
  } else {
    errf(err, cap,
         "master name: unknown scheme %d; use --scheme indexed-job, kubeflow, jobset "
         "or volcano",
         (int)cfg->scheme);
    return -1;
  }
  mctx_t *m = calloc(1, sizeof *m);
  if (m == NULL) {
    errf(err, cap, "master name: out of memory");
    return -1;
  }
  m->cfg = cfg;
  m->envp = envp;
  m->hostname = hostname;
  m->resolv_conf = resolv_conf;
  m->err = err;
  m->cap = cap;
  char name[2 * NAME_CAP];
  size_t len = 0;
  int rc = -1;
  for (const char *p = tmpl; *p;) {
    const char *chunk = p;
    size_t clen = 1;
    if (*p == '{') {
      const char *close = strchr(p + 1, '}');
      const char *next_open = strchr(p + 1, '{');
      if (close == NULL || (next_open != NULL && next_open < close)) {
        errf(err, cap, "master template '%s' (%s): '{' at offset %zu is not closed", tmpl, tsrc,
             (size_t)(p - tmpl));
        goto out;
      }
      int r = placeholder(m, p + 1, (size_t)(close - p - 1));
      if (r > 0) {
        errf(err, cap,
             "master template '%s' (%s): unknown placeholder '%.*s' (known: {job} {service} "
             "{namespace} {domain} {replicated_job} {task})",
             tmpl, tsrc, (int)(close - p + 1), p);
        goto out;
      }
      if (r < 0) goto out;
      chunk = m->val;
      clen = strlen(m->val);
      p = close + 1;
    } else {
      p++;
    }
    if (len + clen >= sizeof name) {
      errf(err, cap, "master name from template '%s' (%s) is longer than 253 characters", tmpl,
           tsrc);
      goto out;
    }
    memcpy(name + len, chunk, clen);
    len += clen;
  }
  name[len] = 0;
  const char *why = hostname_problem(name);
  if (why != NULL) {
    errf(err, cap, "master name '%s' from template '%s' (%s) %s; fix the template or its values",
         name, tmpl, tsrc, why);
    goto out;
  }
  if (len >= out_cap) {
    errf(err, cap, "master name '%s' does not fit in %zu bytes (internal error)", name, out_cap);
    goto out;
  }
  memcpy(out, name, len + 1);
  rc = 0;
out:
  free(m);
  return rc;
}

int agent_pod_name(const char *pod0_name, int index, char *out, size_t out_cap, char *err,
                   size_t cap) {
  if (out != NULL && out_cap > 0) out[0] = 0;
  if (pod0_name == NULL || out == NULL || index < 0) {
    errf(err, cap, "pod name: no name of pod 0 (internal error)");
    return -1;
  }
  const char *dot = strchr(pod0_name, '.');
  size_t label = dot ? (size_t)(dot - pod0_name) : strlen(pod0_name);
  if (label < 3 || pod0_name[label - 1] != '0' || pod0_name[label - 2] != '-') {
    errf(err, cap,
         "pod 0's name '%s' does not start with a label ending in -0, so the name of pod %d "
         "cannot be derived from it",
         pod0_name, index);
    return -1;
  }
  char num[16];
  int nlen = snprintf(num, sizeof num, "%d", index);
  size_t total = label - 1 + (size_t)nlen + strlen(pod0_name + label);
  if (total >= out_cap || total > 253) {
    errf(err, cap, "the name of pod %d from '%s' is too long", index, pod0_name);
    return -1;
  }
  memcpy(out, pod0_name, label - 1);
  memcpy(out + label - 1, num, (size_t)nlen);
  memcpy(out + label - 1 + (size_t)nlen, pod0_name + label, strlen(pod0_name + label) + 1);
  const char *why = hostname_problem(out);
  if (why != NULL) {
    errf(err, cap, "the name of pod %d, '%s', %s", index, out, why);
    out[0] = 0;
    return -1;
  }
  return 0;
}

/* ---- resolving with retry ---- */

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int cancelled(agent_cancel_fn cancel, void *arg) { return cancel != NULL && cancel(arg); }

/* The longest wait between tries. A pod waiting for pod 0's replacement (a lost store host)
 * spends most of that time at this cap, and on average 3/4 of it is added to the recovery once
 * the replacement is up: 2 s keeps that near 1.5 s, at one DNS query per agent every 1-2 s. */
#define RESOLVE_BACKOFF_MAX_MS 2000

/* Sleeps until `until` (monotonic ms) in slices of at most 50 ms, polling cancel between them.
 * Returns 0, or -2 when cancel said stop. */
static int sleep_until(int64_t until, agent_cancel_fn cancel, void *arg) {
  for (;;) {
    if (cancelled(cancel, arg)) return -2;
    int64_t left = until - now_ms();
    if (left <= 0) return 0;
    if (left > 50) left = 50;
    struct timespec ts = {0, (long)left * 1000000L};
    nanosleep(&ts, NULL); /* EINTR: the loop re-checks */
  }
}

/* A TCP connect to ai bounded by `until`. Returns 0 when it connected, -2 when cancelled, else a
 * positive errno. The connection is closed at once: this only proves someone listens. */
static int try_connect(const struct addrinfo *ai, int64_t until, agent_cancel_fn cancel,
                       void *arg) {
  int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
  if (fd < 0) return errno;
  int e = 0;
  if (connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
    e = errno;
    while (e == EINPROGRESS) {
      if (cancelled(cancel, arg)) {
        e = -2;
        break;
      }
      int64_t left = until - now_ms();
      if (left <= 0) {
        e = ETIMEDOUT;
        break;
      }
      struct pollfd p = {.fd = fd, .events = POLLOUT};
      int n = poll(&p, 1, (int)(left < 100 ? left : 100));
      if (n < 0 && errno != EINTR) {
        e = errno;
      } else if (n > 0) {
        socklen_t l = sizeof e;
        if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &l) != 0) e = errno;
      }
    }
  }
  close(fd);
  return e;
}

static int numeric_host(const struct sockaddr *sa, socklen_t len, char *out, size_t cap) {
  char host[NI_MAXHOST];
  if (getnameinfo(sa, len, host, sizeof host, NULL, 0, NI_NUMERICHOST) != 0) return -1;
  if (out != NULL && cap > 0 && (size_t)snprintf(out, cap, "%s", host) >= cap) return -1;
  return 0;
}

static int gai_retryable(int rc) {
  switch (rc) {
    case EAI_AGAIN:
    case EAI_NONAME:
    case EAI_FAIL:
#ifdef EAI_NODATA
    case EAI_NODATA:
#endif
#ifdef EAI_ADDRFAMILY
    case EAI_ADDRFAMILY:
#endif
    case EAI_SYSTEM: /* e.g. a resolv.conf being rewritten; the next attempt may work */ return 1;
    default: return 0;
  }
}

int agent_resolve(const char *name, int port, int confirm_connect, int64_t deadline_ms,
                  agent_cancel_fn cancel, void *cancel_arg, char *ip, size_t ip_cap,
                  agent_resolve_stats_t *stats, char *err, size_t cap) {
  if (ip != NULL && ip_cap > 0) ip[0] = 0;
  if (err != NULL && cap > 0) err[0] = 0;
  if (name == NULL || name[0] == 0) {
    errf(err, cap, "resolve: empty host name");
    return -1;
  }
  if (port < 0 || port > 65535 || (confirm_connect && port == 0)) {
    errf(err, cap, "resolve '%s': port %d is out of range 1..65535", name, port);
    return -1;
  }
  char portstr[8];
  snprintf(portstr, sizeof portstr, "%d", port);
  const int64_t t0 = now_ms();
  /* Jitter only has to differ between pods that start together; no global state needed. */
  struct timespec wall;
  clock_gettime(CLOCK_REALTIME, &wall);
  uint64_t rng = ((uint64_t)wall.tv_nsec * 0x9E3779B97F4A7C15ULL) ^ ((uint64_t)getpid() << 32) ^
                 (uint64_t)wall.tv_sec;
  if (rng == 0) rng = 1;
  int64_t delay = 100, next_log = t0;
  uint64_t attempts = 0;
  char last[320] = "";
  int connect_failed = 0;

  for (;;) {
    if (cancelled(cancel, cancel_arg)) goto cancel;
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    attempts++;
    if (stats) stats->attempts++;
    int rc = getaddrinfo(name, portstr, &hints, &res);
    if (rc == 0) {
      connect_failed = 0;
      for (const struct addrinfo *ai = res; ai != NULL; ai = ai->ai_next) {
        char text[80]; /* numeric: at most INET6_ADDRSTRLEN plus a %scope */
        if (numeric_host(ai->ai_addr, ai->ai_addrlen, text, sizeof text) != 0) continue;
        int e = 0;
        if (confirm_connect) {
          int64_t now = now_ms(), until = deadline_ms;
          if (connect_failed && now >= deadline_ms) break; /* one address past the deadline */
          if (until > now + 2000) until = now + 2000;
          if (until < now + 100)
            until = now + 100; /* the deadline may have passed in getaddrinfo */
          e = try_connect(ai, until, cancel, cancel_arg);
          if (e == -2) {
            freeaddrinfo(res);
            goto cancel;
          }
        }
        if (e == 0) {
          freeaddrinfo(res);
          if (ip != NULL && ip_cap > 0 && (size_t)snprintf(ip, ip_cap, "%s", text) >= ip_cap) {
            errf(err, cap, "resolve '%s': address %s does not fit in %zu bytes", name, text,
                 ip_cap);
            ip[0] = 0;
            return -1;
          }
          if (attempts > 1)
            AGENT_INFO("resolved '%s' to %s after %" PRIu64 " attempts in %.1f s", name, text,
                       attempts, (double)(now_ms() - t0) / 1000.0);
          return 0;
        }
        if (!connect_failed) /* report the first address: the one the resolver prefers */
          snprintf(last, sizeof last, "resolved to %s but connect to port %d failed: %s", text,
                   port, strerror(e));
        connect_failed = 1;
      }
      freeaddrinfo(res);
      if (!connect_failed) snprintf(last, sizeof last, "no usable address in the answer");
    } else {
      connect_failed = 0;
      snprintf(last, sizeof last, "%s", rc == EAI_SYSTEM ? strerror(errno) : gai_strerror(rc));
      if (!gai_retryable(rc)) {
        if (stats) stats->failures++;
        errf(err, cap, "could not resolve '%s': %s (not retried)", name, last);
        return -1;
      }
    }
    if (stats) stats->failures++;
    int64_t now = now_ms();
    if (now >= next_log) {
      AGENT_INFO("waiting for '%s'%s: %s (attempt %" PRIu64 ", %.1f s of %.1f s)", name,
                 confirm_connect ? " to accept connections" : " to resolve", last, attempts,
                 (double)(now - t0) / 1000.0, (double)(deadline_ms - t0) / 1000.0);
      next_log = now + 10000;
    } else {
      AGENT_DEBUG("resolve '%s' attempt %" PRIu64 ": %s", name, attempts, last);
    }
    if (now >= deadline_ms) break;
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    int64_t d = delay / 2 + (int64_t)(rng % (uint64_t)(delay / 2 + 1)); /* [delay/2, delay] */
    if (d > deadline_ms - now) d = deadline_ms - now;
    if (sleep_until(now + d, cancel, cancel_arg) != 0) goto cancel;
    delay = delay * 2 > RESOLVE_BACKOFF_MAX_MS ? RESOLVE_BACKOFF_MAX_MS : delay * 2;
  }
  errf(err, cap, "could not %s '%s' after %" PRIu64 " attempts in %.1f s: %s",
       connect_failed ? "connect to" : "resolve", name, attempts, (double)(now_ms() - t0) / 1000.0,
       last);
  return -1;
cancel:
  errf(err, cap, "resolving '%s' cancelled after %" PRIu64 " attempts in %.1f s%s%s", name,
       attempts, (double)(now_ms() - t0) / 1000.0, last[0] ? "; last error: " : "", last);
  return -2;
}

/* ---- local address ---- */

/* The source address the kernel picks for a UDP "connection" to host (no packet is sent). */
static int udp_probe(const char *host, int numeric, char *ip, size_t cap) {
  struct addrinfo hints, *res = NULL;
  memset(&hints, 0, sizeof hints);
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  hints.ai_flags = AI_NUMERICSERV | (numeric ? AI_NUMERICHOST : 0);
  if (getaddrinfo(host, "9", &hints, &res) != 0) return -1;
  int rc = -1;
  for (const struct addrinfo *ai = res; ai != NULL && rc != 0; ai = ai->ai_next) {
    int fd = socket(ai->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 &&
        getsockname(fd, (struct sockaddr *)&ss, &len) == 0)
      rc = numeric_host((struct sockaddr *)&ss, len, ip, cap);
    close(fd);
  }
  freeaddrinfo(res);
  return rc;
}

/* The first address of an up, non-loopback interface: IPv4 first, then global IPv6. */
static int ifaddrs_pick(char *ip, size_t cap) {
  struct ifaddrs *ifs = NULL;
  if (getifaddrs(&ifs) != 0) return -1;
  int rc = -1;
  for (int want = AF_INET; rc != 0 && want != 0; want = want == AF_INET ? AF_INET6 : 0) {
    for (struct ifaddrs *i = ifs; i != NULL && rc != 0; i = i->ifa_next) {
      if (i->ifa_addr == NULL || i->ifa_addr->sa_family != want) continue;
      if (!(i->ifa_flags & IFF_UP) || (i->ifa_flags & IFF_LOOPBACK)) continue;
      if (want == AF_INET6) {
        const struct in6_addr *a = &((const struct sockaddr_in6 *)i->ifa_addr)->sin6_addr;
        if (IN6_IS_ADDR_LINKLOCAL(a) || IN6_IS_ADDR_LOOPBACK(a)) continue;
      }
      socklen_t len = want == AF_INET ? sizeof(struct sockaddr_in) : sizeof(struct sockaddr_in6);
      rc = numeric_host(i->ifa_addr, len, ip, cap);
    }
  }
  freeifaddrs(ifs);
  return rc;
}

void agent_local_ip(const char *towards, char *ip, size_t cap) {
  if (ip == NULL || cap == 0) return;
  if (given(towards)) {
    if (udp_probe(towards, 0, ip, cap) == 0) return;
  } else {
    /* Public resolvers as route targets: only the routing table is consulted. */
    if (udp_probe("8.8.8.8", 1, ip, cap) == 0 || udp_probe("2001:4860:4860::8888", 1, ip, cap) == 0)
      return;
  }
  if (ifaddrs_pick(ip, cap) == 0) return; /* no route: the first up interface's address */
  snprintf(ip, cap, "127.0.0.1");
}
