/* The in-memory store: the server's key/value map (kv.c) behind one mutex, with a condition
 * variable broadcast on every change so waiters re-check. Thread safe; same semantics as the
 * TCP server (ADD as decimal text, COMPARE_SET rules, queues). For tests and single-process use. */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "runtime/common/clock.h"
#include "runtime/store/kv.h"
#include "runtime/store/store_internal.h"

typedef struct {
  tdist_store_t base;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  tdist__kv_t *kv;
} mem_store_t;

static mem_store_t *M(tdist_store_t *s) { return (mem_store_t *)s; }

static tdist_status_t nomem(tdist_store_t *s, const char *op) {
  return tdist__store_fail(s, TDIST_ERR_NO_MEMORY, "memory store: %s: out of memory", op);
}

/* Waits (mutex held) until all keys exist or the deadline passes. */
static tdist_status_t wait_locked(mem_store_t *m, const char *const *keys, size_t n,
                                  int64_t timeout_ms) {
  int64_t deadline_ns = tdist__now_ns() + timeout_ms * 1000000;
  while (!tdist__kv_all_exist(m->kv, keys, n)) {
    int64_t left = deadline_ns - tdist__now_ns();
    if (left <= 0) {
      char ks[256];
      tdist__store_keys_str(keys, n, ks, sizeof ks);
      return tdist__store_fail(&m->base, TDIST_ERR_TIMEOUT,
                               "memory store: wait timed out after %lld ms for keys %s",
                               (long long)timeout_ms, ks);
    }
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    int64_t ns = ts.tv_nsec + left % 1000000000;
    ts.tv_sec += left / 1000000000 + ns / 1000000000;
    ts.tv_nsec = ns % 1000000000;
    pthread_cond_timedwait(&m->cv, &m->mu, &ts);
  }
  return TDIST_OK;
}

static void mem_destroy(tdist_store_t *s) {
  mem_store_t *m = M(s);
  tdist__kv_destroy(m->kv);
  pthread_cond_destroy(&m->cv);
  pthread_mutex_destroy(&m->mu);
  free(m);
}

#define LOCK(m) pthread_mutex_lock(&(m)->mu)
#define UNLOCK(m) pthread_mutex_unlock(&(m)->mu)
#define CHANGED(m) pthread_cond_broadcast(&(m)->cv)

static tdist_status_t mem_set(tdist_store_t *s, const char *key, const void *v, size_t n,
                              int64_t to) {
  mem_store_t *m = M(s);
  LOCK(m);
  int r = tdist__kv_set(m->kv, key, strlen(key), v, n, NULL);
  CHANGED(m);
  UNLOCK(m);
  return r ? nomem(s, "set") : TDIST_OK;
}

static tdist_status_t mem_get(tdist_store_t *s, const char *key, void **v, size_t *n, int64_t to) {
  mem_store_t *m = M(s);
  LOCK(m);
  tdist_status_t st = wait_locked(m, &key, 1, to);
  if (st == TDIST_OK) {
    tdist__kv_entry_t *e = tdist__kv_find(m->kv, key, strlen(key));
    /* A key that exists only as a queue has no value: reply empty, like the server. */
    size_t len = e && e->has_value ? e->vlen : 0;
    *v = tdist__kv_dup(e && e->has_value ? e->val : NULL, len);
    *n = len;
    if (!*v) st = nomem(s, "get");
  }
  UNLOCK(m);
  return st;
}

static tdist_status_t mem_add(tdist_store_t *s, const char *key, int64_t delta, int64_t *res,
                              int64_t to) {
  mem_store_t *m = M(s);
  LOCK(m);
  int r = tdist__kv_add(m->kv, key, strlen(key), delta, res, NULL);
  if (r == 0) CHANGED(m);
  UNLOCK(m);
  if (r == -EINVAL)
    return tdist__store_fail(s, TDIST_ERR_INVALID_USAGE,
                             "memory store: add on key '%s': the value is not an integer", key);
  return r ? nomem(s, "add") : TDIST_OK;
}

static tdist_status_t mem_compare_set(tdist_store_t *s, const char *key, const void *e, size_t en,
                                      const void *d, size_t dn, void **out, size_t *outn,
                                      int64_t to) {
  mem_store_t *m = M(s);
  const uint8_t *cur;
  size_t cur_len;
  int stored;
  LOCK(m);
  int r =
      tdist__kv_compare_set(m->kv, key, strlen(key), e, en, d, dn, &cur, &cur_len, &stored, NULL);
  if (r == 0) {
    if (stored) CHANGED(m);
    *out = tdist__kv_dup(cur, cur_len);
    *outn = cur_len;
    if (!*out) r = -ENOMEM;
  }
  UNLOCK(m);
  return r ? nomem(s, "compare_set") : TDIST_OK;
}

static tdist_status_t mem_check(tdist_store_t *s, const char *const *keys, size_t n, int *ready,
                                int64_t to) {
  mem_store_t *m = M(s);
  LOCK(m);
  *ready = tdist__kv_all_exist(m->kv, keys, n);
  UNLOCK(m);
  return TDIST_OK;
}

static tdist_status_t mem_wait(tdist_store_t *s, const char *const *keys, size_t n, int64_t to) {
  mem_store_t *m = M(s);
  LOCK(m);
  tdist_status_t st = wait_locked(m, keys, n, to);
  UNLOCK(m);
  return st;
}

