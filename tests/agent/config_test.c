/* agent_cfg_* (operator-agent/config/config.h): precedence flag > env > YAML > default with random
 * values, TDIST_ over PET_ over plain MASTER_ADDR/MASTER_PORT, both flag spellings and the '='
 * form for every flag, the worker command after "--" and torchrun style, every class of error
 * with its exact message (YAML ones with FILE:LINE:COLUMN), --standalone defaults and conflicts,
 * the YAML dump read back to an equal struct (fixed tricky strings and random configurations),
 * and random bytes and mutations of a valid file that must never crash. TDIST_TEST_SEED=N
 * repeats a run. */
#define _GNU_SOURCE
#include <ctype.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "operator-agent/config/config.h"
#include "tests/agent/cfg_equal.h"
#include "tests/fuzz/config_gen.h"
#include "tests/testlib/check.h"

#define CHECK_STR(a, b)                                                                     \
  do {                                                                                      \
    const char *sa_ = (a), *sb_ = (b);                                                      \
    if (sa_ == NULL || sb_ == NULL || strcmp(sa_, sb_) != 0) {                              \
      fprintf(stderr, "%s:%d: CHECK_STR failed:\n  %s = \"%s\"\n  %s = \"%s\"\n", __FILE__, \
              __LINE__, #a, sa_ ? sa_ : "(null)", #b, sb_ ? sb_ : "(null)");                \
      exit(1);                                                                              \
    }                                                                                       \
  } while (0)

#define ARGS(...) ((const char *[]){"tdist-agent", __VA_ARGS__, NULL})
#define ENVS(...) ((const char *[]){__VA_ARGS__, NULL})
#define NOENV ((const char *[]){NULL})

static cfg_rng_t g_rng;
static uint64_t below(uint64_t n) { return cfg_below(&g_rng, n); }

static char g_dir[512];

static const char *write_file(const char *name, const void *data, size_t len) {
  static char path[4][700];
  static int k;
  char *p = path[k++ % 4];
  snprintf(p, sizeof path[0], "%s/%s", g_dir, name);
  FILE *f = fopen(p, "wb");
  CHECK(f != NULL);
  CHECK(fwrite(data, 1, len, f) == len);
  CHECK(fclose(f) == 0);
  return p;
}
static const char *yaml_file(const char *text) { return write_file("t.yaml", text, strlen(text)); }

static agent_cfg_result_t load(agent_cfg_t *c, char *err, const char **argv, const char **envp) {
  int argc = 0;
  while (argv[argc]) argc++;
  return agent_cfg_load(c, argc, (char **)argv, (char **)envp, err, 512);
}

static char *dump(const agent_cfg_t *c) {
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  CHECK(f != NULL);
  CHECK(agent_cfg_dump_yaml(c, f) == 0);
  CHECK(fclose(f) == 0);
  return buf;
}

/* A dump without its comment lines (a YAML-loaded one names the file). */
static const char *body(const char *d) {
  const char *b = strstr(d, "\nnnodes:");
  CHECK(b != NULL);
  return b;
}

/* The dump of a successful load, or aborts with the message. */
static char *dump_of(const char **argv, const char **envp) {
  agent_cfg_t c;
  char err[512];
  agent_cfg_result_t r = load(&c, err, argv, envp);
  if (r != AGENT_CFG_OK) {
    fprintf(stderr, "unexpected load failure (%d): %s\n", (int)r, err);
    exit(1);
  }
  char *d = dump(&c);
  agent_cfg_free(&c);
  return d;
}

static void same_dump(const char *want, const char **argv, const char **envp) {
  char *d = dump_of(argv, envp);
  CHECK_STR(d, want);
  free(d);
}

#define EXPECT_ERR(argv, envp, msg)                               \
  do {                                                            \
    agent_cfg_t c_;                                               \
    char e_[512];                                                 \
    CHECK_EQ_INT(load(&c_, e_, (argv), (envp)), AGENT_CFG_ERROR); \
    CHECK_STR(e_, (msg));                                         \
    agent_cfg_free(&c_);                                          \
  } while (0)

/* agent_cfg_load_yaml of `text` on defaults must fail with "<path><suffix>". */
static void yaml_err_at(int line, const char *text, size_t len, const char *suffix) {
  agent_cfg_t c;
  char err[512], want[1024];
  const char *p = write_file("e.yaml", text, len);
  agent_cfg_defaults(&c);
  snprintf(want, sizeof want, "%s%s", p, suffix);
  if (agent_cfg_load_yaml(&c, p, err, sizeof err) != -1 || strcmp(err, want)) {
    fprintf(stderr, "config_test.c:%d: YAML error mismatch\n  got:  %s\n  want: %s\n", line, err,
            want);
    exit(1);
  }
  agent_cfg_free(&c);
}
#define YAML_ERR(text, suffix) yaml_err_at(__LINE__, (text), strlen(text), (suffix))

static void test_defaults(void) {
  agent_cfg_t c;
  char err[512];
  CHECK_EQ_INT(load(&c, err, ARGS("python"), NOENV), AGENT_CFG_OK);
  CHECK(c.nnodes_min == 1 && c.nnodes_max == 1 && c.nproc_per_node == 1 && c.node_rank == -1);
  CHECK(c.master_addr == NULL && c.master_port == 29500 && c.max_restarts == 0);
  CHECK_STR(c.run_id, "none");
  CHECK_STR(c.role, "default");
  CHECK_STR(c.backend, "gloo");
  CHECK(c.monitor_interval_s == 0.1 && c.rdzv_timeout_s == 900 && c.last_call_s == 30);
  CHECK(c.heartbeat_interval_s == 5 && c.heartbeat_timeout_s == 15 && c.stop_grace_s == 30);
  CHECK(c.scheme == AGENT_SCHEME_INDEXED_JOB && c.master_template == NULL && c.job_name == NULL);
  CHECK(c.service == NULL && c.namespace_ == NULL && c.cluster_domain == NULL);
  CHECK_STR(c.replicated_job, "node");
  CHECK_STR(c.task, "worker");
  CHECK_STR(c.http_host, "");
  CHECK(c.http_port == 29600 && c.http_port_file == NULL && c.omp_num_threads == 0);
  CHECK_STR(c.log_dir, "/tmp");
  CHECK(c.log_format == AGENT_LOG_FORMAT_TEXT && c.config_path == NULL && !c.check_config);
  CHECK(!c.standalone && c.nenv == 0 && c.ncmd == 1 && c.cmd[1] == NULL);
  CHECK_STR(c.cmd[0], "python");
  agent_cfg_free(&c);
  agent_cfg_free(&c); /* zeroed: a second free is harmless */
  CHECK_EQ_INT(load(&c, err, ARGS("x"), ENVS("TMPDIR=/scratch/t")), AGENT_CFG_OK);
  CHECK_STR(c.log_dir, "/scratch/t");
  agent_cfg_free(&c);
  CHECK_STR(agent_scheme_name(AGENT_SCHEME_VOLCANO), "volcano");
  CHECK(agent_scheme_name((agent_scheme_t)7) == NULL);
}

/* --- precedence with random values --- */

typedef struct {
  const char *flag, *env, *yaml;
  int kind; /* 0 int [lo,hi], 1 id string, 2 duration seconds */
  long lo, hi;
} prec_t;

static void value_of(const agent_cfg_t *c, const char *flag, char *out, size_t cap) {
  if (!strcmp(flag, "max-restarts"))
    snprintf(out, cap, "%d", c->max_restarts);
  else if (!strcmp(flag, "master-port"))
    snprintf(out, cap, "%d", c->master_port);
  else if (!strcmp(flag, "nproc-per-node"))
    snprintf(out, cap, "%d", c->nproc_per_node);
  else if (!strcmp(flag, "role"))
    snprintf(out, cap, "%s", c->role);
  else if (!strcmp(flag, "run-id"))
    snprintf(out, cap, "%s", c->run_id);
  else if (!strcmp(flag, "rdzv-timeout"))
    snprintf(out, cap, "%.17g", c->rdzv_timeout_s);
  else if (!strcmp(flag, "omp-num-threads"))
    snprintf(out, cap, "%d", c->omp_num_threads);
  else
    CHECK(!"unknown flag in value_of");
}

static void random_value(const prec_t *p, char *text, char *expect, size_t cap) {
  if (p->kind == 0) {
    long v;
    do v = p->lo + (long)below((uint64_t)(p->hi - p->lo + 1));
    while (v == 29600); /* the HTTP port: master port == HTTP port is an error */
    snprintf(text, cap, "%ld", v);
    snprintf(expect, cap, "%ld", v);
  } else if (p->kind == 1) {
    static const char cs[] = "abcXYZ019._:-";
    size_t n = 1 + below(12);
    for (size_t i = 0; i < n; i++) text[i] = cs[below(sizeof cs - 1)];
    text[n] = '\0';
    snprintf(expect, cap, "%s", text);
  } else {
    long v = 1 + (long)below(500);
    int unit = (int)below(3);
    snprintf(text, cap, "%ld%s", v, unit == 0 ? "" : unit == 1 ? "s" : "m");
    snprintf(expect, cap, "%.17g", (double)v * (unit == 2 ? 60 : 1));
  }
}

static void test_precedence(void) {
  static const prec_t keys[] = {
      {"max-restarts", "PET_MAX_RESTARTS", "max_restarts", 0, 0, 1000000},
      {"master-port", "TDIST_MASTER_PORT", "master_port", 0, 1, 65535},
      {"nproc-per-node", "PET_NPROC_PER_NODE", "nproc_per_node", 0, 1, 4096},
      {"role", "PET_ROLE", "role", 1, 0, 0},
      {"run-id", "PET_RDZV_ID", "rdzv_id", 1, 0, 0},
      {"rdzv-timeout", "TDIST_RDZV_TIMEOUT", "rdzv_timeout", 2, 0, 0},
      {"omp-num-threads", "TDIST_OMP_NUM_THREADS", "omp_num_threads", 0, 0, 65536},
  };
  for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++) {
    const prec_t *p = &keys[k];
    for (int mask = 0; mask < 8; mask++) {
      char yv[64], ye[64], ev[64], ee[64], fv[64], fe[64], def[64], got[64], line[160], envs[160],
          flag[160], cfgflag[700], err[512];
      agent_cfg_t c;
      random_value(p, yv, ye, sizeof yv);
      random_value(p, ev, ee, sizeof ev);
      random_value(p, fv, fe, sizeof fv);
      CHECK_EQ_INT(load(&c, err, ARGS("x"), NOENV), AGENT_CFG_OK);
      value_of(&c, p->flag, def, sizeof def);
      agent_cfg_free(&c);
      snprintf(line, sizeof line, "%s: \"%s\"\n", p->yaml, yv);
      snprintf(cfgflag, sizeof cfgflag, "--config=%s", yaml_file(line));
      snprintf(envs, sizeof envs, "%s=%s", p->env, ev);
      snprintf(flag, sizeof flag, "--%s=%s", p->flag, fv);
      const char *argv[] = {"tdist-agent", (mask & 1) ? cfgflag : "--log-format=text",
                            (mask & 4) ? flag : "--backend=gloo", "x", NULL};
      const char *envp[] = {(mask & 2) ? envs : "UNRELATED=1", NULL};
      agent_cfg_result_t r = load(&c, err, argv, envp);
      if (r != AGENT_CFG_OK) {
        fprintf(stderr, "precedence %s mask %d: %s\n", p->flag, mask, err);
        exit(1);
      }
      value_of(&c, p->flag, got, sizeof got);
      CHECK_STR(got, (mask & 4) ? fe : (mask & 2) ? ee : (mask & 1) ? ye : def);
      agent_cfg_free(&c);
    }
  }
}

