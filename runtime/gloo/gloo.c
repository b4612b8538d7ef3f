/* The gloo CPU backend: collectives written only against transport.h (Gloo's layering).
 *
 * Algorithms (chosen by size and world size; TDIST_ALGO_ALLREDUCE=ring|rd overrides, logged at
 * debug level):
 *   all_reduce      recursive doubling (MPICH's non-power-of-two fold) up to 64 KiB, else ring
 *                   reduce-scatter + ring all-gather (bandwidth optimal);
 *   broadcast       binomial tree, or a segmented chain for large messages on 3+ ranks;
 *   reduce  binomial tree;   gather/scatter  direct from/to root;
 *   all_gather(_v)  Bruck (ceil(log2 p) rounds) for equal blocks up to 64 KiB in all on 3+ ranks,
 *                   else ring;
 *   reduce_scatter  recursive doubling of the whole vector up to 16 KiB on 3+ ranks, else ring
 *                   (a real one: (p-1)/p of the data moves);
 *   all_to_all(_v)  all pairs at once;  barrier  dissemination;  monitored_barrier  via rank 0.
 * Every rank gets bitwise identical all_reduce results: each element is reduced in one order
 * (ring), or pairwise with commutative operations (recursive doubling). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/common/clock.h"
#include "runtime/common/log.h"
#include "runtime/common/param.h"
#include "runtime/gloo/transport.h"
#include "runtime/pg/backend.h"
#include "runtime/pg/reduce.h"

#define RD_MAX_BYTES (64 * 1024)
#define RS_RD_MAX_BYTES \
  (16 * 1024) /* reduce_scatter by all-reduce: every rank moves all p blocks */
#define SEG_BYTES \
  (256 * 1024) /* pipelined ring steps and broadcast chains move this much at once */
/* all_reduce above RD_MAX_BYTES and up to DIRECT_MAX_BYTES in a group of 3 to DIRECT_MAX_RANKS
 * ranks, all on one host, runs the direct algorithm (allreduce_direct); 2 ranks move the same
 * bytes either way. Above 512 KiB the ring measured faster (4 ranks on 2 cores, shared memory,
 * alternating runs: 128 KiB direct 39-40 us, ring 45-58; 512 KiB 176-178 against 146-240;
 * 1 MiB 362-369 against 297-313; 4 MiB 1329-1405 against 1277). */
#define DIRECT_MAX_RANKS 8
#define DIRECT_MAX_BYTES (512 * 1024)
#define COLL_TAG(kind) (TDIST__XFER_COLL_TAG | (uint32_t)(kind))
#define FINGERPRINT_TAG 0xffffffffu

typedef struct {
  tdist__transport_t *tp;
  uint8_t *scratch;
  size_t scratch_cap;
  int force_algo; /* 0 auto, 1 ring, 2 recursive doubling */
  int fingerprint;
} gloo_t;

static gloo_t *G(tdist__bctx_t *b) { return b->state; }

static void *scratch(tdist__bctx_t *b, size_t bytes) {
  gloo_t *g = G(b);
  if (bytes > g->scratch_cap) {
    void *p = realloc(g->scratch, bytes);
    if (!p) return NULL;
    g->scratch = p;
    g->scratch_cap = bytes;
  }
  return g->scratch ? g->scratch : (void *)g; /* non-NULL even for 0 bytes */
}

typedef struct {
  tdist__bctx_t *b;
  int64_t dl;
  tdist__what_t *what;
  uint32_t tag;
  size_t copy_min; /* xfer.copy_min of its sends */
} ctx_t;

static tdist_status_t nomem(ctx_t *c, size_t bytes) {
  return tdist__bctx_fail(c->b, TDIST_ERR_NO_MEMORY, "%s: cannot allocate %zu bytes of scratch",
                          tdist__what(c->what), bytes);
}

static tdist_status_t xchg(ctx_t *c, tdist__xfer_t *x, int n) {
  return G(c->b)->tp->exchange(G(c->b)->tp, x, n, c->dl, c->what);
}

static tdist__xfer_t xsend(ctx_t *c, int peer, const void *buf, size_t len) {
  return (tdist__xfer_t){.peer = peer,
                         .is_send = 1,
                         .buf = (void *)buf,
                         .len = len,
                         .tag = c->tag,
                         .copy_min = c->copy_min};
}
static tdist__xfer_t xrecv(ctx_t *c, int peer, void *buf, size_t len) {
  return (tdist__xfer_t){.peer = peer, .is_send = 0, .buf = buf, .len = len, .tag = c->tag};
}

static tdist_status_t sendrecv(ctx_t *c, int to, const void *sbuf, size_t slen, int from,
                               void *rbuf, size_t rlen) {
  tdist__xfer_t x[2] = {xsend(c, to, sbuf, slen), xrecv(c, from, rbuf, rlen)};
  return xchg(c, x, 2);
}

/* Block i of `count` elements split over p ranks. */
static size_t blk_count(size_t count, int p, int i) {
  return count / (size_t)p + ((size_t)i < count % (size_t)p);
}
static size_t blk_off(size_t count, int p, int i) {
  size_t base = count / (size_t)p, extra = count % (size_t)p;
  return (size_t)i * base + ((size_t)i < extra ? (size_t)i : extra);
}

static int mod(int a, int p) { return ((a % p) + p) % p; }

/* A block of n elements moves as nseg(n, seg) messages (one even when empty); the k-th holds
 * seg_len(n, seg, k) elements. Sender and receiver of a block compute the same. */
static size_t nseg(size_t n, size_t seg) { return n <= seg ? 1 : (n + seg - 1) / seg; }
static size_t seg_len(size_t n, size_t seg, size_t k) {
  return k * seg >= n ? 0 : (n - k * seg < seg ? n - k * seg : seg);
}

