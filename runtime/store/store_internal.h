/* The store handle shared by every store kind: a magic word, a vtable, the default timeout and
 * the handle's error text. store.c validates arguments and dispatches; each kind (client.c,
 * memory.c, file.c, prefix.c) implements the vtable, and depends on store.c, never the reverse
 * (a wrapper is unwrapped through its vtable's inner member). Timeouts reaching the vtable are
 * already resolved (always > 0). */
#ifndef TDIST_STORE_STORE_INTERNAL_H
#define TDIST_STORE_STORE_INTERNAL_H

#include <stdarg.h>
#include <stdatomic.h>

#include "runtime/common/status_internal.h"
#include "tdist/store.h"

#define TDIST__STORE_MAGIC 0x5709e5a1u

typedef struct tdist__store_vtable {
  const char *kind; /* "tcp", "memory", "prefix" */
  void (*destroy)(tdist_store_t *s);
  tdist_status_t (*set)(tdist_store_t *s, const char *key, const void *v, size_t n, int64_t to);
  tdist_status_t (*get)(tdist_store_t *s, const char *key, void **v, size_t *n, int64_t to);
  tdist_status_t (*add)(tdist_store_t *s, const char *key, int64_t delta, int64_t *res, int64_t to);
  tdist_status_t (*compare_set)(tdist_store_t *s, const char *key, const void *e, size_t en,
                                const void *d, size_t dn, void **out, size_t *outn, int64_t to);
  tdist_status_t (*check)(tdist_store_t *s, const char *const *keys, size_t n, int *ready,
                          int64_t to);
  tdist_status_t (*wait)(tdist_store_t *s, const char *const *keys, size_t n, int64_t to);
  tdist_status_t (*delete_key)(tdist_store_t *s, const char *key, int *deleted, int64_t to);
  tdist_status_t (*num_keys)(tdist_store_t *s, int64_t *n, int64_t to);
  tdist_status_t (*append)(tdist_store_t *s, const char *key, const void *v, size_t n, int64_t to);
  tdist_status_t (*multi_get)(tdist_store_t *s, const char *const *keys, size_t n, void **vals,
                              size_t *lens, int64_t to);
  tdist_status_t (*multi_set)(tdist_store_t *s, const char *const *keys, const void *const *vals,
                              const size_t *lens, size_t n, int64_t to);
  tdist_status_t (*queue_push)(tdist_store_t *s, const char *key, const void *v, size_t n,
                               int64_t to);
  /* wait_ms == 0: no waiting; else wait up to wait_ms. */
  tdist_status_t (*queue_pop)(tdist_store_t *s, const char *key, int64_t wait_ms, void **v,
                              size_t *n, int64_t to);
  tdist_status_t (*queue_len)(tdist_store_t *s, const char *key, int64_t *n, int64_t to);
  /* 1 if one handle may be used by several threads at once (memory store): its error text is
   * then kept per thread (tdist_last_error) instead of in the handle. */
  int thread_safe;
  /* A wrapper's inner store (the prefix store's); NULL, or a NULL member, for the others. */
  tdist_store_t *(*inner)(tdist_store_t *s);
} tdist__store_vtable_t;

struct tdist_store_s {
  uint32_t magic;
  const tdist__store_vtable_t *vt;
  /* Atomic: a process group's worker thread reads it while the user's thread may set it. */
  _Atomic int64_t timeout_ms;
  char err[TDIST__ERRMSG_MAX];
};

/* The store at the bottom of a chain of prefix stores (s itself if it is not a prefix store).
 * Its timeout is the one every wrapper uses, as in PyTorch's PrefixStore. */
tdist_store_t *tdist__store_root(tdist_store_t *s);

/* Records the handle's error text (and the thread's) and returns st. */
tdist_status_t tdist__store_fail(tdist_store_t *s, tdist_status_t st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Joins keys for messages: "/a, /b, ... (N keys)", bounded. */
void tdist__store_keys_str(const char *const *keys, size_t n, char *buf, size_t cap);

#include "runtime/store/local_ip.h" /* tdist__store_local_ip */

void tdist__store_init(tdist_store_t *s, const tdist__store_vtable_t *vt, int64_t timeout_ms);

/* tdist_store_compare_set, _get and _multi_get with a timeout of their own (> 0), leaving the
 * handle's as it is: for callers inside libtdist that borrow a user's handle, possibly shared with
 * other threads (the process group's failure record, a backend's address or id exchange), where
 * changing the handle's timeout would change the user's calls too. */
tdist_status_t tdist__store_compare_set_ms(tdist_store_t *s, const char *key, const void *expected,
                                           size_t expected_len, const void *desired,
                                           size_t desired_len, void **out, size_t *out_len,
                                           int64_t timeout_ms);
tdist_status_t tdist__store_get_ms(tdist_store_t *s, const char *key, void **value, size_t *len,
                                   int64_t timeout_ms);
tdist_status_t tdist__store_multi_get_ms(tdist_store_t *s, const char *const *keys, size_t n,
                                         void **values, size_t *lens, int64_t timeout_ms);

#endif