static void test_env_names(void) {
  agent_cfg_t c;
  char err[512];
  /* TDIST_ wins over PET_, PET_ over plain; empty counts as unset. */
  CHECK_EQ_INT(load(&c, err, ARGS("x"),
                    ENVS("PET_NNODES=3", "TDIST_NNODES=2:5", "PET_NPROC_PER_NODE=7",
                         "TDIST_NPROC_PER_NODE=", "MASTER_ADDR=plain", "PET_MASTER_ADDR=pet",
                         "MASTER_PORT=23456", "PET_MAX_RESTARTS=", "TDIST_ROLE=r1", "PET_ROLE=r2")),
               AGENT_CFG_OK);
  CHECK(c.nnodes_min == 2 && c.nnodes_max == 5 && c.nproc_per_node == 7 && c.max_restarts == 0);
  CHECK_STR(c.master_addr, "pet");
  CHECK_EQ_INT(c.master_port, 23456);
  CHECK_STR(c.role, "r1");
  agent_cfg_free(&c);
  /* Plain MASTER_ADDR/MASTER_PORT beat YAML but lose to flags. */
  char cfgflag[700];
  snprintf(cfgflag, sizeof cfgflag, "--config=%s",
           yaml_file("master_addr: yaml-host\nmaster_port: 1111\n"));
  CHECK_EQ_INT(load(&c, err, ARGS(cfgflag, "--master-port", "2222", "x"),
                    ENVS("MASTER_ADDR=kf-master-0", "MASTER_PORT=23456")),
               AGENT_CFG_OK);
  CHECK_STR(c.master_addr, "kf-master-0");
  CHECK_EQ_INT(c.master_port, 2222);
  agent_cfg_free(&c);
  /* Every flag has TDIST_<UPPER_SNAKE>; the torchrun ones PET_ too; TDIST_CONFIG. */
  CHECK_EQ_INT(load(&c, err, ARGS("x"),
                    ENVS("TDIST_CONFIG=", "PET_STANDALONE=yes", "PET_RDZV_ID=kf",
                         "TDIST_HTTP_PORT=-1", "TDIST_CHECK_CONFIG=1", "PET_MONITOR_INTERVAL=2",
                         "PET_LOG_DIR=/logs", "TDIST_NAMESPACE=ns1")),
               AGENT_CFG_OK);
  CHECK(c.standalone && c.http_port == -1 && c.check_config && c.monitor_interval_s == 2);
  CHECK_STR(c.run_id, "kf");
  CHECK_STR(c.log_dir, "/logs");
  CHECK_STR(c.namespace_, "ns1");
  agent_cfg_free(&c);
  CHECK_EQ_INT(load(&c, err, ARGS("x"), ENVS("TDIST_CONFIG", "PET_STANDALONE")), AGENT_CFG_OK);
  agent_cfg_free(&c); /* malformed entries without '=' are ignored */
}

/* Every flag: dash and underscore spellings, "--f v" and "--f=v", TDIST_/PET_ env and the YAML
 * key all give the same configuration, which differs from the defaults; --help names them all. */
