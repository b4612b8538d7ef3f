/* Work handles (tdist_work_t) check their magic word on entry:
 *   - a real handle from an async all_reduce (one rank over a memory store, then two ranks over
 *     TCP) waits, tests and destroys as documented, with the right result;
 *   - NULL and garbage handles (memory that never was a handle: seeded random bytes, all zeros,
 *     all ones, and a buffer that holds a valid group handle's bytes) are refused by
 *     tdist_work_wait and tdist_work_test with TDIST_ERR_INVALID_ARGUMENT and a message saying
 *     so, and tdist_work_destroy leaves them untouched (a handle that was destroyed and freed
 *     cannot be passed without a use after free; one that was freed into garbage is this case).
 * Each garbage buffer is 64 KiB, far larger than a handle, so every read the library makes of
 * it stays inside memory the test owns. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "rng.h"
#include "ranks.h"

#define GARBAGE 65536

static _Alignas(64) unsigned char g_buf[GARBAGE];
static unsigned char g_copy[GARBAGE];

static void expect_refused(const char *what) {
  tdist_work_t *w = (tdist_work_t *)g_buf;
  memcpy(g_copy, g_buf, GARBAGE);
  tdist_status_t st = tdist_work_wait(w, 1000);
  if (st != TDIST_ERR_INVALID_ARGUMENT || !strstr(tdist_last_error(), "tdist_work_wait: work")) {
    fprintf(stderr, "%s: tdist_work_wait returned %s: %s\n", what, tdist_status_name(st),
            tdist_last_error());
    exit(1);
  }
  int done = 42;
  st = tdist_work_test(w, &done);
  if (st != TDIST_ERR_INVALID_ARGUMENT || !strstr(tdist_last_error(), "tdist_work_test: work")) {
    fprintf(stderr, "%s: tdist_work_test returned %s: %s\n", what, tdist_status_name(st),
            tdist_last_error());
    exit(1);
  }
  CHECK_EQ_INT(done, 42); /* not written */
  tdist_work_destroy(w);  /* a no-op: nothing freed, nothing written */
  CHECK(memcmp(g_copy, g_buf, GARBAGE) == 0);
  TEST_LOG("  %s: refused", what);
}

/* One async all_reduce of n int64s on pg, checked against the sum over ranks. */
static void async_all_reduce(tdist_pg_t *pg, int rank, int world) {
  enum { n = 1000 };
  static int64_t v[n];
  for (int i = 0; i < n; i++)
    v[i] = (int64_t)(tdist_test_rand(7, (uint64_t)rank, (uint64_t)i) >> 8);
  tdist_work_t *w = NULL;
  CHECK_OK_MSG(tdist_all_reduce_async(pg, v, n, TDIST_INT64, TDIST_SUM, &w),
               tdist_pg_last_error(pg));
  CHECK(w != NULL);
  CHECK_OK_MSG(tdist_work_wait(w, -1), tdist_pg_last_error(pg));
  int done = 0;
  CHECK_OK(tdist_work_test(w, &done));
  CHECK_EQ_INT(done, 1);
  CHECK_OK(tdist_work_wait(w, 0)); /* done: a second wait returns at once, same status */
  tdist_work_destroy(w);
  for (int i = 0; i < n; i++) {
    int64_t want = 0;
    for (int r = 0; r < world; r++)
      want += (int64_t)(tdist_test_rand(7, (uint64_t)r, (uint64_t)i) >> 8);
    CHECK_EQ_INT(v[i], want);
  }
}

static int two_rank_body(int rank, int world, int port, void *arg) {
  (void)arg;
  tdist_store_t *store = NULL;
  tdist_pg_t *pg = tdist_test_init_pg(rank, world, port, 20000, &store);
  async_all_reduce(pg, rank, world);
  tdist_pg_destroy(pg);
  tdist_store_destroy(store);
  return 0;
}

int main(void) {
  TEST_LOG("real handles: one rank over a memory store");
  tdist_store_t *mem = NULL;
  CHECK_OK(tdist_memory_store_create(&mem));
  tdist_pg_options_t o = TDIST_PG_OPTIONS_INIT;
  o.store = mem;
  o.rank = 0;
  o.world_size = 1;
  o.timeout_ms = 20000;
  tdist_pg_t *pg = NULL;
  CHECK_OK(tdist_init_process_group(&o, &pg));
  async_all_reduce(pg, 0, 1);

  TEST_LOG("NULL and garbage handles");
  CHECK_EQ_INT(tdist_work_wait(NULL, 0), TDIST_ERR_INVALID_ARGUMENT);
  int done = 0;
  CHECK_EQ_INT(tdist_work_test(NULL, &done), TDIST_ERR_INVALID_ARGUMENT);
  tdist_work_destroy(NULL);
  test_rng_t r;
  test_rng_seed(&r, 0x9e3779b97f4a7c15ull); /* fixed: the same garbage every run */
  for (int round = 0; round < 8; round++) {
    test_rng_bytes(&r, g_buf, GARBAGE);
    char what[64];
    snprintf(what, sizeof what, "random bytes, round %d", round);
    expect_refused(what);
  }
  memset(g_buf, 0, GARBAGE);
  expect_refused("all zeros");
  memset(g_buf, 0xff, GARBAGE);
  expect_refused("all ones");
  /* The group handle's bytes: another public object's magic word is not a work handle's. */
  memset(g_buf, 0, GARBAGE);
  memcpy(g_buf, pg, 16); /* its magic, rank, size and timeout: a group is larger than that */
  expect_refused("a group handle's first 16 bytes");

  /* The group still works after all that. */
  async_all_reduce(pg, 0, 1);
  tdist_pg_destroy(pg);
  tdist_store_destroy(mem);

  TEST_LOG("real handles: two ranks over TCP");
  CHECK(tdist_test_run_ranks(2, 60000, two_rank_body, NULL) == 0);
  TEST_LOG("ok");
  return 0;
}
