/* tdist_new_group on real processes: membership (non-members get NULL and TDIST_OK), ranks and
 * sizes inside subgroups, collectives inside subgroups checked against references built from
 * the members' parent ranks, disjoint subgroups running at the same time, subgroups used
 * alternately with the parent group, a subgroup of a subgroup, invalid rank lists (every rank
 * gets the same error and the group numbering stays in step), and the single-rank subgroup.
 * Worlds 5 and 4, each with the default transports and with TDIST_SHM=0 (TCP only); int64 data
 * (exact) and float32 max. Every rank checks in its own debug log (tests/testlib/logcap.h) that
 * each group of more than one rank it joined linked all its peers over shared memory (one line
 * per group) or, TCP only, that no group used shared memory. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "logcap.h"
#include "ranks.h"

#define N 1031
#define BIGN 70001 /* > 64 KiB of int64: the ring */
#define MAX_WORLD 8

#define OK(pg, expr) CHECK_OK_MSG(expr, tdist_pg_last_error(pg))

static int64_t val(uint64_t seed, int parent_rank, size_t i) {
  return (int64_t)(tdist_test_rand(seed, (uint64_t)parent_rank, i) % 20001) - 10000;
}

/* Index of `rank` in `ranks`, or -1. */
static int index_of(const int *ranks, int n, int rank) {
  for (int i = 0; i < n; i++)
    if (ranks[i] == rank) return i;
  return -1;
}

/* The groups of more than one rank this process joined: its rank and size in each. */
static struct { int rank, size; } g_joined[64];
static int g_njoined;

static void joined(int rank, int size) {
  if (size < 2) return;
  CHECK(g_njoined < (int)(sizeof g_joined / sizeof g_joined[0]));
  g_joined[g_njoined].rank = rank;
  g_joined[g_njoined++].size = size;
}

/* Creates a subgroup and checks membership, rank and size. */
static tdist_pg_t *make_group(tdist_pg_t *parent, const int *ranks, int n, int parent_rank) {
  tdist_pg_t *g = (tdist_pg_t *)(uintptr_t)1;
  CHECK_OK_MSG(tdist_new_group(parent, ranks, n, &g), tdist_last_error());
  int me = index_of(ranks, n, parent_rank);
  if (me < 0) {
    CHECK(g == NULL);
    return NULL;
  }
  CHECK(g != NULL);
  CHECK_EQ_INT(tdist_pg_rank(g), me);
  CHECK_EQ_INT(tdist_pg_size(g), n);
  joined(me, n);
  return g;
}

/* all_reduce SUM of int64 in group g (members `ranks` of the parent), checked. */
static void check_all_reduce(tdist_pg_t *g, const int *ranks, int n, int parent_rank, uint64_t seed,
                             size_t count) {
  int64_t *b = malloc(sizeof(int64_t) * count);
  CHECK(b != NULL);
  for (size_t i = 0; i < count; i++) b[i] = val(seed, parent_rank, i);
  OK(g, tdist_all_reduce(g, b, count, TDIST_INT64, TDIST_SUM));
  for (size_t i = 0; i < count; i++) {
    int64_t want = 0;
    for (int k = 0; k < n; k++) want += val(seed, ranks[k], i);
    if (b[i] != want) {
      fprintf(stderr,
              "subgroup all_reduce (seed %llu, %d members, count %zu): element %zu = %lld, "
              "want %lld\n",
              (unsigned long long)seed, n, count, i, (long long)b[i], (long long)want);
      exit(1);
    }
  }
  free(b);
}

