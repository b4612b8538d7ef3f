/* The generator of errorfile_fuzz_replay_test (the driver is tests/testlib/fuzz_replay.h): after
 * the seed corpus of the error-file fuzz target (errorfile_fuzz.c), inputs made from the seed:
 * random JSON documents shaped like error files (the keys that matter, at
 * random depths, nesting near the 64-level cap, strings with every escape, raw and broken UTF-8),
 * corpus files with bit flips, dictionary tokens, insertions, deletions and truncations, splices
 * of two files, and random bytes. An invariant failure aborts (the test fails with the message;
 * TDIST_TEST_SEED and COUNT reproduce a run).
 *
 * usage: errorfile_fuzz_replay_test CORPUS_DIR [COUNT]   (default COUNT 20000) */
#define _GNU_SOURCE
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/testlib/fuzz_replay.h"

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

static void gen_string(enc_t *b, size_t maxlen) {
  enc_text(b, "\"");
  size_t n = rnd_below(maxlen + 1);
  for (size_t i = 0; i < n; i++) {
    switch (rnd_below(8)) {
      case 0: {
        static const char *esc[] = {"\\\"", "\\\\", "\\/", "\\b", "\\f", "\\n", "\\r", "\\t"};
        enc_text(b, esc[rnd_below(8)]);
        break;
      }
      case 1: {
        char u[16];
        uint32_t v =
            rnd_below(4) == 0 ? 0xD800 + (uint32_t)rnd_below(0x800) : (uint32_t)rnd_below(0x10000);
        snprintf(u, sizeof u, "\\u%04x", v);
        enc_text(b, u);
        break;
      }
      case 2:
        enc_text(b, tokens[6 + rnd_below(11)]); /* escapes, broken UTF-8 */
        break;
      default: {
        uint8_t c = (uint8_t)(0x20 + rnd_below(0x5F));
        if (c == '"' || c == '\\') c = 'q';
        enc_bytes(b, &c, 1);
      }
    }
  }
  enc_text(b, "\"");
}

static void gen_value(enc_t *b, int depth, int deep);

static void gen_key(enc_t *b) {
  if (rnd_below(3))
    enc_text(b, tokens[rnd_below(5)]);
  else
    gen_string(b, 6);
}

static void gen_value(enc_t *b, int depth, int deep) {
  int limit = deep ? 70 : 6;
  uint64_t kind = depth >= limit ? 2 + rnd_below(3) : rnd_below(6);
  if (deep && depth < limit && rnd_below(8) != 0) kind = rnd_below(2);
  char num[64];
  switch (kind) {
    case 0: { /* object */
      enc_text(b, "{");
      size_t n = deep ? 1 : rnd_below(5);
      for (size_t i = 0; i < n; i++) {
        if (i) enc_text(b, rnd_below(2) ? ", " : ",");
        gen_key(b);
        enc_text(b, rnd_below(2) ? ": " : ":");
        gen_value(b, depth + 1, deep);
      }
      enc_text(b, "}");
      break;
    }
    case 1: { /* array */
      enc_text(b, "[");
      size_t n = deep ? 1 : rnd_below(4);
      for (size_t i = 0; i < n; i++) {
        if (i) enc_text(b, ",");
        gen_value(b, depth + 1, deep);
      }
      enc_text(b, "]");
      break;
    }
    case 2: gen_string(b, rnd_below(4) == 0 ? 2000 : 40); break;
    case 3:
      if (rnd_below(2))
        snprintf(num, sizeof num, "%" PRId64, (int64_t)rnd() >> rnd_below(64));
      else
        snprintf(num, sizeof num, "%" PRId64 ".%u", (int64_t)rnd() >> rnd_below(64),
                 (unsigned)rnd_below(100));
      enc_text(b, num);
      break;
    case 4: enc_text(b, tokens[17 + rnd_below(3)]); break;
    default: enc_text(b, tokens[20 + rnd_below(3)]); break;
  }
}

/* A document shaped like an error file: one of the two forms with extra members mixed in. */
static void gen_doc(enc_t *b) {
  int deep = rnd_below(10) == 0;
  if (rnd_below(3) == 0) {
    gen_value(b, 0, deep);
    return;
  }
  enc_text(b, "{");
  if (rnd_below(2)) {
    enc_text(b, "\"message\": {\"message\": ");
    gen_string(b, rnd_below(4) == 0 ? 3000 : 60);
    enc_text(b, ", \"extraInfo\": {\"py_callstack\": ");
    gen_string(b, rnd_below(4) == 0 ? 8000 : 200);
    enc_text(b, ", \"timestamp\": ");
    if (rnd_below(2))
      enc_text(b, "\"1796207442\"");
    else
      gen_value(b, 3, 0);
    enc_text(b, "}");
    if (rnd_below(2)) {
      enc_text(b, ", \"errorCode\": ");
      gen_value(b, 2, 0);
    }
    if (rnd_below(3) == 0) {
      enc_text(b, ", ");
      gen_key(b);
      enc_text(b, ": ");
      gen_value(b, 2, deep);
    }
    enc_text(b, "}");
  } else {
    enc_text(b, "\"message\": ");
    gen_string(b, rnd_below(4) == 0 ? 3000 : 60);
    enc_text(b, ", \"timestamp\": ");
    gen_value(b, 1, 0);
  }
  if (rnd_below(3) == 0) {
    enc_text(b, ", ");
    gen_key(b);
    enc_text(b, ": ");
    gen_value(b, 1, deep);
  }
  enc_text(b, rnd_below(2) ? "}" : "}\n");
}

/* A dictionary token inserted at random. */
static void put_token(enc_t *b) { fuzz_insert_text(b, tokens[rnd_below(NTOKENS)]); }

static void generate(long i, const corpus_file_t *files, size_t nfiles, enc_t *b) {
  fuzz_generate_mix(i, files, nfiles, b, gen_doc, put_token, 200);
}

static const fuzz_replay_t desc = {
    .name = "errorfile_fuzz_replay_test",
    .default_dir = "tests/fuzz/corpus_errorfile",
    .default_count = 20000,
    .default_seed = 0xe77f11e5eedULL,
    .generate = generate,
};

int main(int argc, char **argv) { return fuzz_replay_main(argc, argv, &desc); }