/* ---------------------------------------------------------------------------------------- */
/* all_reduce                                                                                */

static tdist_status_t allreduce_rd(ctx_t *c, uint8_t *buf, size_t count, tdist_dtype_t dt,
                                   tdist_reduce_op_t op) {
  tdist__bctx_t *b = c->b;
  int p = b->size, r = b->rank;
  size_t bytes = count * tdist_dtype_size(dt);
  uint8_t *tmp = scratch(b, bytes);
  if (!tmp) return nomem(c, bytes);
  int pof2 = 1;
  while (pof2 * 2 <= p) pof2 *= 2;
  int rem = p - pof2, newrank;
  tdist_status_t st;
  /* Fold the ranks beyond the largest power of two into their even neighbours. */
  if (r < 2 * rem) {
    if (r % 2 == 0) {
      tdist__xfer_t x = xsend(c, r + 1, buf, bytes);
      if ((st = xchg(c, &x, 1))) return st;
      newrank = -1;
    } else {
      tdist__xfer_t x = xrecv(c, r - 1, tmp, bytes);
      if ((st = xchg(c, &x, 1))) return st;
      tdist__reduce(buf, tmp, count, dt, op);
      newrank = r / 2;
    }
  } else {
    newrank = r - rem;
  }
  if (newrank >= 0) {
    for (int mask = 1; mask < pof2; mask <<= 1) {
      int nd = newrank ^ mask;
      int dst = nd < rem ? nd * 2 + 1 : nd + rem;
      if ((st = sendrecv(c, dst, buf, bytes, dst, tmp, bytes))) return st;
      tdist__reduce(buf, tmp, count, dt, op);
    }
  }
  if (r < 2 * rem) {
    tdist__xfer_t x = r % 2 ? xsend(c, r - 1, buf, bytes) : xrecv(c, r + 1, buf, bytes);
    if ((st = xchg(c, &x, 1))) return st;
  }
  return TDIST_OK;
}

/* The bytes of ring_reduce_scatter's tmp for blocks of at most blk elements of es bytes. */
static size_t ring_tmp_bytes(size_t blk, size_t es) {
  size_t seg = SEG_BYTES / es;
  return (blk < seg ? blk : seg) * es;
}

/* Ring reduce-scatter over `count` elements of buf split in p blocks; afterwards rank r holds the
 * full reduction of block r. tmp holds one segment. A block of more than SEG_BYTES moves in
 * segments, each reduced as soon as it is in, so that the left neighbour writes the next segment
 * while this rank reduces (the transfer and the reduction overlap across ranks). Every segment
 * lands at tmp's start, which stays in cache between the copy in and the reduction (2 ranks,
 * shared memory, alternating runs: 4 MiB 407 -> 369 us, 5 MiB 512 -> 470; 4 ranks 4 MiB 1327 ->
 * 1206, 16 MiB 5056 -> 4565; a tmp of the whole block, each segment at its offset, left the
 * segments of one step to fall out of cache). The block a rank sends at one step is the one its
 * right neighbour receives, so both split it alike; every element is still reduced in the same
 * order. */
static tdist_status_t ring_reduce_scatter(ctx_t *c, uint8_t *buf, size_t count, tdist_dtype_t dt,
                                          tdist_reduce_op_t op, uint8_t *tmp) {
  int p = c->b->size, r = c->b->rank;
  size_t es = tdist_dtype_size(dt), seg = SEG_BYTES / es;
  int right = mod(r + 1, p), left = mod(r - 1, p);
  for (int s = 0; s < p - 1; s++) {
    int si = mod(r - 1 - s, p), ri = mod(r - 2 - s, p);
    size_t sc = blk_count(count, p, si), rc = blk_count(count, p, ri);
    uint8_t *sb = buf + blk_off(count, p, si) * es, *rb = buf + blk_off(count, p, ri) * es;
    size_t ns = nseg(sc, seg), nr = nseg(rc, seg);
    for (size_t k = 0; k < ns || k < nr; k++) {
      size_t off = k * seg, sn = seg_len(sc, seg, k), rn = seg_len(rc, seg, k);
      tdist__xfer_t x[2];
      int n = 0;
      if (k < ns) x[n++] = xsend(c, right, sb + off * es, sn * es);
      if (k < nr) x[n++] = xrecv(c, left, tmp, rn * es);
      tdist_status_t st = xchg(c, x, n);
      if (st) return st;
      if (rn) tdist__reduce(rb + off * es, tmp, rn, dt, op);
    }
  }
  return TDIST_OK;
}

/* Ring all-gather of p blocks laid out by counts/displs (elements); rank r owns block r. */
/* own: this rank's block where the first step sends it from (NULL: out). */
static tdist_status_t ring_all_gather(ctx_t *c, uint8_t *out, const uint8_t *own,
                                      const size_t *counts, const size_t *displs, size_t es) {
  int p = c->b->size, r = c->b->rank;
  int right = mod(r + 1, p), left = mod(r - 1, p);
  for (int s = 0; s < p - 1; s++) {
    int si = mod(r - s, p), ri = mod(r - s - 1, p);
    tdist_status_t st = sendrecv(c, right, s == 0 && own ? own : out + displs[si] * es,
                                 counts[si] * es, left, out + displs[ri] * es, counts[ri] * es);
    if (st) return st;
  }
  return TDIST_OK;
}

