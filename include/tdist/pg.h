/* Process groups and collectives: the C counterpart of torch.distributed.
 *
 * A process group (tdist_pg_t) is one rank's view of a communicator of `world_size` ranks that
 * met through a store. Collectives are called by every rank of the group in the same order with
 * matching arguments. Buffers are borrowed: they must stay valid until the call returns (blocking
 * forms) or until the work handle completes (the `_async` forms).
 *
 * Failure semantics: every call honours the group's timeout and tdist_pg_abort(). A peer that
 * dies or stalls past the timeout makes the call fail with a status and a message naming the peer
 * rank and address (tdist_pg_last_error); the group is then aborted and every later call fails
 * fast with the same error. Destroy the group and create a new one to continue.
 *
 * Threads: a group is used by one thread at a time, except tdist_pg_abort (any thread). Async
 * work runs on one worker thread per group, in submission order, except that async sends and
 * receives in flight together progress in any order (see tdist_send_async).
 *
 * Backend "nccl" (GPU tensors, NVIDIA NCCL >= 2.14):
 *   - Buffers are CUDA device pointers (cudaMalloc, or managed memory) on the group's device;
 *     anything else is refused with TDIST_ERR_INVALID_ARGUMENT before it reaches NCCL
 *     (TDIST_NCCL_CHECK_POINTERS=0 turns the check off). Counts and dtypes are as for gloo.
 *   - Libraries: libcudart and libnccl are opened at tdist_init_process_group (dlopen), never
 *     linked, so programs also run on nodes without them. TDIST_CUDART_LIBRARY and
 *     TDIST_NCCL_LIBRARY name the files to use. No driver, no device, no NCCL or NCCL < 2.14:
 *     TDIST_ERR_NOT_AVAILABLE, with a message naming what is missing.
 *   - Device: TDIST_NCCL_DEVICE, else LOCAL_RANK, else rank % device count (PyTorch's guess).
 *     The calling thread's current device is left as it was.
 *   - Ordering: each group has one CUDA stream, created without cudaStreamNonBlocking, so work
 *     the caller queued on the legacy default stream before a call is complete before NCCL
 *     reads the buffers; work on other streams must be synchronised by the caller. Blocking
 *     calls return when the NCCL kernels have finished; async work completes the same way, one
 *     operation at a time per group, in submission order.
 *   - Not available (TDIST_ERR_NOT_AVAILABLE, the group stays usable): BAND/BOR/BXOR and
 *     tdist_monitored_barrier (PyTorch supports it on gloo only). gather, scatter, all_to_all(_v)
 *     and uneven all_gather_v are built from grouped NCCL calls, as PyTorch does. Send/recv
 *     tags are not seen by NCCL: messages between two ranks match in call order, and a send
 *     waits for its receive (order pairwise exchanges even/odd, or use all_to_all_v).
 *   - Failure: communicators are non-blocking; a watchdog polls ncclCommGetAsyncError. A timeout,
 *     an asynchronous NCCL error or tdist_pg_abort aborts the communicator (ncclCommAbort) before
 *     the failing call returns; the message carries NCCL's own text (ncclGetLastError).
 *   - Subgroups split the parent's communicator (ncclCommSplit, NCCL >= 2.18): every rank of the
 *     parent must call tdist_new_group, as the API already requires. TDIST_NCCL_COMM_SPLIT=0
 *     gives each subgroup a communicator of its own instead.
 *   - Tuning: TDIST_NCCL_SPIN_US (default 10000) is how long a waiting thread polls the GPU
 *     before it sleeps in 50 us steps. NCCL's own variables (NCCL_DEBUG, ...) apply as usual.
 *
 * Backend "mpi" (the machine's MPI; start the ranks with mpirun):
 *   - Rank and world size are MPI_COMM_WORLD's; store and init_method are not used; a rank or
 *     world_size in the options, or RANK/WORLD_SIZE, that contradicts MPI is
 *     TDIST_ERR_INVALID_ARGUMENT naming both. MPI is initialised at the first group unless the
 *     program did it, and finalised with the last group if tdist initialised it.
 *   - The plugin libtdist-mpi.so (built against the MPI's mpi.h) is opened with dlopen:
 *     TDIST_MPI_PLUGIN, else beside libtdist, else the loader path. Missing, or without its
 *     libmpi: TDIST_ERR_NOT_AVAILABLE naming every path tried.
 *   - Every collective, dtype and op; f16/bf16, float MIN/MAX and int8/uint8 SUM/PROD reduce
 *     with gloo's kernels (same rounding). Tags match by (peer, tag) in any order. Counts and
 *     displacements are limited to INT_MAX elements.
 *   - Timeouts: MPI cannot cancel a collective; a call older than the group's timeout ends the
 *     job (MPI_Abort(MPI_COMM_WORLD, 124)) after logging which collective. monitored_barrier
 *     fails with TDIST_ERR_TIMEOUT naming the absent ranks. tdist_pg_abort fails later calls
 *     only. */
