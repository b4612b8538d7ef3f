/* Backend "mpi": libtdist's collectives over the machine's MPI (the plugin libtdist-mpi.so; the
 * interface is runtime/mpi/plugin.h, the semantics are PyTorch's mpi backend's):
 *   - rank and size are MPI_COMM_WORLD's; no store. MPI is initialised on first use
 *     (MPI_Init_thread, MPI_THREAD_MULTIPLE asked) unless the program did it, and finalised
 *     when the last group is destroyed, only if tdist initialised it and no collective failed
 *     (a finalize waits for every rank: after a failure the process exits without it and the
 *     launcher ends the job); the watchdog bounds the finalize by the group's timeout.
 *   - Each group has its own communicator: the world group a duplicate of MPI_COMM_WORLD,
 *     subgroups MPI_Comm_create_group of the parent's (only the members call it), so tdist's
 *     traffic never matches the program's own MPI calls. Errors return (MPI_ERRORS_RETURN) and
 *     fail the group with MPI's own text.
 *   - Every dtype and op: MPI's predefined ones where they exist; f16 and bf16 (which MPI
 *     lacks) as 2-byte contiguous types with user ops over gloo's kernels (host->reduce), so
 *     they round as gloo's do; float MIN/MAX through the same kernels (NaN propagates, as in
 *     torch); int8 and uint8 SUM and PROD through them too (Open MPI 4.1's op/avx saturates
 *     8-bit sums, torch wraps); AVG is SUM then gloo's division by the group size.
 *   - Blocking calls use MPI's blocking collectives (the implementation's tuned algorithms);
 *     the _async forms use the nonblocking ones on the group's worker thread, which polls them
 *     with MPI_Testall for TDIST_MPI_SPIN_US, then sleeps between polls (20 us doubling to 1
 *     ms), so waiting async work does not hold a core.
 *   - Timeouts: MPI cannot cancel a collective. A watchdog thread sees every group's call in
 *     flight; one older than the group's timeout is logged (rank, group, collective and
 *     sequence number, how long) and the job is ended with MPI_Abort(MPI_COMM_WORLD, 124). A
 *     dead peer therefore ends every rank within timeout + the watchdog's period (under mpirun
 *     usually at once: the launcher ends the job when a rank dies). monitored_barrier is point to
 *     point and can be cancelled: rank 0 names the ranks that did not arrive and the group fails
 *     with TDIST_ERR_TIMEOUT, as on gloo. tdist_pg_abort fails later calls; a call in progress
 *     runs until it ends or the watchdog ends the job.
 *   - MPI counts are int: a count or displacement above INT_MAX elements is refused before it
 *     runs (split the call). Tags go up to MPI_TAG_UB (at least 32767). */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <mpi.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "runtime/mpi/plugin.h"

#define ABORT_CODE 124
#define LOG_ERROR 0
#define LOG_WARN 1
#define LOG_DEBUG 3

static const tdist__mpi_host_t *H;

/* Process-wide MPI state, under g_mu. */
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static int g_ready;          /* types and ops created */
static int g_we_initialized; /* tdist called MPI_Init_thread */
static int g_level;          /* the thread level MPI provides */
static int g_groups;         /* live groups */
static int g_failed;         /* some group failed: never finalize */
static int g_tag_ub = 32767;
static char g_library[MPI_MAX_LIBRARY_VERSION_STRING + 1];
static MPI_Datatype g_half; /* 2 contiguous bytes: f16 and bf16 (each has its own ops) */
static MPI_Datatype g_bhalf;
static MPI_Op g_uop[TDIST_REDUCE_OP_COUNT_]; /* gloo's kernels: SUM, PROD, MIN, MAX */

/* Below MPI_THREAD_MULTIPLE every MPI call of tdist's is made under this lock. */
static pthread_mutex_t g_call_mu = PTHREAD_MUTEX_INITIALIZER;
#define MPI_LOCK() \
  if (g_level < MPI_THREAD_MULTIPLE) pthread_mutex_lock(&g_call_mu)
#define MPI_UNLOCK() \
  if (g_level < MPI_THREAD_MULTIPLE) pthread_mutex_unlock(&g_call_mu)

