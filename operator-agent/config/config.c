/* See config.h. This file holds value parsing, the environment and command-line
 * steps and the final checks; config_opts.c has the option table, config_yaml.c reads and
 * writes YAML, config_usage.c builds --help.
 * Values are validated before anything is stored, and strings stored in the struct are always
 * heap copies, so agent_cfg_free() is right after any error. Never prints or exits. */
#define _GNU_SOURCE
#include "operator-agent/config/config.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "operator-agent/common/utf8.h"
#include "operator-agent/config/config_internal.h"

#define IDCHARS "A-Z a-z 0-9 . _ : -"

/* torchrun flags that have no tdist-agent equivalent, for a better message than "unknown". */
static const char *const k_torchrun_only[] = {
    "rdzv-backend", "rdzv-endpoint",      "rdzv-conf", "start-method", "redirects",
    "tee",          "no-python",          "module",    "run-path",     "local-addr",
    "logs-specs",   "local-ranks-filter", "role-name", "max-nodes",    "rdzv-backend-conf"};

int agent_cfg__fail(cfg_ctx_t *ctx, const char *fmt, ...) {
  if (ctx->cap == 0) return -1;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(ctx->err, ctx->cap, fmt, ap);
  va_end(ap);
  return -1;
}

const char *agent_cfg__show(const char *s, size_t len, char *buf, size_t cap) {
  size_t n = 0;
  if (cap < 8) {
    if (cap) buf[0] = '\0';
    return buf;
  }
  for (size_t i = 0; i < len;) {
    unsigned char c = (unsigned char)s[i];
    int l = agent_utf8_next(s + i, len - i, NULL);
    size_t k = l > 0 ? (size_t)l : 0;
    if (n + 8 >= cap || n >= 60) {
      memcpy(buf + n, "...", 4);
      return buf;
    }
    if (k == 0 || c < 0x20 || c == 0x7f || c == '\\' || c == '\'') {
      n += (size_t)snprintf(buf + n, cap - n, "\\x%02x", c); /* also bytes that are not UTF-8 */
      i++;
    } else {
      memcpy(buf + n, s + i, k);
      n += k;
      i += k;
    }
  }
  buf[n] = '\0';
  return buf;
}

char **agent_cfg__strv_dup(char *const *v, size_t n) {
  char **out = calloc(n + 1, sizeof *out);
  if (out == NULL) return NULL;
  for (size_t i = 0; i < n; i++) {
    out[i] = strdup(v[i]);
    if (out[i] == NULL) {
      agent_cfg__strv_free(out, i);
      return NULL;
    }
  }
  return out;
}

void agent_cfg__strv_free(char **v, size_t n) {
  if (v == NULL) return;
  for (size_t i = 0; i < n; i++) free(v[i]);
  free(v);
}

const char *agent_scheme_name(agent_scheme_t scheme) {
  static const char *const n[] = {"indexed-job", "kubeflow", "jobset", "volcano"};
  return (unsigned)scheme < sizeof n / sizeof n[0] ? n[scheme] : NULL;
}

/* --- defaults and free --- */

static int path_ok(const char *s) {
  size_t n = strlen(s);
  if (n == 0 || n > 4095 || !agent_utf8_valid(s, n)) return 0;
  for (size_t i = 0; i < n; i++)
    if ((unsigned char)s[i] < 0x20 || s[i] == 0x7f) return 0;
  return 1;
}

/* 0, or -1 when out of memory (agent_cfg_free releases what was set). */
static int defaults_with_tmpdir(agent_cfg_t *cfg, const char *tmpdir) {
  memset(cfg, 0, sizeof *cfg);
  cfg->nnodes_min = cfg->nnodes_max = 1;
  cfg->nproc_per_node = 1;
  cfg->node_rank = -1;
  cfg->master_port = 29500;
  cfg->run_id = strdup("none");
  cfg->max_restarts = 0;
  cfg->monitor_interval_s = 0.1;
  cfg->role = strdup("default");
  cfg->backend = strdup("gloo");
  cfg->rdzv_timeout_s = 900;
  cfg->last_call_s = 30;
  cfg->heartbeat_interval_s = 5;
  cfg->heartbeat_timeout_s = 15;
  cfg->stop_grace_s = 30;
  cfg->scheme = AGENT_SCHEME_INDEXED_JOB;
  cfg->replicated_job = strdup("node");
  cfg->task = strdup("worker");
  cfg->http_host = strdup("");
  cfg->http_port = 29600;
  cfg->log_dir = strdup(tmpdir && path_ok(tmpdir) ? tmpdir : "/tmp");
  cfg->log_format = AGENT_LOG_FORMAT_TEXT;
  return cfg->run_id && cfg->role && cfg->backend && cfg->replicated_job && cfg->task &&
                 cfg->http_host && cfg->log_dir
             ? 0
             : -1;
}

/* The defaults cannot fail politely (void API): out of memory at start-up aborts. */
void agent_cfg_defaults(agent_cfg_t *cfg) {
  if (defaults_with_tmpdir(cfg, getenv("TMPDIR"))) abort();
}

