/* The generator of proto_fuzz_replay_test (the driver is tests/testlib/fuzz_replay.h): after the
 * seed corpus, a few thousand inputs for the proto fuzz target: valid request streams in both
 * dialects with lengths around the fuzz limits, corpus files with bit flips, boundary length
 * fields, insertions and truncations, splices of two files, and random bytes. An invariant
 * failure aborts (the test fails with the message; TDIST_TEST_SEED and COUNT reproduce a run).
 *
 * usage: proto_fuzz_replay_test CORPUS_DIR [COUNT]   (default COUNT 4000) */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>

#include "runtime/store/proto.h"
#include "tests/fuzz/proto_ref.h"
#include "tests/testlib/fuzz_replay.h"

/* Set for some streams: lengths just under the limits, so that whole requests (MULTI_SET with
 * several pairs) grow past the 600-byte request limit while every field stays legal. */
static int g_big;

/* Lengths near the fuzz limits (16/64/300/600, see proto_fuzz.c) and the edges of small. */
static uint64_t pick_len(void) {
  static const uint64_t near[] = {0, 1, 2, 3, 7, 8, 15, 16, 17, 63, 64, 65, 299, 300, 301};
  static const uint64_t big[] = {15, 16, 63, 64, 200, 250, 299, 300};
  if (g_big) return big[rnd_below(sizeof big / sizeof big[0])];
  return rnd_below(4) == 0 ? near[rnd_below(sizeof near / sizeof near[0])] : rnd_below(24);
}

static void put_str(enc_t *b, uint64_t len) {
  enc_u64(b, len);
  enc_reserve(b, (size_t)len);
  for (uint64_t i = 0; i < len; i++) b->p[b->len + i] = (uint8_t)("/abkv0123"[rnd_below(9)]);
  b->len += (size_t)len;
}

/* Appends one well-formed request (well-formed for the layout; lengths may exceed a limit). */
static void gen_request(enc_t *b, tdist__dialect_t d) {
  uint8_t wire = (uint8_t)rnd_below(ref_op_count(d));
  const ref_op_t *e = ref_lookup(d, wire);
  enc_u8(b, wire);
  for (const char *l = e->layout; *l; l++) {
    switch (*l) {
      case 'k':
      case 'v': put_str(b, pick_len()); break;
      case 'i': enc_u64(b, rnd()); break;
      case 'u': enc_u32(b, rnd_below(2) ? TDIST__VALIDATE_MAGIC : (uint32_t)rnd()); break;
      case 'K':
      case 'P': {
        uint64_t n = rnd_below(10);
        enc_u64(b, n);
        for (uint64_t i = 0; i < n; i++) {
          put_str(b, g_big || rnd_below(8) == 0 ? pick_len() : rnd_below(6));
          if (*l == 'P') put_str(b, g_big || rnd_below(8) == 0 ? pick_len() : rnd_below(20));
        }
        break;
      }
    }
  }
}

static void gen_stream(enc_t *b) {
  tdist__dialect_t d = rnd_below(2) ? TDIST__DIALECT_V2 : TDIST__DIALECT_V1_13;
  g_big = rnd_below(4) == 0;
  if (d == TDIST__DIALECT_V2 && rnd_below(4) != 0) {
    enc_u8(b, 0);
    enc_u32(b, TDIST__VALIDATE_MAGIC);
  }
  int n = 1 + (int)rnd_below(6);
  for (int i = 0; i < n; i++) gen_request(b, d);
  if (rnd_below(4) == 0 && b->len > 0) b->len = (size_t)rnd_below(b->len); /* cut mid-request */
}

/* A boundary value where a length field may be. */
static void put_interesting(enc_t *b) {
  static const uint64_t interesting[] = {0,  1,   7,   8,   15,         16,         17,        64,
                                         65, 300, 301, 600, 1ULL << 32, 1ULL << 63, UINT64_MAX};
  if (b->len < 8) return;
  size_t at = (size_t)rnd_below(b->len - 7);
  uint64_t v = interesting[rnd_below(sizeof interesting / sizeof interesting[0])];
  for (int k = 0; k < 8; k++) b->p[at + k] = (uint8_t)(v >> (8 * k));
}

static void generate(long i, const corpus_file_t *files, size_t nfiles, enc_t *b) {
  switch (i % 4) {
    case 0: gen_stream(b); break;
    case 1: {
      const corpus_file_t *f = fuzz_pick(files, nfiles);
      enc_bytes(b, f->data, f->len);
      fuzz_mutate(b, put_interesting);
      break;
    }
    case 2:
      fuzz_splice(b, files, nfiles);
      if (rnd_below(2)) fuzz_mutate(b, put_interesting);
      break;
    case 3:
      fuzz_random_bytes(b, (size_t)rnd_below(65));
      if (b->len && rnd_below(2)) b->p[0] = (uint8_t)rnd_below(0x12); /* mostly valid opcodes */
      break;
  }
}

static const fuzz_replay_t desc = {
    .name = "proto_fuzz_replay_test",
    .default_dir = "tests/fuzz/corpus",
    .default_count = 4000,
    .default_seed = 0x7d15757d0e5eedULL,
    .generate = generate,
};

int main(int argc, char **argv) { return fuzz_replay_main(argc, argv, &desc); }