typedef struct mstate {
  tdist__bctx_t *b;
  MPI_Comm comm;    /* collectives and send/recv */
  MPI_Comm mb_comm; /* monitored_barrier's point-to-point messages */
  int64_t timeout_ms;
  /* The call in flight, for the watchdog: 0 when none. */
  _Atomic int64_t busy_since_ms;
  _Atomic int busy_kind;
  _Atomic uint64_t busy_seq;
  struct mstate *next; /* the watchdog's list, under g_mu */
} mstate_t;

#define BUSY_CONNECT (-1) /* busy_kind while the group's communicator is made */

static mstate_t *g_watched;
static int g_watchdog_started;
static _Atomic int64_t g_finalize_since_ms, g_finalize_timeout_ms; /* MPI_Finalize in progress */

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void mpi_text(int rc, char *buf, size_t cap) {
  char s[MPI_MAX_ERROR_STRING + 1];
  int len = 0;
  if (MPI_Error_string(rc, s, &len) != MPI_SUCCESS) len = 0;
  s[len] = '\0';
  snprintf(buf, cap, "%s (MPI error %d)", len ? s : "unknown error", rc);
}

/* ---- the watchdog ------------------------------------------------------------------------ */

static void *watchdog_main(void *arg) {
  (void)arg;
  for (;;) {
    int64_t period = 500;
    pthread_mutex_lock(&g_mu);
    int64_t now = now_ms();
    for (mstate_t *s = g_watched; s; s = s->next) {
      int64_t p = s->timeout_ms / 20;
      if (p < period) period = p < 1 ? 1 : p;
      int64_t since = atomic_load(&s->busy_since_ms);
      if (since && now - since > s->timeout_ms) {
        char what[TDIST__WHAT_MAX + 64];
        int kind = atomic_load(&s->busy_kind);
        if (kind == BUSY_CONNECT)
          snprintf(what, sizeof what, "creating the group's communicator (a rank has not joined)");
        else
          H->coll_what(what, (tdist__coll_kind_t)kind, atomic_load(&s->busy_seq));
        H->log(LOG_ERROR, "mpi",
               "rank %d of group '%s' (%d ranks): %s has not finished after %lld ms (the "
               "group's timeout is %lld ms); a rank of the group has not called it or has "
               "stopped. MPI cannot cancel a collective: ending the job with "
               "MPI_Abort(MPI_COMM_WORLD, %d)",
               s->b->rank, s->b->name, s->b->size, what, (long long)(now - since),
               (long long)s->timeout_ms, ABORT_CODE);
        fflush(stderr);
        MPI_Abort(MPI_COMM_WORLD, ABORT_CODE);
        _exit(ABORT_CODE); /* MPI_Abort does not return; if it did, end this rank at least */
      }
    }
    pthread_mutex_unlock(&g_mu);
    int64_t fin = atomic_load(&g_finalize_since_ms), fto = atomic_load(&g_finalize_timeout_ms);
    if (fin && now - fin > fto) {
      H->log(LOG_ERROR, "mpi",
             "MPI_Finalize has not finished after %lld ms (the last group's timeout): a rank "
             "has not finalized; ending the job with MPI_Abort(MPI_COMM_WORLD, %d)",
             (long long)(now - fin), ABORT_CODE);
      fflush(stderr);
      MPI_Abort(MPI_COMM_WORLD, ABORT_CODE);
      _exit(ABORT_CODE);
    }
    if (fin && fto / 20 < period) period = fto / 20 < 1 ? 1 : fto / 20;
    struct timespec ts = {(time_t)(period / 1000), (long)(period % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
  }
  return NULL;
}

static inline void busy_begin(mstate_t *s, const tdist__coll_t *c) {
  atomic_store_explicit(&s->busy_kind, c ? (int)c->kind : BUSY_CONNECT, memory_order_relaxed);
  atomic_store_explicit(&s->busy_seq, c ? c->seq : 0, memory_order_relaxed);
  atomic_store_explicit(&s->busy_since_ms, now_ms(), memory_order_release);
}

static inline void busy_end(mstate_t *s) {
  atomic_store_explicit(&s->busy_since_ms, 0, memory_order_release);
}

/* ---- f16, bf16 and gloo-exact ops ---------------------------------------------------------- */

static tdist_dtype_t user_dtype(MPI_Datatype dt) {
  if (dt == g_half) return TDIST_FLOAT16;
  if (dt == g_bhalf) return TDIST_BFLOAT16;
  if (dt == MPI_FLOAT) return TDIST_FLOAT32;
  if (dt == MPI_INT8_T) return TDIST_INT8;
  if (dt == MPI_UINT8_T) return TDIST_UINT8;
  return TDIST_FLOAT64;
}

/* MPI: inout[i] = in[i] op inout[i]; every op here is commutative. */
#define USER_OP(name, OP)                                               \
  static void name(void *in, void *inout, int *len, MPI_Datatype *dt) { \
    H->reduce(inout, in, (size_t)*len, user_dtype(*dt), OP);            \
  }
USER_OP(uop_sum, TDIST_SUM)
USER_OP(uop_prod, TDIST_PROD)
USER_OP(uop_min, TDIST_MIN)
USER_OP(uop_max, TDIST_MAX)

static int setup_types_locked(char *err, size_t cap) {
  int rc = MPI_Type_contiguous(2, MPI_BYTE, &g_half);
  if (rc == MPI_SUCCESS) rc = MPI_Type_commit(&g_half);
  if (rc == MPI_SUCCESS) rc = MPI_Type_contiguous(2, MPI_BYTE, &g_bhalf);
  if (rc == MPI_SUCCESS) rc = MPI_Type_commit(&g_bhalf);
  MPI_User_function *fns[] = {uop_sum, uop_prod, uop_min, uop_max};
  for (int i = 0; i < 4 && rc == MPI_SUCCESS; i++) rc = MPI_Op_create(fns[i], 1, &g_uop[i]);
  if (rc != MPI_SUCCESS) {
    char t[256];
    mpi_text(rc, t, sizeof t);
    snprintf(err, cap, "cannot create the f16/bf16 datatypes and ops: %s", t);
    return -1;
  }
  void *ub = NULL;
  int flag = 0;
  if (MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &flag) == MPI_SUCCESS && flag && ub)
    g_tag_ub = *(int *)ub;
  return 0;
}

static MPI_Datatype mpi_dtype(tdist_dtype_t d) {
  switch (d) {
    case TDIST_FLOAT16: return g_half;
    case TDIST_BFLOAT16: return g_bhalf;
    case TDIST_FLOAT32: return MPI_FLOAT;
    case TDIST_FLOAT64: return MPI_DOUBLE;
    case TDIST_INT8: return MPI_INT8_T;
    case TDIST_UINT8: return MPI_UINT8_T;
    case TDIST_INT32: return MPI_INT32_T;
    default: return MPI_INT64_T;
  }
}

static int is_float(tdist_dtype_t d) { return d <= TDIST_FLOAT64; }

static MPI_Op mpi_op(tdist_dtype_t d, tdist_reduce_op_t op) {
  if (op == TDIST_AVG) op = TDIST_SUM; /* then divided */
  int half = d == TDIST_FLOAT16 || d == TDIST_BFLOAT16;
  /* 8-bit SUM and PROD too: Open MPI 4.1's op/avx component adds int8/uint8 vectors with
   * saturation (127 + 1 = 127; torch and gloo wrap to -128). */
  int byte_arith = (d == TDIST_INT8 || d == TDIST_UINT8) && (op == TDIST_SUM || op == TDIST_PROD);
  if (half || byte_arith || (is_float(d) && (op == TDIST_MIN || op == TDIST_MAX))) return g_uop[op];
  switch (op) {
    case TDIST_SUM: return MPI_SUM;
    case TDIST_PROD: return MPI_PROD;
    case TDIST_MIN: return MPI_MIN;
    case TDIST_MAX: return MPI_MAX;
    case TDIST_BAND: return MPI_BAND;
    case TDIST_BOR: return MPI_BOR;
    default: return MPI_BXOR;
  }
}

/* ---- process-wide init ----------------------------------------------------------------------- */

static tdist_status_t world(int *rank, int *size, char *err, size_t cap) {
  pthread_mutex_lock(&g_mu);
  tdist_status_t st = TDIST_OK;
  int init = 0, fin = 0, rc;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (fin) {
    snprintf(err, cap,
             "MPI is finalized in this process (by the program, or by tdist when the last mpi "
             "group was destroyed) and cannot be initialised again: keep one mpi group for the "
             "life of the process");
    st = TDIST_ERR_INVALID_USAGE;
    goto out;
  }
  if (!init) {
    int provided = 0;
    rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided);
    if (rc != MPI_SUCCESS) {
      char t[256];
      mpi_text(rc, t, sizeof t);
      snprintf(err, cap, "MPI_Init_thread failed: %s", t);
      st = TDIST_ERR_NOT_AVAILABLE;
      goto out;
    }
    g_we_initialized = 1;
    g_level = provided;
  } else if (!g_ready) {
    MPI_Query_thread(&g_level);
  }
  if (!g_ready) {
    if (setup_types_locked(err, cap)) {
      st = TDIST_ERR_INTERNAL;
      goto out;
    }
    int len = 0;
    if (MPI_Get_library_version(g_library, &len) != MPI_SUCCESS) len = 0;
    g_library[len] = '\0';
    char *nl = strchr(g_library, '\n');
    if (nl) *nl = '\0';
    if (g_level < MPI_THREAD_SERIALIZED)
      H->log(LOG_WARN, "mpi",
             "MPI provides thread level %d (below MPI_THREAD_SERIALIZED): tdist's async worker and "
             "watchdog call MPI from their own threads; every call is serialised, but MPI may "
             "still misbehave. Initialise MPI with MPI_Init_thread(MPI_THREAD_MULTIPLE)",
             g_level);
    g_ready = 1;
  }
  MPI_Comm_rank(MPI_COMM_WORLD, rank);
  MPI_Comm_size(MPI_COMM_WORLD, size);
out:
  pthread_mutex_unlock(&g_mu);
  return st;
}

