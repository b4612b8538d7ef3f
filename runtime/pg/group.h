/* What the files of the process-group library share among themselves, and not with backends
 * (those see pg_internal.h only):
 *   pg.c    the group's lifecycle: init, subgroups, accessors, abort, finalize, destroy;
 *   init.c  init methods (env://, tcp://, file://) and the stores they open;
 *   work.c  the async worker thread and work handles;
 *   coll.c  argument checks, the public collectives and running one. */
#ifndef TDIST_PG_GROUP_H
#define TDIST_PG_GROUP_H

#include <stdint.h>

#include "runtime/pg/pg_internal.h"
#include "runtime/pg/stats.h"

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
