/* The store's key/value map with PyTorch's per-operation semantics (ADD as decimal text,
 * COMPARE_SET rules, queues), shared by the TCP server (single thread) and the memory store (under
 * its mutex). Not thread safe by itself. Every function that can fail returns 0 or -errno (-ENOMEM,
 * -EINVAL).
 *
 * An entry "exists" for WAIT/CHECK when it holds a value or a non-empty queue. Entries also carry
 * an opaque `waiters` pointer owned by the server; an entry with waiters is never freed. */
#ifndef TDIST_STORE_KV_H
#define TDIST_STORE_KV_H

#include <stddef.h>
#include <stdint.h>

typedef struct tdist__kv_qitem {
  struct tdist__kv_qitem *next;
  size_t len;
  uint8_t data[];
} tdist__kv_qitem_t;

typedef struct tdist__kv_entry {
  struct tdist__kv_entry *next; /* hash chain */
  uint64_t hash;
  uint8_t *key;
  size_t klen;
  uint8_t *val;
  size_t vlen, vcap;
  int has_value;
  tdist__kv_qitem_t *qhead, *qtail;
  size_t qlen;
  void *waiters; /* server-owned list of pending WAITs on this key */
} tdist__kv_entry_t;

typedef struct tdist__kv tdist__kv_t;

tdist__kv_t *tdist__kv_create(void);
/* Frees every entry. The caller must have dropped its waiter lists. */
void tdist__kv_destroy(tdist__kv_t *kv);

/* Number of keys holding a value (PyTorch's GETNUMKEYS). */
uint64_t tdist__kv_num_keys(const tdist__kv_t *kv);

tdist__kv_entry_t *tdist__kv_find(tdist__kv_t *kv, const void *key, size_t klen);
/* Finds or creates an empty entry (no value, no queue). NULL on allocation failure. */
tdist__kv_entry_t *tdist__kv_lookup(tdist__kv_t *kv, const void *key, size_t klen);
/* Frees the entry if nothing keeps it (no value, empty queue, no waiters). */
void tdist__kv_release(tdist__kv_t *kv, tdist__kv_entry_t *e);

static inline int tdist__kv_exists(const tdist__kv_entry_t *e) {
  return e && (e->has_value || e->qlen > 0);
}

/* Each returns the entry touched (for waking waiters) through *out when out != NULL. */
int tdist__kv_set(tdist__kv_t *kv, const void *key, size_t klen, const void *val, size_t vlen,
                  tdist__kv_entry_t **out);
int tdist__kv_append(tdist__kv_t *kv, const void *key, size_t klen, const void *val, size_t vlen,
                     tdist__kv_entry_t **out);
/* -EINVAL if the current value is not an integer as std::stoll reads it (or overflows). */
int tdist__kv_add(tdist__kv_t *kv, const void *key, size_t klen, int64_t delta, int64_t *result,
                  tdist__kv_entry_t **out);
/* cur and cur_len get the reply bytes (pointing into the map or into `expected`); *stored = 1 if
 * the value changed. */
int tdist__kv_compare_set(tdist__kv_t *kv, const void *key, size_t klen, const void *expected,
                          size_t elen, const void *desired, size_t dlen, const uint8_t **cur,
                          size_t *cur_len, int *stored, tdist__kv_entry_t **out);
/* 1 if the key held a value, else 0. */
int tdist__kv_delete(tdist__kv_t *kv, const void *key, size_t klen);

int tdist__kv_queue_push(tdist__kv_t *kv, const void *key, size_t klen, const void *val,
                         size_t vlen, tdist__kv_entry_t **out);
/* Pops the oldest item (caller frees it with free()); NULL if the queue is empty. */
tdist__kv_qitem_t *tdist__kv_queue_pop(tdist__kv_t *kv, const void *key, size_t klen);
size_t tdist__kv_queue_len(tdist__kv_t *kv, const void *key, size_t klen);

/* 1 if every NUL-terminated key exists (a value or a non-empty queue). */
int tdist__kv_all_exist(tdist__kv_t *kv, const char *const *keys, size_t n);

/* A malloc'd copy of n bytes (never NULL for n == 0 unless out of memory); free() it. */
void *tdist__kv_dup(const void *p, size_t n);

/* std::stoll semantics on a byte string: leading whitespace, optional sign, decimal digits, stops
 * at the first other byte. 0 on success, -EINVAL if no digits or out of int64 range. */
int tdist__kv_parse_int(const uint8_t *p, size_t n, int64_t *out);

#endif