static const char *library(void) { return g_library; }

/* ---- connect / destroy ----------------------------------------------------------------------- */

static tdist_status_t connect_fail(tdist__bctx_t *b, const char *what, int rc) {
  char t[256];
  mpi_text(rc, t, sizeof t);
  return tdist__bctx_fail(b, TDIST_ERR_REMOTE, "mpi: %s failed: %s", what, t);
}

static tdist_status_t mpi_connect(tdist__bctx_t *b, int64_t deadline_ms) {
  (void)deadline_ms; /* the watchdog holds the timeout */
  mstate_t *s = calloc(1, sizeof *s);
  if (!s) return tdist__bctx_fail(b, TDIST_ERR_NO_MEMORY, "mpi: out of memory");
  s->b = b;
  s->timeout_ms = b->timeout_ms;
  s->comm = s->mb_comm = MPI_COMM_NULL;
  pthread_mutex_lock(&g_mu);
  s->next = g_watched;
  g_watched = s;
  g_groups++;
  if (!g_watchdog_started) {
    pthread_t t;
    pthread_attr_t a;
    pthread_attr_init(&a);
    pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
    if (pthread_create(&t, &a, watchdog_main, NULL) == 0) g_watchdog_started = 1;
    pthread_attr_destroy(&a);
  }
  int started = g_watchdog_started;
  pthread_mutex_unlock(&g_mu);
  b->state = s;
  if (!started)
    return tdist__bctx_fail(b, TDIST_ERR_SYSTEM, "mpi: cannot start the watchdog thread");
  /* The watchdog covers connecting too: a rank that never joins ends the job at the timeout. */
  busy_begin(s, NULL);
  int rc;
  MPI_LOCK();
  if (b->parent) {
    mstate_t *ps = b->parent->state;
    MPI_Group pgroup, sub;
    rc = MPI_Comm_group(ps->comm, &pgroup);
    if (rc == MPI_SUCCESS) {
      rc = MPI_Group_incl(pgroup, b->size, b->parent_ranks, &sub);
      MPI_Group_free(&pgroup);
    }
    if (rc == MPI_SUCCESS) {
      /* Only the members call it; concurrent creations of one parent are told apart by the
       * parent's subgroup count, which every parent rank keeps in step. */
      rc = MPI_Comm_create_group(ps->comm, sub, b->subgroup_id % g_tag_ub, &s->comm);
      MPI_Group_free(&sub);
    }
  } else {
    rc = MPI_Comm_dup(MPI_COMM_WORLD, &s->comm);
  }
  if (rc == MPI_SUCCESS) rc = MPI_Comm_set_errhandler(s->comm, MPI_ERRORS_RETURN);
  if (rc == MPI_SUCCESS) rc = MPI_Comm_dup(s->comm, &s->mb_comm);
  MPI_UNLOCK();
  busy_end(s);
  if (rc != MPI_SUCCESS)
    return connect_fail(b, b->parent ? "MPI_Comm_create_group" : "MPI_Comm_dup", rc);
  return TDIST_OK;
}