static tdist_status_t allreduce_ring(ctx_t *c, uint8_t *buf, size_t count, tdist_dtype_t dt,
                                     tdist_reduce_op_t op, int avg) {
  tdist__bctx_t *b = c->b;
  int p = b->size;
  size_t es = tdist_dtype_size(dt);
  size_t tmp_bytes = ring_tmp_bytes(blk_count(count, p, 0), es); /* block 0 is the largest */
  size_t *cd = malloc(2 * (size_t)p * sizeof *cd);
  uint8_t *tmp = scratch(b, tmp_bytes);
  if (!cd || !tmp) {
    free(cd);
    return nomem(c, tmp_bytes);
  }
  for (int i = 0; i < p; i++) {
    cd[i] = blk_count(count, p, i);
    cd[p + i] = blk_off(count, p, i);
  }
  tdist_status_t st = ring_reduce_scatter(c, buf, count, dt, op, tmp);
  /* AVG: divide only the block we own, before it is shared. */
  if (!st && avg) tdist__reduce_finish_avg(buf + cd[p + b->rank] * es, cd[b->rank], dt, p);
  if (!st) st = ring_all_gather(c, buf, NULL, cd, cd + p, es);
  free(cd);
  return st;
}

/* Whether this group runs the direct algorithms: 3 to DIRECT_MAX_RANKS ranks, all on one host
 * (the same answer on every rank). */
static int direct_group(tdist__bctx_t *b) {
  return b->size >= 3 && b->size <= DIRECT_MAX_RANKS && G(b)->tp->single_host;
}

/* The direct algorithms' reduction round: `src` holds `count` elements in p blocks (blk_count,
 * blk_off); this rank sends block j to rank j and reduces the p - 1 copies of its own block into
 * `own` (which starts as this rank's block, and may be it) as they arrive, a segment at a time
 * into a buffer that stays in cache. Between same-host ranks each transfer is a single copy out
 * of the sender's buffer, so a rank reads its block's p - 1 remote copies once and writes its
 * block once, in one round instead of the ring's p - 1 steps. */
static tdist_status_t direct_reduce_round(ctx_t *c, uint8_t *own, const uint8_t *src, size_t count,
                                          tdist_dtype_t dt, tdist_reduce_op_t op,
                                          tdist__xfer_t *x) {
  tdist__bctx_t *b = c->b;
  int p = b->size, r = b->rank;
  size_t es = tdist_dtype_size(dt), seg = SEG_BYTES / es;
  uint8_t *tmp = scratch(b, (size_t)(p - 1) * seg * es);
  if (!tmp) return nomem(c, (size_t)(p - 1) * seg * es);
  size_t mine = blk_count(count, p, r);
  size_t rounds = nseg(blk_count(count, p, 0), seg); /* block 0 is the largest */
  for (size_t k = 0; k < rounds; k++) {
    int n = 0;
    for (int j = 0; j < p; j++) {
      if (j == r) continue;
      size_t cj = blk_count(count, p, j);
      if (k < nseg(cj, seg))
        x[n++] = xsend(c, j, src + (blk_off(count, p, j) + k * seg) * es, seg_len(cj, seg, k) * es);
      if (k < nseg(mine, seg))
        x[n++] =
            xrecv(c, j, tmp + (size_t)(j < r ? j : j - 1) * seg * es, seg_len(mine, seg, k) * es);
    }
    tdist_status_t st = n ? xchg(c, x, n) : TDIST_OK;
    if (st) return st;
    size_t len = seg_len(mine, seg, k);
    for (int j = 0; j < p - 1 && len; j++)
      tdist__reduce(own + k * seg * es, tmp + (size_t)j * seg * es, len, dt, op);
  }
  return TDIST_OK;
}

/* Direct all_reduce: the reduction round in place, then every rank takes every other block from
 * its owner: at 4 ranks about 2.75 times the buffer in memory traffic per rank against the
 * ring's 3.75, in two rounds instead of 2(p - 1) steps. */
static tdist_status_t allreduce_direct(ctx_t *c, uint8_t *buf, size_t count, tdist_dtype_t dt,
                                       tdist_reduce_op_t op, int avg) {
  tdist__bctx_t *b = c->b;
  int p = b->size, r = b->rank;
  size_t es = tdist_dtype_size(dt), mine = blk_count(count, p, r);
  uint8_t *own = buf + blk_off(count, p, r) * es;
  tdist__xfer_t *x = malloc(2 * (size_t)p * sizeof *x);
  if (!x) return nomem(c, 2 * (size_t)p * sizeof *x);
  tdist_status_t st = direct_reduce_round(c, own, buf, count, dt, op, x);
  if (!st && avg) tdist__reduce_finish_avg(own, mine, dt, p);
  if (!st) {
    int n = 0;
    for (int j = 0; j < p; j++) {
      if (j == r) continue;
      x[n++] = xsend(c, j, own, mine * es);
      x[n++] = xrecv(c, j, buf + blk_off(count, p, j) * es, blk_count(count, p, j) * es);
    }
    st = xchg(c, x, n);
  }
  free(x);
  return st;
}

static tdist_status_t all_reduce(ctx_t *c, uint8_t *buf, size_t count, tdist_dtype_t dt,
                                 tdist_reduce_op_t op) {
  tdist__bctx_t *b = c->b;
  int avg = op == TDIST_AVG;
  tdist_reduce_op_t eff = avg ? TDIST_SUM : op;
  if (b->size == 1 || count == 0) return TDIST_OK;
  size_t bytes = count * tdist_dtype_size(dt);
  int algo = G(b)->force_algo;
  if (!algo)
    algo = bytes <= RD_MAX_BYTES || count < (size_t)b->size ? 2
           : bytes <= DIRECT_MAX_BYTES && direct_group(b)   ? 3
                                                            : 1;
  if ((algo == 1 || algo == 3) && count < (size_t)b->size) algo = 2;
  if (tdist__log_enabled(TDIST__LOG_DEBUG))
    tdist__log(TDIST__LOG_DEBUG, "gloo", "all_reduce %zu bytes, %d ranks: %s", bytes, b->size,
               algo == 1   ? "ring"
               : algo == 3 ? "direct"
                           : "recursive doubling");
  if (algo == 1) return allreduce_ring(c, buf, count, dt, eff, avg);
  if (algo == 3) return allreduce_direct(c, buf, count, dt, eff, avg);
  tdist_status_t st = allreduce_rd(c, buf, count, dt, eff);
  if (!st && avg) tdist__reduce_finish_avg(buf, count, dt, b->size);
  return st;
}

