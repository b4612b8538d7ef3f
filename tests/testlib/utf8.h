/* Strict UTF-8 check for tests and fuzz targets: no overlong forms, surrogates or code points past
 * U+10FFFF. Header-only (also compiled outside Bazel by tests/fuzz/run_libfuzzer.sh). */
#ifndef TDIST_TESTLIB_UTF8_H
#define TDIST_TESTLIB_UTF8_H

#include <stddef.h>
#include <stdint.h>

static inline int valid_utf8(const char *s) {
  const unsigned char *p = (const unsigned char *)s;
  while (*p) {
    unsigned c = *p;
    size_t n;
    uint32_t cp, min;
    if (c < 0x80) {
      p++;
      continue;
    }
    if ((c & 0xE0) == 0xC0)
      n = 2, cp = c & 0x1F, min = 0x80;
    else if ((c & 0xF0) == 0xE0)
      n = 3, cp = c & 0x0F, min = 0x800;
    else if ((c & 0xF8) == 0xF0)
      n = 4, cp = c & 0x07, min = 0x10000;
    else
      return 0;
    for (size_t i = 1; i < n; i++) {
      if ((p[i] & 0xC0) != 0x80) return 0;
      cp = cp << 6 | (p[i] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
    p += n;
  }
  return 1;
}

#endif
