/* A main() for the proto fuzz target so that plain `bazel test` exercises it without libFuzzer:
 * it replays every file of the seed corpus, then a few thousand inputs made from a deterministic
 * seed: valid request streams in both dialects with lengths around the fuzz limits, corpus files
 * with bit flips, boundary length fields, insertions and truncations, splices of two files, and
 * random bytes. An invariant failure aborts (the test fails with the message and the input
 * number; TDIST_FUZZ_SEED and the count reproduce a run).
 *
 * usage: proto_fuzz_replay_test CORPUS_DIR [COUNT]   (default COUNT 4000) */
#define _GNU_SOURCE
#include <dirent.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tests/fuzz/corpus.h"

#include "runtime/store/proto.h"
#include "tests/fuzz/proto_ref.h"

typedef struct {
  uint8_t *p;
  size_t len, cap;
} buf_t;

static void buf_reserve(buf_t *b, size_t more) {
  if (b->len + more <= b->cap) return;
  size_t cap = b->cap ? b->cap : 256;
  while (cap < b->len + more) cap *= 2;
  b->p = realloc(b->p, cap);
  if (b->p == NULL) {
    perror("realloc");
    exit(1);
  }
  b->cap = cap;
}
static void buf_put(buf_t *b, const void *p, size_t n) {
  buf_reserve(b, n);
  if (n) memcpy(b->p + b->len, p, n);
  b->len += n;
}
static void buf_u8(buf_t *b, uint8_t v) { buf_put(b, &v, 1); }
static void buf_le(buf_t *b, uint64_t v, int bytes) {
  uint8_t t[8];
  for (int i = 0; i < bytes; i++) t[i] = (uint8_t)(v >> (8 * i));
  buf_put(b, t, (size_t)bytes);
}

static uint64_t rng_state;
static uint64_t rnd(void) { /* xorshift64* */
  rng_state ^= rng_state >> 12;
  rng_state ^= rng_state << 25;
  rng_state ^= rng_state >> 27;
  return rng_state * 0x2545F4914F6CDD1DULL;
}
static uint64_t rnd_below(uint64_t n) { return n ? rnd() % n : 0; }

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

static void put_str(buf_t *b, uint64_t len) {
  buf_le(b, len, 8);
  buf_reserve(b, (size_t)len);
  for (uint64_t i = 0; i < len; i++) b->p[b->len + i] = (uint8_t)("/abkv0123"[rnd_below(9)]);
  b->len += (size_t)len;
}

/* Appends one well-formed request (well-formed for the layout; lengths may exceed a limit). */
static void gen_request(buf_t *b, tdist__dialect_t d) {
  uint8_t wire = (uint8_t)rnd_below(ref_op_count(d));
  const ref_op_t *e = ref_lookup(d, wire);
  buf_u8(b, wire);
  for (const char *l = e->layout; *l; l++) {
    switch (*l) {
      case 'k':
      case 'v': put_str(b, pick_len()); break;
      case 'i': buf_le(b, rnd(), 8); break;
      case 'u': buf_le(b, rnd_below(2) ? TDIST__VALIDATE_MAGIC : (uint32_t)rnd(), 4); break;
      case 'K':
      case 'P': {
        uint64_t n = rnd_below(10);
        buf_le(b, n, 8);
        for (uint64_t i = 0; i < n; i++) {
          put_str(b, g_big || rnd_below(8) == 0 ? pick_len() : rnd_below(6));
          if (*l == 'P') put_str(b, g_big || rnd_below(8) == 0 ? pick_len() : rnd_below(20));
        }
        break;
      }
    }
  }
}

static void gen_stream(buf_t *b) {
  tdist__dialect_t d = rnd_below(2) ? TDIST__DIALECT_V2 : TDIST__DIALECT_V1_13;
  g_big = rnd_below(4) == 0;
  if (d == TDIST__DIALECT_V2 && rnd_below(4) != 0) {
    buf_u8(b, 0);
    buf_le(b, TDIST__VALIDATE_MAGIC, 4);
  }
  int n = 1 + (int)rnd_below(6);
  for (int i = 0; i < n; i++) gen_request(b, d);
  if (rnd_below(4) == 0 && b->len > 0) b->len = (size_t)rnd_below(b->len); /* cut mid-request */
}