static void test_every_flag(void) {
  static const struct {
    const char *flag, *value, *pet, *yaml;
  } t[] = {
      {"nnodes", "3", "PET_NNODES", "nnodes"},
      {"nproc-per-node", "3", "PET_NPROC_PER_NODE", "nproc_per_node"},
      {"node-rank", "0", "PET_NODE_RANK", "node_rank"},
      {"master-addr", "10.1.2.3", "PET_MASTER_ADDR", "master_addr"},
      {"master-port", "1234", "PET_MASTER_PORT", "master_port"},
      {"run-id", "abc", "PET_RDZV_ID", "run_id"},
      {"rdzv-id", "abc", "PET_RDZV_ID", "rdzv_id"},
      {"max-restarts", "7", "PET_MAX_RESTARTS", "max_restarts"},
      {"monitor-interval", "250ms", "PET_MONITOR_INTERVAL", "monitor_interval"},
      {"role", "trainer", "PET_ROLE", "role"},
      {"backend", "nccl", NULL, "backend"},
      {"rdzv-timeout", "5m", NULL, "rdzv_timeout"},
      {"last-call", "1", NULL, "last_call"},
      {"heartbeat-interval", "2", NULL, "heartbeat_interval"},
      {"heartbeat-timeout", "0.5h", NULL, "heartbeat_timeout"},
      {"stop-grace-period", "0", NULL, "stop_grace_period"},
      {"scheme", "jobset", NULL, "discovery.scheme"},
      {"master-template", "{job}-0.{service}.", NULL, "discovery.master_template"},
      {"job-name", "j", NULL, "discovery.job_name"},
      {"service", "s", NULL, "discovery.service"},
      {"namespace", "ns", NULL, "discovery.namespace"},
      {"cluster-domain", "c.local", NULL, "discovery.cluster_domain"},
      {"replicated-job", "rj", NULL, "discovery.replicated_job"},
      {"task", "t", NULL, "discovery.task"},
      {"http-host", "::1", NULL, "http_host"},
      {"http-port", "-1", NULL, "http_port"},
      {"http-port-file", "/tmp/p", NULL, "http_port_file"},
      {"log-dir", "/var/log/x", "PET_LOG_DIR", "log_dir"},
      {"omp-num-threads", "4", NULL, "omp_num_threads"},
      {"log-format", "json", NULL, "log_format"},
  };
  const char *usage = agent_cfg_usage();
  char *def = dump_of(ARGS("x"), NOENV);
  for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
    char dash[64], us[64], eqd[128], equ[128], env[128], pet[128], yaml[256], cfgflag[700];
    snprintf(dash, sizeof dash, "--%s", t[i].flag);
    snprintf(us, sizeof us, "--%s", t[i].flag);
    for (char *p = us + 2; *p; p++)
      if (*p == '-') *p = '_';
    snprintf(eqd, sizeof eqd, "%s=%s", dash, t[i].value);
    snprintf(equ, sizeof equ, "%s=%s", us, t[i].value);
    snprintf(env, sizeof env, "TDIST_%s=%s", us + 2, t[i].value);
    for (char *p = env; *p != '='; p++) *p = (char)toupper((unsigned char)*p);
    char *d1 = dump_of(ARGS(dash, t[i].value, "x"), NOENV);
    if (!strcmp(d1, def)) {
      fprintf(stderr, "%s %s: same as the defaults\n", dash, t[i].value);
      exit(1);
    }
    same_dump(d1, ARGS(us, t[i].value, "x"), NOENV);
    same_dump(d1, ARGS(eqd, "x"), NOENV);
    same_dump(d1, ARGS(equ, "x"), NOENV);
    same_dump(d1, ARGS("x"), ENVS(env));
    if (t[i].pet) {
      snprintf(pet, sizeof pet, "%s=%s", t[i].pet, t[i].value);
      same_dump(d1, ARGS("x"), ENVS(pet));
      CHECK(strstr(usage, t[i].pet) != NULL);
    }
    if (!strncmp(t[i].yaml, "discovery.", 10))
      snprintf(yaml, sizeof yaml, "discovery:\n  %s: \"%s\"\n", t[i].yaml + 10, t[i].value);
    else
      snprintf(yaml, sizeof yaml, "%s: \"%s\"\n", t[i].yaml, t[i].value);
    snprintf(cfgflag, sizeof cfgflag, "--config=%s", yaml_file(yaml));
    char *d7 = dump_of(ARGS(cfgflag, "x"), NOENV);
    CHECK_STR(body(d7), body(d1));
    free(d1), free(d7);
    /* --help lists the flag, its TDIST_ name and its YAML key. */
    *strchr(env, '=') = '\0';
    const char *key = strchr(t[i].yaml, '.') ? strchr(t[i].yaml, '.') + 1 : t[i].yaml;
    CHECK(strstr(usage, dash) && strstr(usage, env) && strstr(usage, key));
  }
  free(def);
  for (const char *const *s =
           (const char *const[]){"--standalone", "--check-config", "--config", "--help", "-h",
                                 "--version", "TDIST_CONFIG", "PET_STANDALONE",
                                 "TDIST_CHECK_CONFIG", "MASTER_ADDR (lowest)", "\n  64 ", "\n  69 ",
                                 "\n  70 ", "\n  71 ", "128+N", NULL};
       *s; s++)
    CHECK(strstr(usage, *s) != NULL);
}

static void check_cmd(const agent_cfg_t *c, const char **want) {
  size_t n = 0;
  while (want[n]) n++;
  CHECK_EQ_INT(c->ncmd, n);
  for (size_t i = 0; i < n; i++) CHECK_STR(c->cmd[i], want[i]);
  CHECK(c->cmd[n] == NULL);
}

static void test_command(void) {
  agent_cfg_t c;
  char err[512], cfgflag[700];
  CHECK_EQ_INT(load(&c, err, ARGS("--nnodes", "2", "--", "python", "--nnodes", "3", "--"), NOENV),
               AGENT_CFG_OK);
  CHECK_EQ_INT(c.nnodes_max, 2);
  check_cmd(&c, ARGS("python", "--nnodes", "3", "--") + 1);
  agent_cfg_free(&c);
  /* torchrun style: the first argument that is not an option starts the command */
  CHECK_EQ_INT(
      load(&c, err,
           ARGS("--nproc-per-node", "2", "--standalone", "train.py", "--lr", "1", "--help"), NOENV),
      AGENT_CFG_OK);
  CHECK_EQ_INT(c.nproc_per_node, 2);
  check_cmd(&c, ARGS("train.py", "--lr", "1", "--help") + 1);
  agent_cfg_free(&c);
  CHECK_EQ_INT(load(&c, err, ARGS("-", "x"), NOENV), AGENT_CFG_OK); /* "-" is not an option */
  check_cmd(&c, ARGS("-", "x") + 1);
  agent_cfg_free(&c);
  /* no command on the command line: the YAML list; the command line wins over it */
  snprintf(cfgflag, sizeof cfgflag, "--config=%s",
           yaml_file("command: [python3, -u, \"train it.py\", \"\"]\n"));
  CHECK_EQ_INT(load(&c, err, ARGS(cfgflag, "--"), NOENV), AGENT_CFG_OK);
  check_cmd(&c, ARGS("python3", "-u", "train it.py", "") + 1);
  agent_cfg_free(&c);
  CHECK_EQ_INT(load(&c, err, ARGS(cfgflag, "bash", "-c", "true"), NOENV), AGENT_CFG_OK);
  check_cmd(&c, ARGS("bash", "-c", "true") + 1);
  agent_cfg_free(&c);
  static const char no_cmd[] =
      "no worker command: give it after the flags (tdist-agent [FLAGS] [--] COMMAND [ARGS]) or "
      "as command: in the YAML file";
  EXPECT_ERR(ARGS("--nnodes", "2"), NOENV, no_cmd);
  EXPECT_ERR(ARGS("--"), NOENV, no_cmd);
  EXPECT_ERR(((const char *[]){"tdist-agent", NULL}), NOENV, no_cmd);
  CHECK_EQ_INT(load(&c, err, ARGS("--check-config"), NOENV), AGENT_CFG_OK); /* optional there */
  CHECK(c.check_config && c.ncmd == 0);
  agent_cfg_free(&c);
  CHECK_EQ_INT(load(&c, err, ((const char *[]){NULL}), NOENV), AGENT_CFG_ERROR); /* argc 0 */
  agent_cfg_free(&c);
}

static void test_help_version(void) {
  agent_cfg_t c;
  char err[512];
  CHECK_EQ_INT(load(&c, err, ARGS("-h"), NOENV), AGENT_CFG_HELP);
  agent_cfg_free(&c);
  CHECK_EQ_INT(load(&c, err, ARGS("--nnodes=bad", "--bogus", "--help"), NOENV), AGENT_CFG_HELP);
  agent_cfg_free(&c);
  CHECK_EQ_INT(load(&c, err, ARGS("--version", "--config=/nonexistent"), NOENV), AGENT_CFG_VERSION);
  agent_cfg_free(&c);
  CHECK_EQ_INT(load(&c, err, ARGS("x", "--help"), NOENV), AGENT_CFG_OK); /* part of the command */
  agent_cfg_free(&c);
  EXPECT_ERR(ARGS("--help=yes"), NOENV, "'--help' takes no value (it is a switch)");
}

