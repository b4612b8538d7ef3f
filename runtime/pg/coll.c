/* Argument checks and the public collectives: each entry point checks the group handle, then
 * its dtype, op, root, peer and buffers, with messages naming the bad value, builds a
 * tdist__coll_t and dispatches it: run now on the caller's thread (after the queued async work,
 * so the group's order holds) or queued on the worker (work.c). A check that fails leaves the
 * group usable; only a collective that fails once it runs makes the group's error sticky. Never
 * talks to peers itself (the backend's `run` does) and never lets an async call borrow the
 * caller's counts/displs arrays: they are copied. */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>

#include "runtime/common/clock.h"
#include "runtime/pg/group.h"
#include "runtime/pg/reduce.h"
#include "runtime/pg/stats.h"

/* After op `what` failed with st (pg->err says why): the group's failure handling. */
static tdist_status_t failed(tdist_pg_t *pg, tdist_status_t st) {
  if (!atomic_load(&pg->b.aborted)) {
    st = tdist__pg_share_failure(pg, st);
    tdist__pg_set_sticky(pg, st);
  }
  tdist__fail(st, "%s", pg->err);
  return st;
}

/* Runs one op with its deadline, its statistics, and the group's failure handling. */
tdist_status_t tdist__pg_run(tdist_pg_t *pg, tdist__coll_t *c) {
  if (atomic_load(&pg->b.aborted))
    return tdist__fail(pg->b.sticky, "%s: process group is aborted after an earlier failure: %s",
                       tdist__coll_name(c->kind), pg->err);
  tdist__stats_op_t sop;
  int64_t deadline = tdist__pg_op_begin(pg, c, &sop);
  tdist_status_t st = pg->be->run(&pg->b, c, deadline);
  tdist__stats_end(pg->stats_group, c, &sop, st);
  return st ? failed(pg, st) : st;
}

int64_t tdist__pg_op_begin(tdist_pg_t *pg, tdist__coll_t *c, tdist__stats_op_t *sop) {
  /* One clock reading for the deadline and the statistics; without statistics, the cheap
   * clock (a deadline a few ms late is as good, and most small calls never read another). */
  int64_t now = pg->stats_group >= 0 ? tdist__now_ns() : tdist__now_not_before_ns();
  tdist__stats_begin(pg->stats_group, pg->b.size, c, now, sop);
  return c->deadline_ms = now / 1000000 + pg->b.timeout_ms;
}

tdist_status_t tdist__pg_run_p2p(tdist_pg_t *pg, tdist__p2p_feed_t *feed) {
  if (atomic_load(&pg->b.aborted))
    return tdist__fail(pg->b.sticky,
                       "send/recv: process group is aborted after an earlier "
                       "failure: %s",
                       pg->err);
  tdist_status_t st = pg->be->run_p2p(&pg->b, feed);
  return st ? failed(pg, st) : st;
}

void tdist__coll_free_arrays(tdist__coll_t *c) {
  if (c->owned_arrays) free(c->counts);
  c->owned_arrays = 0;
}

#define PG_ENTRY(pg, fn)                                                                     \
  do {                                                                                       \
    if (!(pg) || (pg)->magic != TDIST__PG_MAGIC)                                             \
      return tdist__fail(TDIST_ERR_INVALID_ARGUMENT, fn ": process group is NULL or freed"); \
  } while (0)

static tdist_status_t check_dtype(tdist_pg_t *pg, const char *fn, tdist_dtype_t dt) {
  if ((unsigned)dt >= TDIST_DTYPE_COUNT_)
    return tdist__pg_fail(pg, TDIST_ERR_INVALID_ARGUMENT, "%s: unknown dtype %d", fn, (int)dt);
  return TDIST_OK;
}

static tdist_status_t check_op(tdist_pg_t *pg, const char *fn, tdist_dtype_t dt,
                               tdist_reduce_op_t op) {
  tdist_status_t st = check_dtype(pg, fn, dt);
  if (st) return st;
  if ((unsigned)op >= TDIST_REDUCE_OP_COUNT_)
    return tdist__pg_fail(pg, TDIST_ERR_INVALID_ARGUMENT, "%s: unknown reduce op %d", fn, (int)op);
  if (!tdist__op_valid(dt, op))
    return tdist__pg_fail(pg, TDIST_ERR_INVALID_ARGUMENT, "%s: op %s is not defined for dtype %s",
                          fn, tdist_reduce_op_name(op), tdist_dtype_name(dt));
  return TDIST_OK;
}

