/* agent_errorfile_parse / agent_errorfile_read (operator-agent/supervisor/errorfile.h): both forms
 * of torch-contracts.md §2.8 byte for byte, every escape, UTF-8 repair, truncation on character
 * boundaries, files that are missing, too big, FIFOs or directories, invalid JSON, nesting bombs,
 * a round trip of random strings, and random bytes and mutations that must never crash. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "operator-agent/supervisor/errorfile.h"
#include "tests/testlib/check.h"
#include "tests/testlib/utf8.h"
#include "tests/testlib/rng.h"

static int is_zero(const agent_error_info_t *info) {
  static const agent_error_info_t zero;
  return memcmp(info, &zero, sizeof zero) == 0;
}

/* What every result must satisfy, whatever the input. */
static void check_invariants(int rc, const agent_error_info_t *info, const char *err) {
  CHECK(rc == 0 || rc == -1);
  CHECK(memchr(info->message, 0, sizeof info->message) != NULL);
  CHECK(memchr(info->traceback, 0, sizeof info->traceback) != NULL);
  CHECK(valid_utf8(info->message));
  CHECK(valid_utf8(info->traceback));
  CHECK(memchr(err, 0, 256) != NULL);
  if (rc != 0) {
    CHECK(is_zero(info));
    CHECK(err[0] != 0);
  }
}

static int parse(const char *s, size_t n, agent_error_info_t *info, char *err) {
  /* An exact-size heap copy without a NUL, so that reading past len is visible to ASan. */
  char *copy = malloc(n ? n : 1);
  CHECK(copy != NULL);
  memcpy(copy, s, n);
  int rc = agent_errorfile_parse(copy, n, info, err, 256);
  free(copy);
  check_invariants(rc, info, err);
  return rc;
}
static int parse_str(const char *s, agent_error_info_t *info, char *err) {
  return parse(s, strlen(s), info, err);
}

