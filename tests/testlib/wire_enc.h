/* A small growable byte encoder for building TCPStore requests (and fuzz inputs) in tests, written
 * from the protocol reference (little-endian integers, u64-length-prefixed strings), independently
 * of runtime/store/proto.c, with the op table of both dialects; and unhex() for byte strings
 * written as hex. Allocation failure fails the test (CHECK). */
#ifndef TDIST_TESTLIB_WIRE_ENC_H
#define TDIST_TESTLIB_WIRE_ENC_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

/* The TCPStore ops and their wire bytes in each dialect, copied from reference §1.2 (-1: the
 * dialect has no such op). */
enum {
  OP_VALIDATE,
  OP_SET,
  OP_CAS,
  OP_GET,
  OP_ADD,
  OP_CHECK,
  OP_WAIT,
  OP_NUMKEYS,
  OP_WATCH,
  OP_DELETE,
  OP_APPEND,
  OP_MGET,
  OP_MSET,
  OP_CANCEL,
  OP_PING,
  OP_QPUSH,
  OP_QPOP,
  OP_QLEN,
  OP_N
};
static const int v113_wire[OP_N] = {-1,   0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07,
                                    0x08, -1,   -1,   -1,   -1,   -1,   -1,   -1,   -1};
static const int v2_wire[OP_N] = {0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, -1,
                                  0x08, 0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x0E, 0x0F, 0x10};

typedef struct {
  uint8_t *p;
  size_t len, cap;
} enc_t;

/* Room for n more bytes at e->p + e->len. */
static inline void enc_reserve(enc_t *e, size_t n) {
  if (e->len + n <= e->cap) return;
  size_t cap = e->cap ? e->cap : 256;
  while (cap < e->len + n) cap *= 2;
  e->p = realloc(e->p, cap);
  CHECK(e->p != NULL);
  e->cap = cap;
}
static inline void enc_bytes(enc_t *e, const void *data, size_t n) {
  enc_reserve(e, n);
  if (n) memcpy(e->p + e->len, data, n);
  e->len += n;
}
/* The characters of s, without a length or the NUL. */
static inline void enc_text(enc_t *e, const char *s) { enc_bytes(e, s, strlen(s)); }
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

/* Decodes hex text into out, ignoring anything that is not a hex digit (spaces); returns the
 * number of bytes. More than cap bytes, or an odd number of digits, fails the test. */
static inline size_t unhex(const char *hex, uint8_t *out, size_t cap) {
  size_t n = 0;
  int half = -1;
  for (const char *p = hex; *p; p++) {
    int v;
    if (*p >= '0' && *p <= '9')
      v = *p - '0';
    else if (*p >= 'a' && *p <= 'f')
      v = *p - 'a' + 10;
    else if (*p >= 'A' && *p <= 'F')
      v = *p - 'A' + 10;
    else
      continue;
    if (half < 0) {
      half = v;
    } else {
      CHECK(n < cap);
      out[n++] = (uint8_t)(half * 16 + v);
      half = -1;
    }
  }
  CHECK(half < 0);
  return n;
}

#endif