void agent_cfg_free(agent_cfg_t *cfg) {
  if (cfg == NULL) return;
  for (int id = 0; id < CFG_NOPTS; id++) {
    const cfg_opt_t *o = &agent_cfg__opts[id];
    if (o->type == CFG_T_STR || o->type == CFG_T_BACKEND) free(*CFG_FIELD(cfg, char *, o->off));
  }
  for (size_t i = 0; i < cfg->nenv; i++) {
    free(cfg->env[i].name);
    free(cfg->env[i].value);
  }
  free(cfg->env);
  agent_cfg__strv_free(cfg->cmd, cfg->ncmd);
  memset(cfg, 0, sizeof *cfg);
}

/* --- values --- */

void agent_cfg__ctx_init(cfg_ctx_t *ctx, agent_cfg_t *cfg, char *err, size_t cap) {
  memset(ctx, 0, sizeof *ctx);
  ctx->cfg = cfg;
  ctx->err = err;
  ctx->cap = cap;
  if (cap) err[0] = '\0';
  for (int i = 0; i < CFG_NOPTS; i++) snprintf(ctx->where[i], sizeof ctx->where[i], "default");
}

/* Strict decimal integer: optional '-', digits only. 0 ok, -1 not an integer, -2 out of long. */
static int parse_long(const char *s, long *out) {
  const char *p = s + (*s == '-');
  if (*p == '\0') return -1;
  for (const char *q = p; *q; q++)
    if (!isdigit((unsigned char)*q)) return -1;
  long v = 0;
  for (; *p; p++) {
    if (v > (LONG_MAX - 9) / 10) return -2;
    v = v * 10 + (*p - '0');
  }
  *out = *s == '-' ? -v : v;
  return 0;
}

static int int_in(const char *s, long min, long max, long *out, char *msg, size_t cap) {
  char sv[96];
  int rc = parse_long(s, out);
  agent_cfg__show(s, strlen(s), sv, sizeof sv);
  if (rc == -1) {
    snprintf(msg, cap, "'%s' is not an integer (expected %ld..%ld)", sv, min, max);
    return -1;
  }
  if (rc == -2 || *out < min || *out > max) {
    snprintf(msg, cap, "'%s' is out of range %ld..%ld", sv, min, max);
    return -1;
  }
  return 0;
}

#define DUR_MAX_S 1e7 /* ~115 days */

/* "30", "0.5", ".5", "100ms", "30s", "5m", "1h": no sign, no exponent, no blanks. */
static int parse_dur(const char *s, int positive, double *out, char *msg, size_t cap) {
  char sv[96], num[72];
  agent_cfg__show(s, strlen(s), sv, sizeof sv);
  const char *p = s;
  size_t digits = 0;
  while (isdigit((unsigned char)*p)) p++, digits++;
  if (*p == '.') {
    p++;
    while (isdigit((unsigned char)*p)) p++, digits++;
  }
  double mult = 1;
  if (!strcmp(p, "") || !strcmp(p, "s"))
    mult = 1;
  else if (!strcmp(p, "ms"))
    mult = 0; /* divide, below: exact for whole milliseconds */
  else if (!strcmp(p, "m"))
    mult = 60;
  else if (!strcmp(p, "h"))
    mult = 3600;
  else
    digits = 0;
  if (digits == 0) {
    snprintf(msg, cap,
             "'%s' is not a duration (seconds such as 30 or 0.5, or with a unit: 100ms, 30s, 5m, "
             "1h)",
             sv);
    return -1;
  }
  if ((size_t)(p - s) >= sizeof num) {
    snprintf(msg, cap, "'%s' has too many digits for a duration", sv);
    return -1;
  }
  memcpy(num, s, (size_t)(p - s));
  num[p - s] = '\0';
  double v = strtod(num, NULL);
  v = mult == 0 ? v / 1000 : v * mult;
  if (!(v <= DUR_MAX_S)) {
    snprintf(msg, cap, "'%s' is out of range (at most %.0f s)", sv, DUR_MAX_S);
    return -1;
  }
  if (positive && v == 0) {
    snprintf(msg, cap, "'%s' must be greater than 0", sv);
    return -1;
  }
  if (v != 0 && v < 0.001) {
    snprintf(msg, cap, "'%s' is below 1ms (use %sat least 1ms)", sv, positive ? "" : "0 or ");
    return -1;
  }
  *out = v;
  return 0;
}

void agent_cfg__fmt_dur(double v, char *buf, size_t cap) {
  /* The shortest fixed-point text that reads back to the same double (no exponent: the parser
   * takes none). Values are >= 1 ms or 0 and <= 1e7, so 20 decimals always suffice. */
  for (int prec = 0; prec <= 20; prec++) {
    snprintf(buf, cap, "%.*f", prec, v);
    if (strtod(buf, NULL) == v) return;
  }
}

static int parse_bool(const char *s, int *out) {
  static const char *const t[] = {"true", "1", "yes"}, *const f[] = {"false", "0", "no"};
  for (int i = 0; i < 3; i++) {
    if (!strcasecmp(s, t[i])) return *out = 1, 0;
    if (!strcasecmp(s, f[i])) return *out = 0, 0;
  }
  return -1;
}

