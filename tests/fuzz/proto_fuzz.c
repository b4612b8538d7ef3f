/* libFuzzer target for the TCPStore request codec (runtime/store/proto.h).
 *
 * Each input is treated as the bytes one connection sent. It is classified the way the server does
 * (and also parsed as forced 1.13 and forced 2.x), under three sets of small limits, consuming
 * requests one after another until the parser needs more or rejects. Every answer is checked
 * against an independent reference decoder (proto_ref.h, from the PyTorch reference) and against
 * invariants that must hold for any input:
 *   - OK: 0 < consumed <= len, consumed == the reference's request size, every slice lies inside
 *     the buffer, fields equal the reference's, multi-key items walk to exactly n items, the wire
 *     opcode maps to the op and back, and the request fits max_request when that is set;
 *   - NEED_MORE: the lower bound is > len; ERROR: a reason is given;
 *   - a strict prefix of a complete request is NEED_MORE with a bound in (prefix, request size],
 *     never OK and never ERROR (1.13 clients send field by field, so prefixes are what a server
 *     sees); the exact request alone parses to the same request;
 *   - classification agrees with the reference on every prefix;
 *   - the bytes fed in growing pieces with one progress record (tdist__proto_parse_resume, as the
 *     server parses a partial multi-key request) give the plain parse's answer at every step,
 *     without walking the items from the start again.
 * Prefixes are copied into exact-size heap buffers so that ASan catches any read past `len`.
 * Built by Bazel into proto_fuzz_replay_test (proto_replay.c) and by run_libfuzzer.sh with
 * -fsanitize=fuzzer. It must never write to the input or keep state between inputs. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/store/proto.h"
#include "tests/fuzz/proto_ref.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FUZZ_CHECK(cond, ...)                                                                    \
  do {                                                                                           \
    if (!(cond)) {                                                                               \
      fprintf(stderr, "proto_fuzz: %s:%d: invariant failed: %s\n  ", __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                                                              \
      fputc('\n', stderr);                                                                       \
      abort();                                                                                   \
    }                                                                                            \
  } while (0)

/* Small limits so that length checks are reached by short inputs; max_keys stays within
 * REF_MAX_ITEMS so every item can be compared. */
static const tdist__proto_limits_t k_limits[] = {
    {.max_key = 16, .max_value = 64, .max_keys = 4, .max_request = 0},
    {.max_key = 64, .max_value = 300, .max_keys = 8, .max_request = 600},
    {.max_key = 8192, .max_value = 1 << 20, .max_keys = REF_MAX_ITEMS, .max_request = 0},
};

static const char *dialect_name(tdist__dialect_t d) {
  return d == TDIST__DIALECT_V1_13 ? "1.13" : d == TDIST__DIALECT_V2 ? "2.x" : "unknown";
}

static const char *result_name(int r) {
  return r == TDIST__PARSE_OK ? "OK" : r == TDIST__PARSE_NEED_MORE ? "NEED_MORE" : "ERROR";
}

static const char *ref_name(ref_result_t r) {
  return r == REF_OK ? "OK" : r == REF_MORE ? "NEED_MORE" : "ERROR";
}

static void slice_inside(const uint8_t *buf, size_t len, tdist__slice_t s, const char *what) {
  if (s.len == 0) {
    FUZZ_CHECK(s.ptr == NULL || (s.ptr >= buf && s.ptr <= buf + len),
               "empty %s slice points outside the buffer", what);
    return;
  }
  FUZZ_CHECK(s.ptr >= buf && s.ptr <= buf + len && s.len <= (uint64_t)(buf + len - s.ptr),
             "%s slice (%" PRIu64 " bytes at offset %td) outside the %zu-byte buffer", what, s.len,
             s.ptr - buf, len);
}

static void slice_is(const uint8_t *buf, tdist__slice_t s, size_t off, size_t len,
                     const char *what) {
  FUZZ_CHECK(s.len == len && (len == 0 || s.ptr == buf + off),
             "%s: parser gives %" PRIu64 " bytes at offset %td, reference %zu at %zu", what, s.len,
             s.len ? s.ptr - buf : (ptrdiff_t)-1, len, off);
}

/* Parses buf[0..len) and checks the answer against the reference. Returns the result; on OK
 * *consumed is the request size and *req the request. */
