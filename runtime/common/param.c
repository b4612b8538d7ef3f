/* See param.h. The table, its parser and the read-once cache. The only file of the project that
 * reads a TDIST_* variable with getenv(). Never allocates. */
#include "runtime/common/param.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "runtime/common/log.h"

const tdist__param_def_t tdist__params[TDIST__P_COUNT_] = {
#define TDIST__PARAM_DEF_ROW(id, type, dflt, doc, lo, hi, choices, scope, help) \
  [TDIST__P_##id] = {"TDIST_" #id, TDIST__PARAM_##type, dflt, doc, lo, hi, choices, scope, help},
    TDIST__PARAMS(TDIST__PARAM_DEF_ROW)
#undef TDIST__PARAM_DEF_ROW
};

#define ERR_MAX 320
#define SHOWN_MAX 64 /* bytes of a bad value quoted in a message */

typedef struct {
  int set; /* set to a valid value */
  int bad; /* set to a bad value: err holds the message */
  tdist__param_value_t v;
  char err[ERR_MAX];
  char text[TDIST__PATH_MAX_LEN + 1]; /* STR: a copy, so that a later setenv cannot move it */
} slot_t;

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static _Atomic int g_loaded[TDIST__P_COUNT_];
static slot_t g_slots[TDIST__P_COUNT_];

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

static int fmt_range(char *buf, size_t cap, const tdist__param_def_t *d) {
  if (d->type == TDIST__PARAM_INT) return snprintf(buf, cap, "%.0f..%.0f", d->min, d->max);
  return snprintf(buf, cap, "%g..%g", d->min, d->max);
}

int tdist__param_parse(tdist__param_id_t id, const char *text, tdist__param_value_t *out, char *err,
                       size_t cap) {
  const tdist__param_def_t *d = &tdist__params[id];
  char q[SHOWN_MAX + 8], range[64];
  memset(out, 0, sizeof *out);
  shown(text, q, sizeof q);
  fmt_range(range, sizeof range, d);
  char *end = NULL;
  errno = 0;
  /* strtoll and strtod skip leading white space: numbers must not have any. */
  int space = text[0] == ' ' || (text[0] >= '\t' && text[0] <= '\r');
  switch (d->type) {
    case TDIST__PARAM_INT: {
      long long x = strtoll(text, &end, 10);
      if (space || end == text || *end || errno || (double)x < d->min || (double)x > d->max) {
        snprintf(err, cap, "%s='%s' is not an integer in %s", d->name, q, range);
        return -1;
      }
      out->i = x;
      return 0;
    }
    case TDIST__PARAM_DOUBLE: {
      double x = strtod(text, &end);
      if (space || end == text || *end || errno || !isfinite(x) || x < d->min || x > d->max) {
        snprintf(err, cap, "%s='%s' is not a number in %s", d->name, q, range);
        return -1;
      }
      out->d = x;
      return 0;
    }
    case TDIST__PARAM_ENUM: {
      long long k = choice_index(d->choices, text);
      if (k < 0) {
        snprintf(err, cap, "%s='%s' is not one of %s", d->name, q, d->choices);
        return -1;
      }
      out->i = k;
      return 0;
    }
    case TDIST__PARAM_STR: {
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
static int load(tdist__param_id_t id) {
  if (atomic_load_explicit(&g_loaded[id], memory_order_acquire)) return 0;
  int did = 0;
  pthread_mutex_lock(&g_mu);
  if (!atomic_load_explicit(&g_loaded[id], memory_order_relaxed)) {
    slot_t *s = &g_slots[id];
    const char *v = getenv(tdist__params[id].name);
    const char *text = v && *v ? v : tdist__params[id].dflt;
    if (text && tdist__param_parse(id, text, &s->v, s->err, sizeof s->err) != 0) {
      s->bad = 1;
      /* A bad value reads as the default (every default in the table parses). */
      char scratch[ERR_MAX];
      text = tdist__params[id].dflt;
      if (!text || tdist__param_parse(id, text, &s->v, scratch, sizeof scratch) != 0) {
        memset(&s->v, 0, sizeof s->v);
        text = NULL;
      }
    }
    if (text && tdist__params[id].type == TDIST__PARAM_STR) {
      snprintf(s->text, sizeof s->text, "%s", text); /* fits: the length was checked */
      s->v.s = s->text;
    }
    s->set = v && *v && !s->bad;
    atomic_store_explicit(&g_loaded[id], 1, memory_order_release);
    did = 1;
  }
  pthread_mutex_unlock(&g_mu);
  return did;
}

/* Logs the read after the slot is published and the lock released: logging reads
 * TDIST_LOG_LEVEL through here, which must find itself loaded. */
static const slot_t *get(tdist__param_id_t id) {
  if (load(id)) {
    const tdist__param_def_t *d = &tdist__params[id];
    const slot_t *s = &g_slots[id];
    if (s->bad)
      tdist__log(TDIST__LOG_DEBUG, "param", "%s", s->err);
    else if (s->set)
      tdist__log(TDIST__LOG_DEBUG, "param", "%s=%s", d->name, getenv(d->name));
    else
      tdist__log(TDIST__LOG_DEBUG, "param", "%s unset: default %s", d->name,
                 d->dflt_doc ? d->dflt_doc
                 : d->dflt   ? d->dflt
                             : "none");
  }
  return &g_slots[id];
}

long long tdist__param_int(tdist__param_id_t id) { return get(id)->v.i; }
double tdist__param_double(tdist__param_id_t id) { return get(id)->v.d; }
const char *tdist__param_str(tdist__param_id_t id) { return get(id)->v.s; }
int tdist__param_is_set(tdist__param_id_t id) { return get(id)->set; }

const char *tdist__param_error(tdist__param_id_t id) {
  const slot_t *s = get(id);
  return s->bad ? s->err : NULL;
}

const char *tdist__param_first_error(const tdist__param_id_t *ids, size_t n, unsigned scope) {
  if (ids) {
    for (size_t i = 0; i < n; i++) {
      const char *e = tdist__param_error(ids[i]);
      if (e) return e;
    }
    return NULL;
  }
  for (int id = 0; id < TDIST__P_COUNT_; id++) {
    if (!(tdist__params[id].scope & scope)) continue;
    const char *e = tdist__param_error((tdist__param_id_t)id);
    if (e) return e;
  }
  return NULL;
}
