/* Sweep of every collective over real processes and real TCP sockets (Gloo's sweep style):
 * world size x count x dtype x op x all_reduce algorithm, random data, each result checked
 * against a reference computed here, independently of the library's kernels.
 *
 * What runs (chosen to keep the target well under a minute per shard on 2 cores, ASan included):
 *   all_reduce, for each algorithm forced with TDIST_ALGO_ALLREDUCE=ring|rd|direct (set in the
 *     child before init), counts {0, 1, 37, 100003} (100003 elements is beyond the 64 KiB
 *     recursive-doubling threshold for every dtype, so "auto" would pick the ring), and for
 *     direct also 700001 float32 SUM and int64 MAX (several segments per block):
 *       worlds {2, 3, 5}: every dtype x every valid op (the full matrix);
 *       worlds {1, 4, 8}: the reduced matrix: SUM and MAX for every dtype, plus every op for
 *         float16, float64, int8 and int32 (so every op still runs at world 8).
 *     After each call every rank all_gathers a 64-bit hash of its result: all ranks must hold
 *     bitwise identical results. The values are checked by one rank per case (rotating).
 *   reduce (every root; SUM plus one more op per root, rotating through the valid ops) and
 *     reduce_scatter (same op matrix as all_reduce) with the same references, and per-rank
 *       blocks of 150001 float32 SUM and int64 MAX (several segments of the direct algorithm);
 *   broadcast (every root), all_gather, all_gather_v (uneven counts with zeros, blocks out of
 *     rank order with gaps), gather/scatter (every root), all_to_all, all_to_all_v (uneven, with
 *     zeros), barrier (nobody leaves before everyone arrived: a shared-memory arrival counter),
 *     send/recv between every pair with several tags in a row; all byte-exact, and every output
 *     buffer has guard bytes after it that must stay untouched.
 *
 * Inputs and references:
 *   integers: full-range random values for SUM/AVG/MIN/MAX/BAND/BOR/BXOR (SUM wraps, and the
 *     reference wraps in two's complement exactly: it is computed in uint64 and truncated, which
 *     is exact mod 2^n whatever order the library reduces in); PROD uses values in {+-1,+-2,+-3}
 *     ({1,2,3} for uint8) so int32/int64 products stay exact and int8/uint8 wrap (checked
 *     exactly too); AVG is the wrapped sum divided by the world size, truncating toward zero.
 *   floats: built bit by bit (sign, exponent in a small range, random mantissa), so every input
 *     is exactly representable: magnitudes in [2^-5, 4) for SUM/AVG/MIN/MAX and [0.5, 2) for
 *     PROD (a product of 8 such values stays in [2^-8, 2^8]: no overflow, no subnormals even in
 *     float16). float16 and bfloat16 are decoded here from the IEEE definition. The reference is
 *     computed in long double (64-bit significand) from the same inputs, so its own error is
 *     negligible next to the tolerances:
 *       MIN, MAX: exact (a selection, no rounding).
 *       SUM:  |got - ref| <= 2 (p-1) u sum|x|.  Any association of p-1 additions, each rounded
 *             once to the dtype, errs by at most (p-1) u sum|x| (+O(u^2)); the factor 2 covers
 *             the second-order term and the float16/bfloat16 path (widen to float, add, round
 *             back), which in these ranges is exact in float and so rounds only once anyway.
 *       PROD: |got - ref| <= 2 (p-1) u |ref|   (p-1 multiplications, each relative error <= u).
 *       AVG:  |got - ref| <= 2 (p-1) u sum|x| / p + 2 u |ref|   (the sum's error scaled by 1/p,
 *             plus the rounding of the division).
 *     u is the unit roundoff: 2^-11 float16, 2^-8 bfloat16, 2^-24 float32, 2^-53 float64.
 *
 * Transports: every job runs twice, with the default transports (same-host peers use shared
 * memory) and with TDIST_SHM=0 (TCP only).
 * What ran: every rank reads its own debug log (tests/testlib/logcap.h) and checks that it linked
 * every peer over shared memory (or, TCP only, none), and that each all_reduce that moved data
 * ran the forced algorithm (a forced ring with fewer elements than ranks runs recursive
 * doubling, as documented in runtime/gloo/gloo.c).
 * Sharding: the (world, phase, transport) jobs are spread over Bazel's shards (shard_count).
 *
 * Backend "mpi" (tests/mpi/mpi_sweep_test.sh): `collectives_sweep_test --mpi ARRIVALS_FILE`,
 * started by mpirun, runs every phase in one group of backend "mpi" (rank and world from
 * MPI_COMM_WORLD; the full op matrix at worlds 2, 3 and 5), all_reduce once blocking and once
 * through tdist_all_reduce_async, with the same inputs, references and bitwise-identity checks.
 * The barrier's arrival counters live in ARRIVALS_FILE (4096 zero bytes, shared by the ranks);
 * the gloo-only log checks (transport, algorithm) are skipped. */
#define _GNU_SOURCE
#include <inttypes.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <fcntl.h>
#include <unistd.h>

#include "check.h"
#include "clock.h"
#include "shard.h"
#include "logcap.h"
#include "ranks.h"

#define LARGE 100003 /* > 64 KiB for every dtype: the ring runs */
/* The direct all_reduce's blocks move in 256 KiB segments, single copies from 256 KiB between
 * same-host ranks: 700001 float32/int64 elements make blocks of several uneven segments at
 * every world here (float32 SUM and int64 MAX only, to keep the time down). */
