/* Unit tests of the TCPStore wire codec (runtime/store/proto.h), written from the PyTorch
 * reference (shared/reference/torch-contracts.md §1), not from proto.c.
 *
 * Every byte capture of reference §1.3 and §1.12 is spelled here as hex copied from the reference
 * text and decoded in its dialect; each one is also fed at every prefix length, which must ask for
 * more bytes with a sane lower bound. Classification (§1.11), the opcode tables of both dialects
 * (§1.2), the length limits (which must fail as soon as a length field is read, before the bytes
 * it announces) and a random round trip through an encoder written here complete the picture.
 * The test never touches a socket. */
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "rng.h"
#include "wire_enc.h"
#include "runtime/store/proto.h"

/* ---------------------------------------------------------------------------------------- */
/* Helpers                                                                                  */
/* ---------------------------------------------------------------------------------------- */

static const tdist__proto_limits_t big_limits = {
    .max_key = 8192, .max_value = (uint64_t)64 << 20, .max_keys = 131072, .max_request = 0};

static int slice_is(tdist__slice_t s, const char *text) {
  size_t len = strlen(text);
  return s.len == len && (len == 0 || memcmp(s.ptr, text, len) == 0);
}

/* Parses buf and requires OK with every byte consumed. */
static void parse_whole(tdist__dialect_t d, const uint8_t *buf, size_t len,
                        const tdist__proto_limits_t *lim, tdist__request_t *req) {
  size_t consumed = 0;
  const char *why = NULL;
  memset(req, 0xA5, sizeof(*req));
  tdist__parse_result_t r = tdist__proto_parse(d, buf, len, lim, req, &consumed, &why);
  if (r != TDIST__PARSE_OK) fprintf(stderr, "parse: result %d why=%s\n", (int)r, why ? why : "");
  CHECK_EQ_INT(r, TDIST__PARSE_OK);
  CHECK_EQ_INT(consumed, len);
}

/* Every proper prefix must be NEED_MORE with prefix < bound <= len. */
static void check_prefixes(tdist__dialect_t d, const uint8_t *buf, size_t len,
                           const tdist__proto_limits_t *lim) {
  for (size_t k = 0; k < len; k++) {
    tdist__request_t req;
    size_t consumed = 0;
    const char *why = NULL;
    tdist__parse_result_t r = tdist__proto_parse(d, buf, k, lim, &req, &consumed, &why);
    if (r != TDIST__PARSE_NEED_MORE || consumed <= k || consumed > len) {
      fprintf(stderr,
              "prefix %zu of %zu (dialect %d, opcode %02x): result %d consumed %zu why=%s\n", k,
              len, (int)d, buf[0], (int)r, consumed, why ? why : "");
    }
    CHECK_EQ_INT(r, TDIST__PARSE_NEED_MORE);
    CHECK(consumed > k);
    CHECK(consumed <= len);
  }
}

static void expect_error(tdist__dialect_t d, const uint8_t *buf, size_t len,
                         const tdist__proto_limits_t *lim, const char *what) {
  tdist__request_t req;
  size_t consumed = 0;
  const char *why = NULL;
  tdist__parse_result_t r = tdist__proto_parse(d, buf, len, lim, &req, &consumed, &why);
  if (r != TDIST__PARSE_ERROR) {
    fprintf(stderr, "%s: expected PARSE_ERROR with %zu bytes, got %d (consumed %zu)\n", what, len,
            (int)r, consumed);
  }
  CHECK_EQ_INT(r, TDIST__PARSE_ERROR);
  CHECK(why != NULL && why[0] != '\0');
}

/* Walks a multi-key request; keys[i] (and values[i] for MULTI_SET) must match. */
static void check_items(const tdist__request_t *req, const char *const *keys,
                        const char *const *values, uint64_t n) {
  CHECK_EQ_INT(req->n, n);
  uint64_t pos = 0;
  for (uint64_t i = 0; i < n; i++) {
    tdist__slice_t k, v;
    v.ptr = NULL;
    v.len = 0;
    CHECK(tdist__proto_next_item(req, &pos, &k, &v) != 0);
    CHECK(slice_is(k, keys[i]));
    if (values) CHECK(slice_is(v, values[i]));
  }
  tdist__slice_t k, v;
  CHECK(tdist__proto_next_item(req, &pos, &k, &v) == 0);
}

/* ---------------------------------------------------------------------------------------- */
/* Captures (reference §1.3 and §1.12)                                                      */
/* ---------------------------------------------------------------------------------------- */

typedef struct {
  const char *name;
  tdist__dialect_t dialect;
  const char *hex;
} capture_t;

