/* See param.h. libtdist's table and its read-once cache, on the engine both programs share
 * (envparam/envparam.h: the parser, the cache, the messages). Never allocates. */
#include "runtime/common/param.h"

#include <pthread.h>
#include <stdatomic.h>

#include "runtime/common/log.h"

const tdist__param_def_t tdist__params[TDIST__P_COUNT_] = {
#define TDIST__PARAM_DEF_ROW(id, type, dflt, doc, lo, hi, choices, scope, help) \
  [TDIST__P_##id] = {"TDIST_" #id, TDIST__PARAM_##type, dflt, doc, lo, hi, choices, scope, help},
    TDIST__PARAMS(TDIST__PARAM_DEF_ROW)
#undef TDIST__PARAM_DEF_ROW
};

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static _Atomic int g_loaded[TDIST__P_COUNT_];
static envparam_slot_t g_slots[TDIST__P_COUNT_];

/* The first read of each variable, logged after the slot is published and the lock released:
 * logging reads TDIST_LOG_LEVEL through here, which must find itself loaded. */
static void debug_line(const char *line) { tdist__log(TDIST__LOG_DEBUG, "param", "%s", line); }

static const envparam_table_t g_table = {tdist__params, TDIST__P_COUNT_, g_slots,
                                         g_loaded,      &g_mu,           debug_line};

int tdist__param_parse(tdist__param_id_t id, const char *text, tdist__param_value_t *out, char *err,
                       size_t cap) {
  return envparam_parse(&tdist__params[id], text, out, err, cap);
}

static const envparam_slot_t *get(tdist__param_id_t id) { return envparam_get(&g_table, (int)id); }

long long tdist__param_int(tdist__param_id_t id) { return get(id)->v.i; }
double tdist__param_double(tdist__param_id_t id) { return get(id)->v.d; }
const char *tdist__param_str(tdist__param_id_t id) { return get(id)->v.s; }
int tdist__param_is_set(tdist__param_id_t id) { return get(id)->set; }

const char *tdist__param_error(tdist__param_id_t id) {
  const envparam_slot_t *s = get(id);
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
