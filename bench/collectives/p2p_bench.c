/* p2p_bench: send/recv latency between 2 ranks of one host, and what a rank waiting in a receive
 * costs in CPU. Prints; asserts nothing about speed.
 *
 *   p2p_bench [ITERS]     (TDIST_SHM=0 for TCP; the default uses the shared-memory rings;
 *                          P2P_BENCH_MODES=2: the first two rows only, for a libtdist without
 *                          order-free sends/receives, where recv-first deadlocks)
 *
 * Rows: one-way time (half a ping-pong round trip, median of 7 passes of ITERS round trips) for
 *   blocking   tdist_send / tdist_recv on the calling thread;
 *   async      tdist_send_async / tdist_recv_async + tdist_work_wait (the worker thread, as the
 *              "tdist" PyTorch backend's send/recv run);
 *   recv-first both ranks post an irecv, then an isend, then wait for both (PyTorch's
 *              batch_isend_irecv pattern: one exchange, so the time is a whole round);
 * then "idle wait": rank 0 posts an irecv that rank 1 answers only after 1 s; rank 0's CPU time
 * (user + system, both threads) during that second.
 * The ranks are this program forked; they meet through a file store under $TMPDIR. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tdist/tdist.h"

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static void ok(tdist_pg_t *pg, tdist_status_t st, const char *what) {
  if (st) {
    fprintf(stderr, "p2p_bench: %s: %s\n", what, tdist_pg_last_error(pg));
    exit(1);
  }
}

static void wait_ok(tdist_pg_t *pg, tdist_work_t *w) {
  ok(pg, tdist_work_wait(w, -1), "wait");
  tdist_work_destroy(w);
}

/* One ping-pong round trip of n bytes in mode m (0 blocking, 1 async, 2 recv-first). */
static void round_trip(tdist_pg_t *pg, int rank, int m, uint8_t *buf, uint8_t *in, size_t n) {
  int peer = 1 - rank;
  tdist_work_t *w[2];
  if (m == 2) {
    ok(pg, tdist_recv_async(pg, in, n, TDIST_UINT8, peer, 0, &w[0]), "irecv");
    ok(pg, tdist_send_async(pg, buf, n, TDIST_UINT8, peer, 0, &w[1]), "isend");
    wait_ok(pg, w[0]);
    wait_ok(pg, w[1]);
    return;
  }
  for (int step = 0; step < 2; step++) {
    int sending = (step == 0) == (rank == 0);
    if (m == 0) {
      ok(pg,
         sending ? tdist_send(pg, buf, n, TDIST_UINT8, peer, 0)
                 : tdist_recv(pg, in, n, TDIST_UINT8, peer, 0),
         "send/recv");
    } else {
      ok(pg,
         sending ? tdist_send_async(pg, buf, n, TDIST_UINT8, peer, 0, &w[0])
                 : tdist_recv_async(pg, in, n, TDIST_UINT8, peer, 0, &w[0]),
         "isend/irecv");
      wait_ok(pg, w[0]);
    }
  }
}

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static void rank_main(int rank, const char *path, int iters) {
  char url[512];
  snprintf(url, sizeof url, "file://%s?rank=%d&world_size=2", path, rank);
  tdist_pg_options_t o = TDIST_PG_OPTIONS_INIT;
  o.init_method = url;
  o.timeout_ms = 60000;
  tdist_pg_t *pg;
  if (tdist_init_process_group(&o, &pg)) {
    fprintf(stderr, "p2p_bench: init: %s\n", tdist_last_error());
    exit(1);
  }
  static const size_t sizes[] = {4, 1024, 65536, 1 << 20};
  static const char *modes[] = {"blocking", "async", "recv-first"};
  size_t maxn = 1 << 20;
  uint8_t *buf = malloc(maxn), *in = malloc(maxn);
  memset(buf, 7, maxn);
  if (rank == 0) printf("%-10s %10s %12s\n", "mode", "bytes", "one-way us");
  int nmodes = getenv("P2P_BENCH_MODES") ? atoi(getenv("P2P_BENCH_MODES")) : 3;
  for (int m = 0; m < nmodes && m < 3; m++)
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
      size_t n = sizes[k];
      int it = n >= 65536 ? iters / 10 + 1 : iters;
      for (int i = 0; i < it / 10 + 1; i++) round_trip(pg, rank, m, buf, in, n); /* warm-up */
      double pass[7];
      for (int p = 0; p < 7; p++) {
        ok(pg, tdist_barrier(pg), "barrier");
        double t0 = now_us();
        for (int i = 0; i < it; i++) round_trip(pg, rank, m, buf, in, n);
        pass[p] = (now_us() - t0) / it / 2;
      }
      qsort(pass, 7, sizeof pass[0], cmp_d);
      if (rank == 0) printf("%-10s %10zu %12.2f\n", modes[m], n, pass[3]);
    }
  ok(pg, tdist_barrier(pg), "barrier");
  /* Idle wait: rank 0 waits 1 s in an irecv. */
  if (rank == 0) {
    struct rusage a, b;
    tdist_work_t *w;
    getrusage(RUSAGE_SELF, &a);
    double t0 = now_us();
    ok(pg, tdist_recv_async(pg, in, 4, TDIST_UINT8, 1, 5, &w), "irecv");
    wait_ok(pg, w);
    double wall = now_us() - t0;
    getrusage(RUSAGE_SELF, &b);
    double cpu =
        (b.ru_utime.tv_sec - a.ru_utime.tv_sec) * 1e6 + (b.ru_utime.tv_usec - a.ru_utime.tv_usec) +
        (b.ru_stime.tv_sec - a.ru_stime.tv_sec) * 1e6 + (b.ru_stime.tv_usec - a.ru_stime.tv_usec);
    printf("idle wait: %.0f ms in an irecv, %.1f ms of CPU (%.1f%% of a core)\n", wall / 1e3,
           cpu / 1e3, 100 * cpu / wall);
  } else {
    usleep(1000000);
    ok(pg, tdist_send(pg, buf, 4, TDIST_UINT8, 0, 5), "send");
  }
  free(buf);
  free(in);
  tdist_pg_destroy(pg);
  exit(0);
}

int main(int argc, char **argv) {
  int iters = argc > 1 ? atoi(argv[1]) : 2000;
  const char *tmp = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
  char path[400];
  snprintf(path, sizeof path, "%s/p2p_bench.%d", tmp, (int)getpid());
  unlink(path);
  printf("p2p_bench: 2 ranks, %s, %d round trips per pass (64 KiB and up: %d)\n",
         getenv("TDIST_SHM") && !strcmp(getenv("TDIST_SHM"), "0") ? "TCP" : "shared memory", iters,
         iters / 10 + 1);
  fflush(stdout);
  pid_t pid[2];
  for (int r = 0; r < 2; r++)
    if ((pid[r] = fork()) == 0) rank_main(r, path, iters);
  int bad = 0;
  for (int r = 0; r < 2; r++) {
    int status = 0;
    waitpid(pid[r], &status, 0);
    bad |= !WIFEXITED(status) || WEXITSTATUS(status);
  }
  unlink(path);
  return bad;
}