static tdist_status_t check_root(tdist_pg_t *pg, const char *fn, int root) {
  if (root < 0 || root >= pg->b.size)
    return tdist__pg_fail(pg, TDIST_ERR_INVALID_ARGUMENT,
                          "%s: root %d is not a rank of this "
                          "group (0..%d)",
                          fn, root, pg->b.size - 1);
  return TDIST_OK;
}

static tdist_status_t check_buf(tdist_pg_t *pg, const char *fn, const void *p, size_t count,
                                const char *what) {
  if (!p && count)
    return tdist__pg_fail(pg, TDIST_ERR_INVALID_ARGUMENT, "%s: %s is NULL with count %zu", fn, what,
                          count);
  if (count > (SIZE_MAX / 16) / (size_t)pg->b.size)
    return tdist__pg_fail(pg, TDIST_ERR_INVALID_ARGUMENT, "%s: count %zu is too large", fn, count);
  return TDIST_OK;
}

/* Runs now (blocking form) or queues (async form, work != NULL). */
static tdist_status_t dispatch(tdist_pg_t *pg, tdist__coll_t *c, tdist_work_t **work) {
  if (pg->be->check && !atomic_load(&pg->b.aborted)) {
    c->seq = pg->seq + 1; /* the number it gets below (one thread uses a handle at a time) */
    tdist_status_t st = pg->be->check(&pg->b, c); /* what the backend cannot run; group unharmed */
    if (st) return tdist__fail(st, "%s", pg->err);
  }
  if (work) return tdist__pg_submit(pg, c, work);
  if ((c->kind == TDIST__COLL_SEND || c->kind == TDIST__COLL_RECV) && pg->be->run_p2p &&
      pg->worker_started && tdist__pg_work_pending(pg))
    /* Sends and receives in flight on the worker may wait for what this one brings (an irecv
     * whose send the peer makes after receiving this): join them instead of draining them. */
    return tdist__pg_submit_wait(pg, c);
  tdist__pg_drain(pg);
  c->seq = ++pg->seq;
  return tdist__pg_run(pg, c);
}

#define TRY(x)                         \
  do {                                 \
    tdist_status_t st_ = (x);          \
    if (st_) {                         \
      tdist__fail(st_, "%s", pg->err); \
      return st_;                      \
    }                                  \
  } while (0)

static tdist_status_t all_reduce(tdist_pg_t *pg, void *buf, size_t count, tdist_dtype_t dt,
                                 tdist_reduce_op_t op, tdist_work_t **work) {
  TRY(check_op(pg, "all_reduce", dt, op));
  TRY(check_buf(pg, "all_reduce", buf, count, "buf"));
  tdist__coll_t c = {
      .kind = TDIST__COLL_ALL_REDUCE, .out = buf, .count = count, .dtype = dt, .op = op};
  return dispatch(pg, &c, work);
}

TDIST_EXTERN tdist_status_t tdist_all_reduce(tdist_pg_t *pg, void *buf, size_t count,
                                             tdist_dtype_t dt, tdist_reduce_op_t op) {
  PG_ENTRY(pg, "tdist_all_reduce");
  return all_reduce(pg, buf, count, dt, op, NULL);
}
TDIST_EXTERN tdist_status_t tdist_all_reduce_async(tdist_pg_t *pg, void *buf, size_t count,
                                                   tdist_dtype_t dt, tdist_reduce_op_t op,
                                                   tdist_work_t **work) {
  PG_ENTRY(pg, "tdist_all_reduce_async");
  if (!work) return tdist__fail(TDIST_ERR_INVALID_ARGUMENT, "tdist_all_reduce_async: work is NULL");
  return all_reduce(pg, buf, count, dt, op, work);
}

