/* Internal to operator-agent/config: the option table that config.c (flags, env, values),
 * config_yaml.c (YAML load and dump) and config_usage.c (--help) share, and the load context that
 * remembers where each setting came from. Nothing outside this package includes it. */
#ifndef TDIST_AGENT_CONFIG_INTERNAL_H
#define TDIST_AGENT_CONFIG_INTERNAL_H

#include <stddef.h>

#include "operator-agent/config/config.h"

typedef enum {
  CFG_NNODES,
  CFG_SPARES,
  CFG_SPARES_IN_NNODES,
  CFG_NPROC,
  CFG_NODE_RANK,
  CFG_MASTER_ADDR,
  CFG_MASTER_PORT,
  CFG_STORE_PROXY,
  CFG_RUN_ID,
  CFG_MAX_RESTARTS,
  CFG_JOBSET_IN_PLACE_RESTART,
  CFG_MONITOR_INTERVAL,
  CFG_STANDALONE,
  CFG_ROLE,
  CFG_BACKEND,
  CFG_RDZV_TIMEOUT,
  CFG_LAST_CALL,
  CFG_HB_INTERVAL,
  CFG_HB_TIMEOUT,
  CFG_STOP_GRACE,
  CFG_SCHEME,
  CFG_MASTER_TEMPLATE,
  CFG_JOB_NAME,
  CFG_SERVICE,
  CFG_NAMESPACE,
  CFG_CLUSTER_DOMAIN,
  CFG_REPLICATED_JOB,
  CFG_TASK,
  CFG_HTTP_HOST,
  CFG_HTTP_PORT,
  CFG_HTTP_PORT_FILE,
  CFG_LOG_DIR,
  CFG_KEEP_RUN_DIR,
  CFG_OMP,
  CFG_LOG_FORMAT,
  CFG_CONFIG,
  CFG_CHECK_CONFIG,
  CFG_HELP,
  CFG_VERSION,
  CFG_NOPTS
} cfg_id_t;

typedef enum {
  CFG_T_NNODES, /* N or MIN:MAX */
  CFG_T_NPROC,  /* N or cpu|gpu|auto */
  CFG_T_INT,    /* [min, max] */
  CFG_T_DUR,    /* seconds, optional unit; min 0 = zero allowed, 1 = must be > 0 */
  CFG_T_BOOL,   /* flag without value; env/YAML true|false|1|0|yes|no */
  CFG_T_STR,    /* see cfg_str_t */
  CFG_T_SCHEME,
  CFG_T_BACKEND,
  CFG_T_LOGFMT,
  CFG_T_ACTION /* --help, --version: flag only */
} cfg_type_t;

typedef enum {
  CFG_S_ID,       /* run id, role: 1..128 of [A-Za-z0-9._:-] */
  CFG_S_HOST,     /* host/DNS-ish names: 1..253 bytes, no blanks or control characters */
  CFG_S_HOST0,    /* like CFG_S_HOST but "" allowed (http_host: all addresses) */
  CFG_S_TEMPLATE, /* 1..1024 bytes, no blanks or control characters */
  CFG_S_PATH      /* 1..4095 bytes, no control characters */
} cfg_str_t;

typedef struct {
  const char *flag;  /* long flag, dash spelling, without "--" */
  const char *flag2; /* a second name for the same setting (rdzv-id), or NULL */
  const char *yaml;  /* YAML key (under discovery: when `discovery`), NULL = not in YAML */
  const char *yaml2; /* an alias key, or NULL */
  int discovery;
  const char *pet;   /* torchrun's PET_* name, or NULL */
  const char *plain; /* a plain variable read last (MASTER_ADDR), or NULL */
  cfg_type_t type;
  int sclass;        /* cfg_str_t for CFG_T_STR */
  long min, max;     /* CFG_T_INT range; CFG_T_DUR: min 1 = must be > 0 */
  int nullable;      /* YAML null allowed: char* NULL, int -1 */
  size_t off;        /* field in agent_cfg_t */
  const char *group; /* --help section title, on the first option of a section */
  const char *metavar;
  const char *def; /* default, as --help shows it */
  const char *help;
} cfg_opt_t;

extern const cfg_opt_t agent_cfg__opts[CFG_NOPTS];

/* Where the current value of a setting came from, lowest first. CFG_SRC_PLAIN (MASTER_ADDR and
 * MASTER_PORT as Kubeflow injects them) does not count as "given" for --standalone. */
typedef enum {
  CFG_SRC_DEFAULT = 0,
  CFG_SRC_YAML,
  CFG_SRC_PLAIN,
  CFG_SRC_ENV,
  CFG_SRC_FLAG,
  CFG_SRC_DERIVED /* set by --standalone */
} cfg_src_t;

typedef enum { CFG_NPROC_NUM = 0, CFG_NPROC_CPU, CFG_NPROC_GPU, CFG_NPROC_AUTO } cfg_nproc_sym_t;

typedef struct {
  agent_cfg_t *cfg;
  char *err;
  size_t cap;
  cfg_src_t src[CFG_NOPTS];
  char where[CFG_NOPTS][1024]; /* "--nnodes", "env PET_NNODES", "agent.yaml:3:9: nnodes" */
  cfg_nproc_sym_t nproc_sym;   /* cpu|gpu|auto, resolved once all sources are read */
} cfg_ctx_t;

void agent_cfg__ctx_init(cfg_ctx_t *ctx, agent_cfg_t *cfg, char *err, size_t cap);

/* Parses `value` for option `id` and stores it. `loc` names the source ("--nnodes",
 * "env PET_NNODES", "agent.yaml:3:9"); `key` is the YAML key to add after loc, or NULL.
 * is_null: YAML null (only for nullable options). Returns 0, or -1 with ctx->err set. */
int agent_cfg__set(cfg_ctx_t *ctx, cfg_id_t id, const char *value, int is_null, cfg_src_t src,
                   const char *loc, const char *key);

/* Resolves nproc_per_node cpu|gpu|auto. Returns 0 or -1 with ctx->err set. */
int agent_cfg__resolve_nproc(cfg_ctx_t *ctx);

/* The YAML step with a context (config_yaml.c). `from` says how the path was chosen, for the
 * message when the file can't be read ("--config", "env TDIST_CONFIG"), or NULL. */
int agent_cfg__load_yaml(cfg_ctx_t *ctx, const char *path, const char *from);

/* snprintf into ctx->err (never truncates mid-UTF-8 in a way that matters; one line). Returns -1.
 */
int agent_cfg__fail(cfg_ctx_t *ctx, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* A printable, bounded rendering of an untrusted value for messages: control characters, quotes,
 * backslashes and bytes that are not UTF-8 as \xNN; at most ~60 bytes, then "...". Returns buf. */
const char *agent_cfg__show(const char *s, size_t len, char *buf, size_t cap);

/* The shortest fixed-point text of a duration (seconds) that parses back to the same double. */
void agent_cfg__fmt_dur(double v, char *buf, size_t cap);

/* The environment names of option id, highest precedence first (TDIST_*, then PET_*); the plain
 * name (MASTER_ADDR) is not included. Returns how many. */
int agent_cfg__env_names(cfg_id_t id, char names[3][48]);

/* Duplicates a NULL-terminated list of n strings; NULL on OOM. */
char **agent_cfg__strv_dup(char *const *v, size_t n);
void agent_cfg__strv_free(char **v, size_t n);

#define CFG_FIELD(cfg, type, off) ((type *)(void *)((char *)(cfg) + (off)))

#endif
