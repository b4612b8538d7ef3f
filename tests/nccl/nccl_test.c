/* The nccl backend's CPU-side logic on real processes and a real TCPStore, against the fake
 * CUDA runtime + NCCL of fake/fake.h (a fault seam: host memory and files, not a GPU):
 *   ids       rank 0's ncclUniqueId reaches every rank byte for byte through the store, under
 *             PyTorch 2.x's key "/default_pg/0//cuda//0" (the fake records what each rank got);
 *             devices come from LOCAL_RANK and the caller's current device is left alone;
 *   sweep     every collective x dtype x op (NCCL's five) x count {0,1,odd,larger}, uneven
 *             all_gather_v / all_to_all_v, send/recv pairs, barrier and async work, with random
 *             data against references computed here; BAND/BOR/BXOR and monitored_barrier are
 *             NOT_AVAILABLE, host or wrong-device buffers INVALID_ARGUMENT, and none of these
 *             fail the group; finalize flushes and destroys (no abort);
 *   split     subgroups (and a nested one) from ncclCommSplit: members and non-members take
 *             part, collectives and send/recv inside them, interleaved with the parent;
 *   nosplit   TDIST_NCCL_COMM_SPLIT=0: the subgroup's own unique id under "/default_pg/1//cuda//0";
 *   hang      an operation that never completes: TDIST_ERR_TIMEOUT within the deadline, the
 *             communicator aborted (ncclCommAbort), later calls fail fast with the same status;
 *   asyncerr  an asynchronous NCCL error mid-operation: TDIST_ERR_REMOTE long before the
 *             timeout, with NCCL's own text; the peer stuck in its op is freed by tdist_pg_abort
 *             from another thread (TDIST_ERR_ABORTED);
 *   idleerr   an error while nothing runs: the watchdog aborts the communicator on its own and
 *             the next call reports NCCL's text;
 *   initto    a rank that never joins (init times out and aborts), and a rank 0 that never
 *             publishes the id (the others name the store key).
 * argv[1]: //tests/nccl:libfake_cuda_nccl.so. Sharded (TEST_TOTAL_SHARDS). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "clock.h"
#include "dtype.h"
#include "shard.h"
#include "ranks.h"
#include "runtime/pg/reduce.h"

#define NDEV 8
#define SLACK_MS 3000 /* scheduling slack on a loaded 2-core machine with sanitizers */

typedef int cuda_err_t; /* cudaError_t without the CUDA headers */

typedef struct {
  cuda_err_t (*malloc)(void **, size_t);
  cuda_err_t (*free)(void *);
  cuda_err_t (*set_device)(int);
  cuda_err_t (*get_device)(int *);
  long (*counter)(const char *);
  void (*fail_idle_after)(long);
} fake_t;

typedef struct {
  _Atomic int flag;       /* scenario-specific signal between ranks */
  _Atomic int64_t t_flag; /* when it was raised (ms) */
} shared_t;

static char g_fake[PATH_MAX];
static shared_t *g_sh;
static fake_t F;

static void fake_open(void) {
  void *h = dlopen(g_fake, RTLD_NOW | RTLD_LOCAL);
  CHECK(h != NULL);
  F.malloc = (cuda_err_t(*)(void **, size_t))dlsym(h, "cudaMalloc");
  F.free = (cuda_err_t(*)(void *))dlsym(h, "cudaFree");
  F.set_device = (cuda_err_t(*)(int))dlsym(h, "cudaSetDevice");
  F.get_device = (cuda_err_t(*)(int *))dlsym(h, "cudaGetDevice");
  F.counter = (long (*)(const char *))dlsym(h, "fake_nccl_counter");
  F.fail_idle_after = (void (*)(long))dlsym(h, "fake_nccl_fail_idle_after");
  CHECK(F.malloc && F.free && F.set_device && F.get_device && F.counter && F.fail_idle_after);
}

static void *dev_alloc(size_t bytes) {
  void *p = NULL;
  CHECK_EQ_INT(F.malloc(&p, bytes ? bytes : 1), 0);
  return p;
}

static long ctr(const char *name) { return F.counter(name); }

/* Store client + nccl group; the status is returned (the group is NULL on failure). */
static tdist_status_t init_nccl(int rank, int world, int port, int64_t tmo, tdist_store_t **store,
                                tdist_pg_t **pg) {
  tdist_tcp_store_options_t co = TDIST_TCP_STORE_OPTIONS_INIT;
  co.host = "127.0.0.1";
  co.port = port;
  co.connect_timeout_ms = 10000;
  co.timeout_ms = 10000;
  CHECK_OK(tdist_tcp_store_connect(&co, store));
  tdist_pg_options_t po = TDIST_PG_OPTIONS_INIT;
  po.backend = "nccl";
  po.store = *store;
  po.rank = rank;
  po.world_size = world;
  po.timeout_ms = tmo;
  *pg = NULL;
  return tdist_init_process_group(&po, pg);
}

