/* Seeded pseudo-random numbers for tests (xorshift64*): one generator per test, whose seed is
 * printed at start and can be set with TDIST_TEST_SEED=N (decimal or 0x...) to replay a failure.
 *
 *   uint64_t seed = test_rng_init("server_test", 424242);   fixed default; 0: from time and pid
 *   rnd()  rnd_below(n)  rnd_bytes(p, n)                      the test's generator
 *   test_rng_t r = {seed}; test_rng_next(&r) ...             a generator of one's own
 *
 * Data that several processes must derive alike (one rank's buffer as every rank expects it) comes
 * from the stateless tdist_test_rand(seed, rank, i) of ranks.h instead.
 * Header-only (also compiled outside Bazel by tests/fuzz/run_libfuzzer.sh). */
#ifndef TDIST_TESTLIB_RNG_H
#define TDIST_TESTLIB_RNG_H

#include <inttypes.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

typedef struct {
  uint64_t s; /* never 0 once seeded (0 is xorshift's fixed point; test_rng_seed avoids it) */
} test_rng_t;

static inline void test_rng_seed(test_rng_t *r, uint64_t seed) { r->s = seed ? seed : 1; }

static inline uint64_t test_rng_next(test_rng_t *r) {
  if (r->s == 0) r->s = 1;
  r->s ^= r->s >> 12;
  r->s ^= r->s << 25;
  r->s ^= r->s >> 27;
  return r->s * 0x2545F4914F6CDD1DULL;
}
/* Below n (0 when n is 0), by Lemire's multiply-shift: uniform enough for test data, and no
 * 64-bit division in fill loops. */
static inline uint64_t test_rng_below(test_rng_t *r, uint64_t n) {
  return (uint64_t)(((unsigned __int128)test_rng_next(r) * n) >> 64);
}
static inline void test_rng_bytes(test_rng_t *r, void *p, size_t n) {
  unsigned char *b = p;
  for (size_t i = 0; i < n; i++) b[i] = (unsigned char)test_rng_next(r);
}

/* The seed a test runs with: TDIST_TEST_SEED if set (a bad value fails the test), otherwise
 * `fallback`, or a fresh one from the time and pid when fallback is 0. Printed on stderr. */
static inline uint64_t test_seed(const char *test, uint64_t fallback) {
  const char *env = getenv("TDIST_TEST_SEED");
  uint64_t seed = fallback;
  if (env && *env) {
    char *end = NULL;
    seed = strtoull(env, &end, 0);
    if (end == env || *end != '\0') {
      fprintf(stderr, "%s: TDIST_TEST_SEED=\"%s\" is not a number\n", test, env);
      exit(1);
    }
  } else if (seed == 0) {
    seed = (uint64_t)time(NULL) * 2654435761u ^ (uint64_t)getpid() << 32;
  }
  fprintf(stderr, "%s: seed %" PRIu64 " (TDIST_TEST_SEED=%" PRIu64 " replays this run)\n", test,
          seed, seed);
  return seed;
}

/* The test's own generator, for files that need only one. Like everything here it is static: one
 * per .c file, so the file that draws from it is the one that calls test_rng_init. */
static test_rng_t test_rng __attribute__((unused));
static inline uint64_t test_rng_init(const char *test, uint64_t fallback) {
  uint64_t seed = test_seed(test, fallback);
  test_rng_seed(&test_rng, seed);
  return seed;
}
static inline uint64_t rnd(void) { return test_rng_next(&test_rng); }
static inline uint64_t rnd_below(uint64_t n) { return test_rng_below(&test_rng, n); }
static inline void rnd_bytes(void *p, size_t n) { test_rng_bytes(&test_rng, p, n); }

#endif