static int check_str(int sclass, const char *s, char *msg, size_t cap) {
  char sv[96];
  size_t n = strlen(s);
  agent_cfg__show(s, n, sv, sizeof sv);
  size_t max = sclass == CFG_S_ID         ? 128
               : sclass == CFG_S_TEMPLATE ? 1024
               : sclass == CFG_S_PATH     ? 4095
                                          : 253;
  if (n == 0 && sclass != CFG_S_HOST0) {
    snprintf(msg, cap, "must not be empty");
    return -1;
  }
  if (n > max) {
    snprintf(msg, cap, "'%s' is longer than %zu bytes", sv, max);
    return -1;
  }
  if (!agent_utf8_valid(s, n)) {
    snprintf(msg, cap, "'%s' is not valid UTF-8", sv);
    return -1;
  }
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    if (sclass == CFG_S_ID && !isalnum(c) && !strchr("._:-", c)) {
      snprintf(msg, cap, "'%s' may only contain " IDCHARS, sv);
      return -1;
    }
    if (c < 0x20 || c == 0x7f || (c == ' ' && sclass != CFG_S_PATH)) {
      snprintf(msg, cap, "'%s' must not contain %s", sv,
               sclass == CFG_S_PATH ? "control characters" : "blanks or control characters");
      return -1;
    }
  }
  return 0;
}

static int replace_str(cfg_ctx_t *ctx, char **field, const char *v, const char *pre) {
  char *copy = NULL;
  if (v != NULL && (copy = strdup(v)) == NULL)
    return agent_cfg__fail(ctx, "%s: out of memory", pre);
  free(*field);
  *field = copy;
  return 0;
}

int agent_cfg__set(cfg_ctx_t *ctx, cfg_id_t id, const char *v, int is_null, cfg_src_t src,
                   const char *loc, const char *key) {
  const cfg_opt_t *o = &agent_cfg__opts[id];
  agent_cfg_t *cfg = ctx->cfg;
  char pre[sizeof ctx->where[0]], msg[256], sv[96];
  long a, b;
  if (key)
    snprintf(pre, sizeof pre, "%s: %s", loc, key);
  else
    snprintf(pre, sizeof pre, "%s", loc);
  msg[0] = '\0';
  if (is_null) {
    if (!o->nullable)
      return agent_cfg__fail(ctx, "%s%s%s: a value is required (%s)", loc, key ? ": " : "",
                             key ? key : "", o->metavar ? o->metavar : "true|false");
    if (o->type == CFG_T_STR) {
      free(*CFG_FIELD(cfg, char *, o->off));
      *CFG_FIELD(cfg, char *, o->off) = NULL;
    } else {
      *CFG_FIELD(cfg, int, o->off) = -1;
    }
    goto stored;
  }
  agent_cfg__show(v, strlen(v), sv, sizeof sv);
  switch (o->type) {
    case CFG_T_NNODES: {
      const char *colon = strchr(v, ':');
      if (colon == NULL) {
        if (int_in(v, 1, 65536, &a, msg, sizeof msg)) break;
        b = a;
      } else {
        char left[32];
        size_t ln = (size_t)(colon - v);
        if (ln >= sizeof left || strchr(colon + 1, ':')) {
          snprintf(msg, sizeof msg, "'%s' is not N or MIN:MAX (1..65536)", sv);
          break;
        }
        memcpy(left, v, ln);
        left[ln] = '\0';
        if (int_in(left, 1, 65536, &a, msg, sizeof msg) ||
            int_in(colon + 1, 1, 65536, &b, msg, sizeof msg)) {
          snprintf(msg, sizeof msg, "'%s' is not N or MIN:MAX (1..65536)", sv);
          break;
        }
        if (a > b) {
          snprintf(msg, sizeof msg, "'%s': MIN must be <= MAX", sv);
          break;
        }
      }
      cfg->nnodes_min = (int)a;
      cfg->nnodes_max = (int)b;
      break;
    }
    case CFG_T_NPROC:
      if (!strcmp(v, "cpu") || !strcmp(v, "gpu") || !strcmp(v, "auto")) {
        ctx->nproc_sym = v[0] == 'c' ? CFG_NPROC_CPU : v[0] == 'g' ? CFG_NPROC_GPU : CFG_NPROC_AUTO;
        break;
      }
      if (parse_long(v, &a) == -1) {
        snprintf(msg, sizeof msg, "'%s' is not an integer 1..4096 or cpu|gpu|auto", sv);
        break;
      }
      if (int_in(v, 1, 4096, &a, msg, sizeof msg)) break;
      cfg->nproc_per_node = (int)a;
      ctx->nproc_sym = CFG_NPROC_NUM;
      break;
    case CFG_T_INT:
      if (int_in(v, o->min, o->max, &a, msg, sizeof msg)) break;
      *CFG_FIELD(cfg, int, o->off) = (int)a;
      break;
    case CFG_T_DUR: {
      double d;
      if (parse_dur(v, o->min > 0, &d, msg, sizeof msg)) break;
      *CFG_FIELD(cfg, double, o->off) = d;
      break;
    }
    case CFG_T_BOOL: {
      int t;
      if (parse_bool(v, &t)) {
        snprintf(msg, sizeof msg, "'%s' is not a boolean (true|false|1|0|yes|no)", sv);
        break;
      }
      *CFG_FIELD(cfg, int, o->off) = t;
      break;
    }
    case CFG_T_STR:
      if (check_str(o->sclass, v, msg, sizeof msg)) break;
      if (replace_str(ctx, CFG_FIELD(cfg, char *, o->off), v, pre)) return -1;
      break;
    case CFG_T_SCHEME: {
      int found = -1;
      for (int s = 0; agent_scheme_name((agent_scheme_t)s); s++)
        if (!strcmp(v, agent_scheme_name((agent_scheme_t)s))) found = s;
      if (found < 0) {
        snprintf(msg, sizeof msg, "'%s' is not one of indexed-job|kubeflow|jobset|volcano", sv);
        break;
      }
      cfg->scheme = (agent_scheme_t)found;
      break;
    }
    case CFG_T_BACKEND:
      if (strcmp(v, "gloo") && strcmp(v, "nccl") && strcmp(v, "mpi")) {
        snprintf(msg, sizeof msg, "'%s' is not one of gloo|nccl|mpi", sv);
        break;
      }
      if (replace_str(ctx, &cfg->backend, v, pre)) return -1;
      break;
    case CFG_T_LOGFMT:
      if (strcmp(v, "text") && strcmp(v, "json")) {
        snprintf(msg, sizeof msg, "'%s' is not one of text|json", sv);
        break;
      }
      cfg->log_format = v[0] == 't' ? AGENT_LOG_FORMAT_TEXT : AGENT_LOG_FORMAT_JSON;
      break;
    case CFG_T_ACTION: snprintf(msg, sizeof msg, "is not a setting"); break;
  }
  if (msg[0]) /* from loc, not pre: a long path must not be cut off */
    return agent_cfg__fail(ctx, "%s%s%s: %s", loc, key ? ": " : "", key ? key : "", msg);
stored:
  ctx->src[id] = src;
  snprintf(ctx->where[id], sizeof ctx->where[id], "%s", pre);
  return 0;
}