#define DIRECT_BIG 700001
#define RS_LARGE 20011 /* reduce_scatter: per-rank block, p * 20011 elements in all */
#define RS_BIG 150001  /* reduce_scatter, float32 SUM and int64 MAX: blocks of several segments */
#define A2A_LARGE 4099 /* all_to_all: per-peer block */
#define GATHER_LARGE 10007
#define GUARD 64 /* guard bytes after every output buffer */
#define GUARD_BYTE 0xC3
#define TIMEOUT_MS 60000
#define RUN_TIMEOUT_MS 110000
#define MAX_WORLD 8

static const size_t k_counts[] = {0, 1, 37, LARGE};
static const tdist_dtype_t k_dtypes[] = {TDIST_FLOAT16, TDIST_BFLOAT16, TDIST_FLOAT32,
                                         TDIST_FLOAT64, TDIST_INT8,     TDIST_UINT8,
                                         TDIST_INT32,   TDIST_INT64};
#define NDT (sizeof k_dtypes / sizeof k_dtypes[0])

typedef struct {
  const char *algo; /* "ring", "rd" or NULL (auto) */
  int full;         /* full dtype x op matrix */
  /* shared (MAP_SHARED) across the forked ranks: barrier arrival counters */
  _Atomic int *arrivals;
  int shm;            /* same-host peers must be linked over shared memory (else TCP only) */
  tdist_pg_t *mpi_pg; /* --mpi: the one group every phase uses (NULL: gloo, a group per job) */
  int async;          /* all_reduce through tdist_all_reduce_async + tdist_work_wait */
} cfg_t;

/* The job's group: the mpi group, or a new gloo group over the parent's store. */
static tdist_pg_t *body_pg(const cfg_t *cfg, int *rank, int *world, int port,
                           tdist_store_t **store) {
  *store = NULL;
  if (!cfg->mpi_pg) return tdist_test_init_pg(*rank, *world, port, TIMEOUT_MS, store);
  *rank = tdist_pg_rank(cfg->mpi_pg);
  *world = tdist_pg_size(cfg->mpi_pg);
  return cfg->mpi_pg;
}

static void body_done(const cfg_t *cfg, tdist_pg_t *pg, tdist_store_t *store) {
  if (cfg->mpi_pg) return;
  tdist_pg_destroy(pg);
  tdist_store_destroy(store);
}

/* ---------------------------------------------------------------------------------------- */
/* dtypes, inputs and references                                                             */

static int is_float(tdist_dtype_t dt) { return dt <= TDIST_FLOAT64; }

static int op_valid(tdist_dtype_t dt, tdist_reduce_op_t op) {
  return op <= TDIST_AVG || !is_float(dt);
}

static int in_matrix(const cfg_t *cfg, tdist_dtype_t dt, tdist_reduce_op_t op) {
  if (!op_valid(dt, op)) return 0;
  if (cfg->full) return 1;
  return op == TDIST_SUM || op == TDIST_MAX || dt == TDIST_FLOAT16 || dt == TDIST_FLOAT64 ||
         dt == TDIST_INT8 || dt == TDIST_INT32;
}

static long double unit_roundoff(tdist_dtype_t dt) {
  switch (dt) {
    case TDIST_FLOAT16: return ldexpl(1, -11);
    case TDIST_BFLOAT16: return ldexpl(1, -8);
    case TDIST_FLOAT32: return ldexpl(1, -24);
    default: return ldexpl(1, -53);
  }
}

/* IEEE 754 binary16, decoded from its definition. */
static long double f16_value(uint16_t h) {
  int e = (h >> 10) & 0x1f, m = h & 0x3ff;
  long double v;
  if (e == 0)
    v = ldexpl(m, -24);
  else if (e == 31)
    v = m ? NAN : INFINITY;
  else
    v = ldexpl(1024 + m, e - 25);
  return (h & 0x8000) ? -v : v;
}