/* ---------------------------------------------------------------------------------------- */
/* Rooted collectives                                                                        */

/* Large broadcast: a chain from the root in rank order, in segments; each rank forwards segment
 * k-1 while it receives segment k, so the time is about one message's plus (p - 2) segments'
 * instead of log2(p) messages'. */
static tdist_status_t broadcast_chain(ctx_t *c, uint8_t *buf, size_t bytes, int root) {
  int p = c->b->size, r = c->b->rank, vr = mod(r - root, p);
  int prev = mod(r - 1, p), next = vr < p - 1 ? mod(r + 1, p) : -1;
  size_t ns = nseg(bytes, SEG_BYTES);
  /* One call per segment (the root only sends, the last rank only receives): messages to one
   * peer go one at a time anyway, and a call over every segment at once would rescan them all
   * on each pass. */
  for (size_t k = 0; k <= ns; k++) {
    tdist__xfer_t x[2];
    int n = 0;
    if (k < ns && vr > 0)
      x[n++] = xrecv(c, prev, buf + k * SEG_BYTES, seg_len(bytes, SEG_BYTES, k));
    if (k > 0 && next >= 0)
      x[n++] = xsend(c, next, buf + (k - 1) * SEG_BYTES, seg_len(bytes, SEG_BYTES, k - 1));
    if (!n) continue;
    tdist_status_t st = xchg(c, x, n);
    if (st) return st;
  }
  return TDIST_OK;
}

static tdist_status_t broadcast(ctx_t *c, uint8_t *buf, size_t bytes, int root) {
  int p = c->b->size, r = c->b->rank;
  /* The chain takes about (segments + p - 2) segment times, the tree depth x segments. */
  int depth = 0;
  while ((1 << depth) < p) depth++;
  if (p >= 3 && nseg(bytes, SEG_BYTES) * (size_t)(depth - 1) > (size_t)(p - 2))
    return broadcast_chain(c, buf, bytes, root);
  int vr = mod(r - root, p), mask = 1;
  tdist_status_t st;
  while (mask < p) {
    if (vr & mask) {
      tdist__xfer_t x = xrecv(c, mod(vr - mask + root, p), buf, bytes);
      if ((st = xchg(c, &x, 1))) return st;
      break;
    }
    mask <<= 1;
  }
  tdist__xfer_t x[32];
  int n = 0;
  for (mask >>= 1; mask > 0; mask >>= 1)
    if (vr + mask < p) x[n++] = xsend(c, mod(vr + mask + root, p), buf, bytes);
  return n ? xchg(c, x, n) : TDIST_OK;
}

static tdist_status_t reduce(ctx_t *c, uint8_t *buf, size_t count, tdist_dtype_t dt,
                             tdist_reduce_op_t op, int root) {
  tdist__bctx_t *b = c->b;
  int p = b->size, r = b->rank;
  int avg = op == TDIST_AVG;
  tdist_reduce_op_t eff = avg ? TDIST_SUM : op;
  size_t bytes = count * tdist_dtype_size(dt);
  uint8_t *tmp = scratch(b, bytes);
  if (!tmp) return nomem(c, bytes);
  int vr = mod(r - root, p);
  tdist_status_t st;
  for (int mask = 1; mask < p; mask <<= 1) {
    if (vr & mask) {
      tdist__xfer_t x = xsend(c, mod(vr - mask + root, p), buf, bytes);
      return xchg(c, &x, 1);
    }
    if (vr + mask < p) {
      tdist__xfer_t x = xrecv(c, mod(vr + mask + root, p), tmp, bytes);
      if ((st = xchg(c, &x, 1))) return st;
      tdist__reduce(buf, tmp, count, dt, eff);
    }
  }
  if (avg) tdist__reduce_finish_avg(buf, count, dt, p);
  return TDIST_OK;
}

/* Gather (to_root = 1) or scatter: the root moves p-1 blocks at once. */
static tdist_status_t gather_scatter(ctx_t *c, uint8_t *out, const uint8_t *in, size_t bytes,
                                     int root, int to_root) {
  tdist__bctx_t *b = c->b;
  int p = b->size, r = b->rank;
  if (r != root) {
    tdist__xfer_t x = to_root ? xsend(c, root, in, bytes) : xrecv(c, root, out, bytes);
    return xchg(c, &x, 1);
  }
  tdist__xfer_t *x = calloc((size_t)p, sizeof *x);
  if (!x) return nomem(c, (size_t)p * sizeof *x);
  int n = 0;
  for (int i = 0; i < p; i++) {
    if (i == r) continue;
    x[n++] = to_root ? xrecv(c, i, out + (size_t)i * bytes, bytes)
                     : xsend(c, i, in + (size_t)i * bytes, bytes);
  }
  if (bytes) {
    if (to_root)
      memmove(out + (size_t)r * bytes, in, bytes);
    else
      memmove(out, in + (size_t)r * bytes, bytes);
  }
  tdist_status_t st = xchg(c, x, n);
  free(x);
  return st;
}

/* ---------------------------------------------------------------------------------------- */
/* All-to-all style                                                                          */

/* Bruck's all-gather of p equal blocks of blk bytes (block i at out + i * blk, this rank's in
 * place): ceil(log2 p) rounds instead of the ring's p - 1, for small blocks, where rounds cost
 * more than bytes. Round k sends the first min(k, p - k) blocks of a rotated copy to rank r - k
 * and appends as many from rank r + k. */
