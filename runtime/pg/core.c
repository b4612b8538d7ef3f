/* Collective names (backend.h: the group and its backends name calls in errors) and the
 * group's error text, which backends write through their context's vfail. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "runtime/pg/group.h"

#define COLL_NAME_(kind, name) name,
static const char *const k_coll_names[] = {TDIST_STATS_OP_LIST(COLL_NAME_)};
#undef COLL_NAME_

const char *tdist__coll_name(tdist__coll_kind_t k) {
  return k < TDIST__COLL_KIND_COUNT_ ? k_coll_names[k] : "unknown";
}

/* Every collective names itself for its error messages before it runs; snprintf's cost (tens of
 * nanoseconds) showed on the smallest collectives, so this one is written by hand. */
const char *tdist__coll_what(char out[TDIST__WHAT_MAX], tdist__coll_kind_t k, uint64_t seq) {
  const char *name = tdist__coll_name(k);
  size_t n = strlen(name);
  memcpy(out, name, n);
  out[n++] = ' ';
  out[n++] = '#';
  char digits[20];
  int d = 0;
  do digits[d++] = (char)('0' + seq % 10);
  while ((seq /= 10) != 0);
  while (d > 0) out[n++] = digits[--d];
  out[n] = '\0';
  return out;
}

const char *tdist__what(tdist__what_t *w) {
  if (w->fixed) return w->fixed;
  if (!w->s[0]) tdist__coll_what(w->s, w->kind, w->seq);
  return w->s;
}

/* The group of a backend's context: the context is a member of the group (group.h). */
static tdist_pg_t *of_bctx(const tdist__bctx_t *b) {
  return (tdist_pg_t *)((char *)b - offsetof(tdist_pg_t, b));
}

tdist_status_t tdist__pg_vfail(tdist__bctx_t *b, tdist_status_t st, const char *fmt, va_list ap) {
  tdist_pg_t *pg = of_bctx(b);
  char msg[TDIST__ERRMSG_MAX];
  vsnprintf(msg, sizeof msg, fmt, ap);
  pthread_mutex_lock(&pg->err_mu);
  snprintf(pg->err, sizeof pg->err, "%s", msg);
  pthread_mutex_unlock(&pg->err_mu);
  tdist__fail(st, "%s", msg);
  return st;
}

tdist_status_t tdist__pg_fail(tdist_pg_t *pg, tdist_status_t st, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  st = tdist__pg_vfail(&pg->b, st, fmt, ap);
  va_end(ap);
  return st;
}

const char *tdist__pg_last_error(const tdist__bctx_t *b) { return of_bctx(b)->err; }
