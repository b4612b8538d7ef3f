/* GPU check of the nccl backend on a machine with one (or more) GPUs; run by tests/gpu/run.sh.
 *
 *   1. correctness, world size 1: every collective x dtype x NCCL op (SUM PRODUCT MIN MAX AVG) x
 *      count {0, 1, 1001, 1 Mi + 3} on device buffers with random data, blocking and async,
 *      compared bit for bit with a CPU reference (with one rank every reduction is the input;
 *      the copies of gather/scatter/all_to_all(_v)/all_gather_v move real data); the refusals
 *      (BAND, monitored_barrier, host memory) return their status without failing the group;
 *   2. all_reduce timing, 8 B ... 1 GiB (float32, in place), tdist_all_reduce against a plain
 *      loop of ncclAllReduce + cudaStreamSynchronize on a communicator of the same NCCL, same
 *      device, same buffer, in alternating rounds; median of 5 rounds. SUM with one rank
 *      launches no kernel (NCCL skips it), so that column is pure call overhead; AVG runs a
 *      kernel over the data, so it is the column the goal (<= 2% at >= 64 MiB) is read from;
 *   3. failure: world size 2 with rank 1 absent: init must return TDIST_ERR_TIMEOUT after the
 *      group timeout (non-blocking init + ncclCommAbort on the real library).
 * Prints a table; exits 1 when a correctness or failure check fails (timings never fail it).
 * Options: --max-bytes N (default 1 GiB), --budget-ms N per timing (default 100), --big-count N
 * (largest count of the correctness sweep, default 1 Mi + 3), --no-bench, --no-fault. The device
 * is TDIST_NCCL_DEVICE (default 0). //tests/gpu:nccl_gpu_test_on_fake runs this program against
 * the fake CUDA/NCCL of //tests/nccl on CPU machines, so the script's logic is exercised there. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "runtime/nccl/loader.h"
#include "runtime/pg/reduce.h"
#include "tdist/tdist.h"
#include "tests/testlib/clock.h"
#include "tests/testlib/dtype.h"
#include "tests/testlib/rng.h"

static tdist__nccl_lib_t L;
static cudaError_t (*p_memcpy)(void *, const void *, size_t, enum cudaMemcpyKind);
static cudaError_t (*p_sync)(cudaStream_t);
static ncclResult_t (*p_init_rank)(ncclComm_t *, int, ncclUniqueId, int);
static int g_failures, g_checks;

#define DIE(...) (fprintf(stderr, "nccl_gpu_test: " __VA_ARGS__), fputc('\n', stderr), exit(2))
#define CU(x)                                                           \
  do {                                                                  \
    cudaError_t e_ = (x);                                               \
    if (e_ != cudaSuccess) DIE("%s: %s", #x, L.cudaGetErrorString(e_)); \
  } while (0)
#define NC(x)                                                                     \
  do {                                                                            \
    ncclResult_t r_ = (x);                                                        \
    if (r_ != ncclSuccess)                                                        \
      DIE("%s: %s (%s)", #x, L.ncclGetErrorString(r_), L.ncclGetLastError(NULL)); \
  } while (0)

static void expect(int ok, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void expect(int ok, const char *fmt, ...) {
  g_checks++;
  if (ok) return;
  g_failures++;
  va_list ap;
  va_start(ap, fmt);
  fputs("FAIL: ", stdout);
  vprintf(fmt, ap);
  fputc('\n', stdout);
  va_end(ap);
}

static void *dmalloc(size_t n) {
  void *p = NULL;
  CU(L.cudaMalloc(&p, n ? n : 1));
  return p;
}
static void h2d(void *d, const void *h, size_t n) {
  if (n) CU(p_memcpy(d, h, n, cudaMemcpyDefault));
}
static void d2h(void *h, const void *d, size_t n) {
  if (n) CU(p_memcpy(h, d, n, cudaMemcpyDefault));
}

/* Random finite values of the dtype. */
static void fill(void *b, tdist_dtype_t t, size_t n) {
  uint8_t *p = b;
  for (size_t i = 0; i < n; i++) {
    uint64_t r = rnd();
    float f = (float)((double)(r >> 11) / (double)(1ull << 53) * 8.0 - 4.0);
    if (test_put_float(p, t, i, t == TDIST_FLOAT64 ? f * 1.000000123 : f) != 0)
      memcpy(p + tdist_dtype_size(t) * i, &r, tdist_dtype_size(t));
  }
}