static void test_flag_env_errors(void) {
  EXPECT_ERR(ARGS("--nproc", "2", "x"), NOENV,
             "unknown flag '--nproc'; did you mean --nproc-per-node? (tdist-agent --help lists "
             "the flags)");
  EXPECT_ERR(ARGS("--max-restart=2", "x"), NOENV,
             "unknown flag '--max-restart'; did you mean --max-restarts? (tdist-agent --help "
             "lists the flags)");
  EXPECT_ERR(ARGS("--rdzv_endpoint=h:1", "x"), NOENV,
             "unknown flag '--rdzv_endpoint': a torchrun flag that tdist-agent does not have "
             "(tdist-agent --help lists the flags)");
  EXPECT_ERR(ARGS("--frobnicate", "x"), NOENV,
             "unknown flag '--frobnicate' (tdist-agent --help lists the flags)");
  EXPECT_ERR(ARGS("--nproc_per-node=2", "x"), NOENV,
             "unknown flag '--nproc_per-node'; did you mean --nproc-per-node? (tdist-agent --help "
             "lists the flags)");
  EXPECT_ERR(ARGS("-x"), NOENV, "unknown flag '-x' (tdist-agent --help lists the flags)");
  EXPECT_ERR(ARGS("--nnodes"), NOENV, "'--nnodes' needs a value (N|MIN:MAX)");
  EXPECT_ERR(ARGS("--master-addr", "--nnodes", "2", "x"), NOENV,
             "'--master-addr' needs a value (HOST)");
  EXPECT_ERR(ARGS("--standalone=1", "x"), NOENV, "'--standalone' takes no value (it is a switch)");
  EXPECT_ERR(ARGS("--max-restarts", "three", "x"), NOENV,
             "--max-restarts: 'three' is not an integer (expected 0..1000000)");
  EXPECT_ERR(ARGS("--max_restarts=1000001", "x"), NOENV,
             "--max_restarts: '1000001' is out of range 0..1000000");
  EXPECT_ERR(ARGS("--nproc-per-node", "0", "x"), NOENV,
             "--nproc-per-node: '0' is out of range 1..4096");
  EXPECT_ERR(ARGS("--nproc-per-node", "2x", "x"), NOENV,
             "--nproc-per-node: '2x' is not an integer 1..4096 or cpu|gpu|auto");
  EXPECT_ERR(ARGS("--node-rank", "99999999999999999999999", "x"), NOENV,
             "--node-rank: '99999999999999999999999' is out of range 0..65535");
  EXPECT_ERR(ARGS("--node-rank", " 1", "x"), NOENV,
             "--node-rank: ' 1' is not an integer (expected 0..65535)");
  EXPECT_ERR(ARGS("--http-port=-2", "x"), NOENV, "--http-port: '-2' is out of range -1..65535");
  EXPECT_ERR(ARGS("x"), ENVS("PET_NNODES=2:1"), "env PET_NNODES: '2:1': MIN must be <= MAX");
  EXPECT_ERR(ARGS("x"), ENVS("TDIST_NNODES=0"), "env TDIST_NNODES: '0' is out of range 1..65536");
  EXPECT_ERR(ARGS("--nnodes", "1:", "x"), NOENV, "--nnodes: '1:' is not N or MIN:MAX (1..65536)");
  EXPECT_ERR(ARGS("--monitor-interval", "fast", "x"), NOENV,
             "--monitor-interval: 'fast' is not a duration (seconds such as 30 or 0.5, or with a "
             "unit: 100ms, 30s, 5m, 1h)");
  EXPECT_ERR(ARGS("--rdzv-timeout", "0", "x"), NOENV, "--rdzv-timeout: '0' must be greater than 0");
  EXPECT_ERR(ARGS("--last-call", "-1", "x"), NOENV,
             "--last-call: '-1' is not a duration (seconds such as 30 or 0.5, or with a unit: "
             "100ms, 30s, 5m, 1h)");
  EXPECT_ERR(ARGS("--stop-grace-period", "0.0001", "x"), NOENV,
             "--stop-grace-period: '0.0001' is below 1ms (use 0 or at least 1ms)");
  EXPECT_ERR(ARGS("--rdzv-timeout", "200000h", "x"), NOENV,
             "--rdzv-timeout: '200000h' is out of range (at most 10000000 s)");
  EXPECT_ERR(ARGS("--scheme", "k8s", "x"), NOENV,
             "--scheme: 'k8s' is not one of indexed-job|kubeflow|jobset|volcano");
  EXPECT_ERR(ARGS("--backend", "mpi", "x"), NOENV, "--backend: 'mpi' is not one of gloo|nccl");
  EXPECT_ERR(ARGS("--log-format", "xml", "x"), NOENV,
             "--log-format: 'xml' is not one of text|json");
  EXPECT_ERR(ARGS("x"), ENVS("TDIST_STANDALONE=maybe"),
             "env TDIST_STANDALONE: 'maybe' is not a boolean (true|false|1|0|yes|no)");
  EXPECT_ERR(ARGS("--run-id", "a/b", "x"), NOENV,
             "--run-id: 'a/b' may only contain A-Z a-z 0-9 . _ : -");
  EXPECT_ERR(ARGS("--role", "", "x"), NOENV, "--role: must not be empty");
  EXPECT_ERR(ARGS("--master-addr", "a b", "x"), NOENV,
             "--master-addr: 'a b' must not contain blanks or control characters");
  EXPECT_ERR(ARGS("--log-dir", "/a\nb", "x"), NOENV,
             "--log-dir: '/a\\x0ab' must not contain control characters");
  EXPECT_ERR(ARGS("--job-name", "\xff\xfe", "x"), NOENV,
             "--job-name: '\\xff\\xfe' is not valid UTF-8");
  EXPECT_ERR(ARGS("--master-port", "0", "x"), NOENV,
             "--master-port: '0' is out of range 1..65535 (port 0, an ephemeral port, needs "
             "--standalone)");
  EXPECT_ERR(ARGS("--heartbeat-timeout", "5", "x"), NOENV,
             "heartbeat timeout 5s (--heartbeat-timeout) must be greater than the heartbeat "
             "interval 5s (default); raise the timeout or lower the interval");
  EXPECT_ERR(ARGS("--nnodes", "1:4", "--last-call", "15m", "x"), ENVS("TDIST_RDZV_TIMEOUT=900"),
             "last call 900s (--last-call) must be less than the rendezvous timeout 900s (env "
             "TDIST_RDZV_TIMEOUT) when nnodes is MIN:MAX");
  EXPECT_ERR(ARGS("--node-rank", "3", "--nnodes", "3", "x"), NOENV,
             "--node-rank: node rank 3 must be below the number of nodes 3 (--nnodes); node "
             "ranks are 0..2");
  EXPECT_ERR(ARGS("--http-port", "29500", "x"), NOENV,
             "--http-port: HTTP port 29500 is also the master port (default); choose another one");
  EXPECT_ERR(ARGS("--config", "/nonexistent/a.yaml", "x"), NOENV,
             "/nonexistent/a.yaml: cannot open: No such file or directory (from --config)");
  EXPECT_ERR(ARGS("x"), ENVS("TDIST_CONFIG=/nonexistent/b.yaml"),
             "/nonexistent/b.yaml: cannot open: No such file or directory (from env "
             "TDIST_CONFIG)");
  /* the first error wins; a long value is shortened */
  char longv[300];
  memset(longv, 'a', sizeof longv - 1);
  longv[sizeof longv - 1] = '\0';
  EXPECT_ERR(ARGS("--role", longv, "--nnodes=0", "x"), NOENV,
             "--role: 'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa...' is longer "
             "than 128 bytes");
  /* a small error buffer is filled and terminated */
  agent_cfg_t c;
  char small[16];
  const char **argv = ARGS("--nnodes=0", "x");
  CHECK_EQ_INT(agent_cfg_load(&c, 3, (char **)argv, NULL, small, sizeof small), AGENT_CFG_ERROR);
  CHECK_STR(small, "--nnodes: '0' i");
  agent_cfg_free(&c);
}