static int count_gpus(void) {
  DIR *d = opendir("/dev");
  if (d == NULL) return 0;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    const char *s = e->d_name;
    if (strncmp(s, "nvidia", 6) || !s[6]) continue;
    s += 6;
    while (isdigit((unsigned char)*s)) s++;
    if (*s == '\0') n++;
  }
  closedir(d);
  return n;
}

int agent_cfg__resolve_nproc(cfg_ctx_t *ctx) {
  if (ctx->nproc_sym == CFG_NPROC_NUM) return 0;
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  int gpus = ctx->nproc_sym == CFG_NPROC_CPU ? 0 : count_gpus();
  if (cpus < 1) cpus = 1;
  long n = ctx->nproc_sym == CFG_NPROC_CPU ? cpus : gpus > 0 ? gpus : cpus;
  if (ctx->nproc_sym == CFG_NPROC_GPU && gpus == 0) {
    ctx->nproc_sym = CFG_NPROC_NUM;
    return agent_cfg__fail(ctx,
                           "%s: 'gpu': no GPU found (no /dev/nvidia<N> device); give a number, "
                           "cpu or auto",
                           ctx->where[CFG_NPROC]);
  }
  ctx->cfg->nproc_per_node = n > 4096 ? 4096 : (int)n;
  ctx->nproc_sym = CFG_NPROC_NUM;
  return 0;
}

/* --- environment and command line --- */

static const char *env_get(char **envp, const char *name) {
  size_t n = strlen(name);
  for (char **e = envp; e && *e; e++)
    if (!strncmp(*e, name, n) && (*e)[n] == '=') return *e + n + 1;
  return NULL;
}

/* "TDIST_" + the flag in upper snake case. */
static void tdist_env_name(const char *flag, char *buf, size_t cap) {
  size_t n = (size_t)snprintf(buf, cap, "TDIST_%s", flag);
  for (size_t i = 6; i < n && i < cap; i++)
    buf[i] = buf[i] == '-' ? '_' : (char)toupper((unsigned char)buf[i]);
}

/* The environment names of an option, highest precedence first; the plain name (MASTER_ADDR) is
 * not included. Returns the count. */
int agent_cfg__env_names(cfg_id_t id, char names[3][48]) {
  const cfg_opt_t *o = &agent_cfg__opts[id];
  int n = 0;
  if (o->type == CFG_T_ACTION) return 0;
  tdist_env_name(o->flag, names[n++], 48);
  if (o->flag2) tdist_env_name(o->flag2, names[n++], 48);
  if (o->pet) snprintf(names[n++], 48, "%s", o->pet);
  return n;
}

