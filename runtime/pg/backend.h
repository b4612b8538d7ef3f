/* All a backend sees of a process group: its context (tdist__bctx_t: rank, size, name, timeout,
 * subgroup ancestry, the abort fd and flag, the store, the error sink), the collective
 * descriptor every backend's `run` receives, the lazily formatted name of a call for error
 * messages, the async worker's send/receive feed, the backend vtable, and the registry a
 * backend joins by name. The group itself (struct tdist_pg_s: statistics, failure sharing, the
 * work queue) stays private to runtime/pg; a backend includes this header and nothing of pg's
 * but reduce.h (the kernels). Header only, for the MPI plugin too, which links nothing of
 * libtdist's: everything a backend calls of the group is a pointer in the context. */
#ifndef TDIST_PG_BACKEND_H
#define TDIST_PG_BACKEND_H

#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "tdist/pg.h"
#include "tdist/stats.h"
#include "tdist/status.h"
#include "tdist/store.h"

/* A backend's view of its group, filled by pg.c before connect and fixed afterwards (but the
 * abort state and `state`). Lives inside the group: valid from connect to destroy. */
typedef struct tdist__bctx tdist__bctx_t;
struct tdist__bctx {
  int rank, size;
  int64_t timeout_ms;        /* the group's: each op's deadline is its start + this */
  const char *name;          /* the group's name and store prefix ("default_pg", "default_pg/1") */
  const char *socket_ifname; /* from the options; NULL: TDIST_SOCKET_IFNAME or automatic */
  /* Subgroups (tdist_new_group). */
  const int *parent_ranks; /* this group's ranks in the parent; NULL in a world group */
  int subgroup_id;         /* the parent's subgroup count at its creation (every parent rank keeps
                              it in step); 0 in a world group */
  tdist__bctx_t *parent;   /* the parent's context, during connect only (NULL afterwards) */
  /* Abort: set by the group (a failure, tdist_pg_abort), from any thread. */
  int abort_fd;          /* eventfd, readable once the group is aborted */
  _Atomic int aborted;   /* 1 once the group failed or was aborted */
  tdist_status_t sticky; /* why (read after aborted is 1): TDIST_ERR_ABORTED for tdist_pg_abort */
  /* The group's store: borrowed (other threads of the user's may use the store under it), so a
   * backend gives each call its own deadline (runtime/store/store_internal.h's _ms calls) and
   * never changes the handle's timeout. NULL for a backend registered with open (mpi). */
  tdist_store_t *store; /* keys under name/ */
  void *state;          /* the backend's own: set by connect, cleared by destroy */
  /* The group's error sink (use tdist__bctx_fail): records the text as the group's error
   * (tdist_pg_last_error) and the caller's (tdist_last_error) and returns st. Never aborts
   * the group: a failed run or run_p2p does, once it returns. Any thread. */
  tdist_status_t (*vfail)(tdist__bctx_t *b, tdist_status_t st, const char *fmt, va_list ap);
  /* The group's error text (what vfail recorded last; "" if none). */
  const char *(*last_error)(const tdist__bctx_t *b);
};

static inline tdist_status_t tdist__bctx_fail(tdist__bctx_t *b, tdist_status_t st, const char *fmt,
                                              ...) __attribute__((format(printf, 3, 4)));
static inline tdist_status_t tdist__bctx_fail(tdist__bctx_t *b, tdist_status_t st, const char *fmt,
                                              ...) {
  va_list ap;
  va_start(ap, fmt);
  st = b->vfail(b, st, fmt, ap);
  va_end(ap);
  return st;
}

/* The collective kinds, one per type of the statistics file: generated from its list
 * (TDIST_STATS_OP_LIST, include/tdist/stats.h), which also gives their names. */
#define TDIST__COLL_KIND_(kind, name) TDIST__COLL_##kind,
typedef enum { TDIST_STATS_OP_LIST(TDIST__COLL_KIND_) TDIST__COLL_KIND_COUNT_ } tdist__coll_kind_t;
#undef TDIST__COLL_KIND_

/* One collective call, as every backend receives it. Arrays (counts/displs) are owned by the
 * descriptor when `owned_arrays` (async calls copy them). */
typedef struct tdist__coll {
  tdist__coll_kind_t kind;
  void *out;
  const void *in;
  size_t count;
  tdist_dtype_t dtype;
  tdist_reduce_op_t op;
  int root;                      /* broadcast/reduce/gather/scatter */
  int peer;                      /* send/recv */
  int tag;                       /* send/recv */
  int64_t timeout_ms;            /* monitored barrier */
  size_t *counts, *displs;       /* all_gather_v; all_to_all_v output side */
  size_t *in_counts, *in_displs; /* all_to_all_v input side */
  int owned_arrays;
  int async;    /* 1: runs on the group's worker (an _async call); 0: on the caller's thread */
  uint64_t seq; /* sequence number in the group */
  int64_t deadline_ms; /* run_p2p: when this send/recv fails (CLOCK_MONOTONIC ms) */
} tdist__coll_t;

const char *tdist__coll_name(tdist__coll_kind_t kind);
/* "all_reduce #12": the collective's name and sequence number, written to out; returns out. */
#define TDIST__WHAT_MAX 48 /* the longest name (17) + " #" + 20 digits + NUL */
const char *tdist__coll_what(char out[TDIST__WHAT_MAX], tdist__coll_kind_t kind, uint64_t seq);
/* A collective's name for error messages, formatted (tdist__coll_what) only when a message needs
 * it: formatting it before every call was a tenth of a small shared-memory broadcast. */
typedef struct tdist__what {
  const char *fixed; /* a name to use as is, or NULL: kind and seq */
  tdist__coll_kind_t kind;
  uint64_t seq;
  char s[TDIST__WHAT_MAX]; /* "" until formatted */
} tdist__what_t;
const char *tdist__what(tdist__what_t *w);

#define TDIST__P2P_BATCH_MAX 64 /* sends and receives one run_p2p call has in flight at most */

/* The async worker's sends and receives (work.c), as run_p2p gets them. */
typedef struct tdist__p2p_feed tdist__p2p_feed_t;
struct tdist__p2p_feed {
  /* Moves up to cap sends/receives posted and not yet taken, in posting order, into c, each
   * with its deadline_ms set; returns how many (0: none now). Never blocks; cheap when there is
   * nothing (an atomic load), so a backend may call it on every idle pass. */
  int (*take)(tdist__p2p_feed_t *f, tdist__coll_t **c, int cap);
  /* c, which take gave, completed successfully. */
  void (*done)(tdist__p2p_feed_t *f, tdist__coll_t *c);
};

typedef struct tdist__backend {
  const char *name;
  /* Connects the backend among the group's ranks (store under b->store); sets b->state. */
  tdist_status_t (*connect)(tdist__bctx_t *b, int64_t deadline_ms);
  void (*destroy)(tdist__bctx_t *b);
  /* Runs one collective; must honour the deadline and b->abort_fd. Returns TDIST_OK or an
   * error after writing the detail with tdist__bctx_fail. */
  tdist_status_t (*run)(tdist__bctx_t *b, const tdist__coll_t *c, int64_t deadline_ms);
  /* Optional. Runs the async sends and receives feed->take gives, together, and takes those
   * posted while they wait, so that none waits for one posted after it (PyTorch's
   * batch_isend_irecv with irecv first); per peer and direction they move in posting order.
   * Each completes on its own (feed->done) or fails at its deadline_ms. Returns TDIST_OK once
   * every one taken is done and take gives none; an error (after tdist__bctx_fail) fails every
   * one not reported done. Same abort contract as run. Without it the worker runs sends and
   * receives one by one. */
  tdist_status_t (*run_p2p)(tdist__bctx_t *b, tdist__p2p_feed_t *feed);
  /* Optional (with run_p2p). A send/recv was posted while run_p2p runs: make it take soon. Any
   * thread. */
  void (*wake_p2p)(tdist__bctx_t *b);
  /* Optional. Refuses, before it is queued, a call this backend cannot run (after coll.c's own
   * argument checks; c->seq is the number the call will have); the error goes through
   * tdist__bctx_fail and does not fail the group. */
  tdist_status_t (*check)(tdist__bctx_t *b, const tdist__coll_t *c);
  /* Optional. tdist_new_group calls it on the parent ranks that are not in the new group, after
   * draining the parent's async work, so a backend can derive the subgroup's communicator from
   * the parent's collectively (ncclCommSplit). Members see b->parent during connect instead. */
  tdist_status_t (*skip_group)(tdist__bctx_t *parent, int64_t deadline_ms);
  /* Optional. The CUDA device the group's buffers must be on; absent: -1 (host memory). */
  int (*device)(const tdist__bctx_t *b);
  /* Optional. After a failure: shut down the connections so peers blocked on this rank fail
   * now, not at their deadline (failure.c). */
  void (*hangup)(tdist__bctx_t *b);
} tdist__backend_t;

/* A backend by name, as it registers itself (registry.c) from a constructor in its own object:
 *   static const tdist__backend_reg_t k_reg = {.name = "gloo", .be = &k_backend};
 *   __attribute__((constructor)) static void reg(void) { tdist__backend_register(&k_reg); } */
typedef struct tdist__backend_reg {
  const char *name;
  int order; /* its place in the list of names that an unknown name's error gives */
  const tdist__backend_t *be; /* NULL where open gives it */
  /* Optional: a backend that numbers the ranks itself and needs no store (mpi: the plugin, and
   * MPI_COMM_WORLD's numbering). Loads what it needs, checks opts' rank and world size, and
   * gives the vtable, this process's rank and the world size. On failure tdist_last_error()
   * says why. */
  tdist_status_t (*open)(const tdist_pg_options_t *opts, const tdist__backend_t **be, int *rank,
                         int *size);
} tdist__backend_reg_t;

/* Adds reg (static storage) to the registry. From constructors only (before any group). */
void tdist__backend_register(const tdist__backend_reg_t *reg);
/* The registration of that name, or NULL. */
const tdist__backend_reg_t *tdist__backend_find(const char *name);
/* "'gloo', 'nccl' or 'mpi'": the registered names by order, written to out; returns out. */
const char *tdist__backend_names(char *out, size_t cap);

#endif
