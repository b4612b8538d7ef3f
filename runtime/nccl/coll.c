/* The nccl backend's collectives: tdist dtype/op -> NCCL enums, what NCCL cannot do (refused
 * before anything is queued, without failing the group), and the NCCL calls of each collective.
 *
 *   all_reduce / broadcast / reduce / reduce_scatter   one NCCL collective (avg: ncclAvg)
 *   all_gather       ncclAllGather; uneven sizes (all_gather_v): grouped ncclBroadcast per rank
 *   gather / scatter / all_to_all(_v) / send / recv    grouped ncclSend/ncclRecv (as PyTorch)
 *   barrier          all_reduce of one device byte (as PyTorch)
 *   monitored_barrier, BAND/BOR/BXOR                    TDIST_ERR_NOT_AVAILABLE
 * Tags of send/recv are not seen by NCCL: messages between two ranks match in call order. */
#include <stdio.h>
#include <string.h>

#include "runtime/nccl/nccl_internal.h"

static const int k_dtypes[TDIST_DTYPE_COUNT_] = {
    [TDIST_FLOAT16] = ncclFloat16, [TDIST_BFLOAT16] = ncclBfloat16, [TDIST_FLOAT32] = ncclFloat32,
    [TDIST_FLOAT64] = ncclFloat64, [TDIST_INT8] = ncclInt8,         [TDIST_UINT8] = ncclUint8,
    [TDIST_INT32] = ncclInt32,     [TDIST_INT64] = ncclInt64,
};

#define NO_OP (-1)
static const int k_ops[TDIST_REDUCE_OP_COUNT_] = {
    [TDIST_SUM] = ncclSum, [TDIST_PROD] = ncclProd, [TDIST_MIN] = ncclMin, [TDIST_MAX] = ncclMax,
    [TDIST_AVG] = ncclAvg, [TDIST_BAND] = NO_OP,    [TDIST_BOR] = NO_OP,   [TDIST_BXOR] = NO_OP,
};

int tdist__nccl_dtype(tdist_dtype_t dtype, ncclDataType_t *out) {
  if ((unsigned)dtype >= TDIST_DTYPE_COUNT_) return -1;
  *out = (ncclDataType_t)k_dtypes[dtype];
  return 0;
}

int tdist__nccl_op(tdist_reduce_op_t op, ncclRedOp_t *out) {
  if ((unsigned)op >= TDIST_REDUCE_OP_COUNT_ || k_ops[op] == NO_OP) return -1;
  *out = (ncclRedOp_t)k_ops[op];
  return 0;
}

static int has_op(tdist__coll_kind_t k) {
  return k == TDIST__COLL_ALL_REDUCE || k == TDIST__COLL_REDUCE || k == TDIST__COLL_REDUCE_SCATTER;
}

/* A buffer handed to NCCL must be memory of the group's device (or managed memory): a host
 * pointer would fault inside the kernel, far from the call that passed it. The last few good
 * pointers are remembered, so a training loop pays for the lookup once per buffer. */
static tdist_status_t check_ptr(tdist__bctx_t *b, const void *p, const char *fn, const char *name) {
  tdist__nccl_t *g = tdist__nccl(b);
  for (int i = 0; i < TDIST__NCCL_PTR_CACHE; i++)
    if (g->ptr_ok[i] == p) return TDIST_OK;
  struct cudaPointerAttributes a;
  memset(&a, 0, sizeof a);
  cudaError_t e = g->lib.cudaPointerGetAttributes(&a, p);
  if (e != cudaSuccess)
    return tdist__bctx_fail(b, TDIST_ERR_INVALID_ARGUMENT,
                            "%s: %s %p is not CUDA memory "
                            "(cudaPointerGetAttributes: %s); backend nccl needs device buffers "
                            "(cudaMalloc) on device %d",
                            fn, name, p, g->lib.cudaGetErrorName(e), g->dev);
  if (a.type == cudaMemoryTypeDevice && a.device != g->dev)
    return tdist__bctx_fail(b, TDIST_ERR_INVALID_ARGUMENT,
                            "%s: %s %p is memory of device %d, but "
                            "this group uses device %d (%s)",
                            fn, name, p, a.device, g->dev, g->dev_from);
  if (a.type != cudaMemoryTypeDevice && a.type != cudaMemoryTypeManaged)
    return tdist__bctx_fail(b, TDIST_ERR_INVALID_ARGUMENT,
                            "%s: %s %p is host memory (%s); "
                            "backend nccl needs device buffers (cudaMalloc) on device %d",
                            fn, name, p,
                            a.type == cudaMemoryTypeHost ? "page-locked"
                                                         : "not registered with "
                                                           "CUDA",
                            g->dev);
  g->ptr_ok[g->ptr_next++ % TDIST__NCCL_PTR_CACHE] = p;
  return TDIST_OK;
}

