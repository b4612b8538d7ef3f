/* FAULT SEAM, NOT A GPU: the NCCL half of the fake (see fake.h for what it models and why).
 * A communicator is a directory; a message is a file "<dir>/m<src>-<dst>-<n>" written then
 * renamed into place, read and unlinked by the receiver; every collective is built from
 * messages (everyone sends to whoever needs its data, then receives) and reduces in rank order.
 * Sends never block, so any order of calls that NCCL would accept completes here too. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "fake.h"
#include "tests/testlib/clock.h"

#define ID_MAGIC "TDFAKEID"
#define TOKEN_BYTES 16

/* ---- counters and last error ---- */

static const char *const k_counters[] = {
    "inits",   "splits",          "nocolor_splits", "aborts",      "destroys",       "finalizes",
    "groups",  "tasks",           "hangs",          "unique_ids",  "last_group_ops", "set_device",
    "streams", "pointer_queries", "inprogress",     "async_polls",
};
#define NCOUNTERS (sizeof k_counters / sizeof *k_counters)
static _Atomic long g_counters[NCOUNTERS];

static int counter_index(const char *name) {
  for (size_t i = 0; i < NCOUNTERS; i++)
    if (!strcmp(k_counters[i], name)) return (int)i;
  return -1;
}
void fake_count(const char *name) {
  int i = counter_index(name);
  if (i >= 0) atomic_fetch_add(&g_counters[i], 1);
}
static void counter_set(const char *name, long v) {
  atomic_store(&g_counters[counter_index(name)], v);
}

/* How many times `name` happened in this process; -1 for an unknown name. */
FAKE_API long fake_nccl_counter(const char *name) {
  int i = counter_index(name);
  return i < 0 ? -1 : atomic_load(&g_counters[i]);
}

static pthread_mutex_t g_err_mu = PTHREAD_MUTEX_INITIALIZER;
static char g_last[512];

static void set_last(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void set_last(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  pthread_mutex_lock(&g_err_mu);
  vsnprintf(g_last, sizeof g_last, fmt, ap);
  pthread_mutex_unlock(&g_err_mu);
  va_end(ap);
}

FAKE_API const char *ncclGetLastError(ncclComm_t comm) {
  (void)comm;
  return g_last; /* like NCCL: one process-wide buffer */
}

FAKE_API const char *ncclGetErrorString(ncclResult_t r) {
  switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError:
      return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError:
      return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
  }
}

static long env_long(const char *name, long dflt) {
  const char *v = getenv(name);
  return v && *v ? strtol(v, NULL, 10) : dflt;
}

FAKE_API ncclResult_t ncclGetVersion(int *v) {
  *v = (int)env_long("TDIST_FAKE_NCCL_VERSION", NCCL_VERSION_CODE);
  return ncclSuccess;
}

static void nap(unsigned *i) {
  struct timespec ts = {0, *i < 50 ? 20000 : 1000000};
  (*i)++;
  nanosleep(&ts, NULL);
}

/* ---- unique ids: magic, a random token naming the directory, random bytes ---- */

static const char *base_dir(void) {
  const char *b = getenv("TDIST_FAKE_NCCL_DIR");
  if (!b || !*b) b = getenv("TEST_TMPDIR");
  return b && *b ? b : "/tmp";
}

static void id_dir(const ncclUniqueId *id, char *dir, size_t cap) {
  int n = snprintf(dir, cap, "%s/fakenccl-", base_dir());
  for (int i = 0; i < TOKEN_BYTES && n + 2 < (int)cap; i++, n += 2)
    snprintf(dir + n, cap - (size_t)n, "%02x", (unsigned char)id->internal[8 + i]);
}

static int write_file(const char *path, const void *data, size_t len) {
  char tmp[PATH_MAX + 8];
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return -1;
  const char *p = data;
  while (len) {
    ssize_t w = write(fd, p, len);
    if (w <= 0) {
      close(fd);
      return -1;
    }
    p += w;
    len -= (size_t)w;
  }
  close(fd);
  return rename(tmp, path);
}

/* Whole file into a malloc'd buffer; NULL if absent. */
static char *read_file(const char *path, size_t *len) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return NULL;
  struct stat st;
  if (fstat(fd, &st) != 0) {
    close(fd);
    return NULL;
  }
  char *b = malloc((size_t)st.st_size + 1);
  size_t got = 0;
  while (b && got < (size_t)st.st_size) {
    ssize_t r = read(fd, b + got, (size_t)st.st_size - got);
    if (r <= 0) break;
    got += (size_t)r;
  }
  close(fd);
  if (b) b[got] = '\0';
  *len = got;
  return b;
}