int agent_cfg_tdist_env_name(size_t i, char *buf, size_t cap) {
  for (int id = 0; id < CFG_NOPTS; id++) {
    char names[3][48];
    int n = agent_cfg__env_names((cfg_id_t)id, names);
    for (int k = 0; k < n; k++) {
      if (strncmp(names[k], "TDIST_", 6) || i--) continue;
      snprintf(buf, cap, "%s", names[k]);
      return 1;
    }
  }
  return 0;
}

static int apply_env(cfg_ctx_t *ctx, char **envp) {
  for (int id = 0; id < CFG_NOPTS; id++) {
    char names[3][48], loc[160];
    int n = agent_cfg__env_names((cfg_id_t)id, names);
    if (id == CFG_CONFIG) continue; /* read before the YAML step */
    for (int k = 0; k < n; k++) {
      const char *v = env_get(envp, names[k]);
      if (v == NULL || *v == '\0') continue; /* empty = unset */
      snprintf(loc, sizeof loc, "env %s", names[k]);
      if (agent_cfg__set(ctx, (cfg_id_t)id, v, 0, CFG_SRC_ENV, loc, NULL)) return -1;
      break;
    }
  }
  return 0;
}

/* MASTER_ADDR / MASTER_PORT as Kubeflow injects them: below every other environment variable and
 * every flag, above YAML; ignored with --standalone. */
static int apply_plain_env(cfg_ctx_t *ctx, char **envp) {
  if (ctx->cfg->standalone) return 0;
  for (int id = 0; id < CFG_NOPTS; id++) {
    const cfg_opt_t *o = &agent_cfg__opts[id];
    const char *v;
    char loc[64];
    if (o->plain == NULL || ctx->src[id] >= CFG_SRC_ENV) continue;
    if ((v = env_get(envp, o->plain)) == NULL || *v == '\0') continue;
    snprintf(loc, sizeof loc, "env %s", o->plain);
    if (agent_cfg__set(ctx, (cfg_id_t)id, v, 0, CFG_SRC_PLAIN, loc, NULL)) return -1;
  }
  return 0;
}

/* Exact dash spelling, or the same with every '-' written '_'. */
static int flag_is(const char *name, size_t len, const char *flag) {
  if (flag == NULL || strlen(flag) != len) return 0;
  if (!memcmp(name, flag, len)) return 1;
  for (size_t i = 0; i < len; i++)
    if (name[i] != (flag[i] == '-' ? '_' : flag[i])) return 0;
  return 1;
}

static int lookup_flag(const char *name, size_t len) {
  for (int id = 0; id < CFG_NOPTS; id++)
    if (flag_is(name, len, agent_cfg__opts[id].flag) ||
        flag_is(name, len, agent_cfg__opts[id].flag2))
      return id;
  return -1;
}

static size_t edit_distance(const char *a, size_t la, const char *b) {
  size_t lb = strlen(b), row[64];
  if (la >= 63 || lb >= 63) return 99;
  for (size_t j = 0; j <= lb; j++) row[j] = j;
  for (size_t i = 1; i <= la; i++) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= lb; j++) {
      char ca = a[i - 1] == '_' ? '-' : a[i - 1];
      size_t best = diag + (ca != b[j - 1]);
      if (row[j] + 1 < best) best = row[j] + 1;
      if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
      diag = row[j];
      row[j] = best;
    }
  }
  return row[lb];
}

static void unknown_flag(cfg_ctx_t *ctx, const char *arg, const char *name, size_t len) {
  char sv[96], norm[64];
  agent_cfg__show(arg, (size_t)(name - arg) + len, sv, sizeof sv);
  if (len < sizeof norm) {
    for (size_t i = 0; i < len; i++) norm[i] = name[i] == '_' ? '-' : name[i];
    norm[len] = '\0';
    for (size_t i = 0; i < sizeof k_torchrun_only / sizeof k_torchrun_only[0]; i++)
      if (!strcmp(norm, k_torchrun_only[i])) {
        agent_cfg__fail(ctx,
                        "unknown flag '%s': a torchrun flag that tdist-agent does not have "
                        "(tdist-agent --help lists the flags)",
                        sv);
        return;
      }
    const char *best = NULL;
    size_t best_d = 3;
    for (int id = 0; id < CFG_NOPTS; id++) {
      const char *f = agent_cfg__opts[id].flag;
      size_t d = edit_distance(name, len, f);
      if (len >= 3 && !strncmp(norm, f, len)) d = 1;
      if (d < best_d) best = f, best_d = d;
    }
    if (best) {
      agent_cfg__fail(ctx,
                      "unknown flag '%s'; did you mean --%s? (tdist-agent --help lists the "
                      "flags)",
                      sv, best);
      return;
    }
  }
  agent_cfg__fail(ctx, "unknown flag '%s' (tdist-agent --help lists the flags)", sv);
}

typedef struct {
  cfg_id_t id;
  const char *arg; /* the argument as typed, up to '=' (name_len) */
  size_t name_len;
  const char *value;
} flagrec_t;

typedef struct {
  flagrec_t *recs;
  size_t nrecs;
  int help, version, error;
  int cmd_start; /* index of the command's first argument, or argc */
} scan_t;