static void mpi_destroy(tdist__bctx_t *b) {
  mstate_t *s = b->state;
  b->state = NULL;
  if (!s) return;
  pthread_mutex_lock(&g_mu);
  for (mstate_t **p = &g_watched; *p; p = &(*p)->next) {
    if (*p == s) {
      *p = s->next;
      break;
    }
  }
  /* A collective failed (not a deliberate tdist_pg_abort): peers may never finalize. */
  if (atomic_load(&b->aborted) && b->sticky != TDIST_ERR_ABORTED) g_failed = 1;
  int fin = 0;
  MPI_Finalized(&fin);
  if (!fin) {
    MPI_LOCK();
    if (s->mb_comm != MPI_COMM_NULL) MPI_Comm_free(&s->mb_comm);
    if (s->comm != MPI_COMM_NULL) MPI_Comm_free(&s->comm);
    MPI_UNLOCK();
  }
  int finalize = --g_groups == 0 && g_we_initialized && !g_failed && !fin;
  if (finalize) {
    /* MPI_Finalize waits for every rank: the watchdog ends the job if it outlives the
     * group's timeout (g_mu is released, so the watchdog can run). */
    atomic_store(&g_finalize_timeout_ms, s->timeout_ms);
    atomic_store(&g_finalize_since_ms, now_ms());
  }
  pthread_mutex_unlock(&g_mu);
  free(s);
  if (finalize) {
    H->log(LOG_DEBUG, "mpi", "last mpi group destroyed: MPI_Finalize");
    MPI_Finalize();
    atomic_store(&g_finalize_since_ms, 0);
  }
}

