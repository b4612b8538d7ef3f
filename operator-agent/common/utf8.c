/* See utf8.h. The ranges are those of Unicode Table 3-7 (well-formed UTF-8 byte sequences). */
#include "operator-agent/common/utf8.h"

int agent_utf8_next(const char *str, size_t n, uint32_t *cp) {
  const unsigned char *s = (const unsigned char *)str;
  if (n == 0) return 0;
  unsigned c = s[0];
  if (c < 0x80) {
    if (cp) *cp = c;
    return 1;
  }
  int len;
  unsigned lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
  uint32_t v;
  if (c >= 0xC2 && c <= 0xDF) {
    len = 2, v = c & 0x1F;
  } else if (c >= 0xE0 && c <= 0xEF) {
    len = 3, v = c & 0x0F;
    if (c == 0xE0) lo = 0xA0; /* else overlong */
    if (c == 0xED) hi = 0x9F; /* else a surrogate */
  } else if (c >= 0xF0 && c <= 0xF4) {
    len = 4, v = c & 0x07;
    if (c == 0xF0) lo = 0x90; /* else overlong */
    if (c == 0xF4) hi = 0x8F; /* else past U+10FFFF */
  } else {
    return -1; /* 80..C1 (continuation, overlong lead) or F5..FF */
  }
  if (n < 2 || s[1] < lo || s[1] > hi) return -1;
  v = v << 6 | (s[1] & 0x3F);
  for (int i = 2; i < len; i++) {
    if ((size_t)i >= n || s[i] < 0x80 || s[i] > 0xBF) return -i;
    v = v << 6 | (s[i] & 0x3F);
  }
  if (cp) *cp = v;
  return len;
}

int agent_utf8_valid(const char *s, size_t n) {
  for (size_t i = 0; i < n;) {
    int l = agent_utf8_next(s + i, n - i, NULL);
    if (l <= 0) return 0;
    i += (size_t)l;
  }
  return 1;
}

size_t agent_utf8_put(char *o, uint32_t cp) {
  if (cp >= 0xD800 && cp <= 0xDFFF) cp = 0xFFFD;
  if (cp < 0x80) {
    o[0] = (char)cp;
    return 1;
  }
  if (cp < 0x800) {
    o[0] = (char)(0xC0 | (cp >> 6));
    o[1] = (char)(0x80 | (cp & 0x3F));
    return 2;
  }
  if (cp < 0x10000) {
    o[0] = (char)(0xE0 | (cp >> 12));
    o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
    o[2] = (char)(0x80 | (cp & 0x3F));
    return 3;
  }
  o[0] = (char)(0xF0 | (cp >> 18));
  o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
  o[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
  o[3] = (char)(0x80 | (cp & 0x3F));
  return 4;
}