static void test_reference_forms(void) {
  agent_error_info_t info;
  char err[256];
  /* torch-contracts.md §2.8, byte for byte (the @record form). */
  const char *record =
      "{\"message\": {\"message\": \"ValueError: deliberate failure on attempt 0\",\n"
      "             \"extraInfo\": {\"py_callstack\": \"Traceback (most recent call last):\\n "
      "...\",\n"
      "                           \"timestamp\": \"1796207442\"}}}";
  CHECK_EQ_INT(parse_str(record, &info, err), 0);
  CHECK_STR(info.message, "ValueError: deliberate failure on attempt 0");
  CHECK_STR(info.traceback, "Traceback (most recent call last):\n ...");
  CHECK_EQ_INT(info.timestamp, 1796207442);
  CHECK_EQ_INT(info.has_error_code, 0);

  /* The copy @record makes for the launcher adds errorCode inside message. */
  const char *with_code =
      "{\"message\": {\"message\": \"RuntimeError: boom\", \"extraInfo\": {\"py_callstack\": "
      "\"tb\", \"timestamp\": \"1700000000\"}, \"errorCode\": 1}}";
  CHECK_EQ_INT(parse_str(with_code, &info, err), 0);
  CHECK_STR(info.message, "RuntimeError: boom");
  CHECK_STR(info.traceback, "tb");
  CHECK_EQ_INT(info.timestamp, 1700000000);
  CHECK_EQ_INT(info.has_error_code, 1);
  CHECK_EQ_INT(info.error_code, 1);

  /* The short form. */
  CHECK_EQ_INT(parse_str("{\"message\": \"<str>\", \"timestamp\": 1796207442}", &info, err), 0);
  CHECK_STR(info.message, "<str>");
  CHECK_STR(info.traceback, "");
  CHECK_EQ_INT(info.timestamp, 1796207442);
  CHECK_EQ_INT(info.has_error_code, 0);
  /* ... with the timestamp first, as a string, or missing. */
  CHECK_EQ_INT(parse_str("{\"timestamp\": \"42\", \"message\": \"m\"}", &info, err), 0);
  CHECK_STR(info.message, "m");
  CHECK_EQ_INT(info.timestamp, 42);
  CHECK_EQ_INT(parse_str("{\"message\": \"m\"}", &info, err), 0);
  CHECK_EQ_INT(info.timestamp, 0);
  /* Python's json.dumps with indent=2 and a UTF-8 BOM from some other writer. */
  CHECK_EQ_INT(parse_str("\xEF\xBB\xBF{\n  \"message\": {\n    \"message\": \"x\",\n    "
                         "\"extraInfo\": {\n      \"py_callstack\": \"y\",\n      \"timestamp\": "
                         "\"7\"\n    }\n  }\n}\n",
                         &info, err),
               0);
  CHECK_STR(info.message, "x");
  CHECK_STR(info.traceback, "y");
  CHECK_EQ_INT(info.timestamp, 7);
  /* Unknown members of any type are skipped; the object form without extraInfo still counts. */
  CHECK_EQ_INT(parse_str("{\"a\": [1, 2.5e3, {\"b\": null}, true, false, \"s\"], \"message\": "
                         "{\"x\": {\"message\": \"nested-not-ours\"}, \"message\": \"ours\", "
                         "\"errorCode\": -9}, \"z\": {}}",
                         &info, err),
               0);
  CHECK_STR(info.message, "ours");
  CHECK_EQ_INT(info.timestamp, 0);
  CHECK_EQ_INT(info.has_error_code, 1);
  CHECK_EQ_INT(info.error_code, -9);
  /* errorCode that is not an integer is not an exit code. */
  CHECK_EQ_INT(parse_str("{\"message\": {\"errorCode\": \"1\"}}", &info, err), 0);
  CHECK_EQ_INT(info.has_error_code, 0);
  CHECK_EQ_INT(parse_str("{\"message\": {\"errorCode\": 1e3}}", &info, err), 0);
  CHECK_EQ_INT(info.has_error_code, 0);
  CHECK_EQ_INT(parse_str("{\"message\": {\"errorCode\": 99999999999}}", &info, err), 0);
  CHECK_EQ_INT(info.has_error_code, 0);
  /* Duplicate keys: the last one wins, and a replaced message forgets its fields. */
  CHECK_EQ_INT(parse_str("{\"message\": {\"message\": \"a\", \"errorCode\": 3, \"extraInfo\": "
                         "{\"py_callstack\": \"t\", \"timestamp\": \"5\"}}, \"message\": \"b\", "
                         "\"timestamp\": 6}",
                         &info, err),
               0);
  CHECK_STR(info.message, "b");
  CHECK_STR(info.traceback, "");
  CHECK_EQ_INT(info.timestamp, 6);
  CHECK_EQ_INT(info.has_error_code, 0);
  /* Timestamps: digit strings with a sign, numbers with a fraction; junk gives 0. */
  CHECK_EQ_INT(parse_str("{\"message\": \"m\", \"timestamp\": \"-12\"}", &info, err), 0);
  CHECK_EQ_INT(info.timestamp, -12);
  CHECK_EQ_INT(parse_str("{\"message\": \"m\", \"timestamp\": 1700000000.75}", &info, err), 0);
  CHECK_EQ_INT(info.timestamp, 1700000000);
  CHECK_EQ_INT(parse_str("{\"message\": \"m\", \"timestamp\": \"12x\"}", &info, err), 0);
  CHECK_EQ_INT(info.timestamp, 0);
  CHECK_EQ_INT(
      parse_str("{\"message\": \"m\", \"timestamp\": \"99999999999999999999\"}", &info, err), 0);
  CHECK_EQ_INT(info.timestamp, 0);
}

