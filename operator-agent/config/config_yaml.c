/* The YAML step of the configuration (see config.h) and its inverse, agent_cfg_dump_yaml().
 *
 * The file is read whole (at most CFG_YAML_MAX_BYTES, refused before parsing when larger) and
 * walked with libyaml's event parser against a fixed grammar: a top-level mapping of settings, a
 * `discovery:` mapping, an `env:` mapping of strings and a `command:` list of strings. The first
 * problem stops the walk; its message starts with "FILE:LINE:COLUMN:" (1-based, from libyaml's
 * marks) and names the key. Aliases are refused, so the work is linear in the file size and no
 * value is ever expanded. Never prints. */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <yaml.h>

#include "operator-agent/config/config.h"
#include "operator-agent/common/utf8.h"
#include "operator-agent/config/config_internal.h"
#include "tdist/version.h"

#define CFG_YAML_MAX_BYTES (1u << 20)
#define CFG_YAML_MAX_ENV 4096
#define CFG_YAML_MAX_CMD 65536

/* Keys that are not settings of the table. */
enum { Y_DISCOVERY = CFG_NOPTS, Y_ENV, Y_COMMAND, Y_NKEYS };

typedef struct {
  cfg_ctx_t *ctx;
  const char *path;
  const unsigned char *buf;
  size_t len;
  yaml_parser_t parser;
  yaml_event_t ev;
  int have_ev;
} yp_t;

