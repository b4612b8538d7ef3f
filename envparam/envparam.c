/* See envparam.h. */
#include "envparam/envparam.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define SHOWN_MAX 64 /* bytes of a bad value quoted in a message */

/* The value as quoted in a message: at most SHOWN_MAX bytes, control bytes as '?'. */
static void shown(const char *text, char *buf, size_t cap) {
  size_t n = 0, len = strlen(text);
  for (; n < len && n < SHOWN_MAX && n + 4 < cap; n++)
    buf[n] = (unsigned char)text[n] < 0x20 || text[n] == 0x7f ? '?' : text[n];
  if (n < len && n + 4 <= cap) {
    memcpy(buf + n, "...", 3);
    n += 3;
  }
  buf[n] = '\0';
}

/* Index of text among the '|'-separated choices (case-insensitive), or -1. */
static long long choice_index(const char *choices, const char *text) {
  size_t tl = strlen(text);
  long long k = 0;
  for (const char *p = choices; *p; k++) {
    const char *bar = strchr(p, '|');
    size_t l = bar ? (size_t)(bar - p) : strlen(p);
    if (l == tl && strncasecmp(p, text, l) == 0) return k;
    if (!bar) break;
    p = bar + 1;
  }
  return -1;
}

static int fmt_range(char *buf, size_t cap, const envparam_def_t *d) {
  if (d->type == ENVPARAM_INT) return snprintf(buf, cap, "%.0f..%.0f", d->min, d->max);
  return snprintf(buf, cap, "%g..%g", d->min, d->max);
}

int envparam_parse(const envparam_def_t *d, const char *text, envparam_value_t *out, char *err,
                   size_t cap) {
  char q[SHOWN_MAX + 8], range[64];
  memset(out, 0, sizeof *out);
  shown(text, q, sizeof q);
  fmt_range(range, sizeof range, d);
  char *end = NULL;
  errno = 0;
  /* strtoll and strtod skip leading white space: numbers must not have any. */
  int space = text[0] == ' ' || (text[0] >= '\t' && text[0] <= '\r');
  switch (d->type) {
    case ENVPARAM_INT: {
      long long x = strtoll(text, &end, 10);
      if (space || end == text || *end || errno || (double)x < d->min || (double)x > d->max) {
        snprintf(err, cap, "%s='%s' is not an integer in %s", d->name, q, range);
        return -1;
      }
      out->i = x;
      return 0;
    }
    case ENVPARAM_DOUBLE: {
      double x = strtod(text, &end);
      if (space || end == text || *end || errno || !isfinite(x) || x < d->min || x > d->max) {
        snprintf(err, cap, "%s='%s' is not a number in %s", d->name, q, range);
        return -1;
      }
      out->d = x;
      return 0;
    }
    case ENVPARAM_ENUM: {
      long long k = choice_index(d->choices, text);
      if (k < 0) {
        snprintf(err, cap, "%s='%s' is not one of %s", d->name, q, d->choices);
        return -1;
      }
      out->i = k;
      return 0;
    }
    case ENVPARAM_STR: {
      size_t l = strlen(text);
      if ((double)l < d->min || (double)l > d->max) {
        snprintf(err, cap, "%s='%s' is %zu bytes long; at most %.0f are allowed", d->name, q, l,
                 d->max);
        return -1;
      }
      out->s = text;
      return 0;
    }
  }
  snprintf(err, cap, "%s: unknown parameter type", d->name);
  return -1;
}

/* Reads and parses the variable once; returns 1 for the call that did. */
static int load(const envparam_table_t *t, int id) {
  if (atomic_load_explicit(&t->loaded[id], memory_order_acquire)) return 0;
  int did = 0;
  const envparam_def_t *d = &t->defs[id];
  pthread_mutex_lock(t->mu);
  if (!atomic_load_explicit(&t->loaded[id], memory_order_relaxed)) {
    envparam_slot_t *s = &t->slots[id];
    const char *v = getenv(d->name);
    const char *text = v && *v ? v : d->dflt;
    if (text && envparam_parse(d, text, &s->v, s->err, sizeof s->err) != 0) {
      s->bad = 1;
      /* A bad value reads as the default (every default in a table parses). */
      char scratch[ENVPARAM_ERR_MAX];
      text = d->dflt;
      if (!text || envparam_parse(d, text, &s->v, scratch, sizeof scratch) != 0) {
        memset(&s->v, 0, sizeof s->v);
        text = NULL;
      }
    }
    if (text && d->type == ENVPARAM_STR) {
      snprintf(s->text, sizeof s->text, "%s", text); /* fits: the length was checked */
      s->v.s = s->text;
    }
    s->set = v && *v && !s->bad;
    atomic_store_explicit(&t->loaded[id], 1, memory_order_release);
    did = 1;
  }
  pthread_mutex_unlock(t->mu);
  return did;
}

const envparam_slot_t *envparam_get(const envparam_table_t *t, int id) {
  if (load(t, id) && t->debug) {
    const envparam_def_t *d = &t->defs[id];
    const envparam_slot_t *s = &t->slots[id];
    char line[ENVPARAM_ERR_MAX + ENVPARAM_STR_MAX + 64];
    if (s->bad)
      snprintf(line, sizeof line, "%s", s->err);
    else if (s->set)
      snprintf(line, sizeof line, "%s=%s", d->name, getenv(d->name));
    else
      snprintf(line, sizeof line, "%s unset: default %s", d->name,
               d->dflt_doc ? d->dflt_doc
               : d->dflt   ? d->dflt
                           : "none");
    t->debug(line);
  }
  return &t->slots[id];
}