static void mutate(buf_t *b) {
  static const uint64_t interesting[] = {0,  1,   7,   8,   15,         16,         17,        64,
                                         65, 300, 301, 600, 1ULL << 32, 1ULL << 63, UINT64_MAX};
  int n = 1 + (int)rnd_below(4);
  for (int i = 0; i < n; i++) {
    switch (rnd_below(6)) {
      case 0: /* bit flip */
        if (b->len) b->p[rnd_below(b->len)] ^= (uint8_t)(1u << rnd_below(8));
        break;
      case 1: /* random byte */
        if (b->len) b->p[rnd_below(b->len)] = (uint8_t)rnd();
        break;
      case 2: /* a boundary value where a length field may be */
        if (b->len >= 8) {
          size_t at = (size_t)rnd_below(b->len - 7);
          uint64_t v = interesting[rnd_below(sizeof interesting / sizeof interesting[0])];
          for (int k = 0; k < 8; k++) b->p[at + k] = (uint8_t)(v >> (8 * k));
        }
        break;
      case 3: /* insert a byte */
        buf_reserve(b, 1);
        {
          size_t at = (size_t)rnd_below(b->len + 1);
          memmove(b->p + at + 1, b->p + at, b->len - at);
          b->p[at] = (uint8_t)rnd();
          b->len++;
        }
        break;
      case 4: /* delete a byte */
        if (b->len) {
          size_t at = (size_t)rnd_below(b->len);
          memmove(b->p + at, b->p + at + 1, b->len - at - 1);
          b->len--;
        }
        break;
      case 5: /* truncate */
        if (b->len) b->len = (size_t)rnd_below(b->len);
        break;
    }
  }
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
  const char *dir = argc > 1 ? argv[1] : "tests/fuzz/corpus";
  long count = argc > 2 ? strtol(argv[2], NULL, 10) : 4000;
  const char *seed_env = getenv("TDIST_FUZZ_SEED");
  uint64_t seed = seed_env ? strtoull(seed_env, NULL, 0) : 0x7d15757d0e5eedULL;
  rng_state = seed ? seed : 1;
  double t0 = now_s();

  corpus_file_t *files = NULL;
  size_t nfiles = corpus_load(dir, &files);
  if (nfiles == 0) {
    fprintf(stderr, "corpus directory '%s' is empty\n", dir);
    return 1;
  }
  size_t corpus_bytes = 0;
  for (size_t i = 0; i < nfiles; i++) {
    corpus_run(files[i].data, files[i].len);
    corpus_bytes += files[i].len;
  }
  fprintf(stderr, "replayed %zu corpus files (%zu bytes) from %s\n", nfiles, corpus_bytes, dir);

  buf_t b = {0};
  long done = 0;
  for (long i = 0; i < count; i++) {
    b.len = 0;
    switch (i % 4) {
      case 0: gen_stream(&b); break;
      case 1: {
        const corpus_file_t *f = &files[rnd_below(nfiles)];
        buf_put(&b, f->data, f->len);
        mutate(&b);
        break;
      }
      case 2: {
        const corpus_file_t *f = &files[rnd_below(nfiles)], *g = &files[rnd_below(nfiles)];
        buf_put(&b, f->data, (size_t)rnd_below(f->len + 1));
        size_t from = (size_t)rnd_below(g->len + 1);
        buf_put(&b, g->data + from, g->len - from);
        if (rnd_below(2)) mutate(&b);
        break;
      }
      case 3: {
        size_t n = (size_t)rnd_below(65);
        buf_reserve(&b, n);
        for (size_t k = 0; k < n; k++) b.p[k] = (uint8_t)rnd();
        if (n && rnd_below(2)) b.p[0] = (uint8_t)rnd_below(0x12); /* mostly valid opcodes */
        b.len = n;
        break;
      }
    }
    corpus_run(b.p, b.len);
    done++;
    /* A safety net for slow sanitizer builds: the test must stay small. */
    if (now_s() - t0 > 40.0) {
      fprintf(stderr, "stopping early after %ld generated inputs (40 s budget)\n", done);
      break;
    }
  }
  fprintf(stderr, "ran %ld generated inputs (seed 0x%" PRIx64 ") in %.2f s: all invariants held\n",
          done, seed, now_s() - t0);
  free(b.p);
  corpus_free(files, nfiles);
  return 0;
}