static int fail_at(yp_t *y, yaml_mark_t m, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int fail_at(yp_t *y, yaml_mark_t m, const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return agent_cfg__fail(y->ctx, "%s:%zu:%zu: %s", y->path, m.line + 1, m.column + 1, msg);
}

static int syntax_error(yp_t *y) {
  yaml_parser_t *p = &y->parser;
  const char *problem = p->problem ? p->problem : "unknown error";
  if (p->error == YAML_MEMORY_ERROR)
    return agent_cfg__fail(y->ctx, "%s: out of memory while reading YAML", y->path);
  if (p->error == YAML_READER_ERROR) {
    /* Reader errors carry a byte offset, not a mark. */
    size_t line = 1, col = 1;
    for (size_t i = 0; i < p->problem_offset && i < y->len; i++) {
      if (y->buf[i] == '\n')
        line++, col = 1;
      else
        col++;
    }
    if (p->problem_value != -1)
      return agent_cfg__fail(y->ctx, "%s:%zu:%zu: YAML: %s (0x%X); the file must be UTF-8 text",
                             y->path, line, col, problem, (unsigned)p->problem_value);
    return agent_cfg__fail(y->ctx, "%s:%zu:%zu: YAML: %s", y->path, line, col, problem);
  }
  if (p->context)
    return fail_at(y, p->problem_mark, "YAML syntax error: %s (%s at line %zu, column %zu)",
                   problem, p->context, p->context_mark.line + 1, p->context_mark.column + 1);
  return fail_at(y, p->problem_mark, "YAML syntax error: %s", problem);
}

static int next(yp_t *y) {
  if (y->have_ev) yaml_event_delete(&y->ev);
  y->have_ev = 0;
  if (!yaml_parser_parse(&y->parser, &y->ev)) return syntax_error(y);
  y->have_ev = 1;
  if (y->ev.type == YAML_ALIAS_EVENT) {
    char sv[96];
    const char *a = (const char *)y->ev.data.alias.anchor;
    agent_cfg__show(a, strlen(a), sv, sizeof sv);
    return fail_at(y, y->ev.start_mark,
                   "alias '*%s': aliases are not supported; write the value "
                   "out",
                   sv);
  }
  return 0;
}

static const char *kind(const yaml_event_t *e) {
  switch (e->type) {
    case YAML_MAPPING_START_EVENT: return "a mapping";
    case YAML_SEQUENCE_START_EVENT: return "a list";
    case YAML_SCALAR_EVENT: return "a single value";
    default: return "something else";
  }
}

static int is_null(const yaml_event_t *e) {
  if (e->type != YAML_SCALAR_EVENT) return 0;
  const char *v = (const char *)e->data.scalar.value, *tag = (const char *)e->data.scalar.tag;
  if (tag && !strcmp(tag, YAML_NULL_TAG)) return 1;
  if (tag || e->data.scalar.style != YAML_PLAIN_SCALAR_STYLE) return 0;
  return !strcmp(v, "") || !strcmp(v, "~") || !strcmp(v, "null") || !strcmp(v, "Null") ||
         !strcmp(v, "NULL");
}

/* The current event is a scalar without NUL bytes inside. `what` names it in the message. */
static int want_scalar(yp_t *y, const char *what, const char *expected) {
  if (y->ev.type != YAML_SCALAR_EVENT)
    return fail_at(y, y->ev.start_mark, "%s: expected %s, found %s", what, expected, kind(&y->ev));
  if (strlen((const char *)y->ev.data.scalar.value) != y->ev.data.scalar.length)
    return fail_at(y, y->ev.start_mark, "%s: the value contains a NUL character", what);
  return 0;
}

static int key_lookup(const char *k, int discovery) {
  if (!discovery) {
    if (!strcmp(k, "discovery")) return Y_DISCOVERY;
    if (!strcmp(k, "env")) return Y_ENV;
    if (!strcmp(k, "command")) return Y_COMMAND;
  }
  for (int id = 0; id < CFG_NOPTS; id++) {
    const cfg_opt_t *o = &agent_cfg__opts[id];
    if (o->yaml && o->discovery == discovery &&
        (!strcmp(k, o->yaml) || (o->yaml2 && !strcmp(k, o->yaml2))))
      return id;
  }
  return -1;
}

static int unknown_key(yp_t *y, const char *k, int discovery, yaml_mark_t m) {
  char sv[96];
  agent_cfg__show(k, strlen(k), sv, sizeof sv);
  if (key_lookup(k, !discovery) >= 0 && key_lookup(k, !discovery) < CFG_NOPTS)
    return fail_at(y, m, "unknown key '%s%s': it belongs %s", discovery ? "discovery." : "", sv,
                   discovery ? "at the top level" : "under discovery:");
  return fail_at(y, m, "unknown key '%s%s' (tdist-agent --help lists the YAML keys)",
                 discovery ? "discovery." : "", sv);
}

static int env_name_ok(const char *s) {
  size_t n = strlen(s);
  if (n == 0 || n > 256 || (s[0] >= '0' && s[0] <= '9')) return 0;
  for (size_t i = 0; i < n; i++) {
    char c = s[i];
    if (!(c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')))
      return 0;
  }
  return 1;
}

static void free_pairs(agent_env_pair_t *p, size_t n) {
  for (size_t i = 0; i < n; i++) {
    free(p[i].name);
    free(p[i].value);
  }
  free(p);
}

/* env: NAME: value ... (the current event is the value of the `env` key). */
static int parse_env(yp_t *y) {
  agent_env_pair_t *pairs = NULL;
  size_t n = 0, cap = 0;
  agent_cfg_t *cfg = y->ctx->cfg;
  if (!is_null(&y->ev)) {
    if (y->ev.type != YAML_MAPPING_START_EVENT)
      return fail_at(y, y->ev.start_mark, "env: expected a mapping of NAME: value, found %s",
                     kind(&y->ev));
    for (;;) {
      char sv[96], what[128];
      if (next(y)) goto fail;
      if (y->ev.type == YAML_MAPPING_END_EVENT) break;
      if (want_scalar(y, "env", "a variable name")) goto fail;
      const char *name = (const char *)y->ev.data.scalar.value;
      agent_cfg__show(name, strlen(name), sv, sizeof sv);
      if (!env_name_ok(name)) {
        fail_at(y, y->ev.start_mark,
                "env: '%s' is not a variable name (letters, digits and _, not starting with a "
                "digit, at most 256)",
                sv);
        goto fail;
      }
      for (size_t i = 0; i < n; i++)
        if (!strcmp(pairs[i].name, name)) {
          fail_at(y, y->ev.start_mark, "env: duplicate variable '%s'", sv);
          goto fail;
        }
      if (n == CFG_YAML_MAX_ENV) {
        fail_at(y, y->ev.start_mark, "env: more than %d variables", CFG_YAML_MAX_ENV);
        goto fail;
      }
      if (n == cap) {
        size_t nc = cap ? cap * 2 : 8;
        agent_env_pair_t *np = realloc(pairs, nc * sizeof *np);
        if (np == NULL) goto oom;
        pairs = np, cap = nc;
      }
      pairs[n].value = NULL;
      if ((pairs[n].name = strdup(name)) == NULL) goto oom;
      n++;
      snprintf(what, sizeof what, "env.%s", sv);
      if (next(y)) goto fail;
      if (want_scalar(y, what, "a string")) goto fail;
      if (is_null(&y->ev)) {
        fail_at(y, y->ev.start_mark, "%s: a value is required (write \"\" for an empty one)", what);
        goto fail;
      }
      if ((pairs[n - 1].value = strdup((const char *)y->ev.data.scalar.value)) == NULL) goto oom;
    }
  }
  free_pairs(cfg->env, cfg->nenv);
  cfg->env = pairs;
  cfg->nenv = n;
  return 0;
oom:
  agent_cfg__fail(y->ctx, "%s: out of memory reading env:", y->path);
fail:
  free_pairs(pairs, n);
  return -1;
}

/* command: [prog, arg, ...] (the current event is the value of the `command` key). */
static int parse_command(yp_t *y) {
  char **v = NULL;
  size_t n = 0, cap = 0;
  agent_cfg_t *cfg = y->ctx->cfg;
  if (!is_null(&y->ev)) {
    if (y->ev.type != YAML_SEQUENCE_START_EVENT)
      return fail_at(y, y->ev.start_mark,
                     "command: expected a list of strings such as [python, train.py], found %s",
                     kind(&y->ev));
    for (;;) {
      char what[48];
      if (next(y)) goto fail;
      if (y->ev.type == YAML_SEQUENCE_END_EVENT) break;
      snprintf(what, sizeof what, "command[%zu]", n);
      if (want_scalar(y, what, "a string")) goto fail;
      if (is_null(&y->ev)) {
        fail_at(y, y->ev.start_mark, "%s: a value is required (write \"\" for an empty one)", what);
        goto fail;
      }
      if (n == CFG_YAML_MAX_CMD) {
        fail_at(y, y->ev.start_mark, "command: more than %d arguments", CFG_YAML_MAX_CMD);
        goto fail;
      }
      if (n + 1 >= cap) {
        size_t nc = cap ? cap * 2 : 8;
        char **nv = realloc(v, nc * sizeof *nv);
        if (nv == NULL) goto oom;
        v = nv, cap = nc;
      }
      if ((v[n] = strdup((const char *)y->ev.data.scalar.value)) == NULL) goto oom;
      v[++n] = NULL;
    }
  }
  agent_cfg__strv_free(cfg->cmd, cfg->ncmd);
  cfg->cmd = v;
  cfg->ncmd = n;
  return 0;
oom:
  agent_cfg__fail(y->ctx, "%s: out of memory reading command:", y->path);
fail:
  agent_cfg__strv_free(v, n);
  return -1;
}

/* The body of a mapping of settings; the MAPPING_START event was consumed. */
static int parse_mapping(yp_t *y, int discovery) {
  int seen[Y_NKEYS] = {0};
  size_t seen_line[Y_NKEYS];
  char seen_key[Y_NKEYS][24];
  for (;;) {
    char key[72], what[96], loc[4200];
    if (next(y)) return -1;
    if (y->ev.type == YAML_MAPPING_END_EVENT) return 0;
    yaml_mark_t km = y->ev.start_mark;
    if (y->ev.type != YAML_SCALAR_EVENT)
      return fail_at(y, km, "%skeys must be names, found %s", discovery ? "discovery: " : "",
                     kind(&y->ev));
    const char *k = (const char *)y->ev.data.scalar.value;
    int id = strlen(k) < sizeof key ? key_lookup(k, discovery) : -1;
    if (id < 0) return unknown_key(y, k, discovery, km);
    snprintf(key, sizeof key, "%s", k);
    snprintf(what, sizeof what, "%s%s", discovery ? "discovery." : "", key);
    if (seen[id]) {
      if (strcmp(seen_key[id], key))
        return fail_at(y, km, "%s: duplicate key (the same setting as %s at line %zu)", what,
                       seen_key[id], seen_line[id]);
      return fail_at(y, km, "%s: duplicate key (first at line %zu)", what, seen_line[id]);
    }
    seen[id] = 1;
    seen_line[id] = km.line + 1;
    snprintf(seen_key[id], sizeof seen_key[id], "%.23s", key);
    if (next(y)) return -1;
    switch (id) {
      case Y_DISCOVERY:
        if (is_null(&y->ev)) break;
        if (y->ev.type != YAML_MAPPING_START_EVENT)
          return fail_at(y, y->ev.start_mark, "discovery: expected a mapping, found %s",
                         kind(&y->ev));
        if (parse_mapping(y, 1)) return -1;
        break;
      case Y_ENV:
        if (parse_env(y)) return -1;
        break;
      case Y_COMMAND:
        if (parse_command(y)) return -1;
        break;
      default: {
        const cfg_opt_t *o = &agent_cfg__opts[id];
        if (want_scalar(y, what, o->metavar ? o->metavar : "true|false")) return -1;
        snprintf(loc, sizeof loc, "%s:%zu:%zu", y->path, y->ev.start_mark.line + 1,
                 y->ev.start_mark.column + 1);
        if (agent_cfg__set(y->ctx, (cfg_id_t)id, (const char *)y->ev.data.scalar.value,
                           is_null(&y->ev), CFG_SRC_YAML, loc, what))
          return -1;
      }
    }
  }
}

static int parse_stream(yp_t *y) {
  if (next(y)) return -1; /* STREAM_START */
  if (next(y)) return -1;
  if (y->ev.type == YAML_STREAM_END_EVENT) return 0; /* empty file: no settings */
  if (next(y)) return -1;                            /* after DOCUMENT_START */
  if (y->ev.type == YAML_MAPPING_START_EVENT) {
    if (parse_mapping(y, 0)) return -1;
  } else if (!is_null(&y->ev)) {
    return fail_at(y, y->ev.start_mark,
                   "the top level must be a mapping of settings (key: value), found %s",
                   kind(&y->ev));
  }
  if (next(y)) return -1; /* DOCUMENT_END */
  if (next(y)) return -1;
  if (y->ev.type == YAML_DOCUMENT_START_EVENT)
    return fail_at(y, y->ev.start_mark,
                   "a second YAML document ('---'): put all settings in one document");
  return 0;
}

/* Reads the whole file, refusing more than CFG_YAML_MAX_BYTES before parsing anything. */
static int read_file(cfg_ctx_t *ctx, const char *path, const char *from, unsigned char **out,
                     size_t *len) {
  char hint[240] = "";
  struct stat st;
  size_t cap = 65536, n = 0;
  unsigned char *buf;
  if (from) snprintf(hint, sizeof hint, " (from %s)", from);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return agent_cfg__fail(ctx, "%s: cannot open: %s%s", path, strerror(errno), hint);
  if (fstat(fd, &st) == 0) {
    if (S_ISDIR(st.st_mode)) {
      close(fd);
      return agent_cfg__fail(ctx, "%s: is a directory, not a YAML file%s", path, hint);
    }
    if (S_ISREG(st.st_mode) && st.st_size > (off_t)CFG_YAML_MAX_BYTES) {
      close(fd);
      return agent_cfg__fail(ctx, "%s: %lld bytes is over the %u-byte limit for a config file%s",
                             path, (long long)st.st_size, CFG_YAML_MAX_BYTES, hint);
    }
    if (S_ISREG(st.st_mode)) cap = (size_t)st.st_size + 1; /* + 1: EOF is seen without a grow */
  }
  if ((buf = malloc(cap)) == NULL) {
    close(fd);
    return agent_cfg__fail(ctx, "%s: out of memory", path);
  }
  for (;;) {
    if (n == cap) {
      if (cap > CFG_YAML_MAX_BYTES) break; /* read one byte past the limit: too large */
      size_t nc = cap * 2 > CFG_YAML_MAX_BYTES + 1 ? CFG_YAML_MAX_BYTES + 1 : cap * 2;
      unsigned char *nb = realloc(buf, nc);
      if (nb == NULL) {
        free(buf);
        close(fd);
        return agent_cfg__fail(ctx, "%s: out of memory", path);
      }
      buf = nb, cap = nc;
    }
    ssize_t r = read(fd, buf + n, cap - n);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      int e = errno;
      free(buf);
      close(fd);
      return agent_cfg__fail(ctx, "%s: cannot read: %s%s", path, strerror(e), hint);
    }
    if (r == 0) break;
    n += (size_t)r;
  }
  close(fd);
  if (n > CFG_YAML_MAX_BYTES) {
    free(buf);
    return agent_cfg__fail(ctx, "%s: over the %u-byte limit for a config file%s", path,
                           CFG_YAML_MAX_BYTES, hint);
  }
  *out = buf;
  *len = n;
  return 0;
}

int agent_cfg__load_yaml(cfg_ctx_t *ctx, const char *path, const char *from) {
  yp_t y = {.ctx = ctx, .path = path};
  unsigned char *buf = NULL;
  size_t len = 0;
  if (read_file(ctx, path, from, &buf, &len)) return -1;
  if (!yaml_parser_initialize(&y.parser)) {
    free(buf);
    return agent_cfg__fail(ctx, "%s: out of memory", path);
  }
  y.buf = buf;
  y.len = len;
  yaml_parser_set_input_string(&y.parser, buf, len);
  int rc = parse_stream(&y);
  if (y.have_ev) yaml_event_delete(&y.ev);
  yaml_parser_delete(&y.parser);
  free(buf);
  return rc;
}

int agent_cfg_load_yaml(agent_cfg_t *cfg, const char *path, char *err, size_t cap) {
  cfg_ctx_t ctx;
  agent_cfg__ctx_init(&ctx, cfg, err, cap);
  if (path == NULL || *path == '\0') return agent_cfg__fail(&ctx, "no YAML file given");
  if (agent_cfg__load_yaml(&ctx, path, NULL)) return -1;
  return agent_cfg__resolve_nproc(&ctx);
}

/* --- dump --- */

/* A double-quoted YAML scalar in pure ASCII: code points above 0x7e and control characters as
 * escapes, which libyaml turns back into the same UTF-8. Bytes that are not UTF-8 become \xNN
 * (U+00NN): the only inexact case. */
static void put_q(FILE *f, const char *str) {
  const unsigned char *s = (const unsigned char *)str;
  size_t len = strlen(str);
  fputc('"', f);
  for (size_t i = 0; i < len;) {
    unsigned c = s[i], cp = 0, n = 0;
    if (c == '"' || c == '\\') {
      fputc('\\', f);
      fputc((int)c, f);
      i++;
      continue;
    }
    if (c >= 0x20 && c < 0x7f) {
      fputc((int)c, f);
      i++;
      continue;
    }
    if (c == '\n' || c == '\t') {
      fputs(c == '\n' ? "\\n" : "\\t", f);
      i++;
      continue;
    }
    int l = c >= 0x80 ? agent_utf8_next((const char *)s + i, len - i, &cp) : 0;
    n = l > 0 ? (unsigned)l : 0;
    if (n == 0) n = 1, cp = c;
    if (cp < 0x100)
      fprintf(f, "\\x%02X", cp);
    else if (cp < 0x10000)
      fprintf(f, "\\u%04X", cp);
    else
      fprintf(f, "\\U%08X", cp);
    i += n;
  }
  fputc('"', f);
}

static void put_value(FILE *f, const agent_cfg_t *cfg, const cfg_opt_t *o) {
  char d[48];
  switch (o->type) {
    case CFG_T_NNODES:
      if (cfg->nnodes_min == cfg->nnodes_max)
        fprintf(f, "%d", cfg->nnodes_min);
      else
        fprintf(f, "\"%d:%d\"", cfg->nnodes_min, cfg->nnodes_max);
      break;
    case CFG_T_NPROC:
    case CFG_T_INT: {
      int v = *CFG_FIELD(cfg, const int, o->off);
      if (o->nullable && v == -1)
        fputs("null", f);
      else
        fprintf(f, "%d", v);
      break;
    }
    case CFG_T_DUR:
      agent_cfg__fmt_dur(*CFG_FIELD(cfg, const double, o->off), d, sizeof d);
      fputs(d, f);
      break;
    case CFG_T_BOOL: fputs(*CFG_FIELD(cfg, const int, o->off) ? "true" : "false", f); break;
    case CFG_T_STR:
    case CFG_T_BACKEND: {
      const char *s = *CFG_FIELD(cfg, char *const, o->off);
      if (s)
        put_q(f, s);
      else
        fputs("null", f);
      break;
    }
    case CFG_T_SCHEME: {
      const char *s = agent_scheme_name(cfg->scheme);
      if (s)
        put_q(f, s);
      else
        fputs("null", f);
      break;
    }
    case CFG_T_LOGFMT:
      fputs(cfg->log_format == AGENT_LOG_FORMAT_JSON ? "\"json\"" : "\"text\"", f);
      break;
    case CFG_T_ACTION: break;
  }
}

int agent_cfg_dump_yaml(const agent_cfg_t *cfg, FILE *out) {
  int in_discovery = 0;
  fprintf(out, "# tdist-agent %s: effective configuration (tdist-agent --config FILE reads it)\n",
          TDIST_VERSION_STRING);
  if (cfg->config_path) {
    fputs("# loaded from ", out);
    put_q(out, cfg->config_path);
    fputc('\n', out);
  }
  for (int id = 0; id < CFG_NOPTS; id++) {
    const cfg_opt_t *o = &agent_cfg__opts[id];
    if (o->yaml == NULL) continue;
    if (o->discovery && !in_discovery) fputs("discovery:\n", out);
    in_discovery = o->discovery;
    fprintf(out, "%s%s: ", o->discovery ? "  " : "", o->yaml);
    put_value(out, cfg, o);
    fputc('\n', out);
  }
  if (cfg->nenv == 0)
    fputs("env: {}\n", out);
  else
    fputs("env:\n", out);
  for (size_t i = 0; i < cfg->nenv; i++) {
    fputs("  ", out);
    put_q(out, cfg->env[i].name);
    fputs(": ", out);
    put_q(out, cfg->env[i].value ? cfg->env[i].value : "");
    fputc('\n', out);
  }
  if (cfg->ncmd == 0)
    fputs("command: []\n", out);
  else
    fputs("command:\n", out);
  for (size_t i = 0; i < cfg->ncmd; i++) {
    fputs("  - ", out);
    put_q(out, cfg->cmd[i]);
    fputc('\n', out);
  }
  return ferror(out) ? -1 : 0;
}
