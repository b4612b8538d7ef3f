/* An independent reference for the c10d TCPStore request layouts, written from the shared
 * reference torch-contracts.md §1.2-§1.3 (not from runtime/store/proto.c), used by the
 * fuzz target to check the real parser field by field and by the replay test to generate valid
 * requests. Header-only (static) so both binaries and the plain-clang libFuzzer build share it.
 *
 * Layout letters: k = str key (u64 len + bytes, bounded by max_key), v = bytes value (bounded by
 * max_value), i = i64, u = u32, K = u64 count + count keys, P = u64 count + count (key, value)
 * pairs, "" = nothing after the opcode. */
#ifndef TDIST_TESTS_FUZZ_PROTO_REF_H
#define TDIST_TESTS_FUZZ_PROTO_REF_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "runtime/store/proto.h"

typedef struct {
  tdist__op_t op;
  const char *layout;
} ref_op_t;

/* Index = wire byte. §1.2: 1.13 numbering. */
static const ref_op_t ref_v113[] = {
    {TDIST__OP_SET, "kv"},      {TDIST__OP_COMPARE_SET, "kvv"}, {TDIST__OP_GET, "k"},
    {TDIST__OP_ADD, "ki"},      {TDIST__OP_CHECK, "K"},         {TDIST__OP_WAIT, "K"},
    {TDIST__OP_GETNUMKEYS, ""}, {TDIST__OP_WATCH_KEY, "k"},     {TDIST__OP_DELETE_KEY, "k"},
};

/* §1.2: 2.6 numbering plus the post-2.6 queue ops. */
static const ref_op_t ref_v2[] = {
    {TDIST__OP_VALIDATE, "u"},   {TDIST__OP_SET, "kv"},      {TDIST__OP_COMPARE_SET, "kvv"},
    {TDIST__OP_GET, "k"},        {TDIST__OP_ADD, "ki"},      {TDIST__OP_CHECK, "K"},
    {TDIST__OP_WAIT, "K"},       {TDIST__OP_GETNUMKEYS, ""}, {TDIST__OP_DELETE_KEY, "k"},
    {TDIST__OP_APPEND, "kv"},    {TDIST__OP_MULTI_GET, "K"}, {TDIST__OP_MULTI_SET, "P"},
    {TDIST__OP_CANCEL_WAIT, ""}, {TDIST__OP_PING, "u"},      {TDIST__OP_QUEUE_PUSH, "kv"},
    {TDIST__OP_QUEUE_POP, "k"},  {TDIST__OP_QUEUE_LEN, "k"},
};

static inline const ref_op_t *ref_lookup(tdist__dialect_t d, uint8_t wire) {
  if (d == TDIST__DIALECT_V1_13 && wire < sizeof ref_v113 / sizeof ref_v113[0])
    return &ref_v113[wire];
  if (d == TDIST__DIALECT_V2 && wire < sizeof ref_v2 / sizeof ref_v2[0]) return &ref_v2[wire];
  return NULL;
}

static inline size_t ref_op_count(tdist__dialect_t d) {
  return d == TDIST__DIALECT_V1_13 ? sizeof ref_v113 / sizeof ref_v113[0]
                                   : sizeof ref_v2 / sizeof ref_v2[0];
}

/* §1.11 classification. */
static inline tdist__dialect_t ref_classify(const uint8_t *b, size_t len) {
  if (len == 0) return TDIST__DIALECT_UNKNOWN;
  if (b[0] != 0) return TDIST__DIALECT_V1_13;
  if (len < 5) return TDIST__DIALECT_UNKNOWN;
  /* ce f7 85 3c: the magic 0x3C85F7CE, little-endian. */
  if (b[1] == 0xce && b[2] == 0xf7 && b[3] == 0x85 && b[4] == 0x3c) return TDIST__DIALECT_V2;
  return TDIST__DIALECT_V1_13;
}

static inline uint64_t ref_le64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}

#define REF_MAX_ITEMS 64 /* the fuzz limits keep max_keys at or below this */

typedef enum { REF_OK, REF_MORE, REF_ERROR } ref_result_t;

