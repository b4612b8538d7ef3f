/* Fault loops over the agent's configuration loader (operator-agent/config, tests/testlib/fault.h):
 * agent_cfg_load of a YAML file (scalars, a discovery map, an env map, a command list), the
 * environment (TDIST_* and PET_*) and flags, with every allocation the loader makes failing once
 * in turn, then every allocation from the n-th on. libyaml's own allocations are not ours and are
 * not wrapped. Each failure must give AGENT_CFG_ERROR with a message (never a crash or abort),
 * leave a struct agent_cfg_free releases completely (LeakSanitizer under --config=asan), and a
 * fresh load must then give the configuration an unarmed load gives. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "operator-agent/config/config.h"
#include "tests/agent/cfg_equal.h"
#include "tests/testlib/check.h"
#include "tests/testlib/fault.h"

static const char kYaml[] =
    "nnodes: 2:4\n"
    "nproc_per_node: 3\n"
    "master_addr: yaml-master.example\n"
    "max_restarts: 5\n"
    "role: trainer\n"
    "backend: gloo\n"
    "rdzv_timeout: 120\n"
    "discovery:\n"
    "  scheme: jobset\n"
    "  job_name: myjob\n"
    "  service: mysvc\n"
    "  namespace: ml\n"
    "  cluster_domain: cluster.example\n"
    "  replicated_job: workers\n"
    "http_port: 0\n"
    "env:\n"
    "  ALPHA: \"1\"\n"
    "  BETA: two words\n"
    "  GAMMA: \"\"\n"
    "command: [python3, -u, \"train it.py\", --lr, \"0.1\"]\n";

typedef struct {
  char path[512], cfgflag[600];
  agent_cfg_t ref;
  fault_mode_t mode;
  int with_cmd; /* the command from argv (else from the YAML) */
} ctx_t;

static agent_cfg_result_t load(ctx_t *c, agent_cfg_t *cfg, char *err, size_t cap) {
  char *argv_cmd[] = {
      "tdist-agent", c->cfgflag, "--run-id=job-42", "--master-port", "29511", "--log-format=json",
      "--",          "worker",   "--flag",          "x y",           NULL};
  char *argv_yaml[] = {"tdist-agent",       c->cfgflag, "--run-id=job-42", "--master-port", "29511",
                       "--log-format=json", NULL};
  char *envp[] = {"TDIST_HEARTBEAT_INTERVAL=2", "PET_MAX_RESTARTS=7", "TMPDIR=/var/tmp",
                  "POD_NAMESPACE=ignored", NULL};
  char **argv = c->with_cmd ? argv_cmd : argv_yaml;
  int argc = 0;
  while (argv[argc]) argc++;
  return agent_cfg_load(cfg, argc, argv, envp, err, cap);
}

static agent_cfg_t g_cfg;
static char g_err[512];

static int attempt(void *arg, long n) {
  ctx_t *c = arg;
  g_err[0] = '\0';
  fault_arm(FAULT_ALLOC, n, c->mode);
  agent_cfg_result_t r = load(c, &g_cfg, g_err, sizeof g_err);
  fault_disarm();
  return (int)r;
}

static void after(void *arg, long n, int rc) {
  ctx_t *c = arg;
  char why[256];
  if (rc == AGENT_CFG_OK) {
    if (!cfg_equal(&g_cfg, &c->ref, why, sizeof why)) {
      fprintf(stderr, "config n=%ld (%s failed, absorbed): a different configuration: %s\n", n,
              fault_last_failed_name(), why);
      exit(1);
    }
  } else if (rc != AGENT_CFG_ERROR || strstr(g_err, "out of memory") == NULL) {
    fprintf(stderr, "config n=%ld (%s failed): result %d, message '%s'\n", n,
            fault_last_failed_name(), rc, g_err);
    exit(1);
  }
  agent_cfg_free(&g_cfg);
  agent_cfg_t fresh;
  char err[512];
  CHECK_EQ_INT(load(c, &fresh, err, sizeof err), AGENT_CFG_OK);
  CHECK(cfg_equal(&fresh, &c->ref, why, sizeof why));
  agent_cfg_free(&fresh);
}

int main(void) {
  static ctx_t c;
  const char *dir = getenv("TEST_TMPDIR");
  snprintf(c.path, sizeof c.path, "%s/agent.yaml", dir && *dir ? dir : "/tmp");
  FILE *f = fopen(c.path, "w");
  CHECK(f != NULL);
  CHECK(fwrite(kYaml, 1, sizeof kYaml - 1, f) == sizeof kYaml - 1);
  CHECK(fclose(f) == 0);
  snprintf(c.cfgflag, sizeof c.cfgflag, "--config=%s", c.path);

  for (int with_cmd = 0; with_cmd < 2; with_cmd++) {
    c.with_cmd = with_cmd;
    char err[512];
    agent_cfg_result_t r = load(&c, &c.ref, err, sizeof err);
    if (r != AGENT_CFG_OK) {
      fprintf(stderr, "reference load failed: %s\n", err);
      return 1;
    }
    /* The sources really were read: one value from each. */
    CHECK(c.ref.nnodes_min == 2 && c.ref.nnodes_max == 4);             /* YAML */
    CHECK(c.ref.max_restarts == 7 && c.ref.heartbeat_interval_s == 2); /* env over YAML */
    CHECK(c.ref.master_port == 29511);                                 /* flag */
    CHECK(c.ref.nenv == 3);
    CHECK(c.ref.ncmd == (with_cmd ? 3u : 5u));
    for (int mode = 0; mode < 2; mode++) {
      c.mode = (fault_mode_t)mode;
      fault_loop_t l = {with_cmd ? "agent config (argv command)" : "agent config (YAML command)",
                        FAULT_ALLOC,
                        c.mode,
                        attempt,
                        after,
                        &c,
                        20,
                        60};
      fault_loop_run(&l);
    }
    agent_cfg_free(&c.ref);
  }
  return 0;
}
