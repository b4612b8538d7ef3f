/* tdist-agent's environment parameters: the table of every TDIST_* variable the agent itself
 * reads (besides TDIST_<FLAG>, its flags' environment names: config/config_opts.c), with its
 * type, default, range or allowed values and one line of help; on the engine libtdist's table
 * (runtime/common/param.h) uses too (envparam/envparam.h), without including libtdist's table:
 * the library reads its own variables in the agent's process (TDIST_LOG_LEVEL for its log lines
 * too), the agent reads these.
 *
 * Each variable is read at its first use and cached for the life of the process (thread-safe).
 * An empty value counts as unset. A bad value is never replaced by the default in silence: the
 * getters return the default so that logging keeps working, but agent_param_error() holds a
 * message naming the variable, the value and what is allowed, and main() refuses to start with
 * it (exit 64). Every read is logged at debug level ("param: TDIST_X=value"). Nothing else in
 * operator-agent/ calls getenv() for a TDIST_* name (//tests/common:param_tree_test checks). */
#ifndef TDIST_AGENT_PARAM_H
#define TDIST_AGENT_PARAM_H

#include <stddef.h>

#include "envparam/envparam.h"

/* The types, definitions and values of the engine both tables use (envparam/envparam.h). */
typedef envparam_type_t agent_param_type_t;
#define AGENT_PARAM_INT ENVPARAM_INT       /* decimal integer in min..max */
#define AGENT_PARAM_DOUBLE ENVPARAM_DOUBLE /* decimal number in min..max */
#define AGENT_PARAM_ENUM ENVPARAM_ENUM     /* one of choices, case-insensitive: the index */
#define AGENT_PARAM_STR ENVPARAM_STR       /* any text of min..max bytes */

#define AGENT_PARAM_PATH_MAX_LEN ENVPARAM_STR_MAX

/* X(ID, type, default, default as documented (NULL: the default itself), min, max, choices,
 *   help). The variable is TDIST_<ID>. A name also in libtdist's table (LOG_LEVEL) must have the
 * same default and choices there (//tests/common:param_doc checks); the README lists it once. */
/* clang-format off */
#define AGENT_PARAMS(X)                                                                           \
  X(LOG_LEVEL, ENUM, "info", NULL, 0, 0, "error|warn|warning|info|debug",                         \
    "Log level of tdist-agent on stderr (warning = warn).")                                       \
  X(PYTHON, STR, "python3", NULL, 1, AGENT_PARAM_PATH_MAX_LEN, NULL,                              \
    "Interpreter tdist-agent runs a worker command ending in .py with (as PYTHON -u x.py).")      \
  X(STALL_REPORT_SECONDS, DOUBLE, "5", NULL, 0.001, 86400, NULL,                                  \
    "Seconds a collective may be in flight before tdist-agent reports its group as stuck.")      \
  X(KUBE_API_URL, STR, NULL, "https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT", 1, 511, \
    NULL, "Kubernetes API server tdist-agent calls for --jobset-in-place-restart (for tests).")   \
  X(KUBE_SA_DIR, STR, "/var/run/secrets/kubernetes.io/serviceaccount", NULL, 1, 511, NULL,        \
    "Directory with the service account's token, ca.crt and namespace (--jobset-in-place-restart).") \
  X(PROGRESS_DEADLINE_SECONDS, DOUBLE, "0", "0 (off)", 0, 86400, NULL,                            \
    "Seconds a worker may go without progress (no byte read or written, no collective done) before tdist-agent names it as hung.")                                                        \
  X(NVML_LIBRARY, STR, "libnvidia-ml.so.1", NULL, 1, AGENT_PARAM_PATH_MAX_LEN, NULL,              \
    "The NVML library tdist-agent opens for the workers' GPU metrics (absent: no GPU series).")    \
  X(RANK_METRICS, INT, "1", NULL, 0, 1, NULL,                                                     \
    "0: tdist-agent does not sample its workers' /proc (no tdist_rank_* process series, no hang reports but libtdist's).")  \
  X(PY_STACKS, INT, "1", NULL, 0, 1, NULL,                                                        \
    "0: tdist-agent neither puts its sitecustomize.py on the workers' PYTHONPATH nor takes Python stacks for hang reports.")
/* clang-format on */

typedef enum {
#define AGENT_PARAM_ENUM_ROW(id, ...) AGENT_P_##id,
  AGENT_PARAMS(AGENT_PARAM_ENUM_ROW)
#undef AGENT_PARAM_ENUM_ROW
      AGENT_P_COUNT_
} agent_param_id_t;

typedef envparam_def_t agent_param_def_t; /* scope: 0 (the agent is the one reader) */

extern const agent_param_def_t agent_params[AGENT_P_COUNT_];

typedef envparam_value_t agent_param_value_t;

/* Parses text as parameter id would be: 0 and *out set, or -1 and a message naming the variable,
 * the value and what is allowed in err. Pure. */
int agent_param_parse(agent_param_id_t id, const char *text, agent_param_value_t *out, char *err,
                      size_t cap);

/* The variable's value, read from the environment once. When it is unset, empty or bad, the
 * default (0 or NULL where there is none). */
long long agent_param_int(agent_param_id_t id); /* INT and ENUM */
double agent_param_double(agent_param_id_t id);
const char *agent_param_str(agent_param_id_t id);
/* NULL, or the message for a bad value ("TDIST_PYTHON='' ..."). */
const char *agent_param_error(agent_param_id_t id);
/* The first error among every row, in table order; NULL when all are good. */
const char *agent_param_first_error(void);

#endif