/* Child setup: LOCAL_RANK = rank, the fake's files under a per-scenario directory. */
static void child_env(int rank) {
  char lr[16];
  snprintf(lr, sizeof lr, "%d", rank);
  setenv("LOCAL_RANK", lr, 1);
  fake_open();
}

/* ---------------------------------------------------------------------------------------- */
/* Data and references                                                                       */

static const tdist_reduce_op_t k_ops[] = {TDIST_SUM, TDIST_PROD, TDIST_MIN, TDIST_MAX, TDIST_AVG};
#define NOPS (int)(sizeof k_ops / sizeof *k_ops)

static int is_float(tdist_dtype_t t) { return t <= TDIST_FLOAT64; }

/* Floats are small integers (-3..3: every sum and product of up to 4 is exact even in bf16);
 * integers are random bits over the whole type, so sums and products wrap. */
static void put(void *b, tdist_dtype_t t, size_t i, uint64_t r) {
  uint8_t *p = b;
  if (test_put_float(b, t, i, (double)((int)(r % 7) - 3)) == 0) return;
  switch (t) {
    case TDIST_INT8:
    case TDIST_UINT8: p[i] = (uint8_t)r; break;
    case TDIST_INT32: {
      uint32_t v = (uint32_t)r;
      memcpy(p + 4 * i, &v, 4);
      break;
    }
    default: memcpy(p + 8 * i, &r, 8); break;
  }
}

static void fill(void *b, tdist_dtype_t t, size_t n, uint64_t seed, int rank) {
  for (size_t i = 0; i < n; i++) put(b, t, i, tdist_test_rand(seed, (uint64_t)rank, i));
}

static double getf(const void *b, tdist_dtype_t t, size_t i) {
  const uint8_t *p = b;
  uint16_t h;
  switch (t) {
    case TDIST_FLOAT16: memcpy(&h, p + 2 * i, 2); return tdist__f16_to_f32(h);
    case TDIST_BFLOAT16: memcpy(&h, p + 2 * i, 2); return tdist__bf16_to_f32(h);
    case TDIST_FLOAT32: {
      float f;
      memcpy(&f, p + 4 * i, 4);
      return f;
    }
    default: {
      double d;
      memcpy(&d, p + 8 * i, 8);
      return d;
    }
  }
}

/* Signed types sign-extended, so MIN/MAX compare as the type does. */
static int64_t geti(const void *b, tdist_dtype_t t, size_t i) {
  const uint8_t *p = b;
  switch (t) {
    case TDIST_INT8: return (int8_t)p[i];
    case TDIST_UINT8: return p[i];
    case TDIST_INT32: {
      int32_t v;
      memcpy(&v, p + 4 * i, 4);
      return v;
    }
    default: {
      int64_t v;
      memcpy(&v, p + 8 * i, 8);
      return v;
    }
  }
}

static int64_t trunc_to(tdist_dtype_t t, uint64_t v) {
  switch (t) {
    case TDIST_INT8: return (int8_t)(uint8_t)v;
    case TDIST_UINT8: return (uint8_t)v;
    case TDIST_INT32: return (int32_t)(uint32_t)v;
    default: return (int64_t)v;
  }
}

/* Element i of the reduction over `n` ranks' inputs (inputs[r] + off elements). */
static void expect_elem(void *const *in, int n, size_t idx, tdist_dtype_t t, tdist_reduce_op_t op,
                        double *fv, int64_t *iv) {
  if (is_float(t)) {
    double a = getf(in[0], t, idx);
    for (int r = 1; r < n; r++) {
      double x = getf(in[r], t, idx);
      if (op == TDIST_SUM || op == TDIST_AVG)
        a += x;
      else if (op == TDIST_PROD)
        a *= x;
      else if (op == TDIST_MIN)
        a = fmin(a, x);
      else
        a = fmax(a, x);
    }
    *fv = op == TDIST_AVG ? a / n : a;
    return;
  }
  uint64_t a = (uint64_t)geti(in[0], t, idx);
  for (int r = 1; r < n; r++) {
    int64_t x = geti(in[r], t, idx);
    if (op == TDIST_SUM || op == TDIST_AVG)
      a = (uint64_t)trunc_to(t, a + (uint64_t)x);
    else if (op == TDIST_PROD)
      a = (uint64_t)trunc_to(t, a * (uint64_t)x);
    else if (op == TDIST_MIN)
      a = (int64_t)a < x ? a : (uint64_t)x;
    else
      a = (int64_t)a > x ? a : (uint64_t)x;
  }
  *iv = op == TDIST_AVG ? (int64_t)a / n : (int64_t)a;
}