static tdist_status_t bruck_all_gather(ctx_t *c, uint8_t *out, size_t blk) {
  tdist__bctx_t *b = c->b;
  int p = b->size, r = b->rank;
  uint8_t *tmp = scratch(b, (size_t)p * blk);
  if (!tmp) return nomem(c, (size_t)p * blk);
  memcpy(tmp, out + (size_t)r * blk, blk);
  for (int k = 1; k < p; k <<= 1) {
    size_t n = (size_t)(k < p - k ? k : p - k);
    tdist_status_t st =
        sendrecv(c, mod(r - k, p), tmp, n * blk, mod(r + k, p), tmp + (size_t)k * blk, n * blk);
    if (st) return st;
  }
  for (int i = 1; i < p; i++) memcpy(out + (size_t)mod(r + i, p) * blk, tmp + (size_t)i * blk, blk);
  return TDIST_OK;
}

static tdist_status_t all_gather_v(ctx_t *c, uint8_t *out, const uint8_t *in, const size_t *counts,
                                   const size_t *displs, size_t es) {
  int p = c->b->size, r = c->b->rank;
  if (counts[r]) memmove(out + displs[r] * es, in, counts[r] * es);
  if (p == 1) return TDIST_OK;
  int even = p > 2 && counts[0] && counts[0] * es * (size_t)p <= RD_MAX_BYTES;
  for (int i = 0; even && i < p; i++) even = counts[i] == counts[0] && displs[i] == i * counts[0];
  /* The first step sends this rank's block from `in`, which the caller wrote long ago, rather
   * than from its copy in `out` just written: a same-host peer that copies it straight from our
   * memory reads clean lines (2 ranks, 64-256 KiB blocks: 7.4 -> 4.7, 19 -> 16 us). Not when
   * `in` overlaps `out` elsewhere than this rank's block: the copy may have overwritten it. */
  size_t end = 0;
  for (int i = 0; i < p; i++)
    if (counts[i] && (displs[i] + counts[i]) * es > end) end = (displs[i] + counts[i]) * es;
  const uint8_t *own =
      in == out + displs[r] * es || in + counts[r] * es <= out || in >= out + end ? in : NULL;
  return even ? bruck_all_gather(c, out, counts[0] * es)
              : ring_all_gather(c, out, own, counts, displs, es);
}

/* Direct reduce_scatter: the direct algorithms' reduction round, from `in` into `out` (count
 * elements a rank: equal blocks); no working copy of the whole input. */
static tdist_status_t reduce_scatter_direct(ctx_t *c, uint8_t *out, const uint8_t *in, size_t count,
                                            tdist_dtype_t dt, tdist_reduce_op_t op) {
  int p = c->b->size;
  size_t es = tdist_dtype_size(dt);
  tdist__xfer_t *x = malloc(2 * (size_t)p * sizeof *x);
  if (!x) return nomem(c, 2 * (size_t)p * sizeof *x);
  memcpy(out, in + (size_t)c->b->rank * count * es, count * es);
  tdist_status_t st = direct_reduce_round(c, out, in, count * (size_t)p, dt, op, x);
  free(x);
  return st;
}

static tdist_status_t reduce_scatter(ctx_t *c, uint8_t *out, const uint8_t *in, size_t count,
                                     tdist_dtype_t dt, tdist_reduce_op_t op) {
  tdist__bctx_t *b = c->b;
  int p = b->size, r = b->rank;
  size_t es = tdist_dtype_size(dt), total = count * (size_t)p * es;
  int avg = op == TDIST_AVG;
  if (p > 2 && total <= RS_RD_MAX_BYTES) {
    /* Small: all-reduce everything by recursive doubling (log2 p rounds, not p - 1) and keep
     * this rank's block. */
    uint8_t *all = malloc(total ? total : 1);
    if (!all) return nomem(c, total);
    if (total) memcpy(all, in, total);
    tdist_status_t st = allreduce_rd(c, all, count * (size_t)p, dt, avg ? TDIST_SUM : op);
    if (!st && count) memcpy(out, all + (size_t)r * count * es, count * es);
    free(all);
    if (!st && avg) tdist__reduce_finish_avg(out, count, dt, p);
    return st;
  }
  /* A group of 3 to DIRECT_MAX_RANKS ranks on one host: the direct algorithm, at every size,
   * unless `out` overlaps the input (it would overwrite blocks still to be sent). 4 ranks on 2
   * cores, alternating runs, ring against direct: shared memory 64 KiB 15-18 -> 12-14 us,
   * 1 MiB 232-289 -> 115-122, 16 MiB 4.42-4.56 -> 2.08-2.14 ms; TCP 64 KiB 41-43 -> 29,
   * 16 MiB 7.6-7.7 -> 4.3-4.4 ms. */
  if (direct_group(b) && count && (out + count * es <= in || in + total <= out)) {
    tdist_status_t st = reduce_scatter_direct(c, out, in, count, dt, avg ? TDIST_SUM : op);
    if (!st && avg) tdist__reduce_finish_avg(out, count, dt, p);
    return st;
  }
  /* One scratch area: the working copy of all blocks, then the ring's receive segment. */
  size_t need = total + ring_tmp_bytes(count, es);
  uint8_t *work = scratch(b, need);
  if (!work) return nomem(c, need);
  if (total) memcpy(work, in, total);
  tdist_status_t st = p == 1 ? TDIST_OK
                             : ring_reduce_scatter(c, work, count * (size_t)p, dt,
                                                   avg ? TDIST_SUM : op, work + total);
  if (st) return st;
  if (count) memcpy(out, work + (size_t)r * count * es, count * es);
  if (avg) tdist__reduce_finish_avg(out, count, dt, p);
  return TDIST_OK;
}

