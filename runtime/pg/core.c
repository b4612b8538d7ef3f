/* Shared by the process group and its backends: collective names and the group's error text.
 * Kept apart from pg.c so backends can depend on it without a dependency cycle. */
#include <stdarg.h>
#include <stdio.h>

#include "runtime/pg/pg_internal.h"

static const char *const k_coll_names[TDIST__COLL_KIND_COUNT_] = {
    "all_reduce",     "broadcast",  "reduce",  "all_gather", "gather",
    "scatter",        "reduce_scatter", "all_to_all", "barrier", "monitored_barrier",
    "send",           "recv",
};

const char *tdist__coll_name(tdist__coll_kind_t k) {
  return k < TDIST__COLL_KIND_COUNT_ ? k_coll_names[k] : "unknown";
}

tdist_status_t tdist__pg_fail(tdist_pg_t *pg, tdist_status_t st, const char *fmt, ...) {
  char msg[TDIST__ERRMSG_MAX];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  pthread_mutex_lock(&pg->err_mu);
  snprintf(pg->err, sizeof pg->err, "%s", msg);
  pthread_mutex_unlock(&pg->err_mu);
  tdist__fail(st, "%s", msg);
  return st;
}

