/* Backend "mpi" beyond the sweep: one rank of an mpirun job (tests/mpi/mpi_backend_test.sh
 * starts it and checks what the job printed and how it ended). The scenario is argv[1]:
 *   async      every _async form with random data against references computed here, in-place
 *              all_gather/gather/scatter, send/recv whose tags are received in the other
 *              order, subgroups (two overlapping ones, members and non-members), AVG on
 *              integers, monitored_barrier, tdist_pg_abort; needs 4 ranks;
 *   options    rank / world_size in the options that contradict MPI are refused naming both
 *              (RANK and WORLD_SIZE: the script sets them with mpirun -x);
 *   initfail   tdist_init_process_group(mpi) must fail; prints the error (the script checks it);
 *   stall      rank 1 stops calling: the others' all_reduce outlives the 1.5 s timeout and the
 *              watchdog ends the job, naming the collective;
 *   kill       rank 1 is killed (SIGKILL) mid-loop; the job must end within timeout + grace;
 *   monitored  rank 2 skips a monitored_barrier: rank 0 names it, rank 1 says rank 0 did not
 *              release it; both within the barrier's timeout;
 *   nojoin     rank 2 never calls tdist_new_group for a subgroup it is in: the others' group
 *              creation outlives the 1.5 s timeout and the watchdog ends the job, saying so. */
#define _GNU_SOURCE
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "tdist/tdist.h"

#define N 1031

static tdist_pg_t *init_mpi(int64_t timeout_ms) {
  tdist_pg_options_t o = TDIST_PG_OPTIONS_INIT;
  o.backend = "mpi";
  o.timeout_ms = timeout_ms;
  tdist_pg_t *pg = NULL;
  tdist_status_t st = tdist_init_process_group(&o, &pg);
  if (st) TEST_FAIL("init_process_group(mpi): %s: %s", tdist_status_name(st), tdist_last_error());
  return pg;
}

static uint64_t rnd(uint64_t seed, uint64_t a, uint64_t b) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull ^ a * 0xBF58476D1CE4E5B9ull ^ b * 0x94D049BB133111EBull;
  x ^= x >> 31;
  x *= 0xD6E8FEB86CA9F6E5ull;
  return x ^ (x >> 29);
}

/* st: what the _async call returned; *w: the work it made (read only after the call). */
static void wait_ok(tdist_pg_t *pg, tdist_status_t st, tdist_work_t **w, const char *what) {
  if (!st) st = tdist_work_wait(*w, -1);
  tdist_work_destroy(*w);
  *w = NULL;
  if (st) TEST_FAIL("%s: %s: %s", what, tdist_status_name(st), tdist_pg_last_error(pg));
}