typedef struct {
  ref_result_t result;
  size_t total; /* REF_OK: request size; REF_MORE: end of the field that is short */
  tdist__op_t op;
  size_t key_off, key_len, a_off, a_len, b_off, b_len; /* offsets into the buffer */
  int64_t delta;
  uint32_t u32;
  uint64_t n;
  size_t items_off, items_len;
  size_t item_key_off[REF_MAX_ITEMS], item_key_len[REF_MAX_ITEMS];
  size_t item_val_off[REF_MAX_ITEMS], item_val_len[REF_MAX_ITEMS];
} ref_request_t;

/* Decodes one request the simple way: walk the layout; a field whose bytes are not all there is
 * REF_MORE; a length over its limit, an unknown opcode, or a request whose size is known to
 * exceed max_request (when non-zero) is REF_ERROR. */
static inline void ref_parse(tdist__dialect_t d, const uint8_t *b, size_t len,
                             const tdist__proto_limits_t *lim, ref_request_t *r) {
  memset(r, 0, sizeof *r);
  r->result = REF_OK;
  if (len == 0) {
    r->result = REF_MORE;
    r->total = 1;
    return;
  }
  const ref_op_t *e = ref_lookup(d, b[0]);
  if (e == NULL) {
    r->result = REF_ERROR;
    return;
  }
  r->op = e->op;
  size_t pos = 1;
  int slot = 0; /* which of key/a/b the next k/v fills */
  uint64_t max_req = lim->max_request;
/* Needs `n` more bytes at pos: REF_ERROR past max_request, REF_MORE past len. */
#define REF_NEED(n)                                \
  do {                                             \
    uint64_t end_ = (uint64_t)pos + (uint64_t)(n); \
    if (max_req && end_ > max_req) {               \
      r->result = REF_ERROR;                       \
      return;                                      \
    }                                              \
    if (end_ > len) {                              \
      r->result = REF_MORE;                        \
      r->total = (size_t)end_;                     \
      return;                                      \
    }                                              \
  } while (0)
/* Reads one length-prefixed field bounded by `limit` into (off, flen). */
#define REF_BYTES(limit, off, flen)  \
  do {                               \
    REF_NEED(8);                     \
    uint64_t n_ = ref_le64(b + pos); \
    pos += 8;                        \
    if (n_ > (limit)) {              \
      r->result = REF_ERROR;         \
      return;                        \
    }                                \
    REF_NEED(n_);                    \
    (off) = pos;                     \
    (flen) = (size_t)n_;             \
    pos += (size_t)n_;               \
  } while (0)
  for (const char *l = e->layout; *l; l++) {
    switch (*l) {
      case 'k':
        REF_BYTES(lim->max_key, r->key_off, r->key_len);
        slot = 1;
        break;
      case 'v':
        if (slot == 1) {
          REF_BYTES(lim->max_value, r->a_off, r->a_len);
          slot = 2;
        } else {
          REF_BYTES(lim->max_value, r->b_off, r->b_len);
        }
        break;
      case 'i':
        REF_NEED(8);
        r->delta = (int64_t)ref_le64(b + pos);
        pos += 8;
        break;
      case 'u':
        REF_NEED(4);
        r->u32 = (uint32_t)b[pos] | (uint32_t)b[pos + 1] << 8 | (uint32_t)b[pos + 2] << 16 |
                 (uint32_t)b[pos + 3] << 24;
        pos += 4;
        break;
      case 'K':
      case 'P': {
        REF_NEED(8);
        uint64_t n = ref_le64(b + pos);
        pos += 8;
        if (n > lim->max_keys) {
          r->result = REF_ERROR;
          return;
        }
        r->n = n;
        r->items_off = pos;
        for (uint64_t i = 0; i < n; i++) {
          size_t ko = 0, kl = 0, vo = 0, vl = 0;
          REF_BYTES(lim->max_key, ko, kl);
          if (*l == 'P') REF_BYTES(lim->max_value, vo, vl);
          if (i < REF_MAX_ITEMS) {
            r->item_key_off[i] = ko;
            r->item_key_len[i] = kl;
            r->item_val_off[i] = vo;
            r->item_val_len[i] = vl;
          }
        }
        r->items_len = pos - r->items_off;
        break;
      }
    }
  }
#undef REF_BYTES
#undef REF_NEED
  r->total = pos;
}

#endif