static void check_elem(const char *what, const void *got, size_t gi, void *const *in, int n,
                       size_t idx, tdist_dtype_t t, tdist_reduce_op_t op) {
  double fv = 0;
  int64_t iv = 0;
  expect_elem(in, n, idx, t, op, &fv, &iv);
  if (is_float(t)) {
    double g = getf(got, t, gi);
    double tol = op != TDIST_AVG      ? 0 /* small integers: exact */
                 : t == TDIST_FLOAT64 ? 1e-12
                 : t == TDIST_FLOAT32 ? 1e-6
                 : t == TDIST_FLOAT16 ? 1e-2
                                      : 4e-2;
    if (fabs(g - fv) > tol * fmax(1.0, fabs(fv))) {
      fprintf(stderr, "%s %s %s: element %zu = %.17g, want %.17g\n", what, tdist_dtype_name(t),
              tdist_reduce_op_name(op), gi, g, fv);
      exit(1);
    }
  } else if (geti(got, t, gi) != iv) {
    fprintf(stderr, "%s %s %s: element %zu = %lld, want %lld\n", what, tdist_dtype_name(t),
            tdist_reduce_op_name(op), gi, (long long)geti(got, t, gi), (long long)iv);
    exit(1);
  }
}

static void check_copy(const char *what, const void *got, const void *want, size_t bytes) {
  if (bytes && memcmp(got, want, bytes) != 0) {
    fprintf(stderr, "%s: data differs\n", what);
    exit(1);
  }
}

/* Every rank's input for a given seed, generated independently of the collective. */
static void **inputs(int world, tdist_dtype_t t, size_t n, uint64_t seed) {
  void **in = calloc((size_t)world, sizeof *in);
  for (int r = 0; r < world; r++) {
    in[r] = malloc(n * tdist_dtype_size(t) + 1);
    fill(in[r], t, n, seed, r);
  }
  return in;
}

static void free_inputs(void **in, int world) {
  for (int r = 0; r < world; r++) free(in[r]);
  free(in);
}

#define OK(pg, expr) CHECK_OK_MSG(expr, tdist_pg_last_error(pg))

static int all_reduce_once(tdist_pg_t *pg, int32_t *d) {
  d[0] = 1;
  return tdist_all_reduce(pg, d, 1, TDIST_INT32, TDIST_SUM);
}

/* ---------------------------------------------------------------------------------------- */
/* ids + sweep                                                                               */

static void check_ids(tdist_store_t *store, int world) {
  void *v = NULL;
  size_t len = 0;
  CHECK_OK(tdist_store_get(store, "default_pg/0//cuda//0", &v, &len)); /* PyTorch 2.x's key */
  CHECK_EQ_INT(len, 128);
  const unsigned char *id = v;
  char dir[PATH_MAX];
  int n = snprintf(dir, sizeof dir, "%s/fakenccl-", getenv("TDIST_FAKE_NCCL_DIR"));
  for (int i = 0; i < 16; i++) n += snprintf(dir + n, sizeof dir - (size_t)n, "%02x", id[8 + i]);
  for (int r = 0; r < world; r++) {
    char path[PATH_MAX + 32], rec[512];
    snprintf(path, sizeof path, "%s/init-%d", dir, r);
    FILE *f = fopen(path, "rb");
    CHECK(f != NULL);
    size_t got = fread(rec, 1, sizeof rec - 1, f);
    fclose(f);
    rec[got] = '\0';
    CHECK(got > 128);
    if (memcmp(rec, id, 128) != 0) {
      fprintf(stderr, "rank %d received other ncclUniqueId bytes than rank 0 stored\n", r);
      exit(1);
    }
    char want[128];
    snprintf(want, sizeof want, "dev=%d nranks=%d blocking=0 name=default_pg", r, world);
    if (!strstr(rec + 128, want)) {
      fprintf(stderr, "rank %d's init record '%s' lacks '%s'\n", r, rec + 128, want);
      exit(1);
    }
  }
  tdist_free(v);
}

static void sweep_reductions(tdist_pg_t *pg, uint64_t seed) {
  int me = tdist_pg_rank(pg), p = tdist_pg_size(pg);
  static const size_t counts[] = {0, 1, 7, 33};
  for (int t = 0; t < TDIST_DTYPE_COUNT_; t++) {
    size_t es = tdist_dtype_size((tdist_dtype_t)t);
    for (int k = 0; k < NOPS; k++) {
      for (size_t ci = 0; ci < sizeof counts / sizeof *counts; ci++, seed++) {
        size_t n = counts[ci];
        tdist_dtype_t dt = (tdist_dtype_t)t;
        tdist_reduce_op_t op = k_ops[k];
        void **in = inputs(p, dt, n * (size_t)p, seed);
        char *buf = dev_alloc(n * (size_t)p * es), *out = dev_alloc(n * es);
        memcpy(buf, in[me], n * es);
        OK(pg, tdist_all_reduce(pg, buf, n, dt, op));
        for (size_t i = 0; i < n; i++) check_elem("all_reduce", buf, i, in, p, i, dt, op);
        int root = (int)(seed % (uint64_t)p);
        memcpy(buf, in[me], n * es);
        OK(pg, tdist_reduce(pg, buf, n, dt, op, root));
        if (me == root)
          for (size_t i = 0; i < n; i++) check_elem("reduce", buf, i, in, p, i, dt, op);
        memcpy(buf, in[me], n * (size_t)p * es);
        OK(pg, tdist_reduce_scatter(pg, out, buf, n, dt, op));
        for (size_t i = 0; i < n; i++)
          check_elem("reduce_scatter", out, i, in, p, (size_t)me * n + i, dt, op);
        F.free(buf);
        F.free(out);
        free_inputs(in, p);
      }
    }
  }
}