/* bfloat16 is the top half of a float32. */
static long double bf16_value(uint16_t b) {
  uint32_t u = (uint32_t)b << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

static long double get_float(tdist_dtype_t dt, const void *buf, size_t i) {
  switch (dt) {
    case TDIST_FLOAT16: return f16_value(((const uint16_t *)buf)[i]);
    case TDIST_BFLOAT16: return bf16_value(((const uint16_t *)buf)[i]);
    case TDIST_FLOAT32: return ((const float *)buf)[i];
    default: return ((const double *)buf)[i];
  }
}

static int64_t get_int(tdist_dtype_t dt, const void *buf, size_t i) {
  switch (dt) {
    case TDIST_INT8: return ((const int8_t *)buf)[i];
    case TDIST_UINT8: return ((const uint8_t *)buf)[i];
    case TDIST_INT32: return ((const int32_t *)buf)[i];
    default: return ((const int64_t *)buf)[i];
  }
}

/* Two's complement truncation of a uint64 to the dtype, sign- or zero-extended back. */
static int64_t wrap_int(tdist_dtype_t dt, uint64_t v) {
  switch (dt) {
    case TDIST_INT8: return (int8_t)(uint8_t)v;
    case TDIST_UINT8: return (uint8_t)v;
    case TDIST_INT32: return (int32_t)(uint32_t)v;
    default: return (int64_t)v;
  }
}

/* Writes element i of `rank`'s input for case `seed` to *dst (one element). */
static void gen(tdist_dtype_t dt, tdist_reduce_op_t op, uint64_t seed, int rank, size_t i,
                void *dst) {
  uint64_t z = tdist_test_rand(seed, (uint64_t)rank, i);
  unsigned neg = (unsigned)(z & 1);
  z >>= 1;
  int prod = op == TDIST_PROD;
  switch (dt) {
    case TDIST_FLOAT16: { /* exponent field 10..16 -> [2^-5, 4); 14..15 -> [0.5, 2) */
      unsigned e = prod ? 14 + (unsigned)(z % 2) : 10 + (unsigned)(z % 7);
      z >>= 8;
      *(uint16_t *)dst = (uint16_t)(neg << 15 | e << 10 | (unsigned)(z & 0x3ff));
      break;
    }
    case TDIST_BFLOAT16: {
      unsigned e = prod ? 126 + (unsigned)(z % 2) : 122 + (unsigned)(z % 7);
      z >>= 8;
      *(uint16_t *)dst = (uint16_t)(neg << 15 | e << 7 | (unsigned)(z & 0x7f));
      break;
    }
    case TDIST_FLOAT32: {
      int e = prod ? -1 + (int)(z % 2) : -5 + (int)(z % 7);
      z >>= 8;
      float f = (float)ldexp(1.0 + (double)(z & 0x7fffff) / 0x800000, e); /* 23-bit mantissa */
      *(float *)dst = neg ? -f : f;
      break;
    }
    case TDIST_FLOAT64: {
      int e = prod ? -1 + (int)(z % 2) : -5 + (int)(z % 7);
      z >>= 8;
      double d = ldexp(1.0 + (double)(z & ((1ull << 52) - 1)) / 0x1p52, e);
      *(double *)dst = neg ? -d : d;
      break;
    }
    default: {
      uint64_t v = z << 1 | neg; /* full range */
      if (prod) {
        int64_t s = 1 + (int64_t)(z % 3);
        if (dt != TDIST_UINT8 && neg) s = -s;
        v = (uint64_t)s;
      }
      switch (dt) {
        case TDIST_INT8: *(int8_t *)dst = (int8_t)wrap_int(dt, v); break;
        case TDIST_UINT8: *(uint8_t *)dst = (uint8_t)v; break;
        case TDIST_INT32: *(int32_t *)dst = (int32_t)wrap_int(dt, v); break;
        default: *(int64_t *)dst = (int64_t)v; break;
      }
    }
  }
}

static void fill(void *buf, size_t count, tdist_dtype_t dt, tdist_reduce_op_t op, uint64_t seed,
                 int rank, size_t base) {
  size_t es = tdist_dtype_size(dt);
  for (size_t i = 0; i < count; i++) gen(dt, op, seed, rank, base + i, (uint8_t *)buf + i * es);
}

static uint64_t case_seed(int kind, int world, tdist_dtype_t dt, tdist_reduce_op_t op, size_t count,
                          int root) {
  return ((((uint64_t)kind * 16 + (uint64_t)world) * 16 + (uint64_t)dt) * 16 + (uint64_t)op) *
             1000003u +
         count * 17 + (uint64_t)root;
}

/* Checks out[i] (i < count) against the reduction over all ranks of input element base + i.
 * Exits the rank with a precise message on the first mismatch. */
static void check_reduction(const char *what, const cfg_t *cfg, int world, const void *out,
                            size_t count, tdist_dtype_t dt, tdist_reduce_op_t op, uint64_t seed,
                            size_t base) {
  for (size_t i = 0; i < count; i++) {
    uint64_t x[MAX_WORLD]; /* one element each, 8-byte aligned for any dtype */
    for (int r = 0; r < world; r++) gen(dt, op, seed, r, base + i, &x[r]);
    if (is_float(dt)) {
      long double sum = 0, abs_sum = 0, prod = 1, mn = INFINITY, mx = -INFINITY;
      for (int r = 0; r < world; r++) {
        long double v = get_float(dt, &x[r], 0);
        sum += v;
        abs_sum += fabsl(v);
        prod *= v;
        if (v < mn) mn = v;
        if (v > mx) mx = v;
      }
      long double u = unit_roundoff(dt), ref, tol;
      switch (op) {
        case TDIST_SUM:
          ref = sum;
          tol = 2 * (world - 1) * u * abs_sum;
          break;
        case TDIST_PROD:
          ref = prod;
          tol = 2 * (world - 1) * u * fabsl(prod);
          break;
        case TDIST_MIN:
          ref = mn;
          tol = 0;
          break;
        case TDIST_MAX:
          ref = mx;
          tol = 0;
          break;
        default: /* AVG */
          ref = sum / world;
          tol = 2 * (world - 1) * u * abs_sum / world + 2 * u * fabsl(ref);
          break;
      }
      long double got = get_float(dt, out, i);
      if (!(fabsl(got - ref) <= tol)) {
        fprintf(stderr,
                "%s mismatch: world %d algo %s dtype %s op %s count %zu element %zu: got %.20Lg, "
                "reference %.20Lg, tolerance %.6Lg\n",
                what, world, cfg->algo ? cfg->algo : "auto", tdist_dtype_name(dt),
                tdist_reduce_op_name(op), count, i, got, ref, tol);
        exit(1);
      }
    } else {
      uint64_t sum = 0, prod = 1, band = ~0ull, bor = 0, bxor = 0;
      int64_t mn = INT64_MAX, mx = INT64_MIN;
      for (int r = 0; r < world; r++) {
        int64_t v = get_int(dt, &x[r], 0);
        sum += (uint64_t)v;
        prod *= (uint64_t)v;
        band &= (uint64_t)v;
        bor |= (uint64_t)v;
        bxor ^= (uint64_t)v;
        if (v < mn) mn = v;
        if (v > mx) mx = v;
      }
      int64_t ref;
      switch (op) {
        case TDIST_SUM: ref = wrap_int(dt, sum); break;
        case TDIST_PROD: ref = wrap_int(dt, prod); break;
        case TDIST_MIN: ref = mn; break;
        case TDIST_MAX: ref = mx; break;
        case TDIST_AVG: ref = wrap_int(dt, sum) / world; break; /* C truncates toward zero */
        case TDIST_BAND: ref = wrap_int(dt, band); break;
        case TDIST_BOR: ref = wrap_int(dt, bor); break;
        default: ref = wrap_int(dt, bxor); break;
      }
      int64_t got = get_int(dt, out, i);
      if (got != ref) {
        fprintf(stderr,
                "%s mismatch: world %d algo %s dtype %s op %s count %zu element %zu: got %" PRId64
                ", reference %" PRId64 "\n",
                what, world, cfg->algo ? cfg->algo : "auto", tdist_dtype_name(dt),
                tdist_reduce_op_name(op), count, i, got, ref);
        exit(1);
      }
    }
  }
}

/* ---------------------------------------------------------------------------------------- */
/* helpers                                                                                   */

static uint64_t hash_bytes(const void *p, size_t n) {
  const uint8_t *b = p;
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

static void set_guard(void *buf, size_t bytes) {
  memset((uint8_t *)buf + bytes, GUARD_BYTE, GUARD);
}

static void check_guard(const char *what, const void *buf, size_t bytes) {
  const uint8_t *g = (const uint8_t *)buf + bytes;
  for (size_t i = 0; i < GUARD; i++) {
    if (g[i] != GUARD_BYTE) {
      fprintf(stderr,
              "%s: wrote past the end of the output (%zu bytes): guard byte %zu is "
              "0x%02x\n",
              what, bytes, i, g[i]);
      exit(1);
    }
  }
}

/* Deterministic byte streams for the data-movement collectives. */
static uint8_t byte_at(uint64_t seed, uint64_t stream, size_t k) {
  return (uint8_t)(tdist_test_rand(seed, stream, k >> 3) >> ((k & 7) * 8));
}

static void fill_bytes(void *buf, size_t n, uint64_t seed, uint64_t stream) {
  uint8_t *p = buf;
  for (size_t k = 0; k < n; k++) p[k] = byte_at(seed, stream, k);
}

static void check_bytes(const char *what, int world, const void *buf, size_t n, uint64_t seed,
                        uint64_t stream) {
  const uint8_t *p = buf;
  for (size_t k = 0; k < n; k++) {
    if (p[k] != byte_at(seed, stream, k)) {
      fprintf(stderr, "%s (world %d): byte %zu of %zu is 0x%02x, expected 0x%02x\n", what, world, k,
              n, p[k], byte_at(seed, stream, k));
      exit(1);
    }
  }
}

static void *xmalloc(size_t n) {
  void *p = malloc(n ? n : 1);
  CHECK(p != NULL);
  return p;
}

/* Every rank must hold the same `bytes` at buf: all_gather a hash and compare. */
static void check_identical(tdist_pg_t *pg, const char *what, const void *buf, size_t bytes) {
  int world = tdist_pg_size(pg);
  int64_t mine = (int64_t)hash_bytes(buf, bytes), all[MAX_WORLD];
  CHECK_OK_MSG(tdist_all_gather(pg, all, &mine, 1, TDIST_INT64), tdist_pg_last_error(pg));
  for (int r = 0; r < world; r++) {
    if (all[r] != mine) {
      fprintf(stderr,
              "%s: rank %d's result differs from rank %d's (hash %016" PRIx64 " vs %016" PRIx64
              ")\n",
              what, tdist_pg_rank(pg), r, (uint64_t)mine, (uint64_t)all[r]);
      exit(1);
    }
  }
}

/* ---------------------------------------------------------------------------------------- */
/* all_reduce phase                                                                          */

/* The cases that also run at DIRECT_BIG / RS_BIG elements (blocks of several segments). */
static int big_case(tdist_dtype_t dt, int op) {
  return (dt == TDIST_FLOAT32 && op == TDIST_SUM) || (dt == TDIST_INT64 && op == TDIST_MAX);
}

static int all_reduce_body(int rank, int world, int port, void *arg) {
  const cfg_t *cfg = arg;
  if (!cfg->mpi_pg) {
    setenv("TDIST_ALGO_ALLREDUCE", cfg->algo, 1);
    logcap_begin("sweep");
  }
  tdist_store_t *store;
  tdist_pg_t *pg = body_pg(cfg, &rank, &world, port, &store);
  uint8_t *buf = xmalloc(DIRECT_BIG * 8 + GUARD);
  int case_no = 0, want_ring = 0, want_rd = 0, want_direct = 0;
  int direct = cfg->algo && !strcmp(cfg->algo, "direct");
  for (size_t d = 0; d < NDT; d++) {
    tdist_dtype_t dt = k_dtypes[d];
    size_t es = tdist_dtype_size(dt);
    for (int op = 0; op < TDIST_REDUCE_OP_COUNT_; op++) {
      if (!in_matrix(cfg, dt, (tdist_reduce_op_t)op)) continue;
      int big = direct && big_case(dt, op);
      for (size_t c = 0; c < sizeof k_counts / sizeof k_counts[0] + (size_t)big; c++) {
        size_t n = c < sizeof k_counts / sizeof k_counts[0] ? k_counts[c] : DIRECT_BIG;
        uint64_t seed = case_seed(1, world, dt, (tdist_reduce_op_t)op, n, 0);
        fill(buf, n, dt, (tdist_reduce_op_t)op, seed, rank, 0);
        set_guard(buf, n * es);
        tdist_status_t st;
        if (cfg->async) {
          tdist_work_t *w = NULL;
          st = tdist_all_reduce_async(pg, n ? buf : NULL, n, dt, (tdist_reduce_op_t)op, &w);
          if (!st) st = tdist_work_wait(w, -1);
          tdist_work_destroy(w);
        } else {
          st = tdist_all_reduce(pg, n ? buf : NULL, n, dt, (tdist_reduce_op_t)op);
        }
        if (st) {
          fprintf(stderr, "rank %d: all_reduce world %d algo %s dtype %s op %s count %zu: %s: %s\n",
                  rank, world, cfg->algo ? cfg->algo : "mpi", tdist_dtype_name(dt),
                  tdist_reduce_op_name((tdist_reduce_op_t)op), n, tdist_status_name(st),
                  tdist_pg_last_error(pg));
          return 1;
        }
        if (n && world > 1) {
          if (cfg->algo && !strcmp(cfg->algo, "ring") && n >= (size_t)world)
            want_ring++;
          else if (direct && n >= (size_t)world)
            want_direct++;
          else
            want_rd++;
        }
        check_guard("all_reduce", buf, n * es);
        if (case_no++ % world == rank)
          check_reduction("all_reduce", cfg, world, buf, n, dt, (tdist_reduce_op_t)op, seed, 0);
        check_identical(pg, "all_reduce", buf, n * es);
      }
    }
  }
  body_done(cfg, pg, store);
  free(buf);
  if (cfg->mpi_pg) return 0;
  char *log = logcap_end();
  logcap_expect_transport(log, rank, world, cfg->shm, 1);
  logcap_expect_algos3(log, rank, want_ring, want_rd, want_direct);
  free(log);
  return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* reductions to one rank / reduce_scatter                                                   */

static void run_reduce(tdist_pg_t *pg, const cfg_t *cfg, uint8_t *buf) {
  int rank = tdist_pg_rank(pg), world = tdist_pg_size(pg);
  for (int root = 0; root < world; root++) {
    for (size_t d = 0; d < NDT; d++) {
      tdist_dtype_t dt = k_dtypes[d];
      size_t es = tdist_dtype_size(dt);
      int nops = is_float(dt) ? 5 : 8;
      tdist_reduce_op_t ops[2] = {TDIST_SUM, (tdist_reduce_op_t)(1 + (root + (int)d) % (nops - 1))};
      for (int k = 0; k < 2; k++) {
        tdist_reduce_op_t op = ops[k];
        for (size_t c = 0; c < sizeof k_counts / sizeof k_counts[0]; c++) {
          size_t n = k_counts[c];
          uint64_t seed = case_seed(2, world, dt, op, n, root);
          fill(buf, n, dt, op, seed, rank, 0);
          set_guard(buf, n * es);
          tdist_status_t st = tdist_reduce(pg, n ? buf : NULL, n, dt, op, root);
          if (st) {
            fprintf(stderr, "rank %d: reduce world %d root %d dtype %s op %s count %zu: %s: %s\n",
                    rank, world, root, tdist_dtype_name(dt), tdist_reduce_op_name(op), n,
                    tdist_status_name(st), tdist_pg_last_error(pg));
            exit(1);
          }
          check_guard("reduce", buf, n * es);
          if (rank == root) check_reduction("reduce", cfg, world, buf, n, dt, op, seed, 0);
        }
      }
    }
  }
}

static void run_reduce_scatter(tdist_pg_t *pg, const cfg_t *cfg) {
  int rank = tdist_pg_rank(pg), world = tdist_pg_size(pg);
  size_t counts[] = {0, 1, 37, RS_LARGE, RS_BIG};
  uint8_t *in = xmalloc((size_t)world * RS_BIG * 8);
  uint8_t *out = xmalloc(RS_BIG * 8 + GUARD);
  for (size_t d = 0; d < NDT; d++) {
    tdist_dtype_t dt = k_dtypes[d];
    size_t es = tdist_dtype_size(dt);
    for (int op = 0; op < TDIST_REDUCE_OP_COUNT_; op++) {
      if (!in_matrix(cfg, dt, (tdist_reduce_op_t)op)) continue;
      for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++) {
        size_t n = counts[c];
        if (n == RS_BIG && !big_case(dt, op)) continue;
        uint64_t seed = case_seed(3, world, dt, (tdist_reduce_op_t)op, n, 0);
        fill(in, n * (size_t)world, dt, (tdist_reduce_op_t)op, seed, rank, 0);
        set_guard(out, n * es);
        tdist_status_t st =
            tdist_reduce_scatter(pg, n ? out : NULL, n ? in : NULL, n, dt, (tdist_reduce_op_t)op);
        if (st) {
          fprintf(stderr, "rank %d: reduce_scatter world %d dtype %s op %s count %zu: %s: %s\n",
                  rank, world, tdist_dtype_name(dt), tdist_reduce_op_name((tdist_reduce_op_t)op), n,
                  tdist_status_name(st), tdist_pg_last_error(pg));
          exit(1);
        }
        check_guard("reduce_scatter", out, n * es);
        /* Block `rank` of the reduction: input elements rank * n .. rank * n + n - 1. */
        check_reduction("reduce_scatter", cfg, world, out, n, dt, (tdist_reduce_op_t)op, seed,
                        (size_t)rank * n);
      }
    }
  }
  free(in);
  free(out);
}

/* ---------------------------------------------------------------------------------------- */
/* data movement                                                                             */

#define OK(pg, expr) CHECK_OK_MSG(expr, tdist_pg_last_error(pg))

static void run_broadcast(tdist_pg_t *pg, uint8_t *buf) {
  int rank = tdist_pg_rank(pg), world = tdist_pg_size(pg);
  for (int root = 0; root < world; root++) {
    for (size_t c = 0; c < sizeof k_counts / sizeof k_counts[0]; c++) {
      size_t n = k_counts[c];
      tdist_dtype_t dt = k_dtypes[((size_t)root + c) % NDT];
      size_t bytes = n * tdist_dtype_size(dt);
      uint64_t seed = case_seed(4, world, dt, 0, n, root);
      if (rank == root)
        fill_bytes(buf, bytes, seed, 0);
      else
        memset(buf, 0xA5, bytes);
      set_guard(buf, bytes);
      OK(pg, tdist_broadcast(pg, n ? buf : NULL, n, dt, root));
      check_bytes("broadcast", world, buf, bytes, seed, 0);
      check_guard("broadcast", buf, bytes);
    }
  }
}

static void run_all_gather(tdist_pg_t *pg, uint8_t *in, uint8_t *out) {
  int rank = tdist_pg_rank(pg), world = tdist_pg_size(pg);
  size_t counts[] = {0, 1, 37, GATHER_LARGE};
  for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++) {
    size_t n = counts[c];
    tdist_dtype_t dt = k_dtypes[(c * 3) % NDT];
    size_t bytes = n * tdist_dtype_size(dt);
    uint64_t seed = case_seed(5, world, dt, 0, n, 0);
    fill_bytes(in, bytes, seed, (uint64_t)rank);
    memset(out, 0xA5, bytes * (size_t)world);
    set_guard(out, bytes * (size_t)world);
    OK(pg, tdist_all_gather(pg, n ? out : NULL, n ? in : NULL, n, dt));
    for (int r = 0; r < world; r++)
      check_bytes("all_gather", world, out + (size_t)r * bytes, bytes, seed, (uint64_t)r);
    check_guard("all_gather", out, bytes * (size_t)world);
  }
}

/* Uneven counts (every third rank contributes nothing, the last one a large block), blocks
 * placed in reverse rank order with 3-element gaps that must stay untouched. */
static void run_all_gather_v(tdist_pg_t *pg, uint8_t *in, uint8_t *out, int all_zero) {
  int rank = tdist_pg_rank(pg), world = tdist_pg_size(pg);
  size_t counts[MAX_WORLD], displs[MAX_WORLD];
  tdist_dtype_t dt = all_zero ? TDIST_INT32 : TDIST_FLOAT16;
  size_t es = tdist_dtype_size(dt);
  uint64_t seed = case_seed(6, world, dt, 0, (size_t)all_zero, 0);
  for (int r = 0; r < world; r++) {
    if (all_zero || r % 3 == 1)
      counts[r] = 0;
    else if (r == world - 1)
      counts[r] = GATHER_LARGE;
    else
      counts[r] = tdist_test_rand(seed, (uint64_t)r, 999) % 50;
  }
  size_t pos = 3;
  for (int r = world - 1; r >= 0; r--) {
    displs[r] = pos;
    pos += counts[r] + 3;
  }
  size_t total = pos;
  fill_bytes(in, counts[rank] * es, seed, (uint64_t)rank);
  memset(out, GUARD_BYTE, total * es + GUARD);
  OK(pg, tdist_all_gather_v(pg, out, counts, displs, in, dt));
  for (int r = 0; r < world; r++)
    check_bytes("all_gather_v", world, out + displs[r] * es, counts[r] * es, seed, (uint64_t)r);
  /* gaps: everything not covered by a block */
  size_t at = 0;
  for (int r = world - 1; r >= -1; r--) {
    size_t end = r >= 0 ? displs[r] : total;
    for (size_t k = at * es; k < end * es; k++) {
      if (out[k] != GUARD_BYTE) {
        fprintf(stderr, "all_gather_v (world %d): byte %zu outside every block was written\n",
                world, k);
        exit(1);
      }
    }
    if (r >= 0) at = displs[r] + counts[r];
  }
  check_guard("all_gather_v", out, total * es);
}

static void run_gather_scatter(tdist_pg_t *pg, uint8_t *in, uint8_t *out) {
  int rank = tdist_pg_rank(pg), world = tdist_pg_size(pg);
  size_t counts[] = {0, 1, 37, GATHER_LARGE};
  for (int root = 0; root < world; root++) {
    for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++) {
      size_t n = counts[c];
      tdist_dtype_t dt = k_dtypes[((size_t)root * 5 + c) % NDT];
      size_t bytes = n * tdist_dtype_size(dt), all = bytes * (size_t)world;
      uint64_t seed = case_seed(7, world, dt, 0, n, root);
      /* gather */
      fill_bytes(in, bytes, seed, (uint64_t)rank);
      if (rank == root) {
        memset(out, 0xA5, all);
        set_guard(out, all);
      }
      OK(pg, tdist_gather(pg, rank == root && n ? out : NULL, n ? in : NULL, n, dt, root));
      if (rank == root) {
        for (int r = 0; r < world; r++)
          check_bytes("gather", world, out + (size_t)r * bytes, bytes, seed, (uint64_t)r);
        check_guard("gather", out, all);
      }
      /* scatter: block r of root's input goes to rank r */
      if (rank == root)
        for (int r = 0; r < world; r++)
          fill_bytes(in + (size_t)r * bytes, bytes, seed + 1, (uint64_t)r);
      memset(out, 0xA5, bytes);
      set_guard(out, bytes);
      OK(pg, tdist_scatter(pg, n ? out : NULL, rank == root && n ? in : NULL, n, dt, root));
      check_bytes("scatter", world, out, bytes, seed + 1, (uint64_t)rank);
      check_guard("scatter", out, bytes);
    }
  }
}