static tdist_status_t broadcast(tdist_pg_t *pg, void *buf, size_t count, tdist_dtype_t dt, int root,
                                tdist_work_t **work) {
  TRY(check_dtype(pg, "broadcast", dt));
  TRY(check_root(pg, "broadcast", root));
  TRY(check_buf(pg, "broadcast", buf, count, "buf"));
  tdist__coll_t c = {
      .kind = TDIST__COLL_BROADCAST, .out = buf, .count = count, .dtype = dt, .root = root};
  return dispatch(pg, &c, work);
}
TDIST_EXTERN tdist_status_t tdist_broadcast(tdist_pg_t *pg, void *buf, size_t count,
                                            tdist_dtype_t dt, int root) {
  PG_ENTRY(pg, "tdist_broadcast");
  return broadcast(pg, buf, count, dt, root, NULL);
}
TDIST_EXTERN tdist_status_t tdist_broadcast_async(tdist_pg_t *pg, void *buf, size_t count,
                                                  tdist_dtype_t dt, int root, tdist_work_t **work) {
  PG_ENTRY(pg, "tdist_broadcast_async");
  if (!work) return tdist__fail(TDIST_ERR_INVALID_ARGUMENT, "tdist_broadcast_async: work is NULL");
  return broadcast(pg, buf, count, dt, root, work);
}

static tdist_status_t reduce_impl(tdist_pg_t *pg, void *buf, size_t count, tdist_dtype_t dt,
                                  tdist_reduce_op_t op, int root, tdist_work_t **work) {
  TRY(check_op(pg, "reduce", dt, op));
  TRY(check_root(pg, "reduce", root));
  TRY(check_buf(pg, "reduce", buf, count, "buf"));
  tdist__coll_t c = {
      .kind = TDIST__COLL_REDUCE, .out = buf, .count = count, .dtype = dt, .op = op, .root = root};
  return dispatch(pg, &c, work);
}
TDIST_EXTERN tdist_status_t tdist_reduce(tdist_pg_t *pg, void *buf, size_t count, tdist_dtype_t dt,
                                         tdist_reduce_op_t op, int root) {
  PG_ENTRY(pg, "tdist_reduce");
  return reduce_impl(pg, buf, count, dt, op, root, NULL);
}
TDIST_EXTERN tdist_status_t tdist_reduce_async(tdist_pg_t *pg, void *buf, size_t count,
                                               tdist_dtype_t dt, tdist_reduce_op_t op, int root,
                                               tdist_work_t **work) {
  PG_ENTRY(pg, "tdist_reduce_async");
  if (!work) return tdist__fail(TDIST_ERR_INVALID_ARGUMENT, "tdist_reduce_async: work is NULL");
  return reduce_impl(pg, buf, count, dt, op, root, work);
}

/* Uniform all_gather as all_gather_v with counts = count, displs = r * count. */
static tdist_status_t all_gather(tdist_pg_t *pg, void *out, const void *in, size_t count,
                                 tdist_dtype_t dt, tdist_work_t **work) {
  TRY(check_dtype(pg, "all_gather", dt));
  TRY(check_buf(pg, "all_gather", out, count, "out"));
  TRY(check_buf(pg, "all_gather", in, count, "in"));
  size_t n = (size_t)pg->b.size;
  size_t *counts = malloc(2 * n * sizeof *counts), *displs = counts + n;
  if (!counts) return tdist__pg_fail(pg, TDIST_ERR_NO_MEMORY, "all_gather: out of memory");
  for (size_t r = 0; r < n; r++) {
    counts[r] = count;
    displs[r] = r * count;
  }
  tdist__coll_t c = {.kind = TDIST__COLL_ALL_GATHER_V,
                     .out = out,
                     .in = in,
                     .count = count,
                     .dtype = dt,
                     .counts = counts,
                     .displs = displs,
                     .owned_arrays = 1};
  tdist_status_t st = dispatch(pg, &c, work);
  if (!work || st) tdist__coll_free_arrays(&c);
  return st;
}
TDIST_EXTERN tdist_status_t tdist_all_gather(tdist_pg_t *pg, void *out, const void *in,
                                             size_t count, tdist_dtype_t dt) {
  PG_ENTRY(pg, "tdist_all_gather");
  return all_gather(pg, out, in, count, dt, NULL);
}
TDIST_EXTERN tdist_status_t tdist_all_gather_async(tdist_pg_t *pg, void *out, const void *in,
                                                   size_t count, tdist_dtype_t dt,
                                                   tdist_work_t **work) {
  PG_ENTRY(pg, "tdist_all_gather_async");
  if (!work) return tdist__fail(TDIST_ERR_INVALID_ARGUMENT, "tdist_all_gather_async: work is NULL");
  return all_gather(pg, out, in, count, dt, work);
}

