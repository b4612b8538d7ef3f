/* Line-buffered logging: each line is formatted whole and written with one write(2), so lines from
 * different threads and processes never interleave mid-line. Never allocates. */
#include "runtime/common/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "runtime/common/param.h"

/* TDIST_LOG_LEVEL's choices (param.h) in order, as levels. A bad value logs at the default level
 * (info) until the group creation that reports it. */
static const tdist__log_level_t k_levels[] = {TDIST__LOG_ERROR, TDIST__LOG_WARN, TDIST__LOG_WARN,
                                              TDIST__LOG_INFO, TDIST__LOG_DEBUG};

int tdist__log_enabled(tdist__log_level_t level) {
  long long k = tdist__param_int(TDIST__P_LOG_LEVEL);
  tdist__log_level_t cur = k >= 0 && k < (long long)(sizeof k_levels / sizeof k_levels[0])
                               ? k_levels[k]
                               : TDIST__LOG_INFO;
  return level <= cur;
}

void tdist__log(tdist__log_level_t level, const char *component, const char *fmt, ...) {
  if (!tdist__log_enabled(level)) return;
  static const char letters[] = "EWID";
  char line[1024];
  struct timeval tv;
  struct tm tm;
  gettimeofday(&tv, NULL);
  gmtime_r(&tv.tv_sec, &tm);
  int n = snprintf(line, sizeof line,
                   "tdist %c %04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %s: ", letters[level],
                   tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                   (long)tv.tv_usec / 1000, component);
  if (n < 0) return;
  if ((size_t)n < sizeof line) {
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
    va_end(ap);
    if (m > 0) n += m;
  }
  if ((size_t)n >= sizeof line - 1) n = (int)sizeof line - 2;
  line[n++] = '\n';
  ssize_t w = write(STDERR_FILENO, line, (size_t)n);
  (void)w;
}
