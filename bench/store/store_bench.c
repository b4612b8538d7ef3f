/* store_bench: ops/s of our TCPStore server against PyTorch 1.13's, in the same run.
 *
 * Both servers are driven by the same client code (our C client, one blocking connection per
 * client thread), the same keys and the same value sizes, so the ratio column compares servers,
 * not clients. Operations:
 *   set   SET of a value-bytes value, each client cycling over 16 keys of its own; SET has
 *         no reply, so each batch of --set-batch SETs is confirmed by a CHECK and counted then
 *   get   tdist_store_get = WAIT + GET (two round trips, as every real client does)
 *   add   ADD +1 on the client's own counter (the reply is checked to be the previous + 1)
 *   wait  K clients WAIT on a fresh key, one extra connection SETs it once all K were woken by
 *         the previous key; reported as wakeups/s (K per round). A WAIT that reaches the server
 *         after its SET is answered at once, the same for both servers.
 * Each cell opens fresh connections (only its own clients: an idle connection costs torch's
 * poll() loop but not our epoll one), runs a warm-up, then counts operations completed during a
 * fixed duration. Server CPU per operation comes from the server thread's (or process's) CPU
 * clock over the same window, client CPU from this process's clock minus the server's, and the
 * CPU other processes took from /proc/stat, so a noisy machine shows in the table.
 * This is a benchmark that prints a table: it asserts nothing about speed. */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "servers.h"
#include "tdist/tdist.h"

#define MAX_CLIENT_COUNTS 16
#define KEYS_PER_CLIENT 16
#define MAX_REPEAT 15

typedef enum { OP_SET = 0, OP_GET, OP_ADD, OP_WAIT, OP_COUNT } op_t;
static const char *const op_names[OP_COUNT] = {"set", "get", "add", "wait"};

typedef struct {
  unsigned ops_mask;
  int clients[MAX_CLIENT_COUNTS];
  int nclients;
  int duration_ms;
  int warmup_ms;
  size_t value_bytes;
  int use_server[2]; /* indexed by bench_server_kind_t */
  const char *tdist_store_path;
  const char *python;
  tdist_store_dialect_t dialect;
  int repeat;
  int64_t timeout_ms;
  int set_batch;
} options_t;

/* One measured cell. */
typedef struct {
  int ok;
  double ops_per_s;
  double srv_us_per_op; /* < 0: unknown */
  double srv_util;      /* server CPU seconds per wall second; < 0: unknown */
  double other_util;    /* CPU of every other process on the machine, cores; < 0: unknown */
  double cli_us_per_op; /* client threads' CPU per op (this process minus the server thread) */
  char err[256];
} result_t;

struct run_s;

typedef struct {
  _Alignas(64) _Atomic uint64_t ops; /* written by its thread only; read by main */
  struct run_s *run;
  tdist_store_t *store;
  int index;
  pthread_t thread;
} worker_t;

typedef struct run_s {
  op_t op;
  int clients;
  const options_t *opt;
  const unsigned char *value;
  unsigned run_id;
  _Atomic int stop;
  _Atomic int failed;
  char err[256];
  pthread_mutex_t err_mu;
  pthread_barrier_t start;
  /* wait-wake */
  _Atomic uint64_t woken;
  pthread_mutex_t mu;
  pthread_cond_t cv;
} run_t;

static void fail(run_t *run, tdist_store_t *s, const char *what, tdist_status_t st) {
  pthread_mutex_lock(&run->err_mu);
  if (!atomic_load(&run->failed)) {
    snprintf(run->err, sizeof(run->err), "%s: %s (%s)", what, tdist_strerror(st),
             s ? tdist_store_last_error(s) : "");
    atomic_store(&run->failed, 1);
  }
  pthread_mutex_unlock(&run->err_mu);
  atomic_store(&run->stop, 1);
  pthread_mutex_lock(&run->mu);
  pthread_cond_broadcast(&run->cv);
  pthread_mutex_unlock(&run->mu);
}

static void publish(worker_t *w, uint64_t n) {
  atomic_store_explicit(&w->ops, n, memory_order_relaxed);
}

static int stopping(run_t *run) { return atomic_load_explicit(&run->stop, memory_order_relaxed); }

static void wait_start(run_t *run) { pthread_barrier_wait(&run->start); }