static void run_all_to_all(tdist_pg_t *pg, uint8_t *in, uint8_t *out) {
  int rank = tdist_pg_rank(pg), world = tdist_pg_size(pg);
  size_t counts[] = {0, 1, 37, A2A_LARGE};
  for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++) {
    size_t n = counts[c];
    tdist_dtype_t dt = k_dtypes[(c * 5 + 1) % NDT];
    size_t bytes = n * tdist_dtype_size(dt), all = bytes * (size_t)world;
    uint64_t seed = case_seed(8, world, dt, 0, n, 0);
    /* block j of rank r's input: stream r * 64 + j */
    for (int j = 0; j < world; j++)
      fill_bytes(in + (size_t)j * bytes, bytes, seed, (uint64_t)(rank * 64 + j));
    memset(out, 0xA5, all);
    set_guard(out, all);
    OK(pg, tdist_all_to_all(pg, n ? out : NULL, n ? in : NULL, n, dt));
    for (int i = 0; i < world; i++)
      check_bytes("all_to_all", world, out + (size_t)i * bytes, bytes, seed,
                  (uint64_t)(i * 64 + rank));
    check_guard("all_to_all", out, all);
  }
}

/* Elements rank src sends to rank dst in all_to_all_v. */
static size_t a2av_count(uint64_t seed, int src, int dst, int world) {
  if ((src + dst) % 3 == 0) return 0;
  size_t n = tdist_test_rand(seed, (uint64_t)(src * 64 + dst), 12345) % 40;
  if (src == 0 && dst == world - 1) n += 5000;
  return n;
}