static const capture_t captures[] = {
    {"2.x VALIDATE", TDIST__DIALECT_V2, "00 ce f7 85 3c"},
    {"2.x PING 4660", TDIST__DIALECT_V2, "0d 34 12 00 00"},
    {"2.x SET /k1=v1", TDIST__DIALECT_V2, "01 03000000 00000000 2f6b31 02000000 00000000 7631"},
    {"1.13 SET /k1=v1", TDIST__DIALECT_V1_13, "00 03000000 00000000 2f6b31 02000000 00000000 7631"},
    {"1.13 ADD init/ 1", TDIST__DIALECT_V1_13, "03 05000000 00000000 696e69742f 01000000 00000000"},
    {"2.x ADD init/ 1", TDIST__DIALECT_V2, "04 05000000 00000000 696e69742f 01000000 00000000"},
    {"1.13 WAIT [/k1]", TDIST__DIALECT_V1_13, "05 01000000 00000000 03000000 00000000 2f6b31"},
    {"1.13 GET /k1", TDIST__DIALECT_V1_13, "02 03000000 00000000 2f6b31"},
    {"2.x CANCEL_WAIT", TDIST__DIALECT_V2, "0c"},
    {"1.13 GETNUMKEYS", TDIST__DIALECT_V1_13, "06"},
    {"1.13 DELETE /k1", TDIST__DIALECT_V1_13, "08 03000000 00000000 2f6b31"},
    {"2.x DELETE /k1", TDIST__DIALECT_V2, "08 03000000 00000000 2f6b31"},
    /* §1.12 */
    {"12 SET /k1=v1", TDIST__DIALECT_V1_13, "0003000000000000002f6b31 02000000000000007631"},
    {"12 WAIT [/k1]", TDIST__DIALECT_V1_13, "05 0100000000000000 0300000000000000 2f6b31"},
    {"12 GET /k1", TDIST__DIALECT_V1_13, "02 0300000000000000 2f6b31"},
    {"12 ADD /cnt 5", TDIST__DIALECT_V1_13, "03 0400000000000000 2f636e74 0500000000000000"},
    /* the reference elides the key length ("03 ... 2f636e74"); it is the same 4-byte key */
    {"12 ADD /cnt -2", TDIST__DIALECT_V1_13, "03 0400000000000000 2f636e74 feffffffffffffff"},
    {"12 CAS /cs '' new", TDIST__DIALECT_V1_13,
     "01 0300000000000000 2f6373 0000000000000000 0300000000000000 6e6577"},
    {"12 GETNUMKEYS", TDIST__DIALECT_V1_13, "06"},
    {"12 DELETE /k1", TDIST__DIALECT_V1_13, "08 0300000000000000 2f6b31"},
    {"12 WAIT [/late,/cnt]", TDIST__DIALECT_V1_13,
     "05 0200000000000000 0500000000000000 2f6c617465 0400000000000000 2f636e74"},
};
#define NCAPTURES (sizeof(captures) / sizeof(captures[0]))

/* The decoded meaning of capture i, checked field by field. */
static void check_capture_fields(size_t i, const tdist__request_t *r) {
  const char *name = captures[i].name;
  if (!strcmp(name, "2.x VALIDATE")) {
    CHECK_EQ_INT(r->op, TDIST__OP_VALIDATE);
    CHECK_EQ_INT(r->u32, 0x3C85F7CEu);
  } else if (!strcmp(name, "2.x PING 4660")) {
    CHECK_EQ_INT(r->op, TDIST__OP_PING);
    CHECK_EQ_INT(r->u32, 4660);
  } else if (strstr(name, "SET /k1=v1")) {
    CHECK_EQ_INT(r->op, TDIST__OP_SET);
    CHECK(slice_is(r->key, "/k1"));
    CHECK(slice_is(r->a, "v1"));
  } else if (strstr(name, "ADD init/ 1")) {
    CHECK_EQ_INT(r->op, TDIST__OP_ADD);
    CHECK(slice_is(r->key, "init/"));
    CHECK_EQ_INT(r->delta, 1);
  } else if (strstr(name, "WAIT [/k1]")) {
    static const char *const keys[] = {"/k1"};
    CHECK_EQ_INT(r->op, TDIST__OP_WAIT);
    check_items(r, keys, NULL, 1);
  } else if (strstr(name, "GET /k1")) {
    CHECK_EQ_INT(r->op, TDIST__OP_GET);
    CHECK(slice_is(r->key, "/k1"));
  } else if (!strcmp(name, "2.x CANCEL_WAIT")) {
    CHECK_EQ_INT(r->op, TDIST__OP_CANCEL_WAIT);
  } else if (strstr(name, "GETNUMKEYS")) {
    CHECK_EQ_INT(r->op, TDIST__OP_GETNUMKEYS);
  } else if (strstr(name, "DELETE /k1")) {
    CHECK_EQ_INT(r->op, TDIST__OP_DELETE_KEY);
    CHECK(slice_is(r->key, "/k1"));
  } else if (!strcmp(name, "12 ADD /cnt 5")) {
    CHECK_EQ_INT(r->op, TDIST__OP_ADD);
    CHECK(slice_is(r->key, "/cnt"));
    CHECK_EQ_INT(r->delta, 5);
  } else if (!strcmp(name, "12 ADD /cnt -2")) {
    CHECK_EQ_INT(r->op, TDIST__OP_ADD);
    CHECK(slice_is(r->key, "/cnt"));
    CHECK_EQ_INT(r->delta, -2);
  } else if (!strcmp(name, "12 CAS /cs '' new")) {
    CHECK_EQ_INT(r->op, TDIST__OP_COMPARE_SET);
    CHECK(slice_is(r->key, "/cs"));
    CHECK(slice_is(r->a, ""));
    CHECK(slice_is(r->b, "new"));
  } else if (!strcmp(name, "12 WAIT [/late,/cnt]")) {
    static const char *const keys[] = {"/late", "/cnt"};
    CHECK_EQ_INT(r->op, TDIST__OP_WAIT);
    check_items(r, keys, NULL, 2);
  } else {
    fprintf(stderr, "no field check for capture %s\n", name);
    CHECK(0);
  }
}

static void test_captures(void) {
  uint8_t buf[256];
  for (size_t i = 0; i < NCAPTURES; i++) {
    size_t len = unhex(captures[i].hex, buf, sizeof(buf));
    tdist__request_t req;
    parse_whole(captures[i].dialect, buf, len, &big_limits, &req);
    CHECK_EQ_INT(req.wire_op, buf[0]);
    check_capture_fields(i, &req);
    check_prefixes(captures[i].dialect, buf, len, &big_limits);
    /* Trailing bytes of a following request must not change the decode or what it consumes. */
    uint8_t more[300];
    memcpy(more, buf, len);
    memset(more + len, 0x06, 16);
    size_t consumed = 0;
    const char *why = NULL;
    CHECK_EQ_INT(
        tdist__proto_parse(captures[i].dialect, more, len + 16, &big_limits, &req, &consumed, &why),
        TDIST__PARSE_OK);
    CHECK_EQ_INT(consumed, len);
    check_capture_fields(i, &req);
  }
  TEST_LOG("captures: %zu decoded, every prefix NEED_MORE", NCAPTURES);
}

