/* Monotonic clock helpers and deadlines (milliseconds). */
#ifndef TDIST_COMMON_CLOCK_H
#define TDIST_COMMON_CLOCK_H

#include <stdint.h>
#include <time.h>

static inline int64_t tdist__now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static inline int64_t tdist__now_ms(void) { return tdist__now_ns() / 1000000; }

/* Milliseconds left until `deadline_ms` (monotonic), never negative. */
static inline int64_t tdist__remaining_ms(int64_t deadline_ms) {
  int64_t left = deadline_ms - tdist__now_ms();
  return left > 0 ? left : 0;
}

/* poll() timeout for a deadline: clamps to int, rounds up so we never spin on 0 early. */
static inline int tdist__poll_timeout(int64_t deadline_ms) {
  int64_t left = deadline_ms - tdist__now_ms();
  if (left <= 0) return 0;
  return left > 1000000000 ? 1000000000 : (int)left;
}

#endif
