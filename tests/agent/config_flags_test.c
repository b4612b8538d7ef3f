/* agent_cfg_load from argv and the environment (operator-agent/config/config.h): defaults,
 * precedence flag > env > YAML > default with random values, TDIST_ over PET_ over plain
 * MASTER_ADDR/MASTER_PORT, both flag spellings and the '=' form for every flag, the worker command
 * after "--" and torchrun style, every class of flag and env error with its exact message,
 * --standalone defaults and conflicts. TDIST_TEST_SEED=N repeats a run. */
#define _GNU_SOURCE
#include <ctype.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "operator-agent/config/config.h"
#include "tests/agent/config_testlib.h"
#include "tests/testlib/check.h"
#include "tests/testlib/rng.h"

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
    do v = p->lo + (long)rnd_below((uint64_t)(p->hi - p->lo + 1));
    while (v == 29600); /* the HTTP port: master port == HTTP port is an error */
    snprintf(text, cap, "%ld", v);
    snprintf(expect, cap, "%ld", v);
  } else if (p->kind == 1) {
    static const char cs[] = "abcXYZ019._:-";
    size_t n = 1 + rnd_below(12);
    for (size_t i = 0; i < n; i++) text[i] = cs[rnd_below(sizeof cs - 1)];
    text[n] = '\0';
    snprintf(expect, cap, "%s", text);
  } else {
    long v = 1 + (long)rnd_below(500);
    int unit = (int)rnd_below(3);
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
  EXPECT_ERR(ARGS("--backend", "mpich", "x"), NOENV,
             "--backend: 'mpich' is not one of gloo|nccl|mpi");
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
             "ranks are 0..2 (or give --spares)");
  EXPECT_ERR(ARGS("--node-rank", "5", "--nnodes", "3", "--spares", "2", "x"), NOENV,
             "--node-rank: node rank 5 must be below the number of nodes 3 (--nnodes) plus the "
             "spares 2 (--spares); node ranks are 0..4");
  EXPECT_ERR(ARGS("--standalone", "--spares", "1", "x"), NOENV,
             "--spares: '1' conflicts with standalone (--standalone), which runs exactly one node "
             "and no spare; remove one of them");
  EXPECT_ERR(ARGS("--nnodes", "65000", "--spares", "600", "x"), NOENV,
             "--spares: 600 spare(s) and 65000 node(s) (--nnodes) make 65600 pods, more than "
             "65536 node ranks; lower one of them");
  EXPECT_ERR(ARGS("--spares", "-1", "x"), NOENV, "--spares: '-1' is out of range 0..65535");
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

/* --spares-in-nnodes (issue 35): the node count given counts the spares (Trainer v2's
 * PET_NNODES = numNodes); the loader leaves nnodes = the active nodes and the flag consumed. */
static void test_spares_in_nnodes(void) {
  agent_cfg_t c;
  char err[512];
  CHECK_EQ_INT(
      load(&c, err, ARGS("--nnodes", "4", "--spares", "1", "--spares-in-nnodes", "x"), NOENV),
      AGENT_CFG_OK);
  CHECK_EQ_INT(c.nnodes_min, 3);
  CHECK_EQ_INT(c.nnodes_max, 3);
  CHECK_EQ_INT(c.spares, 1);
  CHECK_EQ_INT(c.spares_in_nnodes, 0);
  round_trip(&c, "--spares-in-nnodes");
  agent_cfg_free(&c);
  /* Trainer's way: PET_NNODES and PET_NODE_RANK in the environment, the rest in the YAML. */
  char cfgflag[600];
  snprintf(cfgflag, sizeof cfgflag, "--config=%s",
           yaml_file("nnodes: 2\nspares: 2\nspares_in_nnodes: true\n"));
  CHECK_EQ_INT(load(&c, err, ARGS(cfgflag, "x"), ENVS("PET_NNODES=5", "PET_NODE_RANK=4")),
               AGENT_CFG_OK);
  CHECK_EQ_INT(c.nnodes_max, 3);
  CHECK_EQ_INT(c.spares, 2);
  CHECK_EQ_INT(c.node_rank, 4); /* the last spare */
  agent_cfg_free(&c);
  char *d = dump_of(ARGS("--nnodes", "3", "x"), ENVS("TDIST_SPARES_IN_NNODES=true"));
  same_dump(d, ARGS("--nnodes", "3", "x"), NOENV); /* no spares: nothing to take off */
  free(d);
  EXPECT_ERR(ARGS("--nnodes", "2", "--spares", "2", "--spares-in-nnodes", "x"), NOENV,
             "--nnodes: 2 node(s) with spares_in_nnodes (--spares-in-nnodes) leave no active "
             "node beside the 2 spare(s) (--spares); raise the node count (numNodes) to at least "
             "3 or lower spares");
  EXPECT_ERR(ARGS("--nnodes", "2:4", "--spares", "1", "x"), ENVS("TDIST_SPARES_IN_NNODES=1"),
             "--nnodes: '2:4' is MIN:MAX, but spares_in_nnodes (env TDIST_SPARES_IN_NNODES) "
             "needs one node count (all the pods, spares included); give a single number");
  EXPECT_ERR(ARGS("--nnodes", "3", "--spares", "1", "--spares-in-nnodes", "--node-rank", "3", "x"),
             NOENV,
             "--node-rank: node rank 3 must be below the number of nodes 2 (--nnodes) plus the "
             "spares 1 (--spares); node ranks are 0..2");
}

int main(void) {
  cfg_test_init("config_flags_test");
  test_rng_init("config_flags_test", 0); /* a fresh seed each run, printed */
  test_defaults();
  test_precedence();
  test_env_names();
  test_every_flag();
  test_command();
  test_help_version();
  test_flag_env_errors();
  test_standalone();
  test_nproc_symbolic();
  test_spares_in_nnodes();
  TEST_LOG("config_flags_test: all passed");
  return 0;
}