/* The §1.12 session of c1 in one buffer (what a pipelining peer could send): parsed one by one. */
static void test_pipelined(void) {
  static const char *const names[] = {"12 SET /k1=v1", "12 WAIT [/k1]",  "12 GET /k1",
                                      "12 ADD /cnt 5", "12 ADD /cnt -2", "12 CAS /cs '' new",
                                      "12 GETNUMKEYS", "12 DELETE /k1",  "12 WAIT [/late,/cnt]"};
  const size_t nn = sizeof(names) / sizeof(names[0]);
  uint8_t buf[1024];
  size_t len = 0, idx[16], lens[16];
  for (size_t j = 0; j < nn; j++) {
    size_t i = 0;
    while (strcmp(captures[i].name, names[j]) != 0) i++;
    idx[j] = i;
    lens[j] = unhex(captures[i].hex, buf + len, sizeof(buf) - len);
    len += lens[j];
  }
  size_t off = 0;
  for (size_t j = 0; j < nn; j++) {
    tdist__request_t req;
    size_t consumed = 0;
    const char *why = NULL;
    CHECK_EQ_INT(tdist__proto_parse(TDIST__DIALECT_V1_13, buf + off, len - off, &big_limits, &req,
                                    &consumed, &why),
                 TDIST__PARSE_OK);
    CHECK_EQ_INT(consumed, lens[j]);
    check_capture_fields(idx[j], &req);
    off += consumed;
  }
  CHECK_EQ_INT(off, len);

  /* A 2.x connection's usual opening: VALIDATE and PING back to back, then a SET. */
  len = unhex("00 ce f7 85 3c 0d 34 12 00 00 01 03000000 00000000 2f6b31 02000000 00000000 7631",
              buf, sizeof(buf));
  CHECK_EQ_INT(tdist__proto_classify(buf, len), TDIST__DIALECT_V2);
  static const tdist__op_t ops[] = {TDIST__OP_VALIDATE, TDIST__OP_PING, TDIST__OP_SET};
  static const size_t sizes[] = {5, 5, 22};
  off = 0;
  for (int j = 0; j < 3; j++) {
    tdist__request_t req;
    size_t consumed = 0;
    const char *why = NULL;
    CHECK_EQ_INT(tdist__proto_parse(TDIST__DIALECT_V2, buf + off, len - off, &big_limits, &req,
                                    &consumed, &why),
                 TDIST__PARSE_OK);
    CHECK_EQ_INT(req.op, ops[j]);
    CHECK_EQ_INT(consumed, sizes[j]);
    off += consumed;
  }
  CHECK_EQ_INT(off, len);
  TEST_LOG("pipelined: ok");
}

/* ---------------------------------------------------------------------------------------- */
/* Classification (§1.11)                                                                   */
/* ---------------------------------------------------------------------------------------- */

static void test_classify(void) {
  uint8_t b[64] = {0};
  CHECK_EQ_INT(tdist__proto_classify(b, 0), TDIST__DIALECT_UNKNOWN);
  for (int first = 1; first < 256; first++) {
    b[0] = (uint8_t)first;
    CHECK_EQ_INT(tdist__proto_classify(b, 1), TDIST__DIALECT_V1_13);
    memset(b + 1, 0, 8);
    CHECK_EQ_INT(tdist__proto_classify(b, 9), TDIST__DIALECT_V1_13);
  }
  /* 00 + magic: 2.x, whatever follows */
  size_t n = unhex("00 ce f7 85 3c 0d 34 12 00 00", b, sizeof(b));
  CHECK_EQ_INT(tdist__proto_classify(b, 5), TDIST__DIALECT_V2);
  CHECK_EQ_INT(tdist__proto_classify(b, n), TDIST__DIALECT_V2);
  /* 00 with fewer than 5 bytes: undecided, even when they are a prefix of the magic */
  for (size_t k = 1; k < 5; k++) CHECK_EQ_INT(tdist__proto_classify(b, k), TDIST__DIALECT_UNKNOWN);
  uint8_t z[4] = {0, 3, 0, 0};
  for (size_t k = 1; k <= 4; k++) CHECK_EQ_INT(tdist__proto_classify(z, k), TDIST__DIALECT_UNKNOWN);
  /* 00 + anything else: a 1.13 SET (low half of its key length) */
  n = unhex("00 03000000 00000000 2f6b31 02000000 00000000 7631", b, sizeof(b));
  CHECK_EQ_INT(tdist__proto_classify(b, 5), TDIST__DIALECT_V1_13);
  CHECK_EQ_INT(tdist__proto_classify(b, n), TDIST__DIALECT_V1_13);
  /* near misses of the magic, one byte changed */
  uint8_t m[5] = {0x00, 0xce, 0xf7, 0x85, 0x3c};
  for (int pos = 1; pos < 5; pos++) {
    for (int delta = 1; delta < 256; delta += 37) {
      uint8_t c[5];
      memcpy(c, m, 5);
      c[pos] = (uint8_t)(c[pos] + delta);
      CHECK_EQ_INT(tdist__proto_classify(c, 5), TDIST__DIALECT_V1_13);
    }
  }
  /* magic in big-endian order (a byte-swapping peer) is not 2.x */
  uint8_t be[5] = {0x00, 0x3c, 0x85, 0xf7, 0xce};
  CHECK_EQ_INT(tdist__proto_classify(be, 5), TDIST__DIALECT_V1_13);
  uint32_t s = 12345;
  for (int i = 0; i < 10000; i++) {
    uint8_t r[5] = {0};
    for (int j = 1; j < 5; j++) {
      s = s * 1103515245u + 12345u;
      r[j] = (uint8_t)(s >> 16);
    }
    if (memcmp(r, m, 5) == 0) continue;
    CHECK_EQ_INT(tdist__proto_classify(r, 5), TDIST__DIALECT_V1_13);
  }
  TEST_LOG("classify: ok");
}

