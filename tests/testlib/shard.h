/* Bazel test sharding (shard_count in BUILD): a test numbers its jobs in a fixed order and runs
 * the ones of its shard, job % TEST_TOTAL_SHARDS == TEST_SHARD_INDEX. test_shard_init touches
 * TEST_SHARD_STATUS_FILE, which tells Bazel the test knows about sharding, and rejects bad values.
 *
 *   test_shard_t sh = test_shard_init("nccl_test");
 *   if (test_shard_take(&sh)) run_job_0();
 *   if (test_shard_take(&sh)) run_job_1(); ...
 *
 * Header-only. */
#ifndef TDIST_TESTLIB_SHARD_H
#define TDIST_TESTLIB_SHARD_H

#include <stdio.h>
#include <stdlib.h>

typedef struct {
  int index, total; /* this shard, and how many (1 and 0 when not sharded) */
  int next;         /* the number of the next job */
} test_shard_t;

static inline int test_shard_env_(const char *test, const char *name, int fallback, int min) {
  const char *v = getenv(name);
  if (v == NULL || *v == '\0') return fallback;
  char *end = NULL;
  long n = strtol(v, &end, 10);
  if (end == v || *end != '\0' || n < min || n > 1000000) {
    fprintf(stderr, "%s: %s=\"%s\" is not a whole number >= %d\n", test, name, v, min);
    exit(1);
  }
  return (int)n;
}

static inline test_shard_t test_shard_init(const char *test) {
  test_shard_t s = {0, 1, 0};
  s.total = test_shard_env_(test, "TEST_TOTAL_SHARDS", 1, 1);
  s.index = test_shard_env_(test, "TEST_SHARD_INDEX", 0, 0);
  if (s.index >= s.total) {
    fprintf(stderr, "%s: TEST_SHARD_INDEX=%d is not below TEST_TOTAL_SHARDS=%d\n", test, s.index,
            s.total);
    exit(1);
  }
  const char *sf = getenv("TEST_SHARD_STATUS_FILE");
  if (sf && *sf) {
    FILE *f = fopen(sf, "w");
    if (f == NULL) {
      perror("TEST_SHARD_STATUS_FILE");
      exit(1);
    }
    fclose(f);
  }
  if (s.total > 1) fprintf(stderr, "%s: shard %d of %d\n", test, s.index, s.total);
  return s;
}

/* 1 when the next job belongs to this shard; counts the job either way. */
static inline int test_shard_take(test_shard_t *s) { return s->next++ % s->total == s->index; }

#endif