/* broadcast from every group root, all_gather, reduce_scatter, float32 max all_reduce. */
static void check_more(tdist_pg_t *g, const int *ranks, int n, int parent_rank, uint64_t seed) {
  int me = tdist_pg_rank(g);
  int64_t *b = malloc(sizeof(int64_t) * N * (size_t)n);
  int64_t *o = malloc(sizeof(int64_t) * N * (size_t)n);
  CHECK(b && o);
  for (int root = 0; root < n; root++) {
    for (size_t i = 0; i < N; i++) b[i] = me == root ? val(seed + 1, ranks[root], i) : 0;
    OK(g, tdist_broadcast(g, b, N, TDIST_INT64, root));
    for (size_t i = 0; i < N; i++) CHECK_EQ_INT(b[i], val(seed + 1, ranks[root], i));
  }
  for (size_t i = 0; i < N; i++) b[i] = val(seed + 2, parent_rank, i);
  OK(g, tdist_all_gather(g, o, b, N, TDIST_INT64));
  for (int k = 0; k < n; k++)
    for (size_t i = 0; i < N; i++) CHECK_EQ_INT(o[(size_t)k * N + i], val(seed + 2, ranks[k], i));
  for (size_t i = 0; i < N * (size_t)n; i++) b[i] = val(seed + 3, parent_rank, i);
  OK(g, tdist_reduce_scatter(g, o, b, N, TDIST_INT64, TDIST_SUM));
  for (size_t i = 0; i < N; i++) {
    int64_t want = 0;
    for (int k = 0; k < n; k++) want += val(seed + 3, ranks[k], (size_t)me * N + i);
    CHECK_EQ_INT(o[i], want);
  }
  float f[N];
  for (size_t i = 0; i < N; i++) f[i] = (float)val(seed + 4, parent_rank, i);
  OK(g, tdist_all_reduce(g, f, N, TDIST_FLOAT32, TDIST_MAX));
  for (size_t i = 0; i < N; i++) {
    float want = -1e30f;
    for (int k = 0; k < n; k++) {
      float v = (float)val(seed + 4, ranks[k], i);
      want = v > want ? v : want;
    }
    CHECK(f[i] == want);
  }
  free(b);
  free(o);
}

