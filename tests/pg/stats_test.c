/* Per-rank collective statistics (include/tdist/stats.h, runtime/pg/stats.c) on real processes:
 *   (a) a random sequence of collectives (every type, blocking and async, random counts and
 *       dtypes, send/recv pairs, a subgroup) against a count kept by the test: ops, bytes and
 *       errors per type, the histogram rebuilt from the flight recorder's own durations, the
 *       duration sums, last_seq = world-group collectives, every flight entry (seq, type, bytes,
 *       peer/root, group, status, times), the in-flight block cleared at the end;
 *   (b) the flight ring after more than TDIST_STATS_FLIGHT operations holds exactly the newest
 *       ones, each in slot index % FLIGHT;
 *   (c) a peer SIGKILLed: the failed collective counts an error and its entry carries the failure
 *       status; last_seq stays at the last success; the sticky failures after it count nothing;
 *   (d) reader threads hammering tdist_stats_read (this rank's file and the peer's) while the
 *       ranks run thousands of small collectives never see a torn copy: an in-flight block is
 *       cur_seq = last_seq + 1 with the op, root and a start time that belong to that seq, and
 *       every flight entry is internally consistent;
 *   (e) tdist_stats_read errors: a missing file, empty, short, random and wrong-version files,
 *       NULL arguments; no file without TDIST_STATS_FILE; an unusable path leaves collectives
 *       working;
 *   (f) threads writing at once: four one-rank groups driven by four threads, plus async work
 *       on a fifth, lose no count (the owner thread's plain counters and the others' shared
 *       set); a forked child's collectives add to the parent's counts without losing any.
 * The collective types are found by name through tdist_stats_op_name, as a reader outside the
 * library would. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "clock.h"
#include "proc.h"
#include "ranks.h"

#define OK(pg, expr) CHECK_OK_MSG(expr, tdist_pg_last_error(pg))
#define WORLD 4
#define NOPS 150      /* random plan: fewer than TDIST_STATS_FLIGHT entries in all */
#define MAXCOUNT 3000 /* elements */
#define RING_OPS (2 * TDIST_STATS_FLIGHT + 89)
/* Enough ops that the readers get well over 100 reads in (they start first): small collectives
 * take 0.1-0.3 us each over shared memory, and 4000 once ended before the readers began. */
#define HAMMER_OPS 10000

/* Collective type indices, resolved by name. */
enum { AR, BC, RED, AG, GA, SC, RS, A2A, BAR, MBAR, SEND, RECV, NKINDS };
static const char *const k_names[NKINDS] = {
    "all_reduce",     "broadcast",  "reduce",  "all_gather",        "gather", "scatter",
    "reduce_scatter", "all_to_all", "barrier", "monitored_barrier", "send",   "recv"};
static int k_idx[NKINDS];

static void resolve_kinds(void) {
  for (int k = 0; k < NKINDS; k++) {
    k_idx[k] = -1;
    for (int i = 0; i < TDIST_STATS_OPS; i++)
      if (!strcmp(tdist_stats_op_name(i), k_names[k])) k_idx[k] = i;
    if (k_idx[k] < 0) {
      fprintf(stderr, "tdist_stats_op_name has no \"%s\"\n", k_names[k]);
      exit(1);
    }
  }
  CHECK(!strcmp(tdist_stats_op_name(-1), "unknown"));
  CHECK(!strcmp(tdist_stats_op_name(TDIST_STATS_OPS), "unknown"));
  for (int i = 1; i < TDIST_STATS_BUCKETS; i++)
    CHECK(tdist_stats_bucket_le(i) > tdist_stats_bucket_le(i - 1));
  CHECK(tdist_stats_bucket_le(0) > 0);
}

static void stats_path(char *out, size_t cap, const char *scen, int rank) {
  const char *tmp = getenv("TEST_TMPDIR") ? getenv("TEST_TMPDIR") : "/tmp";
  snprintf(out, cap, "%s/stats_test.%d.%s.%d", tmp, (int)getppid(), scen, rank);
}

/* In a rank: TDIST_STATS_FILE for this rank, before the group exists. */
static void use_stats_file(const char *scen, int rank, char *path, size_t cap) {
  stats_path(path, cap, scen, rank);
  unlink(path);
  CHECK(setenv("TDIST_STATS_FILE", path, 1) == 0);
}

static tdist_stats_file_t *read_stats(const char *path) {
  tdist_stats_file_t *f = malloc(sizeof *f);
  CHECK(f != NULL);
  CHECK_OK(tdist_stats_read(path, f));
  return f;
}

/* The bucket of a duration, by the Prometheus rule (value <= le), from the public bounds. */
static int bucket_of(int64_t dur_ns) {
  for (int b = 0; b < TDIST_STATS_BUCKETS; b++)
    if ((double)dur_ns <= tdist_stats_bucket_le(b) * 1e9) return b;
  return TDIST_STATS_BUCKETS;
}

/* What the test expects, kept independently of the library. */
typedef struct {
  int kind; /* index into k_names */
  uint64_t seq;
  uint64_t bytes;
  int peer, group;
} exp_entry_t;

typedef struct {
  uint64_t ops[NKINDS], bytes[NKINDS];
  exp_entry_t e[NOPS * 2];
  int n;
  uint64_t wseq, sseq; /* world group / subgroup sequence numbers */
} expect_t;