static size_t total(const size_t *counts, int n) {
  size_t t = 0;
  for (int i = 0; i < n; i++) t += counts[i];
  return t;
}

#define CHECK_PTR(p, n, name)                             \
  do {                                                    \
    if ((n) > 0) {                                        \
      tdist_status_t st_ = check_ptr(b, (p), fn, (name)); \
      if (st_) return st_;                                \
    }                                                     \
  } while (0)

tdist_status_t tdist__nccl_check(tdist__bctx_t *b, const tdist__coll_t *c) {
  tdist__nccl_t *g = tdist__nccl(b);
  const char *fn = tdist__coll_name(c->kind);
  if (c->kind == TDIST__COLL_MONITORED_BARRIER)
    return tdist__bctx_fail(
        b, TDIST_ERR_NOT_AVAILABLE,
        "monitored_barrier is not available with "
        "backend nccl (PyTorch supports it on gloo only): use tdist_barrier, or "
        "a gloo group for the monitored barrier");
  ncclDataType_t dt;
  ncclRedOp_t op;
  if (c->kind != TDIST__COLL_BARRIER && tdist__nccl_dtype(c->dtype, &dt) != 0)
    return tdist__bctx_fail(b, TDIST_ERR_NOT_AVAILABLE,
                            "%s: dtype %s is not available with "
                            "backend nccl",
                            fn, tdist_dtype_name(c->dtype));
  if (has_op(c->kind) && tdist__nccl_op(c->op, &op) != 0)
    return tdist__bctx_fail(b, TDIST_ERR_NOT_AVAILABLE,
                            "%s: Cannot use ReduceOp.%s with NCCL "
                            "(NCCL reduces with SUM, PRODUCT, MIN, MAX and AVG only)",
                            fn, tdist_reduce_op_name(c->op));
  if (!g || !g->check_ptrs) return TDIST_OK;
  int me = b->rank, p = b->size;
  switch (c->kind) {
    case TDIST__COLL_ALL_REDUCE:
    case TDIST__COLL_BROADCAST:
    case TDIST__COLL_REDUCE: CHECK_PTR(c->out, c->count, "buf"); break;
    case TDIST__COLL_ALL_GATHER_V:
      CHECK_PTR(c->in, c->counts[me], "in");
      CHECK_PTR(c->out, total(c->counts, p), "out");
      break;
    case TDIST__COLL_GATHER:
      CHECK_PTR(c->in, c->count, "in");
      if (me == c->root) CHECK_PTR(c->out, c->count, "out");
      break;
    case TDIST__COLL_SCATTER:
      CHECK_PTR(c->out, c->count, "out");
      if (me == c->root) CHECK_PTR(c->in, c->count, "in");
      break;
    case TDIST__COLL_REDUCE_SCATTER:
      CHECK_PTR(c->in, c->count, "in");
      CHECK_PTR(c->out, c->count, "out");
      break;
    case TDIST__COLL_ALL_TO_ALL_V:
      CHECK_PTR(c->in, total(c->in_counts, p), "in");
      CHECK_PTR(c->out, total(c->counts, p), "out");
      break;
    case TDIST__COLL_SEND: CHECK_PTR(c->in, c->count, "buf"); break;
    case TDIST__COLL_RECV: CHECK_PTR(c->out, c->count, "buf"); break;
    default: break;
  }
  return TDIST_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* Enqueueing                                                                                */

/* Calls inside ncclGroupStart/End: the first failure is kept, the group is always closed. */
typedef struct {
  tdist__nccl_t *g;
  ncclResult_t first;
  const char *call;
} grp_t;

static void grp_note(grp_t *q, ncclResult_t r, const char *call) {
  if (r != ncclSuccess && r != ncclInProgress && q->first == ncclSuccess) {
    q->first = r;
    q->call = call;
  }
}

/* base + off bytes is only formed for a non-empty message (base may be NULL otherwise). */
static void send_to(grp_t *q, const char *base, size_t off, size_t n, ncclDataType_t dt, int peer) {
  if (n)
    grp_note(q, q->g->lib.ncclSend(base + off, n, dt, peer, q->g->comm, q->g->stream), "ncclSend");
}

static void recv_from(grp_t *q, char *base, size_t off, size_t n, ncclDataType_t dt, int peer) {
  if (n)
    grp_note(q, q->g->lib.ncclRecv(base + off, n, dt, peer, q->g->comm, q->g->stream), "ncclRecv");
}

static int uniform(const tdist__coll_t *c, int p) {
  for (int r = 0; r < p; r++)
    if (c->counts[r] != c->count || c->displs[r] != (size_t)r * c->count) return 0;
  return 1;
}

ncclResult_t tdist__nccl_enqueue_locked(tdist__bctx_t *b, const tdist__coll_t *c,
                                        const char **call) {
  tdist__nccl_t *g = tdist__nccl(b);
  ncclComm_t comm = g->comm;
  cudaStream_t s = g->stream;
  ncclDataType_t dt = ncclUint8;
  ncclRedOp_t op = ncclSum;
  /* Both map: tdist__nccl_check refused the rest before the op was queued. */
  if (c->kind != TDIST__COLL_BARRIER) tdist__nccl_dtype(c->dtype, &dt);
  if (has_op(c->kind)) tdist__nccl_op(c->op, &op);
  size_t es = tdist_dtype_size(c->dtype);
  char *out = c->out;
  const char *in = c->in;
  int me = b->rank, p = b->size;
  switch (c->kind) {
    case TDIST__COLL_ALL_REDUCE:
      *call = "ncclAllReduce";
      return g->lib.ncclAllReduce(out, out, c->count, dt, op, comm, s);
    case TDIST__COLL_BROADCAST:
      *call = "ncclBroadcast";
      return g->lib.ncclBroadcast(out, out, c->count, dt, c->root, comm, s);
    case TDIST__COLL_REDUCE:
      *call = "ncclReduce";
      return g->lib.ncclReduce(out, out, c->count, dt, op, c->root, comm, s);
    case TDIST__COLL_REDUCE_SCATTER:
      *call = "ncclReduceScatter";
      return g->lib.ncclReduceScatter(in, out, c->count, dt, op, comm, s);
    case TDIST__COLL_BARRIER:
      *call = "ncclAllReduce (barrier)";
      return g->lib.ncclAllReduce(g->scratch, g->scratch, 1, ncclUint8, ncclSum, comm, s);
    case TDIST__COLL_ALL_GATHER_V:
      if (uniform(c, p)) {
        *call = "ncclAllGather";
        return g->lib.ncclAllGather(in, out, c->count, dt, comm, s);
      }
      break;
    default: break;
  }
  grp_t q = {g, ncclSuccess, NULL};
  ncclResult_t r = g->lib.ncclGroupStart();
  if (r != ncclSuccess) {
    *call = "ncclGroupStart";
    return r;
  }
  switch (c->kind) {
    case TDIST__COLL_ALL_GATHER_V: /* uneven: every rank broadcasts its block */
      for (int i = 0; i < p; i++)
        if (c->counts[i])
          grp_note(&q,
                   g->lib.ncclBroadcast(i == me ? in : out + c->displs[i] * es,
                                        out + c->displs[i] * es, c->counts[i], dt, i, comm, s),
                   "ncclBroadcast");
      break;
    case TDIST__COLL_GATHER:
      if (me == c->root)
        for (int i = 0; i < p; i++) recv_from(&q, out, (size_t)i * c->count * es, c->count, dt, i);
      send_to(&q, in, 0, c->count, dt, c->root);
      break;
    case TDIST__COLL_SCATTER:
      if (me == c->root)
        for (int i = 0; i < p; i++) send_to(&q, in, (size_t)i * c->count * es, c->count, dt, i);
      recv_from(&q, out, 0, c->count, dt, c->root);
      break;
    case TDIST__COLL_ALL_TO_ALL_V:
      for (int i = 0; i < p; i++) {
        send_to(&q, in, c->in_displs[i] * es, c->in_counts[i], dt, i);
        recv_from(&q, out, c->displs[i] * es, c->counts[i], dt, i);
      }
      break;
    case TDIST__COLL_SEND: send_to(&q, in, 0, c->count, dt, c->peer); break;
    case TDIST__COLL_RECV: recv_from(&q, out, 0, c->count, dt, c->peer); break;
    default: grp_note(&q, ncclInternalError, "(unknown collective)"); break;
  }
  r = g->lib.ncclGroupEnd();
  *call = "ncclGroupEnd";
  if (q.first != ncclSuccess) {
    *call = q.call;
    return q.first;
  }
  return r;
}
