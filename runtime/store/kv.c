/* Chained hash map of store entries (see kv.h). Grows by doubling at load factor 1; never
 * shrinks. Keys and values are owned copies. Must never be called from two threads at once. */
#include "runtime/store/kv.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct tdist__kv {
  tdist__kv_entry_t **buckets;
  size_t nbuckets; /* power of two */
  size_t nentries;
  uint64_t nvalues;
};

/* 64-bit FNV-1a with a final avalanche; keys are short and adversarial input only costs the
 * sender's own connection's time, since one request is processed at a time. */
static uint64_t hash_bytes(const uint8_t *p, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  return h;
}

tdist__kv_t *tdist__kv_create(void) {
  tdist__kv_t *kv = calloc(1, sizeof *kv);
  if (!kv) return NULL;
  kv->nbuckets = 1024;
  kv->buckets = calloc(kv->nbuckets, sizeof *kv->buckets);
  if (!kv->buckets) {
    free(kv);
    return NULL;
  }
  return kv;
}

static void free_entry(tdist__kv_entry_t *e) {
  for (tdist__kv_qitem_t *q = e->qhead; q;) {
    tdist__kv_qitem_t *n = q->next;
    free(q);
    q = n;
  }
  free(e->val);
  free(e->key);
  free(e);
}

void tdist__kv_destroy(tdist__kv_t *kv) {
  if (!kv) return;
  for (size_t i = 0; i < kv->nbuckets; i++) {
    for (tdist__kv_entry_t *e = kv->buckets[i]; e;) {
      tdist__kv_entry_t *n = e->next;
      free_entry(e);
      e = n;
    }
  }
  free(kv->buckets);
  free(kv);
}

uint64_t tdist__kv_num_keys(const tdist__kv_t *kv) { return kv->nvalues; }

tdist__kv_entry_t *tdist__kv_find(tdist__kv_t *kv, const void *key, size_t klen) {
  uint64_t h = hash_bytes(key, klen);
  for (tdist__kv_entry_t *e = kv->buckets[h & (kv->nbuckets - 1)]; e; e = e->next)
    if (e->hash == h && e->klen == klen && (klen == 0 || memcmp(e->key, key, klen) == 0)) return e;
  return NULL;
}

static void grow(tdist__kv_t *kv) {
  size_t nb = kv->nbuckets * 2;
  tdist__kv_entry_t **b = calloc(nb, sizeof *b);
  if (!b) return; /* keep working with longer chains */
  for (size_t i = 0; i < kv->nbuckets; i++) {
    for (tdist__kv_entry_t *e = kv->buckets[i]; e;) {
      tdist__kv_entry_t *n = e->next;
      size_t j = e->hash & (nb - 1);
      e->next = b[j];
      b[j] = e;
      e = n;
    }
  }
  free(kv->buckets);
  kv->buckets = b;
  kv->nbuckets = nb;
}

tdist__kv_entry_t *tdist__kv_lookup(tdist__kv_t *kv, const void *key, size_t klen) {
  tdist__kv_entry_t *e = tdist__kv_find(kv, key, klen);
  if (e) return e;
  e = calloc(1, sizeof *e);
  if (!e) return NULL;
  e->key = malloc(klen ? klen : 1);
  if (!e->key) {
    free(e);
    return NULL;
  }
  if (klen) memcpy(e->key, key, klen);
  e->klen = klen;
  e->hash = hash_bytes(key, klen);
  if (kv->nentries >= kv->nbuckets) grow(kv);
  size_t j = e->hash & (kv->nbuckets - 1);
  e->next = kv->buckets[j];
  kv->buckets[j] = e;
  kv->nentries++;
  return e;
}

void tdist__kv_release(tdist__kv_t *kv, tdist__kv_entry_t *e) {
  if (!e || e->has_value || e->qlen > 0 || e->waiters) return;
  tdist__kv_entry_t **pp = &kv->buckets[e->hash & (kv->nbuckets - 1)];
  while (*pp && *pp != e) pp = &(*pp)->next;
  if (!*pp) return;
  *pp = e->next;
  kv->nentries--;
  free_entry(e);
}

/* Replaces the value with a copy of val (capacity kept when it fits). */
static int store_value(tdist__kv_t *kv, tdist__kv_entry_t *e, const void *val, size_t vlen) {
  if (vlen > e->vcap || !e->val || (e->vcap > 4096 && vlen < e->vcap / 4)) {
    uint8_t *nv = malloc(vlen ? vlen : 1);
    if (!nv) return -ENOMEM;
    free(e->val);
    e->val = nv;
    e->vcap = vlen ? vlen : 1;
  }
  if (vlen) memcpy(e->val, val, vlen);
  e->vlen = vlen;
  if (!e->has_value) kv->nvalues++;
  e->has_value = 1;
  return 0;
}

int tdist__kv_set(tdist__kv_t *kv, const void *key, size_t klen, const void *val, size_t vlen,
                  tdist__kv_entry_t **out) {
  tdist__kv_entry_t *e = tdist__kv_lookup(kv, key, klen);
  if (!e) return -ENOMEM;
  int r = store_value(kv, e, val, vlen);
  if (r) {
    tdist__kv_release(kv, e);
    return r;
  }
  if (out) *out = e;
  return 0;
}

