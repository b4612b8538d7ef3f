/* Init methods: env:// (PyTorch's variables, TORCHELASTIC_USE_AGENT_STORE), tcp://HOST:PORT and
 * file://PATH with their ?rank=&world_size= queries, parsed with PyTorch's error messages, and
 * the stores they lead to (rank 0 hosts the TCP store outside an agent). Only finds where the
 * ranks meet: it must never talk to peers through the store or touch the backend (pg.c's
 * connect does, once the store is up), and never keeps a pointer into the caller's options. */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/common/log.h"
#include "runtime/pg/group.h"

/* Reads a non-negative int from a string (all of it); -1 on garbage. */
static long parse_nonneg(const char *s) {
  if (!s || !*s) return -1;
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno || *end || v < 0 || v > INT_MAX) return -1;
  return v;
}

/* Finds `name=` in a URL query ("a=1&b=2"); copies the value into buf. 1 if found. */
static int query_get(const char *query, const char *name, char *buf, size_t cap) {
  size_t nl = strlen(name);
  for (const char *p = query; p && *p;) {
    const char *amp = strchr(p, '&');
    size_t len = amp ? (size_t)(amp - p) : strlen(p);
    if (len > nl && strncmp(p, name, nl) == 0 && p[nl] == '=') {
      size_t vl = len - nl - 1;
      if (vl >= cap) vl = cap - 1;
      memcpy(buf, p + nl + 1, vl);
      buf[vl] = '\0';
      return 1;
    }
    p = amp ? amp + 1 : NULL;
  }
  return 0;
}

static const char *env_nonempty(const char *name) {
  const char *v = getenv(name);
  return v && *v ? v : NULL;
}

/* Resolves rank/world from the URL query, then the options, then RANK/WORLD_SIZE (PyTorch's
 * order), with PyTorch's messages for what is missing. */
static tdist_status_t resolve_rank_world(const char *scheme, const char *query,
                                         const tdist_pg_options_t *o, tdist__rdzv_t *r) {
  char buf[64];
  r->rank = o->rank;
  r->world = o->world_size;
  if (query && query_get(query, "rank", buf, sizeof buf)) {
    if ((r->rank = (int)parse_nonneg(buf)) < 0)
      return tdist__fail(TDIST_ERR_INVALID_ARGUMENT,
                         "%s: rank '%s' in the URL is not a "
                         "non-negative integer",
                         scheme, buf);
  }
  if (query && query_get(query, "world_size", buf, sizeof buf)) {
    if ((r->world = (int)parse_nonneg(buf)) <= 0)
      return tdist__fail(TDIST_ERR_INVALID_ARGUMENT,
                         "%s: world_size '%s' in the URL is not a "
                         "positive integer",
                         scheme, buf);
  }
  int is_env = strcmp(scheme, "env://") == 0;
  if (r->rank < 0) {
    const char *v = is_env ? env_nonempty("RANK") : NULL;
    if (!v)
      return tdist__fail(TDIST_ERR_INVALID_ARGUMENT,
                         is_env ? "Error initializing torch.distributed using env:// rendezvous: "
                                  "environment variable RANK expected, but not set"
                                : "%s rendezvous: rank parameter missing",
                         scheme);
    if ((r->rank = (int)parse_nonneg(v)) < 0)
      return tdist__fail(TDIST_ERR_INVALID_ARGUMENT,
                         "invalid literal for int() with base 10: '%s' (environment variable "
                         "RANK)",
                         v);
  }
  if (r->world < 0) {
    const char *v = is_env ? env_nonempty("WORLD_SIZE") : NULL;
    if (!v)
      return tdist__fail(TDIST_ERR_INVALID_ARGUMENT,
                         is_env ? "Error initializing torch.distributed using env:// rendezvous: "
                                  "environment variable WORLD_SIZE expected, but not set"
                                : "%s rendezvous: world_size parameter missing",
                         scheme);
    if ((r->world = (int)parse_nonneg(v)) <= 0)
      return tdist__fail(TDIST_ERR_INVALID_ARGUMENT,
                         "invalid literal for int() with base 10: '%s' (environment variable "
                         "WORLD_SIZE must be a positive integer)",
                         v);
  }
  return TDIST_OK;
}

static tdist_status_t parse_port(const char *s, int *port) {
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (!*s || *end || errno)
    return tdist__fail(TDIST_ERR_INVALID_ARGUMENT, "invalid literal for int() with base 10: '%s'",
                       s);
  if (v < 0 || v > 65535)
    return tdist__fail(TDIST_ERR_INVALID_ARGUMENT,
                       "port must have value from 0 to 65535 but was %ld.", v);
  *port = (int)v;
  return TDIST_OK;
}

