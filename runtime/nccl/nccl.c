/* The nccl backend: GPU collectives through NVIDIA's NCCL, loaded at run time (loader.h).
 *
 * One non-blocking NCCL communicator (config.blocking = 0), one CUDA stream and one event per
 * process group. connect(): the CUDA runtime and NCCL are opened, a device is chosen
 * (TDIST_NCCL_DEVICE, else LOCAL_RANK, else rank % devices, as PyTorch guesses), rank 0 creates
 * the unique id and publishes it in the group's store under PyTorch 2.x's key ("0//cuda//0" under
 * default_pg, i.e. wire key "/default_pg/0//cuda//0"; "/cuda//0" under a subgroup's prefix), and
 * every rank joins. Subgroups split the parent's communicator (ncclCommSplit, NCCL >= 2.18; every
 * parent rank takes part, non-members with NCCL_SPLIT_NOCOLOR) unless TDIST_NCCL_COMM_SPLIT=0, in
 * which case they exchange a unique id of their own.
 *
 * run(): the NCCL calls are enqueued on the stream (coll.c), an event is recorded after them and
 * the calling thread (the caller, or the group's async worker) polls the event: busy for
 * TDIST_NCCL_SPIN_US, then in 50 us sleeps, honouring the deadline, tdist_pg_abort and the
 * communicator's asynchronous error. A watchdog thread per group polls ncclCommGetAsyncError every
 * 100 ms, also while the group is idle, and reacts to tdist_pg_abort at once. On an error, a
 * timeout or an abort the communicator is aborted (ncclCommAbort), so no kernel keeps spinning on
 * a dead peer; the failure, with NCCL's own text (ncclGetLastError), is sticky.
 *
 * Must never: block without a deadline, call NCCL on a communicator without holding `mu`, or leave
 * the calling thread's current CUDA device changed. */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "runtime/common/clock.h"
#include "runtime/common/log.h"
#include "runtime/common/param.h"
#include "runtime/nccl/nccl_internal.h"
#include "runtime/store/store_internal.h"

#define WATCHDOG_MS 100
#define SLEEP_NS 50000               /* between event queries once spinning gave up */
#define ASYNC_CHECK_NS (1000 * 1000) /* how often a waiter asks for the async error */
#define FINALIZE_MAX_MS 30000

static const char *result_name(ncclResult_t r) {
  static const char *const names[] = {
      "ncclSuccess",         "ncclUnhandledCudaError", "ncclSystemError", "ncclInternalError",
      "ncclInvalidArgument", "ncclInvalidUsage",       "ncclRemoteError", "ncclInProgress"};
  return (unsigned)r < sizeof names / sizeof *names ? names[r] : "ncclResult(unknown)";
}

/* Whose fault an NCCL result says it is, in tdist's categories. */
static tdist_status_t result_status(ncclResult_t r) {
  switch (r) {
    case ncclSuccess: return TDIST_OK;
    case ncclUnhandledCudaError:
    case ncclSystemError: return TDIST_ERR_SYSTEM;
    case ncclInvalidArgument: return TDIST_ERR_INVALID_ARGUMENT;
    case ncclInvalidUsage: return TDIST_ERR_INVALID_USAGE;
    case ncclRemoteError: return TDIST_ERR_REMOTE;
    case ncclInProgress: return TDIST_ERR_IN_PROGRESS;
    default: return TDIST_ERR_INTERNAL;
  }
}

static void cuda_text(tdist__nccl_t *g, cudaError_t e, char *buf, size_t cap) {
  snprintf(buf, cap, "%s (%s)", g->lib.cudaGetErrorName(e), g->lib.cudaGetErrorString(e));
}

/* Under mu. Records the first failure, aborts the communicator (kernels and proxy threads stop
 * waiting for peers) and puts the recorded text in the group's error. Returns the recorded status:
 * an earlier failure wins. `failing` goes up before the abort, `failed` once it returned: an
 * abort may complete the op in flight, and a waiter that then sees its event done must still
 * report the failure (it checks `failing` after the event), but only once the abort is over
 * (it takes mu), so the caller may free its buffers at once. */