static tdist_status_t mem_delete(tdist_store_t *s, const char *key, int *deleted, int64_t to) {
  mem_store_t *m = M(s);
  LOCK(m);
  *deleted = tdist__kv_delete(m->kv, key, strlen(key));
  UNLOCK(m);
  return TDIST_OK;
}

static tdist_status_t mem_num_keys(tdist_store_t *s, int64_t *n, int64_t to) {
  mem_store_t *m = M(s);
  LOCK(m);
  *n = (int64_t)tdist__kv_num_keys(m->kv);
  UNLOCK(m);
  return TDIST_OK;
}

static tdist_status_t mem_append(tdist_store_t *s, const char *key, const void *v, size_t n,
                                 int64_t to) {
  mem_store_t *m = M(s);
  LOCK(m);
  int r = tdist__kv_append(m->kv, key, strlen(key), v, n, NULL);
  CHANGED(m);
  UNLOCK(m);
  return r ? nomem(s, "append") : TDIST_OK;
}

static tdist_status_t mem_multi_get(tdist_store_t *s, const char *const *keys, size_t n,
                                    void **vals, size_t *lens, int64_t to) {
  mem_store_t *m = M(s);
  LOCK(m);
  tdist_status_t st = wait_locked(m, keys, n, to);
  for (size_t i = 0; st == TDIST_OK && i < n; i++) {
    tdist__kv_entry_t *e = tdist__kv_find(m->kv, keys[i], strlen(keys[i]));
    lens[i] = e && e->has_value ? e->vlen : 0;
    vals[i] = tdist__kv_dup(e && e->has_value ? e->val : NULL, lens[i]);
    if (!vals[i]) st = nomem(s, "multi_get");
  }
  UNLOCK(m);
  if (st != TDIST_OK) {
    for (size_t i = 0; i < n; i++) {
      free(vals[i]);
      vals[i] = NULL;
      lens[i] = 0;
    }
  }
  return st;
}

static tdist_status_t mem_multi_set(tdist_store_t *s, const char *const *keys,
                                    const void *const *vals, const size_t *lens, size_t n,
                                    int64_t to) {
  mem_store_t *m = M(s);
  int r = 0;
  LOCK(m);
  for (size_t i = 0; i < n && r == 0; i++)
    r = tdist__kv_set(m->kv, keys[i], strlen(keys[i]), vals[i], lens[i], NULL);
  CHANGED(m);
  UNLOCK(m);
  return r ? nomem(s, "multi_set") : TDIST_OK;
}

static tdist_status_t mem_queue_push(tdist_store_t *s, const char *key, const void *v, size_t n,
                                     int64_t to) {
  mem_store_t *m = M(s);
  LOCK(m);
  int r = tdist__kv_queue_push(m->kv, key, strlen(key), v, n, NULL);
  CHANGED(m);
  UNLOCK(m);
  return r ? nomem(s, "queue_push") : TDIST_OK;
}

static tdist_status_t mem_queue_pop(tdist_store_t *s, const char *key, int64_t wait_ms, void **v,
                                    size_t *n, int64_t to) {
  mem_store_t *m = M(s);
  tdist_status_t st = TDIST_OK;
  LOCK(m);
  if (wait_ms > 0) st = wait_locked(m, &key, 1, wait_ms);
  if (st == TDIST_OK) {
    tdist__kv_qitem_t *q = tdist__kv_queue_pop(m->kv, key, strlen(key));
    if (!q) {
      st = tdist__store_fail(s, TDIST_ERR_NOT_FOUND, "memory store: queue '%s' is empty", key);
    } else {
      *n = q->len;
      *v = tdist__kv_dup(q->data, q->len);
      free(q);
      if (!*v) st = nomem(s, "queue_pop");
    }
  }
  UNLOCK(m);
  return st;
}

static tdist_status_t mem_queue_len(tdist_store_t *s, const char *key, int64_t *n, int64_t to) {
  mem_store_t *m = M(s);
  LOCK(m);
  *n = (int64_t)tdist__kv_queue_len(m->kv, key, strlen(key));
  UNLOCK(m);
  return TDIST_OK;
}

static const tdist__store_vtable_t k_mem_vt = {
    "memory",        mem_destroy,         mem_set,       mem_get,        mem_add,
    mem_compare_set, mem_check,           mem_wait,      mem_delete,     mem_num_keys,
    mem_append,      mem_multi_get,       mem_multi_set, mem_queue_push, mem_queue_pop,
    mem_queue_len,   1 /* thread_safe */, NULL /* inner */
};

TDIST_EXTERN tdist_status_t tdist_memory_store_create(tdist_store_t **out) {
  if (!out)
    return tdist__fail(TDIST_ERR_INVALID_ARGUMENT, "tdist_memory_store_create: out is NULL");
  *out = NULL;
  mem_store_t *m = calloc(1, sizeof *m);
  if (!m) return tdist__fail(TDIST_ERR_NO_MEMORY, "tdist_memory_store_create: out of memory");
  m->kv = tdist__kv_create();
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&m->cv, &ca);
  pthread_condattr_destroy(&ca);
  pthread_mutex_init(&m->mu, NULL);
  if (!m->kv) {
    mem_destroy(&m->base);
    return tdist__fail(TDIST_ERR_NO_MEMORY, "tdist_memory_store_create: out of memory");
  }
  tdist__store_init(&m->base, &k_mem_vt, 300000);
  *out = &m->base;
  return TDIST_OK;
}