#ifndef TDIST_PG_H
#define TDIST_PG_H

#include <stddef.h>
#include <stdint.h>

#include "tdist/status.h"
#include "tdist/store.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tdist_pg_s tdist_pg_t;
typedef struct tdist_work_s tdist_work_t;

typedef enum {
  TDIST_FLOAT16 = 0,
  TDIST_BFLOAT16 = 1,
  TDIST_FLOAT32 = 2,
  TDIST_FLOAT64 = 3,
  TDIST_INT8 = 4,
  TDIST_UINT8 = 5,
  TDIST_INT32 = 6,
  TDIST_INT64 = 7,
  TDIST_DTYPE_COUNT_
} tdist_dtype_t;

typedef enum {
  TDIST_SUM = 0,
  TDIST_PROD = 1,
  TDIST_MIN = 2,
  TDIST_MAX = 3,
  TDIST_AVG = 4,  /* sum / world size; integers divide truncating toward zero, like torch */
  TDIST_BAND = 5, /* integer dtypes only */
  TDIST_BOR = 6,
  TDIST_BXOR = 7,
  TDIST_REDUCE_OP_COUNT_
} tdist_reduce_op_t;

/* Size in bytes of one element; 0 for an unknown dtype. */
TDIST_EXTERN size_t tdist_dtype_size(tdist_dtype_t dtype);
TDIST_EXTERN const char *tdist_dtype_name(tdist_dtype_t dtype);
TDIST_EXTERN const char *tdist_reduce_op_name(tdist_reduce_op_t op);

/* Fields are only ever appended. A caller built against an older pg.h passes its smaller size
 * and the fields it lacks take their defaults (version 1 ended at group_name). */
typedef struct {
  size_t size;         /* sizeof(tdist_pg_options_t) */
  int version;         /* 1 */
  const char *backend; /* "gloo" (default), "nccl" (device buffers) or "mpi" (see above) */
  /* Where ranks meet: exactly one of `store` or `init_method` ("env://", the default when both
   * are NULL; "tcp://HOST:PORT[?rank=R&world_size=N]"; "file:///path?rank=R&world_size=N"). */
  const char *init_method;
  tdist_store_t *store;   /* borrowed; must outlive the group */
  int rank;               /* -1: from init_method / RANK */
  int world_size;         /* -1: from init_method / WORLD_SIZE */
  int64_t timeout_ms;     /* every collective's deadline; 0 = 30 min (PyTorch's default) */
  const char *group_name; /* store prefix of this group; NULL = "default_pg" */
  /* Network interface whose IPv4 address peers connect to (gloo). NULL: TDIST_SOCKET_IFNAME,
   * else the interface that reaches the store. */
  const char *socket_ifname;
} tdist_pg_options_t;

#define TDIST_PG_OPTIONS_INIT \
  { sizeof(tdist_pg_options_t), 1, NULL, NULL, NULL, -1, -1, 0, NULL, NULL }

/* Creates this rank's process group; blocks until every rank has joined (or the timeout).
 * On failure tdist_last_error() says what was missing or wrong, with PyTorch's wording for
 * env:// variables. */
TDIST_EXTERN tdist_status_t tdist_init_process_group(const tdist_pg_options_t *opts,
                                                     tdist_pg_t **out);

/* A subgroup of `parent` made of `ranks` (parent ranks, strictly increasing). Every rank of the
 * parent must call it with the same list; ranks not in the list get *out = NULL and TDIST_OK. */
TDIST_EXTERN tdist_status_t tdist_new_group(tdist_pg_t *parent, const int *ranks, int nranks,
                                            tdist_pg_t **out);

TDIST_EXTERN int tdist_pg_rank(const tdist_pg_t *pg);
TDIST_EXTERN int tdist_pg_size(const tdist_pg_t *pg);
TDIST_EXTERN const char *tdist_pg_backend(const tdist_pg_t *pg);
/* The CUDA device index a "nccl" group's buffers must be on (chosen at init: TDIST_NCCL_DEVICE,
 * LOCAL_RANK, ...); -1 for "gloo" (host memory), after tdist_pg_finalize and for an invalid
 * handle. */
TDIST_EXTERN int tdist_pg_device(const tdist_pg_t *pg);

/* Detail of the group's last failure (names the peer rank and address). */
TDIST_EXTERN const char *tdist_pg_last_error(const tdist_pg_t *pg);

