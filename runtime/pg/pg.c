/* Process-group lifecycle: tdist_init_process_group (an explicit store or an init method,
 * init.c), tdist_new_group, the accessors, abort and the sticky error, finalize and destroy. The
 * pieces: init.c finds the rendezvous, work.c runs async work, coll.c checks and runs
 * collectives, the backend (tdist__backend_t, found by name in registry.c) connects and moves
 * data, seeing the group only through its context (pg->b, backend.h). Never names a backend,
 * never talks to peers itself, never frees a group its worker may still use (stop the worker
 * first), and never reads an options field beyond the caller's opts->size
 * (runtime/common/options.h). */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "runtime/common/clock.h"
#include "runtime/common/log.h"
#include "runtime/common/options.h"
#include "runtime/pg/group.h"
#include "runtime/pg/stats.h"

/* Where a caller's tdist_pg_options_t may end: version 1 ended at group_name; socket_ifname
 * came after (append only: a new field adds its end here). */
static const size_t k_opts_ends[] = {
    TDIST__OPTS_END(tdist_pg_options_t, group_name),
    TDIST__OPTS_END(tdist_pg_options_t, socket_ifname),
};

/* Marks the group failed; the first failure is the one every later call reports. */
void tdist__pg_set_sticky(tdist_pg_t *pg, tdist_status_t st) {
  int expected = 0;
  if (atomic_compare_exchange_strong(&pg->b.aborted, &expected, 1)) {
    pg->b.sticky = st;
    uint64_t one = 1;
    ssize_t w = write(pg->b.abort_fd, &one, sizeof one);
    (void)w;
  }
}

static tdist_pg_t *pg_alloc(void) {
  tdist_pg_t *pg = calloc(1, sizeof *pg);
  if (!pg) return NULL;
  pg->stats_group = -1;
  pg->b.abort_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (pg->b.abort_fd < 0) {
    int e = errno;
    free(pg);
    errno = e; /* pg_alloc_fail tells ENOMEM from an eventfd failure */
    return NULL;
  }
  pg->b.vfail = tdist__pg_vfail;
  pg->b.last_error = tdist__pg_last_error;
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
  if (pg->be && pg->b.state) pg->be->destroy(&pg->b);
  tdist__pg_close_stores(pg);
  close(pg->b.abort_fd);
  pthread_mutex_destroy(&pg->err_mu);
  pthread_mutex_destroy(&pg->mu);
  pthread_cond_destroy(&pg->cv);
  free((char *)pg->b.name); /* the group's own copies (pg_connect, init, new_group) */
  free((char *)pg->b.socket_ifname);
  free((int *)pg->b.parent_ranks);
  pg->magic = 0;
  free(pg);
}

/* Common tail of init and new_group: prefix store, backend connect. */
static tdist_status_t pg_connect(tdist_pg_t *pg, const char *name) {
  if (!(pg->b.name = strdup(name))) return tdist__fail(TDIST_ERR_NO_MEMORY, "out of memory");
  tdist_status_t st;
  if (pg->base_store) { /* none for backend "mpi": MPI connects the ranks */
    st = tdist_prefix_store_create(pg->base_store, name, &pg->b.store);
    if (st) return st;
    tdist_store_set_timeout(pg->b.store, pg->b.timeout_ms);
  }
  pg->magic = TDIST__PG_MAGIC;
  st = pg->be->connect(&pg->b, tdist__now_ms() + pg->b.timeout_ms);
  if (st) {
    tdist__fail(st, "%s", pg->err);
    return st;
  }
  tdist__log(TDIST__LOG_DEBUG, "pg", "group '%s': rank %d of %d connected (%s)", name, pg->b.rank,
             pg->b.size, pg->be->name);
  pg->stats_group = tdist__stats_register(pg->b.rank, pg->b.size);
  return TDIST_OK;
}