FAKE_API ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
  int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd < 0 || read(fd, id->internal, sizeof id->internal) != (ssize_t)sizeof id->internal) {
    if (fd >= 0) close(fd);
    set_last("fake: cannot read /dev/urandom");
    return ncclSystemError;
  }
  close(fd);
  memcpy(id->internal, ID_MAGIC, 8);
  char dir[PATH_MAX], path[PATH_MAX + 16];
  id_dir(id, dir, sizeof dir);
  snprintf(path, sizeof path, "%s/id", dir);
  if (mkdir(dir, 0700) != 0 || write_file(path, id->internal, sizeof id->internal) != 0) {
    set_last("fake: cannot create %s: %s", dir, strerror(errno));
    return ncclSystemError;
  }
  fake_count("unique_ids");
  return ncclSuccess;
}

/* ---- communicators ---- */

struct ncclComm {
  char dir[PATH_MAX];
  int rank, nranks, dev, blocking;
  _Atomic int state;         /* ncclResult_t as seen by ncclCommGetAsyncError */
  _Atomic int aborted;       /* abort or destroy: whatever waits gives up */
  _Atomic int refs;          /* the user + queued tasks + a split job */
  _Atomic int pending_polls; /* "still in progress" answers left (background enqueue) */
  _Atomic int running;       /* tasks executing now (abort waits for them, as kernels exit) */
  unsigned long calls;
  uint64_t *sseq, *rseq; /* messages sent to / received from each peer (stream thread) */
  int nsplits;
  int64_t created_ms;
  pthread_t job; /* background init or split */
  int job_started;
  struct ncclComm *parent; /* split job: parent, color, key, split number */
  int color, key, split_k;
};

static void comm_unref(ncclComm_t c) {
  if (atomic_fetch_sub(&c->refs, 1) != 1) return;
  if (c->parent) comm_unref(c->parent);
  free(c->sseq);
  free(c->rseq);
  free(c);
}

static ncclComm_t comm_new(const char *dir, int rank, int nranks, int blocking) {
  ncclComm_t c = calloc(1, sizeof *c);
  if (!c) return NULL;
  snprintf(c->dir, sizeof c->dir, "%s", dir);
  c->rank = rank;
  c->nranks = nranks;
  c->dev = fake_current_device();
  c->blocking = blocking;
  c->created_ms = now_ms();
  atomic_store(&c->refs, 1);
  atomic_store(&c->state, ncclSuccess);
  return c;
}

static int alloc_seqs(ncclComm_t c) {
  c->sseq = calloc((size_t)c->nranks, sizeof *c->sseq);
  c->rseq = calloc((size_t)c->nranks, sizeof *c->rseq);
  return c->sseq && c->rseq ? 0 : -1;
}

/* Waits until <dir>/<prefix><r> exists for every r < n; -1 if c is aborted first. */
static int wait_all(ncclComm_t c, const char *dir, const char *prefix, int n) {
  char path[PATH_MAX + 64];
  for (int r = 0; r < n; r++) {
    snprintf(path, sizeof path, "%s/%s%d", dir, prefix, r);
    for (unsigned i = 0; access(path, F_OK) != 0; nap(&i))
      if (atomic_load(&c->aborted)) return -1;
  }
  return 0;
}

static void *init_job(void *arg) {
  ncclComm_t c = arg;
  if (wait_all(c, c->dir, "join-", c->nranks) == 0) atomic_store(&c->state, ncclSuccess);
  return NULL;
}

/* Non-blocking communicators: every third call reports ncclInProgress and needs two polls. */
static ncclResult_t maybe_in_progress(ncclComm_t c) {
  if (c->blocking || ++c->calls % 3) return ncclSuccess;
  atomic_store(&c->pending_polls, 2);
  fake_count("inprogress");
  return ncclInProgress;
}

static int config_blocking(const ncclConfig_t *cfg, ncclResult_t *bad) {
  *bad = ncclSuccess;
  if (!cfg) return 1;
  if (cfg->magic != 0xcafebeef || cfg->size != sizeof(ncclConfig_t)) {
    set_last("fake: ncclConfig_t not initialised with NCCL_CONFIG_INITIALIZER");
    *bad = ncclInvalidArgument;
  }
  return cfg->blocking != 0; /* NCCL_CONFIG_UNDEF_INT means the default: blocking */
}