static int parse_checked(tdist__dialect_t d, const uint8_t *buf, size_t len,
                         const tdist__proto_limits_t *lim, tdist__request_t *req,
                         size_t *consumed) {
  static ref_request_t ref; /* large; not reentrant, and libFuzzer runs one input at a time */
  const char *why = NULL;
  *consumed = (size_t)-1;
  int res = tdist__proto_parse(d, buf, len, lim, req, consumed, &why);
  ref_parse(d, buf, len, lim, &ref);
  FUZZ_CHECK(res == TDIST__PARSE_OK || res == TDIST__PARSE_NEED_MORE || res == TDIST__PARSE_ERROR,
             "result %d", res);
  FUZZ_CHECK((res == TDIST__PARSE_OK && ref.result == REF_OK) ||
                 (res == TDIST__PARSE_NEED_MORE && ref.result == REF_MORE) ||
                 (res == TDIST__PARSE_ERROR && ref.result == REF_ERROR),
             "%s dialect, %zu bytes (first 0x%02x), limits key %" PRIu64 " value %" PRIu64
             " keys %" PRIu64 " request %" PRIu64
             ": parser says %s (consumed %zu, why '%s'), reference says %s (size %zu)",
             dialect_name(d), len, len ? buf[0] : 0, lim->max_key, lim->max_value, lim->max_keys,
             lim->max_request, result_name(res), *consumed, why ? why : "(null)",
             ref_name(ref.result), ref.total);
  if (res == TDIST__PARSE_NEED_MORE) {
    FUZZ_CHECK(*consumed > len, "NEED_MORE with lower bound %zu for %zu bytes", *consumed, len);
    return res;
  }
  if (res == TDIST__PARSE_ERROR) {
    FUZZ_CHECK(why != NULL && why[0] != '\0', "ERROR without a reason");
    return res;
  }

  /* OK */
  FUZZ_CHECK(*consumed > 0 && *consumed <= len, "OK consumed %zu of %zu", *consumed, len);
  FUZZ_CHECK(*consumed == ref.total, "OK consumed %zu, reference request size %zu", *consumed,
             ref.total);
  FUZZ_CHECK(lim->max_request == 0 || *consumed <= lim->max_request,
             "OK for a %zu-byte request over max_request %" PRIu64, *consumed, lim->max_request);
  FUZZ_CHECK(req->op == ref.op, "op %s, reference %s", tdist__proto_op_name(req->op),
             tdist__proto_op_name(ref.op));
  FUZZ_CHECK(req->wire_op == buf[0], "wire_op 0x%02x, first byte 0x%02x", req->wire_op, buf[0]);
  FUZZ_CHECK(tdist__proto_op_from_wire(d, buf[0]) == req->op, "op_from_wire disagrees");
  FUZZ_CHECK(tdist__proto_opcode(d, req->op) == buf[0], "opcode(%s) = %d, wire 0x%02x",
             tdist__proto_op_name(req->op), tdist__proto_opcode(d, req->op), buf[0]);
  const char *name = tdist__proto_op_name(req->op);
  FUZZ_CHECK(name != NULL && strcmp(name, "INVALID") != 0, "no name for op %d", (int)req->op);

  slice_inside(buf, len, req->key, "key");
  slice_inside(buf, len, req->a, "a");
  slice_inside(buf, len, req->b, "b");
  slice_inside(buf, len, req->items, "items");

  const char *layout = ref_lookup(d, buf[0])->layout;
  if (strchr(layout, 'k')) {
    slice_is(buf, req->key, ref.key_off, ref.key_len, "key");
    FUZZ_CHECK(req->key.len <= lim->max_key, "key over the limit");
  }
  if (strchr(layout, 'v')) {
    slice_is(buf, req->a, ref.a_off, ref.a_len, "value/expected");
    FUZZ_CHECK(req->a.len <= lim->max_value, "value over the limit");
  }
  if (strstr(layout, "vv")) {
    slice_is(buf, req->b, ref.b_off, ref.b_len, "desired");
    FUZZ_CHECK(req->b.len <= lim->max_value, "desired over the limit");
  }
  if (strchr(layout, 'i')) FUZZ_CHECK(req->delta == ref.delta, "delta");
  if (strchr(layout, 'u')) FUZZ_CHECK(req->u32 == ref.u32, "u32");
  if (strchr(layout, 'K') || strchr(layout, 'P')) {
    FUZZ_CHECK(req->n == ref.n, "n = %" PRIu64 ", reference %" PRIu64, req->n, ref.n);
    FUZZ_CHECK(req->n <= lim->max_keys, "n over the limit");
    slice_is(buf, req->items, ref.items_off, ref.items_len, "items");
    uint64_t pos = 0, i = 0;
    tdist__slice_t k, v;
    for (;;) {
      memset(&k, 0, sizeof k);
      memset(&v, 0, sizeof v);
      uint64_t before = pos;
      if (!tdist__proto_next_item(req, &pos, &k, &v)) break;
      FUZZ_CHECK(pos > before && pos <= req->items.len,
                 "next_item pos %" PRIu64 " -> %" PRIu64 " of %" PRIu64, before, pos,
                 req->items.len);
      FUZZ_CHECK(i < req->n, "next_item gives more than n = %" PRIu64 " items", req->n);
      slice_inside(buf, len, k, "item key");
      slice_is(buf, k, ref.item_key_off[i], ref.item_key_len[i], "item key");
      if (req->op == TDIST__OP_MULTI_SET) {
        slice_inside(buf, len, v, "item value");
        slice_is(buf, v, ref.item_val_off[i], ref.item_val_len[i], "item value");
      } else {
        FUZZ_CHECK(v.ptr == NULL && v.len == 0, "next_item wrote a value for a key-only op");
      }
      i++;
    }
    FUZZ_CHECK(i == req->n, "next_item gave %" PRIu64 " items, n = %" PRIu64, i, req->n);
    FUZZ_CHECK(pos == req->items.len, "items not fully walked");
  }
  return res;
}

