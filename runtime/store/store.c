/* Public store calls: check the handle and arguments, clear the handle's error, resolve the
 * timeout and dispatch to the store kind's vtable. Nothing here touches the network. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/store/store_internal.h"

void tdist__store_init(tdist_store_t *s, const tdist__store_vtable_t *vt, int64_t timeout_ms) {
  s->magic = TDIST__STORE_MAGIC;
  s->vt = vt;
  s->timeout_ms = timeout_ms > 0 ? timeout_ms : 300000;
  s->err[0] = '\0';
}

tdist_store_t *tdist__store_root(tdist_store_t *s) {
  for (tdist_store_t *in; s && s->magic == TDIST__STORE_MAGIC && s->vt->inner;) {
    if (!(in = s->vt->inner(s))) break;
    s = in;
  }
  return s;
}

static int thread_safe(const tdist_store_t *s) {
  return tdist__store_root((tdist_store_t *)s)->vt->thread_safe;
}

tdist_status_t tdist__store_fail(tdist_store_t *s, tdist_status_t st, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  if (thread_safe(s)) {
    char msg[TDIST__ERRMSG_MAX];
    vsnprintf(msg, sizeof msg, fmt, ap);
    tdist__fail(st, "%s", msg);
  } else {
    tdist__vfailbuf(s->err, sizeof s->err, st, fmt, ap);
  }
  va_end(ap);
  return st;
}

void tdist__store_keys_str(const char *const *keys, size_t n, char *buf, size_t cap) {
  size_t j = 0;
  buf[0] = '\0';
  for (size_t i = 0; i < n && j + 1 < cap; i++) {
    int w = snprintf(buf + j, cap - j, "%s%s", i ? ", " : "", keys[i]);
    if (w < 0 || (size_t)w >= cap - j || (i >= 7 && i + 1 < n)) {
      char tail[40];
      int tl = snprintf(tail, sizeof tail, ", ... (%zu keys)", n);
      size_t at = j + (size_t)tl < cap ? j : cap - (size_t)tl - 1;
      memcpy(buf + at, tail, (size_t)tl + 1);
      return;
    }
    j += (size_t)w;
  }
}

/* Validates the handle; on success clears its error. */
#define CHECK_HANDLE(s, fn)                                                                 \
  do {                                                                                      \
    if (!(s) || (s)->magic != TDIST__STORE_MAGIC)                                           \
      return tdist__fail(TDIST_ERR_INVALID_ARGUMENT, fn ": store handle is NULL or freed"); \
    if (thread_safe(s))                                                                     \
      tdist__clear_last_error();                                                            \
    else                                                                                    \
      (s)->err[0] = '\0';                                                                   \
  } while (0)

#define CHECK_ARG(s, cond, fn, what)                                                      \
  do {                                                                                    \
    if (!(cond)) return tdist__store_fail((s), TDIST_ERR_INVALID_ARGUMENT, fn ": " what); \
  } while (0)

static int keys_ok(const char *const *keys, size_t n) {
  if (n && !keys) return 0;
  for (size_t i = 0; i < n; i++)
    if (!keys[i]) return 0;
  return 1;
}

static int64_t handle_timeout(const tdist_store_t *s) {
  return tdist__store_root((tdist_store_t *)s)->timeout_ms;
}

static int64_t resolve_timeout(const tdist_store_t *s, int64_t t) {
  return t < 0 ? handle_timeout(s) : t;
}

TDIST_EXTERN void tdist_store_destroy(tdist_store_t *s) {
  if (!s || s->magic != TDIST__STORE_MAGIC) return;
  s->magic = 0;
  s->vt->destroy(s);
}

TDIST_EXTERN const char *tdist_store_last_error(const tdist_store_t *s) {
  if (!s || s->magic != TDIST__STORE_MAGIC) return "invalid store handle";
  return thread_safe(s) ? tdist_last_error() : s->err;
}

TDIST_EXTERN tdist_status_t tdist_store_set_timeout(tdist_store_t *s, int64_t timeout_ms) {
  CHECK_HANDLE(s, "tdist_store_set_timeout");
  if (timeout_ms <= 0)
    return tdist__store_fail(s, TDIST_ERR_INVALID_ARGUMENT,
                             "tdist_store_set_timeout: timeout %lld ms must be > 0",
                             (long long)timeout_ms);
  tdist__store_root(s)->timeout_ms = timeout_ms; /* PyTorch's PrefixStore forwards it too */
  return TDIST_OK;
}

