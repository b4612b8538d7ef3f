/* See param.h. The agent's table, its parser and the read-once cache; the only file of
 * operator-agent/ that reads a TDIST_* variable with getenv() (the flags' TDIST_<FLAG> names are
 * read by config/). Messages are those of libtdist's table, word for word. Never allocates. */
#include "operator-agent/common/param.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "operator-agent/common/log.h"

const agent_param_def_t agent_params[AGENT_P_COUNT_] = {
#define AGENT_PARAM_DEF_ROW(id, type, dflt, doc, lo, hi, choices, help) \
  [AGENT_P_##id] = {"TDIST_" #id, AGENT_PARAM_##type, dflt, doc, lo, hi, choices, help},
    AGENT_PARAMS(AGENT_PARAM_DEF_ROW)
#undef AGENT_PARAM_DEF_ROW
};

#define ERR_MAX 320
#define SHOWN_MAX 64 /* bytes of a bad value quoted in a message */

typedef struct {
  int set; /* set to a valid value */
  int bad; /* set to a bad value: err holds the message */
  agent_param_value_t v;
  char err[ERR_MAX];
  char text[AGENT_PARAM_PATH_MAX_LEN + 1]; /* STR: a copy, so that a later setenv cannot move it */
} slot_t;

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static _Atomic int g_loaded[AGENT_P_COUNT_];
static slot_t g_slots[AGENT_P_COUNT_];

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

static int fmt_range(char *buf, size_t cap, const agent_param_def_t *d) {
  if (d->type == AGENT_PARAM_INT) return snprintf(buf, cap, "%.0f..%.0f", d->min, d->max);
  return snprintf(buf, cap, "%g..%g", d->min, d->max);
}

int agent_param_parse(agent_param_id_t id, const char *text, agent_param_value_t *out, char *err,
                      size_t cap) {
  const agent_param_def_t *d = &agent_params[id];
  char q[SHOWN_MAX + 8], range[64];
  memset(out, 0, sizeof *out);
  shown(text, q, sizeof q);
  fmt_range(range, sizeof range, d);
  char *end = NULL;
  errno = 0;
  /* strtoll and strtod skip leading white space: numbers must not have any. */
  int space = text[0] == ' ' || (text[0] >= '\t' && text[0] <= '\r');
  switch (d->type) {
    case AGENT_PARAM_INT: {
      long long x = strtoll(text, &end, 10);
      if (space || end == text || *end || errno || (double)x < d->min || (double)x > d->max) {
        snprintf(err, cap, "%s='%s' is not an integer in %s", d->name, q, range);
        return -1;
      }
      out->i = x;
      return 0;
    }
    case AGENT_PARAM_DOUBLE: {
      double x = strtod(text, &end);
      if (space || end == text || *end || errno || !isfinite(x) || x < d->min || x > d->max) {
        snprintf(err, cap, "%s='%s' is not a number in %s", d->name, q, range);
        return -1;
      }
      out->d = x;
      return 0;
    }
    case AGENT_PARAM_ENUM: {
      long long k = choice_index(d->choices, text);
      if (k < 0) {
        snprintf(err, cap, "%s='%s' is not one of %s", d->name, q, d->choices);
        return -1;
      }
      out->i = k;
      return 0;
    }
    case AGENT_PARAM_STR: {
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
static int load(agent_param_id_t id) {
  if (atomic_load_explicit(&g_loaded[id], memory_order_acquire)) return 0;
  int did = 0;
  pthread_mutex_lock(&g_mu);
  if (!atomic_load_explicit(&g_loaded[id], memory_order_relaxed)) {
    slot_t *s = &g_slots[id];
    const char *v = getenv(agent_params[id].name);
    const char *text = v && *v ? v : agent_params[id].dflt;
    if (text && agent_param_parse(id, text, &s->v, s->err, sizeof s->err) != 0) {
      s->bad = 1;
      /* A bad value reads as the default (every default in the table parses). */
      char scratch[ERR_MAX];
      text = agent_params[id].dflt;
      if (!text || agent_param_parse(id, text, &s->v, scratch, sizeof scratch) != 0) {
        memset(&s->v, 0, sizeof s->v);
        text = NULL;
      }
    }
    if (text && agent_params[id].type == AGENT_PARAM_STR) {
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
static const slot_t *get(agent_param_id_t id) {
  if (load(id)) {
    const agent_param_def_t *d = &agent_params[id];
    const slot_t *s = &g_slots[id];
    if (s->bad)
      AGENT_DEBUG("param: %s", s->err);
    else if (s->set)
      AGENT_DEBUG("param: %s=%s", d->name, getenv(d->name));
    else
      AGENT_DEBUG("param: %s unset: default %s", d->name,
                  d->dflt_doc ? d->dflt_doc
                  : d->dflt   ? d->dflt
                              : "none");
  }
  return &g_slots[id];
}

long long agent_param_int(agent_param_id_t id) { return get(id)->v.i; }
double agent_param_double(agent_param_id_t id) { return get(id)->v.d; }
const char *agent_param_str(agent_param_id_t id) { return get(id)->v.s; }

const char *agent_param_error(agent_param_id_t id) {
  const slot_t *s = get(id);
  return s->bad ? s->err : NULL;
}

const char *agent_param_first_error(void) {
  for (int id = 0; id < AGENT_P_COUNT_; id++) {
    const char *e = agent_param_error((agent_param_id_t)id);
    if (e) return e;
  }
  return NULL;
}