/* Data movement: broadcast, all_gather(_v), gather, scatter, all_to_all(_v), send/recv. */
static void sweep_moves(tdist_pg_t *pg, uint64_t seed) {
  int me = tdist_pg_rank(pg), p = tdist_pg_size(pg);
  for (int t = 0; t < TDIST_DTYPE_COUNT_; t++, seed += 10) {
    tdist_dtype_t dt = (tdist_dtype_t)t;
    size_t es = tdist_dtype_size(dt), n = 3 + (size_t)t, pn = n * (size_t)p;
    void **in = inputs(p, dt, pn, seed);
    char *a = dev_alloc(pn * es), *b = dev_alloc(pn * es);
    int root = (int)(seed % (uint64_t)p);
    memcpy(a, in[me], n * es);
    OK(pg, tdist_broadcast(pg, a, n, dt, root));
    check_copy("broadcast", a, in[root], n * es);
    memcpy(a, in[me], n * es);
    OK(pg, tdist_all_gather(pg, b, a, n, dt));
    for (int r = 0; r < p; r++) check_copy("all_gather", b + (size_t)r * n * es, in[r], n * es);
    /* uneven, some empty, placed in reverse rank order */
    size_t cnt[16], dsp[16], off = 0;
    for (int r = p - 1; r >= 0; r--) {
      cnt[r] = (size_t)((r * 3 + t) % 4);
      dsp[r] = off;
      off += cnt[r];
    }
    OK(pg, tdist_all_gather_v(pg, b, cnt, dsp, a, dt));
    for (int r = 0; r < p; r++) check_copy("all_gather_v", b + dsp[r] * es, in[r], cnt[r] * es);
    int nonempty = 0;
    for (int r = 0; r < p; r++) nonempty += cnt[r] > 0;
    if (p > 1 && nonempty) /* uneven: one grouped ncclBroadcast per non-empty block */
      CHECK_EQ_INT(ctr("last_group_ops"), nonempty);
    OK(pg, tdist_gather(pg, me == root ? b : NULL, a, n, dt, root));
    CHECK_EQ_INT(ctr("last_group_ops"), me == root ? p + 1 : 1); /* recvs (self too) + send */
    if (me == root)
      for (int r = 0; r < p; r++) check_copy("gather", b + (size_t)r * n * es, in[r], n * es);
    memcpy(a, in[me], pn * es);
    OK(pg, tdist_scatter(pg, b, me == root ? a : NULL, n, dt, root));
    check_copy("scatter", b, (char *)in[root] + (size_t)me * n * es, n * es);
    OK(pg, tdist_all_to_all(pg, b, a, n, dt));
    CHECK_EQ_INT(ctr("last_group_ops"), 2 * p); /* one send and one recv per rank, in a group */
    for (int r = 0; r < p; r++)
      check_copy("all_to_all", b + (size_t)r * n * es, (char *)in[r] + (size_t)me * n * es, n * es);
    /* all_to_all_v: rank i sends (i + j + t) % 3 elements to rank j, from in_displs packed */
    size_t ic[16], id[16], oc[16], od[16], io = 0, oo = 0;
    for (int j = 0; j < p; j++) {
      ic[j] = (size_t)((me + j + t) % 3);
      id[j] = io;
      io += ic[j];
      oc[j] = (size_t)((j + me + t) % 3);
      od[j] = oo;
      oo += oc[j];
    }
    OK(pg, tdist_all_to_all_v(pg, b, oc, od, a, ic, id, dt));
    for (int j = 0; j < p; j++) {
      size_t src_off = 0; /* where rank j's block for us starts in its input */
      for (int q = 0; q < me; q++) src_off += (size_t)((j + q + t) % 3);
      check_copy("all_to_all_v", b + od[j] * es, (char *)in[j] + src_off * es, oc[j] * es);
    }
    /* send/recv between pairs (0,1), (2,3), ...: even ranks send first, as NCCL needs */
    int peer = me ^ 1;
    if (peer < p) {
      memcpy(a, in[me], n * es);
      if (me % 2 == 0) {
        OK(pg, tdist_send(pg, a, n, dt, peer, 7));
        CHECK_EQ_INT(ctr("last_group_ops"), 1);
        OK(pg, tdist_recv(pg, b, n, dt, peer, 7));
      } else {
        OK(pg, tdist_recv(pg, b, n, dt, peer, 7));
        OK(pg, tdist_send(pg, a, n, dt, peer, 7));
      }
      check_copy("send/recv", b, in[peer], n * es);
    }
    F.free(a);
    F.free(b);
    free_inputs(in, p);
  }
}

