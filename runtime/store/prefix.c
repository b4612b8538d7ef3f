/* PyTorch's PrefixStore: key -> prefix + "/" + key, forwarded to a borrowed inner store. Errors
 * of the inner store are copied into this handle so callers read them in one place. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/store/store_internal.h"

typedef struct {
  tdist_store_t base;
  tdist_store_t *inner;
  char *prefix;
  size_t plen;
} prefix_store_t;

static prefix_store_t *P(tdist_store_t *s) { return (prefix_store_t *)s; }

static char *join(prefix_store_t *p, const char *key) {
  size_t kl = strlen(key);
  char *k = malloc(p->plen + 1 + kl + 1);
  if (!k) return NULL;
  memcpy(k, p->prefix, p->plen);
  k[p->plen] = '/';
  memcpy(k + p->plen + 1, key, kl + 1);
  return k;
}

/* Joins n keys; NULL on allocation failure (everything freed). */
static char **join_all(prefix_store_t *p, const char *const *keys, size_t n) {
  char **out = calloc(n ? n : 1, sizeof *out);
  if (!out) return NULL;
  for (size_t i = 0; i < n; i++) {
    if (!(out[i] = join(p, keys[i]))) {
      for (size_t j = 0; j < i; j++) free(out[j]);
      free(out);
      return NULL;
    }
  }
  return out;
}

static void free_all(char **k, size_t n) {
  if (!k) return;
  for (size_t i = 0; i < n; i++) free(k[i]);
  free(k);
}

/* The inner store's error becomes ours (thread-safe stores keep it per thread already). */
static tdist_status_t relay(prefix_store_t *p, tdist_status_t st) {
  if (st != TDIST_OK && !tdist__store_root(&p->base)->vt->thread_safe)
    snprintf(p->base.err, sizeof p->base.err, "%s", p->inner->err);
  return st;
}

static tdist_status_t nomem(prefix_store_t *p) {
  return tdist__store_fail(&p->base, TDIST_ERR_NO_MEMORY, "prefix store: out of memory");
}

static void px_destroy(tdist_store_t *s) {
  free(P(s)->prefix);
  free(s);
}

/* One-key operations share this shape: join the key, forward, relay the error. */
#define ONE_KEY(name, call)                           \
  static tdist_status_t name {                        \
    prefix_store_t *p = P(s);                         \
    char *k = join(p, key);                           \
    if (!k) return nomem(p);                          \
    tdist_status_t st = relay(p, p->inner->vt->call); \
    free(k);                                          \
    return st;                                        \
  }

ONE_KEY(px_set(tdist_store_t *s, const char *key, const void *v, size_t n, int64_t to),
        set(p->inner, k, v, n, to))
ONE_KEY(px_get(tdist_store_t *s, const char *key, void **v, size_t *n, int64_t to),
        get(p->inner, k, v, n, to))
ONE_KEY(px_add(tdist_store_t *s, const char *key, int64_t d, int64_t *r, int64_t to),
        add(p->inner, k, d, r, to))
ONE_KEY(px_compare_set(tdist_store_t *s, const char *key, const void *e, size_t en, const void *d,
                       size_t dn, void **o, size_t *on, int64_t to),
        compare_set(p->inner, k, e, en, d, dn, o, on, to))
ONE_KEY(px_delete(tdist_store_t *s, const char *key, int *deleted, int64_t to),
        delete_key(p->inner, k, deleted, to))
ONE_KEY(px_append(tdist_store_t *s, const char *key, const void *v, size_t n, int64_t to),
        append(p->inner, k, v, n, to))
ONE_KEY(px_queue_push(tdist_store_t *s, const char *key, const void *v, size_t n, int64_t to),
        queue_push(p->inner, k, v, n, to))
ONE_KEY(px_queue_pop(tdist_store_t *s, const char *key, int64_t w, void **v, size_t *n, int64_t to),
        queue_pop(p->inner, k, w, v, n, to))
ONE_KEY(px_queue_len(tdist_store_t *s, const char *key, int64_t *n, int64_t to),
        queue_len(p->inner, k, n, to))

/* Multi-key operations: join every key, forward, relay. */
#define MULTI_KEY(name, call)                         \
  static tdist_status_t name {                        \
    prefix_store_t *p = P(s);                         \
    char **ks = join_all(p, keys, n);                 \
    if (!ks) return nomem(p);                         \
    const char *const *k = (const char *const *)ks;   \
    tdist_status_t st = relay(p, p->inner->vt->call); \
    free_all(ks, n);                                  \
    return st;                                        \
  }

MULTI_KEY(px_check(tdist_store_t *s, const char *const *keys, size_t n, int *ready, int64_t to),
          check(p->inner, k, n, ready, to))
MULTI_KEY(px_wait(tdist_store_t *s, const char *const *keys, size_t n, int64_t to),
          wait(p->inner, k, n, to))
MULTI_KEY(px_multi_get(tdist_store_t *s, const char *const *keys, size_t n, void **v, size_t *l,
                       int64_t to),
          multi_get(p->inner, k, n, v, l, to))
MULTI_KEY(px_multi_set(tdist_store_t *s, const char *const *keys, const void *const *v,
                       const size_t *l, size_t n, int64_t to),
          multi_set(p->inner, k, v, l, n, to))

static tdist_store_t *px_inner(tdist_store_t *s) { return P(s)->inner; }

static tdist_status_t px_num_keys(tdist_store_t *s, int64_t *n, int64_t to) {
  prefix_store_t *p = P(s);
  return relay(p, p->inner->vt->num_keys(p->inner, n, to));
}

static const tdist__store_vtable_t k_prefix_vt = {
    "prefix",
    px_destroy,
    px_set,
    px_get,
    px_add,
    px_compare_set,
    px_check,
    px_wait,
    px_delete,
    px_num_keys,
    px_append,
    px_multi_get,
    px_multi_set,
    px_queue_push,
    px_queue_pop,
    px_queue_len,
    0 /* thread_safe */,
    px_inner,
};

TDIST_EXTERN tdist_status_t tdist_prefix_store_create(tdist_store_t *inner, const char *prefix,
                                                      tdist_store_t **out) {
  if (!out)
    return tdist__fail(TDIST_ERR_INVALID_ARGUMENT, "tdist_prefix_store_create: out is NULL");
  *out = NULL;
  if (!inner || inner->magic != TDIST__STORE_MAGIC)
    return tdist__fail(TDIST_ERR_INVALID_ARGUMENT,
                       "tdist_prefix_store_create: inner store is NULL or freed");
  if (!prefix)
    return tdist__fail(TDIST_ERR_INVALID_ARGUMENT, "tdist_prefix_store_create: prefix is NULL");
  prefix_store_t *p = calloc(1, sizeof *p);
  char *pc = strdup(prefix);
  if (!p || !pc) {
    free(p);
    free(pc);
    return tdist__fail(TDIST_ERR_NO_MEMORY, "tdist_prefix_store_create: out of memory");
  }
  p->inner = inner;
  p->prefix = pc;
  p->plen = strlen(pc);
  tdist__store_init(&p->base, &k_prefix_vt, inner->timeout_ms);
  *out = &p->base;
  return TDIST_OK;
}