static void scan_error(cfg_ctx_t *ctx, scan_t *sc, const char *fmt, const char *arg, size_t n) {
  char sv[96];
  if (sc->error) return; /* the first error is the one reported */
  sc->error = 1;
  agent_cfg__show(arg, n, sv, sizeof sv);
  agent_cfg__fail(ctx, fmt, sv);
}

/* One pass over argv: records the settings, finds --help/--version anywhere before the command
 * (they win over errors) and where the command starts. */
static int scan_argv(cfg_ctx_t *ctx, int argc, char **argv, scan_t *sc) {
  sc->recs = calloc((size_t)(argc > 0 ? argc : 1), sizeof *sc->recs);
  if (sc->recs == NULL) return agent_cfg__fail(ctx, "out of memory");
  sc->cmd_start = argc;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "--")) {
      sc->cmd_start = i + 1;
      break;
    }
    if (!strcmp(a, "-h")) {
      sc->help = 1;
      continue;
    }
    if (a[0] != '-' || a[1] == '\0') { /* torchrun style: the script starts the command */
      sc->cmd_start = i;
      break;
    }
    if (a[1] != '-') {
      scan_error(ctx, sc, "unknown flag '%s' (tdist-agent --help lists the flags)", a, strlen(a));
      continue;
    }
    const char *name = a + 2, *eq = strchr(name, '=');
    size_t len = eq ? (size_t)(eq - name) : strlen(name);
    int id = lookup_flag(name, len);
    if (id < 0) {
      if (!sc->error) {
        sc->error = 1;
        unknown_flag(ctx, a, name, len);
      }
      continue;
    }
    const cfg_opt_t *o = &agent_cfg__opts[id];
    if (o->type == CFG_T_ACTION || o->type == CFG_T_BOOL) {
      if (eq) {
        scan_error(ctx, sc, "'%s' takes no value (it is a switch)", a, len + 2);
        continue;
      }
      if (id == CFG_HELP) sc->help = 1;
      if (id == CFG_VERSION) sc->version = 1;
      if (o->type == CFG_T_ACTION) continue;
    }
    flagrec_t *r = &sc->recs[sc->nrecs];
    r->id = (cfg_id_t)id;
    r->arg = a;
    r->name_len = len + 2;
    if (o->type == CFG_T_BOOL) {
      r->value = "true";
    } else if (eq) {
      r->value = eq + 1;
    } else if (i + 1 < argc && strncmp(argv[i + 1], "--", 2) != 0) {
      r->value = argv[++i];
    } else {
      char fmt[128];
      snprintf(fmt, sizeof fmt, "'%%s' needs a value (%s)", o->metavar);
      scan_error(ctx, sc, fmt, a, len + 2);
      continue;
    }
    sc->nrecs++;
  }
  return 0;
}

static int apply_flags(cfg_ctx_t *ctx, const scan_t *sc, int only_id) {
  for (size_t i = 0; i < sc->nrecs; i++) {
    const flagrec_t *r = &sc->recs[i];
    char loc[96];
    if (only_id >= 0 ? (int)r->id != only_id : r->id == CFG_CONFIG) continue;
    agent_cfg__show(r->arg, r->name_len, loc, sizeof loc);
    if (agent_cfg__set(ctx, r->id, r->value, 0, CFG_SRC_FLAG, loc, NULL)) return -1;
  }
  return 0;
}

/* --- final steps --- */

static int given(const cfg_ctx_t *ctx, cfg_id_t id) {
  return ctx->src[id] == CFG_SRC_YAML || ctx->src[id] == CFG_SRC_ENV ||
         ctx->src[id] == CFG_SRC_FLAG;
}

static int uuid4(char out[37]) {
  unsigned char b[16];
  size_t got = 0;
  int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  while (got < sizeof b) {
    ssize_t r = read(fd, b + got, sizeof b - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    got += (size_t)r;
  }
  close(fd);
  if (got < sizeof b) return -1;
  b[6] = (unsigned char)((b[6] & 0x0f) | 0x40);
  b[8] = (unsigned char)((b[8] & 0x3f) | 0x80);
  snprintf(out, 37, "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
           b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14],
           b[15]);
  return 0;
}

static int is_loopback(const char *h) {
  return !strcmp(h, "127.0.0.1") || !strcmp(h, "localhost") || !strcmp(h, "::1");
}