static void client_keys(char keys[KEYS_PER_CLIENT][64], const run_t *run, int index) {
  for (int i = 0; i < KEYS_PER_CLIENT; i++)
    snprintf(keys[i], 64, "bench/%s/%u/c%d/k%d", op_names[run->op], run->run_id, index, i);
}

/* A SET has no reply, so a bare loop of SETs would measure how fast the client fills socket
 * buffers. Every set_batch SETs end with a CHECK of the last key: replies come in order, so when
 * it answers READY the server has executed the whole batch, and only then does it count. */
static void run_set(worker_t *w) {
  run_t *run = w->run;
  char keys[KEYS_PER_CLIENT][64];
  client_keys(keys, run, w->index);
  wait_start(run);
  const int batch = run->opt->set_batch;
  uint64_t n = 0;
  while (!stopping(run)) {
    const char *last = NULL;
    for (int i = 0; i < batch; i++) {
      last = keys[(n + (uint64_t)i) % KEYS_PER_CLIENT];
      tdist_status_t st = tdist_store_set(w->store, last, run->value, run->opt->value_bytes);
      if (st != TDIST_OK) {
        fail(run, w->store, "set", st);
        return;
      }
    }
    int ready = 0;
    tdist_status_t st = tdist_store_check(w->store, &last, 1, &ready);
    if (st != TDIST_OK || !ready) {
      fail(run, w->store, ready ? "set: check" : "set: key missing after set",
           st != TDIST_OK ? st : TDIST_ERR_INTERNAL);
      return;
    }
    n += (uint64_t)batch;
    publish(w, n);
  }
}

static void run_get(worker_t *w) {
  run_t *run = w->run;
  char keys[KEYS_PER_CLIENT][64];
  client_keys(keys, run, w->index);
  tdist_status_t st = TDIST_OK;
  for (int i = 0; i < KEYS_PER_CLIENT && st == TDIST_OK; i++)
    st = tdist_store_set(w->store, keys[i], run->value, run->opt->value_bytes);
  wait_start(run);
  if (st != TDIST_OK) {
    fail(run, w->store, "get: populating", st);
    return;
  }
  uint64_t n = 0;
  while (!stopping(run)) {
    void *v = NULL;
    size_t len = 0;
    st = tdist_store_get(w->store, keys[n % KEYS_PER_CLIENT], &v, &len);
    if (st != TDIST_OK) {
      fail(run, w->store, "get", st);
      return;
    }
    int same = len == run->opt->value_bytes && memcmp(v, run->value, len) == 0;
    tdist_free(v);
    if (!same) {
      fail(run, w->store, "get returned a different value", TDIST_ERR_INTERNAL);
      return;
    }
    publish(w, ++n);
  }
}

static void run_add(worker_t *w) {
  run_t *run = w->run;
  char keys[KEYS_PER_CLIENT][64];
  client_keys(keys, run, w->index);
  int64_t last = 0;
  tdist_status_t st = tdist_store_add(w->store, keys[0], 0, &last);
  wait_start(run);
  if (st != TDIST_OK) {
    fail(run, w->store, "add: first add", st);
    return;
  }
  uint64_t n = 0;
  while (!stopping(run)) {
    int64_t now = 0;
    st = tdist_store_add(w->store, keys[0], 1, &now);
    if (st != TDIST_OK) {
      fail(run, w->store, "add", st);
      return;
    }
    if (now != last + 1) {
      fail(run, w->store, "add: wrong total", TDIST_ERR_INTERNAL);
      return;
    }
    last = now;
    publish(w, ++n);
  }
}

static void round_key(char *key, size_t cap, const run_t *run, uint64_t round) {
  snprintf(key, cap, "bench/wait/%u/r%" PRIu64, run->run_id, round);
}

/* Waiters 0..K-1 wait for round r's key; after the K-th wakeup of a round the setter (index K)
 * sets round r+1's key. A waiter is therefore in round r or r+1, and the setter's last SET of
 * round r+1 on the way out releases everyone. */
static void run_waiter(worker_t *w) {
  run_t *run = w->run;
  const uint64_t k = (uint64_t)run->clients;
  wait_start(run);
  uint64_t n = 0;
  for (uint64_t r = 0; !stopping(run); r++) {
    char key[64];
    round_key(key, sizeof(key), run, r);
    const char *keys[1] = {key};
    tdist_status_t st = tdist_store_wait(w->store, keys, 1, -1);
    if (st != TDIST_OK) {
      fail(run, w->store, "wait", st);
      return;
    }
    uint64_t woken = atomic_fetch_add(&run->woken, 1) + 1;
    if (woken % k == 0) {
      pthread_mutex_lock(&run->mu);
      pthread_cond_signal(&run->cv);
      pthread_mutex_unlock(&run->mu);
    }
    publish(w, ++n);
  }
}

static void run_setter(worker_t *w) {
  run_t *run = w->run;
  const uint64_t k = (uint64_t)run->clients;
  wait_start(run);
  uint64_t r = 0;
  for (;; r++) {
    char key[64];
    round_key(key, sizeof(key), run, r);
    tdist_status_t st = tdist_store_set(w->store, key, "1", 1);
    if (st != TDIST_OK) {
      fail(run, w->store, "wait: set", st);
      return;
    }
    pthread_mutex_lock(&run->mu);
    while (atomic_load(&run->woken) < k * (r + 1) && !stopping(run)) {
      struct timespec ts;
      clock_gettime(CLOCK_REALTIME, &ts);
      ts.tv_nsec += 50000000L;
      if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
      }
      pthread_cond_timedwait(&run->cv, &run->mu, &ts);
    }
    pthread_mutex_unlock(&run->mu);
    if (stopping(run)) break;
  }
  if (!atomic_load(&run->failed)) {
    char key[64];
    round_key(key, sizeof(key), run, r + 1);
    tdist_status_t st = tdist_store_set(w->store, key, "1", 1);
    if (st != TDIST_OK) fail(run, w->store, "wait: final set", st);
  }
}

static void *worker_main(void *arg) {
  worker_t *w = arg;
  switch (w->run->op) {
    case OP_SET: run_set(w); break;
    case OP_GET: run_get(w); break;
    case OP_ADD: run_add(w); break;
    case OP_WAIT:
      if (w->index < w->run->clients)
        run_waiter(w);
      else
        run_setter(w);
      break;
    default: break;
  }
  return NULL;
}

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

static uint64_t sum_ops(worker_t *w, int n) {
  uint64_t sum = 0;
  for (int i = 0; i < n; i++) sum += atomic_load_explicit(&w[i].ops, memory_order_relaxed);
  return sum;
}

/* Nothing may hang: a cell that overruns its budget by far kills the process (children follow
 * through PDEATHSIG). */
static void on_alarm(int sig) {
  static const char msg[] = "store_bench: a measurement overran its time budget; aborting\n";
  (void)sig;
  ssize_t ignored = write(2, msg, sizeof(msg) - 1);
  (void)ignored;
  _exit(3);
}

/* ---------------------------------------------------------------------------------------- */
/* Connections                                                                               */
/* ---------------------------------------------------------------------------------------- */

typedef struct {
  const options_t *opt;
  int port;
  tdist_store_t **conns;
  int from, to;
  tdist_status_t st;
  char err[512];
} connect_job_t;

static void *connect_main(void *arg) {
  connect_job_t *j = arg;
  for (int i = j->from; i < j->to; i++) {
    tdist_tcp_store_options_t o = TDIST_TCP_STORE_OPTIONS_INIT;
    o.host = "127.0.0.1";
    o.port = j->port;
    o.connect_timeout_ms = j->opt->timeout_ms;
    o.timeout_ms = j->opt->timeout_ms;
    o.dialect = j->opt->dialect;
    j->st = tdist_tcp_store_connect(&o, &j->conns[i]);
    if (j->st != TDIST_OK) {
      snprintf(j->err, sizeof(j->err), "connect #%d to 127.0.0.1:%d: %s: %s", i, j->port,
               tdist_strerror(j->st), tdist_last_error());
      j->conns[i] = NULL;
      return NULL;
    }
  }
  return NULL;
}

/* Opens n connections with a few threads: dialect detection costs round trips, and 257
 * sequential connects would dominate a short run. */
static int connect_all(const options_t *opt, int port, tdist_store_t **conns, int n) {
  enum { THREADS = 8 };
  connect_job_t jobs[THREADS];
  pthread_t th[THREADS];
  int nt = n < THREADS ? n : THREADS;
  for (int t = 0; t < nt; t++) {
    jobs[t] = (connect_job_t){opt, port, conns, n * t / nt, n * (t + 1) / nt, TDIST_OK, ""};
    if (pthread_create(&th[t], NULL, connect_main, &jobs[t]) != 0) {
      fprintf(stderr, "store_bench: pthread_create failed\n");
      exit(2);
    }
  }
  int rc = 0;
  for (int t = 0; t < nt; t++) {
    pthread_join(th[t], NULL);
    if (jobs[t].st != TDIST_OK) {
      fprintf(stderr, "store_bench: %s\n", jobs[t].err);
      rc = -1;
    }
  }
  return rc;
}