int tdist__kv_append(tdist__kv_t *kv, const void *key, size_t klen, const void *val, size_t vlen,
                     tdist__kv_entry_t **out) {
  tdist__kv_entry_t *e = tdist__kv_lookup(kv, key, klen);
  if (!e) return -ENOMEM;
  if (!e->has_value) {
    int r = store_value(kv, e, val, vlen);
    if (r) {
      tdist__kv_release(kv, e);
      return r;
    }
  } else {
    if (vlen > SIZE_MAX - e->vlen) return -ENOMEM;
    size_t need = e->vlen + vlen;
    if (need > e->vcap) {
      size_t cap = e->vcap * 2 > need ? e->vcap * 2 : need;
      uint8_t *nv = realloc(e->val, cap);
      if (!nv) return -ENOMEM;
      e->val = nv;
      e->vcap = cap;
    }
    if (vlen) memcpy(e->val + e->vlen, val, vlen);
    e->vlen = need;
  }
  if (out) *out = e;
  return 0;
}

int tdist__kv_parse_int(const uint8_t *p, size_t n, int64_t *out) {
  size_t i = 0;
  while (i < n && (p[i] == ' ' || (p[i] >= '\t' && p[i] <= '\r'))) i++;
  int neg = 0;
  if (i < n && (p[i] == '+' || p[i] == '-')) neg = p[i++] == '-';
  if (i >= n || p[i] < '0' || p[i] > '9') return -EINVAL;
  /* Accumulate as a negative number so INT64_MIN parses. */
  int64_t v = 0;
  for (; i < n && p[i] >= '0' && p[i] <= '9'; i++) {
    int d = p[i] - '0';
    if (v < (INT64_MIN + d) / 10) return -EINVAL;
    v = v * 10 - d;
  }
  if (!neg) {
    if (v == INT64_MIN) return -EINVAL;
    v = -v;
  }
  *out = v;
  return 0;
}

int tdist__kv_add(tdist__kv_t *kv, const void *key, size_t klen, int64_t delta, int64_t *result,
                  tdist__kv_entry_t **out) {
  tdist__kv_entry_t *e = tdist__kv_lookup(kv, key, klen);
  if (!e) return -ENOMEM;
  int64_t cur = 0;
  if (e->has_value && tdist__kv_parse_int(e->val, e->vlen, &cur) != 0) return -EINVAL;
  /* PyTorch adds int64s in C++, where overflow is undefined; wrap like the hardware does. */
  int64_t v = (int64_t)((uint64_t)cur + (uint64_t)delta);
  char text[24];
  int n = snprintf(text, sizeof text, "%lld", (long long)v);
  int r = store_value(kv, e, text, (size_t)n);
  if (r) {
    tdist__kv_release(kv, e);
    return r;
  }
  if (result) *result = v;
  if (out) *out = e;
  return 0;
}

int tdist__kv_compare_set(tdist__kv_t *kv, const void *key, size_t klen, const void *expected,
                          size_t elen, const void *desired, size_t dlen, const uint8_t **cur,
                          size_t *cur_len, int *stored, tdist__kv_entry_t **out) {
  tdist__kv_entry_t *e = tdist__kv_find(kv, key, klen);
  *stored = 0;
  if (out) *out = NULL;
  if (!e || !e->has_value) {
    if (elen != 0) {
      /* PyTorch replies `expected` and stores nothing. */
      *cur = expected;
      *cur_len = elen;
      return 0;
    }
    int r = tdist__kv_set(kv, key, klen, desired, dlen, &e);
    if (r) return r;
    *stored = 1;
  } else if (e->vlen == elen && (elen == 0 || memcmp(e->val, expected, elen) == 0)) {
    int r = store_value(kv, e, desired, dlen);
    if (r) return r;
    *stored = 1;
  }
  *cur = e->val;
  *cur_len = e->vlen;
  if (out) *out = e;
  return 0;
}

int tdist__kv_delete(tdist__kv_t *kv, const void *key, size_t klen) {
  tdist__kv_entry_t *e = tdist__kv_find(kv, key, klen);
  if (!e || !e->has_value) return 0;
  free(e->val);
  e->val = NULL;
  e->vlen = e->vcap = 0;
  e->has_value = 0;
  kv->nvalues--;
  tdist__kv_release(kv, e);
  return 1;
}

int tdist__kv_queue_push(tdist__kv_t *kv, const void *key, size_t klen, const void *val,
                         size_t vlen, tdist__kv_entry_t **out) {
  tdist__kv_entry_t *e = tdist__kv_lookup(kv, key, klen);
  if (!e) return -ENOMEM;
  tdist__kv_qitem_t *q = malloc(sizeof *q + vlen);
  if (!q) {
    tdist__kv_release(kv, e);
    return -ENOMEM;
  }
  q->next = NULL;
  q->len = vlen;
  if (vlen) memcpy(q->data, val, vlen);
  if (e->qtail)
    e->qtail->next = q;
  else
    e->qhead = q;
  e->qtail = q;
  e->qlen++;
  if (out) *out = e;
  return 0;
}

tdist__kv_qitem_t *tdist__kv_queue_pop(tdist__kv_t *kv, const void *key, size_t klen) {
  tdist__kv_entry_t *e = tdist__kv_find(kv, key, klen);
  if (!e || !e->qhead) return NULL;
  tdist__kv_qitem_t *q = e->qhead;
  e->qhead = q->next;
  if (!e->qhead) e->qtail = NULL;
  e->qlen--;
  tdist__kv_release(kv, e);
  return q;
}

size_t tdist__kv_queue_len(tdist__kv_t *kv, const void *key, size_t klen) {
  tdist__kv_entry_t *e = tdist__kv_find(kv, key, klen);
  return e ? e->qlen : 0;
}

int tdist__kv_all_exist(tdist__kv_t *kv, const char *const *keys, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (!tdist__kv_exists(tdist__kv_find(kv, keys[i], strlen(keys[i])))) return 0;
  return 1;
}

void *tdist__kv_dup(const void *p, size_t n) {
  void *d = malloc(n ? n : 1);
  if (d && n) memcpy(d, p, n);
  return d;
}