/* ---------------------------------------------------------------------------------------- */
/* Opcode tables (§1.2)                                                                     */
/* ---------------------------------------------------------------------------------------- */

/* Written from the reference table, indexed by wire byte. */
static const tdist__op_t v113_table[] = {
    TDIST__OP_SET,        TDIST__OP_COMPARE_SET, TDIST__OP_GET,
    TDIST__OP_ADD,        TDIST__OP_CHECK,       TDIST__OP_WAIT,
    TDIST__OP_GETNUMKEYS, TDIST__OP_WATCH_KEY,   TDIST__OP_DELETE_KEY};
static const tdist__op_t v2_table[] = {
    TDIST__OP_VALIDATE,    TDIST__OP_SET,    TDIST__OP_COMPARE_SET, TDIST__OP_GET,
    TDIST__OP_ADD,         TDIST__OP_CHECK,  TDIST__OP_WAIT,        TDIST__OP_GETNUMKEYS,
    TDIST__OP_DELETE_KEY,  TDIST__OP_APPEND, TDIST__OP_MULTI_GET,   TDIST__OP_MULTI_SET,
    TDIST__OP_CANCEL_WAIT, TDIST__OP_PING,   TDIST__OP_QUEUE_PUSH,  TDIST__OP_QUEUE_POP,
    TDIST__OP_QUEUE_LEN};
#define V113_N (sizeof(v113_table) / sizeof(v113_table[0]))
#define V2_N (sizeof(v2_table) / sizeof(v2_table[0]))

static int wire_of(tdist__dialect_t d, tdist__op_t op) {
  const tdist__op_t *t = d == TDIST__DIALECT_V2 ? v2_table : v113_table;
  size_t n = d == TDIST__DIALECT_V2 ? V2_N : V113_N;
  for (size_t i = 0; i < n; i++)
    if (t[i] == op) return (int)i;
  return -1;
}

/* ---- the encoder: tests/testlib/wire_enc.h ---- */

/* A minimal valid request of `op` (keys "k", values "v"). */
static void enc_minimal(enc_t *e, tdist__dialect_t d, tdist__op_t op) {
  enc_u8(e, (uint8_t)wire_of(d, op));
  switch (op) {
    case TDIST__OP_VALIDATE: enc_u32(e, 0x3C85F7CEu); break;
    case TDIST__OP_PING: enc_u32(e, 77); break;
    case TDIST__OP_SET:
    case TDIST__OP_APPEND:
    case TDIST__OP_QUEUE_PUSH:
      enc_cstr(e, "k");
      enc_cstr(e, "v");
      break;
    case TDIST__OP_COMPARE_SET:
      enc_cstr(e, "k");
      enc_cstr(e, "x");
      enc_cstr(e, "y");
      break;
    case TDIST__OP_GET:
    case TDIST__OP_WATCH_KEY:
    case TDIST__OP_DELETE_KEY:
    case TDIST__OP_QUEUE_POP:
    case TDIST__OP_QUEUE_LEN: enc_cstr(e, "k"); break;
    case TDIST__OP_ADD:
      enc_cstr(e, "k");
      enc_u64(e, 3);
      break;
    case TDIST__OP_CHECK:
    case TDIST__OP_WAIT:
    case TDIST__OP_MULTI_GET:
      enc_u64(e, 2);
      enc_cstr(e, "k");
      enc_cstr(e, "l");
      break;
    case TDIST__OP_MULTI_SET:
      enc_u64(e, 2);
      enc_cstr(e, "k");
      enc_cstr(e, "v");
      enc_cstr(e, "l");
      enc_cstr(e, "w");
      break;
    case TDIST__OP_GETNUMKEYS:
    case TDIST__OP_CANCEL_WAIT: break;
    default: CHECK(0);
  }
}