static int apply_standalone(cfg_ctx_t *ctx) {
  agent_cfg_t *cfg = ctx->cfg;
  const char *sw = ctx->where[CFG_STANDALONE];
  char uuid[37];
  if (!cfg->standalone) return 0;
  if (given(ctx, CFG_NNODES) && (cfg->nnodes_min != 1 || cfg->nnodes_max != 1)) {
    char n[32];
    if (cfg->nnodes_min == cfg->nnodes_max)
      snprintf(n, sizeof n, "%d", cfg->nnodes_min);
    else
      snprintf(n, sizeof n, "%d:%d", cfg->nnodes_min, cfg->nnodes_max);
    return agent_cfg__fail(ctx,
                           "%s: '%s' conflicts with standalone (%s), which runs exactly one "
                           "node; remove one of them",
                           ctx->where[CFG_NNODES], n, sw);
  }
  if (given(ctx, CFG_NODE_RANK) && cfg->node_rank != 0)
    return agent_cfg__fail(ctx,
                           "%s: '%d' conflicts with standalone (%s), where the only node has "
                           "rank 0; remove one of them",
                           ctx->where[CFG_NODE_RANK], cfg->node_rank, sw);
  if (given(ctx, CFG_MASTER_ADDR) && cfg->master_addr && !is_loopback(cfg->master_addr)) {
    char sv[96];
    agent_cfg__show(cfg->master_addr, strlen(cfg->master_addr), sv, sizeof sv);
    return agent_cfg__fail(ctx,
                           "%s: '%s' conflicts with standalone (%s), which runs the store on "
                           "127.0.0.1; remove one of them",
                           ctx->where[CFG_MASTER_ADDR], sv, sw);
  }
  cfg->nnodes_min = cfg->nnodes_max = 1;
  cfg->node_rank = 0;
  if (!given(ctx, CFG_MASTER_ADDR) || cfg->master_addr == NULL) {
    if (replace_str(ctx, &cfg->master_addr, "127.0.0.1", sw)) return -1;
    ctx->src[CFG_MASTER_ADDR] = CFG_SRC_DERIVED;
  }
  if (!given(ctx, CFG_MASTER_PORT)) {
    cfg->master_port = 0;
    ctx->src[CFG_MASTER_PORT] = CFG_SRC_DERIVED;
  }
  if (!given(ctx, CFG_RUN_ID)) {
    if (uuid4(uuid))
      return agent_cfg__fail(ctx, "%s: cannot read /dev/urandom for a run id (%s); pass --run-id",
                             sw, strerror(errno ? errno : EIO));
    if (replace_str(ctx, &cfg->run_id, uuid, sw)) return -1;
    ctx->src[CFG_RUN_ID] = CFG_SRC_DERIVED;
  }
  return 0;
}

/* --spares-in-nnodes: nnodes as given counts the spares (Trainer v2's PET_NNODES = numNodes, every
 * pod); from here on nnodes is the active nodes, and the flag is consumed so that the effective
 * configuration (--check-config's dump) says what the agent runs: nnodes N, spares S. */
static int apply_spares_in_nnodes(cfg_ctx_t *ctx) {
  agent_cfg_t *cfg = ctx->cfg;
  const char *w = ctx->where[CFG_SPARES_IN_NNODES];
  if (!cfg->spares_in_nnodes || cfg->standalone) return 0;
  if (cfg->nnodes_min != cfg->nnodes_max)
    return agent_cfg__fail(ctx,
                           "%s: '%d:%d' is MIN:MAX, but spares_in_nnodes (%s) needs one node "
                           "count (all the pods, spares included); give a single number",
                           ctx->where[CFG_NNODES], cfg->nnodes_min, cfg->nnodes_max, w);
  if (cfg->nnodes_max <= cfg->spares)
    return agent_cfg__fail(ctx,
                           "%s: %d node(s) with spares_in_nnodes (%s) leave no active node "
                           "beside the %d spare(s) (%s); raise the node count (numNodes) to at "
                           "least %d or lower spares",
                           ctx->where[CFG_NNODES], cfg->nnodes_max, w, cfg->spares,
                           ctx->where[CFG_SPARES], cfg->spares + 1);
  cfg->nnodes_min = cfg->nnodes_max = cfg->nnodes_max - cfg->spares;
  cfg->spares_in_nnodes = 0;
  return 0;
}