static void test_standalone(void) {
  agent_cfg_t c;
  char err[512], cfgflag[700];
  CHECK_EQ_INT(load(&c, err, ARGS("--standalone", "x"),
                    ENVS("MASTER_ADDR=job-master-0", "MASTER_PORT=23456")),
               AGENT_CFG_OK);
  CHECK(c.standalone && c.nnodes_min == 1 && c.nnodes_max == 1 && c.node_rank == 0);
  CHECK_STR(c.master_addr, "127.0.0.1");
  CHECK_EQ_INT(c.master_port, 0);
  CHECK_EQ_INT(strlen(c.run_id), 36);
  for (int i = 0; i < 36; i++)
    CHECK((i == 8 || i == 13 || i == 18 || i == 23) ? c.run_id[i] == '-'
                                                    : isxdigit((unsigned char)c.run_id[i]));
  CHECK(c.run_id[14] == '4' && strchr("89ab", c.run_id[19]));
  char first[40];
  snprintf(first, sizeof first, "%s", c.run_id);
  agent_cfg_free(&c);
  CHECK_EQ_INT(load(&c, err, ARGS("x"), ENVS("PET_STANDALONE=1")), AGENT_CFG_OK);
  CHECK(c.standalone && strlen(c.run_id) == 36 && strcmp(c.run_id, first));
  agent_cfg_free(&c);
  /* given values stay; consistent ones are fine */
  CHECK_EQ_INT(load(&c, err,
                    ARGS("--standalone", "--master-port", "4321", "--run-id", "mine", "--nnodes",
                         "1:1", "--node-rank", "0", "--master-addr", "localhost", "x"),
                    NOENV),
               AGENT_CFG_OK);
  CHECK_EQ_INT(c.master_port, 4321);
  CHECK_STR(c.run_id, "mine");
  CHECK_STR(c.master_addr, "localhost");
  agent_cfg_free(&c);
  EXPECT_ERR(ARGS("--standalone", "--nnodes", "2", "x"), NOENV,
             "--nnodes: '2' conflicts with standalone (--standalone), which runs exactly one "
             "node; remove one of them");
  EXPECT_ERR(ARGS("--nnodes=1:3", "x"), ENVS("TDIST_STANDALONE=true"),
             "--nnodes: '1:3' conflicts with standalone (env TDIST_STANDALONE), which runs "
             "exactly one node; remove one of them");
  EXPECT_ERR(ARGS("--standalone", "x"), ENVS("PET_NODE_RANK=1"),
             "env PET_NODE_RANK: '1' conflicts with standalone (--standalone), where the only "
             "node has rank 0; remove one of them");
  const char *p = yaml_file("standalone: yes\nmaster_addr: 10.0.0.1\n");
  snprintf(cfgflag, sizeof cfgflag, "--config=%s", p);
  char want[1024];
  snprintf(want, sizeof want,
           "%s:2:14: master_addr: '10.0.0.1' conflicts with standalone (%s:1:13: standalone), "
           "which runs the store on 127.0.0.1; remove one of them",
           p, p);
  EXPECT_ERR(ARGS(cfgflag, "x"), NOENV, want);
}

static void test_nproc_symbolic(void) {
  agent_cfg_t c;
  char err[512];
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  int gpus = 0;
  char dev[64];
  for (int i = 0; i < 64; i++) {
    snprintf(dev, sizeof dev, "/dev/nvidia%d", i);
    gpus += access(dev, F_OK) == 0;
  }
  CHECK_EQ_INT(load(&c, err, ARGS("--nproc-per-node=cpu", "x"), NOENV), AGENT_CFG_OK);
  CHECK_EQ_INT(c.nproc_per_node, cpus > 4096 ? 4096 : cpus);
  agent_cfg_free(&c);
  CHECK_EQ_INT(load(&c, err, ARGS("--nproc-per-node=auto", "x"), NOENV), AGENT_CFG_OK);
  CHECK_EQ_INT(c.nproc_per_node, gpus ? gpus : cpus);
  agent_cfg_free(&c);
  /* a symbolic value that a higher source replaces is never resolved */
  CHECK_EQ_INT(load(&c, err, ARGS("--nproc-per-node=3", "x"), ENVS("PET_NPROC_PER_NODE=gpu")),
               AGENT_CFG_OK);
  CHECK_EQ_INT(c.nproc_per_node, 3);
  agent_cfg_free(&c);
  if (gpus == 0) {
    EXPECT_ERR(ARGS("x"), ENVS("PET_NPROC_PER_NODE=gpu"),
               "env PET_NPROC_PER_NODE: 'gpu': no GPU found (no /dev/nvidia<N> device); give a "
               "number, cpu or auto");
  } else {
    CHECK_EQ_INT(load(&c, err, ARGS("x"), ENVS("PET_NPROC_PER_NODE=gpu")), AGENT_CFG_OK);
    CHECK_EQ_INT(c.nproc_per_node, gpus);
    agent_cfg_free(&c);
  }
}

static void test_yaml_values(void) {
  agent_cfg_t c;
  char err[512];
  const char *p = yaml_file(
      "# a full file\n"
      "nnodes: 1:4\n"
      "nproc_per_node: 8\n"
      "node_rank: 2\n"
      "master_addr: trainer-0.svc\n"
      "master_port: 23456\n"
      "rdzv_id: 'job-7'\n"
      "max_restarts: 3\n"
      "monitor_interval: 100ms\n"
      "standalone: no\n"
      "role: worker\n"
      "backend: nccl\n"
      "rdzv_timeout: 10m\n"
      "last_call: 0\n"
      "heartbeat_interval: 1.5\n"
      "heartbeat_timeout: 1h\n"
      "stop_grace_period: 45s\n"
      "discovery:\n"
      "  scheme: kubeflow\n"
      "  master_template: \"{job}-master-0.{namespace}.svc.{domain}.\"\n"
      "  job_name: myjob\n"
      "  service: ~\n"
      "  namespace: team-a\n"
      "  cluster_domain: cluster.local\n"
      "  replicated_job: node\n"
      "  task: worker\n"
      "http_host: \"\"\n"
      "http_port: -1\n"
      "http_port_file: /run/port\n"
      "log_dir: /var/log/tdist\n"
      "omp_num_threads: 2\n"
      "log_format: json\n"
      "env: {NCCL_DEBUG: WARN, EMPTY: \"\", NUM: 10}\n"
      "command:\n"
      "  - python\n"
      "  - train.py\n");
  agent_cfg_defaults(&c);
  if (agent_cfg_load_yaml(&c, p, err, sizeof err)) {
    fprintf(stderr, "%s\n", err);
    exit(1);
  }
  CHECK(c.nnodes_min == 1 && c.nnodes_max == 4 && c.nproc_per_node == 8 && c.node_rank == 2);
  CHECK_STR(c.master_addr, "trainer-0.svc");
  CHECK(c.master_port == 23456 && c.max_restarts == 3 && c.monitor_interval_s == 0.1);
  CHECK_STR(c.run_id, "job-7");
  CHECK_STR(c.backend, "nccl");
  CHECK(c.rdzv_timeout_s == 600 && c.last_call_s == 0 && c.heartbeat_interval_s == 1.5);
  CHECK(c.heartbeat_timeout_s == 3600 && c.stop_grace_s == 45 && c.scheme == AGENT_SCHEME_KUBEFLOW);
  CHECK(c.service == NULL && c.http_port == -1 && c.omp_num_threads == 2);
  CHECK_STR(c.namespace_, "team-a");
  CHECK(c.log_format == AGENT_LOG_FORMAT_JSON && c.nenv == 3);
  CHECK_STR(c.env[0].name, "NCCL_DEBUG");
  CHECK_STR(c.env[1].value, "");
  CHECK_STR(c.env[2].value, "10");
  check_cmd(&c, ARGS("python", "train.py") + 1);
  /* nulls on top of set values unset them; a later file replaces env and command */
  p = yaml_file(
      "node_rank: null\nmaster_addr:\ndiscovery: {job_name: NULL}\nenv: {}\n"
      "command: []\nnnodes: 5\n");
  CHECK_EQ_INT(agent_cfg_load_yaml(&c, p, err, sizeof err), 0);
  CHECK(c.node_rank == -1 && c.master_addr == NULL && c.job_name == NULL && c.nenv == 0);
  CHECK(c.ncmd == 0 && c.cmd == NULL && c.nnodes_min == 5 && c.nnodes_max == 5);
  agent_cfg_free(&c);
  /* no settings: empty, comments only, an empty document, a null document, CRLF, BOM */
  static const char *const empty[] = {"",
                                      "# nothing\n",
                                      "---\n",
                                      "~\n",
                                      "---\n...\n",
                                      "role: a\r\nrdzv_id: b\r\n",
                                      "\xef\xbb\xbfrole: a\n"};
  for (size_t i = 0; i < sizeof empty / sizeof empty[0]; i++) {
    agent_cfg_defaults(&c);
    CHECK_EQ_INT(agent_cfg_load_yaml(&c, yaml_file(empty[i]), err, sizeof err), 0);
    agent_cfg_free(&c);
  }
  /* UTF-16 with a BOM is YAML too */
  static const char u16[] = "\xff\xfer\0o\0l\0e\0:\0 \0x\0\n\0";
  agent_cfg_defaults(&c);
  CHECK_EQ_INT(agent_cfg_load_yaml(&c, write_file("u16.yaml", u16, sizeof u16 - 1), err, 512), 0);
  CHECK_STR(c.role, "x");
  agent_cfg_free(&c);
  /* exactly 1 MiB is accepted, one byte more is not */
  size_t mib = 1u << 20;
  char *big = malloc(mib + 1);
  CHECK(big != NULL);
  memset(big, '#', mib + 1);
  big[mib - 1] = '\n';
  agent_cfg_defaults(&c);
  CHECK_EQ_INT(agent_cfg_load_yaml(&c, write_file("big.yaml", big, mib), err, 512), 0);
  agent_cfg_free(&c);
  big[mib - 1] = '#';
  big[mib] = '\n';
  yaml_err_at(__LINE__, big, mib + 1,
              ": 1048577 bytes is over the 1048576-byte limit for a config file");
  free(big);
}