TDIST_EXTERN tdist_status_t tdist_init_process_group(const tdist_pg_options_t *opts,
                                                     tdist_pg_t **out) {
  if (!out) return tdist__fail(TDIST_ERR_INVALID_ARGUMENT, "tdist_init_process_group: out is NULL");
  *out = NULL;
  if (!opts)
    return tdist__fail(TDIST_ERR_INVALID_ARGUMENT,
                       "tdist_init_process_group: options missing (initialise them with "
                       "TDIST_PG_OPTIONS_INIT)");
  tdist_pg_options_t o = TDIST_PG_OPTIONS_INIT; /* what an older caller's struct lacks */
  tdist_status_t st =
      tdist__opts_load("tdist_init_process_group", "TDIST_PG_OPTIONS_INIT", opts, &o, sizeof o,
                       k_opts_ends, sizeof k_opts_ends / sizeof k_opts_ends[0]);
  if (st) return st;
  opts = &o;
  const char *backend = opts->backend ? opts->backend : "gloo";
  const tdist__backend_reg_t *reg = tdist__backend_find(backend);
  if (!reg) {
    char names[256];
    return tdist__fail(TDIST_ERR_INVALID_ARGUMENT, "backend '%s' is not supported; use %s", backend,
                       tdist__backend_names(names, sizeof names));
  }
  const tdist__backend_t *be = reg->be; /* NULL: reg->open gives it, below */
  if (opts->store && opts->init_method)
    return tdist__fail(TDIST_ERR_INVALID_ARGUMENT,
                       "tdist_init_process_group: give either a store or an init_method, not both");
  if (opts->timeout_ms < 0)
    return tdist__fail(TDIST_ERR_INVALID_ARGUMENT, "timeout_ms %lld must be >= 0",
                       (long long)opts->timeout_ms);
  int64_t timeout = opts->timeout_ms ? opts->timeout_ms : TDIST__PG_DEFAULT_TIMEOUT_MS;
  tdist__rdzv_t r;
  memset(&r, 0, sizeof r);
  if (reg->open) {
    /* The backend numbers the ranks (mpi: MPI_COMM_WORLD); a store or init_method is not used. */
    if ((st = reg->open(opts, &be, &r.rank, &r.world))) return st;
  } else if (opts->store) {
    if (opts->rank < 0 || opts->world_size <= 0)
      return tdist__fail(TDIST_ERR_INVALID_ARGUMENT,
                         "tdist_init_process_group: with an explicit store, rank (%d) and "
                         "world_size (%d) must be given",
                         opts->rank, opts->world_size);
    r.rank = opts->rank;
    r.world = opts->world_size;
  } else {
    if ((st = tdist__pg_parse_init_method(opts, &r))) return st;
  }
  if (r.rank >= r.world)
    return tdist__fail(TDIST_ERR_INVALID_ARGUMENT,
                       "rank %d is out of range for world_size %d (ranks are 0..%d)", r.rank,
                       r.world, r.world - 1);
  tdist_pg_t *pg = pg_alloc();
  if (!pg) return pg_alloc_fail("tdist_init_process_group");
  pg->b.rank = r.rank;
  pg->b.size = r.world;
  pg->b.timeout_ms = timeout;
  pg->be = be;
  if (opts->socket_ifname && !(pg->b.socket_ifname = strdup(opts->socket_ifname)))
    st = tdist__fail(TDIST_ERR_NO_MEMORY, "tdist_init_process_group: out of memory");
  if (st == TDIST_OK && reg->open) {
    /* no store */
  } else if (st == TDIST_OK && opts->store) {
    pg->base_store = opts->store;
  } else if (st == TDIST_OK) {
    st = tdist__pg_open_stores(pg, &r, timeout);
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
  if (!ranks || nranks <= 0 || nranks > parent->b.size)
    return tdist__fail(TDIST_ERR_INVALID_ARGUMENT,
                       "tdist_new_group: ranks must list 1..%d ranks of the parent",
                       parent->b.size);
  int me = -1;
  for (int i = 0; i < nranks; i++) {
    if (ranks[i] < 0 || ranks[i] >= parent->b.size || (i && ranks[i] <= ranks[i - 1]))
      return tdist__fail(TDIST_ERR_INVALID_ARGUMENT,
                         "tdist_new_group: ranks must be strictly increasing parent ranks in "
                         "0..%d (bad entry %d at index %d)",
                         parent->b.size - 1, ranks[i], i);
    if (ranks[i] == parent->b.rank) me = i;
  }
  /* Every parent rank counts the subgroup, members or not, so names stay in step. */
  int id = ++parent->subgroups;
  if (parent->be->skip_group) {
    /* The backend derives the subgroup from the parent's communicator, collectively: the
     * parent's queued work must reach the communicator first. */
    tdist__pg_drain(parent);
    if (me < 0) {
      tdist_status_t st =
          parent->be->skip_group(&parent->b, tdist__now_ms() + parent->b.timeout_ms);
      return st ? tdist__fail(st, "tdist_new_group: %s", parent->err) : TDIST_OK;
    }
  }
  if (me < 0) return TDIST_OK;
  if (atomic_load(&parent->b.aborted))
    return tdist__fail(parent->b.sticky, "tdist_new_group: parent group is aborted: %s",
                       parent->err);
  tdist_pg_t *pg = pg_alloc();
  if (!pg) return pg_alloc_fail("tdist_new_group");
  pg->b.rank = me;
  pg->b.size = nranks;
  pg->b.timeout_ms = parent->b.timeout_ms;
  pg->be = parent->be;
  pg->base_store = parent->base_store;
  if (parent->b.socket_ifname) pg->b.socket_ifname = strdup(parent->b.socket_ifname);
  int *pranks = malloc(sizeof(int) * (size_t)nranks);
  if (pranks) memcpy(pranks, ranks, sizeof(int) * (size_t)nranks);
  pg->b.parent_ranks = pranks;
  pg->b.subgroup_id = id;
  char name[512];
  snprintf(name, sizeof name, "%s/%d", parent->b.name, id);
  pg->b.parent = &parent->b; /* for the backend's connect only */
  tdist_status_t st = pg->b.parent_ranks ? pg_connect(pg, name) : TDIST_ERR_NO_MEMORY;
  pg->b.parent = NULL;
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
  return pg && pg->magic == TDIST__PG_MAGIC ? pg->b.rank : -1;
}
TDIST_EXTERN int tdist_pg_size(const tdist_pg_t *pg) {
  return pg && pg->magic == TDIST__PG_MAGIC ? pg->b.size : -1;
}
TDIST_EXTERN const char *tdist_pg_backend(const tdist_pg_t *pg) {
  return pg && pg->magic == TDIST__PG_MAGIC ? pg->be->name : "";
}
TDIST_EXTERN int tdist_pg_device(const tdist_pg_t *pg) {
  return pg && pg->magic == TDIST__PG_MAGIC && pg->be->device ? pg->be->device(&pg->b) : -1;
}
TDIST_EXTERN const char *tdist_pg_last_error(const tdist_pg_t *pg) {
  return pg && pg->magic == TDIST__PG_MAGIC ? pg->err : "invalid process group handle";
}

TDIST_EXTERN void tdist_pg_abort(tdist_pg_t *pg) {
  if (!pg || pg->magic != TDIST__PG_MAGIC) return;
  if (!atomic_load(&pg->b.aborted)) {
    tdist__pg_fail(pg, TDIST_ERR_ABORTED, "process group '%s' was aborted (tdist_pg_abort)",
                   pg->b.name);
    tdist__pg_set_sticky(pg, TDIST_ERR_ABORTED);
  }
}

TDIST_EXTERN tdist_status_t tdist_pg_finalize(tdist_pg_t *pg) {
  if (!pg || pg->magic != TDIST__PG_MAGIC)
    return tdist__fail(TDIST_ERR_INVALID_ARGUMENT, "tdist_pg_finalize: invalid group handle");
  tdist__pg_stop_worker(pg); /* drains the queue first */
  if (pg->b.state) pg->be->destroy(&pg->b);
  return atomic_load(&pg->b.aborted) ? pg->b.sticky : TDIST_OK;
}

TDIST_EXTERN void tdist_pg_destroy(tdist_pg_t *pg) {
  if (!pg || pg->magic != TDIST__PG_MAGIC) return;
  if (pg->worker_started) {
    /* Queued work must not wait for peers that may be gone: abort, then drain. */
    if (tdist__pg_work_pending(pg)) tdist_pg_abort(pg);
  }
  tdist__pg_stop_worker(pg);
  pg_free(pg);
}