FAKE_API ncclResult_t ncclCommInitRankConfig(ncclComm_t *out, int nranks, ncclUniqueId id, int rank,
                                             ncclConfig_t *cfg) {
  ncclResult_t bad;
  int blocking = config_blocking(cfg, &bad);
  if (bad) return bad;
  if (!out || nranks <= 0 || rank < 0 || rank >= nranks) {
    set_last("fake: ncclCommInitRankConfig: bad rank %d / nranks %d", rank, nranks);
    return ncclInvalidArgument;
  }
  cudaError_t e;
  int ndev = fake_device_count(&e);
  if (e != cudaSuccess || fake_current_device() >= ndev) {
    set_last("fake: no CUDA device %d", fake_current_device());
    return ncclUnhandledCudaError;
  }
  if (memcmp(id.internal, ID_MAGIC, 8) != 0) {
    set_last("fake: rank %d: this ncclUniqueId was not made by ncclGetUniqueId", rank);
    return ncclInvalidArgument;
  }
  char dir[PATH_MAX], path[PATH_MAX + 32];
  id_dir(&id, dir, sizeof dir);
  snprintf(path, sizeof path, "%s/id", dir);
  size_t len = 0;
  char *orig = read_file(path, &len);
  int same = orig && len == sizeof id.internal && !memcmp(orig, id.internal, len);
  free(orig);
  if (!same) {
    set_last("fake: rank %d: ncclUniqueId bytes differ from those ncclGetUniqueId wrote to %s",
             rank, path);
    return ncclInvalidArgument;
  }
  /* What this rank received, for the test to compare with the store. */
  char rec[sizeof id.internal + 256];
  memcpy(rec, id.internal, sizeof id.internal);
  int n =
      snprintf(rec + sizeof id.internal, 256, "dev=%d nranks=%d blocking=%d name=%s\n",
               fake_current_device(), nranks, blocking, cfg && cfg->commName ? cfg->commName : "");
  snprintf(path, sizeof path, "%s/init-%d", dir, rank);
  write_file(path, rec, sizeof id.internal + (size_t)n);
  snprintf(path, sizeof path, "%s/join-%d", dir, rank);
  write_file(path, "", 0);
  ncclComm_t c = comm_new(dir, rank, nranks, blocking);
  if (!c || alloc_seqs(c) != 0) {
    if (c) comm_unref(c);
    return ncclSystemError;
  }
  fake_count("inits");
  *out = c;
  if (blocking) {
    wait_all(c, dir, "join-", nranks); /* a blocking init waits, however long */
    return ncclSuccess;
  }
  atomic_store(&c->state, ncclInProgress);
  c->job_started = pthread_create(&c->job, NULL, init_job, c) == 0;
  return c->job_started ? ncclInProgress : ncclSystemError;
}

static _Atomic long g_idle_ms = -1;

FAKE_API ncclResult_t ncclCommInitRank(ncclComm_t *out, int nranks, ncclUniqueId id, int rank) {
  return ncclCommInitRankConfig(out, nranks, id, rank, NULL); /* blocking */
}

FAKE_API ncclResult_t ncclCommGetAsyncError(ncclComm_t c, ncclResult_t *res) {
  if (!c) return ncclInvalidArgument;
  fake_count("async_polls");
  int pend = atomic_load(&c->pending_polls);
  if (pend > 0 && atomic_compare_exchange_strong(&c->pending_polls, &pend, pend - 1)) {
    *res = ncclInProgress;
    return ncclSuccess;
  }
  long idle = atomic_load(&g_idle_ms);
  int ok = ncclSuccess;
  if (idle >= 0 && now_ms() - c->created_ms >= idle &&
      atomic_compare_exchange_strong(&c->state, &ok, ncclSystemError))
    set_last(
        "fake: injected background failure of the communicator of rank %d, %ld ms after "
        "it was created (fake_nccl_fail_idle_after)",
        c->rank, idle);
  *res = (ncclResult_t)atomic_load(&c->state);
  return ncclSuccess;
}

/* Test control: every communicator fails with ncclSystemError `ms` after it was created
 * (while idle, as a dead peer noticed by NCCL's proxy thread would make it). -1: never. */
FAKE_API void fake_nccl_fail_idle_after(long ms) { atomic_store(&g_idle_ms, ms); }

static void join_job(ncclComm_t c) {
  if (c->job_started) pthread_join(c->job, NULL);
  c->job_started = 0;
}

/* Like NCCL's abort, returns once no operation of the communicator touches user buffers. */
static void stop_tasks(ncclComm_t c) {
  atomic_store(&c->aborted, 1);
  for (unsigned i = 0; atomic_load(&c->running) > 0; nap(&i)) {
  }
}

FAKE_API ncclResult_t ncclCommAbort(ncclComm_t c) {
  if (!c) return ncclSuccess;
  stop_tasks(c);
  fake_count("aborts");
  join_job(c);
  comm_unref(c);
  return ncclSuccess;
}

FAKE_API ncclResult_t ncclCommFinalize(ncclComm_t c) {
  if (!c) return ncclInvalidArgument;
  fake_count("finalizes");
  if (c->blocking) return ncclSuccess;
  atomic_store(&c->pending_polls, 2);
  return ncclInProgress;
}