TDIST_EXTERN int64_t tdist_store_timeout(const tdist_store_t *s) {
  return s && s->magic == TDIST__STORE_MAGIC ? handle_timeout(s) : -1;
}

TDIST_EXTERN tdist_status_t tdist_store_set(tdist_store_t *s, const char *key, const void *value,
                                            size_t len) {
  CHECK_HANDLE(s, "tdist_store_set");
  CHECK_ARG(s, key, "tdist_store_set", "key is NULL");
  CHECK_ARG(s, value || !len, "tdist_store_set", "value is NULL with a non-zero length");
  return s->vt->set(s, key, value, len, handle_timeout(s));
}

tdist_status_t tdist__store_get_ms(tdist_store_t *s, const char *key, void **value, size_t *len,
                                   int64_t timeout_ms) {
  CHECK_HANDLE(s, "tdist_store_get");
  CHECK_ARG(s, key && value && len, "tdist_store_get", "key, value and len must not be NULL");
  CHECK_ARG(s, timeout_ms > 0, "tdist_store_get", "timeout must be > 0");
  *value = NULL;
  *len = 0;
  return s->vt->get(s, key, value, len, timeout_ms);
}

TDIST_EXTERN tdist_status_t tdist_store_get(tdist_store_t *s, const char *key, void **value,
                                            size_t *len) {
  CHECK_HANDLE(s, "tdist_store_get");
  return tdist__store_get_ms(s, key, value, len, handle_timeout(s));
}

TDIST_EXTERN tdist_status_t tdist_store_add(tdist_store_t *s, const char *key, int64_t delta,
                                            int64_t *result) {
  CHECK_HANDLE(s, "tdist_store_add");
  CHECK_ARG(s, key, "tdist_store_add", "key is NULL");
  int64_t tmp;
  return s->vt->add(s, key, delta, result ? result : &tmp, handle_timeout(s));
}

tdist_status_t tdist__store_compare_set_ms(tdist_store_t *s, const char *key, const void *expected,
                                           size_t expected_len, const void *desired,
                                           size_t desired_len, void **out, size_t *out_len,
                                           int64_t timeout_ms) {
  CHECK_HANDLE(s, "tdist_store_compare_set");
  CHECK_ARG(s, key && out && out_len, "tdist_store_compare_set",
            "key, out and out_len must not be NULL");
  CHECK_ARG(s, (expected || !expected_len) && (desired || !desired_len), "tdist_store_compare_set",
            "expected or desired is NULL with a non-zero length");
  CHECK_ARG(s, timeout_ms > 0, "tdist_store_compare_set", "timeout must be > 0");
  *out = NULL;
  *out_len = 0;
  return s->vt->compare_set(s, key, expected, expected_len, desired, desired_len, out, out_len,
                            timeout_ms);
}

TDIST_EXTERN tdist_status_t tdist_store_compare_set(tdist_store_t *s, const char *key,
                                                    const void *expected, size_t expected_len,
                                                    const void *desired, size_t desired_len,
                                                    void **out, size_t *out_len) {
  CHECK_HANDLE(s, "tdist_store_compare_set");
  return tdist__store_compare_set_ms(s, key, expected, expected_len, desired, desired_len, out,
                                     out_len, handle_timeout(s));
}

TDIST_EXTERN tdist_status_t tdist_store_check(tdist_store_t *s, const char *const *keys, size_t n,
                                              int *ready) {
  CHECK_HANDLE(s, "tdist_store_check");
  CHECK_ARG(s, keys_ok(keys, n) && ready, "tdist_store_check",
            "keys (or one of them) or ready is NULL");
  return s->vt->check(s, keys, n, ready, handle_timeout(s));
}

TDIST_EXTERN tdist_status_t tdist_store_wait(tdist_store_t *s, const char *const *keys, size_t n,
                                             int64_t timeout_ms) {
  CHECK_HANDLE(s, "tdist_store_wait");
  CHECK_ARG(s, keys_ok(keys, n), "tdist_store_wait", "keys (or one of them) is NULL");
  if (n == 0) return TDIST_OK;
  return s->vt->wait(s, keys, n, resolve_timeout(s, timeout_ms));
}