/* Copies n-element arrays into one owned block (async calls must not borrow the caller's). */
static size_t *copy_arrays(const size_t *const *arrs, int k, size_t n) {
  size_t *b = malloc((size_t)k * n * sizeof *b);
  if (b)
    for (int i = 0; i < k; i++) memcpy(b + (size_t)i * n, arrs[i], n * sizeof *b);
  return b;
}

static tdist_status_t all_gather_v_impl(tdist_pg_t *pg, void *out, const size_t *counts,
                                        const size_t *displs, const void *in, tdist_dtype_t dt,
                                        tdist_work_t **work) {
  TRY(check_dtype(pg, "all_gather_v", dt));
  if (!counts || !displs)
    TRY(tdist__pg_fail(pg, TDIST_ERR_INVALID_ARGUMENT, "all_gather_v: counts or displs is NULL"));
  TRY(check_buf(pg, "all_gather_v", in, counts[pg->b.rank], "in"));
  for (int r = 0; r < pg->b.size; r++) TRY(check_buf(pg, "all_gather_v", out, counts[r], "out"));
  tdist__coll_t c = {.kind = TDIST__COLL_ALL_GATHER_V,
                     .out = out,
                     .in = in,
                     .count = counts[pg->b.rank],
                     .dtype = dt,
                     .counts = (size_t *)counts,
                     .displs = (size_t *)displs};
  if (!work) return dispatch(pg, &c, NULL);
  const size_t *arrs[2] = {counts, displs};
  if (!(c.counts = copy_arrays(arrs, 2, (size_t)pg->b.size)))
    return tdist__pg_fail(pg, TDIST_ERR_NO_MEMORY, "all_gather_v: out of memory");
  c.displs = c.counts + pg->b.size;
  c.owned_arrays = 1;
  tdist_status_t st = dispatch(pg, &c, work);
  if (st) tdist__coll_free_arrays(&c);
  return st;
}
TDIST_EXTERN tdist_status_t tdist_all_gather_v(tdist_pg_t *pg, void *out, const size_t *counts,
                                               const size_t *displs, const void *in,
                                               tdist_dtype_t dt) {
  PG_ENTRY(pg, "tdist_all_gather_v");
  return all_gather_v_impl(pg, out, counts, displs, in, dt, NULL);
}
TDIST_EXTERN tdist_status_t tdist_all_gather_v_async(tdist_pg_t *pg, void *out,
                                                     const size_t *counts, const size_t *displs,
                                                     const void *in, tdist_dtype_t dt,
                                                     tdist_work_t **work) {
  PG_ENTRY(pg, "tdist_all_gather_v_async");
  if (!work)
    return tdist__fail(TDIST_ERR_INVALID_ARGUMENT, "tdist_all_gather_v_async: work is NULL");
  return all_gather_v_impl(pg, out, counts, displs, in, dt, work);
}

static tdist_status_t gather_impl(tdist_pg_t *pg, void *out, const void *in, size_t count,
                                  tdist_dtype_t dt, int root, tdist_work_t **work) {
  TRY(check_dtype(pg, "gather", dt));
  TRY(check_root(pg, "gather", root));
  TRY(check_buf(pg, "gather", in, count, "in"));
  if (pg->b.rank == root) TRY(check_buf(pg, "gather", out, count, "out (on root)"));
  tdist__coll_t c = {
      .kind = TDIST__COLL_GATHER, .out = out, .in = in, .count = count, .dtype = dt, .root = root};
  return dispatch(pg, &c, work);
}
TDIST_EXTERN tdist_status_t tdist_gather(tdist_pg_t *pg, void *out, const void *in, size_t count,
                                         tdist_dtype_t dt, int root) {
  PG_ENTRY(pg, "tdist_gather");
  return gather_impl(pg, out, in, count, dt, root, NULL);
}
TDIST_EXTERN tdist_status_t tdist_gather_async(tdist_pg_t *pg, void *out, const void *in,
                                               size_t count, tdist_dtype_t dt, int root,
                                               tdist_work_t **work) {
  PG_ENTRY(pg, "tdist_gather_async");
  if (!work) return tdist__fail(TDIST_ERR_INVALID_ARGUMENT, "tdist_gather_async: work is NULL");
  return gather_impl(pg, out, in, count, dt, root, work);
}