static int cross_checks(cfg_ctx_t *ctx) {
  agent_cfg_t *cfg = ctx->cfg;
  char a[48], b[48];
  if (cfg->master_port == 0 && !cfg->standalone)
    return agent_cfg__fail(ctx,
                           "%s: '0' is out of range 1..65535 (port 0, an ephemeral port, needs "
                           "--standalone)",
                           ctx->where[CFG_MASTER_PORT]);
  if (cfg->heartbeat_timeout_s <= cfg->heartbeat_interval_s) {
    agent_cfg__fmt_dur(cfg->heartbeat_timeout_s, a, sizeof a);
    agent_cfg__fmt_dur(cfg->heartbeat_interval_s, b, sizeof b);
    return agent_cfg__fail(ctx,
                           "heartbeat timeout %ss (%s) must be greater than the heartbeat "
                           "interval %ss (%s); raise the timeout or lower the interval",
                           a, ctx->where[CFG_HB_TIMEOUT], b, ctx->where[CFG_HB_INTERVAL]);
  }
  if (cfg->nnodes_min < cfg->nnodes_max && cfg->last_call_s >= cfg->rdzv_timeout_s) {
    agent_cfg__fmt_dur(cfg->last_call_s, a, sizeof a);
    agent_cfg__fmt_dur(cfg->rdzv_timeout_s, b, sizeof b);
    return agent_cfg__fail(ctx,
                           "last call %ss (%s) must be less than the rendezvous timeout %ss (%s) "
                           "when nnodes is MIN:MAX",
                           a, ctx->where[CFG_LAST_CALL], b, ctx->where[CFG_RDZV_TIMEOUT]);
  }
  if (cfg->spares > 0 && cfg->standalone)
    return agent_cfg__fail(ctx,
                           "%s: '%d' conflicts with standalone (%s), which runs exactly one node "
                           "and no spare; remove one of them",
                           ctx->where[CFG_SPARES], cfg->spares, ctx->where[CFG_STANDALONE]);
  if ((long)cfg->nnodes_max + cfg->spares > 65536)
    return agent_cfg__fail(ctx,
                           "%s: %d spare(s) and %d node(s) (%s) make %ld pods, more than 65536 "
                           "node ranks; lower one of them",
                           ctx->where[CFG_SPARES], cfg->spares, cfg->nnodes_max,
                           ctx->where[CFG_NNODES], (long)cfg->nnodes_max + cfg->spares);
  if (cfg->node_rank >= cfg->nnodes_max + cfg->spares && cfg->spares)
    return agent_cfg__fail(ctx,
                           "%s: node rank %d must be below the number of nodes %d (%s) plus the "
                           "spares %d (%s); node ranks are 0..%d",
                           ctx->where[CFG_NODE_RANK], cfg->node_rank, cfg->nnodes_max,
                           ctx->where[CFG_NNODES], cfg->spares, ctx->where[CFG_SPARES],
                           cfg->nnodes_max + cfg->spares - 1);
  if (cfg->node_rank >= cfg->nnodes_max && !cfg->spares)
    return agent_cfg__fail(ctx,
                           "%s: node rank %d must be below the number of nodes %d (%s); node "
                           "ranks are 0..%d (or give --spares)",
                           ctx->where[CFG_NODE_RANK], cfg->node_rank, cfg->nnodes_max,
                           ctx->where[CFG_NNODES], cfg->nnodes_max - 1);
  if (cfg->http_port > 0 && cfg->http_port == cfg->master_port)
    return agent_cfg__fail(ctx, "%s: HTTP port %d is also the master port (%s); choose another one",
                           ctx->where[CFG_HTTP_PORT], cfg->http_port, ctx->where[CFG_MASTER_PORT]);
  if (cfg->ncmd == 0 && !cfg->check_config)
    return agent_cfg__fail(ctx,
                           "no worker command: give it after the flags (tdist-agent [FLAGS] "
                           "[--] COMMAND [ARGS]) or as command: in the YAML file");
  return 0;
}

agent_cfg_result_t agent_cfg_load(agent_cfg_t *cfg, int argc, char **argv, char **envp, char *err,
                                  size_t cap) {
  cfg_ctx_t ctx;
  scan_t sc = {0};
  agent_cfg_result_t res = AGENT_CFG_ERROR;
  const char *tmpdir = env_get(envp, "TMPDIR");
  int oom = defaults_with_tmpdir(cfg, tmpdir && *tmpdir ? tmpdir : NULL);
  agent_cfg__ctx_init(&ctx, cfg, err, cap);
  if (oom) {
    agent_cfg__fail(&ctx, "out of memory");
    goto out;
  }
  if (argc < 0 || (argc > 0 && argv == NULL)) argc = 0;

  if (scan_argv(&ctx, argc, argv, &sc)) goto out;
  if (sc.help || sc.version) {
    if (cap) err[0] = '\0';
    res = sc.help ? AGENT_CFG_HELP : AGENT_CFG_VERSION;
    goto out;
  }
  if (sc.error) goto out;

  /* YAML first (its path from the flags, else the environment), then env, flags. */
  if (apply_flags(&ctx, &sc, CFG_CONFIG)) goto out;
  if (cfg->config_path == NULL) {
    const char *p = env_get(envp, "TDIST_CONFIG");
    if (p && *p && agent_cfg__set(&ctx, CFG_CONFIG, p, 0, CFG_SRC_ENV, "env TDIST_CONFIG", NULL))
      goto out;
  }
  if (cfg->config_path && agent_cfg__load_yaml(&ctx, cfg->config_path, ctx.where[CFG_CONFIG]))
    goto out;
  if (apply_env(&ctx, envp) || apply_flags(&ctx, &sc, -1) || apply_plain_env(&ctx, envp)) goto out;

  if (sc.cmd_start < argc) {
    char **cmd = agent_cfg__strv_dup(argv + sc.cmd_start, (size_t)(argc - sc.cmd_start));
    if (cmd == NULL) {
      agent_cfg__fail(&ctx, "out of memory");
      goto out;
    }
    agent_cfg__strv_free(cfg->cmd, cfg->ncmd);
    cfg->cmd = cmd;
    cfg->ncmd = (size_t)(argc - sc.cmd_start);
  }
  if (apply_standalone(&ctx) || apply_spares_in_nnodes(&ctx) || agent_cfg__resolve_nproc(&ctx) ||
      cross_checks(&ctx))
    goto out;
  res = AGENT_CFG_OK;
out:
  free(sc.recs);
  return res;
}
