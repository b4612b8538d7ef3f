/* See config_testlib.h. */
#define _GNU_SOURCE
#include "tests/agent/config_testlib.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/agent/cfg_equal.h"

static char g_dir[512];

void cfg_test_init(const char *test) {
  const char *tmp = getenv("TEST_TMPDIR");
  snprintf(g_dir, sizeof g_dir, "%s/%s.XXXXXX", tmp && *tmp ? tmp : "/tmp", test);
  CHECK(mkdtemp(g_dir) != NULL);
}

const char *cfg_test_dir(void) { return g_dir; }

const char *write_file(const char *name, const void *data, size_t len) {
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
const char *yaml_file(const char *text) { return write_file("t.yaml", text, strlen(text)); }

agent_cfg_result_t load(agent_cfg_t *c, char *err, const char **argv, const char **envp) {
  int argc = 0;
  while (argv[argc]) argc++;
  return agent_cfg_load(c, argc, (char **)argv, (char **)envp, err, 512);
}

char *dump(const agent_cfg_t *c) {
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  CHECK(f != NULL);
  CHECK(agent_cfg_dump_yaml(c, f) == 0);
  CHECK(fclose(f) == 0);
  return buf;
}

const char *body(const char *d) {
  const char *b = strstr(d, "\nnnodes:");
  CHECK(b != NULL);
  return b;
}

char *dump_of(const char **argv, const char **envp) {
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

void same_dump(const char *want, const char **argv, const char **envp) {
  char *d = dump_of(argv, envp);
  CHECK_STR(d, want);
  free(d);
}

void yaml_err_at(const char *file, int line, const char *text, size_t len, const char *suffix) {
  agent_cfg_t c;
  char err[512], want[1024];
  const char *p = write_file("e.yaml", text, len);
  agent_cfg_defaults(&c);
  snprintf(want, sizeof want, "%s%s", p, suffix);
  if (agent_cfg_load_yaml(&c, p, err, sizeof err) != -1 || strcmp(err, want)) {
    fprintf(stderr, "%s:%d: YAML error mismatch\n  got:  %s\n  want: %s\n", file, line, err, want);
    exit(1);
  }
  agent_cfg_free(&c);
}

void round_trip(const agent_cfg_t *c, const char *what) {
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

void check_cmd(const agent_cfg_t *c, const char **want) {
  size_t n = 0;
  while (want[n]) n++;
  CHECK_EQ_INT(c->ncmd, n);
  for (size_t i = 0; i < n; i++) CHECK_STR(c->cmd[i], want[i]);
  CHECK(c->cmd[n] == NULL);
}