static tdist_status_t scatter_impl(tdist_pg_t *pg, void *out, const void *in, size_t count,
                                   tdist_dtype_t dt, int root, tdist_work_t **work) {
  TRY(check_dtype(pg, "scatter", dt));
  TRY(check_root(pg, "scatter", root));
  TRY(check_buf(pg, "scatter", out, count, "out"));
  if (pg->b.rank == root) TRY(check_buf(pg, "scatter", in, count, "in (on root)"));
  tdist__coll_t c = {
      .kind = TDIST__COLL_SCATTER, .out = out, .in = in, .count = count, .dtype = dt, .root = root};
  return dispatch(pg, &c, work);
}
TDIST_EXTERN tdist_status_t tdist_scatter(tdist_pg_t *pg, void *out, const void *in, size_t count,
                                          tdist_dtype_t dt, int root) {
  PG_ENTRY(pg, "tdist_scatter");
  return scatter_impl(pg, out, in, count, dt, root, NULL);
}
TDIST_EXTERN tdist_status_t tdist_scatter_async(tdist_pg_t *pg, void *out, const void *in,
                                                size_t count, tdist_dtype_t dt, int root,
                                                tdist_work_t **work) {
  PG_ENTRY(pg, "tdist_scatter_async");
  if (!work) return tdist__fail(TDIST_ERR_INVALID_ARGUMENT, "tdist_scatter_async: work is NULL");
  return scatter_impl(pg, out, in, count, dt, root, work);
}

static tdist_status_t reduce_scatter(tdist_pg_t *pg, void *out, const void *in, size_t count,
                                     tdist_dtype_t dt, tdist_reduce_op_t op, tdist_work_t **work) {
  TRY(check_op(pg, "reduce_scatter", dt, op));
  TRY(check_buf(pg, "reduce_scatter", out, count, "out"));
  TRY(check_buf(pg, "reduce_scatter", in, count, "in"));
  tdist__coll_t c = {.kind = TDIST__COLL_REDUCE_SCATTER,
                     .out = out,
                     .in = in,
                     .count = count,
                     .dtype = dt,
                     .op = op};
  return dispatch(pg, &c, work);
}
TDIST_EXTERN tdist_status_t tdist_reduce_scatter(tdist_pg_t *pg, void *out, const void *in,
                                                 size_t count, tdist_dtype_t dt,
                                                 tdist_reduce_op_t op) {
  PG_ENTRY(pg, "tdist_reduce_scatter");
  return reduce_scatter(pg, out, in, count, dt, op, NULL);
}
TDIST_EXTERN tdist_status_t tdist_reduce_scatter_async(tdist_pg_t *pg, void *out, const void *in,
                                                       size_t count, tdist_dtype_t dt,
                                                       tdist_reduce_op_t op, tdist_work_t **work) {
  PG_ENTRY(pg, "tdist_reduce_scatter_async");
  if (!work)
    return tdist__fail(TDIST_ERR_INVALID_ARGUMENT, "tdist_reduce_scatter_async: work is NULL");
  return reduce_scatter(pg, out, in, count, dt, op, work);
}