static void test_yaml_errors(void) {
  YAML_ERR("role: b: c\n",
           ":1:8: YAML syntax error: mapping values are not allowed in this context");
  YAML_ERR("{",
           ":2:1: YAML syntax error: did not find expected node content (while parsing a "
           "flow node at line 2, column 1)");
  YAML_ERR("role: x\n\t- a\n",
           ":2:1: YAML syntax error: found a tab character that violates "
           "indentation (while scanning a plain scalar at line 1, column 7)");
  YAML_ERR("\t- a\n",
           ":1:1: YAML syntax error: found character that cannot start any token "
           "(while scanning for the next token at line 1, column 1)");
  YAML_ERR("role: \"abc\n",
           ":2:1: YAML syntax error: found unexpected end of stream (while "
           "scanning a quoted scalar at line 1, column 7)");
  YAML_ERR("role: x\nrole: \xff\n",
           ":2:7: YAML: invalid leading UTF-8 octet (0xFF); the file "
           "must be UTF-8 text");
  YAML_ERR("nproc_per_node: 2\nnprocs: 3\n",
           ":2:1: unknown key 'nprocs' (tdist-agent --help lists the YAML keys)");
  YAML_ERR("scheme: jobset\n", ":1:1: unknown key 'scheme': it belongs under discovery:");
  YAML_ERR("discovery:\n  nnodes: 2\n",
           ":2:3: unknown key 'discovery.nnodes': it belongs at the top level");
  YAML_ERR("discovery:\n  zone: a\n",
           ":2:3: unknown key 'discovery.zone' (tdist-agent --help lists the YAML keys)");
  YAML_ERR("role:\n  name: x\n", ":2:3: role: expected NAME, found a mapping");
  YAML_ERR("standalone: [true]\n", ":1:13: standalone: expected true|false, found a list");
  YAML_ERR("max_restarts: 1\nrole: a\nmax_restarts: 2\n",
           ":3:1: max_restarts: duplicate key (first at line 1)");
  YAML_ERR("run_id: a\nrdzv_id: b\n",
           ":2:1: rdzv_id: duplicate key (the same setting as run_id at line 1)");
  YAML_ERR("discovery: {}\ndiscovery: {}\n", ":2:1: discovery: duplicate key (first at line 1)");
  YAML_ERR("discovery:\n  task: a\n  task: b\n",
           ":3:3: discovery.task: duplicate key (first at line 2)");
  YAML_ERR("max_restarts: three\n",
           ":1:15: max_restarts: 'three' is not an integer (expected 0..1000000)");
  YAML_ERR("nnodes: \"4:2\"\n", ":1:9: nnodes: '4:2': MIN must be <= MAX");
  YAML_ERR("master_port: 65536\n", ":1:14: master_port: '65536' is out of range 0..65535");
  YAML_ERR("monitor_interval: 0\n", ":1:19: monitor_interval: '0' must be greater than 0");
  YAML_ERR("discovery:\n  scheme: foo\n",
           ":2:11: discovery.scheme: 'foo' is not one of indexed-job|kubeflow|jobset|volcano");
  YAML_ERR("discovery: 3\n", ":1:12: discovery: expected a mapping, found a single value");
  YAML_ERR("role:\n", ":1:6: role: a value is required (NAME)");
  YAML_ERR("role: \"a\\0b\"\n", ":1:7: role: the value contains a NUL character");
  YAML_ERR("env:\n  A: 1\n  A: 2\n", ":3:3: env: duplicate variable 'A'");
  YAML_ERR("env:\n  1A: x\n",
           ":2:3: env: '1A' is not a variable name (letters, digits and _, "
           "not starting with a digit, at most 256)");
  YAML_ERR("env:\n  A: [1]\n", ":2:6: env.A: expected a string, found a list");
  YAML_ERR("env:\n  A:\n", ":2:5: env.A: a value is required (write \"\" for an empty one)");
  YAML_ERR("env: [A]\n", ":1:6: env: expected a mapping of NAME: value, found a list");
  YAML_ERR("command: python train.py\n",
           ":1:10: command: expected a list of strings such as "
           "[python, train.py], found a single value");
  YAML_ERR("command:\n  - python\n  - {a: b}\n",
           ":3:5: command[1]: expected a string, found a mapping");
  YAML_ERR("command: [a, ~]\n",
           ":1:14: command[1]: a value is required (write \"\" for an empty one)");
  YAML_ERR("command: [&a x, *a]\n",
           ":1:17: alias '*a': aliases are not supported; write the value out");
  YAML_ERR("---\nrole: a\n---\nrole: b\n",
           ":3:1: a second YAML document ('---'): put all settings in one document");
  YAML_ERR("- role: a\n",
           ":1:1: the top level must be a mapping of settings (key: value), found a list");
  YAML_ERR("hello\n",
           ":1:1: the top level must be a mapping of settings (key: value), found a single value");
  YAML_ERR("? [a]\n: b\n", ":1:3: keys must be names, found a list");
  YAML_ERR("discovery:\n  ? {a: 1}\n  : b\n",
           ":2:5: discovery: keys must be names, found a mapping");

  agent_cfg_t c;
  char err[512], want[2048];
  agent_cfg_defaults(&c);
  CHECK_EQ_INT(agent_cfg_load_yaml(&c, g_dir, err, sizeof err), -1);
  snprintf(want, sizeof want, "%s: is a directory, not a YAML file", g_dir);
  CHECK_STR(err, want);
  snprintf(want, sizeof want, "%s/missing.yaml", g_dir);
  CHECK_EQ_INT(agent_cfg_load_yaml(&c, want, err, sizeof err), -1);
  CHECK(strstr(err, ": cannot open: No such file or directory") != NULL);
  CHECK_EQ_INT(agent_cfg_load_yaml(&c, NULL, err, sizeof err), -1);
  CHECK_STR(err, "no YAML file given");
  /* a long path is never cut off in a message */
  char dir[1200], big[2048];
  int n = snprintf(dir, sizeof dir, "%s/", g_dir);
  for (int k = 0; k < 4; k++) {
    memset(dir + n, 'd' + k, 200);
    dir[n += 200] = '\0';
    CHECK(mkdir(dir, 0700) == 0 || errno == EEXIST);
    dir[n++] = '/';
  }
  snprintf(dir + n, sizeof dir - (size_t)n, "x.yaml");
  FILE *f = fopen(dir, "w");
  CHECK(f && fputs("max_restarts: -1\n", f) >= 0 && fclose(f) == 0);
  CHECK_EQ_INT(agent_cfg_load_yaml(&c, dir, big, sizeof big), -1);
  snprintf(want, sizeof want, "%s:1:15: max_restarts: '-1' is out of range 0..1000000", dir);
  CHECK_STR(big, want);
  agent_cfg_free(&c);
}

