/* The process group (struct tdist_pg_s) and what the files of the process-group library share
 * among themselves, and not with backends (those see the group's context only, backend.h):
 *   pg.c       the group's lifecycle: init, subgroups, accessors, abort, finalize, destroy;
 *   init.c     init methods (env://, tcp://, file://) and the stores they open;
 *   work.c     the async worker thread and work handles;
 *   coll.c     argument checks, the public collectives and running one;
 *   failure.c  a failed collective's root cause, shared among the ranks.
 *
 * coll.c validates every public call, turns it into a tdist__coll_t and runs it through the
 * backend's single `run` entry, on the caller's thread or on the group's async worker. A failure
 * is sticky: the group records it, aborts, and every later call returns it at once. Private to
 * runtime/pg: no file outside it includes this header (Bazel: a source of //runtime/pg). */
#ifndef TDIST_PG_GROUP_H
#define TDIST_PG_GROUP_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "runtime/common/status_internal.h"
#include "runtime/pg/backend.h"
#include "runtime/pg/stats.h"
#include "tdist/pg.h"
#include "tdist/stats.h"
#include "tdist/store.h"

#define TDIST__PG_MAGIC 0x9a0c011eu

typedef struct tdist_work_s tdist_work_t;

struct tdist_pg_s {
  uint32_t magic;
  /* What the backend sees: rank, size, timeout, name, subgroup ancestry, the abort state, the
   * store and its own state. The group owns b's strings and parent_ranks (pg_free frees them). */
  tdist__bctx_t b;
  const tdist__backend_t *be;
  tdist_store_t *base_store;          /* under b.store: the user's store, or owned_store */
  tdist_store_t *owned_store;         /* a TCP client we created (env://, tcp://) */
  tdist_store_t *owned_agent_prefix;  /* "/worker/attempt_N" over owned_store (agent mode) */
  tdist_store_server_t *owned_server; /* rank 0 hosts the store (env:// outside an agent) */
  int subgroups;                      /* subgroups created from this group so far */
  uint64_t seq;                       /* collectives issued */
  int stats_group;                    /* index for runtime/pg/stats.c, -1 = no statistics */
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

/* failure.c: after a collective failed with st (pg->err holds why): shares the root cause
 * through the group's store and adopts one another rank recorded first, then hangs up. Returns
 * the status to report: st, or the adopted cause's. */
tdist_status_t tdist__pg_share_failure(tdist_pg_t *pg, tdist_status_t st);

/* core.c: records the group's error text (first failure wins for the sticky status) and
 * returns st; the context's vfail (backends' tdist__bctx_fail) is this. */
tdist_status_t tdist__pg_fail(tdist_pg_t *pg, tdist_status_t st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
tdist_status_t tdist__pg_vfail(tdist__bctx_t *b, tdist_status_t st, const char *fmt, va_list ap);
const char *tdist__pg_last_error(const tdist__bctx_t *b);

#define TDIST__PG_DEFAULT_TIMEOUT_MS (30LL * 60 * 1000) /* PyTorch's default group timeout */

/* init.c: where the ranks meet, as an init method names it. */
typedef struct {
  int rank, world;
  char host[256];
  int port;
  int agent_store; /* TORCHELASTIC_USE_AGENT_STORE=True: client only, per-attempt prefix */
  int file;        /* file://: host holds the path */
  char prefix[64];
} tdist__rdzv_t;

/* Parses o->init_method (NULL: env://) with rank and world size from the URL, the options or
 * RANK/WORLD_SIZE, with PyTorch's messages. */
tdist_status_t tdist__pg_parse_init_method(const tdist_pg_options_t *o, tdist__rdzv_t *r);
/* Opens the stores of r into pg->owned_* and sets pg->base_store; rank 0 hosts a TCP store
 * outside an agent. On failure what was opened stays for tdist__pg_close_stores. */
tdist_status_t tdist__pg_open_stores(tdist_pg_t *pg, const tdist__rdzv_t *r, int64_t timeout_ms);
/* Destroys pg->store and every store the group owns (not a store the user passed). */
void tdist__pg_close_stores(tdist_pg_t *pg);

/* pg.c: marks the group failed; the first failure is the one every later call reports. */
void tdist__pg_set_sticky(tdist_pg_t *pg, tdist_status_t st);

/* coll.c: runs one collective on this thread (statistics, sticky error). */
tdist_status_t tdist__pg_run(tdist_pg_t *pg, tdist__coll_t *c);
/* Starts the clock of op c: its statistics and c->deadline_ms, which it also returns. */
int64_t tdist__pg_op_begin(tdist_pg_t *pg, tdist__coll_t *c, tdist__stats_op_t *sop);
/* The worker's sends and receives through the backend's run_p2p (feed: work.c), with the
 * group's failure handling; the status is that of every op taken and not reported done. */
tdist_status_t tdist__pg_run_p2p(tdist_pg_t *pg, tdist__p2p_feed_t *feed);
/* Frees the arrays a descriptor owns (owned_arrays); they are one allocation at `counts`. */
void tdist__coll_free_arrays(tdist__coll_t *c);

/* work.c: queues c (its owned arrays pass to the work) on the group's worker, starting it. */
tdist_status_t tdist__pg_submit(tdist_pg_t *pg, const tdist__coll_t *c, tdist_work_t **work);
/* Queues c and waits until it has run (a blocking send/recv while async ones are in flight). */
tdist_status_t tdist__pg_submit_wait(tdist_pg_t *pg, const tdist__coll_t *c);
/* Waits for every queued async op, so blocking calls keep the group's order. */
void tdist__pg_drain(tdist_pg_t *pg);
/* 1 while async work is queued or running. */
int tdist__pg_work_pending(tdist_pg_t *pg);
/* Lets the worker finish the queue, then joins it. */
void tdist__pg_stop_worker(tdist_pg_t *pg);

#endif
