/* Process-group internals shared by the process-group library (pg.c, init.c, work.c, coll.c)
 * and the backends.
 *
 * coll.c validates every public call, turns it into a tdist__coll_t and runs it through the
 * backend's single `run` entry, on the caller's thread or on the group's async worker. A failure
 * is sticky: the group records it, aborts, and every later call returns it at once. */
#ifndef TDIST_PG_PG_INTERNAL_H
#define TDIST_PG_PG_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "runtime/common/status_internal.h"
#include "runtime/pg/backend.h"
#include "tdist/pg.h"
#include "tdist/stats.h"
#include "tdist/store.h"

#define TDIST__PG_MAGIC 0x9a0c011eu

typedef struct tdist_work_s tdist_work_t;

struct tdist_pg_s {
  uint32_t magic;
  int rank, size;
  int64_t timeout_ms;
  const tdist__backend_t *be;
  void *be_state;
  char *name;                         /* store prefix of this group */
  char *socket_ifname;                /* from the options; NULL: TDIST_SOCKET_IFNAME or automatic */
  tdist_store_t *store;               /* prefix store: name/... over base_store */
  tdist_store_t *base_store;          /* the user's store, or owned_store */
  tdist_store_t *owned_store;         /* a TCP client we created (env://, tcp://) */
  tdist_store_t *owned_agent_prefix;  /* "/worker/attempt_N" over owned_store (agent mode) */
  tdist_store_server_t *owned_server; /* rank 0 hosts the store (env:// outside an agent) */
  int *parent_ranks;                  /* subgroups: our ranks in the parent */
  tdist_pg_t *parent;                 /* subgroups, during connect only (NULL afterwards) */
  int subgroups;                      /* subgroups created from this group so far */
  uint64_t seq;                       /* collectives issued */
  int stats_group;                    /* index for runtime/pg/stats.c, -1 = no statistics */
  int abort_fd;                       /* eventfd, readable once aborted */
  _Atomic int aborted;
  tdist_status_t sticky; /* the failure that aborted the group */
  pthread_mutex_t err_mu;
  char err[TDIST__ERRMSG_MAX];
  /* async worker */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  pthread_t worker;
  int worker_started, stopping;
  int running; /* the worker is executing an op it took off the queue */
  tdist_work_t *qhead, *qtail;
  int p2p_open;            /* the worker is in run_p2p: posted sends/receives join it (wake_p2p) */
  _Atomic unsigned posted; /* bumped on every submit: run_p2p's take looks at it before locking */
};

/* After a collective failed with st (pg->err holds why): shares the root cause through the
 * group's store and adopts one another rank recorded first, then hangs up (failure.c).
 * Returns the status to report: st, or the adopted cause's. */
tdist_status_t tdist__pg_share_failure(tdist_pg_t *pg, tdist_status_t st);

/* Records the group's error text (first failure wins for the sticky status) and returns st. */
tdist_status_t tdist__pg_fail(tdist_pg_t *pg, tdist_status_t st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif
