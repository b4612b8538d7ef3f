/* operator-agent/common/utf8.{h,c}, the agent's one UTF-8 decoder and encoder, against three
 * independent references:
 *   (a) a table written from the Unicode standard (Table 3-7 boundaries; overlong forms,
 *       surrogates, code points past U+10FFFF, truncated and lone bytes; the Table 3-8 example of
 *       U+FFFD substitution by maximal subparts);
 *   (b) tests/testlib/utf8.h's strict validator (written apart, by code point arithmetic) on every
 *       string of 1 to 3 non-NUL bytes and on every 4-byte string with a lead F0..F7 and
 *       continuation bytes drawn from the boundary values;
 *   (c) CPython's decoder (bytes.decode("utf-8", "replace") and strict) on 20,000 random byte
 *       strings biased to the interesting bytes, in a real python3 process.
 * And the encoder round trip for every code point. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "operator-agent/common/utf8.h"
#include "ranks.h" /* tdist_test_rand */
#include "utf8.h"  /* tests/testlib: the independent strict validator */

/* Decodes s[0..n) replacing each maximal subpart with U+FFFD; returns the output length. */
static size_t decode_replace(const unsigned char *s, size_t n, unsigned char *out) {
  size_t o = 0;
  for (size_t i = 0; i < n;) {
    int l = agent_utf8_next((const char *)s + i, n - i, NULL);
    CHECK(l != 0);
    if (l < 0) {
      memcpy(out + o, "\xEF\xBF\xBD", 3);
      o += 3;
      i += (size_t)-l;
    } else {
      memcpy(out + o, s + i, (size_t)l);
      o += (size_t)l;
      i += (size_t)l;
    }
  }
  return o;
}

typedef struct {
  const char *bytes; /* hex */
  int next;          /* agent_utf8_next of the whole string */
  uint32_t cp;       /* when next > 0 */
} case_t;

static size_t unhex(const char *h, unsigned char *out) {
  size_t n = 0;
  for (; h[0] && h[1]; h += 2) {
    unsigned v;
    CHECK(sscanf(h, "%2x", &v) == 1);
    out[n++] = (unsigned char)v;
  }
  return n;
}

static void check_table(void) {
  static const case_t cases[] = {
      /* well-formed: the first and last code point of each row of Table 3-7 */
      {"41", 1, 0x41},
      {"7f", 1, 0x7f},
      {"00", 1, 0},
      {"c280", 2, 0x80},
      {"dfbf", 2, 0x7ff},
      {"e0a080", 3, 0x800},
      {"e0bfbf", 3, 0xfff},
      {"e18080", 3, 0x1000},
      {"ecbfbf", 3, 0xcfff},
      {"ed8080", 3, 0xd000},
      {"ed9fbf", 3, 0xd7ff},
      {"ee8080", 3, 0xe000},
      {"efbfbf", 3, 0xffff},
      {"f0908080", 4, 0x10000},
      {"f0bfbfbf", 4, 0x3ffff},
      {"f1808080", 4, 0x40000},
      {"f3bfbfbf", 4, 0xfffff},
      {"f4808080", 4, 0x100000},
      {"f48fbfbf", 4, 0x10ffff},
      {"e282ac41", 3, 0x20ac}, /* only the first sequence counts */
      /* overlong forms */
      {"c080", -1, 0},
      {"c1bf", -1, 0},
      {"e08080", -1, 0},
      {"e09fbf", -1, 0},
      {"f0808080", -1, 0},
      {"f08fbfbf", -1, 0},
      /* surrogates U+D800..U+DFFF */
      {"eda080", -1, 0},
      {"edbfbf", -1, 0},
      /* past U+10FFFF */
      {"f4908080", -1, 0},
      {"f4bfbfbf", -1, 0},
      {"f5808080", -1, 0},
      {"f7bfbfbf", -1, 0},
      {"f8888080", -1, 0},
      {"fe", -1, 0},
      {"ff", -1, 0},
      /* lone continuation bytes */
      {"80", -1, 0},
      {"bf", -1, 0},
      /* truncated: the maximal subpart is what is there */
      {"c2", -1, 0},
      {"c241", -1, 0},
      {"e2", -1, 0},
      {"e282", -2, 0},
      {"e28241", -2, 0},
      {"f0", -1, 0},
      {"f090", -2, 0},
      {"f09080", -3, 0},
      {"f0908041", -3, 0},
      {"f4", -1, 0},
      {"f48f", -2, 0},
      {"e0a0", -2, 0},
      {"e09f", -1, 0}, /* 9F cannot follow E0: the subpart is E0 alone */
      {"ed9f", -2, 0},
      {"eda0", -1, 0},
  };
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    unsigned char b[16];
    size_t n = unhex(cases[k].bytes, b);
    uint32_t cp = 0xdeadbeef;
    int got = agent_utf8_next((const char *)b, n, &cp);
    if (got != cases[k].next || (got > 0 && cp != cases[k].cp)) {
      fprintf(stderr, "%s: next %d cp %x, wanted %d cp %x\n", cases[k].bytes, got, cp,
              cases[k].next, cases[k].cp);
      exit(1);
    }
    /* the sequence alone is valid; a string starting with a malformed one is not */
    CHECK_EQ_INT(agent_utf8_valid((const char *)b, got > 0 ? (size_t)got : n), got > 0);
  }
  CHECK_EQ_INT(agent_utf8_next("", 0, NULL), 0);
  CHECK_EQ_INT(agent_utf8_valid("", 0), 1);
  /* Unicode 15, Table 3-8: 61 F1 80 80 E1 80 C2 62 80 63 80 BF 64 decodes to
   * 0061 FFFD FFFD FFFD 0062 FFFD 0063 FFFD FFFD 0064. */
  unsigned char in[16], out[64], want[64];
  size_t n = unhex("61f18080e180c262806380bf64", in);
  size_t wn = unhex("61efbfbdefbfbdefbfbd62efbfbd63efbfbdefbfbd64", want);
  size_t on = decode_replace(in, n, out);
  CHECK_MEM_EQ(out, on, want, wn);
  TEST_LOG("table: %zu cases and Table 3-8", sizeof cases / sizeof cases[0]);
}

/* (b) every 1..3-byte string of non-NUL bytes, and 4-byte strings over boundary values. */
static void check_exhaustive(void) {
  unsigned char s[5];
  long count = 0, valid = 0;
  for (int len = 1; len <= 3; len++) {
    long total = 1;
    for (int k = 0; k < len; k++) total *= 255;
    for (long x = 0; x < total; x++) {
      long y = x;
      for (int k = 0; k < len; k++, y /= 255) s[k] = (unsigned char)(1 + y % 255);
      s[len] = 0;
      int a = agent_utf8_valid((const char *)s, (size_t)len), b = valid_utf8((const char *)s);
      if (a != b) {
        fprintf(stderr, "len %d %02x %02x %02x: agent %d, reference %d\n", len, s[0], s[1], s[2], a,
                b);
        exit(1);
      }
      count++;
      valid += a;
    }
  }
  static const unsigned char cont[] = {0x7f, 0x80, 0x81, 0x8f, 0x90, 0x9f, 0xa0, 0xbf, 0xc0, 0xff};
  for (unsigned lead = 0xf0; lead <= 0xf7; lead++)
    for (unsigned b1 = 1; b1 < 256; b1++)
      for (size_t i = 0; i < sizeof cont; i++)
        for (size_t j = 0; j < sizeof cont; j++) {
          s[0] = (unsigned char)lead, s[1] = (unsigned char)b1, s[2] = cont[i], s[3] = cont[j];
          s[4] = 0;
          int a = agent_utf8_valid((const char *)s, 4), b = valid_utf8((const char *)s);
          if (a != b) {
            fprintf(stderr, "%02x %02x %02x %02x: agent %d, reference %d\n", s[0], s[1], s[2], s[3],
                    a, b);
            exit(1);
          }
          count++;
          valid += a;
        }
  TEST_LOG("exhaustive: %ld strings, %ld valid, agree with testlib/utf8.h", count, valid);
  CHECK(valid > 1000000); /* the comparison saw both answers */
}

/* (c) CPython on random bytes: one line per string, "hex" in, "valid hex" out. */
static uint64_t g_draw;
static uint64_t rnd(void) { return tdist_test_rand(13, 0, g_draw++); } /* testlib: seeded */

static unsigned char pick_byte(void) {
  static const unsigned char interesting[] = {0x00, 0x41, 0x7f, 0x80, 0x8f, 0x90, 0x9f, 0xa0, 0xbf,
                                              0xc0, 0xc1, 0xc2, 0xdf, 0xe0, 0xe1, 0xec, 0xed, 0xee,
                                              0xef, 0xf0, 0xf1, 0xf3, 0xf4, 0xf5, 0xf8, 0xfe, 0xff};
  uint64_t r = rnd();
  if (r % 4 == 0) return (unsigned char)(r >> 8);
  if (r % 4 == 1) return (unsigned char)(0x80 | ((r >> 8) & 0x3f)); /* continuation */
  return interesting[(r >> 8) % sizeof interesting];
}

static size_t r_index(size_t n) { return (size_t)(rnd() % n); }

#define NRANDOM 20000
#define MAXLEN 24

static void check_python(void) {
  const char *tmp = getenv("TEST_TMPDIR");
  char in_path[512], cmd[1400];
  snprintf(in_path, sizeof in_path, "%s/utf8_in.txt", tmp ? tmp : "/tmp");
  static unsigned char strs[NRANDOM][MAXLEN];
  static size_t lens[NRANDOM];
  FILE *f = fopen(in_path, "w");
  CHECK(f != NULL);
  for (int k = 0; k < NRANDOM; k++) {
    lens[k] = (size_t)(rnd() % MAXLEN) + 1;
    for (size_t i = 0; i < lens[k]; i++) strs[k][i] = pick_byte();
    if (k % 2) { /* a third of these stay well-formed: code points near the boundaries */
      static const uint32_t edges[] = {0x7f,   0x80,   0x7ff,   0x800,   0xd7ff,
                                       0xe000, 0xffff, 0x10000, 0x10ffff};
      size_t i = 0;
      while (i + 4 <= lens[k]) {
        uint64_t r = rnd();
        uint32_t cp = r % 2 ? edges[(r >> 8) % 9] : (uint32_t)((r >> 8) % 0x110000);
        if (cp >= 0xd800 && cp <= 0xdfff) cp = 0x41;
        i += agent_utf8_put((char *)strs[k] + i, cp);
      }
      lens[k] = i ? i : lens[k];
      if (k % 3 == 0 && i) strs[k][(r_index(i))] ^= 0x40; /* then flip a bit in a third of them */
    }
    for (size_t i = 0; i < lens[k]; i++) fprintf(f, "%02x", strs[k][i]);
    fputc('\n', f);
  }
  CHECK(fclose(f) == 0);
  const char *py = access("/usr/bin/python3", X_OK) == 0 ? "/usr/bin/python3" : "python3";
  snprintf(cmd, sizeof cmd,
           "%s -c 'import sys\n"
           "for line in open(sys.argv[1]):\n"
           "    b = bytes.fromhex(line.strip())\n"
           "    try:\n"
           "        b.decode(\"utf-8\"); ok = 1\n"
           "    except UnicodeDecodeError:\n"
           "        ok = 0\n"
           "    print(ok, b.decode(\"utf-8\", \"replace\").encode(\"utf-8\").hex())\n' %s",
           py, in_path);
  FILE *p = popen(cmd, "r");
  CHECK(p != NULL);
  char line[512];
  int k = 0, nvalid = 0;
  for (; k < NRANDOM && fgets(line, sizeof line, p); k++) {
    int ok;
    char hex[400];
    int fields = sscanf(line, "%d %399s", &ok, hex);
    CHECK(fields >= 1);
    if (fields == 1) hex[0] = '\0';
    unsigned char want[200], got[200];
    size_t wn = unhex(hex, want);
    size_t gn = decode_replace(strs[k], lens[k], got);
    int valid = agent_utf8_valid((const char *)strs[k], lens[k]);
    if (valid != ok || gn != wn || memcmp(got, want, gn)) {
      fprintf(stderr, "string %d (", k);
      for (size_t i = 0; i < lens[k]; i++) fprintf(stderr, "%02x", strs[k][i]);
      fprintf(stderr, "): agent valid %d, python %d; python replaced: %s\n", valid, ok, hex);
      exit(1);
    }
    nvalid += ok;
  }
  int rc = pclose(p);
  CHECK_EQ_INT(k, NRANDOM); /* python answered for every string */
  CHECK_EQ_INT(rc, 0);
  CHECK(nvalid > 100 && nvalid < NRANDOM - 100); /* both kinds were compared */
  TEST_LOG("python: %d random strings (%d valid) decode as CPython's decoder does", k, nvalid);
}

/* The encoder round trips every code point, with the length of Table 3-7. */
static void check_put(void) {
  for (uint32_t cp = 0; cp < 0x110000; cp++) {
    char o[4];
    size_t n = agent_utf8_put(o, cp);
    if (cp >= 0xd800 && cp <= 0xdfff) {
      CHECK_MEM_EQ(o, n, "\xEF\xBF\xBD", 3);
      continue;
    }
    size_t want = cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
    CHECK_EQ_INT(n, want);
    uint32_t back = 0;
    CHECK_EQ_INT(agent_utf8_next(o, n, &back), (long long)n);
    CHECK_EQ_INT(back, cp);
    char z[5] = {0};
    memcpy(z, o, n);
    if (cp) CHECK_EQ_INT(valid_utf8(z), 1);
  }
  TEST_LOG("encoder: every code point round trips");
}

int main(void) {
  check_table();
  check_exhaustive();
  check_python();
  check_put();
  TEST_LOG("ok");
  return 0;
}