tdist_status_t tdist__pg_parse_init_method(const tdist_pg_options_t *o, tdist__rdzv_t *r) {
  const char *im = o->init_method ? o->init_method : "env://";
  memset(r, 0, sizeof *r);
  if (strncmp(im, "env://", 6) == 0) {
    const char *q = strchr(im, '?');
    tdist_status_t st = resolve_rank_world("env://", q ? q + 1 : NULL, o, r);
    if (st) return st;
    const char *addr = env_nonempty("MASTER_ADDR");
    if (!addr)
      return tdist__fail(TDIST_ERR_INVALID_ARGUMENT,
                         "Error initializing torch.distributed using env:// rendezvous: "
                         "environment variable MASTER_ADDR expected, but not set");
    const char *port = env_nonempty("MASTER_PORT");
    if (!port)
      return tdist__fail(TDIST_ERR_INVALID_ARGUMENT,
                         "Error initializing torch.distributed using env:// rendezvous: "
                         "environment variable MASTER_PORT expected, but not set");
    if ((st = parse_port(port, &r->port))) return st;
    snprintf(r->host, sizeof r->host, "%s", addr);
    const char *agent = getenv("TORCHELASTIC_USE_AGENT_STORE");
    if (agent && strcmp(agent, "True") == 0) {
      const char *rc = env_nonempty("TORCHELASTIC_RESTART_COUNT");
      r->agent_store = 1;
      snprintf(r->prefix, sizeof r->prefix, "/worker/attempt_%s", rc ? rc : "0");
    }
    return TDIST_OK;
  }
  if (strncmp(im, "tcp://", 6) == 0) {
    const char *hp = im + 6;
    const char *q = strchr(hp, '?');
    size_t hl = q ? (size_t)(q - hp) : strlen(hp);
    char hostport[256];
    if (hl >= sizeof hostport)
      return tdist__fail(TDIST_ERR_INVALID_ARGUMENT, "tcp://: host name too long");
    memcpy(hostport, hp, hl);
    hostport[hl] = '\0';
    char *colon = strrchr(hostport, ':');
    if (!colon || colon[1] == '\0' || (hostport[0] == '[' && colon < strchr(hostport, ']')))
      return tdist__fail(TDIST_ERR_INVALID_ARGUMENT, "port number missing in '%s'", im);
    *colon = '\0';
    tdist_status_t st = parse_port(colon + 1, &r->port);
    if (st) return st;
    char *h = hostport;
    if (h[0] == '[') { /* [v6]:port */
      h++;
      char *rb = strchr(h, ']');
      if (rb) *rb = '\0';
    }
    if (!*h) return tdist__fail(TDIST_ERR_INVALID_ARGUMENT, "host missing in '%s'", im);
    snprintf(r->host, sizeof r->host, "%s", h);
    return resolve_rank_world("tcp://", q ? q + 1 : NULL, o, r);
  }
  if (strncmp(im, "file://", 7) == 0) {
    const char *path = im + 7;
    const char *q = strchr(path, '?');
    size_t pl = q ? (size_t)(q - path) : strlen(path);
    if (pl == 0 || pl >= sizeof r->host)
      return tdist__fail(TDIST_ERR_INVALID_ARGUMENT,
                         "file:// init: missing or too long path in "
                         "'%s'",
                         im);
    memcpy(r->host, path, pl); /* the path, for file:// */
    r->host[pl] = '\0';
    r->file = 1;
    return resolve_rank_world("file://", q ? q + 1 : NULL, o, r);
  }
  return tdist__fail(TDIST_ERR_INVALID_ARGUMENT,
                     "init_method '%s' is not supported; use env://, tcp://HOST:PORT or pass a "
                     "store",
                     im);
}

/* Creates (rank 0, outside an agent) or joins the TCP store of env:// / tcp://, or opens the
 * file store of file://. */
tdist_status_t tdist__pg_open_stores(tdist_pg_t *pg, const tdist__rdzv_t *r, int64_t timeout_ms) {
  if (r->file) {
    tdist_status_t st = tdist_file_store_create(r->host, timeout_ms, &pg->owned_store);
    pg->base_store = pg->owned_store;
    return st;
  }
  if (r->rank == 0 && !r->agent_store) {
    tdist_store_server_options_t so = TDIST_STORE_SERVER_OPTIONS_INIT;
    so.port = r->port;
    so.quiet = !tdist__log_enabled(TDIST__LOG_INFO);
    tdist_status_t st = tdist_store_server_create(&so, &pg->owned_server);
    if (st) {
      char why[TDIST__ERRMSG_MAX]; /* tdist__fail writes the buffer tdist_last_error() reads */
      snprintf(why, sizeof why, "%s", tdist_last_error());
      return tdist__fail(st, "rank 0 could not host the store on MASTER_PORT %d: %s", r->port, why);
    }
  }
  tdist_tcp_store_options_t co = TDIST_TCP_STORE_OPTIONS_INIT;
  co.host = r->host;
  co.port = r->port;
  co.connect_timeout_ms = timeout_ms;
  co.timeout_ms = timeout_ms;
  tdist_status_t st = tdist_tcp_store_connect(&co, &pg->owned_store);
  if (st) return st;
  pg->base_store = pg->owned_store;
  if (r->agent_store) {
    /* PyTorch 1.13's agent-store mode: PrefixStore("/worker/attempt_N", TCPStore). We wrap it
     * the same way so keys line up with torch workers of the same job. */
    tdist_store_t *px = NULL;
    st = tdist_prefix_store_create(pg->owned_store, r->prefix, &px);
    if (st) return st;
    pg->base_store = px;
    pg->owned_agent_prefix = px;
  }
  return TDIST_OK;
}

void tdist__pg_close_stores(tdist_pg_t *pg) {
  tdist_store_destroy(pg->b.store); /* wrappers first: they borrow what is below them */
  tdist_store_destroy(pg->owned_agent_prefix);
  tdist_store_destroy(pg->owned_store);
  tdist_store_server_destroy(pg->owned_server);
  pg->b.store = pg->owned_agent_prefix = pg->owned_store = NULL;
  pg->owned_server = NULL;
}
