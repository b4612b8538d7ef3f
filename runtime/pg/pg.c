/* Process-group lifecycle: init methods (explicit store, env://, tcp://), subgroups, argument
 * checks for every collective, the sticky-error/abort machinery and the async worker thread.
 * Never talks to peers itself: the backend does (tdist__backend_t). */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "runtime/common/clock.h"
#include "runtime/common/log.h"
#include "runtime/pg/pg_internal.h"
#include "runtime/pg/reduce.h"
#include "runtime/pg/stats.h"

#define DEFAULT_TIMEOUT_MS (30LL * 60 * 1000) /* PyTorch's default process-group timeout */

struct tdist_work_s {
  tdist_pg_t *pg;
  tdist__coll_t coll;
  int done;
  tdist_status_t status;
  int abandoned; /* destroy was called before completion: the worker frees it */
  tdist_work_t *next;
};

static void drain_async(tdist_pg_t *pg);

/* Marks the group failed; the first failure is the one every later call reports. */
static void set_sticky(tdist_pg_t *pg, tdist_status_t st) {
  int expected = 0;
  if (atomic_compare_exchange_strong(&pg->aborted, &expected, 1)) {
    pg->sticky = st;
    uint64_t one = 1;
    ssize_t w = write(pg->abort_fd, &one, sizeof one);
    (void)w;
  }
}

/* ---------------------------------------------------------------------------------------- */
/* Init methods                                                                              */

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

typedef struct {
  int rank, world;
  char host[256];
  int port;
  int agent_store; /* TORCHELASTIC_USE_AGENT_STORE=True: client only, per-attempt prefix */
  int file;        /* file://: host holds the path */
  char prefix[64];
} rdzv_t;

/* Resolves rank/world from the URL query, then the options, then RANK/WORLD_SIZE (PyTorch's
 * order), with PyTorch's messages for what is missing. */