static void test_opcodes(void) {
  const tdist__dialect_t dialects[] = {TDIST__DIALECT_V1_13, TDIST__DIALECT_V2};
  for (int di = 0; di < 2; di++) {
    tdist__dialect_t d = dialects[di];
    const tdist__op_t *t = d == TDIST__DIALECT_V2 ? v2_table : v113_table;
    size_t n = d == TDIST__DIALECT_V2 ? V2_N : V113_N;
    for (int w = 0; w < 256; w++) {
      tdist__op_t want = (size_t)w < n ? t[w] : TDIST__OP_INVALID;
      CHECK_EQ_INT(tdist__proto_op_from_wire(d, (uint8_t)w), want);
    }
    for (int op = TDIST__OP_VALIDATE; op < TDIST__OP_COUNT_; op++) {
      CHECK_EQ_INT(tdist__proto_opcode(d, (tdist__op_t)op), wire_of(d, (tdist__op_t)op));
      CHECK(tdist__proto_op_name((tdist__op_t)op) != NULL);
      CHECK(tdist__proto_op_name((tdist__op_t)op)[0] != '\0');
      if (wire_of(d, (tdist__op_t)op) < 0) continue;
      enc_t e = {0};
      enc_minimal(&e, d, (tdist__op_t)op);
      tdist__request_t req;
      parse_whole(d, e.p, e.len, &big_limits, &req);
      CHECK_EQ_INT(req.op, op);
      CHECK_EQ_INT(req.wire_op, e.p[0]);
      check_prefixes(d, e.p, e.len, &big_limits);
      free(e.p);
    }
    /* Unknown opcodes fail at once, whatever follows (even nothing). */
    for (int w = (int)n; w < 256; w++) {
      uint8_t b[64];
      memset(b, 0, sizeof(b));
      b[0] = (uint8_t)w;
      expect_error(d, b, 1, &big_limits, "unknown opcode alone");
      expect_error(d, b, sizeof(b), &big_limits, "unknown opcode + zeros");
    }
  }
  CHECK(strcmp(tdist__proto_op_name(TDIST__OP_SET), "SET") == 0);
  /* Only DELETE_KEY shares its byte between the dialects (§1.2). */
  for (int w = 0; w < 256; w++) {
    tdist__op_t a = tdist__proto_op_from_wire(TDIST__DIALECT_V1_13, (uint8_t)w);
    tdist__op_t b = tdist__proto_op_from_wire(TDIST__DIALECT_V2, (uint8_t)w);
    if (a != TDIST__OP_INVALID && a == b) CHECK_EQ_INT(w, 0x08);
  }
  TEST_LOG("opcodes: both tables ok, unknown opcodes rejected");
}

/* ---------------------------------------------------------------------------------------- */
/* Limits                                                                                   */
/* ---------------------------------------------------------------------------------------- */

static const tdist__proto_limits_t small = {
    .max_key = 16, .max_value = 64, .max_keys = 4, .max_request = 0};

static void fill(enc_t *e, size_t n, uint8_t c) {
  for (size_t i = 0; i < n; i++) enc_u8(e, c);
}

/* Builds "opcode, key of klen": the key-length field is the last thing written when body=0. */
static void test_key_limits(tdist__dialect_t d) {
  static const tdist__op_t keyed[] = {
      TDIST__OP_SET,       TDIST__OP_COMPARE_SET, TDIST__OP_GET,    TDIST__OP_ADD,
      TDIST__OP_WATCH_KEY, TDIST__OP_DELETE_KEY,  TDIST__OP_APPEND, TDIST__OP_QUEUE_PUSH,
      TDIST__OP_QUEUE_POP, TDIST__OP_QUEUE_LEN};
  for (size_t i = 0; i < sizeof(keyed) / sizeof(keyed[0]); i++) {
    int w = wire_of(d, keyed[i]);
    if (w < 0) continue;
    const uint64_t bad[] = {17,         1u << 20,       (uint64_t)1 << 40,
                            UINT64_MAX, UINT64_MAX - 7, (uint64_t)1 << 63};
    for (size_t j = 0; j < sizeof(bad) / sizeof(bad[0]); j++) {
      enc_t e = {0};
      enc_u8(&e, (uint8_t)w);
      enc_u64(&e, bad[j]);
      expect_error(d, e.p, e.len, &small, "key over the limit");
      free(e.p);
    }
    /* exactly the limit is fine */
    enc_t e = {0};
    enc_u8(&e, (uint8_t)w);
    enc_u64(&e, 16);
    fill(&e, 16, 'k');
    switch (keyed[i]) {
      case TDIST__OP_SET:
      case TDIST__OP_APPEND:
      case TDIST__OP_QUEUE_PUSH: enc_cstr(&e, "v"); break;
      case TDIST__OP_COMPARE_SET:
        enc_cstr(&e, "");
        enc_cstr(&e, "v");
        break;
      case TDIST__OP_ADD: enc_u64(&e, 1); break;
      default: break;
    }
    tdist__request_t req;
    parse_whole(d, e.p, e.len, &small, &req);
    CHECK_EQ_INT(req.op, keyed[i]);
    CHECK_EQ_INT(req.key.len, 16);
    free(e.p);
  }
}

static void test_value_limits(tdist__dialect_t d) {
  static const tdist__op_t valued[] = {TDIST__OP_SET, TDIST__OP_APPEND, TDIST__OP_QUEUE_PUSH,
                                       TDIST__OP_COMPARE_SET};
  const uint64_t bad[] = {65, (uint64_t)1 << 40 /* 1 TB */, UINT64_MAX, UINT64_MAX - 30,
                          (uint64_t)1 << 63};
  for (size_t i = 0; i < sizeof(valued) / sizeof(valued[0]); i++) {
    int w = wire_of(d, valued[i]);
    if (w < 0) continue;
    for (size_t j = 0; j < sizeof(bad) / sizeof(bad[0]); j++) {
      /* the (first) value too large */
      enc_t e = {0};
      enc_u8(&e, (uint8_t)w);
      enc_cstr(&e, "key");
      enc_u64(&e, bad[j]);
      expect_error(d, e.p, e.len, &small, "value over the limit");
      free(e.p);
      if (valued[i] == TDIST__OP_COMPARE_SET) {
        /* desired too large after a fine expected */
        enc_t f = {0};
        enc_u8(&f, (uint8_t)w);
        enc_cstr(&f, "key");
        enc_cstr(&f, "exp");
        enc_u64(&f, bad[j]);
        expect_error(d, f.p, f.len, &small, "desired over the limit");
        free(f.p);
      }
    }
    /* exactly the limit */
    enc_t e = {0};
    enc_u8(&e, (uint8_t)w);
    enc_cstr(&e, "key");
    enc_u64(&e, 64);
    fill(&e, 64, 'v');
    if (valued[i] == TDIST__OP_COMPARE_SET) {
      enc_u64(&e, 64);
      fill(&e, 64, 'w');
    }
    tdist__request_t req;
    parse_whole(d, e.p, e.len, &small, &req);
    CHECK_EQ_INT(req.a.len, 64);
    free(e.p);
  }
  /* With the default-sized limits, a 1 TB value must fail on its header too, not wait for it. */
  int w = wire_of(d, TDIST__OP_SET);
  enc_t e = {0};
  enc_u8(&e, (uint8_t)w);
  enc_cstr(&e, "/k");
  enc_u64(&e, (uint64_t)1 << 40);
  expect_error(d, e.p, e.len, &big_limits, "1 TB value, default limits");
  free(e.p);
}