static void test_escapes(void) {
  agent_error_info_t info;
  char err[256];
  CHECK_EQ_INT(parse_str("{\"message\": \"q\\\" b\\\\ s\\/ \\b\\f\\n\\r\\t end\"}", &info, err), 0);
  CHECK_STR(info.message, "q\" b\\ s/ \b\f\n\r\t end");
  /* \u escapes: 1, 2, 3 and 4 UTF-8 bytes (a surrogate pair), either case of hex. */
  CHECK_EQ_INT(
      parse_str("{\"message\": \"\\u0041\\u00e9\\u00C9\\u20ac\\ud83d\\ude00\"}", &info, err), 0);
  CHECK_STR(info.message, "A\xC3\xA9\xC3\x89\xE2\x82\xAC\xF0\x9F\x98\x80");
  /* Lone surrogates, a reversed pair and \u0000 become U+FFFD. */
  CHECK_EQ_INT(
      parse_str("{\"message\": \"a\\ud800b\\udc00c\\ude00\\ud83dd\\u0000e\\ud800\"}", &info, err),
      0);
  CHECK_STR(info.message,
            "a\xEF\xBF\xBD"
            "b\xEF\xBF\xBD"
            "c\xEF\xBF\xBD\xEF\xBF\xBD"
            "d\xEF\xBF\xBD"
            "e\xEF\xBF\xBD");
  /* Raw UTF-8 passes through; invalid bytes (0xFF, an overlong '/', a truncated sequence, an
   * encoded surrogate) become U+FFFD, one per byte. */
  CHECK_EQ_INT(
      parse_str("{\"message\": \"\xE2\x82\xAC|\xFF|\xC0\xAF|\xE2\x82|\xED\xA0\x80\"}", &info, err),
      0);
  CHECK_STR(info.message,
            "\xE2\x82\xAC|\xEF\xBF\xBD|\xEF\xBF\xBD\xEF\xBF\xBD|\xEF\xBF\xBD\xEF\xBF"
            "\xBD|\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
  /* Bad escapes and raw control characters are invalid JSON. */
  const char *bad[] = {"{\"message\": \"\\x41\"}",   "{\"message\": \"\\u12\"}",
                       "{\"message\": \"\\u12G4\"}", "{\"message\": \"a\nb\"}",
                       "{\"message\": \"a\tb\"}",    "{\"message\": \"\\"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    CHECK_EQ_INT(parse_str(bad[i], &info, err), -1);
    CHECK(strstr(err, "invalid JSON") != NULL);
  }
  /* An embedded NUL byte in the file is a control character too. */
  CHECK_EQ_INT(parse("{\"message\": \"a\0b\"}", 18, &info, err), -1);
}

/* A JSON string literal for s: random choice per character between raw UTF-8 and \u escapes (as
 * Python's ensure_ascii writes them, surrogate pairs included). */
static size_t json_quote(char *out, const uint32_t *cps, size_t n, int ascii) {
  size_t o = 0;
  out[o++] = '"';
  for (size_t i = 0; i < n; i++) {
    uint32_t c = cps[i];
    if (c == '"' || c == '\\') {
      out[o++] = '\\';
      out[o++] = (char)c;
    } else if (c < 0x20 || (ascii && c >= 0x80) || rnd_below(8) == 0) {
      if (c >= 0x10000) {
        uint32_t v = c - 0x10000;
        o += (size_t)sprintf(out + o, "\\u%04x\\u%04X", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
      } else {
        o += (size_t)sprintf(out + o, rnd_below(2) ? "\\u%04x" : "\\u%04X", c);
      }
    } else if (c < 0x80) {
      out[o++] = (char)c;
    } else if (c < 0x800) {
      out[o++] = (char)(0xC0 | (c >> 6));
      out[o++] = (char)(0x80 | (c & 0x3F));
    } else if (c < 0x10000) {
      out[o++] = (char)(0xE0 | (c >> 12));
      out[o++] = (char)(0x80 | ((c >> 6) & 0x3F));
      out[o++] = (char)(0x80 | (c & 0x3F));
    } else {
      out[o++] = (char)(0xF0 | (c >> 18));
      out[o++] = (char)(0x80 | ((c >> 12) & 0x3F));
      out[o++] = (char)(0x80 | ((c >> 6) & 0x3F));
      out[o++] = (char)(0x80 | (c & 0x3F));
    }
  }
  out[o++] = '"';
  return o;
}

static size_t utf8_of(char *out, const uint32_t *cps, size_t n) {
  size_t o = 0;
  for (size_t i = 0; i < n; i++) {
    uint32_t c = cps[i];
    if (c < 0x80) {
      out[o++] = (char)c;
    } else if (c < 0x800) {
      out[o++] = (char)(0xC0 | (c >> 6));
      out[o++] = (char)(0x80 | (c & 0x3F));
    } else if (c < 0x10000) {
      out[o++] = (char)(0xE0 | (c >> 12));
      out[o++] = (char)(0x80 | ((c >> 6) & 0x3F));
      out[o++] = (char)(0x80 | (c & 0x3F));
    } else {
      out[o++] = (char)(0xF0 | (c >> 18));
      out[o++] = (char)(0x80 | ((c >> 12) & 0x3F));
      out[o++] = (char)(0x80 | ((c >> 6) & 0x3F));
      out[o++] = (char)(0x80 | (c & 0x3F));
    }
  }
  out[o] = 0;
  return o;
}

static uint32_t random_cp(void) {
  switch (rnd_below(5)) {
    case 0: return 1 + (uint32_t)rnd_below(0x1F); /* controls, not NUL (that one becomes U+FFFD) */
    case 1: return 0x20 + (uint32_t)rnd_below(0x60);
    case 2: return 0x80 + (uint32_t)rnd_below(0x780);
    case 3: {
      uint32_t c = 0x800 + (uint32_t)rnd_below(0xF800);
      return c >= 0xD800 && c <= 0xDFFF ? 0xE000 : c;
    }
    default: return 0x10000 + (uint32_t)rnd_below(0x100000);
  }
}

/* Random strings, JSON-encoded in mixed styles, come back as their UTF-8; long ones are cut
 * exactly as documented (message: head + "...", traceback: "...\n" + tail). */
static void test_round_trip(void) {
  enum { MAXCP = 3000 };
  uint32_t *cps = malloc(MAXCP * sizeof *cps);
  char *doc = malloc(MAXCP * 26 + 256), *want_msg = malloc(MAXCP * 4 + 1),
       *want_tb = malloc(MAXCP * 4 + 1);
  CHECK(cps && doc && want_msg && want_tb);
  agent_error_info_t info;
  char err[256];
  for (int iter = 0; iter < 600; iter++) {
    size_t nm = rnd_below(4) == 0 ? 1000 + rnd_below(40) : rnd_below(MAXCP), nt = rnd_below(MAXCP);
    int ascii = (int)rnd_below(2);
    size_t o = (size_t)sprintf(doc, "{\"message\": {\"message\": ");
    for (size_t i = 0; i < nm; i++)
      cps[i] = rnd_below(3) ? 0x20 + (uint32_t)rnd_below(0x5F) : random_cp();
    size_t lm = utf8_of(want_msg, cps, nm);
    o += json_quote(doc + o, cps, nm, ascii);
    o += (size_t)sprintf(doc + o,
                         ", \"extraInfo\": {\"timestamp\": \"%d\", \"py_callstack\": ", iter);
    for (size_t i = 0; i < nt; i++) cps[i] = random_cp();
    size_t lt = utf8_of(want_tb, cps, nt);
    o += json_quote(doc + o, cps, nt, ascii);
    o += (size_t)sprintf(doc + o, "}}}");
    CHECK_EQ_INT(parse(doc, o, &info, err), 0);
    CHECK_EQ_INT(info.timestamp, iter);
    if (lm < sizeof info.message) {
      CHECK_STR(info.message, want_msg);
    } else {
      size_t k = strlen(info.message);
      CHECK(k >= sizeof info.message - 4 - 3 && k <= sizeof info.message - 1);
      CHECK(memcmp(info.message + k - 3, "...", 3) == 0);
      CHECK(memcmp(info.message, want_msg, k - 3) == 0);
    }
    if (lt < sizeof info.traceback) {
      CHECK_STR(info.traceback, want_tb);
    } else {
      size_t k = strlen(info.traceback);
      CHECK(k >= sizeof info.traceback - 1 - 3 && k <= sizeof info.traceback - 1);
      CHECK(memcmp(info.traceback, "...\n", 4) == 0);
      CHECK(memcmp(info.traceback + 4, want_tb + lt - (k - 4), k - 4) == 0);
    }
  }
  free(cps);
  free(doc);
  free(want_msg);
  free(want_tb);
}

static void test_truncation_edges(void) {
  agent_error_info_t info;
  char err[256];
  char *doc = malloc(20000), *body = malloc(10000);
  CHECK(doc && body);
  /* Exactly at the limits: 1023 bytes fit, 1024 are cut; the same for 4095/4096. */
  for (size_t n = 1018; n <= 1030; n++) {
    memset(body, 'a', n);
    body[n] = 0;
    snprintf(doc, 20000, "{\"message\": \"%s\"}", body);
    CHECK_EQ_INT(parse_str(doc, &info, err), 0);
    if (n <= 1023) {
      CHECK_STR(info.message, body);
    } else {
      CHECK_EQ_INT(strlen(info.message), 1023);
      CHECK_STR(info.message + 1020, "...");
    }
  }
  for (size_t n = 4090; n <= 4100; n++) {
    for (size_t i = 0; i < n; i++) body[i] = (char)('a' + i % 26);
    body[n] = 0;
    snprintf(doc, 20000, "{\"message\": {\"extraInfo\": {\"py_callstack\": \"%s\"}}}", body);
    CHECK_EQ_INT(parse_str(doc, &info, err), 0);
    if (n <= 4095) {
      CHECK_STR(info.traceback, body);
    } else {
      CHECK_EQ_INT(strlen(info.traceback), 4095);
      CHECK(memcmp(info.traceback, "...\n", 4) == 0);
      CHECK_STR(info.traceback + 4, body + n - 4091);
    }
  }
  /* Multi-byte characters are never split: 3-byte euros and 4-byte emoji at every offset. */
  for (size_t shift = 0; shift < 4; shift++) {
    size_t o = 0;
    for (size_t i = 0; i < shift; i++) body[o++] = 'x';
    while (o < 6000) {
      const char *c = (o / 7) % 2 ? "\xE2\x82\xAC" : "\xF0\x9F\x98\x80";
      memcpy(body + o, c, strlen(c));
      o += strlen(c);
    }
    body[o] = 0;
    snprintf(doc, 20000,
             "{\"message\": {\"message\": \"%s\", \"extraInfo\": {\"py_callstack\": \"%s\"}}}",
             body, body);
    CHECK_EQ_INT(parse_str(doc, &info, err), 0); /* check_invariants verified UTF-8 */
    CHECK(strlen(info.message) >= 1023 - 3 - 3);
    CHECK(strlen(info.traceback) >= 4095 - 3);
  }
  free(doc);
  free(body);
}

static void test_invalid(void) {
  agent_error_info_t info;
  char err[256];
  const char *bad[] = {
      "",
      "   \n ",
      "{",
      "}",
      "[",
      "{\"message\": \"x\"",
      "{\"message\": \"x\"} extra",
      "{\"message\": \"x\"}}",
      "{\"message\": \"x\",}",
      "{\"message\" \"x\"}",
      "{message: \"x\"}",
      "{'message': 'x'}",
      "{\"message\": \"x\", }",
      "{\"message\": [1,]}",
      "{\"message\": 01}",
      "{\"message\": 1.}",
      "{\"message\": -}",
      "{\"message\": 1e}",
      "{\"message\": .5}",
      "{\"message\": NaN}",
      "{\"message\": Infinity}",
      "{\"message\": tru}",
      "{\"message\": nul}",
      "{\"message\": \"x\" \"y\"}",
      "{\"a\":1 \"message\": \"x\"}",
      "{\"message\": +1}",
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    info.timestamp = 99;
    CHECK_EQ_INT(parse_str(bad[i], &info, err), -1);
    CHECK(strstr(err, "invalid JSON") != NULL);
  }
  CHECK_EQ_INT(parse("\0", 1, &info, err), -1);
  CHECK_EQ_INT(parse("{\"message\": \"x\"}\0", 17, &info, err), -1);
  /* Valid JSON that is neither form. */
  const char *other[] = {"[]",
                         "\"x\"",
                         "42",
                         "null",
                         "{}",
                         "{\"msg\": \"x\"}",
                         "{\"message\": 5}",
                         "{\"message\": null}",
                         "{\"message\": [\"x\"]}",
                         "{\"timestamp\": 5}",
                         "[{\"message\": \"x\"}]"};
  for (size_t i = 0; i < sizeof other / sizeof other[0]; i++) {
    CHECK_EQ_INT(parse_str(other[i], &info, err), -1);
    CHECK(strstr(err, "neither error-file form") != NULL);
  }
  /* The error names the position. */
  CHECK_EQ_INT(parse_str("{\n  \"message\": \"x\",\n  \"b\": tx\n}", &info, err), -1);
  CHECK(strstr(err, "line 3, column 8") != NULL);
}

static void test_depth(void) {
  agent_error_info_t info;
  char err[256];
  size_t n = 200000;
  char *doc = malloc(n + 64);
  CHECK(doc != NULL);
  /* A bomb: deep arrays and objects, closed or not, stop at the cap (no stack overflow). */
  memset(doc, '[', n);
  CHECK_EQ_INT(parse(doc, n, &info, err), -1);
  CHECK(strstr(err, "nested deeper than 64") != NULL);
  size_t o = 0;
  while (o + 5 < n) o += (size_t)sprintf(doc + o, "{\"a\":");
  CHECK_EQ_INT(parse(doc, o, &info, err), -1);
  CHECK(strstr(err, "nested deeper than 64") != NULL);
  /* The exact limit: the root object plus 63 nested arrays parse; 64 do not. */
  for (int k = 62; k <= 65; k++) {
    o = (size_t)sprintf(doc, "{\"message\": \"m\", \"d\": ");
    for (int i = 0; i < k; i++) doc[o++] = '[';
    for (int i = 0; i < k; i++) doc[o++] = ']';
    doc[o++] = '}';
    CHECK_EQ_INT(parse(doc, o, &info, err), k <= 63 ? 0 : -1);
  }
  free(doc);
}

static const char *const seeds[] = {
    "{\"message\": {\"message\": \"ValueError: deliberate failure on attempt 0\",\n"
    "             \"extraInfo\": {\"py_callstack\": \"Traceback (most recent call last):\\n "
    "...\",\n"
    "                           \"timestamp\": \"1796207442\"}}}",
    "{\"message\": \"<str>\", \"timestamp\": 1796207442}",
    "{\"message\": {\"message\": \"E\\u00e9\\ud83d\\ude00\", \"errorCode\": 1, \"extraInfo\": "
    "{\"py_callstack\": \"t\\n\\\"q\\\"\", \"timestamp\": \"1\"}}, \"x\": [1, -2.5e-3, true, "
    "false, null, {}]}",
};

static void test_random_inputs(void) {
  agent_error_info_t info;
  char err[256];
  enum { CAP = 4096 };
  static const char punct[] = "{}[]\":,\\u0123456789.eE-+tfnrl \n";
  char *b = malloc(CAP);
  CHECK(b != NULL);
  int ok = 0;
  for (int iter = 0; iter < 30000; iter++) {
    size_t n;
    if (iter % 3 == 0) { /* random bytes, biased towards JSON punctuation */
      n = rnd_below(300);
      for (size_t i = 0; i < n; i++)
        b[i] = rnd_below(2) ? punct[rnd_below(sizeof punct - 1)] : (char)rnd();
    } else { /* a mutated valid file */
      const char *s = seeds[rnd_below(sizeof seeds / sizeof seeds[0])];
      n = strlen(s);
      memcpy(b, s, n);
      int muts = 1 + (int)rnd_below(4);
      for (int m = 0; m < muts; m++) {
        switch (rnd_below(5)) {
          case 0:
            if (n) b[rnd_below(n)] ^= (char)(1u << rnd_below(8));
            break;
          case 1:
            if (n) b[rnd_below(n)] = "{}[]\":,\\ux0"[rnd_below(11)];
            break;
          case 2:
            if (n < CAP - 1) {
              size_t at = rnd_below(n + 1);
              memmove(b + at + 1, b + at, n - at);
              b[at] = (char)rnd();
              n++;
            }
            break;
          case 3:
            if (n) {
              size_t at = rnd_below(n);
              memmove(b + at, b + at + 1, n - at - 1);
              n--;
            }
            break;
          case 4: n = rnd_below(n + 1); break;
        }
      }
    }
    if (parse(b, n, &info, err) == 0) ok++;
  }
  TEST_LOG("random inputs: %d of 30000 parsed", ok);
  CHECK(ok > 100); /* the mutations must also reach the success path */
  free(b);
}

static void write_file(const char *path, const char *data, size_t n) {
  FILE *f = fopen(path, "wb");
  CHECK(f != NULL);
  CHECK(fwrite(data, 1, n, f) == n);
  CHECK(fclose(f) == 0);
}

static void test_files(void) {
  const char *tmp = getenv("TEST_TMPDIR");
  if (tmp == NULL) tmp = "/tmp";
  char dir[512], path[600], err[256];
  snprintf(dir, sizeof dir, "%s/errorfile_test.%d", tmp, (int)getpid());
  CHECK(mkdir(dir, 0700) == 0 || errno == EEXIST);
  agent_error_info_t info;

  snprintf(path, sizeof path, "%s/missing.json", dir);
  info.timestamp = 5;
  CHECK_EQ_INT(agent_errorfile_read(path, &info, err, sizeof err), -2);
  CHECK(is_zero(&info));
  CHECK(strstr(err, path) != NULL && strstr(err, "<N/A>") != NULL);
  CHECK_EQ_INT(agent_errorfile_read("", &info, err, sizeof err), -2);

  snprintf(path, sizeof path, "%s/ok.json", dir);
  write_file(path, seeds[0], strlen(seeds[0]));
  CHECK_EQ_INT(agent_errorfile_read(path, &info, err, sizeof err), 0);
  CHECK_STR(info.message, "ValueError: deliberate failure on attempt 0");
  CHECK_EQ_INT(info.timestamp, 1796207442);

  snprintf(path, sizeof path, "%s/bad.json", dir);
  write_file(path, "{\"message\": ", 12); /* a worker killed mid-write */
  CHECK_EQ_INT(agent_errorfile_read(path, &info, err, sizeof err), -1);
  CHECK(strstr(err, path) != NULL && strstr(err, "invalid JSON") != NULL);
  CHECK(is_zero(&info));

  /* 1 MiB is read; one byte more is refused without parsing. */
  size_t big = 1u << 20;
  char *data = malloc(big + 1);
  CHECK(data != NULL);
  int o = sprintf(data, "{\"message\": \"m\", \"pad\": \"");
  memset(data + o, 'p', big - (size_t)o - 2);
  memcpy(data + big - 2, "\"}", 2);
  snprintf(path, sizeof path, "%s/big.json", dir);
  write_file(path, data, big);
  CHECK_EQ_INT(agent_errorfile_read(path, &info, err, sizeof err), 0);
  CHECK_STR(info.message, "m");
  data[big - 2] = ' ';
  memcpy(data + big - 1, "\"}", 2);
  write_file(path, data, big + 1);
  CHECK_EQ_INT(agent_errorfile_read(path, &info, err, sizeof err), -1);
  CHECK(strstr(err, "larger than") != NULL);
  free(data);

  /* A directory and a FIFO (no writer: must not block) are not error files. */
  CHECK_EQ_INT(agent_errorfile_read(dir, &info, err, sizeof err), -1);
  snprintf(path, sizeof path, "%s/fifo", dir);
  CHECK(mkfifo(path, 0600) == 0);
  CHECK_EQ_INT(agent_errorfile_read(path, &info, err, sizeof err), -1);
  CHECK(strstr(err, "not a regular file") != NULL);
  unlink(path);
}

/* Messages that read as a lost peer (their failure is a consequence) and ones that do not. */
static void test_peer_loss(void) {
  static const char *const loss[] = {
      /* PyTorch 1.13 gloo, from a real error file (tests/agent/standalone_test.sh) */
      "RuntimeError: [./gloo/transport/tcp/pair.cc:598] Connection closed by peer [127.0.0.1]:8114",
      "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Read error "
      "[10.0.0.2]:19251: Connection reset by peer",
      "RuntimeError: [gloo/transport/tcp/pair.cc:211] write: Broken pipe",
      "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1275, remote "
      "process exited or there was a network error, NCCL version 2.18.1",
      "RuntimeError: NCCL communicator was aborted on rank 3.",
      "tdist.Error: all_reduce: rank 2 (10.0.0.7:41000) closed the connection (did that process "
      "exit or crash?)",
      "all_gather: rank 1 (same host) closed its connection (did that process exit or crash?)",
      "CONNECTION CLOSED BY PEER",
  };
  static const char *const cause[] = {
      "ValueError: deliberate failure of rank 1 on attempt 0",
      "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB",
      "RuntimeError: Timed out waiting 1800000ms for send operation to complete",
      "KeyError: 'peer'",
      "RuntimeError: the connection string is closed by policy",
      "",
  };
  for (size_t i = 0; i < sizeof loss / sizeof loss[0]; i++)
    CHECK(agent_errorfile_is_peer_loss(loss[i]));
  for (size_t i = 0; i < sizeof cause / sizeof cause[0]; i++)
    CHECK(!agent_errorfile_is_peer_loss(cause[i]));
  CHECK(!agent_errorfile_is_peer_loss(NULL));
  /* Through the parser, as the agent reads it: the message decides, not the traceback. */
  agent_error_info_t info;
  char err[256];
  const char *doc =
      "{\"message\": {\"message\": \"RuntimeError: [./gloo/transport/tcp/pair.cc:598] Connection "
      "closed by peer [127.0.0.1]:54483\", \"extraInfo\": {\"py_callstack\": \"Traceback: "
      "ValueError\", \"timestamp\": \"1796252864\"}}}";
  CHECK(parse_str(doc, &info, err) == 0);
  CHECK(agent_errorfile_is_peer_loss(info.message));
}

int main(void) {
  test_rng_init("errorfile_test", 0x5eed0e77f11eULL);
  test_peer_loss();
  test_reference_forms();
  test_escapes();
  test_round_trip();
  test_truncation_edges();
  test_invalid();
  test_depth();
  test_random_inputs();
  test_files();
  TEST_LOG("errorfile_test: all passed");
  return 0;
}