static void run_all_to_all_v(tdist_pg_t *pg, uint8_t *in, uint8_t *out) {
  int rank = tdist_pg_rank(pg), world = tdist_pg_size(pg);
  size_t in_counts[MAX_WORLD], in_displs[MAX_WORLD], out_counts[MAX_WORLD], out_displs[MAX_WORLD];
  tdist_dtype_t dt = TDIST_FLOAT64;
  size_t es = tdist_dtype_size(dt);
  uint64_t seed = case_seed(9, world, dt, 0, 0, 0);
  /* input blocks packed in reverse destination order; output blocks in source order with
   * 2-element gaps */
  size_t pos = 0;
  for (int j = world - 1; j >= 0; j--) {
    in_counts[j] = a2av_count(seed, rank, j, world);
    in_displs[j] = pos;
    pos += in_counts[j];
  }
  for (int j = 0; j < world; j++)
    fill_bytes(in + in_displs[j] * es, in_counts[j] * es, seed, (uint64_t)(rank * 64 + j));
  pos = 2;
  for (int i = 0; i < world; i++) {
    out_counts[i] = a2av_count(seed, i, rank, world);
    out_displs[i] = pos;
    pos += out_counts[i] + 2;
  }
  size_t total = pos;
  memset(out, GUARD_BYTE, total * es + GUARD);
  OK(pg, tdist_all_to_all_v(pg, out, out_counts, out_displs, in, in_counts, in_displs, dt));
  for (int i = 0; i < world; i++)
    check_bytes("all_to_all_v", world, out + out_displs[i] * es, out_counts[i] * es, seed,
                (uint64_t)(i * 64 + rank));
  size_t at = 0;
  for (int i = 0; i <= world; i++) {
    size_t end = i < world ? out_displs[i] : total;
    for (size_t k = at * es; k < end * es; k++)
      CHECK(out[k] == GUARD_BYTE); /* a gap between blocks was written */
    if (i < world) at = out_displs[i] + out_counts[i];
  }
  check_guard("all_to_all_v", out, total * es);
}

