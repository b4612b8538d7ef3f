/* See param.h. The agent's table and its read-once cache, on the engine libtdist's table uses too
 * (envparam/envparam.h: the parser, the cache, the messages), so the messages are libtdist's word
 * for word; the flags' TDIST_<FLAG> names are read by config/. Never allocates. */
#include "operator-agent/common/param.h"

#include <pthread.h>
#include <stdatomic.h>

#include "operator-agent/common/log.h"

const agent_param_def_t agent_params[AGENT_P_COUNT_] = {
#define AGENT_PARAM_DEF_ROW(id, type, dflt, doc, lo, hi, choices, help) \
  [AGENT_P_##id] = {"TDIST_" #id, AGENT_PARAM_##type, dflt, doc, lo, hi, choices, 0, help},
    AGENT_PARAMS(AGENT_PARAM_DEF_ROW)
#undef AGENT_PARAM_DEF_ROW
};

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static _Atomic int g_loaded[AGENT_P_COUNT_];
static envparam_slot_t g_slots[AGENT_P_COUNT_];

/* The first read of each variable, logged after the slot is published and the lock released:
 * logging reads TDIST_LOG_LEVEL through here, which must find itself loaded. */
static void debug_line(const char *line) { AGENT_DEBUG("param: %s", line); }

static const envparam_table_t g_table = {agent_params, AGENT_P_COUNT_, g_slots,
                                         g_loaded,     &g_mu,          debug_line};

int agent_param_parse(agent_param_id_t id, const char *text, agent_param_value_t *out, char *err,
                      size_t cap) {
  return envparam_parse(&agent_params[id], text, out, err, cap);
}

static const envparam_slot_t *get(agent_param_id_t id) { return envparam_get(&g_table, (int)id); }

long long agent_param_int(agent_param_id_t id) { return get(id)->v.i; }
double agent_param_double(agent_param_id_t id) { return get(id)->v.d; }
const char *agent_param_str(agent_param_id_t id) { return get(id)->v.s; }

const char *agent_param_error(agent_param_id_t id) {
  const envparam_slot_t *s = get(id);
  return s->bad ? s->err : NULL;
}

const char *agent_param_first_error(void) {
  for (int id = 0; id < AGENT_P_COUNT_; id++) {
    const char *e = agent_param_error((agent_param_id_t)id);
    if (e) return e;
  }
  return NULL;
}
