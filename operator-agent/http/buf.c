/* See buf.h. Never writes past the bound and never emits invalid UTF-8. */
#include "operator-agent/http/buf.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "operator-agent/common/utf8.h"

void agent_buf_init(agent_buf_t *b) { memset(b, 0, sizeof *b); }

/* Makes room for n more bytes plus a NUL. */
static int reserve(agent_buf_t *b, size_t n) {
  if (b->failed) return 0;
  if (n > AGENT_BUF_MAX || b->len + n + 1 > AGENT_BUF_MAX) {
    b->failed = 1;
    return 0;
  }
  size_t need = b->len + n + 1;
  if (need <= b->cap) return 1;
  size_t cap = b->cap ? b->cap : 4096;
  while (cap < need) cap *= 2;
  if (cap > AGENT_BUF_MAX) cap = AGENT_BUF_MAX;
  char *p = realloc(b->p, cap);
  if (!p) {
    b->failed = 1;
    return 0;
  }
  b->p = p;
  b->cap = cap;
  return 1;
}

void agent_buf_put(agent_buf_t *b, const char *s, size_t n) {
  if (!reserve(b, n)) return;
  memcpy(b->p + b->len, s, n);
  b->len += n;
  b->p[b->len] = '\0';
}

void agent_buf_puts(agent_buf_t *b, const char *s) { agent_buf_put(b, s, strlen(s)); }

void agent_buf_printf(agent_buf_t *b, const char *fmt, ...) {
  char small[256];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(small, sizeof small, fmt, ap);
  va_end(ap);
  if (n < 0) {
    b->failed = 1;
    return;
  }
  if ((size_t)n < sizeof small) {
    agent_buf_put(b, small, (size_t)n);
    return;
  }
  if (!reserve(b, (size_t)n)) return;
  va_start(ap, fmt);
  vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap);
  va_end(ap);
  b->len += (size_t)n;
}

void agent_buf_double(agent_buf_t *b, double v) {
  if (isnan(v)) {
    agent_buf_puts(b, "NaN");
    return;
  }
  if (isinf(v)) {
    agent_buf_puts(b, v > 0 ? "+Inf" : "-Inf");
    return;
  }
  /* The C locale is assumed (the agent never calls setlocale), so the decimal point is '.'. */
  char s[40];
  for (int prec = 1; prec <= 17; prec++) {
    snprintf(s, sizeof s, "%.*g", prec, v);
    if (strtod(s, NULL) == v) break;
  }
  /* %g switches to an exponent once the exponent reaches the precision: "1.2e+02" for 120.
   * Integers below 1e17 read better (and make stabler le="" labels) in plain digits. */
  const char *e = strchr(s, 'e');
  if (e) {
    int exp10 = atoi(e + 1);
    if (exp10 >= 0 && exp10 < 17) snprintf(s, sizeof s, "%.*g", exp10 + 1, v);
  }
  agent_buf_puts(b, s);
}

static const char kReplacement[] = "\xEF\xBF\xBD"; /* U+FFFD */

void agent_buf_json_str(agent_buf_t *b, const char *str, size_t max) {
  const unsigned char *s = (const unsigned char *)str;
  size_t n = str ? strnlen(str, max) : 0;
  agent_buf_put(b, "\"", 1);
  size_t i = 0;
  while (i < n) {
    unsigned c = s[i];
    if (c == '"' || c == '\\') {
      char e[2] = {'\\', (char)c};
      agent_buf_put(b, e, 2);
      i++;
    } else if (c < 0x20) {
      switch (c) {
        case '\n': agent_buf_puts(b, "\\n"); break;
        case '\r': agent_buf_puts(b, "\\r"); break;
        case '\t': agent_buf_puts(b, "\\t"); break;
        default: agent_buf_printf(b, "\\u%04x", c); break;
      }
      i++;
    } else {
      int l = agent_utf8_next(str + i, n - i, NULL); /* < 0: malformed */
      if (l < 0) {
        agent_buf_put(b, kReplacement, 3);
        i += (size_t)-l;
      } else {
        agent_buf_put(b, str + i, (size_t)l);
        i += (size_t)l;
      }
    }
  }
  agent_buf_put(b, "\"", 1);
}

void agent_buf_prom_label(agent_buf_t *b, const char *str) {
  const unsigned char *s = (const unsigned char *)str;
  size_t n = strlen(str);
  size_t i = 0;
  while (i < n) {
    unsigned c = s[i];
    if (c == '"' || c == '\\') {
      char e[2] = {'\\', (char)c};
      agent_buf_put(b, e, 2);
      i++;
    } else if (c == '\n') {
      agent_buf_puts(b, "\\n");
      i++;
    } else if (c < 0x20 || c == 0x7f) {
      agent_buf_put(b, " ", 1);
      i++;
    } else {
      int l = agent_utf8_next(str + i, n - i, NULL); /* < 0: malformed */
      if (l < 0) {
        agent_buf_put(b, kReplacement, 3);
        i += (size_t)-l;
      } else {
        agent_buf_put(b, str + i, (size_t)l);
        i += (size_t)l;
      }
    }
  }
}

char *agent_buf_finish(agent_buf_t *b, size_t *len) {
  char *p = NULL;
  if (!b->failed && reserve(b, 0)) {
    p = b->p;
    if (len) *len = b->len;
  } else {
    free(b->p);
    if (len) *len = 0;
  }
  agent_buf_init(b);
  return p;
}