/* Nobody may leave a barrier before everyone entered it: each round, one rank comes late. */
static void run_barrier(tdist_pg_t *pg, const cfg_t *cfg) {
  int rank = tdist_pg_rank(pg), world = tdist_pg_size(pg);
  for (int round = 0; round < 6; round++) {
    if (rank == round % world) usleep(30000);
    atomic_fetch_add(&cfg->arrivals[round], 1);
    OK(pg, tdist_barrier(pg));
    int seen = atomic_load(&cfg->arrivals[round]);
    if (seen != world) {
      fprintf(stderr, "barrier round %d (world %d): rank %d left after only %d arrivals\n", round,
              world, rank, seen);
      exit(1);
    }
  }
}

/* Every ordered pair exchanges three messages with distinct tags and sizes, in order. */
static void run_send_recv(tdist_pg_t *pg, uint8_t *sbuf, uint8_t *rbuf) {
  int rank = tdist_pg_rank(pg), world = tdist_pg_size(pg);
  if (world > 1) { /* argument errors are reported and do not break the group */
    CHECK_EQ_INT(tdist_send(pg, sbuf, 1, TDIST_INT8, (rank + 1) % world, -1),
                 TDIST_ERR_INVALID_ARGUMENT);
    CHECK_EQ_INT(tdist_recv(pg, rbuf, 1, TDIST_INT8, rank, 0), TDIST_ERR_INVALID_ARGUMENT);
    CHECK_EQ_INT(tdist_send(pg, sbuf, 1, TDIST_INT8, world, 0), TDIST_ERR_INVALID_ARGUMENT);
  }
  static const size_t sizes[] = {37, 0, LARGE};
  for (int a = 0; a < world; a++) {
    for (int b = 0; b < world; b++) {
      if (a == b || (rank != a && rank != b)) continue;
      uint64_t seed = case_seed(10, world, 0, 0, 0, a * 64 + b);
      for (int m = 0; m < 3; m++) {
        size_t n = sizes[m];
        tdist_dtype_t dt = k_dtypes[(size_t)(a + b + m) % NDT];
        size_t bytes = n * tdist_dtype_size(dt);
        int tag = a * 1000 + b * 10 + m;
        if (rank == a) {
          fill_bytes(sbuf, bytes, seed, (uint64_t)m);
          OK(pg, tdist_send(pg, n ? sbuf : NULL, n, dt, b, tag));
        } else {
          memset(rbuf, 0xA5, bytes);
          set_guard(rbuf, bytes);
          OK(pg, tdist_recv(pg, n ? rbuf : NULL, n, dt, a, tag));
          check_bytes("send/recv", world, rbuf, bytes, seed, (uint64_t)m);
          check_guard("send/recv", rbuf, bytes);
        }
      }
    }
  }
}

