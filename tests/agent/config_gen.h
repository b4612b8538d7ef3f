/* Random inputs for the YAML configuration reader (operator-agent/config), drawn from a
 * tests/testlib/rng.h generator: YAML-flavoured random bytes, and mutations of a file (bit flips,
 * inserted YAML tokens and keys, deleted ranges, duplicated lines, truncation). Shared by
 * tests/agent/config_random_test.c and tests/fuzz/config_replay.c. Header-only, testonly. */
#ifndef TDIST_TESTS_AGENT_CONFIG_GEN_H
#define TDIST_TESTS_AGENT_CONFIG_GEN_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "tests/testlib/rng.h"

/* YAML syntax, escapes, encodings, boundary numbers and the reader's own keys. "\0" is one NUL. */
static const char *const cfg_gen_tokens[] = {":",
                                             ": ",
                                             "- ",
                                             "[",
                                             "]",
                                             "{",
                                             "}",
                                             ",",
                                             "&a ",
                                             "*a",
                                             "!!str ",
                                             "!x ",
                                             "\"",
                                             "'",
                                             "\n",
                                             "\n  ",
                                             "~",
                                             "null",
                                             "---\n",
                                             "...\n",
                                             "#",
                                             "\t",
                                             "\\x",
                                             "\\u00",
                                             "\\U0001",
                                             "? ",
                                             "|\n  ",
                                             ">\n  ",
                                             "%YAML 1.1\n",
                                             "\r",
                                             "\xef\xbb\xbf",
                                             "\xff",
                                             "\0",
                                             "99999999999",
                                             "-1",
                                             "0",
                                             "1:",
                                             "gpu",
                                             "cpu",
                                             "100ms",
                                             "0.0001",
                                             "1e3",
                                             "env",
                                             "command",
                                             "discovery",
                                             "nnodes",
                                             "run_id",
                                             "rdzv_id",
                                             "standalone",
                                             "master_port",
                                             "node_rank",
                                             "scheme",
                                             "http_port"};

static inline size_t cfg_gen_random(test_rng_t *r, char *buf, size_t cap) {
  static const char alpha[] = "ab01: -\n[]{},'\"#&*!?|>~%@`\t\\.";
  size_t len = (size_t)test_rng_below(r, cap < 200 ? cap : 200);
  for (size_t k = 0; k < len; k++)
    buf[k] =
        test_rng_below(r, 4) ? alpha[test_rng_below(r, sizeof alpha - 1)] : (char)test_rng_next(r);
  return len;
}

/* Applies 1..4 edits to buf[0..len) (capacity cap) and returns the new length. */
static inline size_t cfg_gen_mutate(test_rng_t *r, char *buf, size_t len, size_t cap) {
  for (int m = 1 + (int)test_rng_below(r, 4); m > 0; m--) {
    size_t at = (size_t)test_rng_below(r, len + 1);
    switch (test_rng_below(r, 5)) {
      case 0:
        if (len) buf[test_rng_below(r, len)] ^= (char)(1u << test_rng_below(r, 8));
        break;
      case 1: { /* insert a token */
        const char *t =
            cfg_gen_tokens[test_rng_below(r, sizeof cfg_gen_tokens / sizeof *cfg_gen_tokens)];
        size_t tl = t[0] ? strlen(t) : 1;
        if (len + tl > cap) break;
        memmove(buf + at + tl, buf + at, len - at);
        memcpy(buf + at, t, tl);
        len += tl;
        break;
      }
      case 2: { /* delete a range */
        size_t n = (size_t)test_rng_below(r, 16);
        if (n > len - at) n = len - at;
        memmove(buf + at, buf + at + n, len - at - n);
        len -= n;
        break;
      }
      case 3: { /* duplicate the line around `at` (duplicate keys, nesting) */
        size_t s = at, e = at;
        while (s > 0 && buf[s - 1] != '\n') s--;
        while (e < len && buf[e] != '\n') e++;
        if (e < len) e++;
        if (len + (e - s) > cap) break;
        memmove(buf + e + (e - s), buf + e, len - e);
        memcpy(buf + e, buf + s, e - s);
        len += e - s;
        break;
      }
      default: len = at; /* truncate */
    }
  }
  return len;
}

#endif
