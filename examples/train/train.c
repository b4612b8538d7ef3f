/* train: a small data-parallel training program written against libtdist, the C counterpart of a
 * PyTorch DistributedDataParallel script.
 *
 * Every rank generates its own shard of a synthetic regression problem from (seed, rank): the
 * true model comes from the seed alone, so all ranks learn the same thing from different data.
 * The group is created with init_method "env://", so the program runs under torchrun-style
 * environments (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, LOCAL_RANK; rank 0 hosts the store,
 * or with TORCHELASTIC_USE_AGENT_STORE=True the agent does). Rank 0's initial parameters are
 * broadcast (as DDP does), each step's gradient is averaged over ranks with all_reduce(AVG), and
 * rank 0 prints the global loss every few steps. At the end every rank all_gathers the parameter
 * vector and checks that it is bitwise identical on all ranks, and that the loss went down; the
 * exit status is 0 only if both hold.
 *
 * Backend: --backend, else TDIST_BACKEND (which tdist-agent exports), else gloo. With mpi the
 * ranks are MPI's (start them with mpirun; RANK etc. are not needed). With nccl every
 * collective runs on GPU memory of the group's device (tdist_pg_device): the values are copied
 * there with cudaMemcpy, reduced by NCCL and copied back, as a program whose model lived on the
 * GPU would skip doing. The model itself is computed on the CPU; the point is the wiring. The CUDA
 * runtime is opened with dlopen (TDIST_CUDART_LIBRARY, else libcudart.so.13/.12/.11), like
 * libtdist does, so this one binary also runs on CPU-only nodes.
 *
 * Exit status: 0 success, 1 a check failed, 2 bad usage, 3 the process group or a collective
 * failed (the message says which rank and why). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "tdist/tdist.h"

typedef enum { MODEL_LINEAR, MODEL_LOGISTIC } model_t;

typedef struct {
  int steps;
  double lr;
  int features;
  int samples; /* per rank */
  int batch;   /* per rank and step */
  uint64_t seed;
  int print_every;
  model_t model;
  int64_t timeout_ms;
  const char *backend; /* NULL: TDIST_BACKEND, else gloo */
  int crash_until_attempt;
  int check_fresh_store;
  int step_ms;        /* pause after each step (tests that act while training runs) */
  const char *events; /* NULL, or the file that gets "first_step ATTEMPT RANK UNIX_TIME" */
} opts_t;

static void usage(FILE *f) {
  fprintf(
      f,
      "usage: train [options]\n"
      "Data-parallel linear or logistic regression on synthetic data, one process per rank.\n"
      "Joins its process group with env:// and needs RANK, WORLD_SIZE, MASTER_ADDR and\n"
      "MASTER_PORT (LOCAL_RANK is reported; TORCHELASTIC_USE_AGENT_STORE=True joins an agent's\n"
      "store instead of hosting one on rank 0). examples/train/run_local.sh N starts N ranks.\n"
      "\n"
      "  --steps N          optimisation steps (default 200)\n"
      "  --lr X             learning rate of plain SGD (default 0.1)\n"
      "  --features N       input features (default 16)\n"
      "  --samples N        training samples generated per rank (default 1024)\n"
      "  --batch N          samples per rank and step (default 64); the global batch is\n"
      "                     N x WORLD_SIZE\n"
      "  --seed N           seed of the true model and, with the rank, of each rank's data\n"
      "                     (default 1)\n"
      "  --model M          linear (mean squared error, default) or logistic (cross-entropy)\n"
      "  --print-every N    rank 0 prints the loss every N steps (default 20; 0: only first/last)\n"
      "  --timeout-ms N     deadline of joining and of every collective (default 120000)\n"
      "  --backend B        gloo (host memory), nccl (GPU memory of device LOCAL_RANK, through\n"
      "                     NCCL; the CUDA runtime is loaded at run time) or mpi (the machine's\n"
      "                     MPI through libtdist-mpi.so: start the ranks with mpirun; rank and\n"
      "                     world size are MPI's, env:// is not used); default: the\n"
      "                     TDIST_BACKEND variable (tdist-agent sets it), else gloo\n"
      "  --crash-until-attempt N  (restart tests) while TORCHELASTIC_RESTART_COUNT < N, one\n"
      "                     rank dies at one step, both picked from --seed and the attempt;\n"
      "                     the way cycles through exit(1), SIGKILL and abort()\n"
      "  --check-fresh-store  (attempt-isolation tests) before joining, add 1 to a key in the\n"
      "                     launcher's store (MASTER_ADDR/MASTER_PORT, no prefix) and exit 4 if\n"
      "                     the count exceeds WORLD_SIZE: the store kept an earlier\n"
      "                     attempt's keys\n"
      "  --step-ms N        (tests) sleep N ms after every step, so that a test can act while\n"
      "                     the job trains (default 0)\n"
      "  --events FILE      (benchmarks) append \"first_step ATTEMPT RANK UNIX_TIME\" to FILE\n"
      "                     once step 1's gradients are reduced (ATTEMPT:\n"
      "                     TORCHELASTIC_RESTART_COUNT, UNIX_TIME: seconds, to microseconds)\n"
      "  --help             this text\n"
      "\n"
      "At the end every rank checks that the parameters are bitwise identical on all ranks\n"
      "(all_gather) and that the loss decreased; the exit status is 0 only if both hold\n"
      "(1: a check failed, 2: bad usage, 3: the process group failed, 4: --check-fresh-store\n"
      "found an earlier attempt's keys).\n");
}

