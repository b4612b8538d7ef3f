/* The agent's YAML configuration files (operator-agent/config): every value form, every class of
 * error with its exact FILE:LINE:COLUMN message, and the YAML dump read back to an equal struct
 * (fixed tricky strings). */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "operator-agent/config/config.h"
#include "tests/agent/config_testlib.h"
#include "tests/testlib/check.h"
#include "tests/testlib/rng.h"

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
  yaml_err_at(__FILE__, __LINE__, big, mib + 1,
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
  CHECK_EQ_INT(agent_cfg_load_yaml(&c, cfg_test_dir(), err, sizeof err), -1);
  snprintf(want, sizeof want, "%s: is a directory, not a YAML file", cfg_test_dir());
  CHECK_STR(err, want);
  snprintf(want, sizeof want, "%s/missing.yaml", cfg_test_dir());
  CHECK_EQ_INT(agent_cfg_load_yaml(&c, want, err, sizeof err), -1);
  CHECK(strstr(err, ": cannot open: No such file or directory") != NULL);
  CHECK_EQ_INT(agent_cfg_load_yaml(&c, NULL, err, sizeof err), -1);
  CHECK_STR(err, "no YAML file given");
  /* a long path is never cut off in a message */
  char dir[1200], big[2048];
  int n = snprintf(dir, sizeof dir, "%s/", cfg_test_dir());
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

int main(void) {
  cfg_test_init("config_yaml_test");
  test_rng_init("config_yaml_test", 0); /* a fresh seed each run, printed */
  test_yaml_values();
  test_yaml_errors();
  test_dump_round_trip();
  TEST_LOG("config_yaml_test: all passed");
  return 0;
}
