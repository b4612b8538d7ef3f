/* A /dev/shm too small for every pair's rings (as in a pod whose memory-backed /dev/shm has a
 * small sizeLimit): the group must still start and compute right, the pairs that found room over
 * shared memory and the others over TCP, each of those with a warning naming the peer and what
 * to change. Before the rings were allocated at setup, a full /dev/shm killed a rank with
 * SIGBUS at its first write into an unbacked page.
 *
 * Needs a private mount namespace with a small tmpfs on /dev/shm (root, as in CI); elsewhere it
 * says so and checks nothing. */
#define _GNU_SOURCE
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <unistd.h>

#include "check.h"
#include "logcap.h"
#include "ranks.h"

#define WORLD 4
#define BIG 300000 /* floats: 1.2 MB, single copies where the pair has shared memory */

static const char *g_dir;

static float val(int rank, size_t i) {
  return (float)(tdist_test_rand(11, (uint64_t)rank, i) % 2000) - 1000.0f;
}

static int body(int rank, int world, int port, void *arg) {
  (void)arg;
  logcap_begin("shmfull");
  tdist_store_t *store;
  tdist_pg_t *pg = tdist_test_init_pg(rank, world, port, 30000, &store);
  float *buf = malloc(sizeof(float) * BIG * WORLD), *in = malloc(sizeof(float) * BIG);
  CHECK(buf && in);
  size_t counts[] = {2, 1000, BIG};
  for (size_t c = 0; c < 3; c++) {
    size_t n = counts[c];
    for (size_t i = 0; i < n; i++) buf[i] = val(rank, i);
    CHECK_OK_MSG(tdist_all_reduce(pg, buf, n, TDIST_FLOAT32, TDIST_SUM), tdist_pg_last_error(pg));
    for (size_t i = 0; i < n; i++) {
      float want = 0; /* small integers: exact in any order */
      for (int r = 0; r < world; r++) want += val(r, i);
      CHECK(buf[i] == want);
    }
    for (size_t i = 0; i < n; i++) in[i] = val(rank + 7, i);
    CHECK_OK_MSG(tdist_all_gather(pg, buf, in, n, TDIST_FLOAT32), tdist_pg_last_error(pg));
    for (int r = 0; r < world; r++)
      for (size_t i = 0; i < n; i++) CHECK(buf[(size_t)r * n + i] == val(r + 7, i));
  }
  /* Messages under the single-copy size between every pair, through the rings, until each ring
   * has wrapped: every page of every linked ring is written (without room for them: SIGBUS). */
  size_t blk = 1500; /* floats: 6000 bytes per pair, under all_to_all's 8 KiB single-copy size */
  float *a2a_in = malloc(sizeof(float) * blk * WORLD);
  CHECK(a2a_in != NULL);
  for (int it = 0; it < 240; it++) {
    for (int d = 0; d < world; d++)
      for (size_t i = 0; i < blk; i++) a2a_in[(size_t)d * blk + i] = val(rank * 100 + d + it, i);
    CHECK_OK_MSG(tdist_all_to_all(pg, buf, a2a_in, blk, TDIST_FLOAT32), tdist_pg_last_error(pg));
    for (int s = 0; s < world; s++)
      for (size_t i = 0; i < blk; i += 331)
        CHECK(buf[(size_t)s * blk + i] == val(s * 100 + rank + it, i));
  }
  free(a2a_in);
  free(buf);
  free(in);
  tdist_pg_destroy(pg);
  tdist_store_destroy(store);
  char *log = logcap_end();
  /* "rank R: K peers over shared memory" (absent when K is 0), and one warning per peer without
   * room. */
  int shm_peers = 0;
  const char *p = strstr(log, "peers over shared memory");
  if (p) {
    while (p > log && p[-1] != ':') p--;
    shm_peers = atoi(p);
  }
  int no_room = logcap_count(log, "no room in shared memory for the rings with rank");
  CHECK(no_room == 0 || logcap_count(log, "that pair uses TCP. Is /dev/shm large enough") > 0);
  free(log);
  char path[600];
  snprintf(path, sizeof path, "%s/shmfull.%d", g_dir, rank);
  FILE *f = fopen(path, "w");
  CHECK(f != NULL);
  fprintf(f, "%d %d\n", shm_peers, no_room);
  fclose(f);
  return 0;
}

int main(void) {
  if (unshare(CLONE_NEWNS) != 0 || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0 ||
      mount("tdist-small-shm", "/dev/shm", "tmpfs", 0, "size=5m") != 0) {
    TEST_LOG("SKIPPED: cannot mount a small tmpfs on /dev/shm here (%s); needs root",
             strerror(errno));
    return 0;
  }
  logcap_enable_debug();
  g_dir = getenv("TEST_TMPDIR") ? getenv("TEST_TMPDIR") : "/tmp";
  /* 4 ranks: 12 rings of a little over 1 MiB for the 6 pairs; 5 MiB holds a few of them. */
  CHECK(tdist_test_run_ranks(WORLD, 120000, body, NULL) == 0);
  int shm_links = 0, no_room = 0;
  for (int r = 0; r < WORLD; r++) {
    char path[600];
    snprintf(path, sizeof path, "%s/shmfull.%d", g_dir, r);
    FILE *f = fopen(path, "r");
    CHECK(f != NULL);
    int a = -1, b = -1;
    CHECK(fscanf(f, "%d %d", &a, &b) == 2);
    fclose(f);
    TEST_LOG("rank %d: %d peers over shared memory, %d without room", r, a, b);
    shm_links += a;
    no_room += b;
  }
  /* Both kinds of pair ran (each link counts at both ends). */
  CHECK_CMP_INT(shm_links, >, 0);
  CHECK_CMP_INT(shm_links, <, WORLD * (WORLD - 1));
  CHECK_CMP_INT(no_room, >, 0);
  TEST_LOG("ok: %d shared-memory link ends, %d warnings", shm_links, no_room);
  return 0;
}