static tdist_status_t all_to_all_v(ctx_t *c, const tdist__coll_t *k) {
  tdist__bctx_t *b = c->b;
  int p = b->size, r = b->rank;
  size_t es = tdist_dtype_size(k->dtype);
  uint8_t *out = k->out;
  const uint8_t *in = k->in;
  if (k->counts[r] != k->in_counts[r])
    return tdist__bctx_fail(b, TDIST_ERR_INVALID_ARGUMENT,
                            "all_to_all_v: this rank sends itself %zu elements but expects %zu",
                            k->in_counts[r], k->counts[r]);
  if (k->counts[r]) memmove(out + k->displs[r] * es, in + k->in_displs[r] * es, k->counts[r] * es);
  if (p == 1) return TDIST_OK;
  tdist__xfer_t *x = calloc(2 * (size_t)p, sizeof *x);
  if (!x) return nomem(c, 2 * (size_t)p * sizeof *x);
  int n = 0;
  /* Staggered order (r+s, r-s) spreads the load; the transport runs them all concurrently. */
  for (int s = 1; s < p; s++) {
    int to = mod(r + s, p), from = mod(r - s, p);
    x[n++] = xsend(c, to, in + k->in_displs[to] * es, k->in_counts[to] * es);
    x[n++] = xrecv(c, from, out + k->displs[from] * es, k->counts[from] * es);
  }
  tdist_status_t st = xchg(c, x, n);
  free(x);
  return st;
}

static tdist_status_t barrier(ctx_t *c) {
  int p = c->b->size, r = c->b->rank;
  for (int k = 1; k < p; k <<= 1) {
    tdist_status_t st = sendrecv(c, mod(r + k, p), NULL, 0, mod(r - k, p), NULL, 0);
    if (st) return st;
  }
  return TDIST_OK;
}

static tdist_status_t monitored_barrier(ctx_t *c, int64_t timeout_ms) {
  tdist__bctx_t *b = c->b;
  int p = b->size, r = b->rank;
  if (p == 1) return TDIST_OK;
  int64_t dl = tdist__now_ms() + timeout_ms;
  if (r != 0) {
    ctx_t c2 = *c;
    c2.dl = dl;
    tdist__xfer_t x[2] = {xsend(c, 0, NULL, 0), xrecv(c, 0, NULL, 0)};
    return xchg(&c2, x, 2);
  }
  tdist__xfer_t *x = calloc((size_t)p, sizeof *x);
  if (!x) return nomem(c, (size_t)p * sizeof *x);
  for (int i = 1; i < p; i++) x[i - 1] = xrecv(c, i, NULL, 0);
  ctx_t c2 = *c;
  c2.dl = dl;
  tdist_status_t st = xchg(&c2, x, p - 1);
  if (st == TDIST_ERR_TIMEOUT) {
    char missing[300] = "";
    size_t ml = 0;
    int nm = 0;
    for (int i = 1; i < p; i++) {
      if (x[i - 1].complete) continue;
      nm++;
      if (ml + 12 < sizeof missing)
        ml += (size_t)snprintf(missing + ml, sizeof missing - ml, "%s%d", ml ? ", " : "", i);
    }
    st = tdist__bctx_fail(b, TDIST_ERR_TIMEOUT,
                          "monitored_barrier: %d rank%s (%s) did not arrive within %lld ms", nm,
                          nm == 1 ? "" : "s", missing, (long long)timeout_ms);
  }
  if (!st) {
    for (int i = 1; i < p; i++) x[i - 1] = xsend(c, i, NULL, 0);
    st = xchg(c, x, p - 1);
  }
  free(x);
  return st;
}

/* ---------------------------------------------------------------------------------------- */
/* Collective fingerprints (TDIST_DEBUG=DETAIL)                                              */

typedef struct {
  uint64_t seq;
  uint32_t kind, dtype, op, root;
  uint64_t count;
} fp_t;

static void fp_str(const fp_t *f, char *buf, size_t cap) {
  snprintf(buf, cap, "%s #%llu (dtype %s, count %llu, op %s, root %u)",
           tdist__coll_name((tdist__coll_kind_t)f->kind), (unsigned long long)f->seq,
           tdist_dtype_name((tdist_dtype_t)f->dtype), (unsigned long long)f->count,
           tdist_reduce_op_name((tdist_reduce_op_t)f->op), f->root);
}

static tdist_status_t check_fingerprints(tdist__bctx_t *b, const tdist__coll_t *k, int64_t dl) {
  int p = b->size;
  fp_t mine = {k->seq,          (uint32_t)k->kind, (uint32_t)k->dtype,
               (uint32_t)k->op, (uint32_t)k->root, k->count};
  if (k->kind != TDIST__COLL_REDUCE && k->kind != TDIST__COLL_ALL_REDUCE &&
      k->kind != TDIST__COLL_REDUCE_SCATTER)
    mine.op = 0;
  if (k->kind != TDIST__COLL_BROADCAST && k->kind != TDIST__COLL_REDUCE &&
      k->kind != TDIST__COLL_GATHER && k->kind != TDIST__COLL_SCATTER)
    mine.root = 0;
  if (k->kind == TDIST__COLL_ALL_GATHER_V || k->kind == TDIST__COLL_ALL_TO_ALL_V ||
      k->kind == TDIST__COLL_BARRIER || k->kind == TDIST__COLL_MONITORED_BARRIER)
    mine.count = 0; /* sizes legitimately differ per rank */
  tdist__what_t what = {.fixed = "fingerprint check"};
  ctx_t c = {b, dl, &what, FINGERPRINT_TAG, 0};
  fp_t *all = calloc((size_t)p, sizeof *all);
  size_t *cd = calloc(2 * (size_t)p, sizeof *cd);
  if (!all || !cd) {
    free(all);
    free(cd);
    return nomem(&c, (size_t)p * sizeof *all);
  }
  for (int i = 0; i < p; i++) {
    cd[i] = 1;
    cd[p + i] = (size_t)i;
  }
  tdist_status_t st = all_gather_v(&c, (uint8_t *)all, (uint8_t *)&mine, cd, cd + p, sizeof mine);
  for (int i = 0; !st && i < p; i++) {
    if (memcmp(&all[i], &mine, sizeof mine) != 0) {
      char here[200], there[200];
      fp_str(&mine, here, sizeof here);
      fp_str(&all[i], there, sizeof there);
      st = tdist__bctx_fail(b, TDIST_ERR_INVALID_USAGE,
                            "collective mismatch: rank %d called %s but rank %d called %s", b->rank,
                            here, i, there);
    }
  }
  free(all);
  free(cd);
  return st;
}