FAKE_API ncclResult_t ncclCommDestroy(ncclComm_t c) {
  if (!c) return ncclInvalidArgument;
  stop_tasks(c);
  fake_count("destroys");
  join_job(c);
  comm_unref(c);
  return ncclSuccess;
}

/* Split job: wait for every parent rank's (color, key), then order the members by (key, rank). */
static void *split_job(void *arg) {
  ncclComm_t c = arg; /* the child; c->parent the parent */
  ncclComm_t p = c->parent;
  char prefix[32], path[PATH_MAX + 64];
  snprintf(prefix, sizeof prefix, "split%d-", c->split_k);
  if (wait_all(c, p->dir, prefix, p->nranks) != 0) return NULL;
  int me = 0, n = 0;
  for (int r = 0; r < p->nranks; r++) {
    snprintf(path, sizeof path, "%s/%s%d", p->dir, prefix, r);
    size_t len;
    char *s = read_file(path, &len);
    int color = INT_MIN, key = 0;
    if (s) sscanf(s, "%d %d", &color, &key);
    free(s);
    if (color != c->color) continue;
    n++;
    if (key < c->key || (key == c->key && r < p->rank)) me++;
  }
  c->rank = me;
  c->nranks = n;
  snprintf(c->dir, sizeof c->dir, "%.4000s/s%dc%d", p->dir, c->split_k, c->color);
  mkdir(c->dir, 0700);
  snprintf(path, sizeof path, "%s/init-%d", c->dir, me);
  char rec[256];
  int l = snprintf(rec, sizeof rec, "split parent_rank=%d color=%d key=%d nranks=%d dev=%d\n",
                   p->rank, c->color, c->key, n, c->dev);
  write_file(path, rec, (size_t)l);
  if (alloc_seqs(c) != 0) {
    atomic_store(&c->state, ncclSystemError);
    return NULL;
  }
  atomic_store(&c->state, ncclSuccess);
  atomic_store(&p->state, ncclSuccess);
  return NULL;
}

/* The non-member's side: it only has to be counted (its color file is already written). */
FAKE_API ncclResult_t ncclCommSplit(ncclComm_t p, int color, int key, ncclComm_t *out,
                                    ncclConfig_t *cfg) {
  ncclResult_t bad;
  int blocking = config_blocking(cfg, &bad);
  if (bad) return bad;
  if (!p || atomic_load(&p->state) != ncclSuccess) {
    set_last("fake: ncclCommSplit on a communicator that is not ready");
    return ncclInvalidUsage;
  }
  int k = p->nsplits++;
  char path[PATH_MAX + 64], rec[64];
  snprintf(path, sizeof path, "%s/split%d-%d", p->dir, k, p->rank);
  int l = snprintf(rec, sizeof rec, "%d %d\n", color, key);
  write_file(path, rec, (size_t)l);
  *out = NULL;
  if (color == NCCL_SPLIT_NOCOLOR) {
    fake_count("nocolor_splits");
    return ncclSuccess;
  }
  ncclComm_t c = comm_new("", -1, 0, blocking);
  if (!c) return ncclSystemError;
  c->parent = p;
  atomic_fetch_add(&p->refs, 1);
  c->color = color;
  c->key = key;
  c->split_k = k;
  fake_count("splits");
  *out = c;
  if (blocking) {
    split_job(c);
    return (ncclResult_t)atomic_load(&c->state);
  }
  atomic_store(&c->state, ncclInProgress);
  atomic_store(&p->state, ncclInProgress); /* NCCL reports the split on the parent too */
  c->job_started = pthread_create(&c->job, NULL, split_job, c) == 0;
  return c->job_started ? ncclInProgress : ncclSystemError;
}

/* ---- operations ---- */

enum { OP_ALLREDUCE, OP_BROADCAST, OP_REDUCE, OP_ALLGATHER, OP_REDUCESCATTER, OP_SEND, OP_RECV };
static const char *const k_op_names[] = {"AllReduce",     "Broadcast", "Reduce", "AllGather",
                                         "ReduceScatter", "Send",      "Recv"};

typedef struct {
  int kind;
  const void *sbuf;
  void *rbuf;
  size_t count;
  ncclDataType_t dt;
  ncclRedOp_t op;
  int root; /* or peer */
} fop_t;

typedef struct {
  fake_task_t t;
  ncclComm_t comm;
  int n;
  fop_t ops[];
} task_t;

static size_t type_size(ncclDataType_t t) {
  switch (t) {
    case ncclInt8:
    case ncclUint8: return 1;
    case ncclFloat16:
    case ncclBfloat16: return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32: return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64: return 8;
    default: return 0;
  }
}