static tdist_pg_t *init_pg(tdist_store_t *store, int world, int64_t tmo, tdist_status_t *st) {
  tdist_pg_options_t o = TDIST_PG_OPTIONS_INIT;
  o.backend = "nccl";
  o.store = store;
  o.rank = 0;
  o.world_size = world;
  o.timeout_ms = tmo;
  tdist_pg_t *pg = NULL;
  *st = tdist_init_process_group(&o, &pg);
  return pg;
}

#define TOK(pg, x, ...)                                                                    \
  do {                                                                                     \
    tdist_status_t s_ = (x);                                                               \
    if (s_) {                                                                              \
      expect(0, "%s returned %s: %s", #x, tdist_status_name(s_), tdist_pg_last_error(pg)); \
      return;                                                                              \
    }                                                                                      \
  } while (0)

/* One dtype/op/count: all_reduce, reduce, reduce_scatter (blocking and async). */
static void check_reductions(tdist_pg_t *pg, tdist_dtype_t t, tdist_reduce_op_t op, size_t n) {
  size_t bytes = n * tdist_dtype_size(t);
  char *h = malloc(bytes + 1), *got = malloc(bytes + 1);
  char *d = dmalloc(bytes), *o = dmalloc(bytes);
  fill(h, t, n);
  const char *dn = tdist_dtype_name(t), *on = tdist_reduce_op_name(op);
  h2d(d, h, bytes);
  TOK(pg, tdist_all_reduce(pg, d, n, t, op));
  d2h(got, d, bytes);
  expect(!bytes || !memcmp(got, h, bytes), "all_reduce %s %s count %zu", dn, on, n);
  TOK(pg, tdist_reduce(pg, d, n, t, op, 0));
  d2h(got, d, bytes);
  expect(!bytes || !memcmp(got, h, bytes), "reduce %s %s count %zu", dn, on, n);
  TOK(pg, tdist_reduce_scatter(pg, o, d, n, t, op));
  d2h(got, o, bytes);
  expect(!bytes || !memcmp(got, h, bytes), "reduce_scatter %s %s count %zu", dn, on, n);
  tdist_work_t *w = NULL;
  TOK(pg, tdist_all_reduce_async(pg, d, n, t, op, &w));
  TOK(pg, tdist_work_wait(w, -1));
  tdist_work_destroy(w);
  d2h(got, d, bytes);
  expect(!bytes || !memcmp(got, h, bytes), "all_reduce_async %s %s count %zu", dn, on, n);
  L.cudaFree(d);
  L.cudaFree(o);
  free(h);
  free(got);
}

/* Data movement with offsets, so a wrong displacement shows. */
static void check_moves(tdist_pg_t *pg, tdist_dtype_t t, size_t n) {
  size_t es = tdist_dtype_size(t), bytes = n * es, pad = 5;
  char *h = malloc(bytes + 1), *got = malloc((n + pad) * es + 1);
  char *d = dmalloc(bytes), *o = dmalloc((n + pad) * es);
  const char *dn = tdist_dtype_name(t);
  fill(h, t, n);
  h2d(d, h, bytes);
  TOK(pg, tdist_broadcast(pg, d, n, t, 0));
  d2h(got, d, bytes);
  expect(!bytes || !memcmp(got, h, bytes), "broadcast %s count %zu", dn, n);
  TOK(pg, tdist_all_gather(pg, o, d, n, t));
  d2h(got, o, bytes);
  expect(!bytes || !memcmp(got, h, bytes), "all_gather %s count %zu", dn, n);
  size_t cnt = n, dsp = pad; /* uneven layout: the grouped-broadcast path */
  TOK(pg, tdist_all_gather_v(pg, o, &cnt, &dsp, d, t));
  d2h(got, o, (n + pad) * es);
  expect(!bytes || !memcmp(got + pad * es, h, bytes), "all_gather_v %s count %zu", dn, n);
  TOK(pg, tdist_gather(pg, o, d, n, t, 0));
  d2h(got, o, bytes);
  expect(!bytes || !memcmp(got, h, bytes), "gather %s count %zu", dn, n);
  TOK(pg, tdist_scatter(pg, o, d, n, t, 0));
  d2h(got, o, bytes);
  expect(!bytes || !memcmp(got, h, bytes), "scatter %s count %zu", dn, n);
  TOK(pg, tdist_all_to_all(pg, o, d, n, t));
  d2h(got, o, bytes);
  expect(!bytes || !memcmp(got, h, bytes), "all_to_all %s count %zu", dn, n);
  size_t ic = n, id = 0, oc = n, od = pad;
  TOK(pg, tdist_all_to_all_v(pg, o, &oc, &od, d, &ic, &id, t));
  d2h(got, o, (n + pad) * es);
  expect(!bytes || !memcmp(got + pad * es, h, bytes), "all_to_all_v %s count %zu", dn, n);
  L.cudaFree(d);
  L.cudaFree(o);
  free(h);
  free(got);
}

static void check_refusals(tdist_pg_t *pg) {
  int32_t *d = dmalloc(64), host[4] = {1, 2, 3, 4};
  expect(tdist_all_reduce(pg, d, 4, TDIST_INT32, TDIST_BAND) == TDIST_ERR_NOT_AVAILABLE,
         "BAND is refused");
  expect(tdist_monitored_barrier(pg, 1000) == TDIST_ERR_NOT_AVAILABLE,
         "monitored_barrier is refused");
  expect(tdist_all_reduce(pg, host, 4, TDIST_INT32, TDIST_SUM) == TDIST_ERR_INVALID_ARGUMENT &&
             strstr(tdist_last_error(), "host memory"),
         "host memory is refused: %s", tdist_last_error());
  expect(tdist_barrier(pg) == TDIST_OK, "barrier after the refusals: %s", tdist_pg_last_error(pg));
  L.cudaFree(d);
}

static size_t g_big_count = (1u << 20) + 3;

static void correctness(tdist_store_t *store) {
  tdist_status_t st;
  tdist_pg_t *pg = init_pg(store, 1, 60000, &st);
  if (st)
    DIE("init_process_group(nccl, world 1): %s: %s", tdist_status_name(st), tdist_last_error());
  static const tdist_reduce_op_t ops[] = {TDIST_SUM, TDIST_PROD, TDIST_MIN, TDIST_MAX, TDIST_AVG};
  const size_t counts[] = {0, 1, 1001, g_big_count};
  double t0 = now_s();
  printf("%-10s %8s %8s\n", "dtype", "checks", "failed");
  for (int t = 0; t < TDIST_DTYPE_COUNT_; t++) {
    int c0 = g_checks, f0 = g_failures;
    for (size_t ci = 0; ci < sizeof counts / sizeof *counts; ci++) {
      for (size_t k = 0; k < sizeof ops / sizeof *ops; k++)
        check_reductions(pg, (tdist_dtype_t)t, ops[k], counts[ci]);
      check_moves(pg, (tdist_dtype_t)t, counts[ci]);
    }
    printf("%-10s %8d %8d\n", tdist_dtype_name((tdist_dtype_t)t), g_checks - c0, g_failures - f0);
  }
  check_refusals(pg);
  expect(tdist_pg_finalize(pg) == TDIST_OK, "finalize: %s", tdist_pg_last_error(pg));
  tdist_pg_destroy(pg);
  printf("correctness: %d checks, %d failed (%.1f s)\n\n", g_checks, g_failures, now_s() - t0);
}

/* ---- timing ---- */

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

typedef struct {
  tdist_pg_t *pg;
  ncclComm_t comm;
  cudaStream_t s;
  cudaEvent_t ev;
  float *buf;
} bench_t;

/* Seconds per call of `iters` calls. */
static double run_plain(bench_t *b, size_t n, ncclRedOp_t op, int iters) {
  double t0 = now_s();
  for (int i = 0; i < iters; i++) {
    NC(L.ncclAllReduce(b->buf, b->buf, n, ncclFloat32, op, b->comm, b->s));
    CU(p_sync(b->s));
  }
  return (now_s() - t0) / iters;
}

/* The plain loop, waiting the way tdist does (event recorded after the call, polled): the
 * difference to run_plain is the cost of the waiting scheme, the rest is tdist's own. */
static double run_plain_ev(bench_t *b, size_t n, ncclRedOp_t op, int iters) {
  double t0 = now_s();
  for (int i = 0; i < iters; i++) {
    NC(L.ncclAllReduce(b->buf, b->buf, n, ncclFloat32, op, b->comm, b->s));
    CU(L.cudaEventRecord(b->ev, b->s));
    cudaError_t e;
    while ((e = L.cudaEventQuery(b->ev)) == cudaErrorNotReady) {
    }
    CU(e);
  }
  return (now_s() - t0) / iters;
}

static double run_tdist(bench_t *b, size_t n, tdist_reduce_op_t op, int iters) {
  double t0 = now_s();
  for (int i = 0; i < iters; i++) {
    tdist_status_t st = tdist_all_reduce(b->pg, b->buf, n, TDIST_FLOAT32, op);
    if (st) DIE("tdist_all_reduce: %s", tdist_pg_last_error(b->pg));
  }
  return (now_s() - t0) / iters;
}

/* Medians over 5 alternating rounds of (plain, plain + event polling, tdist); iterations sized
 * to budget_s per round and variant. */
static void measure(bench_t *b, size_t n, ncclRedOp_t nop, tdist_reduce_op_t top, double budget_s,
                    double *plain, double *plain_ev, double *ours) {
  run_plain(b, n, nop, 3);
  run_plain_ev(b, n, nop, 3);
  run_tdist(b, n, top, 3);
  double probe = run_plain(b, n, nop, 3);
  int iters = (int)(budget_s / 5 / (probe > 1e-7 ? probe : 1e-7));
  if (iters < 3) iters = 3;
  if (iters > 20000) iters = 20000;
  double a[5], e[5], c[5];
  for (int r = 0; r < 5; r++) {
    a[r] = run_plain(b, n, nop, iters);
    e[r] = run_plain_ev(b, n, nop, iters);
    c[r] = run_tdist(b, n, top, iters);
  }
  qsort(a, 5, sizeof *a, cmp_d);
  qsort(e, 5, sizeof *e, cmp_d);
  qsort(c, 5, sizeof *c, cmp_d);
  *plain = a[2];
  *plain_ev = e[2];
  *ours = c[2];
}

static void fmt_size(size_t b, char *s, size_t cap) {
  if (b >= (1u << 30))
    snprintf(s, cap, "%zu GiB", b >> 30);
  else if (b >= (1u << 20))
    snprintf(s, cap, "%zu MiB", b >> 20);
  else if (b >= 1024)
    snprintf(s, cap, "%zu KiB", b >> 10);
  else
    snprintf(s, cap, "%zu B", b);
}

static void bench(tdist_store_t *store, size_t max_bytes, double budget_s) {
  tdist_status_t st;
  bench_t b = {0};
  b.pg = init_pg(store, 1, 600000, &st);
  if (st) DIE("init_process_group: %s", tdist_last_error());
  ncclUniqueId id;
  NC(L.ncclGetUniqueId(&id));
  NC(p_init_rank(&b.comm, 1, id, 0));
  CU(L.cudaStreamCreateWithFlags(&b.s, cudaStreamDefault)); /* as tdist's stream */
  CU(L.cudaEventCreateWithFlags(&b.ev, cudaEventDisableTiming));
  b.buf = dmalloc(max_bytes);
  CU(p_sync(NULL));
  printf(
      "all_reduce, float32, in place, world size 1: microseconds per call (median of 5 "
      "rounds).\n\"nccl\": ncclAllReduce + cudaStreamSynchronize; \"+ev\": ncclAllReduce + "
      "cudaEventRecord + cudaEventQuery polling (tdist's way of waiting); overhead: tdist vs "
      "nccl.\nSUM launches no kernel with one rank (pure call cost); AVG runs one over the "
      "data: the goal is read there.\n");
  printf("%9s | %9s %9s %9s %8s | %9s %9s %9s %8s %8s\n", "bytes", "nccl SUM", "+ev SUM",
         "tdist SUM", "overhead", "nccl AVG", "+ev AVG", "tdist AVG", "overhead", "GB/s");
  int goal_rows = 0, goal_ok = 0;
  for (size_t bytes = 8; bytes <= max_bytes; bytes *= 2) {
    size_t n = bytes / 4;
    double ps, es, ts, pa, ea, ta;
    measure(&b, n, ncclSum, TDIST_SUM, budget_s, &ps, &es, &ts);
    measure(&b, n, ncclAvg, TDIST_AVG, budget_s, &pa, &ea, &ta);
    char sz[32];
    fmt_size(bytes, sz, sizeof sz);
    double os = (ts - ps) / ps * 100, oa = (ta - pa) / pa * 100;
    int big = bytes >= (64u << 20);
    printf("%9s | %9.2f %9.2f %9.2f %7.1f%% | %9.2f %9.2f %9.2f %7.1f%% %8.1f%s\n", sz, ps * 1e6,
           es * 1e6, ts * 1e6, os, pa * 1e6, ea * 1e6, ta * 1e6, oa, 2.0 * bytes / ta / 1e9,
           big ? (oa <= 2.0 ? "  goal met" : "  GOAL MISSED") : "");
    goal_rows += big;
    goal_ok += big && oa <= 2.0;
  }
  printf("goal (tdist AVG within 2%% of plain NCCL at >= 64 MiB): %d of %d sizes\n\n", goal_ok,
         goal_rows);
  L.cudaFree(b.buf);
  L.cudaEventDestroy(b.ev);
  L.ncclCommDestroy(b.comm);
  L.cudaStreamDestroy(b.s);
  tdist_pg_destroy(b.pg);
}

static void on_alarm(int sig) {
  (void)sig;
  static const char m[] = "FAIL: the init-timeout check hung (ncclCommAbort during init?)\n";
  ssize_t w = write(1, m, sizeof m - 1);
  (void)w;
  _exit(1);
}

static void fault(void) {
  tdist_store_t *store = NULL;
  if (tdist_memory_store_create(&store)) DIE("memory store: %s", tdist_last_error());
  signal(SIGALRM, on_alarm);
  alarm(60);
  double t0 = now_s();
  tdist_status_t st;
  tdist_pg_t *pg = init_pg(store, 2, 5000, &st);
  double took = now_s() - t0;
  alarm(0);
  printf("world size 2, rank 1 absent: init returned %s after %.1f s: %s\n", tdist_status_name(st),
         took, st ? tdist_last_error() : "");
  expect(st == TDIST_ERR_TIMEOUT && took >= 4.9 && took < 20,
         "init with an absent rank: want TDIST_ERR_TIMEOUT after ~5 s");
  tdist_pg_destroy(pg);
  tdist_store_destroy(store);
}

int main(int argc, char **argv) {
  test_rng_init("nccl_gpu_test", 0x9E3779B97F4A7C15ull);
  size_t max_bytes = (size_t)1 << 30;
  double budget_s = 0.1;
  int do_bench = 1, do_fault = 1;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--max-bytes") && i + 1 < argc)
      max_bytes = strtoull(argv[++i], NULL, 0);
    else if (!strcmp(argv[i], "--budget-ms") && i + 1 < argc)
      budget_s = atof(argv[++i]) / 1e3;
    else if (!strcmp(argv[i], "--big-count") && i + 1 < argc)
      g_big_count = strtoull(argv[++i], NULL, 0);
    else if (!strcmp(argv[i], "--no-bench"))
      do_bench = 0;
    else if (!strcmp(argv[i], "--no-fault"))
      do_fault = 0;
    else
      DIE("usage: %s [--max-bytes N] [--budget-ms N] [--big-count N] [--no-bench] "
          "[--no-fault]",
          argv[0]);
  }
  setvbuf(stdout, NULL, _IOLBF, 0);
  char err[512];
  if (tdist__nccl_lib_open(&L, err, sizeof err)) DIE("%s", err);
  p_memcpy = (__typeof__(p_memcpy))dlsym(L.cudart_handle, "cudaMemcpy");
  p_sync = (__typeof__(p_sync))dlsym(L.cudart_handle, "cudaStreamSynchronize");
  p_init_rank = (__typeof__(p_init_rank))dlsym(L.nccl_handle, "ncclCommInitRank");
  if (!p_memcpy || !p_sync || !p_init_rank)
    DIE("missing cudaMemcpy/cudaStreamSynchronize/ncclCommInitRank");
  const char *dv = getenv("TDIST_NCCL_DEVICE");
  int dev = dv && *dv ? atoi(dv) : 0, ndev = 0, drv = 0, rt = 0;
  cudaError_t ce = L.cudaGetDeviceCount(&ndev);
  if (ce != cudaSuccess || ndev == 0)
    DIE("no usable GPU here: cudaGetDeviceCount: %s (%d devices; CUDA runtime %s); this check "
        "needs a machine with an NVIDIA GPU and its driver",
        ce ? L.cudaGetErrorString(ce) : "no error", ndev, L.cudart_path);
  if (dev < 0 || dev >= ndev) DIE("TDIST_NCCL_DEVICE=%d but there are %d devices", dev, ndev);
  L.cudaDriverGetVersion(&drv);
  L.cudaRuntimeGetVersion(&rt);
  char ver[32];
  tdist__nccl_version_str(L.nccl_version, ver, sizeof ver);
  printf("tdist %s | NCCL %s (%s) | CUDA runtime %d, driver %d | %d device(s), using %d\n\n",
         tdist_version(), ver, L.nccl_path, rt, drv, ndev, dev);
  char ds[16];
  snprintf(ds, sizeof ds, "%d", dev);
  setenv("TDIST_NCCL_DEVICE", ds, 1);
  CU(L.cudaSetDevice(dev));
  tdist_store_t *store = NULL;
  if (tdist_memory_store_create(&store)) DIE("memory store: %s", tdist_last_error());
  correctness(store);
  tdist_store_destroy(store);
  if (do_bench) {
    /* a fresh store: the key of the first group's id is taken */
    if (tdist_memory_store_create(&store)) DIE("memory store: %s", tdist_last_error());
    bench(store, max_bytes, budget_s);
    tdist_store_destroy(store);
  }
  if (do_fault) fault();
  printf("%s: %d checks, %d failed\n", g_failures ? "FAIL" : "PASS", g_checks, g_failures);
  tdist__nccl_lib_close(&L);
  return g_failures ? 1 : 0;
}
