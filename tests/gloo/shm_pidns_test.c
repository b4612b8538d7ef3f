/* Same-host ranks that cannot open each other's shared memory fall back to TCP for that pair,
 * with a warning, and the group works: rank 2 of 3 runs in a pid namespace of its own (as two
 * containers of one pod without shareProcessNamespace, same hostname and boot id), so the
 * /proc/<pid>/fd/<fd> its peers are told leads elsewhere (shm.h). Ranks 0 and 1 must link over
 * shared memory, each warn that it cannot open rank 2's, rank 2 link with no one, and random
 * all_reduce / all_gather / send-recv results be right on every pair. Needs root for the pid
 * namespace (as in CI; elsewhere a skip, which fails unless TDIST_TEST_ALLOW_SKIP=1). */
#define _GNU_SOURCE
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "logcap.h"
#include "ranks.h"
#include "rng.h"
#include "skip.h"

#define WORLD 3
#define BIG 300000

static uint64_t g_seed;

static float val(int rank, size_t i) {
  return (float)(tdist_test_rand(g_seed, (uint64_t)rank, i) % 2000) - 1000.0f;
}

static int work(int rank, int world, int port) {
  logcap_begin("shmpidns");
  tdist_store_t *store;
  tdist_pg_t *pg = tdist_test_init_pg(rank, world, port, 60000, &store);
  static float buf[BIG * WORLD], in[BIG];
  size_t counts[] = {3, 5000, BIG};
  for (size_t c = 0; c < 3; c++) {
    size_t n = counts[c];
    for (size_t i = 0; i < n; i++) buf[i] = val(rank, i);
    CHECK_OK_MSG(tdist_all_reduce(pg, buf, n, TDIST_FLOAT32, TDIST_SUM), tdist_pg_last_error(pg));
    for (size_t i = 0; i < n; i++) {
      float want = 0; /* small integers: exact in any order */
      for (int r = 0; r < world; r++) want += val(r, i);
      CHECK(buf[i] == want);
    }
    for (size_t i = 0; i < n; i++) in[i] = val(rank + 5, i);
    CHECK_OK_MSG(tdist_all_gather(pg, buf, in, n, TDIST_FLOAT32), tdist_pg_last_error(pg));
    for (int r = 0; r < world; r++)
      for (size_t i = 0; i < n; i++) CHECK(buf[(size_t)r * n + i] == val(r + 5, i));
    /* Around the ring 0 -> 1 -> 2 -> 0 (rank 0 sends first, the others receive first). */
    int to = (rank + 1) % world, from = (rank + world - 1) % world;
    for (size_t i = 0; i < n; i++) in[i] = val(rank + 9, i);
    if (rank == 0)
      CHECK_OK_MSG(tdist_send(pg, in, n, TDIST_FLOAT32, to, 7), tdist_pg_last_error(pg));
    CHECK_OK_MSG(tdist_recv(pg, buf, n, TDIST_FLOAT32, from, 7), tdist_pg_last_error(pg));
    if (rank != 0)
      CHECK_OK_MSG(tdist_send(pg, in, n, TDIST_FLOAT32, to, 7), tdist_pg_last_error(pg));
    for (size_t i = 0; i < n; i++) CHECK(buf[i] == val(from + 9, i));
  }
  tdist_pg_destroy(pg);
  tdist_store_destroy(store);
  char *log = logcap_end();
  int cannot = logcap_count(log, "shared memory through /proc/");
  int uses_tcp = logcap_count(log, "that pair uses TCP");
  int linked = logcap_count(log, "1 peers over shared memory");
  int any = logcap_count(log, "peers over shared memory");
  if (rank < 2) {
    /* rank 2's descriptor, as its pid 1 names it here, is not the segment */
    CHECK_EQ_INT(linked, 1);
    CHECK_CMP_INT(cannot, >=, 1);
    CHECK(strstr(log, "cannot open rank 2's shared memory through /proc/1/fd/") != NULL);
    CHECK_CMP_INT(uses_tcp, >=, 1);
  } else {
    CHECK_EQ_INT(any, 0); /* it may open theirs (the host's /proc), but they cannot open its */
  }
  free(log);
  return 0;
}

static int body(int rank, int world, int port, void *arg) {
  (void)arg;
  if (rank != 2) return work(rank, world, port);
  /* Rank 2: pid 1 of a new pid namespace (the /proc mount stays the host's). */
  if (unshare(CLONE_NEWPID) != 0) {
    fprintf(stderr, "rank 2: unshare(CLONE_NEWPID): %s\n", strerror(errno));
    return 77;
  }
  pid_t c = fork();
  if (c < 0) return 3;
  if (c == 0) _exit(work(rank, world, port));
  int st = 0;
  if (waitpid(c, &st, 0) != c) return 4;
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

int main(void) {
  /* Can this machine make a pid namespace? Probed in a child: unshare(CLONE_NEWPID) here would
   * put every rank forked later into a new one. */
  pid_t probe = fork();
  CHECK(probe >= 0);
  if (probe == 0) _exit(unshare(CLONE_NEWPID) == 0 ? 0 : 1);
  int pst = 0;
  CHECK(waitpid(probe, &pst, 0) == probe);
  if (!WIFEXITED(pst) || WEXITSTATUS(pst) != 0) {
    test_skip("shm_pidns_test: cannot make a pid namespace; needs root");
    return 0;
  }
  logcap_enable_debug();
  g_seed = test_seed("shm_pidns_test", 0);
  CHECK(tdist_test_run_ranks(WORLD, 120000, body, NULL) == 0);
  TEST_LOG("ok: ranks 0 and 1 over shared memory, rank 2 (another pid namespace) over TCP");
  return 0;
}
