/* The callback store: every operation is a function the caller supplied (tdist_store_callbacks_t),
 * so a language binding can hand libtdist a store it already holds; the PyTorch backend passes
 * torch's own Store (TCPStore, PrefixStore, FileStore, ...) this way. Values and error texts come
 * back through a tdist_store_reply_t that lives on this file's stack for one call. multi_get and
 * multi_set are built from wait + get and set; append and queues are NOT_AVAILABLE. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/common/options.h"
#include "runtime/store/store_internal.h"

struct tdist_store_reply_s {
  void *val; /* malloc'd copy of the value handed back, or NULL */
  size_t len;
  int has_val;
  int nomem;
  char err[TDIST__ERRMSG_MAX];
};

typedef struct {
  tdist_store_t base;
  tdist_store_callbacks_t cb;
} cb_store_t;

static cb_store_t *C(tdist_store_t *s) { return (cb_store_t *)s; }

TDIST_EXTERN tdist_status_t tdist_store_reply_value(tdist_store_reply_t *r, const void *data,
                                                    size_t len) {
  if (!r || (!data && len))
    return tdist__fail(TDIST_ERR_INVALID_ARGUMENT,
                       "tdist_store_reply_value: reply is NULL, or data is NULL with a length");
  free(r->val);
  r->val = malloc(len ? len : 1);
  r->has_val = r->val != NULL;
  r->nomem = r->val == NULL;
  r->len = r->val ? len : 0;
  if (!r->val) return tdist__fail(TDIST_ERR_NO_MEMORY, "tdist_store_reply_value: out of memory");
  if (len) memcpy(r->val, data, len);
  return TDIST_OK;
}

TDIST_EXTERN void tdist_store_reply_error(tdist_store_reply_t *r, const char *message) {
  if (r) snprintf(r->err, sizeof r->err, "%s", message ? message : "");
}

/* The status a callback returned, made an error of the handle with its text. */
static tdist_status_t done(tdist_store_t *s, const char *op, tdist_status_t st,
                           tdist_store_reply_t *r) {
  if (st == TDIST_OK && r->nomem) st = TDIST_ERR_NO_MEMORY;
  if (st == TDIST_OK) return TDIST_OK;
  if (st > 0 || st < TDIST_ERR_PROTOCOL) st = TDIST_ERR_INTERNAL; /* not a tdist status */
  free(r->val);
  r->val = NULL;
  return tdist__store_fail(s, st, "callback store: %s: %s", op,
                           r->err[0] ? r->err : tdist_strerror(st));
}

static tdist_status_t missing(tdist_store_t *s, const char *op) {
  return tdist__store_fail(s, TDIST_ERR_NOT_AVAILABLE,
                           "callback store: %s: not provided by this store", op);
}

#define NEED(s, fn, op) \
  if (!C(s)->cb.fn) return missing((s), (op))

static tdist_status_t cb_set(tdist_store_t *s, const char *key, const void *v, size_t n,
                             int64_t to) {
  (void)to;
  NEED(s, set, "set");
  tdist_store_reply_t r = {0};
  return done(s, "set", C(s)->cb.set(C(s)->cb.ctx, key, v, n, &r), &r);
}

static tdist_status_t cb_get(tdist_store_t *s, const char *key, void **v, size_t *n, int64_t to) {
  NEED(s, get, "get");
  tdist_store_reply_t r = {0};
  tdist_status_t st = done(s, "get", C(s)->cb.get(C(s)->cb.ctx, key, to, &r), &r);
  if (st == TDIST_OK && !r.has_val)
    st = tdist__store_fail(s, TDIST_ERR_INTERNAL, "callback store: get of '%s' gave no value", key);
  if (st != TDIST_OK) return st;
  *v = r.val;
  *n = r.len;
  return TDIST_OK;
}

static tdist_status_t cb_add(tdist_store_t *s, const char *key, int64_t delta, int64_t *res,
                             int64_t to) {
  (void)to;
  NEED(s, add, "add");
  tdist_store_reply_t r = {0};
  return done(s, "add", C(s)->cb.add(C(s)->cb.ctx, key, delta, res, &r), &r);
}

static tdist_status_t cb_compare_set(tdist_store_t *s, const char *key, const void *e, size_t en,
                                     const void *d, size_t dn, void **out, size_t *outn,
                                     int64_t to) {
  (void)to;
  NEED(s, compare_set, "compare_set");
  tdist_store_reply_t r = {0};
  tdist_status_t st =
      done(s, "compare_set", C(s)->cb.compare_set(C(s)->cb.ctx, key, e, en, d, dn, &r), &r);
  if (st == TDIST_OK && !r.has_val)
    st = tdist__store_fail(s, TDIST_ERR_INTERNAL,
                           "callback store: compare_set of '%s' gave no value", key);
  if (st != TDIST_OK) return st;
  *out = r.val;
  *outn = r.len;
  return TDIST_OK;
}

static tdist_status_t cb_check(tdist_store_t *s, const char *const *keys, size_t n, int *ready,
                               int64_t to) {
  (void)to;
  NEED(s, check, "check");
  tdist_store_reply_t r = {0};
  return done(s, "check", C(s)->cb.check(C(s)->cb.ctx, keys, n, ready, &r), &r);
}