/* Writes the dump of c to a file, loads it on fresh defaults and checks both are equal, and that
 * the second dump is the same text. */
static void round_trip(const agent_cfg_t *c, const char *what) {
  agent_cfg_t back;
  char err[512], why[512];
  char *d = dump(c);
  const char *p = write_file("dump.yaml", d, strlen(d));
  agent_cfg_defaults(&back);
  if (agent_cfg_load_yaml(&back, p, err, sizeof err)) {
    fprintf(stderr, "%s: dump does not load: %s\n--- dump ---\n%s", what, err, d);
    exit(1);
  }
  if (!cfg_equal(c, &back, why, sizeof why)) {
    fprintf(stderr, "%s: round trip differs: %s\n--- dump ---\n%s", what, why, d);
    exit(1);
  }
  char *d2 = dump(&back);
  CHECK_STR(d2, d);
  free(d);
  free(d2);
  agent_cfg_free(&back);
}

static void test_dump_round_trip(void) {
  static const char *const tricky[] = {"multi\nline",
                                       "tab\there",
                                       "quote\"back\\slash",
                                       "caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac "
                                       "\xf0\x9f\x98\x80",
                                       "\x01\x1f\x7f ctrl",
                                       "#not a comment",
                                       ": colon",
                                       "- dash",
                                       "",
                                       "  leading",
                                       "trailing  ",
                                       "null",
                                       "~",
                                       "true",
                                       "123",
                                       "'single'",
                                       "\xc2\x85nel",
                                       "\xe2\x80\xa8ls",
                                       "\xef\xbb\xbf"
                                       "bom",
                                       "\xef\xbf\xbe",
                                       "{a: b}",
                                       "[x]",
                                       "*alias",
                                       "&a",
                                       "!tag",
                                       "%percent",
                                       "@at",
                                       "`tick",
                                       "a\r\nb"};
  agent_cfg_t c;
  char err[512];
  const size_t n = sizeof tricky / sizeof tricky[0];
  const char *argv[64] = {"tdist-agent",
                          "--nnodes",
                          "2:7",
                          "--monitor-interval",
                          "1ms",
                          "--rdzv-timeout",
                          "10000000",
                          "--last-call",
                          "1234.567",
                          "--stop-grace-period",
                          "0",
                          "--master-template",
                          "{job}.\xc3\xa9.",
                          "--http-host",
                          "",
                          "--log-dir",
                          "/tmp/\xe2\x82\xac dir",
                          "--"};
  size_t argc = 18;
  for (size_t i = 0; i < n; i++) argv[argc++] = tricky[i];
  argv[argc] = NULL;
  CHECK_EQ_INT(load(&c, err, argv, NOENV), AGENT_CFG_OK);
  /* env values can only come from YAML: add them with every escape form */
  const char *p = yaml_file(
      "env:\n  A: \"multi\\nline\\ttab \\\"q\\\" \\\\ \\x01\\u00e9\\U0001F600\"\n"
      "  B: ''\n  C: 'it''s'\n  D: \"\\N\\_\\L\\P\\e\\a\\b\\v\\f\\r\\0x\"\n"
      "  E: \"#x\"\n");
  CHECK_EQ_INT(agent_cfg_load_yaml(&c, p, err, sizeof err), -1); /* D has \0 */
  CHECK(strstr(err, ":5:6: env.D: the value contains a NUL character") != NULL);
  p = yaml_file(
      "env:\n  A: \"multi\\nline\\ttab \\\"q\\\" \\\\ \\x01\\u00e9\\U0001F600\"\n"
      "  B: ''\n  C: 'it''s'\n  D: \"\\N\\_\\L\\P\\e\\a\\b\\v\\f\\r\"\n  E: \"#x\"\n");
  CHECK_EQ_INT(agent_cfg_load_yaml(&c, p, err, sizeof err), 0);
  CHECK_EQ_INT(c.nenv, 5);
  CHECK_STR(c.env[0].value, "multi\nline\ttab \"q\" \\ \x01\xc3\xa9\xf0\x9f\x98\x80");
  CHECK_STR(c.env[2].value, "it's");
  round_trip(&c, "tricky strings");
  agent_cfg_free(&c);
  /* a command argument that is not UTF-8 is written as \xNN and still loads */
  CHECK_EQ_INT(load(&c, err,
                    ARGS("--",
                         "a\xff"
                         "b"),
                    NOENV),
               AGENT_CFG_OK);
  char *d = dump(&c);
  CHECK(strstr(d, "\"a\\xFFb\"") != NULL);
  agent_cfg_t back;
  agent_cfg_defaults(&back);
  CHECK_EQ_INT(agent_cfg_load_yaml(&back, write_file("d.yaml", d, strlen(d)), err, 512), 0);
  CHECK_STR(back.cmd[0],
            "a\xc3\xbf"
            "b");
  free(d);
  agent_cfg_free(&back);
  agent_cfg_free(&c);
  /* --standalone and --check-config configurations */
  CHECK_EQ_INT(load(&c, err, ARGS("--standalone", "--check-config"), NOENV), AGENT_CFG_OK);
  round_trip(&c, "standalone");
  agent_cfg_free(&c);
  /* a write error is reported */
  FILE *ro = fopen("/dev/full", "w");
  if (ro) {
    agent_cfg_defaults(&c);
    setvbuf(ro, NULL, _IONBF, 0);
    CHECK_EQ_INT(agent_cfg_dump_yaml(&c, ro), -1);
    fclose(ro);
    agent_cfg_free(&c);
  }
}

/* A random valid UTF-8 string without NUL, from code points of every length. */
static void random_utf8(char *out, size_t cap) {
  size_t n = 0, want = below(24);
  while (want-- && n + 5 < cap) {
    uint32_t cp;
    switch (below(5)) {
      case 0: cp = 1 + (uint32_t)below(0x7f); break;
      case 1: cp = 0x20 + (uint32_t)below(0x5f); break;
      case 2: cp = 0x80 + (uint32_t)below(0x780); break;
      case 3: cp = 0x800 + (uint32_t)below(0xf800); break;
      default: cp = 0x10000 + (uint32_t)below(0x100000); break;
    }
    if (cp >= 0xd800 && cp <= 0xdfff) cp = 'x';
    if (cp < 0x80)
      out[n++] = (char)cp;
    else if (cp < 0x800)
      out[n++] = (char)(0xc0 | cp >> 6), out[n++] = (char)(0x80 | (cp & 0x3f));
    else if (cp < 0x10000)
      out[n++] = (char)(0xe0 | cp >> 12), out[n++] = (char)(0x80 | ((cp >> 6) & 0x3f)),
      out[n++] = (char)(0x80 | (cp & 0x3f));
    else
      out[n++] = (char)(0xf0 | cp >> 18), out[n++] = (char)(0x80 | ((cp >> 12) & 0x3f)),
      out[n++] = (char)(0x80 | ((cp >> 6) & 0x3f)), out[n++] = (char)(0x80 | (cp & 0x3f));
  }
  out[n] = '\0';
}

