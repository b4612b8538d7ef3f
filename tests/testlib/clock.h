/* Monotonic clocks and sleeps for tests: now_ns/now_us/now_ms (integers), now_s (a double, for
 * printing durations), realtime_ns (the wall clock), sleep_ms (resumes after signals). Tests use
 * them for generous deadlines that stop a hang, never to assert how fast something ran (that
 * belongs in bench/). Header-only (also compiled outside Bazel by tests/fuzz/run_libfuzzer.sh). */
#ifndef TDIST_TESTLIB_CLOCK_H
#define TDIST_TESTLIB_CLOCK_H

#include <errno.h>
#include <stdint.h>
#include <time.h>

static inline int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}
static inline int64_t now_us(void) { return now_ns() / 1000; }
static inline int64_t now_ms(void) { return now_ns() / 1000000; }
static inline double now_s(void) { return (double)now_ns() / 1e9; }

/* Wall-clock nanoseconds since the epoch (for timestamps compared with files and logs). */
static inline int64_t realtime_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static inline void sleep_ms(int64_t ms) {
  if (ms <= 0) return;
  struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

#endif