static tdist_status_t cb_wait(tdist_store_t *s, const char *const *keys, size_t n, int64_t to) {
  NEED(s, wait, "wait");
  tdist_store_reply_t r = {0};
  return done(s, "wait", C(s)->cb.wait(C(s)->cb.ctx, keys, n, to, &r), &r);
}

static tdist_status_t cb_delete(tdist_store_t *s, const char *key, int *deleted, int64_t to) {
  (void)to;
  NEED(s, delete_key, "delete_key");
  tdist_store_reply_t r = {0};
  return done(s, "delete_key", C(s)->cb.delete_key(C(s)->cb.ctx, key, deleted, &r), &r);
}

static tdist_status_t cb_num_keys(tdist_store_t *s, int64_t *n, int64_t to) {
  (void)to;
  NEED(s, num_keys, "num_keys");
  tdist_store_reply_t r = {0};
  return done(s, "num_keys", C(s)->cb.num_keys(C(s)->cb.ctx, n, &r), &r);
}

static tdist_status_t cb_multi_get(tdist_store_t *s, const char *const *keys, size_t n, void **vals,
                                   size_t *lens, int64_t to) {
  tdist_status_t st = cb_wait(s, keys, n, to);
  for (size_t i = 0; st == TDIST_OK && i < n; i++) st = cb_get(s, keys[i], &vals[i], &lens[i], to);
  if (st != TDIST_OK) {
    for (size_t i = 0; i < n; i++) {
      free(vals[i]);
      vals[i] = NULL;
      lens[i] = 0;
    }
  }
  return st;
}

static tdist_status_t cb_multi_set(tdist_store_t *s, const char *const *keys,
                                   const void *const *vals, const size_t *lens, size_t n,
                                   int64_t to) {
  tdist_status_t st = TDIST_OK;
  for (size_t i = 0; st == TDIST_OK && i < n; i++) st = cb_set(s, keys[i], vals[i], lens[i], to);
  return st;
}

static tdist_status_t cb_append(tdist_store_t *s, const char *key, const void *v, size_t n,
                                int64_t to) {
  (void)key, (void)v, (void)n, (void)to;
  return missing(s, "append");
}

static tdist_status_t cb_queue_push(tdist_store_t *s, const char *key, const void *v, size_t n,
                                    int64_t to) {
  (void)key, (void)v, (void)n, (void)to;
  return missing(s, "queue_push");
}

static tdist_status_t cb_queue_pop(tdist_store_t *s, const char *key, int64_t wait_ms, void **v,
                                   size_t *n, int64_t to) {
  (void)key, (void)wait_ms, (void)v, (void)n, (void)to;
  return missing(s, "queue_pop");
}

static tdist_status_t cb_queue_len(tdist_store_t *s, const char *key, int64_t *n, int64_t to) {
  (void)key, (void)n, (void)to;
  return missing(s, "queue_len");
}

static void cb_destroy(tdist_store_t *s) {
  cb_store_t *c = C(s);
  if (c->cb.destroy) c->cb.destroy(c->cb.ctx);
  free(c);
}

static const tdist__store_vtable_t k_cb_vt = {
    "callback",
    cb_destroy,
    cb_set,
    cb_get,
    cb_add,
    cb_compare_set,
    cb_check,
    cb_wait,
    cb_delete,
    cb_num_keys,
    cb_append,
    cb_multi_get,
    cb_multi_set,
    cb_queue_push,
    cb_queue_pop,
    cb_queue_len,
    0 /* thread_safe: errors in the handle */,
    NULL /* inner */
};

TDIST_EXTERN tdist_status_t tdist_callback_store_create(const tdist_store_callbacks_t *cb,
                                                        int64_t timeout_ms, tdist_store_t **out) {
  if (!out)
    return tdist__fail(TDIST_ERR_INVALID_ARGUMENT, "tdist_callback_store_create: out is NULL");
  *out = NULL;
  if (!cb)
    return tdist__fail(TDIST_ERR_INVALID_ARGUMENT,
                       "tdist_callback_store_create: callbacks is NULL");
  tdist_store_callbacks_t c = TDIST_STORE_CALLBACKS_INIT;
  static const size_t ends[] = {TDIST__OPTS_END(tdist_store_callbacks_t, destroy)};
  tdist_status_t st = tdist__opts_load("tdist_callback_store_create", "TDIST_STORE_CALLBACKS_INIT",
                                       cb, &c, sizeof c, ends, 1);
  if (st) return st;
  if (!c.get || !c.set || !c.wait)
    return tdist__fail(TDIST_ERR_INVALID_ARGUMENT,
                       "tdist_callback_store_create: set, get and wait are required");
  cb_store_t *s = calloc(1, sizeof *s);
  if (!s) return tdist__fail(TDIST_ERR_NO_MEMORY, "tdist_callback_store_create: out of memory");
  s->cb = c;
  tdist__store_init(&s->base, &k_cb_vt, timeout_ms > 0 ? timeout_ms : 300000);
  *out = &s->base;
  return TDIST_OK;
}