/* Waits for queued async work, then closes connections. The handle stays valid (destroy it). */
TDIST_EXTERN tdist_status_t tdist_pg_finalize(tdist_pg_t *pg);
/* Makes every blocked and later call fail with TDIST_ERR_ABORTED. Any thread; NULL is a no-op. */
TDIST_EXTERN void tdist_pg_abort(tdist_pg_t *pg);
/* Aborts if needed and frees the group. NULL is a no-op. */
TDIST_EXTERN void tdist_pg_destroy(tdist_pg_t *pg);

/* ---- collectives (blocking) ---- */

/* In place: buf holds this rank's input and receives the reduction over all ranks. */
TDIST_EXTERN tdist_status_t tdist_all_reduce(tdist_pg_t *pg, void *buf, size_t count,
                                             tdist_dtype_t dtype, tdist_reduce_op_t op);
TDIST_EXTERN tdist_status_t tdist_broadcast(tdist_pg_t *pg, void *buf, size_t count,
                                            tdist_dtype_t dtype, int root);
/* In place; only root's buf receives the result (others' buf may be used as scratch). */
TDIST_EXTERN tdist_status_t tdist_reduce(tdist_pg_t *pg, void *buf, size_t count,
                                         tdist_dtype_t dtype, tdist_reduce_op_t op, int root);
/* out: world_size * count elements, rank r's input at out + r * count. */
TDIST_EXTERN tdist_status_t tdist_all_gather(tdist_pg_t *pg, void *out, const void *in,
                                             size_t count, tdist_dtype_t dtype);
/* Variable sizes: rank r contributes counts[r] elements, placed at out + displs[r] elements. */
TDIST_EXTERN tdist_status_t tdist_all_gather_v(tdist_pg_t *pg, void *out, const size_t *counts,
                                               const size_t *displs, const void *in,
                                               tdist_dtype_t dtype);
/* out (world_size * count) is used on root only (NULL elsewhere). */
TDIST_EXTERN tdist_status_t tdist_gather(tdist_pg_t *pg, void *out, const void *in, size_t count,
                                         tdist_dtype_t dtype, int root);
/* in (world_size * count) is used on root only. */
TDIST_EXTERN tdist_status_t tdist_scatter(tdist_pg_t *pg, void *out, const void *in, size_t count,
                                          tdist_dtype_t dtype, int root);
/* in: world_size * count elements; out (count) gets block `rank` of the reduction. */
TDIST_EXTERN tdist_status_t tdist_reduce_scatter(tdist_pg_t *pg, void *out, const void *in,
                                                 size_t count, tdist_dtype_t dtype,
                                                 tdist_reduce_op_t op);
/* in/out: world_size * count elements; block j of `in` goes to rank j, block i of `out` comes
 * from rank i. */
TDIST_EXTERN tdist_status_t tdist_all_to_all(tdist_pg_t *pg, void *out, const void *in,
                                             size_t count, tdist_dtype_t dtype);
TDIST_EXTERN tdist_status_t tdist_all_to_all_v(tdist_pg_t *pg, void *out, const size_t *out_counts,
                                               const size_t *out_displs, const void *in,
                                               const size_t *in_counts, const size_t *in_displs,
                                               tdist_dtype_t dtype);
TDIST_EXTERN tdist_status_t tdist_barrier(tdist_pg_t *pg);
/* Like barrier, but rank 0 names the ranks that did not arrive within timeout_ms. */
TDIST_EXTERN tdist_status_t tdist_monitored_barrier(tdist_pg_t *pg, int64_t timeout_ms);
TDIST_EXTERN tdist_status_t tdist_send(tdist_pg_t *pg, const void *buf, size_t count,
                                       tdist_dtype_t dtype, int dst, int tag);
TDIST_EXTERN tdist_status_t tdist_recv(tdist_pg_t *pg, void *buf, size_t count, tdist_dtype_t dtype,
                                       int src, int tag);

/* ---- async forms: enqueue and return a work handle ---- */

TDIST_EXTERN tdist_status_t tdist_all_reduce_async(tdist_pg_t *pg, void *buf, size_t count,
                                                   tdist_dtype_t dtype, tdist_reduce_op_t op,
                                                   tdist_work_t **work);
TDIST_EXTERN tdist_status_t tdist_broadcast_async(tdist_pg_t *pg, void *buf, size_t count,
                                                  tdist_dtype_t dtype, int root,
                                                  tdist_work_t **work);
TDIST_EXTERN tdist_status_t tdist_all_gather_async(tdist_pg_t *pg, void *out, const void *in,
                                                   size_t count, tdist_dtype_t dtype,
                                                   tdist_work_t **work);