/* ---- messages ---- */

static void post(ncclComm_t c, int dst, const void *buf, size_t bytes) {
  char path[PATH_MAX + 64];
  snprintf(path, sizeof path, "%s/m%d-%d-%llu", c->dir, c->rank, dst,
           (unsigned long long)c->sseq[dst]++);
  if (write_file(path, buf, bytes) != 0) {
    set_last("fake: rank %d cannot write %s: %s", c->rank, path, strerror(errno));
    atomic_store(&c->state, ncclSystemError);
  }
}

/* Receives the next message from src into buf (exactly `bytes`); -1 when aborted or wrong size. */
static int take(ncclComm_t c, int src, void *buf, size_t bytes) {
  char path[PATH_MAX + 64];
  snprintf(path, sizeof path, "%s/m%d-%d-%llu", c->dir, src, c->rank,
           (unsigned long long)c->rseq[src]++);
  size_t len = 0;
  char *data;
  for (unsigned i = 0; !(data = read_file(path, &len)); nap(&i))
    if (atomic_load(&c->aborted)) return -1;
  unlink(path);
  if (len != bytes) {
    set_last("fake: rank %d expected %zu bytes from rank %d, got %zu (mismatched calls)", c->rank,
             bytes, src, len);
    atomic_store(&c->state, ncclInvalidUsage);
    free(data);
    return -1;
  }
  if (bytes) memcpy(buf, data, bytes);
  free(data);
  return 0;
}

/* ---- reductions, element by element, in rank order ---- */

static float half_to_f(uint16_t h) {
  int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
  float v = e == 0    ? ldexpf((float)m, -24)
            : e == 31 ? (m ? NAN : INFINITY)
                      : ldexpf((float)(m | 1024), e - 25);
  return s ? -v : v;
}

static uint16_t f_to_half(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  uint32_t s = (x >> 16) & 0x8000;
  float a = fabsf(f);
  if (a != a) return (uint16_t)(s | 0x7e00);
  if (a >= 65520.0f) return (uint16_t)(s | 0x7c00);
  if (a < ldexpf(1, -14)) return (uint16_t)(s | (uint32_t)rintf(a * ldexpf(1, 24)));
  int e;
  float m = frexpf(a, &e);                     /* a = m * 2^e, m in [0.5, 1) */
  uint32_t q = (uint32_t)rintf(ldexpf(m, 11)); /* 11 significant bits, ties to even */
  if (q == 2048) {
    q = 1024;
    e++;
  }
  if (e + 14 >= 31) return (uint16_t)(s | 0x7c00);
  return (uint16_t)(s | (uint32_t)(e + 14) << 10 | (q - 1024));
}

static float bf_to_f(uint16_t b) {
  uint32_t x = (uint32_t)b << 16;
  float f;
  memcpy(&f, &x, 4);
  return f;
}

static uint16_t f_to_bf(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  if (f != f) return (uint16_t)((x >> 16) | 0x40);
  x += 0x7fff + ((x >> 16) & 1);
  return (uint16_t)(x >> 16);
}

static int is_float(ncclDataType_t t) {
  return t == ncclFloat16 || t == ncclBfloat16 || t == ncclFloat32 || t == ncclFloat64;
}
static int is_signed(ncclDataType_t t) { return t == ncclInt8 || t == ncclInt32 || t == ncclInt64; }

