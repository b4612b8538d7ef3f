/* See bench_common.h. Plain C11 + POSIX clocks: compiled by Bazel into coll_bench and by mpicc
 * into the Open MPI peer, so it must not include anything from tdist. */
#define _POSIX_C_SOURCE 200809L
#include "bench_common.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

const char *const bench_coll_names[COLL_COUNT] = {"all_reduce", "all_gather", "reduce_scatter",
                                                  "broadcast", "all_to_all"};

/* Outputs start as this value so an element the collective never wrote counts as wrong; no sum
 * of pattern values can equal it. */
#define SENTINEL 1.0e9f

int bench_coll_parse(const char *name) {
  for (int i = 0; i < COLL_COUNT; i++)
    if (strcmp(name, bench_coll_names[i]) == 0) return i;
  return -1;
}

/* Splits a comma list of non-negative integers (K/M/G suffixes allowed). Returns the count or -1.
 */
static int parse_list(const char *s, size_t *out, int cap) {
  int n = 0;
  while (s && *s) {
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (end == s) return -1;
    if (*end == 'K' || *end == 'k')
      v <<= 10, end++;
    else if (*end == 'M' || *end == 'm')
      v <<= 20, end++;
    else if (*end == 'G' || *end == 'g')
      v <<= 30, end++;
    if (n == cap || (*end && *end != ',')) return -1;
    out[n++] = (size_t)v;
    s = *end ? end + 1 : end;
  }
  return n;
}

int bench_plan_parse(bench_plan_t *p, const char *colls, const char *sizes, const char *iters,
                     const char *warmup) {
  memset(p, 0, sizeof *p);
  char buf[256];
  snprintf(buf, sizeof buf, "%s", colls ? colls : "");
  for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    int c = bench_coll_parse(tok);
    if (c < 0 || p->ncolls == COLL_COUNT) {
      fprintf(stderr,
              "unknown collective '%s' (all_reduce, all_gather, reduce_scatter, "
              "broadcast, all_to_all)\n",
              tok);
      return -1;
    }
    p->colls[p->ncolls++] = c;
  }
  size_t it[BENCH_MAX_SIZES], wu[BENCH_MAX_SIZES];
  int ns = parse_list(sizes, p->sizes, BENCH_MAX_SIZES);
  int ni = parse_list(iters, it, BENCH_MAX_SIZES);
  int nw = parse_list(warmup, wu, BENCH_MAX_SIZES);
  if (ns <= 0 || ni != ns || nw != ns || p->ncolls == 0) {
    fprintf(stderr,
            "bad plan: need --colls, and --sizes, --iters, --warmup lists of the same "
            "length\n");
    return -1;
  }
  for (int i = 0; i < ns; i++) {
    if (it[i] < 1 || it[i] > 100000 || wu[i] > 100000) {
      fprintf(stderr, "bad plan: iterations must be 1..100000\n");
      return -1;
    }
    p->iters[i] = (int)it[i];
    p->warmup[i] = (int)wu[i];
  }
  p->nsizes = ns;
  return 0;
}

size_t bench_total_count(bench_coll_t c, size_t bytes, int n) {
  size_t t = bytes / sizeof(float);
  if (c == COLL_ALL_REDUCE || c == COLL_BROADCAST) return t ? t : 1;
  t -= t % (size_t)n;
  return t ? t : (size_t)n;
}

double bench_busbw_factor(bench_coll_t c, int n) {
  switch (c) {
    case COLL_ALL_REDUCE: return 2.0 * (n - 1) / n;
    case COLL_BROADCAST: return 1.0;
    default: return (double)(n - 1) / n;
  }
}

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int cmp_i64(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return (x > y) - (x < y);
}

/* Elements of the input and output buffers a collective needs for `total` elements. */
static void buf_counts(bench_coll_t c, size_t total, int n, size_t *in, size_t *out) {
  size_t blk = total / (size_t)n;
  switch (c) {
    case COLL_ALL_REDUCE:
    case COLL_BROADCAST: *in = 0, *out = total; break;
    case COLL_ALL_GATHER: *in = blk, *out = total; break;
    case COLL_REDUCE_SCATTER: *in = total, *out = blk; break;
    default: *in = total, *out = total;
  }
}

static void fill(bench_coll_t c, int rank, size_t total, int n, float *in, float *out) {
  size_t nin, nout;
  buf_counts(c, total, n, &nin, &nout);
  if (c == COLL_ALL_REDUCE || c == COLL_BROADCAST) {
    uint64_t salt = c == COLL_ALL_REDUCE ? 1 : 2;
    for (size_t i = 0; i < nout; i++) out[i] = bench_val(salt, (uint64_t)rank, i);
    return;
  }
  uint64_t salt = c == COLL_ALL_GATHER ? 3 : c == COLL_REDUCE_SCATTER ? 4 : 5;
  for (size_t i = 0; i < nin; i++) in[i] = bench_val(salt, (uint64_t)rank, i);
  for (size_t i = 0; i < nout; i++) out[i] = SENTINEL;
}

