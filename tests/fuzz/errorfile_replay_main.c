/* A main() for the error-file fuzz target (errorfile_fuzz.c) so that plain `bazel test` exercises
 * it without libFuzzer: it replays every file of the seed corpus, then inputs made from a
 * deterministic seed: random JSON documents shaped like error files (the keys that matter, at
 * random depths, nesting near the 64-level cap, strings with every escape, raw and broken UTF-8),
 * corpus files with bit flips, dictionary tokens, insertions, deletions and truncations, splices
 * of two files, and random bytes. An invariant failure aborts (the test fails with the message;
 * TDIST_FUZZ_SEED and the count reproduce a run).
 *
 * usage: errorfile_fuzz_replay_test CORPUS_DIR [COUNT]   (default COUNT 20000) */
#define _GNU_SOURCE
#include <dirent.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tests/fuzz/corpus.h"

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
static void buf_str(buf_t *b, const char *s) { buf_put(b, s, strlen(s)); }

static uint64_t rng_state;
static uint64_t rnd(void) { /* xorshift64* */
  rng_state ^= rng_state >> 12;
  rng_state ^= rng_state << 25;
  rng_state ^= rng_state >> 27;
  return rng_state * 0x2545F4914F6CDD1DULL;
}
static uint64_t below(uint64_t n) { return n ? rnd() % n : 0; }

static const char *const tokens[] = {
    "\"message\"",
    "\"extraInfo\"",
    "\"py_callstack\"",
    "\"timestamp\"",
    "\"errorCode\"",
    "\\u",
    "\\ud83d\\ude00",
    "\\ud800",
    "\\udc00",
    "\\u0000",
    "\\\"",
    "\\\\",
    "\\n",
    "\xF0\x9F",
    "\xE2\x82\xAC",
    "\xC0\xAF",
    "\xFF",
    "true",
    "false",
    "null",
    "-0",
    "1e9",
    "0.5",
    "{",
    "}",
    "[",
    "]",
    ":",
    ",",
    "\"",
    "9223372036854775808",
    "2147483648",
    "-2147483649",
    "\"1796207442\"",
};
#define NTOKENS (sizeof tokens / sizeof tokens[0])

static void gen_string(buf_t *b, size_t maxlen) {
  buf_str(b, "\"");
  size_t n = below(maxlen + 1);
  for (size_t i = 0; i < n; i++) {
    switch (below(8)) {
      case 0: {
        static const char *esc[] = {"\\\"", "\\\\", "\\/", "\\b", "\\f", "\\n", "\\r", "\\t"};
        buf_str(b, esc[below(8)]);
        break;
      }
      case 1: {
        char u[16];
        uint32_t v = below(4) == 0 ? 0xD800 + (uint32_t)below(0x800) : (uint32_t)below(0x10000);
        snprintf(u, sizeof u, "\\u%04x", v);
        buf_str(b, u);
        break;
      }
      case 2:
        buf_str(b, tokens[6 + below(11)]); /* escapes, broken UTF-8 */
        break;
      default: {
        uint8_t c = (uint8_t)(0x20 + below(0x5F));
        if (c == '"' || c == '\\') c = 'q';
        buf_put(b, &c, 1);
      }
    }
  }
  buf_str(b, "\"");
}

static void gen_value(buf_t *b, int depth, int deep);

static void gen_key(buf_t *b) {
  if (below(3))
    buf_str(b, tokens[below(5)]);
  else
    gen_string(b, 6);
}

static void gen_value(buf_t *b, int depth, int deep) {
  int limit = deep ? 70 : 6;
  uint64_t kind = depth >= limit ? 2 + below(3) : below(6);
  if (deep && depth < limit && below(8) != 0) kind = below(2);
  char num[64];
  switch (kind) {
    case 0: { /* object */
      buf_str(b, "{");
      size_t n = deep ? 1 : below(5);
      for (size_t i = 0; i < n; i++) {
        if (i) buf_str(b, below(2) ? ", " : ",");
        gen_key(b);
        buf_str(b, below(2) ? ": " : ":");
        gen_value(b, depth + 1, deep);
      }
      buf_str(b, "}");
      break;
    }
    case 1: { /* array */
      buf_str(b, "[");
      size_t n = deep ? 1 : below(4);
      for (size_t i = 0; i < n; i++) {
        if (i) buf_str(b, ",");
        gen_value(b, depth + 1, deep);
      }
      buf_str(b, "]");
      break;
    }
    case 2: gen_string(b, below(4) == 0 ? 2000 : 40); break;
    case 3:
      if (below(2))
        snprintf(num, sizeof num, "%" PRId64, (int64_t)rnd() >> below(64));
      else
        snprintf(num, sizeof num, "%" PRId64 ".%u", (int64_t)rnd() >> below(64),
                 (unsigned)below(100));
      buf_str(b, num);
      break;
    case 4: buf_str(b, tokens[17 + below(3)]); break;
    default: buf_str(b, tokens[20 + below(3)]); break;
  }
}