static double ld_f(const char *p, ncclDataType_t t, size_t i) {
  uint16_t h;
  switch (t) {
    case ncclFloat16: memcpy(&h, p + 2 * i, 2); return half_to_f(h);
    case ncclBfloat16: memcpy(&h, p + 2 * i, 2); return bf_to_f(h);
    case ncclFloat32: {
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

static void st_f(char *p, ncclDataType_t t, size_t i, double v) {
  uint16_t h;
  float f = (float)v;
  switch (t) {
    case ncclFloat16:
      h = f_to_half(f);
      memcpy(p + 2 * i, &h, 2);
      break;
    case ncclBfloat16:
      h = f_to_bf(f);
      memcpy(p + 2 * i, &h, 2);
      break;
    case ncclFloat32: memcpy(p + 4 * i, &f, 4); break;
    default: memcpy(p + 8 * i, &v, 8); break;
  }
}

static double in_precision(double v, ncclDataType_t t) {
  char tmp[8];
  st_f(tmp, t, 0, v);
  return ld_f(tmp, t, 0);
}

/* Integers as their two's-complement bits, sign-extended for signed types. */
static uint64_t ld_i(const char *p, ncclDataType_t t, size_t i) {
  switch (t) {
    case ncclInt8: return (uint64_t)(int64_t)((const int8_t *)p)[i];
    case ncclUint8: return ((const uint8_t *)p)[i];
    case ncclInt32: {
      int32_t v;
      memcpy(&v, p + 4 * i, 4);
      return (uint64_t)(int64_t)v;
    }
    case ncclUint32: {
      uint32_t v;
      memcpy(&v, p + 4 * i, 4);
      return v;
    }
    default: {
      uint64_t v;
      memcpy(&v, p + 8 * i, 8);
      return v;
    }
  }
}

static void st_i(char *p, ncclDataType_t t, size_t i, uint64_t v) {
  size_t es = type_size(t);
  if (es == 1)
    p[i] = (char)(uint8_t)v;
  else if (es == 4) {
    uint32_t w = (uint32_t)v;
    memcpy(p + 4 * i, &w, 4);
  } else
    memcpy(p + 8 * i, &v, 8);
}

/* Truncates to the type's width and sign-extends back (so compare/divide see the type's value). */
static uint64_t wrap(uint64_t v, ncclDataType_t t) {
  char tmp[8];
  st_i(tmp, t, 0, v);
  return ld_i(tmp, t, 0);
}

/* dst[i] = reduce over r of srcs[r][off + i], for i < count. NCCL's avg: floats pre-multiply by
 * 1/n and sum; integers sum then divide (truncating). */
static void reduce(char *dst, char *const *srcs, int n, size_t off, size_t count, ncclDataType_t t,
                   ncclRedOp_t op) {
  for (size_t i = 0; i < count; i++) {
    if (is_float(t)) {
      double acc = 0;
      for (int r = 0; r < n; r++) {
        double x = ld_f(srcs[r], t, off + i);
        if (op == ncclAvg) x *= 1.0 / n;
        if (r == 0)
          acc = x;
        else if (op == ncclSum || op == ncclAvg)
          acc += x;
        else if (op == ncclProd)
          acc *= x;
        else if (op == ncclMin)
          acc = x < acc ? x : acc;
        else
          acc = x > acc ? x : acc;
        acc = in_precision(acc, t); /* accumulate in the type's precision */
      }
      st_f(dst, t, i, acc);
    } else {
      uint64_t acc = 0;
      for (int r = 0; r < n; r++) {
        uint64_t x = ld_i(srcs[r], t, off + i);
        if (r == 0)
          acc = x;
        else if (op == ncclSum || op == ncclAvg)
          acc = wrap(acc + x, t);
        else if (op == ncclProd)
          acc = wrap(acc * x, t);
        else if (op == ncclMin)
          acc = is_signed(t) ? ((int64_t)x < (int64_t)acc ? x : acc) : (x < acc ? x : acc);
        else
          acc = is_signed(t) ? ((int64_t)x > (int64_t)acc ? x : acc) : (x > acc ? x : acc);
      }
      if (op == ncclAvg) acc = is_signed(t) ? (uint64_t)((int64_t)acc / n) : acc / (uint64_t)n;
      st_i(dst, t, i, acc);
    }
  }
}

/* Receives every other rank's `bytes` (ours copied from sbuf), in rank order; NULL when
 * aborted. */
static char **collect(ncclComm_t c, const void *sbuf, size_t bytes) {
  char **all = calloc((size_t)c->nranks, sizeof *all);
  for (int r = 0; all && r < c->nranks; r++) {
    all[r] = malloc(bytes ? bytes : 1);
    if (r == c->rank)
      memcpy(all[r], sbuf, bytes);
    else if (take(c, r, all[r], bytes) != 0) {
      for (int q = 0; q <= r; q++) free(all[q]);
      free(all);
      return NULL;
    }
  }
  return all;
}

/* Sends sbuf to every other rank, then collects theirs. */
static char **exchange(ncclComm_t c, const void *sbuf, size_t bytes) {
  for (int r = 0; r < c->nranks; r++)
    if (r != c->rank) post(c, r, sbuf, bytes);
  return collect(c, sbuf, bytes);
}

static void free_all(ncclComm_t c, char **all) {
  for (int r = 0; r < c->nranks; r++) free(all[r]);
  free(all);
}

/* Runs one op; -1 if the communicator was aborted or failed on the way. */
static int exec_op(ncclComm_t c, const fop_t *o) {
  size_t es = type_size(o->dt), bytes = o->count * es;
  int me = c->rank, n = c->nranks;
  char **all;
  switch (o->kind) {
    case OP_SEND: return 0; /* posted before everything else in the task */
    case OP_RECV: return take(c, o->root, o->rbuf, bytes);
    case OP_BROADCAST:
      if (me == o->root) {
        for (int r = 0; r < n; r++)
          if (r != me) post(c, r, o->sbuf, bytes);
        if (o->rbuf != o->sbuf) memmove(o->rbuf, o->sbuf, bytes);
        return 0;
      }
      return take(c, o->root, o->rbuf, bytes);
    case OP_REDUCE:
    case OP_ALLREDUCE:
    case OP_REDUCESCATTER: {
      size_t in_bytes = o->kind == OP_REDUCESCATTER ? bytes * (size_t)n : bytes;
      if (o->kind == OP_REDUCE && me != o->root) {
        post(c, o->root, o->sbuf, bytes);
        return 0;
      }
      if (!(all =
                o->kind == OP_REDUCE ? collect(c, o->sbuf, bytes) : exchange(c, o->sbuf, in_bytes)))
        return -1;
      size_t off = o->kind == OP_REDUCESCATTER ? (size_t)me * o->count : 0;
      reduce(o->rbuf, all, n, off, o->count, o->dt, o->op);
      free_all(c, all);
      return 0;
    }
    case OP_ALLGATHER:
      if (!(all = exchange(c, o->sbuf, bytes))) return -1;
      for (int r = 0; r < n; r++) memcpy((char *)o->rbuf + (size_t)r * bytes, all[r], bytes);
      free_all(c, all);
      return 0;
  }
  return -1;
}

static _Atomic long g_exec; /* operations (tasks) executed by this process */

static void hang(ncclComm_t c) {
  for (unsigned i = 0; !atomic_load(&c->aborted); nap(&i)) {
  }
}

static void task_body(task_t *k);

/* Counted as running before `aborted` is read: abort raises `aborted` before it reads the count,
 * so either the task sees the abort or the abort waits for the task. */
static void task_run(fake_task_t *t) {
  task_t *k = (task_t *)t;
  atomic_fetch_add(&k->comm->running, 1);
  task_body(k);
  atomic_fetch_sub(&k->comm->running, 1);
}

static void task_body(task_t *k) {
  ncclComm_t c = k->comm;
  long idx = atomic_fetch_add(&g_exec, 1) + 1;
  fake_count("tasks");
  if (atomic_load(&c->aborted) || atomic_load(&c->state) != ncclSuccess) return;
  if (env_long("TDIST_FAKE_NCCL_HANG_AT", -1) == idx) {
    fake_count("hangs");
    hang(c); /* like a kernel waiting for a peer that never comes */
    return;
  }
  if (env_long("TDIST_FAKE_NCCL_ERROR_AT", -1) == idx) {
    set_last(
        "fake: injected failure of operation %ld (%s) on rank %d: peer connection lost "
        "(TDIST_FAKE_NCCL_ERROR_AT)",
        idx, k_op_names[k->ops[0].kind], c->rank);
    atomic_store(&c->state, ncclRemoteError);
    hang(c); /* the kernel stays stuck until the communicator is aborted */
    return;
  }
  for (int i = 0; i < k->n; i++) /* sends first: they never block, the receives then drain */
    if (k->ops[i].kind == OP_SEND)
      post(c, k->ops[i].root, k->ops[i].sbuf, k->ops[i].count * type_size(k->ops[i].dt));
  for (int i = 0; i < k->n; i++)
    if (exec_op(c, &k->ops[i]) != 0) return;
}

static void task_free(fake_task_t *t) {
  task_t *k = (task_t *)t;
  comm_unref(k->comm);
  free(k);
}

/* ---- the NCCL calls: validated like NCCL_CHECK_POINTERS=1, queued on the stream ---- */

static __thread struct {
  int depth;
  ncclComm_t comm;
  cudaStream_t stream;
  fop_t *ops;
  int n, cap;
  ncclResult_t err;
} t_grp;

static ncclResult_t launch(ncclComm_t c, cudaStream_t s, const fop_t *ops, int n) {
  task_t *k = malloc(sizeof *k + (size_t)n * sizeof *ops);
  if (!k) return ncclSystemError;
  k->t.run = task_run;
  k->t.free = task_free;
  k->comm = c;
  k->n = n;
  memcpy(k->ops, ops, (size_t)n * sizeof *ops);
  atomic_fetch_add(&c->refs, 1);
  fake_enqueue(s, &k->t);
  return maybe_in_progress(c);
}

static ncclResult_t submit(const fop_t *o, ncclComm_t c, cudaStream_t s) {
  const char *name = k_op_names[o->kind];
  ncclResult_t r = ncclSuccess;
  if (!c || !s) {
    set_last("fake: %s: communicator or stream is NULL", name);
    r = ncclInvalidArgument;
  } else if (atomic_load(&c->aborted) || atomic_load(&c->state) != ncclSuccess) {
    set_last("fake: %s on a communicator that is %s", name,
             atomic_load(&c->aborted) ? "aborted" : "not ready or failed");
    r = ncclInvalidUsage;
  } else if (fake_stream_device(s) != c->dev) {
    set_last("fake: %s: stream of device %d with the communicator of device %d", name,
             fake_stream_device(s), c->dev);
    r = ncclInvalidUsage;
  } else if (!type_size(o->dt) || (unsigned)o->op >= (unsigned)ncclNumOps) {
    set_last("fake: %s: datatype %d / op %d not supported", name, (int)o->dt, (int)o->op);
    r = ncclInvalidArgument;
  } else if (o->root < 0 || o->root >= c->nranks) {
    set_last("fake: %s: root/peer %d out of range", name, o->root);
    r = ncclInvalidArgument;
  } else if (o->count && ((o->sbuf && !fake_is_device_ptr(o->sbuf)) ||
                          (o->rbuf && !fake_is_device_ptr(o->rbuf)))) {
    set_last("fake: %s: a buffer is not device memory", name);
    r = ncclInvalidArgument;
  }
  if (t_grp.depth == 0) return r != ncclSuccess ? r : launch(c, s, o, 1);
  if (r == ncclSuccess && t_grp.n && (t_grp.comm != c || t_grp.stream != s)) {
    set_last("fake: one communicator and stream per group only");
    r = ncclInvalidUsage;
  }
  if (r == ncclSuccess && t_grp.n == t_grp.cap) {
    int cap = t_grp.cap ? 2 * t_grp.cap : 16;
    fop_t *p = realloc(t_grp.ops, (size_t)cap * sizeof *p);
    if (!p)
      r = ncclSystemError;
    else {
      t_grp.ops = p;
      t_grp.cap = cap;
    }
  }
  if (r != ncclSuccess) {
    if (t_grp.err == ncclSuccess) t_grp.err = r;
    return r;
  }
  t_grp.comm = c;
  t_grp.stream = s;
  t_grp.ops[t_grp.n++] = *o;
  return ncclSuccess;
}

FAKE_API ncclResult_t ncclGroupStart(void) {
  t_grp.depth++;
  return ncclSuccess;
}

FAKE_API ncclResult_t ncclGroupEnd(void) {
  if (t_grp.depth == 0) return ncclInvalidUsage;
  if (--t_grp.depth > 0) return ncclSuccess;
  ncclResult_t r = t_grp.err;
  if (r == ncclSuccess && t_grp.n) {
    fake_count("groups");
    counter_set("last_group_ops", t_grp.n);
    r = launch(t_grp.comm, t_grp.stream, t_grp.ops, t_grp.n);
  }
  free(t_grp.ops);
  memset(&t_grp, 0, sizeof t_grp);
  return r;
}

FAKE_API ncclResult_t ncclAllReduce(const void *s, void *r, size_t n, ncclDataType_t t,
                                    ncclRedOp_t op, ncclComm_t c, cudaStream_t st) {
  fop_t o = {OP_ALLREDUCE, s, r, n, t, op, 0};
  return submit(&o, c, st);
}

FAKE_API ncclResult_t ncclBroadcast(const void *s, void *r, size_t n, ncclDataType_t t, int root,
                                    ncclComm_t c, cudaStream_t st) {
  fop_t o = {OP_BROADCAST, s, r, n, t, ncclSum, root};
  return submit(&o, c, st);
}

FAKE_API ncclResult_t ncclReduce(const void *s, void *r, size_t n, ncclDataType_t t, ncclRedOp_t op,
                                 int root, ncclComm_t c, cudaStream_t st) {
  fop_t o = {OP_REDUCE, s, r, n, t, op, root};
  return submit(&o, c, st);
}

FAKE_API ncclResult_t ncclAllGather(const void *s, void *r, size_t n, ncclDataType_t t,
                                    ncclComm_t c, cudaStream_t st) {
  fop_t o = {OP_ALLGATHER, s, r, n, t, ncclSum, 0};
  return submit(&o, c, st);
}

FAKE_API ncclResult_t ncclReduceScatter(const void *s, void *r, size_t n, ncclDataType_t t,
                                        ncclRedOp_t op, ncclComm_t c, cudaStream_t st) {
  fop_t o = {OP_REDUCESCATTER, s, r, n, t, op, 0};
  return submit(&o, c, st);
}

FAKE_API ncclResult_t ncclSend(const void *s, size_t n, ncclDataType_t t, int peer, ncclComm_t c,
                               cudaStream_t st) {
  fop_t o = {OP_SEND, s, NULL, n, t, ncclSum, peer};
  return submit(&o, c, st);
}

FAKE_API ncclResult_t ncclRecv(void *r, size_t n, ncclDataType_t t, int peer, ncclComm_t c,
                               cudaStream_t st) {
  fop_t o = {OP_RECV, NULL, r, n, t, ncclSum, peer};
  return submit(&o, c, st);
}