static tdist_status_t all_to_all(tdist_pg_t *pg, void *out, const void *in, size_t count,
                                 tdist_dtype_t dt, tdist_work_t **work) {
  TRY(check_dtype(pg, "all_to_all", dt));
  TRY(check_buf(pg, "all_to_all", out, count, "out"));
  TRY(check_buf(pg, "all_to_all", in, count, "in"));
  size_t n = (size_t)pg->b.size;
  size_t *a = malloc(4 * n * sizeof *a);
  if (!a) return tdist__pg_fail(pg, TDIST_ERR_NO_MEMORY, "all_to_all: out of memory");
  for (size_t r = 0; r < n; r++) {
    a[r] = a[2 * n + r] = count;
    a[n + r] = a[3 * n + r] = r * count;
  }
  tdist__coll_t c = {.kind = TDIST__COLL_ALL_TO_ALL_V,
                     .out = out,
                     .in = in,
                     .count = count,
                     .dtype = dt,
                     .counts = a,
                     .displs = a + n,
                     .in_counts = a + 2 * n,
                     .in_displs = a + 3 * n};
  c.owned_arrays = 1;
  tdist_status_t st = dispatch(pg, &c, work);
  if (!work || st) tdist__coll_free_arrays(&c);
  return st;
}
TDIST_EXTERN tdist_status_t tdist_all_to_all(tdist_pg_t *pg, void *out, const void *in,
                                             size_t count, tdist_dtype_t dt) {
  PG_ENTRY(pg, "tdist_all_to_all");
  return all_to_all(pg, out, in, count, dt, NULL);
}
TDIST_EXTERN tdist_status_t tdist_all_to_all_async(tdist_pg_t *pg, void *out, const void *in,
                                                   size_t count, tdist_dtype_t dt,
                                                   tdist_work_t **work) {
  PG_ENTRY(pg, "tdist_all_to_all_async");
  if (!work) return tdist__fail(TDIST_ERR_INVALID_ARGUMENT, "tdist_all_to_all_async: work is NULL");
  return all_to_all(pg, out, in, count, dt, work);
}

static tdist_status_t all_to_all_v_impl(tdist_pg_t *pg, void *out, const size_t *out_counts,
                                        const size_t *out_displs, const void *in,
                                        const size_t *in_counts, const size_t *in_displs,
                                        tdist_dtype_t dt, tdist_work_t **work) {
  TRY(check_dtype(pg, "all_to_all_v", dt));
  if (!out_counts || !out_displs || !in_counts || !in_displs)
    TRY(tdist__pg_fail(pg, TDIST_ERR_INVALID_ARGUMENT,
                       "all_to_all_v: a counts/displs array is NULL"));
  for (int r = 0; r < pg->b.size; r++) {
    TRY(check_buf(pg, "all_to_all_v", out, out_counts[r], "out"));
    TRY(check_buf(pg, "all_to_all_v", in, in_counts[r], "in"));
  }
  tdist__coll_t c = {.kind = TDIST__COLL_ALL_TO_ALL_V,
                     .out = out,
                     .in = in,
                     .dtype = dt,
                     .counts = (size_t *)out_counts,
                     .displs = (size_t *)out_displs,
                     .in_counts = (size_t *)in_counts,
                     .in_displs = (size_t *)in_displs};
  if (!work) return dispatch(pg, &c, NULL);
  const size_t *arrs[4] = {out_counts, out_displs, in_counts, in_displs};
  size_t n = (size_t)pg->b.size;
  if (!(c.counts = copy_arrays(arrs, 4, n)))
    return tdist__pg_fail(pg, TDIST_ERR_NO_MEMORY, "all_to_all_v: out of memory");
  c.displs = c.counts + n;
  c.in_counts = c.counts + 2 * n;
  c.in_displs = c.counts + 3 * n;
  c.owned_arrays = 1;
  tdist_status_t st = dispatch(pg, &c, work);
  if (st) tdist__coll_free_arrays(&c);
  return st;
}
TDIST_EXTERN tdist_status_t tdist_all_to_all_v(tdist_pg_t *pg, void *out, const size_t *out_counts,
                                               const size_t *out_displs, const void *in,
                                               const size_t *in_counts, const size_t *in_displs,
                                               tdist_dtype_t dt) {
  PG_ENTRY(pg, "tdist_all_to_all_v");
  return all_to_all_v_impl(pg, out, out_counts, out_displs, in, in_counts, in_displs, dt, NULL);
}
TDIST_EXTERN tdist_status_t tdist_all_to_all_v_async(
    tdist_pg_t *pg, void *out, const size_t *out_counts, const size_t *out_displs, const void *in,
    const size_t *in_counts, const size_t *in_displs, tdist_dtype_t dt, tdist_work_t **work) {
  PG_ENTRY(pg, "tdist_all_to_all_v_async");
  if (!work)
    return tdist__fail(TDIST_ERR_INVALID_ARGUMENT, "tdist_all_to_all_v_async: work is NULL");
  return all_to_all_v_impl(pg, out, out_counts, out_displs, in, in_counts, in_displs, dt, work);
}