static void close_all(tdist_store_t **conns, int n) {
  for (int i = 0; i < n; i++) {
    tdist_store_destroy(conns[i]);
    conns[i] = NULL;
  }
}

/* One cell on fresh connections: only the clients of this cell are connected, since an idle
 * connection costs a poll()-based server (torch's) on every loop turn but not an epoll one. */
static void measure(const bench_server_t *srv, op_t op, int clients, const options_t *opt,
                    const unsigned char *value, unsigned run_id, result_t *res) {
  memset(res, 0, sizeof(*res));
  int nthreads = clients + (op == OP_WAIT ? 1 : 0);
  tdist_store_t **conns = calloc((size_t)nthreads, sizeof(*conns));
  alarm(300);
  if (connect_all(opt, srv->port, conns, nthreads) != 0) {
    alarm(0);
    snprintf(res->err, sizeof(res->err), "connecting %d clients failed", nthreads);
    close_all(conns, nthreads);
    free(conns);
    return;
  }
  worker_t *w = aligned_alloc(64, sizeof(worker_t) * (size_t)nthreads);
  run_t run;
  memset(&run, 0, sizeof(run));
  run.op = op;
  run.clients = clients;
  run.opt = opt;
  run.value = value;
  run.run_id = run_id;
  pthread_mutex_init(&run.err_mu, NULL);
  pthread_mutex_init(&run.mu, NULL);
  pthread_cond_init(&run.cv, NULL);
  pthread_barrier_init(&run.start, NULL, (unsigned)nthreads + 1);

  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, 1 << 20);
  unsigned budget_s =
      (unsigned)((opt->warmup_ms + opt->duration_ms) / 1000 + 3 * opt->timeout_ms / 1000 + 60);
  alarm(budget_s);
  int started = 0;
  for (int i = 0; i < nthreads; i++) {
    memset(&w[i], 0, sizeof(w[i]));
    w[i].run = &run;
    w[i].store = conns[i];
    w[i].index = i;
    if (pthread_create(&w[i].thread, &attr, worker_main, &w[i]) != 0) {
      fprintf(stderr, "store_bench: pthread_create failed after %d threads\n", i);
      exit(2); /* the barrier counts on every thread; nothing sensible to unwind to */
    }
    started++;
  }
  pthread_barrier_wait(&run.start);
  sleep_ms(opt->warmup_ms);
  uint64_t ops0 = sum_ops(w, nthreads);
  int64_t cpu0 = bench_server_cpu_ns(srv);
  int64_t busy0 = bench_machine_busy_ns(), self0 = bench_self_cpu_ns();
  int64_t t0 = bench_now_ns();
  sleep_ms(opt->duration_ms);
  uint64_t ops1 = sum_ops(w, nthreads);
  int64_t cpu1 = bench_server_cpu_ns(srv);
  int64_t busy1 = bench_machine_busy_ns(), self1 = bench_self_cpu_ns();
  int64_t t1 = bench_now_ns();
  atomic_store(&run.stop, 1);
  pthread_mutex_lock(&run.mu);
  pthread_cond_broadcast(&run.cv);
  pthread_mutex_unlock(&run.mu);
  for (int i = 0; i < started; i++) pthread_join(w[i].thread, NULL);
  alarm(0);

  if (atomic_load(&run.failed)) {
    snprintf(res->err, sizeof(res->err), "%s", run.err);
  } else if (ops1 == ops0) {
    snprintf(res->err, sizeof(res->err), "no operation completed in %d ms", opt->duration_ms);
  } else {
    double secs = (double)(t1 - t0) / 1e9;
    uint64_t ops = ops1 - ops0;
    res->ok = 1;
    res->ops_per_s = (double)ops / secs;
    res->srv_us_per_op = -1;
    res->srv_util = -1;
    res->other_util = -1;
    res->cli_us_per_op = -1;
    if (self0 >= 0 && self1 >= self0) {
      int64_t cli = self1 - self0 - (srv->inproc && cpu0 >= 0 ? cpu1 - cpu0 : 0);
      res->cli_us_per_op = (double)cli / 1e3 / (double)ops;
    }
    if (busy0 >= 0 && busy1 >= busy0) {
      int64_t mine = self1 - self0 + (srv->pid > 0 && cpu0 >= 0 ? cpu1 - cpu0 : 0);
      res->other_util = (double)(busy1 - busy0 - mine) / (double)(t1 - t0);
      if (res->other_util < 0) res->other_util = 0; /* jiffy rounding */
    }
    if (cpu0 >= 0 && cpu1 >= cpu0) {
      res->srv_us_per_op = (double)(cpu1 - cpu0) / 1e3 / (double)ops;
      res->srv_util = (double)(cpu1 - cpu0) / (double)(t1 - t0);
    }
  }
  pthread_attr_destroy(&attr);
  pthread_barrier_destroy(&run.start);
  pthread_cond_destroy(&run.cv);
  pthread_mutex_destroy(&run.mu);
  pthread_mutex_destroy(&run.err_mu);
  free(w);
  close_all(conns, nthreads);
  free(conns);
}