static void scenario_async(void) {
  tdist_pg_t *pg = init_mpi(30000);
  int me = tdist_pg_rank(pg), p = tdist_pg_size(pg);
  CHECK_EQ_INT(p, 4);
  CHECK_STR(tdist_pg_backend(pg), "mpi");
  tdist_work_t *w = NULL;
  int64_t *a = calloc((size_t)p * N, 8), *b = calloc((size_t)p * N, 8);
  CHECK(a && b);

  /* all_reduce SUM, int64, async */
  for (int i = 0; i < N; i++) a[i] = (int64_t)(rnd(1, (uint64_t)me, (uint64_t)i) % 1000000);
  wait_ok(pg, tdist_all_reduce_async(pg, a, N, TDIST_INT64, TDIST_SUM, &w), &w, "all_reduce");
  for (int i = 0; i < N; i++) {
    int64_t want = 0;
    for (int r = 0; r < p; r++) want += (int64_t)(rnd(1, (uint64_t)r, (uint64_t)i) % 1000000);
    CHECK_EQ_INT(a[i], want);
  }
  /* AVG on int32 truncates toward zero, as torch does */
  int32_t *ia = (int32_t *)a;
  for (int i = 0; i < N; i++) ia[i] = (int32_t)(rnd(2, (uint64_t)me, (uint64_t)i) % 2001) - 1000;
  CHECK_OK(tdist_all_reduce(pg, ia, N, TDIST_INT32, TDIST_AVG));
  for (int i = 0; i < N; i++) {
    int64_t s = 0;
    for (int r = 0; r < p; r++) s += (int64_t)(rnd(2, (uint64_t)r, (uint64_t)i) % 2001) - 1000;
    CHECK_EQ_INT(ia[i], s / p);
  }
  /* broadcast from every root, async */
  for (int root = 0; root < p; root++) {
    for (int i = 0; i < N; i++)
      a[i] = me == root ? (int64_t)rnd(3, (uint64_t)root, (uint64_t)i) : -1;
    wait_ok(pg, tdist_broadcast_async(pg, a, N, TDIST_INT64, root, &w), &w, "broadcast");
    for (int i = 0; i < N; i++) CHECK_EQ_INT(a[i], (int64_t)rnd(3, (uint64_t)root, (uint64_t)i));
  }
  /* reduce MAX to root 2, async */
  for (int i = 0; i < N; i++) a[i] = (int64_t)rnd(4, (uint64_t)me, (uint64_t)i);
  wait_ok(pg, tdist_reduce_async(pg, a, N, TDIST_INT64, TDIST_MAX, 2, &w), &w, "reduce");
  if (me == 2)
    for (int i = 0; i < N; i++) {
      int64_t want = INT64_MIN;
      for (int r = 0; r < p; r++) {
        int64_t v = (int64_t)rnd(4, (uint64_t)r, (uint64_t)i);
        if (v > want) want = v;
      }
      CHECK_EQ_INT(a[i], want);
    }
  /* all_gather, async and in place (in = out + rank * count) */
  for (int pass = 0; pass < 2; pass++) {
    int64_t *in = pass ? b + (size_t)me * N : a;
    for (int i = 0; i < N; i++) in[i] = (int64_t)rnd(5, (uint64_t)me, (uint64_t)i + (uint64_t)pass);
    wait_ok(pg, tdist_all_gather_async(pg, b, in, N, TDIST_INT64, &w), &w, "all_gather");
    for (int r = 0; r < p; r++)
      for (int i = 0; i < N; i++)
        CHECK_EQ_INT(b[(size_t)r * N + i],
                     (int64_t)rnd(5, (uint64_t)r, (uint64_t)i + (uint64_t)pass));
  }
  /* all_gather_v, uneven (rank r gives r * 7 elements, blocks in reverse order) */
  {
    size_t counts[4], displs[4], off = 0;
    for (int r = p - 1; r >= 0; r--) {
      counts[r] = (size_t)r * 7;
      displs[r] = off;
      off += counts[r];
    }
    for (size_t i = 0; i < counts[me]; i++) a[i] = (int64_t)rnd(6, (uint64_t)me, i);
    wait_ok(pg, tdist_all_gather_v_async(pg, b, counts, displs, a, TDIST_INT64, &w), &w,
            "all_gather_v");
    for (int r = 0; r < p; r++)
      for (size_t i = 0; i < counts[r]; i++)
        CHECK_EQ_INT(b[displs[r] + i], (int64_t)rnd(6, (uint64_t)r, i));
  }
  /* gather and scatter at root 1, async, root in place */
  for (int i = 0; i < N; i++) b[(size_t)me * N + i] = (int64_t)rnd(7, (uint64_t)me, (uint64_t)i);
  wait_ok(pg, tdist_gather_async(pg, me == 1 ? b : NULL, b + (size_t)me * N, N, TDIST_INT64, 1, &w),
          &w, "gather");
  if (me == 1)
    for (int r = 0; r < p; r++)
      for (int i = 0; i < N; i++)
        CHECK_EQ_INT(b[(size_t)r * N + i], (int64_t)rnd(7, (uint64_t)r, (uint64_t)i));
  if (me == 1)
    for (int r = 0; r < p; r++)
      for (int i = 0; i < N; i++) b[(size_t)r * N + i] = (int64_t)rnd(8, (uint64_t)r, (uint64_t)i);
  wait_ok(pg,
          tdist_scatter_async(pg, b + (size_t)me * N, me == 1 ? b : NULL, N, TDIST_INT64, 1, &w),
          &w, "scatter");
  for (int i = 0; i < N; i++)
    CHECK_EQ_INT(b[(size_t)me * N + i], (int64_t)rnd(8, (uint64_t)me, (uint64_t)i));
  /* reduce_scatter SUM float64 (small integers: exact) */
  {
    double *din = (double *)a, *dout = (double *)b;
    for (int j = 0; j < p * N; j++) din[j] = (double)(rnd(9, (uint64_t)me, (uint64_t)j) % 1000);
    wait_ok(pg, tdist_reduce_scatter_async(pg, dout, din, N, TDIST_FLOAT64, TDIST_SUM, &w), &w,
            "reduce_scatter");
    for (int i = 0; i < N; i++) {
      double want = 0;
      for (int r = 0; r < p; r++)
        want += (double)(rnd(9, (uint64_t)r, (uint64_t)(me * N + i)) % 1000);
      CHECK(dout[i] == want);
    }
  }
  /* all_to_all and an uneven all_to_all_v, async */
  for (int j = 0; j < p * N; j++) a[j] = (int64_t)rnd(10, (uint64_t)me, (uint64_t)j);
  wait_ok(pg, tdist_all_to_all_async(pg, b, a, N, TDIST_INT64, &w), &w, "all_to_all");
  for (int r = 0; r < p; r++)
    for (int i = 0; i < N; i++)
      CHECK_EQ_INT(b[(size_t)r * N + i], (int64_t)rnd(10, (uint64_t)r, (uint64_t)(me * N + i)));
  {
    /* rank s sends (s + d) % 3 * 5 elements to d, packed in order of d */
    size_t ic[4], id[4], oc[4], od[4], io = 0, oo = 0;
    for (int d = 0; d < p; d++) {
      ic[d] = (size_t)((me + d) % 3) * 5;
      id[d] = io;
      io += ic[d];
      oc[d] = (size_t)((d + me) % 3) * 5;
      od[d] = oo;
      oo += oc[d];
    }
    for (int d = 0; d < p; d++)
      for (size_t i = 0; i < ic[d]; i++) a[id[d] + i] = (int64_t)rnd(11, (uint64_t)(me * 8 + d), i);
    wait_ok(pg, tdist_all_to_all_v_async(pg, b, oc, od, a, ic, id, TDIST_INT64, &w), &w,
            "all_to_all_v");
    for (int s = 0; s < p; s++)
      for (size_t i = 0; i < oc[s]; i++)
        CHECK_EQ_INT(b[od[s] + i], (int64_t)rnd(11, (uint64_t)(s * 8 + me), i));
  }
  wait_ok(pg, tdist_barrier_async(pg, &w), &w, "barrier");
  /* send/recv: rank 0 sends tags 5 then 7 to rank 1, which receives 7 first (MPI matches by
   * (peer, tag) in any order); the async forms between ranks 2 and 3 */
  if (me == 0) {
    a[0] = 55;
    b[0] = 77;
    CHECK_OK(tdist_send(pg, a, 1, TDIST_INT64, 1, 5));
    CHECK_OK(tdist_send(pg, b, 1, TDIST_INT64, 1, 7));
  } else if (me == 1) {
    CHECK_OK(tdist_recv(pg, a, 1, TDIST_INT64, 0, 7));
    CHECK_OK(tdist_recv(pg, b, 1, TDIST_INT64, 0, 5));
    CHECK_EQ_INT(a[0], 77);
    CHECK_EQ_INT(b[0], 55);
  } else {
    int peer = me == 2 ? 3 : 2;
    for (int i = 0; i < N; i++) a[i] = (int64_t)rnd(12, (uint64_t)me, (uint64_t)i);
    if (me == 2) {
      wait_ok(pg, tdist_send_async(pg, a, N, TDIST_INT64, peer, 9, &w), &w, "send");
      wait_ok(pg, tdist_recv_async(pg, b, N, TDIST_INT64, peer, 9, &w), &w, "recv");
    } else {
      wait_ok(pg, tdist_recv_async(pg, b, N, TDIST_INT64, peer, 9, &w), &w, "recv");
      wait_ok(pg, tdist_send_async(pg, a, N, TDIST_INT64, peer, 9, &w), &w, "send");
    }
    for (int i = 0; i < N; i++) CHECK_EQ_INT(b[i], (int64_t)rnd(12, (uint64_t)peer, (uint64_t)i));
  }
  /* subgroups: {0, 2} and {1, 2, 3}; non-members get NULL */
  int ev[] = {0, 2}, od3[] = {1, 2, 3};
  tdist_pg_t *g1 = NULL, *g2 = NULL;
  CHECK_OK(tdist_new_group(pg, ev, 2, &g1));
  CHECK_OK(tdist_new_group(pg, od3, 3, &g2));
  CHECK_EQ_INT(g1 != NULL, me == 0 || me == 2);
  CHECK_EQ_INT(g2 != NULL, me >= 1);
  if (g1) {
    CHECK_EQ_INT(tdist_pg_rank(g1), me / 2);
    a[0] = me + 1;
    CHECK_OK(tdist_all_reduce(g1, a, 1, TDIST_INT64, TDIST_SUM));
    CHECK_EQ_INT(a[0], 1 + 3);
  }
  if (g2) {
    CHECK_EQ_INT(tdist_pg_rank(g2), me - 1);
    a[0] = me * 10;
    wait_ok(g2, tdist_all_reduce_async(g2, a, 1, TDIST_INT64, TDIST_PROD, &w), &w,
            "sub all_reduce");
    CHECK_EQ_INT(a[0], 10 * 20 * 30);
  }
  tdist_pg_destroy(g1);
  tdist_pg_destroy(g2);
  CHECK_OK(tdist_monitored_barrier(pg, 10000));
  /* wrong arguments are refused and leave the group usable */
  CHECK_STATUS(tdist_send(pg, a, 1, TDIST_INT64, me, 0), TDIST_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(tdist_all_reduce(pg, a, 1, TDIST_FLOAT32, TDIST_BAND), TDIST_ERR_INVALID_ARGUMENT);
  CHECK_OK(tdist_barrier(pg));
  /* abort: later calls fail at once */
  tdist_pg_abort(pg);
  CHECK_STATUS(tdist_barrier(pg), TDIST_ERR_ABORTED);
  tdist_pg_destroy(pg);
  free(a);
  free(b);
  if (me == 0) TEST_LOG("mpi async scenario: ok");
}

static void scenario_options(void) {
  /* The script gives RANK/WORLD_SIZE values that contradict MPI; the options are checked
   * first, when they are set. */
  const char *which = getenv("MPI_TEST_WHICH");
  tdist_pg_options_t o = TDIST_PG_OPTIONS_INIT;
  o.backend = "mpi";
  if (which && !strcmp(which, "opts")) {
    o.rank = 99;
  }
  tdist_pg_t *pg = NULL;
  tdist_status_t st = tdist_init_process_group(&o, &pg);
  CHECK_STATUS(st, TDIST_ERR_INVALID_ARGUMENT);
  printf("refused: %s\n", tdist_last_error());
  fflush(stdout);
}

static void scenario_initfail(void) {
  tdist_pg_options_t o = TDIST_PG_OPTIONS_INIT;
  o.backend = "mpi";
  tdist_pg_t *pg = NULL;
  tdist_status_t st = tdist_init_process_group(&o, &pg);
  CHECK(st != TDIST_OK);
  printf("init failed: %s: %s\n", tdist_status_name(st), tdist_last_error());
}

static void scenario_stall(void) {
  tdist_pg_t *pg = init_mpi(1500);
  int me = tdist_pg_rank(pg);
  int64_t x = 1;
  for (int i = 0; i < 5; i++) CHECK_OK(tdist_all_reduce(pg, &x, 1, TDIST_INT64, TDIST_SUM));
  if (me == 1) {
    fprintf(stderr, "rank 1: stopping (SIGSTOP)\n");
    raise(SIGSTOP);
  }
  tdist_all_reduce(pg, &x, 1, TDIST_INT64, TDIST_SUM);
  TEST_FAIL("rank %d: the stalled all_reduce returned", me);
}

static void scenario_kill(void) {
  tdist_pg_t *pg = init_mpi(20000);
  int me = tdist_pg_rank(pg);
  int64_t x[256] = {0};
  for (int i = 0;; i++) {
    if (me == 1 && i == 50) {
      fprintf(stderr, "rank 1: SIGKILL\n");
      raise(SIGKILL);
    }
    tdist_status_t st = tdist_all_reduce(pg, x, 256, TDIST_INT64, TDIST_SUM);
    if (st) {
      fprintf(stderr, "rank %d: all_reduce failed: %s\n", me, tdist_pg_last_error(pg));
      return;
    }
  }
}

static void scenario_monitored(void) {
  tdist_pg_t *pg = init_mpi(30000);
  int me = tdist_pg_rank(pg);
  CHECK_OK(tdist_barrier(pg));
  if (me == 2) {
    sleep(3);
    fprintf(stderr, "rank 2: skipped the monitored barrier\n");
    _exit(0);
  }
  tdist_status_t st = tdist_monitored_barrier(pg, 1000);
  CHECK_STATUS(st, TDIST_ERR_TIMEOUT);
  printf("rank %d: %s\n", me, tdist_pg_last_error(pg));
  fflush(stdout);
  _exit(0);
}

static void scenario_nojoin(void) {
  tdist_pg_t *pg = init_mpi(1500);
  int me = tdist_pg_rank(pg);
  CHECK_OK(tdist_barrier(pg));
  if (me == 2) {
    sleep(30);
    _exit(0);
  }
  int ranks[] = {0, 1, 2};
  tdist_pg_t *sub = NULL;
  tdist_new_group(pg, ranks, 3, &sub);
  TEST_FAIL("rank %d: tdist_new_group returned without rank 2", me);
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  const char *s = argc > 1 ? argv[1] : "";
  if (!strcmp(s, "async"))
    scenario_async();
  else if (!strcmp(s, "options"))
    scenario_options();
  else if (!strcmp(s, "initfail"))
    scenario_initfail();
  else if (!strcmp(s, "stall"))
    scenario_stall();
  else if (!strcmp(s, "kill"))
    scenario_kill();
  else if (!strcmp(s, "monitored"))
    scenario_monitored();
  else if (!strcmp(s, "nojoin"))
    scenario_nojoin();
  else
    TEST_FAIL("unknown scenario '%s'", s);
  return 0;
}