static long long check(bench_coll_t c, int rank, size_t total, int n, const float *out) {
  size_t blk = total / (size_t)n;
  long long wrong = 0;
  switch (c) {
    case COLL_ALL_REDUCE:
      for (size_t i = 0; i < total; i++) {
        float want = 0;
        for (int k = 0; k < n; k++) want += bench_val(1, (uint64_t)k, i);
        wrong += out[i] != want;
      }
      break;
    case COLL_BROADCAST:
      for (size_t i = 0; i < total; i++) wrong += out[i] != bench_val(2, 0, i);
      break;
    case COLL_ALL_GATHER:
      for (int j = 0; j < n; j++)
        for (size_t i = 0; i < blk; i++)
          wrong += out[(size_t)j * blk + i] != bench_val(3, (uint64_t)j, i);
      break;
    case COLL_REDUCE_SCATTER:
      for (size_t i = 0; i < blk; i++) {
        float want = 0;
        for (int k = 0; k < n; k++) want += bench_val(4, (uint64_t)k, (size_t)rank * blk + i);
        wrong += out[i] != want;
      }
      break;
    default: /* all_to_all: block j of my output is block `rank` of rank j's input */
      for (int j = 0; j < n; j++)
        for (size_t i = 0; i < blk; i++)
          wrong += out[(size_t)j * blk + i] != bench_val(5, (uint64_t)j, (size_t)rank * blk + i);
  }
  return wrong;
}

/* Processes that just started run slower for a while (the scheduler spreads them over the
 * cores, caches and page tables warm up): every implementation first runs one-float all_reduces
 * until rank 0 has spent WARMUP_NS in them. Rank 0 contributes 1 while time is left and the
 * others 0, so every rank sees the same sum and stops after the same call. */
#define WARMUP_NS 300000000LL

static int warm_up(int rank, bench_run_fn run, void *ctx, float *buf) {
  int64_t t0 = now_ns();
  for (int i = 0; i < 1000000; i++) {
    buf[0] = rank == 0 && now_ns() - t0 < WARMUP_NS ? 1.0f : 0.0f;
    if (run(ctx, COLL_ALL_REDUCE, buf, NULL, 1)) return 1;
    if (buf[0] == 0.0f) break;
  }
  return 0;
}

int bench_sweep(const bench_plan_t *p, int n, int rank, bench_run_fn run, void *ctx, FILE *tsv,
                const char *impl) {
  size_t max_in = 1, max_out = 1;
  int max_iters = 1;
  for (int ci = 0; ci < p->ncolls; ci++)
    for (int si = 0; si < p->nsizes; si++) {
      size_t in, out;
      buf_counts((bench_coll_t)p->colls[ci], bench_total_count(p->colls[ci], p->sizes[si], n), n,
                 &in, &out);
      if (in > max_in) max_in = in;
      if (out > max_out) max_out = out;
      if (p->iters[si] > max_iters) max_iters = p->iters[si];
    }
  float *in = aligned_alloc(64, (max_in * sizeof(float) + 63) / 64 * 64);
  float *out = aligned_alloc(64, (max_out * sizeof(float) + 63) / 64 * 64);
  int64_t *t = malloc(sizeof *t * (size_t)max_iters);
  if (!in || !out || !t) {
    fprintf(stderr, "rank %d: out of memory for %zu + %zu floats\n", rank, max_in, max_out);
    return 1;
  }
  int rc = warm_up(rank, run, ctx, out);
  for (int ci = 0; ci < p->ncolls && !rc; ci++) {
    bench_coll_t c = (bench_coll_t)p->colls[ci];
    for (int si = 0; si < p->nsizes && !rc; si++) {
      size_t total = bench_total_count(c, p->sizes[si], n);
      size_t cnt = c == COLL_ALL_REDUCE || c == COLL_BROADCAST ? total : total / (size_t)n;
      size_t nin, nout;
      buf_counts(c, total, n, &nin, &nout);
      fill(c, rank, total, n, in, out);
      if (c == COLL_ALL_REDUCE) memset(out, 0, nout * sizeof(float));
      for (int w = 0; w < p->warmup[si] && !rc; w++) rc = run(ctx, c, out, in, cnt);
      if (rc) break;
      fill(c, rank, total, n, in, out);
      if ((rc = run(ctx, c, out, in, cnt))) break;
      long long wrong = check(c, rank, total, n, out);
      if (c == COLL_ALL_REDUCE) memset(out, 0, nout * sizeof(float));
      for (int it = 0; it < p->iters[si] && !rc; it++) {
        int64_t t0 = now_ns();
        rc = run(ctx, c, out, in, cnt);
        t[it] = now_ns() - t0;
      }
      if (rc) break;
      qsort(t, (size_t)p->iters[si], sizeof *t, cmp_i64);
      int k = p->iters[si];
      int64_t med = k % 2 ? t[k / 2] : (t[k / 2 - 1] + t[k / 2]) / 2;
      fprintf(tsv, "%s\t%d\t%d\t%s\t%zu\t%zu\t%lld\t%lld\t%lld\t%d\n", impl, n, rank,
              bench_coll_names[c], total * sizeof(float), total, (long long)med, (long long)t[0],
              wrong, k);
      fflush(tsv);
    }
  }
  free(in);
  free(out);
  free(t);
  return rc;
}