/* ---- checks before a call is queued ---------------------------------------------------------- */

static int over_int(size_t v) { return v > (size_t)INT_MAX; }

static tdist_status_t mpi_check(tdist__bctx_t *b, const tdist__coll_t *c) {
  char what[TDIST__WHAT_MAX];
  if (over_int(c->count))
    return tdist__bctx_fail(b, TDIST_ERR_INVALID_ARGUMENT,
                            "%s: count %zu is above MPI's int counts (%d): split the call",
                            H->coll_what(what, c->kind, c->seq), c->count, INT_MAX);
  if (c->counts) {
    for (int r = 0; r < b->size; r++) {
      size_t v[4] = {c->counts[r], c->displs[r], c->in_counts ? c->in_counts[r] : 0,
                     c->in_displs ? c->in_displs[r] : 0};
      for (int k = 0; k < 4; k++)
        if (over_int(v[k]))
          return tdist__bctx_fail(b, TDIST_ERR_INVALID_ARGUMENT,
                                  "%s: a count or displacement of rank %d (%zu) is above MPI's int "
                                  "counts (%d): split the call",
                                  H->coll_what(what, c->kind, c->seq), r, v[k], INT_MAX);
    }
  }
  if ((c->kind == TDIST__COLL_SEND || c->kind == TDIST__COLL_RECV) && c->tag > g_tag_ub)
    return tdist__bctx_fail(b, TDIST_ERR_INVALID_ARGUMENT,
                            "%s: tag %d is above this MPI's MPI_TAG_UB (%d)",
                            c->kind == TDIST__COLL_SEND ? "send" : "recv", c->tag, g_tag_ub);
  return TDIST_OK;
}

/* ---- running one call ------------------------------------------------------------------------ */

/* Waits for nonblocking requests: polls for host->spin_us, then sleeps between polls. The
 * watchdog ends the job if they outlive the timeout. */
static int wait_all(int n, MPI_Request *reqs) {
  int64_t spin_until = now_ns() + H->spin_us * 1000;
  long sleep_ns = 20000;
  for (;;) {
    int flag = 0;
    MPI_LOCK();
    int rc = MPI_Testall(n, reqs, &flag, MPI_STATUSES_IGNORE);
    MPI_UNLOCK();
    if (rc != MPI_SUCCESS || flag) return rc;
    if (now_ns() < spin_until) continue;
    struct timespec ts = {0, sleep_ns};
    nanosleep(&ts, NULL);
    if (sleep_ns < 1000000) sleep_ns *= 2;
  }
}