static int other_body(int rank, int world, int port, void *arg) {
  const cfg_t *cfg = arg;
  if (!cfg->mpi_pg) logcap_begin("sweep");
  tdist_store_t *store;
  tdist_pg_t *pg = body_pg(cfg, &rank, &world, port, &store);
  size_t cap = (size_t)world * 8 * LARGE + 4096; /* the largest buffer any case below needs */
  uint8_t *in = xmalloc(cap + GUARD), *out = xmalloc(cap + GUARD);
  run_broadcast(pg, out);
  run_reduce(pg, cfg, out);
  run_reduce_scatter(pg, cfg);
  run_all_gather(pg, in, out);
  run_all_gather_v(pg, in, out, 0);
  run_all_gather_v(pg, in, out, 1);
  run_gather_scatter(pg, in, out);
  run_all_to_all(pg, in, out);
  run_all_to_all_v(pg, in, out);
  run_barrier(pg, cfg);
  run_send_recv(pg, in, out);
  OK(pg, tdist_barrier(pg));
  body_done(cfg, pg, store);
  free(in);
  free(out);
  if (cfg->mpi_pg) return 0;
  char *log = logcap_end();
  logcap_expect_transport(log, rank, world, cfg->shm, 1);
  free(log);
  return 0;
}

/* ---------------------------------------------------------------------------------------- */