static void test_count_limits(tdist__dialect_t d) {
  static const tdist__op_t multi[] = {TDIST__OP_CHECK, TDIST__OP_WAIT, TDIST__OP_MULTI_GET,
                                      TDIST__OP_MULTI_SET};
  const uint64_t bad[] = {5, 1000, (uint64_t)1 << 40, UINT64_MAX, (uint64_t)1 << 63};
  for (size_t i = 0; i < sizeof(multi) / sizeof(multi[0]); i++) {
    int w = wire_of(d, multi[i]);
    if (w < 0) continue;
    for (size_t j = 0; j < sizeof(bad) / sizeof(bad[0]); j++) {
      enc_t e = {0};
      enc_u8(&e, (uint8_t)w);
      enc_u64(&e, bad[j]);
      expect_error(d, e.p, e.len, &small, "too many keys");
      free(e.p);
    }
    /* exactly max_keys is fine; a key inside over the key limit is not */
    enc_t e = {0};
    enc_u8(&e, (uint8_t)w);
    enc_u64(&e, 4);
    for (int k = 0; k < 4; k++) {
      char key[4] = {'k', (char)('0' + k), 0};
      enc_cstr(&e, key);
      if (multi[i] == TDIST__OP_MULTI_SET) enc_cstr(&e, "val");
    }
    tdist__request_t req;
    parse_whole(d, e.p, e.len, &small, &req);
    CHECK_EQ_INT(req.n, 4);
    free(e.p);

    enc_t f = {0};
    enc_u8(&f, (uint8_t)w);
    enc_u64(&f, 3);
    enc_cstr(&f, "ok");
    if (multi[i] == TDIST__OP_MULTI_SET) enc_cstr(&f, "val");
    enc_u64(&f, 17);
    expect_error(d, f.p, f.len, &small, "second key over the limit");
    free(f.p);

    if (multi[i] == TDIST__OP_MULTI_SET) {
      enc_t g = {0};
      enc_u8(&g, (uint8_t)w);
      enc_u64(&g, 2);
      enc_cstr(&g, "a");
      enc_cstr(&g, "x");
      enc_cstr(&g, "b");
      enc_u64(&g, (uint64_t)1 << 40);
      expect_error(d, g.p, g.len, &small, "second value over the limit");
      free(g.p);
    }
  }
}

/* max_request bounds a whole MULTI_SET: 4 pairs of 64-byte values are ~330 bytes. The request
 * must fail once a length field pushes the total over the bound, before those bytes arrive. */
static void test_request_limit(tdist__dialect_t d) {
  const tdist__proto_limits_t lim = {
      .max_key = 16, .max_value = 64, .max_keys = 4, .max_request = 200};
  int w = wire_of(d, TDIST__OP_MULTI_SET);
  if (w < 0) return;
  enc_t e = {0};
  enc_u8(&e, (uint8_t)w);
  enc_u64(&e, 4);
  size_t i;
  for (i = 0; i < 4; i++) {
    enc_cstr(&e, "key");
    enc_u64(&e, 64);
    if (e.len > 200) break; /* this length field took the request past the bound */
    fill(&e, 64, 'v');
  }
  CHECK(i < 4);
  expect_error(d, e.p, e.len, &lim, "MULTI_SET over max_request");
  /* The same request complete in one buffer must fail too: the verdict may not depend on how
   * the bytes were split into reads. */
  for (; i < 4; i++) {
    fill(&e, 64, 'v');
    if (i < 3) {
      enc_cstr(&e, "key");
      enc_u64(&e, 64);
    }
  }
  CHECK_EQ_INT(e.len, 1 + 8 + 4 * (8 + 3 + 8 + 64));
  expect_error(d, e.p, e.len, &lim, "complete MULTI_SET over max_request");
  free(e.p);
  /* well under the bound: fine */
  enc_t f = {0};
  enc_u8(&f, (uint8_t)w);
  enc_u64(&f, 2);
  for (i = 0; i < 2; i++) {
    enc_cstr(&f, "key");
    enc_u64(&f, 40);
    fill(&f, 40, 'v');
  }
  CHECK(f.len < 150);
  tdist__request_t req;
  parse_whole(d, f.p, f.len, &lim, &req);
  CHECK_EQ_INT(req.n, 2);
  free(f.p);
}

static void test_limits(void) {
  test_key_limits(TDIST__DIALECT_V1_13);
  test_key_limits(TDIST__DIALECT_V2);
  test_value_limits(TDIST__DIALECT_V1_13);
  test_value_limits(TDIST__DIALECT_V2);
  test_count_limits(TDIST__DIALECT_V1_13);
  test_count_limits(TDIST__DIALECT_V2);
  test_request_limit(TDIST__DIALECT_V2);
  TEST_LOG("limits: ok");
}

/* ---------------------------------------------------------------------------------------- */
/* Random round trip                                                                        */
/* ---------------------------------------------------------------------------------------- */

typedef struct {
  size_t off, len; /* into the random byte pool */
} span_t;

#define MAXN 6
typedef struct {
  tdist__op_t op;
  size_t start, size; /* where the request lies in the stream */
  span_t key, a, b;
  int64_t delta;
  uint32_t u32;
  uint64_t n;
  span_t keys[MAXN], vals[MAXN];
} expect_t;