/* int counts/displs in elements from the descriptor's size_t ones (mpi_check bounded them). */
static int *int_arrays(const tdist__coll_t *c, int n, int k) {
  int *a = malloc(sizeof(int) * (size_t)n * (size_t)k);
  if (!a) return NULL;
  const size_t *src[4] = {c->counts, c->displs, c->in_counts, c->in_displs};
  for (int j = 0; j < k; j++)
    for (int r = 0; r < n; r++) a[j * n + r] = (int)src[j][r];
  return a;
}

static int even(const size_t *counts, const size_t *displs, int n, size_t count) {
  for (int r = 0; r < n; r++)
    if (counts[r] != count || displs[r] != (size_t)r * count) return 0;
  return 1;
}

/* Issues c: blocking (req NULL) or nonblocking (*req set). Returns MPI's code. */
static int issue(mstate_t *s, const tdist__coll_t *c, MPI_Request *req, int **scratch) {
  tdist__bctx_t *b = s->b;
  MPI_Comm comm = s->comm;
  MPI_Datatype dt = mpi_dtype(c->dtype);
  size_t esz = c->dtype == TDIST_FLOAT16 || c->dtype == TDIST_BFLOAT16 ? 2
               : c->dtype == TDIST_FLOAT32 || c->dtype == TDIST_INT32  ? 4
               : c->dtype == TDIST_FLOAT64 || c->dtype == TDIST_INT64  ? 8
                                                                       : 1;
  int n = (int)c->count, me = b->rank, size = b->size;
  char *out = c->out;
  const char *in = c->in;
  switch (c->kind) {
    case TDIST__COLL_ALL_REDUCE: {
      MPI_Op op = mpi_op(c->dtype, c->op);
      return req ? MPI_Iallreduce(MPI_IN_PLACE, out, n, dt, op, comm, req)
                 : MPI_Allreduce(MPI_IN_PLACE, out, n, dt, op, comm);
    }
    case TDIST__COLL_BROADCAST:
      return req ? MPI_Ibcast(out, n, dt, c->root, comm, req)
                 : MPI_Bcast(out, n, dt, c->root, comm);
    case TDIST__COLL_REDUCE: {
      MPI_Op op = mpi_op(c->dtype, c->op);
      const void *sb = me == c->root ? MPI_IN_PLACE : out;
      void *rb = me == c->root ? out : NULL;
      return req ? MPI_Ireduce(sb, rb, n, dt, op, c->root, comm, req)
                 : MPI_Reduce(sb, rb, n, dt, op, c->root, comm);
    }
    case TDIST__COLL_ALL_GATHER_V: {
      int cnt = (int)c->counts[me];
      const void *sb = in == out + c->displs[me] * esz ? MPI_IN_PLACE : in;
      if (even(c->counts, c->displs, size, c->counts[0]))
        return req ? MPI_Iallgather(sb, cnt, dt, out, (int)c->counts[0], dt, comm, req)
                   : MPI_Allgather(sb, cnt, dt, out, (int)c->counts[0], dt, comm);
      int *a = *scratch = int_arrays(c, size, 2);
      if (!a) return MPI_ERR_NO_MEM;
      return req ? MPI_Iallgatherv(sb, cnt, dt, out, a, a + size, dt, comm, req)
                 : MPI_Allgatherv(sb, cnt, dt, out, a, a + size, dt, comm);
    }
    case TDIST__COLL_GATHER: {
      const void *sb = me == c->root && in == out + (size_t)me * c->count * esz ? MPI_IN_PLACE : in;
      return req ? MPI_Igather(sb, n, dt, out, n, dt, c->root, comm, req)
                 : MPI_Gather(sb, n, dt, out, n, dt, c->root, comm);
    }
    case TDIST__COLL_SCATTER: {
      void *rb = me == c->root && out == in + (size_t)me * c->count * esz ? MPI_IN_PLACE : out;
      return req ? MPI_Iscatter(in, n, dt, rb, n, dt, c->root, comm, req)
                 : MPI_Scatter(in, n, dt, rb, n, dt, c->root, comm);
    }
    case TDIST__COLL_REDUCE_SCATTER: {
      MPI_Op op = mpi_op(c->dtype, c->op);
      return req ? MPI_Ireduce_scatter_block(in, out, n, dt, op, comm, req)
                 : MPI_Reduce_scatter_block(in, out, n, dt, op, comm);
    }
    case TDIST__COLL_ALL_TO_ALL_V: {
      const void *sb = in == out ? MPI_IN_PLACE : in;
      size_t k = c->counts[0];
      if (even(c->counts, c->displs, size, k) && even(c->in_counts, c->in_displs, size, k))
        return req ? MPI_Ialltoall(sb, (int)k, dt, out, (int)k, dt, comm, req)
                   : MPI_Alltoall(sb, (int)k, dt, out, (int)k, dt, comm);
      int *a = *scratch = int_arrays(c, size, 4);
      if (!a) return MPI_ERR_NO_MEM;
      return req ? MPI_Ialltoallv(sb, a + 2 * size, a + 3 * size, dt, out, a, a + size, dt, comm,
                                  req)
                 : MPI_Alltoallv(sb, a + 2 * size, a + 3 * size, dt, out, a, a + size, dt, comm);
    }
    case TDIST__COLL_BARRIER: return req ? MPI_Ibarrier(comm, req) : MPI_Barrier(comm);
    case TDIST__COLL_SEND:
      return req ? MPI_Isend(in, n, dt, c->peer, c->tag, comm, req)
                 : MPI_Send(in, n, dt, c->peer, c->tag, comm);
    case TDIST__COLL_RECV:
      return req ? MPI_Irecv(out, n, dt, c->peer, c->tag, comm, req)
                 : MPI_Recv(out, n, dt, c->peer, c->tag, comm, MPI_STATUS_IGNORE);
    default: return MPI_ERR_OP;
  }
}

