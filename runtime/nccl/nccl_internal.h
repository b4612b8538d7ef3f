/* State shared by the nccl backend's files: nccl.c (communicators, waiting, watchdog, failure)
 * and coll.c (dtype/op tables, argument checks, one NCCL call sequence per collective).
 *
 * Locking: `mu` guards `comm` and every NCCL call on it, because the watchdog thread may abort
 * the communicator at any moment (ncclCommAbort frees it). Nothing under `mu` blocks without a
 * deadline: the communicator is non-blocking, so NCCL calls return at once (ncclInProgress at
 * worst) and progress is polled. The CUDA event is only touched by the thread running the op. */
#ifndef TDIST_NCCL_NCCL_INTERNAL_H
#define TDIST_NCCL_NCCL_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "runtime/common/status_internal.h"
#include "runtime/nccl/loader.h"
#include "runtime/pg/backend.h"

#define TDIST__NCCL_PTR_CACHE 8

typedef struct tdist__nccl {
  tdist__nccl_lib_t lib;
  int dev;              /* CUDA device of this group (inherited by subgroups) */
  const char *dev_from; /* how it was chosen, for messages */
  cudaStream_t stream;  /* one per group; synchronises with the legacy default stream */
  cudaEvent_t ev;       /* recorded after each op; the op is done when it completes */
  void *scratch;        /* one device byte: barrier is an all_reduce of it */
  int use_split;        /* subgroups come from ncclCommSplit */
  int check_ptrs;       /* TDIST_NCCL_CHECK_POINTERS (default 1) */
  int64_t spin_ns;      /* busy-poll this long before sleeping between event queries */
  const void *ptr_ok[TDIST__NCCL_PTR_CACHE]; /* device pointers already validated */
  unsigned ptr_next;

  pthread_mutex_t mu;
  ncclComm_t comm;     /* NULL once aborted or destroyed */
  _Atomic int failed;  /* the communicator failed: fail_st/fail_msg say how (set once) */
  _Atomic int failing; /* fail_locked began (under mu): fail_st/fail_msg are set */
  tdist_status_t fail_st;
  char fail_msg[TDIST__ERRMSG_MAX];
  _Atomic int64_t inflight_dl; /* deadline (ms) of the op in flight, 0 = none */

  pthread_t wd;
  int wd_started;
  int wd_stop_fd; /* eventfd: stops the watchdog */
} tdist__nccl_t;

static inline tdist__nccl_t *tdist__nccl(tdist__bctx_t *b) { return (tdist__nccl_t *)b->state; }

/* ---- coll.c ---- */

/* The NCCL enum for a tdist dtype / reduce op: 0 and *out set, or -1 where NCCL has none. */
int tdist__nccl_dtype(tdist_dtype_t dtype, ncclDataType_t *out);
int tdist__nccl_op(tdist_reduce_op_t op, ncclRedOp_t *out);

/* The backend's check hook: NOT_AVAILABLE for what NCCL cannot do, INVALID_ARGUMENT for buffers
 * that are not device memory of this group's device. Never fails the group. */
tdist_status_t tdist__nccl_check(tdist__bctx_t *b, const tdist__coll_t *c);

/* Issues the NCCL calls of one collective on the group's stream (under mu); returns what the
 * last NCCL call returned and names it in *call. */
ncclResult_t tdist__nccl_enqueue_locked(tdist__bctx_t *b, const tdist__coll_t *c,
                                        const char **call);

/* ---- nccl.c ---- */

/* Under mu: turns an NCCL result into a group failure (ncclInProgress is first polled to its end
 * within dl). TDIST_OK when the call succeeded. */
tdist_status_t tdist__nccl_settle_locked(tdist__bctx_t *b, ncclResult_t r, int64_t dl,
                                         const char *call, const char *what);

#endif