static uint8_t pool[1 << 16];

static span_t rnd_span(size_t maxlen) {
  span_t s;
  /* a few zero-length strings, sometimes long ones */
  s.len = rnd_below(8) == 0 ? 0 : rnd_below(maxlen + 1);
  s.off = rnd_below(sizeof(pool) - s.len);
  return s;
}
static void enc_span(enc_t *e, span_t s) { enc_str(e, pool + s.off, s.len); }
static int slice_eq_span(tdist__slice_t sl, span_t sp) {
  return sl.len == sp.len && (sp.len == 0 || memcmp(sl.ptr, pool + sp.off, sp.len) == 0);
}

static void gen_request(enc_t *e, tdist__dialect_t d, expect_t *x) {
  const tdist__op_t *t = d == TDIST__DIALECT_V2 ? v2_table : v113_table;
  size_t n = d == TDIST__DIALECT_V2 ? V2_N : V113_N;
  memset(x, 0, sizeof(*x));
  x->op = t[rnd_below(n)];
  x->start = e->len;
  enc_u8(e, (uint8_t)wire_of(d, x->op));
  switch (x->op) {
    case TDIST__OP_VALIDATE:
    case TDIST__OP_PING:
      x->u32 = x->op == TDIST__OP_VALIDATE ? 0x3C85F7CEu : (uint32_t)rnd();
      enc_u32(e, x->u32);
      break;
    case TDIST__OP_SET:
    case TDIST__OP_APPEND:
    case TDIST__OP_QUEUE_PUSH:
      x->key = rnd_span(64);
      x->a = rnd_span(rnd_below(10) == 0 ? 4000 : 100);
      enc_span(e, x->key);
      enc_span(e, x->a);
      break;
    case TDIST__OP_COMPARE_SET:
      x->key = rnd_span(64);
      x->a = rnd_span(100);
      x->b = rnd_span(100);
      enc_span(e, x->key);
      enc_span(e, x->a);
      enc_span(e, x->b);
      break;
    case TDIST__OP_GET:
    case TDIST__OP_WATCH_KEY:
    case TDIST__OP_DELETE_KEY:
    case TDIST__OP_QUEUE_POP:
    case TDIST__OP_QUEUE_LEN:
      x->key = rnd_span(64);
      enc_span(e, x->key);
      break;
    case TDIST__OP_ADD:
      x->key = rnd_span(64);
      x->delta = (int64_t)rnd();
      if (rnd_below(2)) x->delta = (int64_t)rnd_below(21) - 10;
      enc_span(e, x->key);
      enc_u64(e, (uint64_t)x->delta);
      break;
    case TDIST__OP_CHECK:
    case TDIST__OP_WAIT:
    case TDIST__OP_MULTI_GET:
    case TDIST__OP_MULTI_SET:
      x->n = rnd_below(MAXN + 1);
      enc_u64(e, x->n);
      for (uint64_t i = 0; i < x->n; i++) {
        x->keys[i] = rnd_span(40);
        enc_span(e, x->keys[i]);
        if (x->op == TDIST__OP_MULTI_SET) {
          x->vals[i] = rnd_span(60);
          enc_span(e, x->vals[i]);
        }
      }
      break;
    case TDIST__OP_GETNUMKEYS:
    case TDIST__OP_CANCEL_WAIT: break;
    default: CHECK(0);
  }
  x->size = e->len - x->start;
}

static void check_request(const tdist__request_t *r, const expect_t *x) {
  CHECK_EQ_INT(r->op, x->op);
  switch (x->op) {
    case TDIST__OP_VALIDATE:
    case TDIST__OP_PING: CHECK_EQ_INT(r->u32, x->u32); break;
    case TDIST__OP_SET:
    case TDIST__OP_APPEND:
    case TDIST__OP_QUEUE_PUSH:
      CHECK(slice_eq_span(r->key, x->key));
      CHECK(slice_eq_span(r->a, x->a));
      break;
    case TDIST__OP_COMPARE_SET:
      CHECK(slice_eq_span(r->key, x->key));
      CHECK(slice_eq_span(r->a, x->a));
      CHECK(slice_eq_span(r->b, x->b));
      break;
    case TDIST__OP_GET:
    case TDIST__OP_WATCH_KEY:
    case TDIST__OP_DELETE_KEY:
    case TDIST__OP_QUEUE_POP:
    case TDIST__OP_QUEUE_LEN: CHECK(slice_eq_span(r->key, x->key)); break;
    case TDIST__OP_ADD:
      CHECK(slice_eq_span(r->key, x->key));
      CHECK_EQ_INT(r->delta, x->delta);
      break;
    case TDIST__OP_CHECK:
    case TDIST__OP_WAIT:
    case TDIST__OP_MULTI_GET:
    case TDIST__OP_MULTI_SET: {
      CHECK_EQ_INT(r->n, x->n);
      uint64_t pos = 0;
      for (uint64_t i = 0; i < x->n; i++) {
        tdist__slice_t k, v;
        CHECK(tdist__proto_next_item(r, &pos, &k, &v) != 0);
        CHECK(slice_eq_span(k, x->keys[i]));
        if (x->op == TDIST__OP_MULTI_SET) CHECK(slice_eq_span(v, x->vals[i]));
      }
      tdist__slice_t k, v;
      CHECK(tdist__proto_next_item(r, &pos, &k, &v) == 0);
      break;
    }
    default: break;
  }
}