static int body(int rank, int world, int port, void *arg) {
  int shm = *(const int *)arg;
  logcap_begin("subgroup");
  tdist_store_t *store;
  tdist_pg_t *pg = tdist_test_init_pg(rank, world, port, 20000, &store);
  joined(rank, world);
  int all[MAX_WORLD];
  for (int r = 0; r < world; r++) all[r] = r;

  /* invalid lists: the same error on every rank, nothing created, numbering unaffected */
  {
    tdist_pg_t *g = (tdist_pg_t *)(uintptr_t)1;
    int dec[] = {2, 1};
    CHECK_EQ_INT(tdist_new_group(pg, dec, 2, &g), TDIST_ERR_INVALID_ARGUMENT);
    CHECK(g == NULL);
    int dup[] = {0, 0};
    CHECK_EQ_INT(tdist_new_group(pg, dup, 2, &g), TDIST_ERR_INVALID_ARGUMENT);
    int out_of_range[] = {0, world};
    CHECK_EQ_INT(tdist_new_group(pg, out_of_range, 2, &g), TDIST_ERR_INVALID_ARGUMENT);
    int neg[] = {-1, 0};
    CHECK_EQ_INT(tdist_new_group(pg, neg, 2, &g), TDIST_ERR_INVALID_ARGUMENT);
    CHECK_EQ_INT(tdist_new_group(pg, all, 0, &g), TDIST_ERR_INVALID_ARGUMENT);
    CHECK_EQ_INT(tdist_new_group(pg, NULL, 1, &g), TDIST_ERR_INVALID_ARGUMENT);
    CHECK_EQ_INT(tdist_new_group(NULL, all, 1, &g), TDIST_ERR_INVALID_ARGUMENT);
    CHECK_EQ_INT(tdist_new_group(pg, all, 1, NULL), TDIST_ERR_INVALID_ARGUMENT);
  }

  /* even ranks, odd ranks, the whole world (a second communicator over the same ranks), the last
   * rank alone */
  int evens[MAX_WORLD], odds[MAX_WORLD], ne = 0, no = 0;
  for (int r = 0; r < world; r++) {
    if (r % 2)
      odds[no++] = r;
    else
      evens[ne++] = r;
  }
  int last[1] = {world - 1};
  tdist_pg_t *ge = make_group(pg, evens, ne, rank);
  tdist_pg_t *go = make_group(pg, odds, no, rank);
  tdist_pg_t *gall = make_group(pg, all, world, rank);
  tdist_pg_t *glast = make_group(pg, last, 1, rank);
  CHECK(gall != NULL);

  /* disjoint subgroups at the same time */
  if (ge) check_all_reduce(ge, evens, ne, rank, 11, N);
  if (go) check_all_reduce(go, odds, no, rank, 12, N);
  if (ge) check_all_reduce(ge, evens, ne, rank, 13, BIGN);
  if (go) check_all_reduce(go, odds, no, rank, 14, BIGN);
  if (ge) check_more(ge, evens, ne, rank, 100);
  if (go) check_more(go, odds, no, rank, 200);
  check_more(gall, all, world, rank, 300);
  if (glast) {
    check_all_reduce(glast, last, 1, rank, 15, N);
    check_more(glast, last, 1, rank, 400);
  }

  /* alternating: parent, evens, parent, odds, the second whole-world group, ... */
  for (int it = 0; it < 4; it++) {
    uint64_t s = 1000 + (uint64_t)it * 10;
    check_all_reduce(pg, all, world, rank, s, N);
    if (ge) check_all_reduce(ge, evens, ne, rank, s + 1, N);
    check_all_reduce(pg, all, world, rank, s + 2, it % 2 ? BIGN : 7);
    if (go) check_all_reduce(go, odds, no, rank, s + 3, N);
    check_all_reduce(gall, all, world, rank, s + 4, N);
    OK(pg, tdist_barrier(pg));
  }

  /* a subgroup of a subgroup: members 1 and 2 of the evens, i.e. parent ranks evens[1..2] */
  if (ge && ne >= 3) {
    int sub[] = {1, 2};
    int sub_parent[] = {evens[1], evens[2]};
    tdist_pg_t *gs = make_group(ge, sub, 2, tdist_pg_rank(ge));
    if (gs) {
      check_all_reduce(gs, sub_parent, 2, rank, 21, N);
      check_more(gs, sub_parent, 2, rank, 500);
    }
    check_all_reduce(ge, evens, ne, rank, 22, N); /* the evens still work */
    tdist_pg_destroy(gs);
  }

  /* a group created after others were destroyed still lines up on every rank */
  tdist_pg_destroy(glast);
  int first_two[] = {0, 1};
  tdist_pg_t *g2 = make_group(pg, first_two, 2, rank);
  if (g2) check_all_reduce(g2, first_two, 2, rank, 31, N);
  OK(pg, tdist_barrier(pg));

  tdist_pg_destroy(g2);
  tdist_pg_destroy(ge);
  tdist_pg_destroy(go);
  tdist_pg_destroy(gall);
  check_all_reduce(pg, all, world, rank, 41, N); /* the parent outlives its subgroups */
  tdist_pg_destroy(pg);
  tdist_store_destroy(store);
  char *log = logcap_end();
  int lines = logcap_count(log, "peers over shared memory");
  CHECK_EQ_INT(lines, shm ? g_njoined : 0);
  for (int i = 0; shm && i < g_njoined; i++) {
    char want[96];
    snprintf(want, sizeof want, "gloo: rank %d: %d peers over shared memory", g_joined[i].rank,
             g_joined[i].size - 1);
    if (!logcap_count(log, want)) {
      fprintf(stderr, "%s\nrank %d: no line '%s' (capture above)\n", log, rank, want);
      exit(1);
    }
  }
  free(log);
  return 0;
}

int main(void) {
  logcap_enable_debug();
  int worlds[] = {5, 4}, failed = 0;
  for (int tcp = 0; tcp < 2; tcp++) { /* default transports, then TCP only (inherited) */
    if (tcp)
      setenv("TDIST_SHM", "0", 1);
    else
      unsetenv("TDIST_SHM");
    int shm = !tcp;
    for (size_t k = 0; k < sizeof worlds / sizeof worlds[0]; k++) {
      int rc = tdist_test_run_ranks(worlds[k], 60000, body, &shm);
      TEST_LOG("world %d%s: %s", worlds[k], tcp ? " (TCP only)" : "", rc ? "FAILED" : "ok");
      failed |= rc;
    }
  }
  CHECK(!failed);
  TEST_LOG("ok");
  return 0;
}