static tdist_status_t resolve_rank_world(const char *scheme, const char *query,
                                         const tdist_pg_options_t *o, rdzv_t *r) {
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

static tdist_status_t parse_init_method(const tdist_pg_options_t *o, rdzv_t *r) {
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

/* Creates (rank 0, outside an agent) or joins the TCP store of env:// / tcp://. */
static tdist_status_t open_rdzv_store(tdist_pg_t *pg, const rdzv_t *r, int64_t timeout_ms) {
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

/* ---------------------------------------------------------------------------------------- */
/* Lifecycle                                                                                 */

static void destroy_stores(tdist_pg_t *pg) {
  tdist_store_destroy(pg->store); /* wrappers first: they borrow what is below them */
  tdist_store_destroy(pg->owned_agent_prefix);
  tdist_store_destroy(pg->owned_store);
  tdist_store_server_destroy(pg->owned_server);
  pg->store = pg->owned_agent_prefix = pg->owned_store = NULL;
  pg->owned_server = NULL;
}

static tdist_pg_t *pg_alloc(void) {
  tdist_pg_t *pg = calloc(1, sizeof *pg);
  if (!pg) return NULL;
  pg->stats_group = -1;
  pg->abort_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (pg->abort_fd < 0) {
    int e = errno;
    free(pg);
    errno = e; /* pg_alloc_fail tells ENOMEM from an eventfd failure */
    return NULL;
  }
  pthread_mutex_init(&pg->err_mu, NULL);
  pthread_mutex_init(&pg->mu, NULL);
  pthread_cond_init(&pg->cv, NULL);
  return pg;
}

static tdist_status_t pg_alloc_fail(const char *fn) {
  if (errno == ENOMEM) return tdist__fail(TDIST_ERR_NO_MEMORY, "%s: out of memory", fn);
  return tdist__fail(TDIST_ERR_SYSTEM, "%s: eventfd: %s", fn, strerror(errno));
}

static void pg_free(tdist_pg_t *pg) {
  if (pg->be && pg->be_state) pg->be->destroy(pg);
  destroy_stores(pg);
  close(pg->abort_fd);
  pthread_mutex_destroy(&pg->err_mu);
  pthread_mutex_destroy(&pg->mu);
  pthread_cond_destroy(&pg->cv);
  free(pg->name);
  free(pg->socket_ifname);
  free(pg->parent_ranks);
  pg->magic = 0;
  free(pg);
}

/* Common tail of init and new_group: prefix store, backend connect. */
static tdist_status_t pg_connect(tdist_pg_t *pg, const char *name) {
  pg->name = strdup(name);
  if (!pg->name) return tdist__fail(TDIST_ERR_NO_MEMORY, "out of memory");
  tdist_status_t st = tdist_prefix_store_create(pg->base_store, name, &pg->store);
  if (st) return st;
  tdist_store_set_timeout(pg->store, pg->timeout_ms);
  pg->magic = TDIST__PG_MAGIC;
  st = pg->be->connect(pg, tdist__now_ms() + pg->timeout_ms);
  if (st) {
    tdist__fail(st, "%s", pg->err);
    return st;
  }
  tdist__log(TDIST__LOG_DEBUG, "pg", "group '%s': rank %d of %d connected (%s)", name, pg->rank,
             pg->size, pg->be->name);
  pg->stats_group = tdist__stats_register(pg->rank, pg->size);
  return TDIST_OK;
}

TDIST_EXTERN tdist_status_t tdist_init_process_group(const tdist_pg_options_t *opts,
                                                     tdist_pg_t **out) {
  if (!out) return tdist__fail(TDIST_ERR_INVALID_ARGUMENT, "tdist_init_process_group: out is NULL");
  *out = NULL;
  if (!opts || opts->size < sizeof(tdist_pg_options_t) || opts->version < 1)
    return tdist__fail(TDIST_ERR_INVALID_ARGUMENT,
                       "tdist_init_process_group: options missing or not initialised with "
                       "TDIST_PG_OPTIONS_INIT");
  const char *backend = opts->backend ? opts->backend : "gloo";
  const tdist__backend_t *be = NULL;
  if (strcmp(backend, "gloo") == 0) {
    be = &tdist__gloo_backend;
  } else if (strcmp(backend, "nccl") == 0) {
    be = &tdist__nccl_backend;
  } else {
    return tdist__fail(TDIST_ERR_INVALID_ARGUMENT,
                       "backend '%s' is not supported; use 'gloo' or 'nccl'", backend);
  }
  if (opts->store && opts->init_method)
    return tdist__fail(TDIST_ERR_INVALID_ARGUMENT,
                       "tdist_init_process_group: give either a store or an init_method, not both");
  if (opts->timeout_ms < 0)
    return tdist__fail(TDIST_ERR_INVALID_ARGUMENT, "timeout_ms %lld must be >= 0",
                       (long long)opts->timeout_ms);
  int64_t timeout = opts->timeout_ms ? opts->timeout_ms : DEFAULT_TIMEOUT_MS;
  rdzv_t r;
  memset(&r, 0, sizeof r);
  if (opts->store) {
    if (opts->rank < 0 || opts->world_size <= 0)
      return tdist__fail(TDIST_ERR_INVALID_ARGUMENT,
                         "tdist_init_process_group: with an explicit store, rank (%d) and "
                         "world_size (%d) must be given",
                         opts->rank, opts->world_size);
    r.rank = opts->rank;
    r.world = opts->world_size;
  } else {
    tdist_status_t st = parse_init_method(opts, &r);
    if (st) return st;
  }
  if (r.rank >= r.world)
    return tdist__fail(TDIST_ERR_INVALID_ARGUMENT,
                       "rank %d is out of range for world_size %d (ranks are 0..%d)", r.rank,
                       r.world, r.world - 1);
  tdist_pg_t *pg = pg_alloc();
  if (!pg) return pg_alloc_fail("tdist_init_process_group");
  pg->rank = r.rank;
  pg->size = r.world;
  pg->timeout_ms = timeout;
  pg->be = be;
  tdist_status_t st = TDIST_OK;
  if (opts->socket_ifname && !(pg->socket_ifname = strdup(opts->socket_ifname)))
    st = tdist__fail(TDIST_ERR_NO_MEMORY, "tdist_init_process_group: out of memory");
  if (st == TDIST_OK && opts->store) {
    pg->base_store = opts->store;
  } else if (st == TDIST_OK) {
    st = open_rdzv_store(pg, &r, timeout);
  }
  if (st == TDIST_OK) st = pg_connect(pg, opts->group_name ? opts->group_name : "default_pg");
  if (st) {
    char msg[TDIST__ERRMSG_MAX];
    snprintf(msg, sizeof msg, "%s", tdist_last_error());
    pg_free(pg);
    return tdist__fail(st, "%s", msg);
  }
  *out = pg;
  return TDIST_OK;
}

TDIST_EXTERN tdist_status_t tdist_new_group(tdist_pg_t *parent, const int *ranks, int nranks,
                                            tdist_pg_t **out) {
  if (!out) return tdist__fail(TDIST_ERR_INVALID_ARGUMENT, "tdist_new_group: out is NULL");
  *out = NULL;
  if (!parent || parent->magic != TDIST__PG_MAGIC)
    return tdist__fail(TDIST_ERR_INVALID_ARGUMENT,
                       "tdist_new_group: parent group is NULL or freed");
  if (!ranks || nranks <= 0 || nranks > parent->size)
    return tdist__fail(TDIST_ERR_INVALID_ARGUMENT,
                       "tdist_new_group: ranks must list 1..%d ranks of the parent", parent->size);
  int me = -1;
  for (int i = 0; i < nranks; i++) {
    if (ranks[i] < 0 || ranks[i] >= parent->size || (i && ranks[i] <= ranks[i - 1]))
      return tdist__fail(TDIST_ERR_INVALID_ARGUMENT,
                         "tdist_new_group: ranks must be strictly increasing parent ranks in "
                         "0..%d (bad entry %d at index %d)",
                         parent->size - 1, ranks[i], i);
    if (ranks[i] == parent->rank) me = i;
  }
  /* Every parent rank counts the subgroup, members or not, so names stay in step. */
  int id = ++parent->subgroups;
  if (parent->be->skip_group) {
    /* The backend derives the subgroup from the parent's communicator, collectively: the
     * parent's queued work must reach the communicator first. */
    drain_async(parent);
    if (me < 0) {
      tdist_status_t st = parent->be->skip_group(parent, tdist__now_ms() + parent->timeout_ms);
      return st ? tdist__fail(st, "tdist_new_group: %s", parent->err) : TDIST_OK;
    }
  }
  if (me < 0) return TDIST_OK;
  if (atomic_load(&parent->aborted))
    return tdist__fail(parent->sticky, "tdist_new_group: parent group is aborted: %s", parent->err);
  tdist_pg_t *pg = pg_alloc();
  if (!pg) return pg_alloc_fail("tdist_new_group");
  pg->rank = me;
  pg->size = nranks;
  pg->timeout_ms = parent->timeout_ms;
  pg->be = parent->be;
  pg->base_store = parent->base_store;
  if (parent->socket_ifname) pg->socket_ifname = strdup(parent->socket_ifname);
  pg->parent_ranks = malloc(sizeof(int) * (size_t)nranks);
  if (pg->parent_ranks) memcpy(pg->parent_ranks, ranks, sizeof(int) * (size_t)nranks);
  char name[512];
  snprintf(name, sizeof name, "%s/%d", parent->name, id);
  pg->parent = parent; /* for the backend's connect only */
  tdist_status_t st = pg->parent_ranks ? pg_connect(pg, name) : TDIST_ERR_NO_MEMORY;
  pg->parent = NULL;
  if (st) {
    char msg[TDIST__ERRMSG_MAX];
    snprintf(msg, sizeof msg, "%s", tdist_last_error());
    pg_free(pg);
    return tdist__fail(st, "tdist_new_group: %s", msg);
  }
  *out = pg;
  return TDIST_OK;
}

TDIST_EXTERN int tdist_pg_rank(const tdist_pg_t *pg) {
  return pg && pg->magic == TDIST__PG_MAGIC ? pg->rank : -1;
}
TDIST_EXTERN int tdist_pg_size(const tdist_pg_t *pg) {
  return pg && pg->magic == TDIST__PG_MAGIC ? pg->size : -1;
}
TDIST_EXTERN const char *tdist_pg_backend(const tdist_pg_t *pg) {
  return pg && pg->magic == TDIST__PG_MAGIC ? pg->be->name : "";
}
TDIST_EXTERN int tdist_pg_device(const tdist_pg_t *pg) {
  return pg && pg->magic == TDIST__PG_MAGIC && pg->be->device ? pg->be->device(pg) : -1;
}
TDIST_EXTERN const char *tdist_pg_last_error(const tdist_pg_t *pg) {
  return pg && pg->magic == TDIST__PG_MAGIC ? pg->err : "invalid process group handle";
}

TDIST_EXTERN void tdist_pg_abort(tdist_pg_t *pg) {
  if (!pg || pg->magic != TDIST__PG_MAGIC) return;
  if (!atomic_load(&pg->aborted)) {
    tdist__pg_fail(pg, TDIST_ERR_ABORTED, "process group '%s' was aborted (tdist_pg_abort)",
                   pg->name);
    set_sticky(pg, TDIST_ERR_ABORTED);
  }
}

static void stop_worker(tdist_pg_t *pg) {
  pthread_mutex_lock(&pg->mu);
  int started = pg->worker_started;
  pg->stopping = 1;
  pthread_cond_broadcast(&pg->cv);
  pthread_mutex_unlock(&pg->mu);
  if (started) pthread_join(pg->worker, NULL);
  pg->worker_started = 0;
}

TDIST_EXTERN tdist_status_t tdist_pg_finalize(tdist_pg_t *pg) {
  if (!pg || pg->magic != TDIST__PG_MAGIC)
    return tdist__fail(TDIST_ERR_INVALID_ARGUMENT, "tdist_pg_finalize: invalid group handle");
  stop_worker(pg); /* drains the queue first */
  if (pg->be_state) pg->be->destroy(pg);
  return atomic_load(&pg->aborted) ? pg->sticky : TDIST_OK;
}

TDIST_EXTERN void tdist_pg_destroy(tdist_pg_t *pg) {
  if (!pg || pg->magic != TDIST__PG_MAGIC) return;
  if (pg->worker_started) {
    /* Queued work must not wait for peers that may be gone: abort, then drain. */
    pthread_mutex_lock(&pg->mu);
    int busy = pg->qhead != NULL || pg->running;
    pthread_mutex_unlock(&pg->mu);
    if (busy) tdist_pg_abort(pg);
  }
  stop_worker(pg);
  pg_free(pg);
}

/* ---------------------------------------------------------------------------------------- */
/* Running collectives                                                                       */

static tdist_status_t run_coll(tdist_pg_t *pg, tdist__coll_t *c) {
  if (atomic_load(&pg->aborted))
    return tdist__fail(pg->sticky, "%s: process group is aborted after an earlier failure: %s",
                       tdist__coll_name(c->kind), pg->err);
  int64_t now = tdist__now_ns(); /* one clock reading for the deadline and the statistics */
  int64_t deadline = now / 1000000 + pg->timeout_ms;
  tdist__stats_op_t sop;
  tdist__stats_begin(pg->stats_group, pg->size, c, now, &sop);
  tdist_status_t st = pg->be->run(pg, c, deadline);
  tdist__stats_end(pg->stats_group, c, &sop, st);
  if (st) {
    if (!atomic_load(&pg->aborted)) set_sticky(pg, st);
    tdist__fail(st, "%s", pg->err);
  }
  return st;
}

/* Owned arrays are one allocation starting at `counts`. */
static void free_coll_arrays(tdist__coll_t *c) {
  if (c->owned_arrays) free(c->counts);
  c->owned_arrays = 0;
}

static void *worker_main(void *arg) {
  tdist_pg_t *pg = arg;
  pthread_mutex_lock(&pg->mu);
  for (;;) {
    while (!pg->qhead && !pg->stopping) pthread_cond_wait(&pg->cv, &pg->mu);
    if (!pg->qhead) break; /* stopping and drained */
    tdist_work_t *w = pg->qhead;
    pg->qhead = w->next;
    if (!pg->qhead) pg->qtail = NULL;
    pg->running = 1; /* drain_async and destroy must see work that left the queue */
    pthread_mutex_unlock(&pg->mu);
    tdist_status_t st = run_coll(pg, &w->coll);
    pthread_mutex_lock(&pg->mu);
    pg->running = 0;
    w->status = st;
    w->done = 1;
    if (w->abandoned) {
      free_coll_arrays(&w->coll);
      free(w);
    }
    pthread_cond_broadcast(&pg->cv);
  }
  pthread_mutex_unlock(&pg->mu);
  return NULL;
}

static tdist_status_t submit(tdist_pg_t *pg, const tdist__coll_t *c, tdist_work_t **work) {
  tdist_work_t *w = calloc(1, sizeof *w);
  if (!w) return tdist__pg_fail(pg, TDIST_ERR_NO_MEMORY, "async submit: out of memory");
  w->pg = pg;
  w->coll = *c;
  pthread_mutex_lock(&pg->mu);
  if (!pg->worker_started) {
    if (pthread_create(&pg->worker, NULL, worker_main, pg) != 0) {
      pthread_mutex_unlock(&pg->mu);
      free(w);
      return tdist__pg_fail(pg, TDIST_ERR_SYSTEM, "async submit: cannot start worker thread");
    }
    pg->worker_started = 1;
  }
  w->coll.seq = ++pg->seq;
  if (pg->qtail)
    pg->qtail->next = w;
  else
    pg->qhead = w;
  pg->qtail = w;
  pthread_cond_broadcast(&pg->cv);
  pthread_mutex_unlock(&pg->mu);
  *work = w;
  return TDIST_OK;
}

/* Waits for every queued async op, so blocking calls keep the group's order. */
static void drain_async(tdist_pg_t *pg) {
  if (!pg->worker_started) return;
  pthread_mutex_lock(&pg->mu);
  while (pg->qhead || pg->running) pthread_cond_wait(&pg->cv, &pg->mu);
  pthread_mutex_unlock(&pg->mu);
}

TDIST_EXTERN tdist_status_t tdist_work_wait(tdist_work_t *w, int64_t timeout_ms) {
  if (!w) return tdist__fail(TDIST_ERR_INVALID_ARGUMENT, "tdist_work_wait: work is NULL");
  tdist_pg_t *pg = w->pg;
  int64_t to = timeout_ms < 0 ? pg->timeout_ms : timeout_ms;
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  ts.tv_sec += to / 1000;
  ts.tv_nsec += (to % 1000) * 1000000;
  if (ts.tv_nsec >= 1000000000) {
    ts.tv_sec++;
    ts.tv_nsec -= 1000000000;
  }
  pthread_mutex_lock(&pg->mu);
  while (!w->done) {
    if (pthread_cond_timedwait(&pg->cv, &pg->mu, &ts) == ETIMEDOUT && !w->done) {
      pthread_mutex_unlock(&pg->mu);
      return tdist__fail(TDIST_ERR_TIMEOUT, "%s #%llu still running after %lld ms",
                         tdist__coll_name(w->coll.kind), (unsigned long long)w->coll.seq,
                         (long long)to);
    }
  }
  tdist_status_t st = w->status;
  pthread_mutex_unlock(&pg->mu);
  if (st) tdist__fail(st, "%s", pg->err);
  return st;
}

TDIST_EXTERN tdist_status_t tdist_work_test(tdist_work_t *w, int *done) {
  if (!w || !done) return tdist__fail(TDIST_ERR_INVALID_ARGUMENT, "tdist_work_test: NULL argument");
  pthread_mutex_lock(&w->pg->mu);
  *done = w->done;
  tdist_status_t st = w->done ? w->status : TDIST_OK;
  pthread_mutex_unlock(&w->pg->mu);
  return st;
}

TDIST_EXTERN void tdist_work_destroy(tdist_work_t *w) {
  if (!w) return;
  tdist_pg_t *pg = w->pg;
  pthread_mutex_lock(&pg->mu);
  if (!w->done) {
    w->abandoned = 1; /* the worker frees it when it finishes */
    pthread_mutex_unlock(&pg->mu);
    return;
  }
  pthread_mutex_unlock(&pg->mu);
  free_coll_arrays(&w->coll);
  free(w);
}

/* ---------------------------------------------------------------------------------------- */
/* Argument checks and public collectives                                                    */

#define PG_ENTRY(pg, fn)                                                                     \
  do {                                                                                       \
    if (!(pg) || (pg)->magic != TDIST__PG_MAGIC)                                             \
      return tdist__fail(TDIST_ERR_INVALID_ARGUMENT, fn ": process group is NULL or freed"); \
  } while (0)

static tdist_status_t check_dtype(tdist_pg_t *pg, const char *fn, tdist_dtype_t dt) {
  if ((unsigned)dt >= TDIST_DTYPE_COUNT_)
    return tdist__pg_fail(pg, TDIST_ERR_INVALID_ARGUMENT, "%s: unknown dtype %d", fn, (int)dt);
  return TDIST_OK;
}

static tdist_status_t check_op(tdist_pg_t *pg, const char *fn, tdist_dtype_t dt,
                               tdist_reduce_op_t op) {
  tdist_status_t st = check_dtype(pg, fn, dt);
  if (st) return st;
  if ((unsigned)op >= TDIST_REDUCE_OP_COUNT_)
    return tdist__pg_fail(pg, TDIST_ERR_INVALID_ARGUMENT, "%s: unknown reduce op %d", fn, (int)op);
  if (!tdist__op_valid(dt, op))
    return tdist__pg_fail(pg, TDIST_ERR_INVALID_ARGUMENT, "%s: op %s is not defined for dtype %s",
                          fn, tdist_reduce_op_name(op), tdist_dtype_name(dt));
  return TDIST_OK;
}

static tdist_status_t check_root(tdist_pg_t *pg, const char *fn, int root) {
  if (root < 0 || root >= pg->size)
    return tdist__pg_fail(pg, TDIST_ERR_INVALID_ARGUMENT,
                          "%s: root %d is not a rank of this "
                          "group (0..%d)",
                          fn, root, pg->size - 1);
  return TDIST_OK;
}

static tdist_status_t check_buf(tdist_pg_t *pg, const char *fn, const void *p, size_t count,
                                const char *what) {
  if (!p && count)
    return tdist__pg_fail(pg, TDIST_ERR_INVALID_ARGUMENT, "%s: %s is NULL with count %zu", fn, what,
                          count);
  if (count > (SIZE_MAX / 16) / (size_t)pg->size)
    return tdist__pg_fail(pg, TDIST_ERR_INVALID_ARGUMENT, "%s: count %zu is too large", fn, count);
  return TDIST_OK;
}

/* Runs now (blocking form) or queues (async form, work != NULL). */
static tdist_status_t dispatch(tdist_pg_t *pg, tdist__coll_t *c, tdist_work_t **work) {
  if (pg->be->check && !atomic_load(&pg->aborted)) {
    tdist_status_t st = pg->be->check(pg, c); /* what the backend cannot run; group unharmed */
    if (st) return tdist__fail(st, "%s", pg->err);
  }
  if (work) return submit(pg, c, work);
  drain_async(pg);
  c->seq = ++pg->seq;
  return run_coll(pg, c);
}

#define TRY(x)                         \
  do {                                 \
    tdist_status_t st_ = (x);          \
    if (st_) {                         \
      tdist__fail(st_, "%s", pg->err); \
      return st_;                      \
    }                                  \
  } while (0)

static tdist_status_t all_reduce(tdist_pg_t *pg, void *buf, size_t count, tdist_dtype_t dt,
                                 tdist_reduce_op_t op, tdist_work_t **work) {
  TRY(check_op(pg, "all_reduce", dt, op));
  TRY(check_buf(pg, "all_reduce", buf, count, "buf"));
  tdist__coll_t c = {
      .kind = TDIST__COLL_ALL_REDUCE, .out = buf, .count = count, .dtype = dt, .op = op};
  return dispatch(pg, &c, work);
}

TDIST_EXTERN tdist_status_t tdist_all_reduce(tdist_pg_t *pg, void *buf, size_t count,
                                             tdist_dtype_t dt, tdist_reduce_op_t op) {
  PG_ENTRY(pg, "tdist_all_reduce");
  return all_reduce(pg, buf, count, dt, op, NULL);
}
TDIST_EXTERN tdist_status_t tdist_all_reduce_async(tdist_pg_t *pg, void *buf, size_t count,
                                                   tdist_dtype_t dt, tdist_reduce_op_t op,
                                                   tdist_work_t **work) {
  PG_ENTRY(pg, "tdist_all_reduce_async");
  if (!work) return tdist__fail(TDIST_ERR_INVALID_ARGUMENT, "tdist_all_reduce_async: work is NULL");
  return all_reduce(pg, buf, count, dt, op, work);
}

static tdist_status_t broadcast(tdist_pg_t *pg, void *buf, size_t count, tdist_dtype_t dt, int root,
                                tdist_work_t **work) {
  TRY(check_dtype(pg, "broadcast", dt));
  TRY(check_root(pg, "broadcast", root));
  TRY(check_buf(pg, "broadcast", buf, count, "buf"));
  tdist__coll_t c = {
      .kind = TDIST__COLL_BROADCAST, .out = buf, .count = count, .dtype = dt, .root = root};
  return dispatch(pg, &c, work);
}
TDIST_EXTERN tdist_status_t tdist_broadcast(tdist_pg_t *pg, void *buf, size_t count,
                                            tdist_dtype_t dt, int root) {
  PG_ENTRY(pg, "tdist_broadcast");
  return broadcast(pg, buf, count, dt, root, NULL);
}
TDIST_EXTERN tdist_status_t tdist_broadcast_async(tdist_pg_t *pg, void *buf, size_t count,
                                                  tdist_dtype_t dt, int root, tdist_work_t **work) {
  PG_ENTRY(pg, "tdist_broadcast_async");
  if (!work) return tdist__fail(TDIST_ERR_INVALID_ARGUMENT, "tdist_broadcast_async: work is NULL");
  return broadcast(pg, buf, count, dt, root, work);
}

static tdist_status_t reduce_impl(tdist_pg_t *pg, void *buf, size_t count, tdist_dtype_t dt,
                                  tdist_reduce_op_t op, int root, tdist_work_t **work) {
  TRY(check_op(pg, "reduce", dt, op));
  TRY(check_root(pg, "reduce", root));
  TRY(check_buf(pg, "reduce", buf, count, "buf"));
  tdist__coll_t c = {
      .kind = TDIST__COLL_REDUCE, .out = buf, .count = count, .dtype = dt, .op = op, .root = root};
  return dispatch(pg, &c, work);
}
TDIST_EXTERN tdist_status_t tdist_reduce(tdist_pg_t *pg, void *buf, size_t count, tdist_dtype_t dt,
                                         tdist_reduce_op_t op, int root) {
  PG_ENTRY(pg, "tdist_reduce");
  return reduce_impl(pg, buf, count, dt, op, root, NULL);
}
TDIST_EXTERN tdist_status_t tdist_reduce_async(tdist_pg_t *pg, void *buf, size_t count,
                                               tdist_dtype_t dt, tdist_reduce_op_t op, int root,
                                               tdist_work_t **work) {
  PG_ENTRY(pg, "tdist_reduce_async");
  if (!work) return tdist__fail(TDIST_ERR_INVALID_ARGUMENT, "tdist_reduce_async: work is NULL");
  return reduce_impl(pg, buf, count, dt, op, root, work);
}

/* Uniform all_gather as all_gather_v with counts = count, displs = r * count. */
static tdist_status_t all_gather(tdist_pg_t *pg, void *out, const void *in, size_t count,
                                 tdist_dtype_t dt, tdist_work_t **work) {
  TRY(check_dtype(pg, "all_gather", dt));
  TRY(check_buf(pg, "all_gather", out, count, "out"));
  TRY(check_buf(pg, "all_gather", in, count, "in"));
  size_t n = (size_t)pg->size;
  size_t *counts = malloc(2 * n * sizeof *counts), *displs = counts + n;
  if (!counts) return tdist__pg_fail(pg, TDIST_ERR_NO_MEMORY, "all_gather: out of memory");
  for (size_t r = 0; r < n; r++) {
    counts[r] = count;
    displs[r] = r * count;
  }
  tdist__coll_t c = {.kind = TDIST__COLL_ALL_GATHER_V,
                     .out = out,
                     .in = in,
                     .count = count,
                     .dtype = dt,
                     .counts = counts,
                     .displs = displs,
                     .owned_arrays = 1};
  tdist_status_t st = dispatch(pg, &c, work);
  if (!work || st) free_coll_arrays(&c);
  return st;
}
TDIST_EXTERN tdist_status_t tdist_all_gather(tdist_pg_t *pg, void *out, const void *in,
                                             size_t count, tdist_dtype_t dt) {
  PG_ENTRY(pg, "tdist_all_gather");
  return all_gather(pg, out, in, count, dt, NULL);
}
TDIST_EXTERN tdist_status_t tdist_all_gather_async(tdist_pg_t *pg, void *out, const void *in,
                                                   size_t count, tdist_dtype_t dt,
                                                   tdist_work_t **work) {
  PG_ENTRY(pg, "tdist_all_gather_async");
  if (!work) return tdist__fail(TDIST_ERR_INVALID_ARGUMENT, "tdist_all_gather_async: work is NULL");
  return all_gather(pg, out, in, count, dt, work);
}

/* Copies n-element arrays into one owned block (async calls must not borrow the caller's). */
static size_t *copy_arrays(const size_t *const *arrs, int k, size_t n) {
  size_t *b = malloc((size_t)k * n * sizeof *b);
  if (b)
    for (int i = 0; i < k; i++) memcpy(b + (size_t)i * n, arrs[i], n * sizeof *b);
  return b;
}

static tdist_status_t all_gather_v_impl(tdist_pg_t *pg, void *out, const size_t *counts,
                                        const size_t *displs, const void *in, tdist_dtype_t dt,
                                        tdist_work_t **work) {
  TRY(check_dtype(pg, "all_gather_v", dt));
  if (!counts || !displs)
    TRY(tdist__pg_fail(pg, TDIST_ERR_INVALID_ARGUMENT, "all_gather_v: counts or displs is NULL"));
  TRY(check_buf(pg, "all_gather_v", in, counts[pg->rank], "in"));
  for (int r = 0; r < pg->size; r++) TRY(check_buf(pg, "all_gather_v", out, counts[r], "out"));
  tdist__coll_t c = {.kind = TDIST__COLL_ALL_GATHER_V,
                     .out = out,
                     .in = in,
                     .count = counts[pg->rank],
                     .dtype = dt,
                     .counts = (size_t *)counts,
                     .displs = (size_t *)displs};
  if (!work) return dispatch(pg, &c, NULL);
  const size_t *arrs[2] = {counts, displs};
  if (!(c.counts = copy_arrays(arrs, 2, (size_t)pg->size)))
    return tdist__pg_fail(pg, TDIST_ERR_NO_MEMORY, "all_gather_v: out of memory");
  c.displs = c.counts + pg->size;
  c.owned_arrays = 1;
  tdist_status_t st = dispatch(pg, &c, work);
  if (st) free_coll_arrays(&c);
  return st;
}
TDIST_EXTERN tdist_status_t tdist_all_gather_v(tdist_pg_t *pg, void *out, const size_t *counts,
                                               const size_t *displs, const void *in,
                                               tdist_dtype_t dt) {
  PG_ENTRY(pg, "tdist_all_gather_v");
  return all_gather_v_impl(pg, out, counts, displs, in, dt, NULL);
}
TDIST_EXTERN tdist_status_t tdist_all_gather_v_async(tdist_pg_t *pg, void *out,
                                                     const size_t *counts, const size_t *displs,
                                                     const void *in, tdist_dtype_t dt,
                                                     tdist_work_t **work) {
  PG_ENTRY(pg, "tdist_all_gather_v_async");
  if (!work)
    return tdist__fail(TDIST_ERR_INVALID_ARGUMENT, "tdist_all_gather_v_async: work is NULL");
  return all_gather_v_impl(pg, out, counts, displs, in, dt, work);
}

static tdist_status_t gather_impl(tdist_pg_t *pg, void *out, const void *in, size_t count,
                                  tdist_dtype_t dt, int root, tdist_work_t **work) {
  TRY(check_dtype(pg, "gather", dt));
  TRY(check_root(pg, "gather", root));
  TRY(check_buf(pg, "gather", in, count, "in"));
  if (pg->rank == root) TRY(check_buf(pg, "gather", out, count, "out (on root)"));
  tdist__coll_t c = {
      .kind = TDIST__COLL_GATHER, .out = out, .in = in, .count = count, .dtype = dt, .root = root};
  return dispatch(pg, &c, work);
}
TDIST_EXTERN tdist_status_t tdist_gather(tdist_pg_t *pg, void *out, const void *in, size_t count,
                                         tdist_dtype_t dt, int root) {
  PG_ENTRY(pg, "tdist_gather");
  return gather_impl(pg, out, in, count, dt, root, NULL);
}
TDIST_EXTERN tdist_status_t tdist_gather_async(tdist_pg_t *pg, void *out, const void *in,
                                               size_t count, tdist_dtype_t dt, int root,
                                               tdist_work_t **work) {
  PG_ENTRY(pg, "tdist_gather_async");
  if (!work) return tdist__fail(TDIST_ERR_INVALID_ARGUMENT, "tdist_gather_async: work is NULL");
  return gather_impl(pg, out, in, count, dt, root, work);
}

static tdist_status_t scatter_impl(tdist_pg_t *pg, void *out, const void *in, size_t count,
                                   tdist_dtype_t dt, int root, tdist_work_t **work) {
  TRY(check_dtype(pg, "scatter", dt));
  TRY(check_root(pg, "scatter", root));
  TRY(check_buf(pg, "scatter", out, count, "out"));
  if (pg->rank == root) TRY(check_buf(pg, "scatter", in, count, "in (on root)"));
  tdist__coll_t c = {
      .kind = TDIST__COLL_SCATTER, .out = out, .in = in, .count = count, .dtype = dt, .root = root};
  return dispatch(pg, &c, work);
}
TDIST_EXTERN tdist_status_t tdist_scatter(tdist_pg_t *pg, void *out, const void *in, size_t count,
                                          tdist_dtype_t dt, int root) {
  PG_ENTRY(pg, "tdist_scatter");
  return scatter_impl(pg, out, in, count, dt, root, NULL);
}
TDIST_EXTERN tdist_status_t tdist_scatter_async(tdist_pg_t *pg, void *out, const void *in,
                                                size_t count, tdist_dtype_t dt, int root,
                                                tdist_work_t **work) {
  PG_ENTRY(pg, "tdist_scatter_async");
  if (!work) return tdist__fail(TDIST_ERR_INVALID_ARGUMENT, "tdist_scatter_async: work is NULL");
  return scatter_impl(pg, out, in, count, dt, root, work);
}

static tdist_status_t reduce_scatter(tdist_pg_t *pg, void *out, const void *in, size_t count,
                                     tdist_dtype_t dt, tdist_reduce_op_t op, tdist_work_t **work) {
  TRY(check_op(pg, "reduce_scatter", dt, op));
  TRY(check_buf(pg, "reduce_scatter", out, count, "out"));
  TRY(check_buf(pg, "reduce_scatter", in, count, "in"));
  tdist__coll_t c = {.kind = TDIST__COLL_REDUCE_SCATTER,
                     .out = out,
                     .in = in,
                     .count = count,
                     .dtype = dt,
                     .op = op};
  return dispatch(pg, &c, work);
}
TDIST_EXTERN tdist_status_t tdist_reduce_scatter(tdist_pg_t *pg, void *out, const void *in,
                                                 size_t count, tdist_dtype_t dt,
                                                 tdist_reduce_op_t op) {
  PG_ENTRY(pg, "tdist_reduce_scatter");
  return reduce_scatter(pg, out, in, count, dt, op, NULL);
}
TDIST_EXTERN tdist_status_t tdist_reduce_scatter_async(tdist_pg_t *pg, void *out, const void *in,
                                                       size_t count, tdist_dtype_t dt,
                                                       tdist_reduce_op_t op, tdist_work_t **work) {
  PG_ENTRY(pg, "tdist_reduce_scatter_async");
  if (!work)
    return tdist__fail(TDIST_ERR_INVALID_ARGUMENT, "tdist_reduce_scatter_async: work is NULL");
  return reduce_scatter(pg, out, in, count, dt, op, work);
}

static tdist_status_t all_to_all(tdist_pg_t *pg, void *out, const void *in, size_t count,
                                 tdist_dtype_t dt, tdist_work_t **work) {
  TRY(check_dtype(pg, "all_to_all", dt));
  TRY(check_buf(pg, "all_to_all", out, count, "out"));
  TRY(check_buf(pg, "all_to_all", in, count, "in"));
  size_t n = (size_t)pg->size;
  size_t *a = malloc(4 * n * sizeof *a);
  if (!a) return tdist__pg_fail(pg, TDIST_ERR_NO_MEMORY, "all_to_all: out of memory");
  for (size_t r = 0; r < n; r++) {
    a[r] = a[2 * n + r] = count;
    a[n + r] = a[3 * n + r] = r * count;
  }
  tdist__coll_t c = {.kind = TDIST__COLL_ALL_TO_ALL_V,
                     .out = out,
                     .in = in,
                     .count = count,
                     .dtype = dt,
                     .counts = a,
                     .displs = a + n,
                     .in_counts = a + 2 * n,
                     .in_displs = a + 3 * n};
  c.owned_arrays = 1;
  tdist_status_t st = dispatch(pg, &c, work);
  if (!work || st) free_coll_arrays(&c);
  return st;
}
TDIST_EXTERN tdist_status_t tdist_all_to_all(tdist_pg_t *pg, void *out, const void *in,
                                             size_t count, tdist_dtype_t dt) {
  PG_ENTRY(pg, "tdist_all_to_all");
  return all_to_all(pg, out, in, count, dt, NULL);
}
TDIST_EXTERN tdist_status_t tdist_all_to_all_async(tdist_pg_t *pg, void *out, const void *in,
                                                   size_t count, tdist_dtype_t dt,
                                                   tdist_work_t **work) {
  PG_ENTRY(pg, "tdist_all_to_all_async");
  if (!work) return tdist__fail(TDIST_ERR_INVALID_ARGUMENT, "tdist_all_to_all_async: work is NULL");
  return all_to_all(pg, out, in, count, dt, work);
}

static tdist_status_t all_to_all_v_impl(tdist_pg_t *pg, void *out, const size_t *out_counts,
                                        const size_t *out_displs, const void *in,
                                        const size_t *in_counts, const size_t *in_displs,
                                        tdist_dtype_t dt, tdist_work_t **work) {
  TRY(check_dtype(pg, "all_to_all_v", dt));
  if (!out_counts || !out_displs || !in_counts || !in_displs)
    TRY(tdist__pg_fail(pg, TDIST_ERR_INVALID_ARGUMENT,
                       "all_to_all_v: a counts/displs array is NULL"));
  for (int r = 0; r < pg->size; r++) {
    TRY(check_buf(pg, "all_to_all_v", out, out_counts[r], "out"));
    TRY(check_buf(pg, "all_to_all_v", in, in_counts[r], "in"));
  }
  tdist__coll_t c = {.kind = TDIST__COLL_ALL_TO_ALL_V,
                     .out = out,
                     .in = in,
                     .dtype = dt,
                     .counts = (size_t *)out_counts,
                     .displs = (size_t *)out_displs,
                     .in_counts = (size_t *)in_counts,
                     .in_displs = (size_t *)in_displs};
  if (!work) return dispatch(pg, &c, NULL);
  const size_t *arrs[4] = {out_counts, out_displs, in_counts, in_displs};
  size_t n = (size_t)pg->size;
  if (!(c.counts = copy_arrays(arrs, 4, n)))
    return tdist__pg_fail(pg, TDIST_ERR_NO_MEMORY, "all_to_all_v: out of memory");
  c.displs = c.counts + n;
  c.in_counts = c.counts + 2 * n;
  c.in_displs = c.counts + 3 * n;
  c.owned_arrays = 1;
  tdist_status_t st = dispatch(pg, &c, work);
  if (st) free_coll_arrays(&c);
  return st;
}
TDIST_EXTERN tdist_status_t tdist_all_to_all_v(tdist_pg_t *pg, void *out, const size_t *out_counts,
                                               const size_t *out_displs, const void *in,
                                               const size_t *in_counts, const size_t *in_displs,
                                               tdist_dtype_t dt) {
  PG_ENTRY(pg, "tdist_all_to_all_v");
  return all_to_all_v_impl(pg, out, out_counts, out_displs, in, in_counts, in_displs, dt, NULL);
}
TDIST_EXTERN tdist_status_t tdist_all_to_all_v_async(
    tdist_pg_t *pg, void *out, const size_t *out_counts, const size_t *out_displs, const void *in,
    const size_t *in_counts, const size_t *in_displs, tdist_dtype_t dt, tdist_work_t **work) {
  PG_ENTRY(pg, "tdist_all_to_all_v_async");
  if (!work)
    return tdist__fail(TDIST_ERR_INVALID_ARGUMENT, "tdist_all_to_all_v_async: work is NULL");
  return all_to_all_v_impl(pg, out, out_counts, out_displs, in, in_counts, in_displs, dt, work);
}

TDIST_EXTERN tdist_status_t tdist_barrier(tdist_pg_t *pg) {
  PG_ENTRY(pg, "tdist_barrier");
  tdist__coll_t c = {.kind = TDIST__COLL_BARRIER};
  return dispatch(pg, &c, NULL);
}
TDIST_EXTERN tdist_status_t tdist_barrier_async(tdist_pg_t *pg, tdist_work_t **work) {
  PG_ENTRY(pg, "tdist_barrier_async");
  if (!work) return tdist__fail(TDIST_ERR_INVALID_ARGUMENT, "tdist_barrier_async: work is NULL");
  tdist__coll_t c = {.kind = TDIST__COLL_BARRIER};
  return dispatch(pg, &c, work);
}

TDIST_EXTERN tdist_status_t tdist_monitored_barrier(tdist_pg_t *pg, int64_t timeout_ms) {
  PG_ENTRY(pg, "tdist_monitored_barrier");
  tdist__coll_t c = {.kind = TDIST__COLL_MONITORED_BARRIER,
                     .timeout_ms = timeout_ms > 0 ? timeout_ms : pg->timeout_ms};
  return dispatch(pg, &c, NULL);
}

static tdist_status_t p2p(tdist_pg_t *pg, tdist__coll_kind_t kind, void *buf, size_t count,
                          tdist_dtype_t dt, int peer, int tag, tdist_work_t **work) {
  const char *fn = tdist__coll_name(kind);
  TRY(check_dtype(pg, fn, dt));
  TRY(check_buf(pg, fn, buf, count, "buf"));
  if (peer < 0 || peer >= pg->size || peer == pg->rank)
    TRY(tdist__pg_fail(pg, TDIST_ERR_INVALID_ARGUMENT,
                       "%s: peer %d is not another rank of this "
                       "group (0..%d, this is %d)",
                       fn, peer, pg->size - 1, pg->rank));
  if (tag < 0)
    TRY(tdist__pg_fail(pg, TDIST_ERR_INVALID_ARGUMENT, "%s: tag %d must be >= 0", fn, tag));
  tdist__coll_t c = {
      .kind = kind, .out = buf, .in = buf, .count = count, .dtype = dt, .peer = peer, .tag = tag};
  return dispatch(pg, &c, work);
}
TDIST_EXTERN tdist_status_t tdist_send(tdist_pg_t *pg, const void *buf, size_t count,
                                       tdist_dtype_t dt, int dst, int tag) {
  PG_ENTRY(pg, "tdist_send");
  return p2p(pg, TDIST__COLL_SEND, (void *)buf, count, dt, dst, tag, NULL);
}
TDIST_EXTERN tdist_status_t tdist_send_async(tdist_pg_t *pg, const void *buf, size_t count,
                                             tdist_dtype_t dt, int dst, int tag,
                                             tdist_work_t **work) {
  PG_ENTRY(pg, "tdist_send_async");
  if (!work) return tdist__fail(TDIST_ERR_INVALID_ARGUMENT, "tdist_send_async: work is NULL");
  return p2p(pg, TDIST__COLL_SEND, (void *)buf, count, dt, dst, tag, work);
}
TDIST_EXTERN tdist_status_t tdist_recv(tdist_pg_t *pg, void *buf, size_t count, tdist_dtype_t dt,
                                       int src, int tag) {
  PG_ENTRY(pg, "tdist_recv");
  return p2p(pg, TDIST__COLL_RECV, buf, count, dt, src, tag, NULL);
}
TDIST_EXTERN tdist_status_t tdist_recv_async(tdist_pg_t *pg, void *buf, size_t count,
                                             tdist_dtype_t dt, int src, int tag,
                                             tdist_work_t **work) {
  PG_ENTRY(pg, "tdist_recv_async");
  if (!work) return tdist__fail(TDIST_ERR_INVALID_ARGUMENT, "tdist_recv_async: work is NULL");
  return p2p(pg, TDIST__COLL_RECV, buf, count, dt, src, tag, work);
}