static void async_work(tdist_pg_t *pg, uint64_t seed) {
  int me = tdist_pg_rank(pg), p = tdist_pg_size(pg);
  enum { K = 4, N = 19 };
  void **in = inputs(p, TDIST_INT32, (size_t)K * N, seed);
  int32_t *buf[K];
  tdist_work_t *w[K + 1];
  for (int k = 0; k < K; k++) {
    buf[k] = dev_alloc(N * 4);
    memcpy(buf[k], (int32_t *)in[me] + k * N, N * 4);
    OK(pg, tdist_all_reduce_async(pg, buf[k], N, TDIST_INT32, TDIST_SUM, &w[k]));
  }
  OK(pg, tdist_barrier_async(pg, &w[K]));
  for (int k = K; k >= 0; k--) OK(pg, tdist_work_wait(w[k], -1));
  for (int k = 0; k <= K; k++) {
    int done = 0;
    OK(pg, tdist_work_test(w[k], &done));
    CHECK(done);
    tdist_work_destroy(w[k]);
  }
  for (int k = 0; k < K; k++) {
    for (int i = 0; i < N; i++)
      check_elem("all_reduce_async", buf[k], (size_t)i, in, p, (size_t)(k * N + i), TDIST_INT32,
                 TDIST_SUM);
    F.free(buf[k]);
  }
  free_inputs(in, p);
}

/* What NCCL cannot do, and buffers it cannot use: refused up front, the group unharmed. */
static void refusals(tdist_pg_t *pg) {
  int me = tdist_pg_rank(pg);
  int32_t *d = dev_alloc(64);
  for (int op = TDIST_BAND; op <= TDIST_BXOR; op++) {
    CHECK_EQ_INT(tdist_all_reduce(pg, d, 4, TDIST_INT32, (tdist_reduce_op_t)op),
                 TDIST_ERR_NOT_AVAILABLE);
    CHECK(strstr(tdist_last_error(), "Cannot use ReduceOp.B") != NULL);
    CHECK(strstr(tdist_last_error(), "with NCCL") != NULL);
  }
  CHECK_EQ_INT(tdist_monitored_barrier(pg, 1000), TDIST_ERR_NOT_AVAILABLE);
  CHECK(strstr(tdist_pg_last_error(pg), "monitored_barrier") != NULL);
  int32_t host[4] = {0};
  CHECK_EQ_INT(tdist_all_reduce(pg, host, 4, TDIST_INT32, TDIST_SUM), TDIST_ERR_INVALID_ARGUMENT);
  CHECK(strstr(tdist_last_error(), "host memory") != NULL);
  tdist_work_t *w = NULL;
  CHECK_EQ_INT(tdist_all_reduce_async(pg, host, 4, TDIST_INT32, TDIST_SUM, &w),
               TDIST_ERR_INVALID_ARGUMENT);
  CHECK(w == NULL);
  int cur;
  F.get_device(&cur);
  F.set_device((me + 3) % NDEV); /* memory of another device than the group's */
  void *other = dev_alloc(64);
  F.set_device(cur);
  CHECK_EQ_INT(tdist_broadcast(pg, other, 4, TDIST_INT32, 0), TDIST_ERR_INVALID_ARGUMENT);
  char want[64];
  snprintf(want, sizeof want, "memory of device %d", (me + 3) % NDEV);
  CHECK(strstr(tdist_last_error(), want) != NULL);
  F.free(other);
  /* the group still works, and a known buffer is not looked up again */
  d[0] = me;
  OK(pg, tdist_all_reduce(pg, d, 1, TDIST_INT32, TDIST_SUM));
  long q = ctr("pointer_queries");
  for (int i = 0; i < 5; i++) OK(pg, tdist_all_reduce(pg, d, 1, TDIST_INT32, TDIST_MAX));
  CHECK_EQ_INT(ctr("pointer_queries"), q);
  F.free(d);
}