static void expect_op(expect_t *x, int kind, uint64_t bytes, int peer, int group) {
  CHECK(x->n < (int)(sizeof x->e / sizeof x->e[0]));
  x->ops[kind]++;
  x->bytes[kind] += bytes;
  x->e[x->n++] = (exp_entry_t){kind, group ? ++x->sseq : ++x->wseq, bytes, peer, group};
}

/* Every file-wide check that needs only the expectation: header, counters, histogram against
 * the flight durations, flight entries in order, the in-flight block cleared. */
static void check_file(const tdist_stats_file_t *f, const expect_t *x, int rank, int world) {
  CHECK_EQ_INT(f->magic, TDIST_STATS_MAGIC);
  CHECK_EQ_INT(f->version, TDIST_STATS_VERSION);
  CHECK_EQ_INT(f->size, sizeof *f);
  CHECK_EQ_INT(f->rank, rank);
  CHECK_EQ_INT(f->world_size, world);
  CHECK_EQ_INT(f->pid, getpid());
  for (int k = 0; k < NKINDS; k++) {
    int i = k_idx[k];
    if (f->ops[i] != x->ops[k] || f->bytes[i] != x->bytes[k] || f->errors[i] != 0) {
      fprintf(stderr,
              "rank %d %s: ops %llu bytes %llu errors %llu; expected ops %llu bytes %llu "
              "errors 0\n",
              rank, k_names[k], (unsigned long long)f->ops[i], (unsigned long long)f->bytes[i],
              (unsigned long long)f->errors[i], (unsigned long long)x->ops[k],
              (unsigned long long)x->bytes[k]);
      exit(1);
    }
  }
  CHECK_EQ_INT(f->flight_next, x->n);
  CHECK_EQ_INT(f->last_seq, x->wseq);
  CHECK_EQ_INT(f->cur_seq, 0);
  CHECK_EQ_INT(f->cur_op, -1);
  CHECK_EQ_INT(f->cur_peer, -1);
  CHECK_EQ_INT(f->cur_start_ns, 0);
  uint64_t hist[TDIST_STATS_OPS][TDIST_STATS_BUCKETS + 1] = {{0}};
  uint64_t dsum[TDIST_STATS_OPS] = {0};
  int64_t prev_start = 0, now = realtime_ns();
  for (int j = 0; j < x->n; j++) {
    const tdist_stats_flight_t *e = &f->flight[j % TDIST_STATS_FLIGHT];
    const exp_entry_t *w = &x->e[j];
    if (e->seq != w->seq || e->op != k_idx[w->kind] || e->bytes != w->bytes || e->peer != w->peer ||
        e->group != w->group || e->status != TDIST_OK) {
      fprintf(stderr,
              "rank %d flight entry %d: seq %llu op %s bytes %llu peer %d group %d status "
              "%d; expected seq %llu op %s bytes %llu peer %d group %d status 0\n",
              rank, j, (unsigned long long)e->seq, tdist_stats_op_name(e->op),
              (unsigned long long)e->bytes, e->peer, e->group, e->status,
              (unsigned long long)w->seq, k_names[w->kind], (unsigned long long)w->bytes, w->peer,
              w->group);
      exit(1);
    }
    CHECK(e->start_ns > 0 && e->end_ns >= e->start_ns && e->end_ns <= now);
    CHECK(e->start_ns >= prev_start); /* one op at a time: starts are in order */
    prev_start = e->start_ns;
    hist[e->op][bucket_of(e->end_ns - e->start_ns)]++;
    dsum[e->op] += (uint64_t)(e->end_ns - e->start_ns);
  }
  for (int i = 0; i < TDIST_STATS_OPS; i++) {
    uint64_t total = 0;
    for (int b = 0; b <= TDIST_STATS_BUCKETS; b++) {
      total += f->hist[i][b];
      if (x->n <= TDIST_STATS_FLIGHT && f->hist[i][b] != hist[i][b]) {
        fprintf(stderr,
                "rank %d %s: histogram bucket %d holds %llu, the flight durations say "
                "%llu\n",
                rank, tdist_stats_op_name(i), b, (unsigned long long)f->hist[i][b],
                (unsigned long long)hist[i][b]);
        exit(1);
      }
    }
    CHECK_EQ_INT(total, f->ops[i]);
    if (x->n <= TDIST_STATS_FLIGHT) CHECK_EQ_INT(f->duration_ns_sum[i], dsum[i]);
  }
  for (int j = x->n; j < TDIST_STATS_FLIGHT; j++) CHECK_EQ_INT(f->flight[j].seq, 0);
}

/* ---------------------------------------------------------------------------------------- */
/* (a) a random sequence                                                                     */

static const int k_sub[] = {1, 2, 3}; /* the subgroup's parent ranks */

static int sub_index(int rank) {
  for (int i = 0; i < 3; i++)
    if (k_sub[i] == rank) return i;
  return -1;
}

static uint64_t g_seed; /* set before the ranks fork: the same plan on every rank */
static uint64_t rnd(uint64_t i, uint64_t what) { return tdist_test_rand(g_seed, what, i); }

static size_t rnd_count(uint64_t i) {
  switch (rnd(i, 1) % 4) {
    case 0: return 0;
    case 1: return 1 + rnd(i, 2) % 7;
    case 2: return 1 + rnd(i, 2) % 257;
    default: return 1 + rnd(i, 2) % MAXCOUNT;
  }
}

