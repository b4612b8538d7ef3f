/* Internal error helpers: per-thread detail for handle-less calls, message formatting. */
#ifndef TDIST_COMMON_STATUS_INTERNAL_H
#define TDIST_COMMON_STATUS_INTERNAL_H

#include <stdarg.h>
#include <stddef.h>

#include "tdist/status.h"

#define TDIST__ERRMSG_MAX 512

/* Sets the calling thread's tdist_last_error() text and returns `st`. */
tdist_status_t tdist__fail(tdist_status_t st, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Formats into a fixed buffer (a handle's error text) and returns `st`; also mirrors the text into
 * the thread's last error, so either accessor gives the detail. */
tdist_status_t tdist__failbuf(char *buf, size_t cap, tdist_status_t st, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
tdist_status_t tdist__vfailbuf(char *buf, size_t cap, tdist_status_t st, const char *fmt,
                               va_list ap);

void tdist__clear_last_error(void);

#endif