/* Point to point, so it can time out without ending the job: every rank sends rank 0 a token
 * and waits for its release; rank 0 names the ranks whose token did not come. Tags are the
 * call's sequence number, so a token that comes late never meets a later barrier. */
static tdist_status_t monitored_barrier(mstate_t *s, const tdist__coll_t *c) {
  tdist__bctx_t *b = s->b;
  int size = b->size, me = b->rank;
  int tag = (int)(c->seq % (uint64_t)(g_tag_ub / 2)) * 2;
  int64_t deadline = now_ms() + c->timeout_ms;
  int nreq = me == 0 ? size - 1 : 2;
  MPI_Request *reqs = calloc((size_t)(nreq > 0 ? nreq : 1), sizeof *reqs);
  if (!reqs) return tdist__bctx_fail(b, TDIST_ERR_NO_MEMORY, "monitored_barrier: out of memory");
  char token = 0, sink[1];
  int rc = MPI_SUCCESS, flag = 0;
  MPI_LOCK();
  if (me == 0) {
    for (int r = 1; r < size && rc == MPI_SUCCESS; r++)
      rc = MPI_Irecv(sink, 0, MPI_BYTE, r, tag, s->mb_comm, &reqs[r - 1]);
  } else {
    rc = MPI_Isend(&token, 0, MPI_BYTE, 0, tag, s->mb_comm, &reqs[0]);
    if (rc == MPI_SUCCESS) rc = MPI_Irecv(sink, 0, MPI_BYTE, 0, tag + 1, s->mb_comm, &reqs[1]);
  }
  MPI_UNLOCK();
  long sleep_ns = 20000;
  while (rc == MPI_SUCCESS && nreq > 0) {
    MPI_LOCK();
    rc = MPI_Testall(nreq, reqs, &flag, MPI_STATUSES_IGNORE);
    MPI_UNLOCK();
    if (rc != MPI_SUCCESS || flag || now_ms() >= deadline) break;
    struct timespec ts = {0, sleep_ns};
    nanosleep(&ts, NULL);
    if (sleep_ns < 1000000) sleep_ns *= 2;
  }
  tdist_status_t st = TDIST_OK;
  if (rc != MPI_SUCCESS) {
    char t[256];
    mpi_text(rc, t, sizeof t);
    st = tdist__bctx_fail(b, TDIST_ERR_REMOTE, "monitored_barrier: MPI error: %s", t);
  } else if (!flag && nreq > 0) {
    char missing[512] = "";
    size_t len = 0;
    int nmissing = 0;
    MPI_LOCK();
    for (int i = 0; i < nreq; i++) {
      int done = 0;
      MPI_Test(&reqs[i], &done, MPI_STATUS_IGNORE);
      if (done) continue;
      MPI_Cancel(&reqs[i]);
      MPI_Wait(&reqs[i], MPI_STATUS_IGNORE);
      if (me == 0 && len < sizeof missing - 16) {
        len += (size_t)snprintf(missing + len, sizeof missing - len, "%s%d", nmissing ? ", " : "",
                                i + 1);
      }
      nmissing++;
    }
    MPI_UNLOCK();
    if (me == 0)
      st = tdist__bctx_fail(
          b, TDIST_ERR_TIMEOUT,
          "monitored_barrier: rank%s %s of group '%s' did not reach the barrier within "
          "%lld ms",
          nmissing > 1 ? "s" : "", missing, b->name, (long long)c->timeout_ms);
    else
      st =
          tdist__bctx_fail(b, TDIST_ERR_TIMEOUT,
                           "monitored_barrier: rank 0 of group '%s' did not release rank %d within "
                           "%lld ms (rank 0 reports the ranks that did not arrive)",
                           b->name, me, (long long)c->timeout_ms);
  } else if (me == 0) {
    MPI_LOCK();
    for (int r = 1; r < size && rc == MPI_SUCCESS; r++)
      rc = MPI_Send(&token, 0, MPI_BYTE, r, tag + 1, s->mb_comm);
    MPI_UNLOCK();
    if (rc != MPI_SUCCESS) {
      char t[256];
      mpi_text(rc, t, sizeof t);
      st = tdist__bctx_fail(b, TDIST_ERR_REMOTE, "monitored_barrier: MPI error: %s", t);
    }
  }
  free(reqs);
  return st;
}

static tdist_status_t mpi_run(tdist__bctx_t *b, const tdist__coll_t *c, int64_t deadline_ms) {
  (void)deadline_ms; /* the watchdog ends the job at the timeout (MPI cannot cancel) */
  mstate_t *s = b->state;
  if (c->kind == TDIST__COLL_MONITORED_BARRIER) return monitored_barrier(s, c);
  int *scratch = NULL;
  busy_begin(s, c);
  int rc;
  if (c->async) {
    MPI_Request req = MPI_REQUEST_NULL;
    MPI_LOCK();
    rc = issue(s, c, &req, &scratch);
    MPI_UNLOCK();
    if (rc == MPI_SUCCESS) rc = wait_all(1, &req);
  } else {
    MPI_LOCK();
    rc = issue(s, c, NULL, &scratch);
    MPI_UNLOCK();
  }
  busy_end(s);
  free(scratch);
  if (rc != MPI_SUCCESS) {
    char t[256], what[TDIST__WHAT_MAX];
    mpi_text(rc, t, sizeof t);
    return tdist__bctx_fail(b, TDIST_ERR_REMOTE, "%s in group '%s': %s",
                            H->coll_what(what, c->kind, c->seq), b->name, t);
  }
  if (c->op == TDIST_AVG &&
      (c->kind == TDIST__COLL_ALL_REDUCE || (c->kind == TDIST__COLL_REDUCE && b->rank == c->root) ||
       c->kind == TDIST__COLL_REDUCE_SCATTER))
    H->reduce_finish_avg(c->out, c->count, c->dtype, b->size);
  return TDIST_OK;
}

static const tdist__backend_t k_backend = {
    .name = "mpi",
    .connect = mpi_connect,
    .destroy = mpi_destroy,
    .run = mpi_run,
    .check = mpi_check,
};

static const tdist__mpi_plugin_t k_plugin = {
    .abi = TDIST__MPI_ABI,
    .sizes = TDIST__MPI_SIZES_INIT,
    .backend = &k_backend,
    .world = world,
    .library = library,
};

__attribute__((visibility("default"))) const tdist__mpi_plugin_t *tdist_mpi_plugin_v1(
    const tdist__mpi_host_t *host) {
  /* An older host's struct may be shorter: its abi (first, in every version) decides first. */
  if (!host || host->abi != TDIST__MPI_ABI || !tdist__mpi_abi_match(host->abi, &host->sizes))
    return NULL;
  H = host;
  return &k_plugin;
}
