/* A small growable byte encoder for building TCPStore requests in tests, written from the
 * protocol reference (little-endian integers, u64-length-prefixed strings), independently of
 * runtime/store/proto.c. Allocation failure fails the test (CHECK). */
#ifndef TDIST_TESTLIB_WIRE_ENC_H
#define TDIST_TESTLIB_WIRE_ENC_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

typedef struct {
  uint8_t *p;
  size_t len, cap;
} enc_t;

static inline void enc_bytes(enc_t *e, const void *data, size_t n) {
  if (e->len + n > e->cap) {
    size_t cap = e->cap ? e->cap : 256;
    while (cap < e->len + n) cap *= 2;
    e->p = realloc(e->p, cap);
    CHECK(e->p != NULL);
    e->cap = cap;
  }
  if (n) memcpy(e->p + e->len, data, n);
  e->len += n;
}
static inline void enc_u8(enc_t *e, uint8_t v) { enc_bytes(e, &v, 1); }
static inline void enc_u64(enc_t *e, uint64_t v) {
  uint8_t b[8];
  for (int i = 0; i < 8; i++) b[i] = (uint8_t)(v >> (8 * i));
  enc_bytes(e, b, 8);
}
static inline void enc_u32(enc_t *e, uint32_t v) {
  uint8_t b[4];
  for (int i = 0; i < 4; i++) b[i] = (uint8_t)(v >> (8 * i));
  enc_bytes(e, b, 4);
}
static inline void enc_str(enc_t *e, const void *s, size_t n) {
  enc_u64(e, n);
  enc_bytes(e, s, n);
}
static inline void enc_cstr(enc_t *e, const char *s) { enc_str(e, s, strlen(s)); }

#endif