/* A complete request of `size` bytes starts at buf: every strict prefix must ask for more (with a
 * bound that does not overshoot the request), and the request alone must parse the same. */
static void check_prefixes(tdist__dialect_t d, const uint8_t *buf, size_t size,
                           const tdist__proto_limits_t *lim, const tdist__request_t *whole) {
  static const uint8_t empty[1];
  size_t steps = size <= 256 ? size : 64;
  for (size_t s = 0; s <= steps; s++) {
    size_t p;
    if (size <= 256)
      p = s;
    else if (s < 16)
      p = s;
    else if (s >= steps - 16)
      p = size - (steps - s);
    else
      p = (size * s) / steps;
    if (p > size) p = size;
    uint8_t *copy = p ? malloc(p) : NULL;
    if (p && copy == NULL) return;
    if (p) memcpy(copy, buf, p);
    tdist__request_t req;
    size_t consumed;
    int res = parse_checked(d, p ? copy : empty, p, lim, &req, &consumed);
    if (p < size) {
      FUZZ_CHECK(res == TDIST__PARSE_NEED_MORE,
                 "the first %zu bytes of a complete %zu-byte %s request give %s", p, size,
                 tdist__proto_op_name(whole->op), result_name(res));
      FUZZ_CHECK(consumed > p && consumed <= size,
                 "prefix %zu of a %zu-byte request: lower bound %zu", p, size, consumed);
    } else {
      FUZZ_CHECK(res == TDIST__PARSE_OK && consumed == size && req.op == whole->op &&
                     req.key.len == whole->key.len && req.a.len == whole->a.len &&
                     req.b.len == whole->b.len && req.n == whole->n && req.delta == whole->delta &&
                     req.u32 == whole->u32,
                 "the %zu-byte request alone parses differently (%s)", size, result_name(res));
    }
    free(copy);
  }
}

/* The bytes buf[0..len) arrive in pieces, as a server reads them: each growing prefix, in a fresh
 * exact-size copy (the buffer moves, as the server's does when it grows), is parsed with one
 * progress record kept across the calls. Every answer must equal the plain parse of the same
 * prefix, and the item fields read over all calls stay within items + calls (no walk restarts
 * from the first item). The piece sizes come from the bytes themselves, so a failure replays. */