static tdist_status_t fail_locked(tdist__bctx_t *b, tdist_status_t st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static tdist_status_t fail_locked(tdist__bctx_t *b, tdist_status_t st, const char *fmt, ...) {
  tdist__nccl_t *g = tdist__nccl(b);
  if (!atomic_load(&g->failed)) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g->fail_msg, sizeof g->fail_msg, fmt, ap);
    va_end(ap);
    g->fail_st = st;
    atomic_store(&g->failing, 1);
    if (g->comm) {
      tdist__log(TDIST__LOG_WARN, "nccl", "group '%s' rank %d: aborting the NCCL communicator: %s",
                 b->name, b->rank, g->fail_msg);
      ncclResult_t r = g->lib.ncclCommAbort(g->comm);
      if (r != ncclSuccess)
        tdist__log(TDIST__LOG_WARN, "nccl", "ncclCommAbort returned %s", result_name(r));
      g->comm = NULL;
    }
    atomic_store(&g->failed, 1);
  }
  return tdist__bctx_fail(b, g->fail_st, "%s", g->fail_msg);
}

static tdist_status_t fail(tdist__bctx_t *b, tdist_status_t st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static tdist_status_t fail(tdist__bctx_t *b, tdist_status_t st, const char *fmt, ...) {
  tdist__nccl_t *g = tdist__nccl(b);
  char msg[TDIST__ERRMSG_MAX];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  pthread_mutex_lock(&g->mu);
  st = fail_locked(b, st, "%s", msg);
  pthread_mutex_unlock(&g->mu);
  return st;
}

/* The failure recorded earlier, as the group's error. */
static tdist_status_t recorded(tdist__bctx_t *b) {
  tdist__nccl_t *g = tdist__nccl(b);
  return tdist__bctx_fail(b, g->fail_st, "%s", g->fail_msg);
}

/* Under mu: fails the group for a bad NCCL result, naming the call (NULL: an asynchronous error
 * of the communicator), NCCL's category and its own last error text. */
static tdist_status_t nccl_error_locked(tdist__bctx_t *b, ncclResult_t r, const char *call,
                                        const char *what) {
  tdist__nccl_t *g = tdist__nccl(b);
  const char *last = g->lib.ncclGetLastError(NULL);
  char ver[32], head[96];
  tdist__nccl_version_str(g->lib.nccl_version, ver, sizeof ver);
  if (call)
    snprintf(head, sizeof head, "%s failed", call);
  else
    snprintf(head, sizeof head, "the NCCL communicator failed asynchronously");
  return fail_locked(b, result_status(r),
                     "%s: %s: %s (%s). NCCL: %s [rank %d of %d, device %d, "
                     "NCCL %s]",
                     what, head, result_name(r), g->lib.ncclGetErrorString(r),
                     last && *last ? last : "(no detail)", b->rank, b->size, g->dev, ver);
}

/* Under mu: polls ncclCommGetAsyncError(comm) while NCCL works in the background (ncclInProgress),
 * up to dl and unless the group is aborted. Returns the final result, or ncclInProgress with
 * *gave_up = 1 (deadline) / 2 (aborted). */
static ncclResult_t poll_async_locked(tdist__bctx_t *b, ncclComm_t comm, int64_t dl, int *gave_up) {
  tdist__nccl_t *g = tdist__nccl(b);
  *gave_up = 0;
  for (unsigned i = 0;; i++) {
    ncclResult_t a = ncclInProgress;
    ncclResult_t r = g->lib.ncclCommGetAsyncError(comm, &a);
    if (r != ncclSuccess) return r;
    if (a != ncclInProgress) return a;
    if (atomic_load(&b->aborted)) {
      *gave_up = 2;
      return ncclInProgress;
    }
    if (tdist__now_ms() >= dl) {
      *gave_up = 1;
      return ncclInProgress;
    }
    if (i < 64) {
      sched_yield();
    } else {
      struct timespec ts = {0, i < 1000 ? 20000 : 1000000};
      nanosleep(&ts, NULL);
    }
  }
}

tdist_status_t tdist__nccl_settle_locked(tdist__bctx_t *b, ncclResult_t r, int64_t dl,
                                         const char *call, const char *what) {
  tdist__nccl_t *g = tdist__nccl(b);
  if (r == ncclInProgress && g->comm) {
    int gave_up;
    r = poll_async_locked(b, g->comm, dl, &gave_up);
    if (gave_up == 1)
      return fail_locked(b, TDIST_ERR_TIMEOUT,
                         "%s: %s still in progress when the group timeout "
                         "of %lld ms ran out; NCCL communicator aborted (ncclCommAbort)",
                         what, call, (long long)b->timeout_ms);
    if (gave_up == 2)
      return fail_locked(b, TDIST_ERR_ABORTED, "%s: aborted (tdist_pg_abort) during %s", what,
                         call);
  }
  return r == ncclSuccess ? TDIST_OK : nccl_error_locked(b, r, call, what);
}

/* Asks NCCL whether the communicator failed in the background; fails the group if so. */
static tdist_status_t check_async(tdist__bctx_t *b, const char *what) {
  tdist__nccl_t *g = tdist__nccl(b);
  tdist_status_t st = TDIST_OK;
  pthread_mutex_lock(&g->mu);
  if (g->comm && !atomic_load(&g->failed)) {
    ncclResult_t a = ncclSuccess;
    ncclResult_t r = g->lib.ncclCommGetAsyncError(g->comm, &a);
    if (r != ncclSuccess)
      st = nccl_error_locked(b, r, "ncclCommGetAsyncError", what);
    else if (a != ncclSuccess && a != ncclInProgress)
      st = nccl_error_locked(b, a, NULL, what);
  }
  pthread_mutex_unlock(&g->mu);
  return st;
}

/* Waits for the event recorded after the op: success, or a failure that aborted the
 * communicator (deadline, tdist_pg_abort, asynchronous NCCL error, CUDA error). */
static tdist_status_t wait_done(tdist__bctx_t *b, int64_t dl, const char *what) {
  tdist__nccl_t *g = tdist__nccl(b);
  int64_t t0 = tdist__now_ns(), last_check = t0;
  for (;;) {
    cudaError_t e = g->lib.cudaEventQuery(g->ev);
    if (atomic_load(&g->failing)) {
      pthread_mutex_lock(&g->mu); /* the abort under way (watchdog) finishes first */
      pthread_mutex_unlock(&g->mu);
      return recorded(b);
    }
    if (e == cudaSuccess) return TDIST_OK;
    if (e != cudaErrorNotReady) {
      char t[160];
      cuda_text(g, e, t, sizeof t);
      return fail(b, TDIST_ERR_SYSTEM,
                  "%s: CUDA error while waiting for the NCCL operation on "
                  "device %d: %s; NCCL communicator aborted",
                  what, g->dev, t);
    }
    if (atomic_load(&b->aborted))
      return fail(b, TDIST_ERR_ABORTED,
                  "%s: aborted (tdist_pg_abort) while the NCCL operation "
                  "was in flight; NCCL communicator aborted",
                  what);
    int64_t now = tdist__now_ns();
    if (now / 1000000 >= dl)
      return fail(b, TDIST_ERR_TIMEOUT,
                  "%s: the NCCL operation did not complete within the "
                  "group timeout of %lld ms (rank %d of %d, device %d); NCCL communicator aborted "
                  "(ncclCommAbort). A peer rank probably died, stalled or called a different "
                  "collective",
                  what, (long long)b->timeout_ms, b->rank, b->size, g->dev);
    if (now - last_check >= ASYNC_CHECK_NS) {
      last_check = now;
      tdist_status_t st = check_async(b, what);
      if (st) return st;
    }
    if (now - t0 >= g->spin_ns) {
      struct timespec ts = {0, SLEEP_NS};
      nanosleep(&ts, NULL);
    }
  }
}

/* Makes dev current on this thread; *prev gets what to restore (-1: nothing). */
static tdist_status_t enter_device(tdist__bctx_t *b, int *prev, const char *what) {
  tdist__nccl_t *g = tdist__nccl(b);
  int cur = -1;
  *prev = -1;
  cudaError_t e = g->lib.cudaGetDevice(&cur);
  if (e == cudaSuccess && cur == g->dev) return TDIST_OK;
  if (e == cudaSuccess) *prev = cur;
  if ((e = g->lib.cudaSetDevice(g->dev)) != cudaSuccess) {
    char t[160];
    cuda_text(g, e, t, sizeof t);
    *prev = -1;
    return tdist__bctx_fail(b, TDIST_ERR_SYSTEM, "%s: cudaSetDevice(%d) failed: %s", what, g->dev,
                            t);
  }
  return TDIST_OK;
}

static void leave_device(tdist__nccl_t *g, int prev) {
  if (prev >= 0) g->lib.cudaSetDevice(prev);
}

static tdist_status_t nccl_run(tdist__bctx_t *b, const tdist__coll_t *c, int64_t dl) {
  tdist__nccl_t *g = tdist__nccl(b);
  if (!g)
    return tdist__bctx_fail(b, TDIST_ERR_INVALID_USAGE, "%s: the process group was finalized",
                            tdist__coll_name(c->kind));
  char what[64];
  tdist__coll_what(what, c->kind, c->seq);
  if (atomic_load(&g->failed)) return recorded(b);
  int prev;
  tdist_status_t st = enter_device(b, &prev, what);
  if (st) return st;
  pthread_mutex_lock(&g->mu);
  if (!g->comm) {
    st = atomic_load(&g->failed) ? recorded(b)
                                 : tdist__bctx_fail(b, TDIST_ERR_INVALID_USAGE,
                                                    "%s: the NCCL communicator is gone", what);
  } else {
    const char *call = "ncclGroupEnd";
    ncclResult_t r = tdist__nccl_enqueue_locked(b, c, &call);
    st = tdist__nccl_settle_locked(b, r, dl, call, what);
    if (!st) {
      cudaError_t e = g->lib.cudaEventRecord(g->ev, g->stream);
      if (e != cudaSuccess) {
        char t[160];
        cuda_text(g, e, t, sizeof t);
        st = fail_locked(b, TDIST_ERR_SYSTEM,
                         "%s: cudaEventRecord on the group's stream "
                         "failed: %s; NCCL communicator aborted",
                         what, t);
      }
    }
    if (!st) atomic_store(&g->inflight_dl, dl);
  }
  pthread_mutex_unlock(&g->mu);
  if (!st) st = wait_done(b, dl, what);
  atomic_store(&g->inflight_dl, 0);
  leave_device(g, prev);
  return st;
}

/* ---------------------------------------------------------------------------------------- */
/* Watchdog                                                                                  */

static void *watchdog_main(void *arg) {
  tdist__bctx_t *b = arg;
  tdist__nccl_t *g = tdist__nccl(b);
  g->lib.cudaSetDevice(g->dev); /* our own thread: ncclCommAbort runs here */
  struct pollfd pf[2] = {{.fd = g->wd_stop_fd, .events = POLLIN},
                         {.fd = b->abort_fd, .events = POLLIN}};
  for (;;) {
    int n = poll(pf, 2, WATCHDOG_MS);
    if (n < 0 && errno != EINTR) break;
    if (pf[0].revents) break;
    pthread_mutex_lock(&g->mu);
    int done = !g->comm || atomic_load(&g->failed);
    if (!done) {
      ncclResult_t a = ncclSuccess;
      ncclResult_t r = g->lib.ncclCommGetAsyncError(g->comm, &a);
      int64_t dl = atomic_load(&g->inflight_dl);
      if (atomic_load(&b->aborted))
        fail_locked(b, TDIST_ERR_ABORTED,
                    "process group '%s' was aborted (tdist_pg_abort); "
                    "NCCL communicator aborted",
                    b->name);
      else if (r != ncclSuccess)
        nccl_error_locked(b, r, "ncclCommGetAsyncError", "watchdog");
      else if (a != ncclSuccess && a != ncclInProgress)
        nccl_error_locked(b, a, NULL, "watchdog");
      else if (dl && tdist__now_ms() > dl + WATCHDOG_MS)
        /* Backstop: the waiter enforces the deadline itself unless it is stuck in CUDA. */
        fail_locked(b, TDIST_ERR_TIMEOUT,
                    "watchdog: NCCL operation still running %d ms after "
                    "the group timeout of %lld ms; NCCL communicator aborted",
                    WATCHDOG_MS, (long long)b->timeout_ms);
      done = atomic_load(&g->failed);
    }
    pthread_mutex_unlock(&g->mu);
    if (done) break; /* the communicator is gone: nothing left to watch */
  }
  return NULL;
}

/* ---------------------------------------------------------------------------------------- */
/* Connect                                                                                   */

/* Reads LOCAL_RANK as a device index: 1 and *dev set, 0 if unset, -1 if bad. */
static int local_rank_index(int *dev) {
  const char *v = getenv("LOCAL_RANK");
  if (!v || !*v) return 0;
  char *end;
  errno = 0;
  long x = strtol(v, &end, 10);
  if (errno || *end || x < 0 || x > INT_MAX) return -1;
  *dev = (int)x;
  return 1;
}

static tdist_status_t choose_device(tdist__bctx_t *b, int ndev) {
  tdist__nccl_t *g = tdist__nccl(b);
  const char *cvd = getenv("CUDA_VISIBLE_DEVICES");
  if (b->parent) { /* one process, one device: subgroups use the parent's */
    g->dev = tdist__nccl(b->parent)->dev;
    g->dev_from = "the parent group";
    return TDIST_OK;
  }
  /* TDIST_NCCL_DEVICE was validated in nccl_connect. */
  int d = (int)tdist__param_int(TDIST__P_NCCL_DEVICE),
      k = tdist__param_is_set(TDIST__P_NCCL_DEVICE);
  const char *from = "TDIST_NCCL_DEVICE";
  if (k == 0) {
    from = "LOCAL_RANK";
    if ((k = local_rank_index(&d)) < 0)
      return tdist__bctx_fail(b, TDIST_ERR_INVALID_ARGUMENT,
                              "LOCAL_RANK='%s' is not a "
                              "non-negative integer",
                              getenv("LOCAL_RANK"));
  }
  if (k == 0) {
    from = "rank % device count (no LOCAL_RANK)";
    d = b->rank % ndev;
  }
  if (d >= ndev)
    return tdist__bctx_fail(b, TDIST_ERR_NOT_AVAILABLE,
                            "backend nccl: %s selects CUDA device %d "
                            "but this node has %d (CUDA_VISIBLE_DEVICES=%s): run at most %d "
                            "processes per node or set TDIST_NCCL_DEVICE",
                            from, d, ndev, cvd ? cvd : "unset", ndev);
  g->dev = d;
  g->dev_from = from;
  return TDIST_OK;
}

/* Rank 0 creates the unique id and publishes it; the others wait for it (PyTorch's key). */
static tdist_status_t exchange_id(tdist__bctx_t *b, ncclUniqueId *id, int64_t dl) {
  tdist__nccl_t *g = tdist__nccl(b);
  const char *key = b->parent_ranks ? "/cuda//0" : "0//cuda//0";
  tdist_status_t st;
  if (b->rank == 0) {
    ncclResult_t r = g->lib.ncclGetUniqueId(id);
    if (r != ncclSuccess) {
      const char *last = g->lib.ncclGetLastError(NULL);
      return tdist__bctx_fail(b, result_status(r), "ncclGetUniqueId failed: %s (%s). NCCL: %s",
                              result_name(r), g->lib.ncclGetErrorString(r), last ? last : "");
    }
    if ((st = tdist_store_set(b->store, key, id, sizeof *id)))
      return tdist__bctx_fail(b, st, "cannot publish the NCCL unique id (store key '%s/%s'): %s",
                              b->name, key, tdist_store_last_error(b->store));
    return TDIST_OK;
  }
  int64_t left = dl - tdist__now_ms();
  void *v = NULL;
  size_t len = 0;
  st = tdist__store_get_ms(b->store, key, &v, &len, left > 0 ? left : 1);
  char why[TDIST__ERRMSG_MAX];
  snprintf(why, sizeof why, "%s", st ? tdist_store_last_error(b->store) : "");
  if (st)
    return tdist__bctx_fail(b, st,
                            "rank %d: no NCCL unique id from rank 0 (store key '%s/%s'): "
                            "%s; did rank 0 fail to start the nccl backend?",
                            b->rank, b->name, key, why);
  if (len != sizeof *id) {
    tdist_free(v);
    return tdist__bctx_fail(b, TDIST_ERR_PROTOCOL,
                            "store key '%s/%s' holds %zu bytes, not a "
                            "%zu-byte ncclUniqueId",
                            b->name, key, len, sizeof *id);
  }
  memcpy(id, v, sizeof *id);
  tdist_free(v);
  return TDIST_OK;
}

static void nccl_config(tdist__bctx_t *b, ncclConfig_t *cfg) {
  ncclConfig_t init = NCCL_CONFIG_INITIALIZER;
  *cfg = init;
  cfg->blocking = 0;
  cfg->commName = b->name; /* shows in NCCL's logs; b->name outlives the communicator */
}

/* A communicator of our own: unique id through the store, then ncclCommInitRankConfig. */
static tdist_status_t init_comm(tdist__bctx_t *b, int64_t dl) {
  tdist__nccl_t *g = tdist__nccl(b);
  ncclUniqueId id;
  tdist_status_t st = exchange_id(b, &id, dl);
  if (st) return st;
  ncclConfig_t cfg;
  nccl_config(b, &cfg);
  char what[96];
  snprintf(what, sizeof what, "NCCL communicator init (rank %d of %d, device %d)", b->rank, b->size,
           g->dev);
  pthread_mutex_lock(&g->mu);
  ncclComm_t comm = NULL;
  ncclResult_t r = g->lib.ncclCommInitRankConfig(&comm, b->size, id, b->rank, &cfg);
  g->comm = comm; /* valid while in progress: abort needs it */
  if (r == ncclInProgress && comm) {
    int gave_up;
    r = poll_async_locked(b, comm, dl, &gave_up);
    if (gave_up)
      st = fail_locked(b, TDIST_ERR_TIMEOUT,
                       "%s did not complete within %lld ms: some ranks "
                       "never joined (did they fail to start the nccl backend?); NCCL "
                       "communicator aborted",
                       what, (long long)b->timeout_ms);
  }
  if (!st && r != ncclSuccess) st = nccl_error_locked(b, r, "ncclCommInitRankConfig", what);
  pthread_mutex_unlock(&g->mu);
  return st;
}

/* ncclCommSplit of the parent's communicator: color 0 for members (key = rank in the subgroup),
 * NCCL_SPLIT_NOCOLOR for the others (child NULL). A failure also fails the parent: its
 * communicator is left in the middle of a collective. */
static tdist_status_t split_comm(tdist__bctx_t *parent, tdist__bctx_t *child, int64_t dl) {
  tdist__nccl_t *pgs = tdist__nccl(parent);
  ncclConfig_t cfg;
  nccl_config(child ? child : parent, &cfg);
  char what[96];
  snprintf(what, sizeof what, "ncclCommSplit of group '%s' (%s)", parent->name,
           child ? "member" : "not a member");
  pthread_mutex_lock(&pgs->mu);
  if (!pgs->comm) {
    pthread_mutex_unlock(&pgs->mu);
    tdist_status_t st = atomic_load(&pgs->failed) ? recorded(parent) : TDIST_ERR_INVALID_USAGE;
    return tdist__bctx_fail(child ? child : parent, st,
                            "%s: the parent's NCCL communicator is "
                            "gone: %s",
                            what, parent->last_error(parent));
  }
  ncclComm_t nc = NULL;
  ncclResult_t r = pgs->lib.ncclCommSplit(pgs->comm, child ? 0 : NCCL_SPLIT_NOCOLOR,
                                          child ? child->rank : parent->rank, &nc, &cfg);
  if (child) tdist__nccl(child)->comm = nc;
  tdist_status_t st = TDIST_OK;
  int gave_up = 0;
  if (r == ncclInProgress) { /* the parent reports the split's progress, the child its init */
    r = poll_async_locked(parent, pgs->comm, dl, &gave_up);
    if (r == ncclSuccess && nc) r = poll_async_locked(parent, nc, dl, &gave_up);
  }
  if (gave_up)
    st = fail_locked(parent, TDIST_ERR_TIMEOUT,
                     "%s did not complete within %lld ms: did every "
                     "rank of the parent call tdist_new_group? Parent's NCCL communicator "
                     "aborted",
                     what, (long long)parent->timeout_ms);
  else if (r != ncclSuccess)
    st = nccl_error_locked(parent, r, "ncclCommSplit", what);
  else if (!child != !nc)
    st = fail_locked(parent, TDIST_ERR_INTERNAL, "%s: NCCL returned %s communicator", what,
                     nc ? "a" : "no");
  pthread_mutex_unlock(&pgs->mu);
  if (st && child) {
    if (nc) pgs->lib.ncclCommAbort(nc);
    tdist__nccl(child)->comm = NULL;
    tdist__bctx_fail(child, st, "%s", parent->last_error(parent));
  }
  return st;
}

static tdist_status_t cuda_fail(tdist__bctx_t *b, cudaError_t e, const char *call) {
  char t[160];
  cuda_text(tdist__nccl(b), e, t, sizeof t);
  return tdist__bctx_fail(b, TDIST_ERR_SYSTEM, "backend nccl: %s on device %d failed: %s", call,
                          tdist__nccl(b)->dev, t);
}

/* Devices present, or NOT_AVAILABLE naming cudaGetDeviceCount's answer and the libraries. */
static tdist_status_t count_devices(tdist__bctx_t *b, int *ndev) {
  tdist__nccl_t *g = tdist__nccl(b);
  int n = 0, drv = 0, rt = 0;
  cudaError_t e = g->lib.cudaGetDeviceCount(&n);
  g->lib.cudaDriverGetVersion(&drv);
  g->lib.cudaRuntimeGetVersion(&rt);
  if (e == cudaSuccess && n > 0) {
    *ndev = n;
    return TDIST_OK;
  }
  char t[160] = "0 devices";
  if (e != cudaSuccess) cuda_text(g, e, t, sizeof t);
  const char *cvd = getenv("CUDA_VISIBLE_DEVICES");
  return tdist__bctx_fail(b, TDIST_ERR_NOT_AVAILABLE,
                          "backend nccl is not available: no usable "
                          "CUDA device: cudaGetDeviceCount returned %s (CUDA runtime %d.%d at %s, "
                          "driver API version %d%s, CUDA_VISIBLE_DEVICES=%s). Run on a GPU node "
                          "with the NVIDIA driver, or use backend gloo",
                          t, rt / 1000, rt % 1000 / 10, g->lib.cudart_path, drv,
                          drv == 0 ? ": no NVIDIA driver (libcuda.so.1) found" : "",
                          cvd ? cvd : "unset");
}

static void nccl_destroy(tdist__bctx_t *b);

static tdist_status_t nccl_connect(tdist__bctx_t *b, int64_t dl) {
  tdist__nccl_t *g = calloc(1, sizeof *g);
  if (!g) return tdist__bctx_fail(b, TDIST_ERR_NO_MEMORY, "nccl: out of memory");
  pthread_mutex_init(&g->mu, NULL);
  g->wd_stop_fd = -1;
  g->dev = -1;
  b->state = g; /* from here on, nccl_destroy cleans up whatever was made */
  char err[TDIST__ERRMSG_MAX];
  /* Every variable an nccl group reads, checked before anything is opened. */
  static const tdist__param_id_t k_params[] = {
      TDIST__P_LOG_LEVEL,           TDIST__P_NCCL_DEVICE,  TDIST__P_NCCL_COMM_SPLIT,
      TDIST__P_NCCL_CHECK_POINTERS, TDIST__P_NCCL_SPIN_US, TDIST__P_NCCL_LIBRARY,
      TDIST__P_CUDART_LIBRARY,      TDIST__P_STATS_FILE};
  const char *bad = tdist__param_first_error(k_params, sizeof k_params / sizeof k_params[0], 0);
  if (bad) return tdist__bctx_fail(b, TDIST_ERR_INVALID_ARGUMENT, "%s", bad);
  tdist_status_t st = tdist__nccl_lib_open(&g->lib, err, sizeof err);
  if (st) {
    tdist__nccl_lib_close(&g->lib);
    return tdist__bctx_fail(b, st, "backend nccl is not available: %s", err);
  }
  int ndev = 0, prev = -1;
  if ((st = count_devices(b, &ndev)) || (st = choose_device(b, ndev))) return st;
  if ((st = enter_device(b, &prev, "backend nccl"))) return st;
  tdist__nccl_t *pgs = b->parent ? tdist__nccl(b->parent) : NULL;
  g->use_split =
      pgs ? pgs->use_split : g->lib.ncclCommSplit && tdist__param_int(TDIST__P_NCCL_COMM_SPLIT);
  g->check_ptrs = (int)tdist__param_int(TDIST__P_NCCL_CHECK_POINTERS);
  g->spin_ns = (int64_t)tdist__param_int(TDIST__P_NCCL_SPIN_US) * 1000;
  cudaError_t e;
  /* cudaStreamDefault: ordered after work the caller queued on the legacy default stream. */
  if ((e = g->lib.cudaStreamCreateWithFlags(&g->stream, cudaStreamDefault)) != cudaSuccess)
    st = cuda_fail(b, e, "cudaStreamCreateWithFlags");
  else if ((e = g->lib.cudaEventCreateWithFlags(&g->ev, cudaEventDisableTiming)) != cudaSuccess)
    st = cuda_fail(b, e, "cudaEventCreateWithFlags");
  else if ((e = g->lib.cudaMalloc(&g->scratch, 1)) != cudaSuccess)
    st = cuda_fail(b, e, "cudaMalloc (1 byte for barrier)");
  if (!st) st = pgs && g->use_split ? split_comm(b->parent, b, dl) : init_comm(b, dl);
  if (!st && (g->wd_stop_fd = eventfd(0, EFD_CLOEXEC)) < 0)
    st = tdist__bctx_fail(b, TDIST_ERR_SYSTEM, "nccl: eventfd: %s", strerror(errno));
  if (!st) {
    if (pthread_create(&g->wd, NULL, watchdog_main, b) != 0)
      st = tdist__bctx_fail(b, TDIST_ERR_SYSTEM, "nccl: cannot start the watchdog thread");
    else
      g->wd_started = 1;
  }
  leave_device(g, prev);
  if (!st) {
    char ver[32];
    tdist__nccl_version_str(g->lib.nccl_version, ver, sizeof ver);
    tdist__log(TDIST__LOG_DEBUG, "nccl",
               "group '%s' rank %d of %d: device %d (from %s), NCCL %s "
               "(%s), CUDA runtime %s, communicator from %s",
               b->name, b->rank, b->size, g->dev, g->dev_from, ver, g->lib.nccl_path,
               g->lib.cudart_path, pgs && g->use_split ? "ncclCommSplit" : "a unique id");
  }
  return st;
}

/* Optional hook: a parent rank that is not in a new subgroup still takes part in the split. */
static tdist_status_t nccl_skip_group(tdist__bctx_t *parent, int64_t dl) {
  tdist__nccl_t *g = tdist__nccl(parent);
  if (!g || !g->use_split) return TDIST_OK;
  int prev;
  tdist_status_t st = enter_device(parent, &prev, "tdist_new_group");
  if (!st) st = split_comm(parent, NULL, dl);
  leave_device(g, prev);
  return st;
}

/* Finalize (flush) then destroy a healthy communicator; abort it when the group failed or
 * flushing does not finish within the group timeout, at most FINALIZE_MAX_MS (a dead peer must
 * not hold tdist_pg_destroy for PyTorch's default 30 minutes). */
static void close_comm(tdist__bctx_t *b) {
  tdist__nccl_t *g = tdist__nccl(b);
  pthread_mutex_lock(&g->mu);
  if (g->comm) {
    if (atomic_load(&b->aborted) || atomic_load(&g->failed)) {
      g->lib.ncclCommAbort(g->comm);
    } else {
      ncclResult_t r = g->lib.ncclCommFinalize(g->comm);
      int gave_up = 0;
      if (r == ncclInProgress)
        r = poll_async_locked(
            b, g->comm,
            tdist__now_ms() + (b->timeout_ms < FINALIZE_MAX_MS ? b->timeout_ms : FINALIZE_MAX_MS),
            &gave_up);
      if (r == ncclSuccess) {
        r = g->lib.ncclCommDestroy(g->comm);
      } else {
        tdist__log(TDIST__LOG_WARN, "nccl",
                   "group '%s' rank %d: ncclCommFinalize %s; aborting "
                   "the communicator",
                   b->name, b->rank, gave_up ? "did not finish in time" : result_name(r));
        g->lib.ncclCommAbort(g->comm);
      }
    }
    g->comm = NULL;
  }
  pthread_mutex_unlock(&g->mu);
}

static void nccl_destroy(tdist__bctx_t *b) {
  tdist__nccl_t *g = tdist__nccl(b);
  if (!g) return;
  if (g->wd_started) {
    uint64_t one = 1;
    ssize_t w = write(g->wd_stop_fd, &one, sizeof one);
    (void)w;
    pthread_join(g->wd, NULL);
  }
  if (g->wd_stop_fd >= 0) close(g->wd_stop_fd);
  if (g->lib.nccl_handle) {
    int prev = -1;
    if (g->dev >= 0) enter_device(b, &prev, "nccl destroy");
    close_comm(b);
    if (g->ev) g->lib.cudaEventDestroy(g->ev);
    if (g->scratch) g->lib.cudaFree(g->scratch);
    if (g->stream) g->lib.cudaStreamDestroy(g->stream);
    leave_device(g, prev);
  }
  tdist__nccl_lib_close(&g->lib);
  pthread_mutex_destroy(&g->mu);
  free(g);
  b->state = NULL;
}

static int nccl_device(const tdist__bctx_t *b) {
  const tdist__nccl_t *g = b->state;
  return g ? g->dev : -1;
}

static const tdist__backend_t k_backend = {
    .name = "nccl",
    .device = nccl_device,
    .connect = nccl_connect,
    .destroy = nccl_destroy,
    .run = nccl_run,
    .check = tdist__nccl_check,
    .skip_group = nccl_skip_group,
};

static const tdist__backend_reg_t k_reg = {.name = "nccl", .order = 1, .be = &k_backend};
__attribute__((constructor)) static void nccl_register(void) { tdist__backend_register(&k_reg); }