static void test_random(uint64_t seed) {
  test_rng_seed(&test_rng, seed);
  for (size_t i = 0; i < sizeof(pool); i++) pool[i] = (uint8_t)rnd();
  const tdist__dialect_t dialects[] = {TDIST__DIALECT_V1_13, TDIST__DIALECT_V2};
  size_t total = 0;
  for (int di = 0; di < 2; di++) {
    tdist__dialect_t d = dialects[di];
    for (int round = 0; round < 20; round++) {
      enum { NREQ = 400 };
      static expect_t xs[NREQ];
      enc_t e = {0};
      for (int i = 0; i < NREQ; i++) gen_request(&e, d, &xs[i]);
      /* one by one from the stream */
      size_t off = 0;
      for (int i = 0; i < NREQ; i++) {
        tdist__request_t req;
        size_t consumed = 0;
        const char *why = NULL;
        tdist__parse_result_t r =
            tdist__proto_parse(d, e.p + off, e.len - off, &big_limits, &req, &consumed, &why);
        if (r != TDIST__PARSE_OK) {
          fprintf(stderr, "random seed %" PRIu64 " dialect %d round %d request %d (%s): %d %s\n",
                  seed, (int)d, round, i, tdist__proto_op_name(xs[i].op), (int)r, why ? why : "");
        }
        CHECK_EQ_INT(r, TDIST__PARSE_OK);
        CHECK_EQ_INT(off, xs[i].start);
        CHECK_EQ_INT(consumed, xs[i].size);
        check_request(&req, &xs[i]);
        /* a random cut inside this request must ask for more, within bounds */
        size_t cut = rnd_below(xs[i].size);
        r = tdist__proto_parse(d, e.p + off, cut, &big_limits, &req, &consumed, &why);
        CHECK_EQ_INT(r, TDIST__PARSE_NEED_MORE);
        CHECK(consumed > cut && consumed <= xs[i].size);
        off += xs[i].size;
      }
      CHECK_EQ_INT(off, e.len);
      /* every prefix of a few requests */
      for (int i = 0; i < 5; i++) {
        const expect_t *x = &xs[rnd_below(NREQ)];
        check_prefixes(d, e.p + x->start, x->size, &big_limits);
      }
      total += NREQ;
      free(e.p);
    }
  }
  TEST_LOG("random: %zu requests round-tripped (seed %" PRIu64 ")", total, seed);
}

/* A multi-key request fed as a server would (what arrived so far, waiting for the bound the
 * parser gave) with a progress record: the same answer as in one piece, and the item fields read
 * over all the calls stay in proportion to the items (the parse resumes, it does not walk the
 * buffered items again on every call). Random keys, random segment sizes. */
static void test_resume(uint64_t seed) {
  test_rng_seed(&test_rng, seed ^ 0x5eed);
  for (int round = 0; round < 4; round++) {
    tdist__dialect_t d = round & 1 ? TDIST__DIALECT_V2 : TDIST__DIALECT_V1_13;
    int mset = d == TDIST__DIALECT_V2 && round >= 2;
    uint64_t n = 2000 + rnd_below(2000);
    enc_t e = {0};
    enc_u8(&e, (uint8_t)tdist__proto_opcode(d, mset ? TDIST__OP_MULTI_SET : TDIST__OP_CHECK));
    enc_u64(&e, n);
    char key[24];
    for (uint64_t i = 0; i < n; i++) {
      size_t kl = rnd_below(sizeof key);
      for (size_t j = 0; j < kl; j++) key[j] = (char)('a' + rnd_below(26));
      enc_str(&e, key, kl);
      if (mset) enc_str(&e, key, rnd_below(kl + 1));
    }
    tdist__request_t whole, part;
    size_t wc, pc = 0, have = 0, calls = 0;
    const char *why;
    CHECK_EQ_INT(tdist__proto_parse(d, e.p, e.len, &big_limits, &whole, &wc, &why),
                 TDIST__PARSE_OK);
    tdist__parse_progress_t prog = {0};
    tdist__parse_result_t r;
    for (;;) {
      size_t need = pc > have ? pc : have + 1;
      have = need + rnd_below(16);
      if (have > e.len) have = e.len;
      uint8_t *copy = malloc(have); /* a fresh buffer each call: the bytes move, as they may */
      CHECK(copy != NULL);
      memcpy(copy, e.p, have);
      r = tdist__proto_parse_resume(d, copy, have, &big_limits, &part, &pc, &why, &prog);
      calls++;
      int ok = r == TDIST__PARSE_OK;
      if (ok) {
        CHECK_EQ_UINT(pc, wc);
        CHECK_EQ_UINT(part.n, whole.n);
        CHECK_EQ_UINT(part.items.len, whole.items.len);
        CHECK(memcmp(part.items.ptr, e.p + (whole.items.ptr - e.p), part.items.len) == 0);
      } else {
        CHECK_EQ_INT(r, TDIST__PARSE_NEED_MORE);
        CHECK(pc > have && pc <= e.len);
      }
      free(copy);
      if (ok) break;
    }
    if (prog.walked > n + calls)
      TEST_FAIL("resumed parse of %" PRIu64 " items in %zu calls read %" PRIu64
                " item fields (want at most %" PRIu64 ")",
                n, calls, prog.walked, n + calls);
    TEST_LOG("resume: %" PRIu64 " items in %zu calls, %" PRIu64 " item reads", n, calls,
             prog.walked);
    free(e.p);
  }
}

int main(int argc, char **argv) {
  uint64_t seed = argc > 1 ? strtoull(argv[1], NULL, 0) : test_seed("proto_test", 20240601);
  test_captures();
  test_pipelined();
  test_classify();
  test_opcodes();
  test_random(seed);
  test_resume(seed);
  test_limits(); /* last: its max_request case fails on the current proto.c (see the report) */
  TEST_LOG("proto_test: all passed");
  return 0;
}
