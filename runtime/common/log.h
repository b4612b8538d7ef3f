/* Logging to stderr: one line per event, "tdist <L> <UTC time> <component>: <message>".
 * The level comes from TDIST_LOG_LEVEL (see param.h; default info), read once. */
#ifndef TDIST_COMMON_LOG_H
#define TDIST_COMMON_LOG_H

typedef enum {
  TDIST__LOG_ERROR = 0,
  TDIST__LOG_WARN,
  TDIST__LOG_INFO,
  TDIST__LOG_DEBUG
} tdist__log_level_t;

int tdist__log_enabled(tdist__log_level_t level);
void tdist__log(tdist__log_level_t level, const char *component, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif
