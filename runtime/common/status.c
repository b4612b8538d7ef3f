/* Status table (generated from TDIST_STATUS_LIST), per-thread error detail and tdist_version().
 * Nothing here allocates or fails. */
#include <stdio.h>
#include <stdlib.h>

#include "runtime/common/status_internal.h"
#include "tdist/version.h"

static _Thread_local char tls_last_error[TDIST__ERRMSG_MAX];

TDIST_EXTERN const char *tdist_strerror(tdist_status_t status) {
  switch (status) {
#define TDIST_STATUS_TEXT_(name, value, text) \
  case name: return text;
    TDIST_STATUS_LIST(TDIST_STATUS_TEXT_)
#undef TDIST_STATUS_TEXT_
  }
  return "unknown status";
}

TDIST_EXTERN const char *tdist_status_name(tdist_status_t status) {
  switch (status) {
#define TDIST_STATUS_NAME_(name, value, text) \
  case name: return #name;
    TDIST_STATUS_LIST(TDIST_STATUS_NAME_)
#undef TDIST_STATUS_NAME_
  }
  return "TDIST_UNKNOWN";
}

TDIST_EXTERN const char *tdist_last_error(void) { return tls_last_error; }

TDIST_EXTERN void tdist_free(void *ptr) { free(ptr); }

TDIST_EXTERN const char *tdist_version(void) { return TDIST_VERSION_STRING; }

void tdist__clear_last_error(void) { tls_last_error[0] = '\0'; }

tdist_status_t tdist__fail(tdist_status_t st, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(tls_last_error, sizeof tls_last_error, fmt, ap);
  va_end(ap);
  return st;
}

tdist_status_t tdist__vfailbuf(char *buf, size_t cap, tdist_status_t st, const char *fmt,
                               va_list ap) {
  vsnprintf(buf, cap, fmt, ap);
  snprintf(tls_last_error, sizeof tls_last_error, "%s", buf);
  return st;
}

tdist_status_t tdist__failbuf(char *buf, size_t cap, tdist_status_t st, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  tdist__vfailbuf(buf, cap, st, fmt, ap);
  va_end(ap);
  return st;
}