/* ---------------------------------------------------------------------------------------- */
/* Backend glue                                                                              */

/* The transport's error sink: the group's, through the backend's context. */
static tdist_status_t fail_group(void *b, tdist_status_t st, const char *fmt, va_list ap) {
  return ((tdist__bctx_t *)b)->vfail(b, st, fmt, ap);
}

static tdist_status_t gloo_connect(tdist__bctx_t *b, int64_t deadline) {
  gloo_t *g = calloc(1, sizeof *g);
  if (!g) return tdist__bctx_fail(b, TDIST_ERR_NO_MEMORY, "gloo: out of memory");
  /* Every variable a gloo group reads, checked before anything is set up. */
  static const tdist__param_id_t k_params[] = {
      TDIST__P_LOG_LEVEL,  TDIST__P_DEBUG,          TDIST__P_SOCKET_IFNAME,
      TDIST__P_SHM,        TDIST__P_SPIN_US,        TDIST__P_SHM_SPIN_US,
      TDIST__P_SHM_YIELD,  TDIST__P_ALGO_ALLREDUCE, TDIST__P_REDUCE_KERNELS,
      TDIST__P_STATS_FILE, TDIST__P_P2P_BUFFER_MB,  TDIST__P_SHM_SINGLE_COPY};
  const char *bad = tdist__param_first_error(k_params, sizeof k_params / sizeof k_params[0], 0);
  if (bad) {
    free(g);
    return tdist__bctx_fail(b, TDIST_ERR_INVALID_ARGUMENT, "%s", bad);
  }
  g->force_algo = (int)tdist__param_int(TDIST__P_ALGO_ALLREDUCE); /* auto|ring|rd: 0, 1, 2 */
  g->fingerprint = tdist__param_int(TDIST__P_DEBUG) == 2;         /* OFF|INFO|DETAIL */
  tdist__transport_cfg_t cfg = {.rank = b->rank,
                                .size = b->size,
                                .store = b->store,
                                .name = b->name,
                                .socket_ifname = b->socket_ifname,
                                .timeout_ms = b->timeout_ms,
                                .abort_fd = b->abort_fd,
                                .aborted = &b->aborted,
                                .fail = fail_group,
                                .fail_ctx = b};
  tdist_status_t st = tdist__transport_create(&cfg, deadline, &g->tp);
  if (st) {
    free(g);
    return st;
  }
  b->state = g;
  return TDIST_OK;
}

static void gloo_destroy(tdist__bctx_t *b) {
  gloo_t *g = G(b);
  if (!g) return;
  g->tp->destroy(g->tp);
  free(g->scratch);
  free(g);
  b->state = NULL;
}

/* From what size a collective's same-host sends go by single copy (xfer.copy_min). Where every
 * rank sends and receives at once (all_gather, all_to_all) from 8 KiB: 2 ranks, 16 KiB all_gather
 * and all_to_all 2.1-2.4 -> 1.5-1.8 us (from 32 KiB), 4 ranks 64 KiB all_to_all 16 -> 12.6 us.
 * Where a root sends (broadcast, scatter, gather's senders, send/recv) from 32 KiB: below that
 * two copies through the ring let the sender return before the receiver reads, and a broadcast
 * of 16 KiB took 1.3-1.8 us with single copies from 8 KiB, 0.9-1.0 us without (4 ranks: 5-8.5
 * against 1.2-1.7). Sends the receiver reduces keep the transport's default (0: 256 KiB): 16-64
 * KiB all_reduce took 1.7-1.9x as long with single copies. */
static size_t copy_min(tdist__coll_kind_t kind) {
  switch (kind) {
    case TDIST__COLL_ALL_GATHER_V:
    case TDIST__COLL_ALL_TO_ALL_V: return 8 * 1024;
    case TDIST__COLL_BROADCAST:
    case TDIST__COLL_GATHER:
    case TDIST__COLL_SCATTER:
    case TDIST__COLL_SEND: return 32 * 1024;
    default: return 0;
  }
}

static tdist_status_t gloo_run(tdist__bctx_t *b, const tdist__coll_t *k, int64_t dl) {
  if (!b->state)
    return tdist__bctx_fail(b, TDIST_ERR_INVALID_USAGE, "%s: the process group was finalized",
                            tdist__coll_name(k->kind));
  tdist__what_t what = {.kind = k->kind, .seq = k->seq};
  ctx_t c = {b, dl, &what, COLL_TAG(k->kind), copy_min(k->kind)};
  size_t es = tdist_dtype_size(k->dtype);
  tdist_status_t st;
  if (G(b)->fingerprint && b->size > 1 && k->kind != TDIST__COLL_SEND &&
      k->kind != TDIST__COLL_RECV && (st = check_fingerprints(b, k, dl)))
    return st;
  switch (k->kind) {
    case TDIST__COLL_ALL_REDUCE: return all_reduce(&c, k->out, k->count, k->dtype, k->op);
    case TDIST__COLL_BROADCAST:
      return b->size == 1 ? TDIST_OK : broadcast(&c, k->out, k->count * es, k->root);
    case TDIST__COLL_REDUCE:
      return b->size == 1 ? TDIST_OK : reduce(&c, k->out, k->count, k->dtype, k->op, k->root);
    case TDIST__COLL_ALL_GATHER_V: return all_gather_v(&c, k->out, k->in, k->counts, k->displs, es);
    case TDIST__COLL_GATHER: return gather_scatter(&c, k->out, k->in, k->count * es, k->root, 1);
    case TDIST__COLL_SCATTER: return gather_scatter(&c, k->out, k->in, k->count * es, k->root, 0);
    case TDIST__COLL_REDUCE_SCATTER:
      return reduce_scatter(&c, k->out, k->in, k->count, k->dtype, k->op);
    case TDIST__COLL_ALL_TO_ALL_V: return all_to_all_v(&c, k);
    case TDIST__COLL_BARRIER: return barrier(&c);
    case TDIST__COLL_MONITORED_BARRIER: return monitored_barrier(&c, k->timeout_ms);
    case TDIST__COLL_SEND:
    case TDIST__COLL_RECV: {
      c.tag = (uint32_t)k->tag & ~TDIST__XFER_COLL_TAG;
      tdist__xfer_t x = k->kind == TDIST__COLL_SEND ? xsend(&c, k->peer, k->in, k->count * es)
                                                    : xrecv(&c, k->peer, k->out, k->count * es);
      return xchg(&c, &x, 1);
    }
    default:
      return tdist__bctx_fail(b, TDIST_ERR_INTERNAL, "gloo: unknown collective %d", (int)k->kind);
  }
}

/* The async worker's sends and receives as transfers: each keeps its own tag, deadline and name,
 * and the transport takes newly posted ones while the others wait (exchange_fed). */
typedef struct {
  tdist__xfer_feed_t base;
  tdist__p2p_feed_t *pf;
  ctx_t *c;
  int took; /* sends/receives taken so far (for the debug log) */
} xfeed_t;

static int xfeed_take(tdist__xfer_feed_t *f, tdist__xfer_t *x, int cap) {
  xfeed_t *xf = (xfeed_t *)f;
  tdist__coll_t *k[TDIST__P2P_BATCH_MAX];
  int n = xf->pf->take(xf->pf, k, cap < TDIST__P2P_BATCH_MAX ? cap : TDIST__P2P_BATCH_MAX);
  for (int i = 0; i < n; i++) {
    size_t bytes = k[i]->count * tdist_dtype_size(k[i]->dtype);
    xf->c->tag = (uint32_t)k[i]->tag & ~TDIST__XFER_COLL_TAG;
    x[i] = k[i]->kind == TDIST__COLL_SEND ? xsend(xf->c, k[i]->peer, k[i]->in, bytes)
                                          : xrecv(xf->c, k[i]->peer, k[i]->out, bytes);
    x[i].deadline_ms = k[i]->deadline_ms;
    x[i].user = k[i];
    x[i].what_kind = (int)k[i]->kind;
    x[i].what_seq = k[i]->seq;
  }
  if (n && tdist__log_enabled(TDIST__LOG_DEBUG)) {
    tdist__what_t w = {.kind = k[0]->kind, .seq = k[0]->seq};
    if (xf->took)
      tdist__log(TDIST__LOG_DEBUG, "gloo", "rank %d: %d sends/receives posted since join from %s",
                 xf->c->b->rank, n, tdist__what(&w));
    else
      tdist__log(TDIST__LOG_DEBUG, "gloo", "rank %d: %d queued sends/receives at once from %s",
                 xf->c->b->rank, n, tdist__what(&w));
  }
  xf->took += n;
  return n;
}

static void xfeed_done(tdist__xfer_feed_t *f, tdist__xfer_t *x) {
  xfeed_t *xf = (xfeed_t *)f;
  xf->pf->done(xf->pf, x->user);
}

static tdist_status_t gloo_run_p2p(tdist__bctx_t *b, tdist__p2p_feed_t *feed) {
  tdist__what_t what = {.fixed = "send/recv"};
  if (!b->state)
    return tdist__bctx_fail(b, TDIST_ERR_INVALID_USAGE, "%s: the process group was finalized",
                            tdist__what(&what));
  ctx_t c = {b, 0, &what, 0, copy_min(TDIST__COLL_SEND)};
  xfeed_t xf = {{xfeed_take, xfeed_done}, feed, &c, 0};
  return G(b)->tp->exchange_fed(G(b)->tp, &xf.base, &what);
}

static void gloo_wake_p2p(tdist__bctx_t *b) {
  if (G(b) && G(b)->tp) G(b)->tp->wake(G(b)->tp);
}

static void gloo_hangup(tdist__bctx_t *b) {
  if (G(b) && G(b)->tp && G(b)->tp->hangup) G(b)->tp->hangup(G(b)->tp);
}

static const tdist__backend_t k_backend = {.name = "gloo",
                                           .connect = gloo_connect,
                                           .destroy = gloo_destroy,
                                           .run = gloo_run,
                                           .run_p2p = gloo_run_p2p,
                                           .wake_p2p = gloo_wake_p2p,
                                           .hangup = gloo_hangup};

static const tdist__backend_reg_t k_reg = {.name = "gloo", .order = 0, .be = &k_backend};
__attribute__((constructor)) static void gloo_register(void) { tdist__backend_register(&k_reg); }