TDIST_EXTERN tdist_status_t tdist_barrier(tdist_pg_t *pg) {
  PG_ENTRY(pg, "tdist_barrier");
  tdist__coll_t c = {.kind = TDIST__COLL_BARRIER};
  return dispatch(pg, &c, NULL);
}
TDIST_EXTERN tdist_status_t tdist_barrier_async(tdist_pg_t *pg, tdist_work_t **work) {
  PG_ENTRY(pg, "tdist_barrier_async");
  if (!work) return tdist__fail(TDIST_ERR_INVALID_ARGUMENT, "tdist_barrier_async: work is NULL");
  tdist__coll_t c = {.kind = TDIST__COLL_BARRIER};
  return dispatch(pg, &c, work);
}

TDIST_EXTERN tdist_status_t tdist_monitored_barrier(tdist_pg_t *pg, int64_t timeout_ms) {
  PG_ENTRY(pg, "tdist_monitored_barrier");
  tdist__coll_t c = {.kind = TDIST__COLL_MONITORED_BARRIER,
                     .timeout_ms = timeout_ms > 0 ? timeout_ms : pg->b.timeout_ms};
  return dispatch(pg, &c, NULL);
}

static tdist_status_t p2p(tdist_pg_t *pg, tdist__coll_kind_t kind, void *buf, size_t count,
                          tdist_dtype_t dt, int peer, int tag, tdist_work_t **work) {
  const char *fn = tdist__coll_name(kind);
  TRY(check_dtype(pg, fn, dt));
  TRY(check_buf(pg, fn, buf, count, "buf"));
  if (peer < 0 || peer >= pg->b.size || peer == pg->b.rank)
    TRY(tdist__pg_fail(pg, TDIST_ERR_INVALID_ARGUMENT,
                       "%s: peer %d is not another rank of this "
                       "group (0..%d, this is %d)",
                       fn, peer, pg->b.size - 1, pg->b.rank));
  if (tag < 0)
    TRY(tdist__pg_fail(pg, TDIST_ERR_INVALID_ARGUMENT, "%s: tag %d must be >= 0", fn, tag));
  tdist__coll_t c = {
      .kind = kind, .out = buf, .in = buf, .count = count, .dtype = dt, .peer = peer, .tag = tag};
  return dispatch(pg, &c, work);
}
TDIST_EXTERN tdist_status_t tdist_send(tdist_pg_t *pg, const void *buf, size_t count,
                                       tdist_dtype_t dt, int dst, int tag) {
  PG_ENTRY(pg, "tdist_send");
  return p2p(pg, TDIST__COLL_SEND, (void *)buf, count, dt, dst, tag, NULL);
}
TDIST_EXTERN tdist_status_t tdist_send_async(tdist_pg_t *pg, const void *buf, size_t count,
                                             tdist_dtype_t dt, int dst, int tag,
                                             tdist_work_t **work) {
  PG_ENTRY(pg, "tdist_send_async");
  if (!work) return tdist__fail(TDIST_ERR_INVALID_ARGUMENT, "tdist_send_async: work is NULL");
  return p2p(pg, TDIST__COLL_SEND, (void *)buf, count, dt, dst, tag, work);
}
TDIST_EXTERN tdist_status_t tdist_recv(tdist_pg_t *pg, void *buf, size_t count, tdist_dtype_t dt,
                                       int src, int tag) {
  PG_ENTRY(pg, "tdist_recv");
  return p2p(pg, TDIST__COLL_RECV, buf, count, dt, src, tag, NULL);
}
TDIST_EXTERN tdist_status_t tdist_recv_async(tdist_pg_t *pg, void *buf, size_t count,
                                             tdist_dtype_t dt, int src, int tag,
                                             tdist_work_t **work) {
  PG_ENTRY(pg, "tdist_recv_async");
  if (!work) return tdist__fail(TDIST_ERR_INVALID_ARGUMENT, "tdist_recv_async: work is NULL");
  return p2p(pg, TDIST__COLL_RECV, buf, count, dt, src, tag, work);
}