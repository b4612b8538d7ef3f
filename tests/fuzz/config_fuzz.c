/* libFuzzer target for the agent's YAML configuration reader (operator-agent/config).
 *
 * Each input is written to a file (the reader's interface is a path) and loaded with
 * agent_cfg_load_yaml() on top of the defaults. Invariants for any input:
 *   - the result is 0 or -1, and nothing crashes, leaks or reads out of bounds (sanitizers);
 *   - on -1 the message is one NUL-terminated line that starts with "<path>:";
 *   - on 0 the configuration dumped with agent_cfg_dump_yaml() loads back (on fresh defaults)
 *     to an equal struct, and dumping that gives the same text (the dump is a fixed point).
 * Files go to $TDIST_FUZZ_TMPDIR, else $TEST_TMPDIR, else $TMPDIR, else /tmp, named by pid, and
 * are removed at exit. Built by Bazel into config_fuzz_replay_test (config_replay.c) and by
 * run_libfuzzer.sh with -fsanitize=fuzzer. Keeps no state between inputs but the file names. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "operator-agent/config/config.h"
#include "tests/agent/cfg_equal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FUZZ_CHECK(cond, ...)                                                                     \
  do {                                                                                            \
    if (!(cond)) {                                                                                \
      fprintf(stderr, "config_fuzz: %s:%d: invariant failed: %s\n  ", __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                                                               \
      fputc('\n', stderr);                                                                        \
      abort();                                                                                    \
    }                                                                                             \
  } while (0)

static char g_in[600], g_out[600];

static void remove_files(void) {
  unlink(g_in);
  unlink(g_out);
}

static void paths_once(void) {
  const char *dir = NULL;
  if (g_in[0]) return;
  const char *const vars[] = {"TDIST_FUZZ_TMPDIR", "TEST_TMPDIR", "TMPDIR"};
  for (int i = 0; i < 3 && !dir; i++)
    if ((dir = getenv(vars[i])) != NULL && !*dir) dir = NULL;
  if (!dir) dir = "/tmp";
  snprintf(g_in, sizeof g_in, "%s/tdist_config_fuzz.%d.yaml", dir, (int)getpid());
  snprintf(g_out, sizeof g_out, "%s/tdist_config_fuzz.%d.dump.yaml", dir, (int)getpid());
  atexit(remove_files);
}

static void write_all(const char *path, const void *data, size_t len) {
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  FUZZ_CHECK(fd >= 0, "cannot create %s: %s", path, strerror(errno));
  const char *p = data;
  while (len > 0) {
    ssize_t w = write(fd, p, len);
    if (w < 0 && errno == EINTR) continue;
    FUZZ_CHECK(w > 0, "cannot write %s: %s", path, strerror(errno));
    p += w;
    len -= (size_t)w;
  }
  close(fd);
}

static char *dump_text(const agent_cfg_t *c, size_t *len) {
  char *buf = NULL;
  FILE *f = open_memstream(&buf, len);
  FUZZ_CHECK(f != NULL, "open_memstream failed");
  FUZZ_CHECK(agent_cfg_dump_yaml(c, f) == 0, "dump failed");
  fclose(f);
  return buf;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  agent_cfg_t c, back;
  char err[512], why[512];
  paths_once();
  write_all(g_in, data, size);
  agent_cfg_defaults(&c);
  memset(err, 'Z', sizeof err);
  int rc = agent_cfg_load_yaml(&c, g_in, err, sizeof err);
  FUZZ_CHECK(rc == 0 || rc == -1, "result %d", rc);
  if (rc == -1) {
    size_t n = strlen(g_in);
    FUZZ_CHECK(memchr(err, '\0', sizeof err) != NULL, "message not terminated");
    FUZZ_CHECK(!strncmp(err, g_in, n) && err[n] == ':', "message does not name the file: %s", err);
    FUZZ_CHECK(strchr(err, '\n') == NULL, "message has a newline: %s", err);
    agent_cfg_free(&c);
    return 0;
  }
  size_t len1 = 0, len2 = 0;
  char *d1 = dump_text(&c, &len1);
  write_all(g_out, d1, len1);
  agent_cfg_defaults(&back);
  rc = agent_cfg_load_yaml(&back, g_out, err, sizeof err);
  FUZZ_CHECK(rc == 0, "the dump does not load: %s\n--- dump ---\n%s", err, d1);
  FUZZ_CHECK(cfg_equal(&c, &back, why, sizeof why), "round trip differs: %s\n--- dump ---\n%s", why,
             d1);
  char *d2 = dump_text(&back, &len2);
  FUZZ_CHECK(len1 == len2 && !memcmp(d1, d2, len1), "dump of the dump differs:\n%s\n---\n%s", d1,
             d2);
  free(d1);
  free(d2);
  agent_cfg_free(&back);
  agent_cfg_free(&c);
  return 0;
}