/* ---------------------------------------------------------------------------------------- */
/* Options and table                                                                         */
/* ---------------------------------------------------------------------------------------- */

static void usage(FILE *f) {
  fprintf(f,
          "usage: store_bench [options]\n"
          "Ops/s of tdist's TCPStore server vs PyTorch 1.13's, both driven by tdist's C client.\n"
          "  --ops LIST          set,get,add,wait (default: all)\n"
          "  --clients LIST      concurrent clients, e.g. 1,16,256 (default)\n"
          "  --duration-ms N     measured time per cell (default 1000)\n"
          "  --warmup-ms N       warm-up before each cell (default 300)\n"
          "  --value-bytes N     value size for set/get (default 64)\n"
          "  --servers LIST      tdist,torch (default: both)\n"
          "  --tdist-store PATH  run our server as this tdist-store binary instead of in-process\n"
          "  --python PATH       interpreter with torch 1.13 (default /usr/bin/python3)\n"
          "  --dialect D         client dialect for both servers: auto (default), v2, v1.13\n"
          "  --repeat N          measure each cell N times, report the median (default 1)\n"
          "  --set-batch N       SETs per CHECK that confirms them (default 16)\n"
          "  --timeout-ms N      connect and per-call timeout (default 10000)\n"
          "  --help\n"
          "set = SETs counted once a CHECK behind them answers (SET has no reply).\n"
          "get = WAIT + GET (two round trips). wait = wakeups/s: K clients wait on a fresh key,\n"
          "one more connection sets it when the previous round's K wakeups are in.\n"
          "Columns: ratio = median tdist/torch ops/s of back-to-back pairs; srv = server CPU\n"
          "us per op / share of a core; client = client CPU us per op; cpu ratio = torch\n"
          "(srv+client) / tdist's; other = cores other processes used (noise). See "
          "docs/benchmarks.md.\n");
}

static int parse_int(const char *s, int lo, int hi, int *out) {
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno || end == s || *end || v < lo || v > hi) return -1;
  *out = (int)v;
  return 0;
}