/* A document shaped like an error file: one of the two forms with extra members mixed in. */
static void gen_doc(buf_t *b) {
  int deep = below(10) == 0;
  if (below(3) == 0) {
    gen_value(b, 0, deep);
    return;
  }
  buf_str(b, "{");
  if (below(2)) {
    buf_str(b, "\"message\": {\"message\": ");
    gen_string(b, below(4) == 0 ? 3000 : 60);
    buf_str(b, ", \"extraInfo\": {\"py_callstack\": ");
    gen_string(b, below(4) == 0 ? 8000 : 200);
    buf_str(b, ", \"timestamp\": ");
    if (below(2))
      buf_str(b, "\"1796207442\"");
    else
      gen_value(b, 3, 0);
    buf_str(b, "}");
    if (below(2)) {
      buf_str(b, ", \"errorCode\": ");
      gen_value(b, 2, 0);
    }
    if (below(3) == 0) {
      buf_str(b, ", ");
      gen_key(b);
      buf_str(b, ": ");
      gen_value(b, 2, deep);
    }
    buf_str(b, "}");
  } else {
    buf_str(b, "\"message\": ");
    gen_string(b, below(4) == 0 ? 3000 : 60);
    buf_str(b, ", \"timestamp\": ");
    gen_value(b, 1, 0);
  }
  if (below(3) == 0) {
    buf_str(b, ", ");
    gen_key(b);
    buf_str(b, ": ");
    gen_value(b, 1, deep);
  }
  buf_str(b, below(2) ? "}" : "}\n");
}

static void mutate(buf_t *b) {
  int n = 1 + (int)below(4);
  for (int i = 0; i < n; i++) {
    switch (below(6)) {
      case 0:
        if (b->len) b->p[below(b->len)] ^= (uint8_t)(1u << below(8));
        break;
      case 1:
        if (b->len) b->p[below(b->len)] = (uint8_t)rnd();
        break;
      case 2: { /* insert a dictionary token */
        const char *t = tokens[below(NTOKENS)];
        size_t tl = strlen(t), at = (size_t)below(b->len + 1);
        buf_reserve(b, tl);
        memmove(b->p + at + tl, b->p + at, b->len - at);
        memcpy(b->p + at, t, tl);
        b->len += tl;
        break;
      }
      case 3: { /* insert a random byte */
        buf_reserve(b, 1);
        size_t at = (size_t)below(b->len + 1);
        memmove(b->p + at + 1, b->p + at, b->len - at);
        b->p[at] = (uint8_t)rnd();
        b->len++;
        break;
      }
      case 4:
        if (b->len) {
          size_t at = (size_t)below(b->len);
          memmove(b->p + at, b->p + at + 1, b->len - at - 1);
          b->len--;
        }
        break;
      case 5:
        if (b->len) b->len = (size_t)below(b->len);
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
  const char *dir = argc > 1 ? argv[1] : "tests/fuzz/corpus_errorfile";
  long count = argc > 2 ? strtol(argv[2], NULL, 10) : 20000;
  const char *seed_env = getenv("TDIST_FUZZ_SEED");
  uint64_t seed = seed_env ? strtoull(seed_env, NULL, 0) : 0xe77f11e5eedULL;
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
    switch (i % 5) {
      case 0:
      case 1:
        gen_doc(&b);
        if (i % 5 == 1) mutate(&b);
        break;
      case 2: {
        const corpus_file_t *f = &files[below(nfiles)];
        buf_put(&b, f->data, f->len);
        mutate(&b);
        break;
      }
      case 3: {
        const corpus_file_t *f = &files[below(nfiles)], *g = &files[below(nfiles)];
        buf_put(&b, f->data, (size_t)below(f->len + 1));
        size_t from = (size_t)below(g->len + 1);
        buf_put(&b, g->data + from, g->len - from);
        if (below(2)) mutate(&b);
        break;
      }
      case 4: {
        size_t n = (size_t)below(200);
        buf_reserve(&b, n);
        for (size_t k = 0; k < n; k++) b.p[k] = (uint8_t)rnd();
        b.len = n;
        break;
      }
    }
    corpus_run(b.p, b.len);
    done++;
    if (now_s() - t0 > 40.0) { /* a safety net for slow sanitizer builds */
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