static void check_resume(tdist__dialect_t d, const uint8_t *buf, size_t len,
                         const tdist__proto_limits_t *lim) {
  static const uint8_t empty[1];
  tdist__parse_progress_t prog;
  memset(&prog, 0, sizeof prog);
  uint64_t x = 0x9E3779B97F4A7C15ull ^ len;
  for (size_t i = 0; i < len && i < 8; i++) x = x * 1099511628211ull ^ buf[i];
  size_t p = 0;
  uint64_t calls = 0, items = 0;
  for (;;) {
    uint8_t *copy = p ? malloc(p) : NULL;
    if (p && copy == NULL) return;
    if (p) memcpy(copy, buf, p);
    const uint8_t *at = p ? copy : empty;
    tdist__request_t plain, res;
    size_t pc = 0, rc = 0;
    const char *pw = NULL, *rw = NULL;
    int a = tdist__proto_parse(d, at, p, lim, &plain, &pc, &pw);
    int b = tdist__proto_parse_resume(d, at, p, lim, &res, &rc, &rw, &prog);
    calls++;
    FUZZ_CHECK(a == b && pc == rc,
               "prefix %zu of %zu bytes, call %" PRIu64 ": plain parse %s (%zu), resumed %s (%zu)",
               p, len, calls, result_name(a), pc, result_name(b), rc);
    if (a == TDIST__PARSE_OK) {
      FUZZ_CHECK(res.op == plain.op && res.n == plain.n && res.delta == plain.delta &&
                     res.u32 == plain.u32 && res.key.ptr == plain.key.ptr &&
                     res.key.len == plain.key.len && res.a.ptr == plain.a.ptr &&
                     res.a.len == plain.a.len && res.b.ptr == plain.b.ptr &&
                     res.b.len == plain.b.len && res.items.ptr == plain.items.ptr &&
                     res.items.len == plain.items.len,
                 "prefix %zu: the resumed parse decodes a different %s request", p,
                 tdist__proto_op_name(plain.op));
      items = plain.n;
    }
    free(copy);
    if (a != TDIST__PARSE_NEED_MORE || p == len || calls >= 64) break;
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    size_t step = 1 + (size_t)((x >> 33) % (len / 8 + 3));
    p = p + step > len ? len : p + step;
  }
  if (items)
    FUZZ_CHECK(prog.walked <= items + calls,
               "%" PRIu64 " item fields read for %" PRIu64 " items in %" PRIu64
               " calls: the parse started over",
               prog.walked, items, calls);
}

enum { MODE_CLASSIFY, MODE_V1_13, MODE_V2, MODE_COUNT_ };

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  for (size_t k = 0; k <= size && k <= 8; k++) {
    tdist__dialect_t got = tdist__proto_classify(data, k);
    FUZZ_CHECK(got == ref_classify(data, k), "classify(%zu bytes) = %s, reference %s", k,
               dialect_name(got), dialect_name(ref_classify(data, k)));
  }
  tdist__dialect_t classified = tdist__proto_classify(data, size);
  FUZZ_CHECK(classified == ref_classify(data, size), "classify(all %zu bytes)", size);

  for (size_t li = 0; li < sizeof k_limits / sizeof k_limits[0]; li++) {
    const tdist__proto_limits_t *lim = &k_limits[li];
    for (int mode = 0; mode < MODE_COUNT_; mode++) {
      tdist__dialect_t d = mode == MODE_CLASSIFY ? classified
                           : mode == MODE_V1_13  ? TDIST__DIALECT_V1_13
                                                 : TDIST__DIALECT_V2;
      if (d == TDIST__DIALECT_UNKNOWN) continue;
      size_t off = 0;
      /* Each OK consumes at least one byte, so this ends; the cap bounds the prefix checks. */
      for (int iter = 0; iter < 4096; iter++) {
        tdist__request_t req;
        size_t consumed;
        int res = parse_checked(d, data + off, size - off, lim, &req, &consumed);
        if (iter < 16) check_resume(d, data + off, size - off, lim);
        if (mode == MODE_CLASSIFY && d == TDIST__DIALECT_V2 && off == 0) {
          /* §1.11: a connection classified 2.x starts with VALIDATE and the magic. */
          FUZZ_CHECK(res == TDIST__PARSE_OK && req.op == TDIST__OP_VALIDATE && consumed == 5 &&
                         req.u32 == TDIST__VALIDATE_MAGIC,
                     "a connection classified 2.x does not start with VALIDATE");
        }
        if (res != TDIST__PARSE_OK) break;
        if (iter < 64) check_prefixes(d, data + off, consumed, lim, &req);
        off += consumed;
      }
    }
  }
  return 0;
}