TDIST_EXTERN tdist_status_t tdist_reduce_scatter_async(tdist_pg_t *pg, void *out, const void *in,
                                                       size_t count, tdist_dtype_t dtype,
                                                       tdist_reduce_op_t op, tdist_work_t **work);
TDIST_EXTERN tdist_status_t tdist_all_to_all_async(tdist_pg_t *pg, void *out, const void *in,
                                                   size_t count, tdist_dtype_t dtype,
                                                   tdist_work_t **work);
TDIST_EXTERN tdist_status_t tdist_barrier_async(tdist_pg_t *pg, tdist_work_t **work);
TDIST_EXTERN tdist_status_t tdist_reduce_async(tdist_pg_t *pg, void *buf, size_t count,
                                               tdist_dtype_t dtype, tdist_reduce_op_t op, int root,
                                               tdist_work_t **work);
TDIST_EXTERN tdist_status_t tdist_gather_async(tdist_pg_t *pg, void *out, const void *in,
                                               size_t count, tdist_dtype_t dtype, int root,
                                               tdist_work_t **work);
TDIST_EXTERN tdist_status_t tdist_scatter_async(tdist_pg_t *pg, void *out, const void *in,
                                                size_t count, tdist_dtype_t dtype, int root,
                                                tdist_work_t **work);
/* The counts/displs arrays are copied: they need not outlive the call. */
TDIST_EXTERN tdist_status_t tdist_all_gather_v_async(tdist_pg_t *pg, void *out,
                                                     const size_t *counts, const size_t *displs,
                                                     const void *in, tdist_dtype_t dtype,
                                                     tdist_work_t **work);
TDIST_EXTERN tdist_status_t tdist_all_to_all_v_async(
    tdist_pg_t *pg, void *out, const size_t *out_counts, const size_t *out_displs, const void *in,
    const size_t *in_counts, const size_t *in_displs, tdist_dtype_t dtype, tdist_work_t **work);
/* Point-to-point, like torch's isend/irecv. Tags are >= 0. A receive takes the first message
 * from src with its tag: messages of one (peer, tag) arrive in sending order, messages of
 * different tags in any order (as Gloo matches them). On the gloo backend a message that arrives
 * before its receive is held (up to TDIST_P2P_BUFFER_MB per group, else the receive fails with
 * TDIST_ERR_NO_MEMORY naming it), and a rank waiting in any call of the group takes such
 * messages off the wire, so a send need not wait for its receive to be posted: two ranks may each
 * send the other before receiving, and a send may come before a collective that precedes its
 * receive on the other rank.
 * Posting order (gloo): posting returns at once, and the async sends and receives a group has in
 * flight progress together, whatever their order, size or number: a receive posted before the
 * send its message depends on (each rank's irecv before its isend, as PyTorch's
 * batch_isend_irecv and pipeline parallelism post them; or a send the peer makes only after it
 * received one posted later here) never waits for that send. Each completes on its own, with its
 * own deadline (the group's timeout from when it starts). A blocking tdist_send/tdist_recv
 * called while async ones are in flight joins them. What stays ordered: a collective runs after
 * the async work submitted before it (so an irecv whose message the peer sends only after a
 * collective that comes later here waits until its deadline), and the sends and receives
 * submitted after a collective start after it. */
TDIST_EXTERN tdist_status_t tdist_send_async(tdist_pg_t *pg, const void *buf, size_t count,
                                             tdist_dtype_t dtype, int dst, int tag,
                                             tdist_work_t **work);
TDIST_EXTERN tdist_status_t tdist_recv_async(tdist_pg_t *pg, void *buf, size_t count,
                                             tdist_dtype_t dtype, int src, int tag,
                                             tdist_work_t **work);

/* Work handles carry a magic word: wait and test refuse NULL, a destroyed handle whose memory
 * is still there, or anything else that is not a handle with TDIST_ERR_INVALID_ARGUMENT
 * (destroy ignores them). That catches mistakes; it does not make a use after free safe. */
/* Waits for the work (timeout_ms < 0: the group's timeout) and returns its status. */
TDIST_EXTERN tdist_status_t tdist_work_wait(tdist_work_t *work, int64_t timeout_ms);
/* *done = 1 when finished (then tdist_work_wait returns at once). */
TDIST_EXTERN tdist_status_t tdist_work_test(tdist_work_t *work, int *done);
/* Frees the handle. Work still running completes in the background and is freed then (its
 * buffers must stay valid until it does: wait first when that matters). NULL is a no-op. */
TDIST_EXTERN void tdist_work_destroy(tdist_work_t *work);

#ifdef __cplusplus
}
#endif
#endif