static int sweep_body(int rank, int world, int port, void *arg) {
  (void)arg;
  child_env(rank);
  /* The caller's current device is not the group's: tdist must leave it as it found it. */
  int mine = (rank + 1) % NDEV, cur = -1;
  F.set_device(rank);
  int32_t *one = dev_alloc(4); /* on the group's device (LOCAL_RANK) */
  tdist_store_t *store;
  tdist_pg_t *pg;
  F.set_device(mine);
  CHECK_OK(init_nccl(rank, world, port, 20000, &store, &pg));
  F.get_device(&cur);
  CHECK_EQ_INT(cur, mine);
  CHECK_EQ_INT(tdist_pg_device(pg), rank); /* LOCAL_RANK, told to the caller */
  OK(pg, all_reduce_once(pg, one));
  CHECK_EQ_INT(one[0], world);
  F.get_device(&cur);
  CHECK_EQ_INT(cur, mine);
  F.set_device(rank); /* the sweep allocates its buffers on the group's device */
  CHECK_EQ_INT(ctr("inits"), 1);
  OK(pg, tdist_barrier(pg));
  if (rank == 0) check_ids(store, world);
  uint64_t seed = 1000 + (uint64_t)world;
  sweep_reductions(pg, seed);
  sweep_moves(pg, seed);
  async_work(pg, seed);
  refusals(pg);
  F.free(one);
  OK(pg, tdist_barrier(pg));
  CHECK(ctr("groups") > 0);
  CHECK(ctr("inprogress") > 0); /* the ncclInProgress path was taken */
  CHECK_EQ_INT(ctr("aborts"), 0);
  OK(pg, tdist_pg_finalize(pg));
  CHECK_EQ_INT(tdist_pg_device(pg), -1); /* the communicator is gone */
  CHECK_EQ_INT(ctr("finalizes"), 1);
  CHECK_EQ_INT(ctr("destroys"), 1);
  CHECK_EQ_INT(ctr("aborts"), 0);
  tdist_pg_destroy(pg);
  tdist_store_destroy(store);
  TEST_LOG("rank %d/%d: sweep ok (%ld tasks, %ld groups)", rank, world, ctr("tasks"),
           ctr("groups"));
  return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* Subgroups                                                                                 */

/* Sum over the members' global ranks, checked in `g` (NULL: not a member). */
static void sub_allreduce(tdist_pg_t *g, int global, const int *members, int n) {
  if (!g) return;
  int64_t *d = dev_alloc(8 * 5);
  for (int i = 0; i < 5; i++) d[i] = (int64_t)global * 100 + i;
  OK(g, tdist_all_reduce(g, d, 5, TDIST_INT64, TDIST_SUM));
  for (int i = 0; i < 5; i++) {
    int64_t want = 0;
    for (int m = 0; m < n; m++) want += (int64_t)members[m] * 100 + i;
    CHECK_EQ_INT(d[i], want);
  }
  F.free(d);
}

static int split_body(int rank, int world, int port, void *arg) {
  int use_split = *(int *)arg;
  child_env(rank);
  F.set_device(rank);
  if (!use_split) setenv("TDIST_NCCL_COMM_SPLIT", "0", 1);
  tdist_store_t *store;
  tdist_pg_t *pg;
  CHECK_OK(init_nccl(rank, world, port, 20000, &store, &pg));
  static const int all[] = {0, 1, 2, 3}, m1[] = {1, 3}, m2[] = {0, 1, 2}, m3g[] = {0, 2};
  tdist_pg_t *g1 = NULL, *g2 = NULL, *g3 = NULL;
  OK(pg, tdist_new_group(pg, m1, 2, &g1));
  CHECK((g1 != NULL) == (rank == 1 || rank == 3));
  sub_allreduce(pg, rank, all, world);
  if (!use_split && rank == 1) { /* the subgroup's own id, under PyTorch's key */
    void *v = NULL;
    size_t len = 0;
    CHECK_OK(tdist_store_get(store, "default_pg/1//cuda//0", &v, &len));
    CHECK_EQ_INT(len, 128);
    tdist_free(v);
  }
  if (use_split) {
    OK(pg, tdist_new_group(pg, m2, 3, &g2));
    CHECK((g2 != NULL) == (rank <= 2));
    if (g2) OK(g2, tdist_new_group(g2, m3g, 2, &g3)); /* g2 ranks 0, 2 = global 0, 2 */
    CHECK((g3 != NULL) == (rank == 0 || rank == 2));
  }
  for (int it = 0; it < 2; it++) { /* interleaved with the parent */
    sub_allreduce(g1, rank, m1, 2);
    sub_allreduce(pg, rank, all, world);
    sub_allreduce(g2, rank, m2, 3);
    sub_allreduce(g3, rank, m3g, 2);
  }
  if (g1) { /* point-to-point inside a subgroup: group ranks 0 and 1 are global 1 and 3 */
    int32_t *d = dev_alloc(4 * 3);
    int gr = tdist_pg_rank(g1);
    for (int i = 0; i < 3; i++) d[i] = rank * 10 + i;
    if (gr == 0) {
      OK(g1, tdist_send(g1, d, 3, TDIST_INT32, 1, 0));
      OK(g1, tdist_recv(g1, d, 3, TDIST_INT32, 1, 0));
      CHECK_EQ_INT(d[2], 32);
    } else {
      int32_t *e = dev_alloc(4 * 3);
      OK(g1, tdist_recv(g1, e, 3, TDIST_INT32, 0, 0));
      CHECK_EQ_INT(e[1], 11);
      OK(g1, tdist_send(g1, d, 3, TDIST_INT32, 0, 0));
      F.free(e);
    }
    F.free(d);
  }
  if (use_split) {
    static const int want_split[] = {2, 2, 2, 1}, want_nocolor[] = {1, 1, 1, 1};
    CHECK_EQ_INT(ctr("splits"), want_split[rank]);
    CHECK_EQ_INT(ctr("nocolor_splits"), want_nocolor[rank]);
    CHECK_EQ_INT(ctr("inits"), 1);
  } else {
    CHECK_EQ_INT(ctr("splits") + ctr("nocolor_splits"), 0);
    CHECK_EQ_INT(ctr("inits"), g1 ? 2 : 1);
  }
  tdist_pg_destroy(g3);
  tdist_pg_destroy(g2);
  tdist_pg_destroy(g1);
  OK(pg, tdist_barrier(pg));
  CHECK_EQ_INT(ctr("aborts"), 0);
  tdist_pg_destroy(pg);
  tdist_store_destroy(store);
  return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* Failures                                                                                  */

#define TMO 1500

static int hang_body(int rank, int world, int port, void *arg) {
  (void)arg;
  child_env(rank);
  F.set_device(rank);
  if (rank == 1) setenv("TDIST_FAKE_NCCL_HANG_AT", "3", 1);
  tdist_store_t *store;
  tdist_pg_t *pg;
  CHECK_OK(init_nccl(rank, world, port, TMO, &store, &pg));
  int32_t *d = dev_alloc(4);
  OK(pg, all_reduce_once(pg, d));
  OK(pg, all_reduce_once(pg, d));
  int64_t t0 = now_ms();
  int st = all_reduce_once(pg, d);
  int64_t took = now_ms() - t0;
  TEST_LOG("rank %d: hung op -> %s after %lld ms: %s", rank, tdist_status_name(st), (long long)took,
           tdist_pg_last_error(pg));
  CHECK_EQ_INT(st, TDIST_ERR_TIMEOUT);
  CHECK(took >= TMO - 50 && took <= TMO + SLACK_MS);
  CHECK(strstr(tdist_pg_last_error(pg), "ncclCommAbort") != NULL);
  CHECK(strstr(tdist_pg_last_error(pg), "1500 ms") != NULL);
  CHECK_EQ_INT(ctr("aborts"), 1);
  if (rank == 1) CHECK_EQ_INT(ctr("hangs"), 1);
  /* sticky: refused at the entry check, without another NCCL call (not timed: the message) */
  CHECK_EQ_INT(tdist_barrier(pg), TDIST_ERR_TIMEOUT);
  CHECK(strstr(tdist_last_error(), "aborted after an earlier failure") != NULL);
  tdist_pg_destroy(pg);
  CHECK_EQ_INT(ctr("aborts"), 1);
  CHECK_EQ_INT(ctr("finalizes"), 0);
  F.free(d);
  tdist_store_destroy(store);
  return 0;
}

typedef struct {
  tdist_pg_t *pg;
} abort_arg_t;

static void *abort_when_flagged(void *p) {
  abort_arg_t *a = p;
  while (!atomic_load(&g_sh->flag)) usleep(1000);
  usleep(200 * 1000);
  atomic_store(&g_sh->t_flag, now_ms());
  tdist_pg_abort(a->pg);
  return NULL;
}

static int asyncerr_body(int rank, int world, int port, void *arg) {
  (void)arg;
  child_env(rank);
  F.set_device(rank);
  if (rank == 1) setenv("TDIST_FAKE_NCCL_ERROR_AT", "2", 1);
  tdist_store_t *store;
  tdist_pg_t *pg;
  CHECK_OK(init_nccl(rank, world, port, 60000, &store, &pg));
  int32_t *d = dev_alloc(4);
  OK(pg, all_reduce_once(pg, d));
  pthread_t th;
  abort_arg_t aa = {pg};
  if (rank == 0) CHECK(pthread_create(&th, NULL, abort_when_flagged, &aa) == 0);
  int64_t t0 = now_ms();
  int st = all_reduce_once(pg, d);
  int64_t took = now_ms() - t0;
  const char *msg = tdist_pg_last_error(pg);
  TEST_LOG("rank %d: -> %s after %lld ms: %s", rank, tdist_status_name(st), (long long)took, msg);
  if (rank == 1) {
    CHECK_EQ_INT(st, TDIST_ERR_REMOTE);
    CHECK(took < 5000); /* found by polling ncclCommGetAsyncError, not by the 60 s timeout */
    CHECK(strstr(msg, "ncclRemoteError") != NULL);
    CHECK(strstr(msg, "injected failure of operation 2") != NULL); /* ncclGetLastError */
    atomic_store(&g_sh->flag, 1);
  } else {
    /* ABORTED, not the 60 s timeout: the other thread's abort ended the call (how soon after
     * the abort is printed, not asserted) */
    CHECK_EQ_INT(st, TDIST_ERR_ABORTED);
    TEST_LOG("rank 0: returned %lld ms after the abort",
             (long long)(now_ms() - atomic_load(&g_sh->t_flag)));
    CHECK(strstr(msg, "abort") != NULL);
    pthread_join(th, NULL);
  }
  CHECK_EQ_INT(ctr("aborts"), 1);
  CHECK_EQ_INT(all_reduce_once(pg, d), st); /* sticky */
  tdist_pg_destroy(pg);
  CHECK_EQ_INT(ctr("aborts"), 1);
  F.free(d);
  tdist_store_destroy(store);
  return 0;
}

static int idleerr_body(int rank, int world, int port, void *arg) {
  (void)arg;
  child_env(rank);
  F.set_device(rank);
  tdist_store_t *store;
  tdist_pg_t *pg;
  CHECK_OK(init_nccl(rank, world, port, 60000, &store, &pg));
  int32_t *d = dev_alloc(4);
  OK(pg, all_reduce_once(pg, d));
  F.fail_idle_after(300); /* ms after the communicator's birth */
  int64_t t0 = now_ms();
  while (ctr("aborts") == 0 && now_ms() - t0 < 5000) usleep(10 * 1000);
  CHECK_EQ_INT(ctr("aborts"), 1); /* the watchdog, with no call in flight */
  int st = all_reduce_once(pg, d);
  TEST_LOG("rank %d: after an idle failure -> %s: %s", rank, tdist_status_name(st),
           tdist_pg_last_error(pg));
  CHECK_EQ_INT(st, TDIST_ERR_SYSTEM);
  CHECK(strstr(tdist_pg_last_error(pg), "injected background failure") != NULL);
  CHECK(strstr(tdist_pg_last_error(pg), "ncclSystemError") != NULL);
  tdist_pg_destroy(pg);
  CHECK_EQ_INT(ctr("aborts"), 1);
  F.free(d);
  tdist_store_destroy(store);
  return 0;
}

/* variant 0: rank 1 never joins; variant 1: rank 0 never publishes the id. */
static int initto_body(int rank, int world, int port, void *arg) {
  int variant = *(int *)arg;
  child_env(rank);
  F.set_device(rank);
  if ((variant == 0 && rank == 1) || (variant == 1 && rank == 0)) return 0;
  tdist_store_t *store;
  tdist_pg_t *pg;
  int64_t t0 = now_ms();
  int st = init_nccl(rank, world, port, TMO, &store, &pg);
  int64_t took = now_ms() - t0;
  TEST_LOG("rank %d: init -> %s after %lld ms: %s", rank, tdist_status_name(st), (long long)took,
           tdist_last_error());
  CHECK_EQ_INT(st, TDIST_ERR_TIMEOUT);
  CHECK(pg == NULL);
  CHECK(took <= TMO + SLACK_MS);
  if (variant == 0) {
    CHECK(strstr(tdist_last_error(), "never joined") != NULL);
    CHECK_EQ_INT(ctr("aborts"), 1);
  } else {
    CHECK(strstr(tdist_last_error(), "default_pg/0//cuda//0") != NULL);
    CHECK_EQ_INT(ctr("inits"), 0);
  }
  tdist_store_destroy(store);
  return 0;
}

/* ---------------------------------------------------------------------------------------- */

static int run(const char *name, int world, tdist_test_rank_fn fn, void *arg) {
  char dir[PATH_MAX];
  const char *tmp = getenv("TEST_TMPDIR");
  static int n;
  snprintf(dir, sizeof dir, "%s/%s-%d-%d", tmp && *tmp ? tmp : "/tmp", name, world, n++);
  mkdir(dir, 0700);
  setenv("TDIST_FAKE_NCCL_DIR", dir, 1);
  atomic_store(&g_sh->flag, 0);
  TEST_LOG("== %s (world %d)", name, world);
  int64_t t0 = now_ms();
  int failed = tdist_test_run_ranks(world, 120000, fn, arg);
  TEST_LOG("== %s (world %d): %s in %lld ms", name, world, failed ? "FAILED" : "ok",
           (long long)(now_ms() - t0));
  return failed;
}

int main(int argc, char **argv) {
  CHECK(argc == 2);
  CHECK(realpath(argv[1], g_fake) != NULL);
  setenv("TDIST_CUDART_LIBRARY", g_fake, 1);
  setenv("TDIST_NCCL_LIBRARY", g_fake, 1);
  setenv("TDIST_FAKE_CUDA_DEVICES", "8", 1);
  setenv("TDIST_NCCL_SPIN_US", "200", 1); /* 2 cores: spin less, so the fake's threads run */
  unsetenv("TDIST_NCCL_DEVICE");
  g_sh = mmap(NULL, sizeof *g_sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  CHECK(g_sh != MAP_FAILED);
  test_shard_t sh = test_shard_init("nccl_test");
  int failed = 0, yes = 1, no = 0, v0 = 0, v1 = 1;
#define JOB if (test_shard_take(&sh))
  JOB failed |= run("sweep", 1, sweep_body, NULL);
  JOB failed |= run("sweep", 3, sweep_body, NULL);
  JOB failed |= run("sweep", 4, sweep_body, NULL);
  JOB failed |= run("split", 4, split_body, &yes);
  JOB failed |= run("nosplit", 4, split_body, &no);
  JOB failed |= run("hang", 2, hang_body, NULL);
  JOB failed |= run("asyncerr", 2, asyncerr_body, NULL);
  JOB failed |= run("idleerr", 2, idleerr_body, NULL);
  JOB failed |= run("initto-absent-rank", 2, initto_body, &v0);
  JOB failed |= run("initto-absent-rank0", 2, initto_body, &v1);
  TEST_LOG(failed ? "FAIL" : "PASS");
  return failed;
}