static int random_body(int rank, int world, int port, void *arg) {
  (void)arg;
  char path[512];
  use_stats_file("random", rank, path, sizeof path);
  tdist_store_t *store;
  tdist_pg_t *pg = tdist_test_init_pg(rank, world, port, 20000, &store);
  tdist_pg_t *sub = NULL;
  OK(pg, tdist_new_group(pg, k_sub, 3, &sub));
  CHECK((sub != NULL) == (sub_index(rank) >= 0));
  char *a = calloc((size_t)world * MAXCOUNT, 8), *b = calloc((size_t)world * MAXCOUNT, 8);
  size_t *cnt = calloc((size_t)world * 4, sizeof *cnt), *dsp = cnt + world, *icnt = cnt + 2 * world,
         *idsp = cnt + 3 * world;
  expect_t *x = calloc(1, sizeof *x);
  CHECK(a && b && cnt && x);
  for (uint64_t i = 0; i < NOPS; i++) {
    size_t count = rnd_count(i);
    tdist_dtype_t dt = (tdist_dtype_t)(rnd(i, 3) % TDIST_DTYPE_COUNT_);
    uint64_t ds = tdist_dtype_size(dt), by = count * ds;
    int root = (int)(rnd(i, 4) % (uint64_t)world), kind = (int)(rnd(i, 5) % 15);
    tdist_work_t *w = NULL;
    switch (kind) {
      case 0:
        OK(pg, tdist_all_reduce(pg, a, count, dt, TDIST_SUM));
        expect_op(x, AR, by, -1, 0);
        break;
      case 1: /* async, on the group's worker thread */
        OK(pg, tdist_all_reduce_async(pg, a, count, dt, TDIST_MAX, &w));
        OK(pg, tdist_work_wait(w, -1));
        tdist_work_destroy(w);
        expect_op(x, AR, by, -1, 0);
        break;
      case 2:
        OK(pg, tdist_broadcast(pg, a, count, dt, root));
        expect_op(x, BC, by, root, 0);
        break;
      case 3:
        OK(pg, tdist_reduce(pg, a, count, dt, TDIST_SUM, root));
        expect_op(x, RED, by, root, 0);
        break;
      case 4:
        OK(pg, tdist_all_gather(pg, b, a, count, dt));
        expect_op(x, AG, by, -1, 0);
        break;
      case 5: { /* all_gather_v: rank r contributes (count + 3r) % 50 elements */
        size_t off = 0;
        for (int r = 0; r < world; r++) {
          cnt[r] = (count + 3 * (size_t)r) % 50;
          dsp[r] = off;
          off += cnt[r];
        }
        OK(pg, tdist_all_gather_v(pg, b, cnt, dsp, a, dt));
        expect_op(x, AG, cnt[rank] * ds, -1, 0);
        break;
      }
      case 6:
        OK(pg, tdist_gather(pg, b, a, count, dt, root));
        expect_op(x, GA, by, root, 0);
        break;
      case 7:
        OK(pg, tdist_scatter(pg, b, a, count, dt, root));
        expect_op(x, SC, by, root, 0);
        break;
      case 8:
        OK(pg, tdist_reduce_scatter(pg, b, a, count, dt, TDIST_SUM));
        expect_op(x, RS, by, -1, 0);
        break;
      case 9: /* uniform all_to_all: the rank's whole input is world x count elements */
        OK(pg, tdist_all_to_all(pg, b, a, count, dt));
        expect_op(x, A2A, (uint64_t)world * by, -1, 0);
        break;
      case 10: { /* all_to_all_v: rank s sends (s + 2d + count) % 40 elements to rank d */
        size_t io = 0, oo = 0;
        uint64_t in_total = 0;
        for (int r = 0; r < world; r++) {
          icnt[r] = ((size_t)rank + 2 * (size_t)r + count) % 40;
          cnt[r] = ((size_t)r + 2 * (size_t)rank + count) % 40;
          idsp[r] = io;
          dsp[r] = oo;
          io += icnt[r];
          oo += cnt[r];
          in_total += icnt[r];
        }
        OK(pg, tdist_all_to_all_v(pg, b, cnt, dsp, a, icnt, idsp, dt));
        expect_op(x, A2A, in_total * ds, -1, 0);
        break;
      }
      case 11:
        if (rnd(i, 6) % 2) {
          OK(pg, tdist_barrier(pg));
          expect_op(x, BAR, 0, -1, 0);
        } else {
          OK(pg, tdist_monitored_barrier(pg, 20000));
          expect_op(x, MBAR, 0, -1, 0);
        }
        break;
      case 12: { /* send/recv in pairs (0,1) (2,3); the direction is random */
        int lo = rank & ~1, hi = lo + 1, sender = rnd(i, 6) % 2 ? lo : hi;
        int peer = rank == lo ? hi : lo, tag = (int)(rnd(i, 7) % 1000);
        if (rank == sender) {
          OK(pg, tdist_send(pg, a, count, dt, peer, tag));
          expect_op(x, SEND, by, peer, 0);
        } else {
          OK(pg, tdist_recv(pg, b, count, dt, peer, tag));
          expect_op(x, RECV, by, peer, 0);
        }
        break;
      }
      case 13: /* the subgroup: counted, but not in the world group's sequence */
        if (sub) {
          OK(sub, tdist_all_reduce(sub, a, count, dt, TDIST_SUM));
          expect_op(x, AR, by, -1, 1);
        }
        break;
      default:
        if (sub) {
          int sroot = root % 3;
          OK(sub, tdist_broadcast(sub, a, count, dt, sroot));
          expect_op(x, BC, by, sroot, 1);
        }
        break;
    }
  }
  tdist_stats_file_t *f = read_stats(path);
  check_file(f, x, rank, world);
  if (sub) CHECK(x->sseq > 0);
  TEST_LOG("random: rank %d: %d ops (%llu world, %llu subgroup) match", rank, x->n,
           (unsigned long long)x->wseq, (unsigned long long)x->sseq);
  tdist_pg_destroy(sub);
  tdist_pg_destroy(pg);
  /* Destroying the groups changes nothing in the file. */
  tdist_stats_file_t *g = read_stats(path);
  check_file(g, x, rank, world);
  tdist_store_destroy(store);
  free(f);
  free(g);
  free(x);
  free(cnt);
  free(a);
  free(b);
  return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* (b) the ring wraps                                                                        */

static int ring_body(int rank, int world, int port, void *arg) {
  (void)arg;
  char path[512];
  use_stats_file("ring", rank, path, sizeof path);
  tdist_store_t *store;
  tdist_pg_t *pg = tdist_test_init_pg(rank, world, port, 20000, &store);
  double buf[64] = {0};
  for (int i = 0; i < RING_OPS; i++) {
    if (i % 3 == 2)
      OK(pg, tdist_broadcast(pg, buf, (size_t)(i % 61), TDIST_FLOAT64, i % world));
    else
      OK(pg, tdist_all_reduce(pg, buf, (size_t)(i % 61), TDIST_FLOAT64, TDIST_SUM));
  }
  tdist_stats_file_t *f = read_stats(path);
  CHECK_EQ_INT(f->flight_next, RING_OPS);
  CHECK_EQ_INT(f->last_seq, RING_OPS);
  CHECK_EQ_INT(f->cur_seq, 0);
  uint64_t nbc = RING_OPS / 3, nar = RING_OPS - nbc;
  CHECK_EQ_INT(f->ops[k_idx[AR]], nar);
  CHECK_EQ_INT(f->ops[k_idx[BC]], nbc);
  uint64_t hsum = 0;
  for (int b = 0; b <= TDIST_STATS_BUCKETS; b++)
    hsum += f->hist[k_idx[AR]][b] + f->hist[k_idx[BC]][b];
  CHECK_EQ_INT(hsum, RING_OPS);
  int64_t prev = 0;
  for (int i = RING_OPS - TDIST_STATS_FLIGHT; i < RING_OPS; i++) { /* oldest kept to newest */
    const tdist_stats_flight_t *e = &f->flight[i % TDIST_STATS_FLIGHT];
    CHECK_EQ_INT(e->seq, i + 1);
    CHECK_EQ_INT(e->op, k_idx[i % 3 == 2 ? BC : AR]);
    CHECK_EQ_INT(e->bytes, (i % 61) * 8);
    CHECK_EQ_INT(e->peer, i % 3 == 2 ? i % world : -1);
    CHECK_EQ_INT(e->status, TDIST_OK);
    CHECK(e->start_ns >= prev && e->end_ns >= e->start_ns);
    prev = e->start_ns;
  }
  tdist_pg_destroy(pg);
  tdist_store_destroy(store);
  free(f);
  return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* (f) concurrent writers                                                                    */

#define CONC_OPS 200000 /* per thread */
#define CONC_GROUPS 4

typedef struct {
  tdist_pg_t *pg;
  int n;
} conc_arg_t;

static void *conc_main(void *arg) {
  conc_arg_t *a = arg;
  int64_t v[2] = {1, 2};
  for (int i = 0; i < a->n; i++) OK(a->pg, tdist_all_reduce(a->pg, v, 2, TDIST_INT64, TDIST_MAX));
  return NULL;
}

/* One-rank groups, so that a collective is little more than its statistics and writers
 * collide often: the main thread (the owner, from its first collective on) on the first group,
 * with every 4th call async (the group's worker thread), and three threads on three more groups
 * at the same time. Then a forked child on a group of its own while the parent keeps going. */
static int conc_body(int rank, int world, int port, void *arg) {
  (void)world, (void)port, (void)arg;
  char path[512];
  use_stats_file("conc", rank, path, sizeof path);
  tdist_store_t *ms;
  CHECK_OK(tdist_memory_store_create(&ms));
  tdist_pg_t *g[CONC_GROUPS];
  for (int i = 0; i < CONC_GROUPS; i++) {
    char name[32];
    snprintf(name, sizeof name, "conc%d", i);
    tdist_pg_options_t o = TDIST_PG_OPTIONS_INIT;
    o.store = ms;
    o.rank = 0;
    o.world_size = 1;
    o.group_name = name;
    CHECK_OK(tdist_init_process_group(&o, &g[i]));
  }
  OK(g[0], tdist_barrier(g[0]));
  conc_arg_t ca[CONC_GROUPS];
  pthread_t th[CONC_GROUPS];
  for (int i = 1; i < CONC_GROUPS; i++) {
    ca[i] = (conc_arg_t){g[i], CONC_OPS};
    CHECK(pthread_create(&th[i], NULL, conc_main, &ca[i]) == 0);
  }
  int64_t v[2] = {1, 2};
  for (int i = 0; i < CONC_OPS; i++) {
    if (i % 4 == 3) {
      tdist_work_t *w = NULL;
      OK(g[0], tdist_all_reduce_async(g[0], v, 2, TDIST_INT64, TDIST_MAX, &w));
      OK(g[0], tdist_work_wait(w, 20000));
      tdist_work_destroy(w);
    } else {
      OK(g[0], tdist_all_reduce(g[0], v, 2, TDIST_INT64, TDIST_MAX));
    }
  }
  for (int i = 1; i < CONC_GROUPS; i++) pthread_join(th[i], NULL);
  tdist_stats_file_t *f = read_stats(path);
  const uint64_t want = (uint64_t)CONC_OPS * CONC_GROUPS;
  TEST_LOG("concurrent writers: %llu all_reduces counted, %llu run",
           (unsigned long long)f->ops[k_idx[AR]], (unsigned long long)want);
  CHECK_EQ_INT(f->ops[k_idx[AR]], want);
  CHECK_EQ_INT(f->bytes[k_idx[AR]], want * 16);
  uint64_t hsum = 0;
  for (int b = 0; b <= TDIST_STATS_BUCKETS; b++) hsum += f->hist[k_idx[AR]][b];
  CHECK_EQ_INT(hsum, want);
  CHECK_EQ_INT(f->ops[k_idx[BAR]], 1);
  for (int i = 0; i < TDIST_STATS_OPS; i++) CHECK_EQ_INT(f->shared_ops[i], 0); /* summed */
  free(f);
  /* The child inherits the mapping and the owner's role on its (only) thread. */
  pid_t child = fork();
  CHECK(child >= 0);
  if (child == 0) {
    ca[0] = (conc_arg_t){g[1], CONC_OPS}; /* a copy of the group, used by the child alone */
    conc_main(&ca[0]);
    _exit(0);
  }
  ca[0] = (conc_arg_t){g[0], CONC_OPS};
  conc_main(&ca[0]);
  CHECK(test_expect_exit(child, 0, "stats writer in a forked child") == 0);
  f = read_stats(path);
  TEST_LOG("with a forked child: %llu all_reduces counted, %llu run",
           (unsigned long long)f->ops[k_idx[AR]], (unsigned long long)(want + 2 * CONC_OPS));
  CHECK_EQ_INT(f->ops[k_idx[AR]], want + 2 * (uint64_t)CONC_OPS);
  free(f);
  for (int i = 0; i < CONC_GROUPS; i++) tdist_pg_destroy(g[i]);
  tdist_store_destroy(ms);
  return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* (c) a failed collective                                                                   */

#define FAIL_OK_OPS 3

static int fail_body(int rank, int world, int port, void *arg) {
  (void)arg;
  float buf[256] = {0};
  if (rank == 1) {
    /* The victim runs in a grandchild so that this rank can report its planned death as a
     * success to the harness. */
    pid_t pid = fork();
    if (pid == 0) {
      tdist_store_t *store;
      tdist_pg_t *pg = tdist_test_init_pg(rank, world, port, 3000, &store);
      OK(pg, tdist_barrier(pg));
      for (int i = 0; i < FAIL_OK_OPS; i++)
        OK(pg, tdist_all_reduce(pg, buf, 256, TDIST_FLOAT32, TDIST_SUM));
      kill(getpid(), SIGKILL);
      _exit(7);
    }
    return test_expect_killed(pid, SIGKILL, "victim");
  }
  char path[512];
  use_stats_file("fail", rank, path, sizeof path);
  tdist_store_t *store;
  tdist_pg_t *pg = tdist_test_init_pg(rank, world, port, 3000, &store);
  OK(pg, tdist_barrier(pg));
  for (int i = 0; i < FAIL_OK_OPS; i++)
    OK(pg, tdist_all_reduce(pg, buf, 256, TDIST_FLOAT32, TDIST_SUM));
  tdist_status_t st = tdist_all_reduce(pg, buf, 256, TDIST_FLOAT32, TDIST_SUM);
  CHECK(st != TDIST_OK);
  TEST_LOG("fail: rank 0 got %s: %s", tdist_status_name(st), tdist_pg_last_error(pg));
  tdist_stats_file_t *f = read_stats(path);
  uint64_t failed_seq = 1 + FAIL_OK_OPS + 1;
  CHECK_EQ_INT(f->ops[k_idx[AR]], FAIL_OK_OPS + 1);
  CHECK_EQ_INT(f->errors[k_idx[AR]], 1);
  CHECK_EQ_INT(f->ops[k_idx[BAR]], 1);
  CHECK_EQ_INT(f->errors[k_idx[BAR]], 0);
  CHECK_EQ_INT(f->last_seq, failed_seq - 1);
  CHECK_EQ_INT(f->cur_seq, 0);
  CHECK_EQ_INT(f->cur_op, -1);
  CHECK_EQ_INT(f->flight_next, failed_seq);
  const tdist_stats_flight_t *e = &f->flight[failed_seq - 1];
  CHECK_EQ_INT(e->seq, failed_seq);
  CHECK_EQ_INT(e->op, k_idx[AR]);
  CHECK_EQ_INT(e->status, st);
  CHECK(e->start_ns > 0 && e->end_ns >= e->start_ns);
  for (uint64_t s = 1; s < failed_seq; s++) CHECK_EQ_INT(f->flight[s - 1].status, TDIST_OK);
  /* Sticky: later calls fail at once without running a collective; nothing is counted. */
  CHECK_EQ_INT(tdist_all_reduce(pg, buf, 1, TDIST_FLOAT32, TDIST_SUM), st);
  CHECK_EQ_INT(tdist_barrier(pg), st);
  tdist_stats_file_t *g = read_stats(path);
  CHECK_EQ_INT(g->ops[k_idx[AR]], FAIL_OK_OPS + 1);
  CHECK_EQ_INT(g->errors[k_idx[AR]], 1);
  CHECK_EQ_INT(g->ops[k_idx[BAR]], 1);
  CHECK_EQ_INT(g->flight_next, failed_seq);
  tdist_pg_destroy(pg);
  tdist_store_destroy(store);
  free(f);
  free(g);
  return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* (d) concurrent readers                                                                    */

typedef struct {
  _Atomic long reads, inflight_seen, torn;
  _Atomic int stop;
  char msg[WORLD][400];
} hammer_shared_t;

/* Seq s (world group) is a broadcast from root s % world with s % 37 floats when s % 3 == 0,
 * else an all_reduce of s % 37 floats; a barrier after the last. */
static int hammer_kind(uint64_t s) { return s > HAMMER_OPS ? BAR : s % 3 == 0 ? BC : AR; }
static uint64_t hammer_bytes(uint64_t s) { return s > HAMMER_OPS ? 0 : (s % 37) * 4; }

typedef struct {
  const char *path[2];
  int world, rank;
  hammer_shared_t *sh;
} reader_arg_t;

static void torn(reader_arg_t *r, const char *fmt, unsigned long long a, unsigned long long b) {
  if (atomic_fetch_add(&r->sh->torn, 1) == 0)
    snprintf(r->sh->msg[r->rank], sizeof r->sh->msg[r->rank], fmt, a, b);
}

static void *reader_main(void *arg) {
  reader_arg_t *r = arg;
  tdist_stats_file_t *f = malloc(sizeof *f);
  uint64_t prev_ops[2] = {0, 0};
  int seen[2] = {0, 0};
  CHECK(f != NULL);
  for (long n = 0; !atomic_load(&r->sh->stop); n++) {
    int which = (int)(n & 1);
    tdist_status_t st = tdist_stats_read(r->path[which], f);
    /* The peer's file may not be there yet, or be in the middle of its initialisation (size
     * set, magic not yet): both only before the first good read. */
    if (!seen[which] && (st == TDIST_ERR_NOT_FOUND || st == TDIST_ERR_PROTOCOL)) continue;
    seen[which] = 1;
    if (st != TDIST_OK) {
      torn(r, "tdist_stats_read: status %llu%llu", (unsigned long long)st, 0);
      continue;
    }
    atomic_fetch_add(&r->sh->reads, 1);
    uint64_t ops = f->ops[k_idx[AR]] + f->ops[k_idx[BC]];
    if (ops < prev_ops[which]) torn(r, "ops went back from %llu to %llu", prev_ops[which], ops);
    prev_ops[which] = ops;
    if (f->cur_seq) {
      atomic_fetch_add(&r->sh->inflight_seen, 1);
      int k = hammer_kind(f->cur_seq);
      int root = k == BC ? (int)(f->cur_seq % (uint64_t)r->world) : -1;
      if (f->cur_seq != f->last_seq + 1)
        torn(r, "in flight #%llu but last completed #%llu", f->cur_seq, f->last_seq);
      else if (f->cur_op != k_idx[k] || f->cur_peer != root)
        torn(r, "in flight #%llu with op/peer %llu", f->cur_seq,
             (unsigned long long)f->cur_op * 1000 + (unsigned long long)(f->cur_peer + 1));
      else if (f->cur_start_ns <= 0)
        torn(r, "in flight #%llu with start %llu", f->cur_seq, (unsigned long long)f->cur_start_ns);
    } else if (f->cur_op != -1 || f->cur_peer != -1 || f->cur_start_ns != 0) {
      torn(r, "idle block not clear: op %llu start %llu", (unsigned long long)f->cur_op,
           (unsigned long long)f->cur_start_ns);
    }
    for (int s = 0; s < TDIST_STATS_FLIGHT; s++) {
      const tdist_stats_flight_t *e = &f->flight[s];
      if (!e->seq) continue;
      int k = hammer_kind(e->seq);
      int root = k == BC ? (int)(e->seq % (uint64_t)r->world) : -1;
      int done = e->end_ns != 0;
      if ((e->seq - 1) % TDIST_STATS_FLIGHT != (uint64_t)s || e->op != k_idx[k] ||
          e->peer != root || e->bytes != hammer_bytes(e->seq) || e->start_ns <= 0 ||
          (done ? e->status != TDIST_OK || e->end_ns < e->start_ns
                : e->status != TDIST_ERR_IN_PROGRESS))
        torn(r, "flight slot %llu holds a torn entry for #%llu", (unsigned long long)s, e->seq);
    }
  }
  free(f);
  return NULL;
}

static int hammer_body(int rank, int world, int port, void *arg) {
  hammer_shared_t *sh = arg;
  char path[512], peer_path[512];
  use_stats_file("hammer", rank, path, sizeof path);
  stats_path(peer_path, sizeof peer_path, "hammer", (rank + 1) % world);
  tdist_store_t *store;
  tdist_pg_t *pg = tdist_test_init_pg(rank, world, port, 20000, &store);
  reader_arg_t ra = {{path, peer_path}, world, rank, sh};
  pthread_t th;
  CHECK(pthread_create(&th, NULL, reader_main, &ra) == 0);
  /* Start once the readers are reading (this rank's file is there since the group's init). */
  for (int64_t t = now_ms(); !atomic_load(&sh->reads) && now_ms() - t < 10000;) sched_yield();
  float buf[40] = {0};
  int64_t t0 = now_ms();
  for (uint64_t s = 1; s <= HAMMER_OPS; s++) {
    size_t n = (size_t)(s % 37);
    if (hammer_kind(s) == BC)
      OK(pg, tdist_broadcast(pg, buf, n, TDIST_FLOAT32, (int)(s % (uint64_t)world)));
    else
      OK(pg, tdist_all_reduce(pg, buf, n, TDIST_FLOAT32, TDIST_SUM));
  }
  OK(pg, tdist_barrier(pg)); /* the peer's reader keeps going until both are done */
  atomic_store(&sh->stop, 1);
  pthread_join(th, NULL);
  TEST_LOG("hammer: rank %d: %d ops in %lld ms", rank, HAMMER_OPS, (long long)(now_ms() - t0));
  tdist_pg_destroy(pg);
  tdist_store_destroy(store);
  return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* (e) reader errors, no file, unusable path                                                 */

static void write_file(const char *path, const void *p, size_t n) {
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  CHECK(fd >= 0);
  CHECK(write(fd, p, n) == (ssize_t)n);
  close(fd);
}

static void expect_read(const char *path, tdist_status_t want, const char *what) {
  tdist_stats_file_t *f = malloc(sizeof *f);
  CHECK(f != NULL);
  tdist_status_t st = tdist_stats_read(path, f);
  if (st != want) {
    fprintf(stderr, "tdist_stats_read on %s: %s, expected %s (%s)\n", what, tdist_status_name(st),
            tdist_status_name(want), tdist_last_error());
    exit(1);
  }
  if (path && st) CHECK(strstr(tdist_last_error(), path) != NULL); /* names the file */
  free(f);
}

static void reader_errors(void) {
  char path[512];
  stats_path(path, sizeof path, "garbage", 0);
  unlink(path);
  expect_read(path, TDIST_ERR_NOT_FOUND, "a missing file");
  write_file(path, "", 0);
  expect_read(path, TDIST_ERR_PROTOCOL, "an empty file");
  unsigned char *junk = malloc(2 * sizeof(tdist_stats_file_t));
  CHECK(junk != NULL);
  for (size_t i = 0; i < 2 * sizeof(tdist_stats_file_t); i++)
    junk[i] = (unsigned char)tdist_test_rand(99, 0, i);
  write_file(path, junk, 100);
  expect_read(path, TDIST_ERR_PROTOCOL, "100 random bytes");
  write_file(path, junk, sizeof(tdist_stats_file_t));
  expect_read(path, TDIST_ERR_PROTOCOL, "a file of random bytes of the right size");
  tdist_stats_file_t *h = (tdist_stats_file_t *)junk;
  h->magic = TDIST_STATS_MAGIC;
  h->version = TDIST_STATS_VERSION + 1;
  h->size = sizeof *h;
  write_file(path, junk, sizeof *h);
  expect_read(path, TDIST_ERR_PROTOCOL, "a newer version");
  h->version = TDIST_STATS_VERSION;
  h->size = sizeof *h + 8;
  write_file(path, junk, sizeof *h);
  expect_read(path, TDIST_ERR_PROTOCOL, "a wrong size field");
  h->size = sizeof *h;
  write_file(path, junk, sizeof *h - 1);
  expect_read(path, TDIST_ERR_PROTOCOL, "a truncated file");
  const char *tmp = getenv("TEST_TMPDIR") ? getenv("TEST_TMPDIR") : "/tmp";
  expect_read(tmp, TDIST_ERR_PROTOCOL, "a directory");
  tdist_stats_file_t f;
  CHECK_EQ_INT(tdist_stats_read(NULL, &f), TDIST_ERR_INVALID_ARGUMENT);
  CHECK_EQ_INT(tdist_stats_read(path, NULL), TDIST_ERR_INVALID_ARGUMENT);
  unlink(path);
  free(junk);
}

/* A writer stopped or killed in the middle of an update leaves a stamp odd for good: the reader
 * must come back (promptly) without the half-written block, and with everything else intact. */
static void frozen_writer(void) {
  char path[512];
  stats_path(path, sizeof path, "frozen", 0);
  tdist_stats_file_t *h = calloc(1, sizeof *h), *f = malloc(sizeof *f);
  CHECK(h && f);
  h->magic = TDIST_STATS_MAGIC;
  h->version = TDIST_STATS_VERSION;
  h->size = sizeof *h;
  h->rank = 3;
  h->world_size = 4;
  h->ops[k_idx[AR]] = 11;
  h->last_seq = 11;
  h->flight_next = 12;
  for (int i = 0; i < 12; i++) {
    h->flight[i] = (tdist_stats_flight_t){.seq = (uint64_t)i + 1,
                                          .op = k_idx[AR],
                                          .status = TDIST_OK,
                                          .start_ns = 1000 + i,
                                          .end_ns = 2000 + i,
                                          .bytes = 4,
                                          .peer = -1,
                                          .stamp = 2};
  }
  /* #12 half begun: the entry has its seq but not yet its op; the in-flight block likewise. */
  h->flight[11].stamp = 3;
  h->flight[11].op = 77;
  h->flight[11].end_ns = 0;
  h->cur_stamp = 5;
  h->cur_seq = 12;
  h->cur_op = -1;
  h->cur_peer = -1;
  h->cur_start_ns = 0;
  write_file(path, h, sizeof *h);
  /* The reader gives up on a block after a bounded number of tries (not a time): it returns, and
   * a hang would be the test's timeout. How long it takes is not asserted. */
  int64_t t0 = now_ms();
  CHECK_OK(tdist_stats_read(path, f));
  int64_t took = now_ms() - t0;
  TEST_LOG("frozen writer: read in %lld ms: cur_seq %llu cur_op %d, slot 11 seq %llu op %d",
           (long long)took, (unsigned long long)f->cur_seq, f->cur_op,
           (unsigned long long)f->flight[11].seq, f->flight[11].op);
  CHECK(f->cur_seq == 0 || (f->cur_op >= 0 && f->cur_op < TDIST_STATS_OPS && f->cur_start_ns > 0));
  CHECK(f->flight[11].seq == 0 || (f->flight[11].op >= 0 && f->flight[11].op < TDIST_STATS_OPS));
  CHECK_EQ_INT(f->last_seq, 11);
  CHECK_EQ_INT(f->ops[k_idx[AR]], 11);
  CHECK_EQ_INT(f->flight_next, 12);
  for (int i = 0; i < 11; i++) {
    CHECK_EQ_INT(f->flight[i].seq, i + 1);
    CHECK_EQ_INT(f->flight[i].end_ns, 2000 + i);
  }
  unlink(path);
  free(h);
  free(f);
}

/* Without TDIST_STATS_FILE nothing is written; with a path that cannot be created collectives
 * work as before (statistics off). */
static int off_body(int rank, int world, int port, void *arg) {
  int bad = *(int *)arg;
  char path[512];
  stats_path(path, sizeof path, "off", rank);
  unlink(path);
  if (bad) {
    snprintf(path, sizeof path, "/nonexistent-dir-%d/stats", (int)getpid());
    CHECK(setenv("TDIST_STATS_FILE", path, 1) == 0);
  } else {
    unsetenv("TDIST_STATS_FILE");
  }
  tdist_store_t *store;
  tdist_pg_t *pg = tdist_test_init_pg(rank, world, port, 20000, &store);
  int64_t v = rank + 1;
  for (int i = 0; i < 5; i++) {
    v = rank + 1;
    OK(pg, tdist_all_reduce(pg, &v, 1, TDIST_INT64, TDIST_SUM));
  }
  CHECK_EQ_INT(v, world * (world + 1) / 2);
  struct stat sb;
  CHECK(stat(path, &sb) != 0 && errno == ENOENT);
  tdist_pg_destroy(pg);
  tdist_store_destroy(store);
  return 0;
}

int main(void) {
  const char *seed = getenv("TDIST_TEST_SEED");
  g_seed = seed ? strtoull(seed, NULL, 0) : (uint64_t)time(NULL) ^ (uint64_t)getpid() << 20;
  TEST_LOG("seed %llu (TDIST_TEST_SEED=%llu repeats this run)", (unsigned long long)g_seed,
           (unsigned long long)g_seed);
  resolve_kinds();
  reader_errors();
  TEST_LOG("reader errors: ok");
  frozen_writer();
  int rc = 0, r;
  rc |= r = tdist_test_run_ranks(WORLD, 60000, random_body, NULL);
  TEST_LOG("random sequence: %s", r ? "FAILED" : "ok");
  rc |= r = tdist_test_run_ranks(2, 60000, ring_body, NULL);
  TEST_LOG("ring: %s", r ? "FAILED" : "ok");
  rc |= r = tdist_test_run_ranks(2, 60000, fail_body, NULL);
  TEST_LOG("failure: %s", r ? "FAILED" : "ok");
  hammer_shared_t *sh =
      mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  CHECK(sh != MAP_FAILED);
  memset(sh, 0, sizeof *sh);
  rc |= tdist_test_run_ranks(2, 60000, hammer_body, sh);
  TEST_LOG("hammer: %ld reads, %ld with a collective in flight, %ld torn", atomic_load(&sh->reads),
           atomic_load(&sh->inflight_seen), atomic_load(&sh->torn));
  for (int r = 0; r < WORLD; r++)
    if (sh->msg[r][0]) TEST_LOG("hammer: rank %d's reader: %s", r, sh->msg[r]);
  CHECK_EQ_INT(atomic_load(&sh->torn), 0);
  CHECK(atomic_load(&sh->reads) > 100);
  rc |= r = tdist_test_run_ranks(1, 60000, conc_body, NULL);
  TEST_LOG("concurrent writers: %s", r ? "FAILED" : "ok");
  int off = 0, bad = 1;
  r = tdist_test_run_ranks(2, 60000, off_body, &off);
  r |= tdist_test_run_ranks(2, 60000, off_body, &bad);
  rc |= r;
  TEST_LOG("statistics off / unusable path: %s", r ? "FAILED" : "ok");
  return rc;
}