/* Random configurations from random flags (each one kept only if valid on its own), a random
 * command and random env pairs written in YAML with \U escapes. */
static void test_random_round_trips(void) {
  static const char *const flags[][4] = {
      {"--nnodes", "1", "3:9", "65536"},
      {"--nproc-per-node", "1", "17", "4096"},
      {"--node-rank", "0", "0", "0"},
      {"--master-addr", "h", "10.0.0.1", "::1"},
      {"--master-port", "1", "2", "65535"},
      {"--run-id", "a", "B.c:d-e_f", "0"},
      {"--max-restarts", "0", "9", "1000000"},
      {"--monitor-interval", "1ms", "0.25", "3m"},
      {"--role", "r", "x.y", "Z"},
      {"--backend", "nccl", "gloo", "nccl"},
      {"--rdzv-timeout", "2h", "1.001", "99"},
      {"--heartbeat-interval", "0.1", "1", "3"},
      {"--heartbeat-timeout", "4", "60", "1h"},
      {"--stop-grace-period", "0", "1s", "0.003"},
      {"--scheme", "volcano", "jobset", "kubeflow"},
      {"--master-template", "{job}", "a.", "{x}"},
      {"--job-name", "j", "k", "l"},
      {"--service", "s", "t", "u"},
      {"--namespace", "n", "o", "p"},
      {"--cluster-domain", "d", "e", "f"},
      {"--replicated-job", "r", "s", "t"},
      {"--task", "t", "u", "v"},
      {"--http-host", "", "0.0.0.0", "::"},
      {"--http-port", "-1", "0", "65535"},
      {"--http-port-file", "/p", "q", "/r s"},
      {"--log-dir", "/l", "m", "/n o"},
      {"--omp-num-threads", "0", "1", "65536"},
      {"--log-format", "json", "text", "json"},
      {"--standalone", NULL, NULL, NULL},
      {"--last-call", "0", "1", "5"},
  };
  const size_t nflags = sizeof flags / sizeof flags[0];
  int loaded = 0;
  for (int iter = 0; iter < 300; iter++) {
    const char *argv[128] = {"tdist-agent"};
    char strs[40][128], yaml[8192], err[512];
    size_t argc = 1, ns = 0;
    for (size_t k = below(12); k > 0; k--) {
      const char *const *f = flags[below(nflags)];
      argv[argc++] = f[0];
      if (f[1]) argv[argc++] = f[1 + below(3)];
    }
    argv[argc++] = "--";
    for (size_t k = below(6); k > 0; k--) {
      random_utf8(strs[ns], sizeof strs[0]);
      argv[argc++] = strs[ns++];
    }
    argv[argc] = NULL;
    agent_cfg_t c;
    if (load(&c, err, argv, NOENV) != AGENT_CFG_OK) { /* e.g. conflicts: fine, not the point */
      CHECK(err[0] != '\0');
      agent_cfg_free(&c);
      continue;
    }
    loaded++;
    size_t y = (size_t)snprintf(yaml, sizeof yaml, "env:\n");
    for (size_t k = below(5); k > 0; k--) {
      char v[128];
      random_utf8(v, sizeof v);
      y += (size_t)snprintf(yaml + y, sizeof yaml - y, "  V%zu_%d: \"", k, iter);
      for (const unsigned char *s = (const unsigned char *)v; *s;) {
        uint32_t cp = *s;
        size_t len = cp < 0x80 ? 1 : cp < 0xe0 ? 2 : cp < 0xf0 ? 3 : 4;
        if (len > 1) cp &= 0xff >> (len + 1);
        for (size_t q = 1; q < len; q++) cp = (cp << 6) | (s[q] & 0x3f);
        y += (size_t)snprintf(yaml + y, sizeof yaml - y, "\\U%08X", cp);
        s += len;
      }
      y += (size_t)snprintf(yaml + y, sizeof yaml - y, "\"\n");
    }
    CHECK(y < sizeof yaml);
    if (agent_cfg_load_yaml(&c, yaml_file(yaml), err, sizeof err)) {
      fprintf(stderr, "random env YAML failed: %s\n%s", err, yaml);
      exit(1);
    }
    round_trip(&c, "random configuration");
    agent_cfg_free(&c);
  }
  TEST_LOG("random configurations: %d of 300 valid and round-tripped", loaded);
  CHECK(loaded > 100);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* One untrusted input: never crashes; an error is one line naming the file; a success dumps
 * and reads back to an equal configuration. */
static int g_ok, g_err;

static void robust_one(const char *data, size_t len) {
  agent_cfg_t c;
  char err[512];
  const char *p = write_file("fuzz.yaml", data, len);
  agent_cfg_defaults(&c);
  memset(err, 'Z', sizeof err);
  int rc = agent_cfg_load_yaml(&c, p, err, sizeof err);
  CHECK(rc == 0 || rc == -1);
  if (rc == -1) {
    CHECK(memchr(err, '\0', sizeof err) != NULL);
    CHECK(!strncmp(err, p, strlen(p)) && err[strlen(p)] == ':' && !strchr(err, '\n'));
    g_err++;
  } else {
    g_ok++;
    round_trip(&c, "random input");
  }
  agent_cfg_free(&c);
}

static void test_random_inputs(void) {
  static const char valid[] =
      "nnodes: 1:4\nnproc_per_node: 2\nmaster_addr: m-0\nmaster_port: 23456\nrun_id: r\n"
      "max_restarts: 3\nmonitor_interval: 100ms\nstandalone: false\nrole: w\nbackend: gloo\n"
      "rdzv_timeout: 5m\nlast_call: 1\nheartbeat_interval: 1\nheartbeat_timeout: 9\n"
      "discovery:\n  scheme: jobset\n  job_name: j\n  namespace: ns\n  task: t\n"
      "http_port: 0\nlog_dir: /l\nlog_format: json\nenv: {A: \"1\", B: 'x y'}\n"
      "command: [python, \"-u\", train.py]\n";
  double t0 = now_s();
  char buf[4096];
  int done = 0;
  for (int i = 0; i < 4000 && now_s() - t0 < 25; i++, done++) {
    size_t len;
    if (i % 3 == 0) {
      len = cfg_gen_random(&g_rng, buf, sizeof buf);
    } else {
      memcpy(buf, valid, sizeof valid - 1);
      len = cfg_gen_mutate(&g_rng, buf, sizeof valid - 1, sizeof buf);
    }
    robust_one(buf, len);
  }
  TEST_LOG("random inputs: %d in %.1f s (%d loaded, %d rejected)", done, now_s() - t0, g_ok, g_err);
  CHECK(g_ok > 0 && g_err > 0);
}

int main(void) {
  const char *tmp = getenv("TEST_TMPDIR");
  snprintf(g_dir, sizeof g_dir, "%s/config_test.XXXXXX", tmp && *tmp ? tmp : "/tmp");
  CHECK(mkdtemp(g_dir) != NULL);
  const char *seed = getenv("TDIST_TEST_SEED");
  g_rng.s =
      seed ? strtoull(seed, NULL, 0) : (uint64_t)time(NULL) * 2654435761u + (uint64_t)getpid();
  if (g_rng.s == 0) g_rng.s = 1;
  TEST_LOG("seed: TDIST_TEST_SEED=%llu", (unsigned long long)g_rng.s);
  test_defaults();
  test_precedence();
  test_env_names();
  test_every_flag();
  test_command();
  test_help_version();
  test_flag_env_errors();
  test_standalone();
  test_nproc_symbolic();
  test_yaml_values();
  test_yaml_errors();
  test_dump_round_trip();
  test_random_round_trips();
  test_random_inputs();
  TEST_LOG("config_test: all passed");
  return 0;
}