/* --mpi ARRIVALS: this process is one rank of an mpirun job (see the header). */
static int mpi_main(const char *arrivals_path) {
  int fd = open(arrivals_path, O_RDWR);
  CHECK(fd >= 0);
  _Atomic int *arrivals = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  CHECK(arrivals != MAP_FAILED);
  close(fd);
  tdist_pg_options_t o = TDIST_PG_OPTIONS_INIT;
  o.backend = "mpi";
  o.timeout_ms = TIMEOUT_MS;
  cfg_t cfg = {.arrivals = arrivals};
  tdist_status_t st = tdist_init_process_group(&o, &cfg.mpi_pg);
  if (st) {
    fprintf(stderr, "init_process_group(mpi): %s: %s\n", tdist_status_name(st), tdist_last_error());
    return 1;
  }
  int rank = tdist_pg_rank(cfg.mpi_pg), world = tdist_pg_size(cfg.mpi_pg);
  cfg.full = world == 2 || world == 3 || world == 5;
  double t0 = now_s();
  int rc = all_reduce_body(rank, world, 0, &cfg);
  if (rank == 0)
    TEST_LOG("mpi world %d all_reduce: %s in %.1f s", world, rc ? "FAILED" : "ok", now_s() - t0);
  cfg.async = 1;
  t0 = now_s();
  rc |= all_reduce_body(rank, world, 0, &cfg);
  if (rank == 0)
    TEST_LOG("mpi world %d all_reduce async: %s in %.1f s", world, rc ? "FAILED" : "ok",
             now_s() - t0);
  t0 = now_s();
  rc |= other_body(rank, world, 0, &cfg);
  if (rank == 0)
    TEST_LOG("mpi world %d other collectives: %s in %.1f s", world, rc ? "FAILED" : "ok",
             now_s() - t0);
  CHECK(!strcmp(tdist_pg_backend(cfg.mpi_pg), "mpi"));
  tdist_pg_destroy(cfg.mpi_pg);
  munmap((void *)arrivals, 4096);
  return rc;
}

int main(int argc, char **argv) {
  if (argc == 3 && !strcmp(argv[1], "--mpi")) return mpi_main(argv[2]);
  logcap_enable_debug();
  /* Jobs in an order that spreads the heavy (large world) ones over the shards. */
  static const struct {
    int world;
    int phase; /* 0 all_reduce ring, 1 all_reduce rd, 2 the other collectives, 3 direct */
  } jobs[] = {
      {8, 0}, {8, 1}, {8, 2}, {8, 3}, {5, 0}, {5, 1}, {5, 2}, {5, 3},
      {4, 0}, {4, 1}, {4, 2}, {4, 3}, {3, 0}, {3, 1}, {3, 2}, {3, 3},
      {2, 0}, {2, 1}, {2, 2}, {2, 3}, {1, 0}, {1, 1}, {1, 2},
  };
  const int njobs = (int)(sizeof jobs / sizeof jobs[0]);
  test_shard_t sh = test_shard_init("collectives_sweep_test");
  _Atomic int *arrivals =
      mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  CHECK(arrivals != MAP_FAILED);
  /* Every job twice: with the default transports (same-host peers use shared memory) and
   * with TDIST_SHM=0 (TCP only); the children inherit the variable. */
  int failed = 0;
  for (int j = 0; j < 2 * njobs; j++) {
    if (!test_shard_take(&sh)) continue;
    int w = jobs[j % njobs].world, ph = jobs[j % njobs].phase, tcp = j >= njobs;
    cfg_t cfg = {.algo = ph == 0   ? "ring"
                         : ph == 1 ? "rd"
                         : ph == 3 ? "direct"
                                   : NULL,
                 .full = w == 2 || w == 3 || w == 5,
                 .arrivals = arrivals,
                 .shm = !tcp};
    if (tcp)
      setenv("TDIST_SHM", "0", 1);
    else
      unsetenv("TDIST_SHM");
    memset((void *)arrivals, 0, 4096);
    double t0 = now_s();
    int rc = tdist_test_run_ranks(w, RUN_TIMEOUT_MS, ph == 2 ? other_body : all_reduce_body, &cfg);
    TEST_LOG("world %d %s%s%s: %s in %.1f s", w, ph == 2 ? "other collectives" : "all_reduce ",
             ph == 2 ? "" : cfg.algo, tcp ? " (TCP only)" : "", rc ? "FAILED" : "ok", now_s() - t0);
    failed |= rc;
  }
  CHECK(!failed);
  munmap((void *)arrivals, 4096);
  TEST_LOG("ok");
  return 0;
}