TDIST_EXTERN tdist_status_t tdist_store_delete_key(tdist_store_t *s, const char *key,
                                                   int *deleted) {
  CHECK_HANDLE(s, "tdist_store_delete_key");
  CHECK_ARG(s, key, "tdist_store_delete_key", "key is NULL");
  int tmp;
  return s->vt->delete_key(s, key, deleted ? deleted : &tmp, handle_timeout(s));
}

TDIST_EXTERN tdist_status_t tdist_store_num_keys(tdist_store_t *s, int64_t *n) {
  CHECK_HANDLE(s, "tdist_store_num_keys");
  CHECK_ARG(s, n, "tdist_store_num_keys", "n is NULL");
  return s->vt->num_keys(s, n, handle_timeout(s));
}

TDIST_EXTERN tdist_status_t tdist_store_append(tdist_store_t *s, const char *key, const void *data,
                                               size_t len) {
  CHECK_HANDLE(s, "tdist_store_append");
  CHECK_ARG(s, key && (data || !len), "tdist_store_append",
            "key is NULL, or data is NULL with a non-zero length");
  return s->vt->append(s, key, data, len, handle_timeout(s));
}

tdist_status_t tdist__store_multi_get_ms(tdist_store_t *s, const char *const *keys, size_t n,
                                         void **values, size_t *lens, int64_t timeout_ms) {
  CHECK_HANDLE(s, "tdist_store_multi_get");
  CHECK_ARG(s, keys_ok(keys, n) && (!n || (values && lens)), "tdist_store_multi_get",
            "keys (or one of them), values or lens is NULL");
  CHECK_ARG(s, timeout_ms > 0, "tdist_store_multi_get", "timeout must be > 0");
  for (size_t i = 0; i < n; i++) {
    values[i] = NULL;
    lens[i] = 0;
  }
  if (n == 0) return TDIST_OK;
  return s->vt->multi_get(s, keys, n, values, lens, timeout_ms);
}

TDIST_EXTERN tdist_status_t tdist_store_multi_get(tdist_store_t *s, const char *const *keys,
                                                  size_t n, void **values, size_t *lens) {
  CHECK_HANDLE(s, "tdist_store_multi_get");
  return tdist__store_multi_get_ms(s, keys, n, values, lens, handle_timeout(s));
}

TDIST_EXTERN tdist_status_t tdist_store_multi_set(tdist_store_t *s, const char *const *keys,
                                                  const void *const *values, const size_t *lens,
                                                  size_t n) {
  CHECK_HANDLE(s, "tdist_store_multi_set");
  CHECK_ARG(s, keys_ok(keys, n) && (!n || (values && lens)), "tdist_store_multi_set",
            "keys (or one of them), values or lens is NULL");
  for (size_t i = 0; i < n; i++)
    CHECK_ARG(s, values[i] || !lens[i], "tdist_store_multi_set",
              "a value is NULL with a non-zero length");
  if (n == 0) return TDIST_OK;
  return s->vt->multi_set(s, keys, values, lens, n, handle_timeout(s));
}

TDIST_EXTERN tdist_status_t tdist_store_queue_push(tdist_store_t *s, const char *key,
                                                   const void *value, size_t len) {
  CHECK_HANDLE(s, "tdist_store_queue_push");
  CHECK_ARG(s, key && (value || !len), "tdist_store_queue_push",
            "key is NULL, or value is NULL with a non-zero length");
  return s->vt->queue_push(s, key, value, len, handle_timeout(s));
}

TDIST_EXTERN tdist_status_t tdist_store_queue_pop(tdist_store_t *s, const char *key,
                                                  int64_t timeout_ms, void **value, size_t *len) {
  CHECK_HANDLE(s, "tdist_store_queue_pop");
  CHECK_ARG(s, key && value && len, "tdist_store_queue_pop", "key, value and len must not be NULL");
  *value = NULL;
  *len = 0;
  int64_t w = resolve_timeout(s, timeout_ms);
  int64_t to = handle_timeout(s);
  return s->vt->queue_pop(s, key, w, value, len, w > to ? w : to);
}

TDIST_EXTERN tdist_status_t tdist_store_queue_len(tdist_store_t *s, const char *key, int64_t *len) {
  CHECK_HANDLE(s, "tdist_store_queue_len");
  CHECK_ARG(s, key && len, "tdist_store_queue_len", "key and len must not be NULL");
  return s->vt->queue_len(s, key, len, handle_timeout(s));
}