static int parse_options(int argc, char **argv, options_t *o) {
  *o = (options_t){.ops_mask = (1u << OP_COUNT) - 1,
                   .clients = {1, 16, 256},
                   .nclients = 3,
                   .duration_ms = 1000,
                   .warmup_ms = 300,
                   .value_bytes = 64,
                   .use_server = {1, 1},
                   .python = "/usr/bin/python3",
                   .dialect = TDIST_STORE_DIALECT_AUTO,
                   .repeat = 1,
                   .timeout_ms = 10000,
                   .set_batch = 16};
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      usage(stdout);
      exit(0);
    }
    if (i + 1 >= argc) {
      fprintf(stderr, "store_bench: unknown option or missing value: %s\n", a);
      return -1;
    }
    const char *v = argv[++i];
    int n;
    if (!strcmp(a, "--ops") || !strcmp(a, "--servers") || !strcmp(a, "--clients")) {
      char buf[256];
      snprintf(buf, sizeof(buf), "%s", v);
      unsigned mask = 0;
      int use[2] = {0, 0};
      if (!strcmp(a, "--clients")) o->nclients = 0;
      for (char *save, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (!strcmp(a, "--ops")) {
          int found = -1;
          for (int k = 0; k < OP_COUNT; k++)
            if (!strcmp(t, op_names[k])) found = k;
          if (found < 0) goto bad;
          mask |= 1u << found;
        } else if (!strcmp(a, "--servers")) {
          if (!strcmp(t, "tdist"))
            use[BENCH_SERVER_TDIST] = 1;
          else if (!strcmp(t, "torch"))
            use[BENCH_SERVER_TORCH] = 1;
          else
            goto bad;
        } else {
          if (o->nclients == MAX_CLIENT_COUNTS || parse_int(t, 1, 4096, &n)) goto bad;
          o->clients[o->nclients++] = n;
        }
      }
      if (!strcmp(a, "--ops")) {
        if (!mask) goto bad;
        o->ops_mask = mask;
      } else if (!strcmp(a, "--servers")) {
        if (!use[0] && !use[1]) goto bad;
        o->use_server[0] = use[0];
        o->use_server[1] = use[1];
      } else if (o->nclients == 0) {
        goto bad;
      }
    } else if (!strcmp(a, "--duration-ms")) {
      if (parse_int(v, 10, 600000, &o->duration_ms)) goto bad;
    } else if (!strcmp(a, "--warmup-ms")) {
      if (parse_int(v, 0, 600000, &o->warmup_ms)) goto bad;
    } else if (!strcmp(a, "--value-bytes")) {
      if (parse_int(v, 0, 64 << 20, &n)) goto bad;
      o->value_bytes = (size_t)n;
    } else if (!strcmp(a, "--tdist-store")) {
      o->tdist_store_path = v;
    } else if (!strcmp(a, "--python")) {
      o->python = v;
    } else if (!strcmp(a, "--dialect")) {
      if (!strcmp(v, "auto"))
        o->dialect = TDIST_STORE_DIALECT_AUTO;
      else if (!strcmp(v, "v2"))
        o->dialect = TDIST_STORE_DIALECT_V2;
      else if (!strcmp(v, "v1.13") || !strcmp(v, "v1_13"))
        o->dialect = TDIST_STORE_DIALECT_V1_13;
      else
        goto bad;
    } else if (!strcmp(a, "--repeat")) {
      if (parse_int(v, 1, MAX_REPEAT, &o->repeat)) goto bad;
    } else if (!strcmp(a, "--set-batch")) {
      if (parse_int(v, 1, 100000, &o->set_batch)) goto bad;
    } else if (!strcmp(a, "--timeout-ms")) {
      if (parse_int(v, 100, 3600000, &n)) goto bad;
      o->timeout_ms = n;
    } else {
      fprintf(stderr, "store_bench: unknown option %s\n", a);
      return -1;
    }
    continue;
  bad:
    fprintf(stderr, "store_bench: bad value for %s: %s\n", a, v);
    return -1;
  }
  return 0;
}

static const char *dialect_name(tdist_store_dialect_t d) {
  switch (d) {
    case TDIST_STORE_DIALECT_V2: return "2.x";
    case TDIST_STORE_DIALECT_V1_13: return "1.13";
    default: return "auto";
  }
}

