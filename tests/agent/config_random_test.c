/* Random agent configurations: dumps of random valid configurations read back to equal structs,
 * and random bytes and mutations of a valid file (tests/agent/config_gen.h) that must never crash:
 * an error is one line naming the file, a success round-trips. TDIST_TEST_SEED=N repeats a run. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "operator-agent/config/config.h"
#include "tests/agent/config_testlib.h"
#include "tests/agent/config_gen.h"
#include "tests/testlib/check.h"
#include "tests/testlib/clock.h"
#include "tests/testlib/rng.h"

/* A random valid UTF-8 string without NUL, from code points of every length. */
static void random_utf8(char *out, size_t cap) {
  size_t n = 0, want = rnd_below(24);
  while (want-- && n + 5 < cap) {
    uint32_t cp;
    switch (rnd_below(5)) {
      case 0: cp = 1 + (uint32_t)rnd_below(0x7f); break;
      case 1: cp = 0x20 + (uint32_t)rnd_below(0x5f); break;
      case 2: cp = 0x80 + (uint32_t)rnd_below(0x780); break;
      case 3: cp = 0x800 + (uint32_t)rnd_below(0xf800); break;
      default: cp = 0x10000 + (uint32_t)rnd_below(0x100000); break;
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
    for (size_t k = rnd_below(12); k > 0; k--) {
      const char *const *f = flags[rnd_below(nflags)];
      argv[argc++] = f[0];
      if (f[1]) argv[argc++] = f[1 + rnd_below(3)];
    }
    argv[argc++] = "--";
    for (size_t k = rnd_below(6); k > 0; k--) {
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
    for (size_t k = rnd_below(5); k > 0; k--) {
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
      len = cfg_gen_random(&test_rng, buf, sizeof buf);
    } else {
      memcpy(buf, valid, sizeof valid - 1);
      len = cfg_gen_mutate(&test_rng, buf, sizeof valid - 1, sizeof buf);
    }
    robust_one(buf, len);
  }
  TEST_LOG("random inputs: %d in %.1f s (%d loaded, %d rejected)", done, now_s() - t0, g_ok, g_err);
  CHECK(g_ok > 0 && g_err > 0);
}

int main(void) {
  cfg_test_init("config_random_test");
  test_rng_init("config_random_test", 0); /* a fresh seed each run, printed */
  test_random_round_trips();
  test_random_inputs();
  TEST_LOG("config_random_test: all passed");
  return 0;
}