static int parse_int(const char *s, long lo, long hi, long *out) {
  char *end;
  long v = strtol(s, &end, 10);
  if (!*s || *end || v < lo || v > hi) return -1;
  *out = v;
  return 0;
}

static int parse_opts(int argc, char **argv, opts_t *o) {
  *o = (opts_t){200, 0.1, 16, 1024, 64, 1, 20, MODEL_LINEAR, 120000, NULL, 0, 0, 0, NULL};
  for (int i = 1; i < argc; i++) {
    const char *k = argv[i];
    if (!strcmp(k, "--help") || !strcmp(k, "-h")) {
      usage(stdout);
      exit(0);
    }
    if (!strcmp(k, "--check-fresh-store")) {
      o->check_fresh_store = 1;
      continue;
    }
    if (i + 1 >= argc) {
      fprintf(stderr, "train: %s needs a value (see --help)\n", k);
      return -1;
    }
    const char *v = argv[++i];
    long n;
    if (!strcmp(k, "--steps")) {
      if (parse_int(v, 1, 100000000, &n)) goto bad;
      o->steps = (int)n;
    } else if (!strcmp(k, "--lr")) {
      char *end;
      o->lr = strtod(v, &end);
      if (!*v || *end || !isfinite(o->lr) || o->lr < 0) goto bad;
    } else if (!strcmp(k, "--features")) {
      if (parse_int(v, 1, 1 << 20, &n)) goto bad;
      o->features = (int)n;
    } else if (!strcmp(k, "--samples")) {
      if (parse_int(v, 1, 1 << 24, &n)) goto bad;
      o->samples = (int)n;
    } else if (!strcmp(k, "--batch")) {
      if (parse_int(v, 1, 1 << 24, &n)) goto bad;
      o->batch = (int)n;
    } else if (!strcmp(k, "--seed")) {
      if (parse_int(v, 0, INT64_MAX > 0x7fffffffL ? 0x7fffffffL : 0x7fffffffL, &n)) goto bad;
      o->seed = (uint64_t)n;
    } else if (!strcmp(k, "--print-every")) {
      if (parse_int(v, 0, 100000000, &n)) goto bad;
      o->print_every = (int)n;
    } else if (!strcmp(k, "--model")) {
      if (!strcmp(v, "linear"))
        o->model = MODEL_LINEAR;
      else if (!strcmp(v, "logistic"))
        o->model = MODEL_LOGISTIC;
      else
        goto bad;
    } else if (!strcmp(k, "--timeout-ms")) {
      if (parse_int(v, 1, 86400000L, &n)) goto bad;
      o->timeout_ms = n;
    } else if (!strcmp(k, "--step-ms")) {
      if (parse_int(v, 0, 60000, &n)) goto bad;
      o->step_ms = (int)n;
    } else if (!strcmp(k, "--crash-until-attempt")) {
      if (parse_int(v, 0, 1000000, &n)) goto bad;
      o->crash_until_attempt = (int)n;
    } else if (!strcmp(k, "--events")) {
      if (!*v) goto bad;
      o->events = v;
    } else if (!strcmp(k, "--backend")) {
      if (strcmp(v, "gloo") && strcmp(v, "nccl") && strcmp(v, "mpi")) goto bad;
      o->backend = v;
    } else {
      fprintf(stderr, "train: unknown option %s (see --help)\n", k);
      return -1;
    }
    continue;
  bad:
    fprintf(stderr, "train: bad value '%s' for %s (see --help)\n", v, k);
    return -1;
  }
  if (o->batch > o->samples) o->batch = o->samples;
  if (!o->backend) {
    const char *e = getenv("TDIST_BACKEND");
    o->backend = e && *e ? e : "gloo";
    if (strcmp(o->backend, "gloo") && strcmp(o->backend, "nccl") && strcmp(o->backend, "mpi")) {
      fprintf(stderr, "train: TDIST_BACKEND='%s' is not gloo, nccl or mpi\n", o->backend);
      return -1;
    }
  }
  return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* Collectives on host memory (gloo) or staged through GPU memory (nccl)                      */

/* The few CUDA runtime calls used here, with the runtime's C ABI (cudaError_t is an int enum,
 * 0 = success), so that no CUDA header is needed to build this example. */
enum { CUDA_H2D = 1, CUDA_D2H = 2 };
typedef struct {
  int on; /* 0: gloo, host buffers used directly */
  int rank;
  int (*set_device)(int);
  int (*malloc_)(void **, size_t);
  int (*free_)(void *);
  int (*memcpy_)(void *, const void *, size_t, int);
  const char *(*error_string)(int);
  char *buf; /* device scratch for the largest collective */
} gpu_t;

static void cuda_die(const gpu_t *dv, const char *what, int e) {
  fprintf(stderr, "train: rank %d: %s failed: %s (cudaError %d)\n", dv->rank, what,
          dv->error_string ? dv->error_string(e) : "?", e);
  exit(3);
}

/* Opens the CUDA runtime, selects the group's device and allocates `bytes` there. */
static int dev_open(gpu_t *dv, tdist_pg_t *pg, size_t bytes) {
  const char *names[] = {getenv("TDIST_CUDART_LIBRARY"), "libcudart.so.13", "libcudart.so.12",
                         "libcudart.so.11"};
  void *h = NULL;
  for (size_t i = 0; i < sizeof names / sizeof *names && !h; i++)
    if (names[i] && *names[i]) {
      h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
      if (i == 0 && !h) break; /* an explicit path that fails is not silently replaced */
    }
  if (!h) {
    fprintf(stderr, "train: rank %d: cannot load the CUDA runtime: %s\n", dv->rank, dlerror());
    return -1;
  }
  *(void **)&dv->set_device = dlsym(h, "cudaSetDevice");
  *(void **)&dv->malloc_ = dlsym(h, "cudaMalloc");
  *(void **)&dv->free_ = dlsym(h, "cudaFree");
  *(void **)&dv->memcpy_ = dlsym(h, "cudaMemcpy");
  *(void **)&dv->error_string = dlsym(h, "cudaGetErrorString");
  if (!dv->set_device || !dv->malloc_ || !dv->free_ || !dv->memcpy_) {
    fprintf(stderr,
            "train: rank %d: the CUDA runtime lacks cudaSetDevice/cudaMalloc/cudaFree/"
            "cudaMemcpy\n",
            dv->rank);
    return -1;
  }
  int e, dev = tdist_pg_device(pg);
  if ((e = dv->set_device(dev))) cuda_die(dv, "cudaSetDevice", e);
  if ((e = dv->malloc_((void **)&dv->buf, bytes))) cuda_die(dv, "cudaMalloc", e);
  dv->on = 1;
  return 0;
}

static void h2d(const gpu_t *dv, void *d, const void *h, size_t n) {
  int e = dv->memcpy_(d, h, n, CUDA_H2D);
  if (e) cuda_die(dv, "cudaMemcpy to the device", e);
}
static void d2h(const gpu_t *dv, void *h, const void *d, size_t n) {
  int e = dv->memcpy_(h, d, n, CUDA_D2H);
  if (e) cuda_die(dv, "cudaMemcpy from the device", e);
}

/* The buffer a collective works on in place: x itself on gloo; on nccl, x's copy in device
 * memory. Blocking nccl calls return once NCCL's kernels are done, and the group's stream is
 * ordered after the legacy default stream that cudaMemcpy uses: no further synchronisation. */
static void *stage_in(const gpu_t *dv, void *x, size_t bytes) {
  if (!dv->on) return x;
  h2d(dv, dv->buf, x, bytes);
  return dv->buf;
}
/* Copies the result back to x after a successful collective on nccl; returns st. */
static tdist_status_t stage_out(const gpu_t *dv, void *x, size_t bytes, tdist_status_t st) {
  if (dv->on && !st) d2h(dv, x, dv->buf, bytes);
  return st;
}

static tdist_status_t all_reduce(tdist_pg_t *pg, const gpu_t *dv, void *x, size_t n,
                                 tdist_dtype_t dt, tdist_reduce_op_t op) {
  size_t b = n * tdist_dtype_size(dt);
  return stage_out(dv, x, b, tdist_all_reduce(pg, stage_in(dv, x, b), n, dt, op));
}

static tdist_status_t broadcast(tdist_pg_t *pg, const gpu_t *dv, void *x, size_t n,
                                tdist_dtype_t dt, int root) {
  size_t b = n * tdist_dtype_size(dt);
  return stage_out(dv, x, b, tdist_broadcast(pg, stage_in(dv, x, b), n, dt, root));
}

/* out: n x world elements; the device copy of `in` sits after them in the scratch buffer. */
static tdist_status_t all_gather(tdist_pg_t *pg, const gpu_t *dv, void *out, const void *in,
                                 size_t n, tdist_dtype_t dt, int world) {
  if (!dv->on) return tdist_all_gather(pg, out, in, n, dt);
  size_t b = n * tdist_dtype_size(dt), ob = b * (size_t)world;
  h2d(dv, dv->buf + ob, in, b);
  tdist_status_t st = tdist_all_gather(pg, dv->buf, dv->buf + ob, n, dt);
  if (!st) d2h(dv, out, dv->buf, ob);
  return st;
}

/* ---------------------------------------------------------------------------------------- */
/* Synthetic data                                                                            */

/* splitmix64: small, seedable, and the same on every platform. */
static uint64_t next_u64(uint64_t *s) {
  uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

static double uniform(uint64_t *s) { return (double)(next_u64(s) >> 11) * 0x1.0p-53; }

static double gaussian(uint64_t *s) {
  double u = uniform(s), v = uniform(s);
  return sqrt(-2.0 * log(u > 0 ? u : 0x1.0p-53)) * cos(2.0 * M_PI * v);
}

typedef struct {
  int n, d;
  float *x; /* n x d, row major */
  float *y; /* n */
} shard_t;

/* The true model depends on the seed only; inputs and noise on (seed, rank). */
static int make_shard(const opts_t *o, int rank, shard_t *sh) {
  int d = o->features, n = o->samples;
  double *w = malloc(sizeof(double) * (size_t)(d + 1));
  sh->n = n, sh->d = d;
  sh->x = malloc(sizeof(float) * (size_t)n * (size_t)d);
  sh->y = malloc(sizeof(float) * (size_t)n);
  if (!w || !sh->x || !sh->y) {
    free(w);
    return -1;
  }
  uint64_t s = o->seed * 0x2545F4914F6CDD1Dull + 7;
  for (int j = 0; j <= d; j++) w[j] = gaussian(&s); /* w[d] is the bias */
  s = o->seed * 0x2545F4914F6CDD1Dull ^ ((uint64_t)rank + 1) * 0x9E3779B97F4A7C15ull;
  for (int i = 0; i < n; i++) {
    double z = w[d];
    for (int j = 0; j < d; j++) {
      float xv = (float)gaussian(&s);
      sh->x[(size_t)i * (size_t)d + (size_t)j] = xv;
      z += w[j] * xv;
    }
    z += 0.1 * gaussian(&s);
    sh->y[i] = o->model == MODEL_LINEAR ? (float)z : (float)(z > 0);
  }
  free(w);
  return 0;
}

/* Loss and (when grad != NULL) its gradient over samples [first, first + count) (wrapping), as
 * means over those samples. Parameters: p[0..d-1] weights, p[d] bias. */
static double loss_grad(const opts_t *o, const shard_t *sh, const float *p, int first, int count,
                        double *grad) {
  int d = sh->d;
  double loss = 0;
  if (grad) memset(grad, 0, sizeof(double) * (size_t)(d + 1));
  for (int k = 0; k < count; k++) {
    int i = (first + k) % sh->n;
    const float *xi = sh->x + (size_t)i * (size_t)d;
    double z = p[d];
    for (int j = 0; j < d; j++) z += (double)p[j] * xi[j];
    double dz;
    if (o->model == MODEL_LINEAR) {
      double e = z - sh->y[i];
      loss += e * e;
      dz = 2 * e;
    } else {
      /* log(1 + e^z) - y z, computed without overflow */
      loss += (z > 0 ? z + log1p(exp(-z)) : log1p(exp(z))) - sh->y[i] * z;
      dz = 1 / (1 + exp(-z)) - sh->y[i];
    }
    if (grad) {
      for (int j = 0; j < d; j++) grad[j] += dz * xi[j];
      grad[d] += dz;
    }
  }
  if (grad)
    for (int j = 0; j <= d; j++) grad[j] /= count;
  return loss / count;
}

/* ---------------------------------------------------------------------------------------- */
/* Restart and attempt-isolation tests */

static int restart_count(void) {
  const char *v = getenv("TORCHELASTIC_RESTART_COUNT");
  return v && *v ? atoi(v) : 0;
}

/* The step at which this rank dies on this attempt (0: it does not). */
static int crash_step(const opts_t *o, int rank, int world) {
  int attempt = restart_count();
  if (attempt >= o->crash_until_attempt) return 0;
  uint64_t s = o->seed * 0x9E3779B97F4A7C15ull + (uint64_t)attempt * 0xBF58476D1CE4E5B9ull + 1;
  int victim = (int)(next_u64(&s) % (uint64_t)world);
  int step = 1 + (int)(next_u64(&s) % (uint64_t)(o->steps > 1 ? o->steps - 1 : 1));
  if (rank != victim) return 0;
  fprintf(stderr, "train: rank %d: attempt %d will crash at step %d\n", rank, attempt, step);
  return step;
}

static void crash(int rank, int step) {
  int how = restart_count() % 3;
  static const char *const ways[] = {"exit(1)", "SIGKILL", "abort()"};
  fprintf(stderr, "train: rank %d: crashing at step %d on attempt %d (%s)\n", rank, step,
          restart_count(), ways[how]);
  if (how == 0) _exit(1);
  if (how == 1) raise(SIGKILL);
  abort();
}

/* Appends "EVENT ATTEMPT RANK UNIX_TIME" to the --events file, in one write so that the lines
 * of concurrent ranks never interleave. A failure is reported, not fatal: timing is a side
 * channel. */
static void event(const char *path, const char *what, int rank) {
  if (!path) return;
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  char line[96];
  int n = snprintf(line, sizeof line, "%s %d %d %lld.%06ld\n", what, restart_count(), rank,
                   (long long)ts.tv_sec, ts.tv_nsec / 1000);
  int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0 || write(fd, line, (size_t)n) != n)
    fprintf(stderr, "train: rank %d: --events %s: %s\n", rank, path, strerror(errno));
  if (fd >= 0) close(fd);
}

/* 0 if the launcher's store counted no more rank starts than the world has ranks. */
static int check_fresh_store(void) {
  const char *addr = getenv("MASTER_ADDR"), *port = getenv("MASTER_PORT");
  const char *ws = getenv("WORLD_SIZE");
  if (!addr || !port || !ws) {
    fprintf(stderr, "train: --check-fresh-store needs MASTER_ADDR, MASTER_PORT and WORLD_SIZE\n");
    return 2;
  }
  tdist_tcp_store_options_t so = TDIST_TCP_STORE_OPTIONS_INIT;
  so.host = addr;
  so.port = atoi(port);
  tdist_store_t *s = NULL;
  int64_t n = 0;
  tdist_status_t st = tdist_tcp_store_connect(&so, &s);
  if (!st) st = tdist_store_add(s, "tdist_test/ranks_started", 1, &n);
  if (st) {
    fprintf(stderr, "train: --check-fresh-store: store %s:%s: %s: %s\n", addr, port,
            tdist_strerror(st), s ? tdist_store_last_error(s) : tdist_last_error());
    tdist_store_destroy(s);
    return 3;
  }
  tdist_store_destroy(s);
  if (n > atoi(ws)) {
    fprintf(stderr,
            "train: the store already counted %lld rank start(s) of a world of %s: it "
            "holds keys of an earlier attempt\n",
            (long long)n - 1, ws);
    return 4;
  }
  return 0;
}

/* Reports a failed collective; returns the exit status (main then frees and leaves). */
static int pg_failed(tdist_pg_t *pg, int rank, const char *what, tdist_status_t st) {
  fprintf(stderr, "train: rank %d: %s failed: %s: %s\n", rank, what, tdist_strerror(st),
          tdist_pg_last_error(pg));
  return 3;
}

/* Global mean loss over every rank's full shard. */
static tdist_status_t global_loss(tdist_pg_t *pg, const gpu_t *dv, const opts_t *o,
                                  const shard_t *sh, const float *p, double *out) {
  *out = loss_grad(o, sh, p, 0, sh->n, NULL);
  return all_reduce(pg, dv, out, 1, TDIST_FLOAT64, TDIST_AVG);
}

int main(int argc, char **argv) {
  opts_t o;
  setvbuf(stdout, NULL, _IOLBF, 0); /* progress lines in order with stderr when piped */
  if (parse_opts(argc, argv, &o)) return 2;
  if (o.check_fresh_store) {
    int rc = check_fresh_store();
    if (rc) return rc;
  }

  tdist_pg_options_t po = TDIST_PG_OPTIONS_INIT;
  po.init_method = strcmp(o.backend, "mpi") ? "env://" : NULL; /* mpi: MPI_COMM_WORLD */
  po.backend = o.backend;
  po.timeout_ms = o.timeout_ms;
  tdist_pg_t *pg = NULL;
  tdist_status_t st = tdist_init_process_group(&po, &pg);
  if (st) {
    fprintf(stderr, "train: init_process_group(%s%s) failed: %s: %s\n", o.backend,
            po.init_method ? ", env://" : "", tdist_strerror(st), tdist_last_error());
    return 3;
  }
  int rank = tdist_pg_rank(pg), world = tdist_pg_size(pg);
  const char *local_rank = getenv("LOCAL_RANK");
  int d = o.features, np = d + 1;
  gpu_t dv = {.rank = rank};
  /* The largest collective: the all_gather of the parameters, its input after its output. */
  if (!strcmp(o.backend, "nccl") &&
      dev_open(&dv, pg, sizeof(float) * (size_t)np * ((size_t)world + 1) + 64)) {
    tdist_pg_destroy(pg);
    return 3;
  }
  char where[48] = "";
  if (dv.on) snprintf(where, sizeof where, ", buffers on GPU %d", tdist_pg_device(pg));
  if (rank == 0)
    printf(
        "train: %d ranks (%s backend%s), %s regression, %d features, %d samples and batch %d "
        "per rank, lr %g, %d steps, seed %llu\n",
        world, tdist_pg_backend(pg), where, o.model == MODEL_LINEAR ? "linear" : "logistic",
        o.features, o.samples, o.batch, o.lr, o.steps, (unsigned long long)o.seed);
  fprintf(stderr, "train: rank %d of %d joined (LOCAL_RANK %s, pid %d)\n", rank, world,
          local_rank && *local_rank ? local_rank : "unset", (int)getpid());

  shard_t sh = {0};
  int rc = 0;
  double loss0 = 0, loss1 = 0;
  float *p = calloc((size_t)np, sizeof *p), *g = calloc((size_t)np, sizeof *g);
  float *all = calloc((size_t)np * (size_t)world, sizeof *all);
  double *gd = calloc((size_t)np, sizeof *gd);
  if (!p || !g || !all || !gd || make_shard(&o, rank, &sh)) {
    fprintf(stderr, "train: rank %d: out of memory\n", rank);
    rc = 3;
    goto done;
  }
  /* Each rank starts from its own random parameters; the broadcast makes rank 0's everyone's,
   * as DDP does at construction. */
  uint64_t s = o.seed ^ (0xD1B54A32D192ED03ull * ((uint64_t)rank + 1));
  for (int j = 0; j < np; j++) p[j] = (float)(0.1 * gaussian(&s));
  if ((st = broadcast(pg, &dv, p, (size_t)np, TDIST_FLOAT32, 0))) {
    rc = pg_failed(pg, rank, "broadcast of the initial parameters", st);
    goto done;
  }

  if ((st = global_loss(pg, &dv, &o, &sh, p, &loss0))) {
    rc = pg_failed(pg, rank, "all_reduce", st);
    goto done;
  }
  if (rank == 0) printf("step %6d  loss %.6f\n", 0, loss0);

  int die_at = crash_step(&o, rank, world);
  for (int step = 1; step <= o.steps; step++) {
    if (step == die_at) crash(rank, step);
    double batch_loss =
        loss_grad(&o, &sh, p, (int)(((long long)(step - 1) * o.batch) % sh.n), o.batch, gd);
    for (int j = 0; j < np; j++) g[j] = (float)gd[j];
    /* Every rank holds the same averaged gradient afterwards (bitwise: the library reduces
     * each element in one order), so the updates below keep the replicas identical. */
    if ((st = all_reduce(pg, &dv, g, (size_t)np, TDIST_FLOAT32, TDIST_AVG))) {
      rc = pg_failed(pg, rank, "all_reduce of the gradients", st);
      goto done;
    }
    if (step == 1) event(o.events, "first_step", rank);
    for (int j = 0; j < np; j++) p[j] -= (float)o.lr * g[j];
    int show = step == o.steps || (o.print_every > 0 && step % o.print_every == 0);
    if (show) {
      if ((st = all_reduce(pg, &dv, &batch_loss, 1, TDIST_FLOAT64, TDIST_AVG))) {
        rc = pg_failed(pg, rank, "all_reduce of the loss", st);
        goto done;
      }
      if (rank == 0)
        printf("step %6d  loss %.6f (global batch of %d)\n", step, batch_loss, o.batch * world);
      fflush(stdout);
    }
    if (o.step_ms) {
      struct timespec ts = {o.step_ms / 1000, (long)(o.step_ms % 1000) * 1000000L};
      nanosleep(&ts, NULL);
    }
  }

  if ((st = global_loss(pg, &dv, &o, &sh, p, &loss1))) {
    rc = pg_failed(pg, rank, "all_reduce", st);
    goto done;
  }
  if ((st = all_gather(pg, &dv, all, p, (size_t)np, TDIST_FLOAT32, world))) {
    rc = pg_failed(pg, rank, "all_gather of the parameters", st);
    goto done;
  }
  for (int r = 0; r < world; r++) {
    if (memcmp(all + (size_t)r * (size_t)np, p, sizeof(float) * (size_t)np) != 0) {
      int j = 0;
      while (all[(size_t)r * (size_t)np + (size_t)j] == p[j]) j++;
      fprintf(stderr,
              "train: rank %d: parameters differ from rank %d's (first at index %d: "
              "%.9g here, %.9g there)\n",
              rank, r, j, (double)p[j], (double)all[(size_t)r * (size_t)np + (size_t)j]);
      rc = 1;
    }
  }
  if (!(loss1 < loss0)) {
    fprintf(stderr,
            "train: rank %d: the loss did not decrease (%.6f -> %.6f); try a smaller "
            "--lr or more --steps\n",
            rank, loss0, loss1);
    rc = 1;
  }
  /* Agree on the outcome so every rank exits the same way, then leave together. */
  int64_t bad = rc;
  if ((st = all_reduce(pg, &dv, &bad, 1, TDIST_INT64, TDIST_MAX))) {
    rc = pg_failed(pg, rank, "all_reduce of the result", st);
    goto done;
  }
  if (bad && !rc) fprintf(stderr, "train: rank %d: another rank's check failed\n", rank);
  if (bad) rc = 1;
  if (rank == 0 && !rc)
    printf(
        "train: OK: loss %.6f -> %.6f; parameters bitwise identical on all %d ranks "
        "(attempt %d)\n",
        loss0, loss1, world, restart_count());
  if ((st = tdist_barrier(pg))) {
    rc = pg_failed(pg, rank, "final barrier", st);
    goto done;
  }
  if ((st = tdist_pg_finalize(pg)) && !rc) {
    fprintf(stderr, "train: rank %d: finalize: %s\n", rank, tdist_pg_last_error(pg));
    rc = 3;
  }
done:
  tdist_pg_destroy(pg);
  if (dv.on) dv.free_(dv.buf);
  free(sh.x);
  free(sh.y);
  free(p);
  free(g);
  free(all);
  free(gd);
  return rc;
}