static int cmp_result(const void *a, const void *b) {
  double x = ((const result_t *)a)->ops_per_s, y = ((const result_t *)b)->ops_per_s;
  return (x > y) - (x < y);
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* Median over repetitions of tdist/torch measured back to back: a pair shares the machine's
 * momentary load, so this is steadier than a ratio of two medians. -1 if no pair succeeded. */
static double paired_ratio(result_t reps[2][MAX_REPEAT], int n) {
  double r[MAX_REPEAT];
  int m = 0;
  for (int i = 0; i < n; i++)
    if (reps[0][i].ok && reps[1][i].ok) r[m++] = reps[0][i].ops_per_s / reps[1][i].ops_per_s;
  if (m == 0) return -1;
  qsort(r, (size_t)m, sizeof(r[0]), cmp_double);
  return m % 2 ? r[m / 2] : (r[m / 2 - 1] + r[m / 2]) / 2;
}

/* The median of the successful repetitions; an error if none succeeded. */
static result_t median(result_t *r, int n) {
  result_t ok[MAX_REPEAT];
  int m = 0;
  for (int i = 0; i < n; i++)
    if (r[i].ok) ok[m++] = r[i];
  if (m == 0) return r[0];
  qsort(ok, (size_t)m, sizeof(ok[0]), cmp_result);
  return ok[m / 2];
}

static void fmt_rate(char *buf, size_t cap, const result_t *r, int used) {
  if (!used)
    snprintf(buf, cap, "-");
  else if (!r->ok)
    snprintf(buf, cap, "ERROR");
  else
    snprintf(buf, cap, "%.0f", r->ops_per_s);
}

static void fmt_cpu(char *buf, size_t cap, const result_t *r, int used) {
  if (!used || !r->ok || r->srv_us_per_op < 0)
    snprintf(buf, cap, "-");
  else
    snprintf(buf, cap, "%.2f/%3.0f%%", r->srv_us_per_op, 100.0 * r->srv_util);
}

static void raise_fd_limit(int need) {
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return;
  rlim_t want = rl.rlim_max == RLIM_INFINITY ? 65536 : rl.rlim_max;
  if (want > 65536) want = 65536;
  if (rl.rlim_cur < want) {
    rl.rlim_cur = want;
    setrlimit(RLIMIT_NOFILE, &rl);
    getrlimit(RLIMIT_NOFILE, &rl);
  }
  if (rl.rlim_cur < (rlim_t)need)
    fprintf(stderr, "store_bench: warning: RLIMIT_NOFILE is %llu, %d fds needed\n",
            (unsigned long long)rl.rlim_cur, need);
}

int main(int argc, char **argv) {
  options_t opt;
  if (parse_options(argc, argv, &opt) != 0) {
    usage(stderr);
    return 2;
  }
  signal(SIGPIPE, SIG_IGN);
  signal(SIGALRM, on_alarm);

  int max_clients = 0;
  for (int i = 0; i < opt.nclients; i++)
    if (opt.clients[i] > max_clients) max_clients = opt.clients[i];
  int nconns = max_clients + 1; /* + the wait-wake setter */
  /* Both ends of every connection live in this machine, plus the torch master's own two. */
  raise_fd_limit(2 * nconns + 64);

  unsigned char *value = malloc(opt.value_bytes ? opt.value_bytes : 1);
  uint64_t x = 0x9E3779B97F4A7C15ull;
  for (size_t i = 0; i < opt.value_bytes; i++) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    value[i] = (unsigned char)x;
  }

  bench_server_t servers[2];
  const char *names[2] = {"tdist", "torch"};
  for (int k = 0; k < 2; k++) {
    if (!opt.use_server[k]) continue;
    int rc;
    alarm(300); /* server start + probe: bounded even if something upstream hangs */
    if (k == BENCH_SERVER_TORCH)
      rc = bench_server_start_torch(&servers[k], opt.python);
    else if (opt.tdist_store_path)
      rc = bench_server_start_binary(&servers[k], opt.tdist_store_path);
    else
      rc = bench_server_start_inproc(&servers[k]);
    if (rc != 0) return 1;
    tdist_store_t *probe = NULL;
    int64_t t0 = bench_now_ns();
    if (connect_all(&opt, servers[k].port, &probe, 1) != 0) return 1;
    alarm(0);
    char who[64];
    if (servers[k].pid > 0)
      snprintf(who, sizeof(who), "pid %d", (int)servers[k].pid);
    else
      snprintf(who, sizeof(who), "server thread tid %d", servers[k].ntids ? servers[k].tids[0] : 0);
    fprintf(stderr,
            "store_bench: %s server on 127.0.0.1:%d (%s, %s), client dialect %s, "
            "connect %.1f ms\n",
            names[k], servers[k].port,
            k == BENCH_SERVER_TORCH ? opt.python
                                    : (opt.tdist_store_path ? opt.tdist_store_path : "in-process"),
            who, dialect_name(tdist_tcp_store_dialect(probe)), (double)(bench_now_ns() - t0) / 1e6);
    tdist_store_destroy(probe);
  }

  printf("# store_bench: tdist %s, value %zu bytes, warm-up %d ms, %d ms per cell, median of %d\n",
         tdist_version(), opt.value_bytes, opt.warmup_ms, opt.duration_ms, opt.repeat);
  printf(
      "# set = %d SETs + 1 CHECK; get = WAIT+GET; wait = wakeups/s; "
      "srv = server CPU us per op / server CPU share\n"
      "# ratio = median of tdist/torch ops/s over back-to-back pairs\n"
      "# srv ratio = torch srv us per op / tdist's; client = client CPU us per op (tdist/torch "
      "run);\n# cpu ratio = torch (srv+client) CPU per op / tdist's: the ops/s ratio a machine "
      "bound by CPU alone would give;\n# other = CPU cores used by other processes on the machine "
      "(noise)\n",
      opt.set_batch);
  printf("%-6s %8s %12s %12s %7s %14s %14s %9s %11s %9s %6s\n", "op", "clients", "tdist ops/s",
         "torch ops/s", "ratio", "tdist srv", "torch srv", "srv ratio", "client", "cpu ratio",
         "other");
  fflush(stdout);

  unsigned run_id = 0;
  int errors = 0;
  for (int op = 0; op < OP_COUNT; op++) {
    if (!(opt.ops_mask & (1u << op))) continue;
    for (int c = 0; c < opt.nclients; c++) {
      result_t reps[2][MAX_REPEAT], med[2];
      memset(med, 0, sizeof(med));
      for (int r = 0; r < opt.repeat; r++) {
        /* Alternate which server goes first so slow drift of the machine hits both alike. */
        for (int j = 0; j < 2; j++) {
          int k = (r + j) % 2;
          if (!opt.use_server[k]) continue;
          measure(&servers[k], (op_t)op, opt.clients[c], &opt, value, run_id++, &reps[k][r]);
          if (!reps[k][r].ok)
            fprintf(stderr, "store_bench: %s %s x%d: %s\n", names[k], op_names[op], opt.clients[c],
                    reps[k][r].err);
        }
      }
      for (int k = 0; k < 2; k++)
        if (opt.use_server[k]) {
          med[k] = median(reps[k], opt.repeat);
          if (!med[k].ok) errors++;
        }
      char a[32], b[32], ratio[32], ca[32], cb[32], cr[32], other[32], cli[32], cpur[32];
      fmt_rate(a, sizeof(a), &med[0], opt.use_server[0]);
      fmt_rate(b, sizeof(b), &med[1], opt.use_server[1]);
      fmt_cpu(ca, sizeof(ca), &med[0], opt.use_server[0]);
      fmt_cpu(cb, sizeof(cb), &med[1], opt.use_server[1]);
      double pr = opt.use_server[0] && opt.use_server[1] ? paired_ratio(reps, opt.repeat) : -1;
      if (pr > 0)
        snprintf(ratio, sizeof(ratio), "%.2f", pr);
      else
        snprintf(ratio, sizeof(ratio), "-");
      if (med[0].ok && med[1].ok && med[0].srv_us_per_op > 0 && med[1].srv_us_per_op >= 0)
        snprintf(cr, sizeof(cr), "%.2f", med[1].srv_us_per_op / med[0].srv_us_per_op);
      else
        snprintf(cr, sizeof(cr), "-");
      double worst = -1;
      for (int k = 0; k < 2; k++)
        if (opt.use_server[k] && med[k].ok && med[k].other_util > worst) worst = med[k].other_util;
      if (worst >= 0)
        snprintf(other, sizeof(other), "%.2f", worst);
      else
        snprintf(other, sizeof(other), "-");
      snprintf(cli, sizeof(cli), "-");
      if (med[0].ok && med[1].ok && med[0].cli_us_per_op >= 0 && med[1].cli_us_per_op >= 0)
        snprintf(cli, sizeof(cli), "%.1f/%.1f", med[0].cli_us_per_op, med[1].cli_us_per_op);
      else if (med[0].ok && med[0].cli_us_per_op >= 0)
        snprintf(cli, sizeof(cli), "%.1f", med[0].cli_us_per_op);
      else if (med[1].ok && med[1].cli_us_per_op >= 0)
        snprintf(cli, sizeof(cli), "%.1f", med[1].cli_us_per_op);
      snprintf(cpur, sizeof(cpur), "-");
      if (med[0].ok && med[1].ok && med[0].srv_us_per_op >= 0 && med[1].srv_us_per_op >= 0 &&
          med[0].cli_us_per_op >= 0 && med[1].cli_us_per_op >= 0)
        snprintf(cpur, sizeof(cpur), "%.2f",
                 (med[1].srv_us_per_op + med[1].cli_us_per_op) /
                     (med[0].srv_us_per_op + med[0].cli_us_per_op));
      printf("%-6s %8d %12s %12s %7s %14s %14s %9s %11s %9s %6s\n", op_names[op], opt.clients[c], a,
             b, ratio, ca, cb, cr, cli, cpur, other);
      fflush(stdout);
    }
  }

  for (int k = 0; k < 2; k++) {
    if (!opt.use_server[k]) continue;
    bench_server_stop(&servers[k]);
  }
  free(value);
  return errors ? 1 : 0;
}
