/* operator-agent/common/param.{h,c}: tdist-agent's own TDIST_* parameter table (TDIST_LOG_LEVEL,
 * TDIST_PYTHON, TDIST_STALL_REPORT_SECONDS; moved out of libtdist's table, whose test
 * //tests/common:param_test checked these same rows before).
 *
 * The table is checked against this file's own list (name, type, default and what is allowed,
 * written out by hand). Parsing is checked at and past each bound with the exact message (the
 * same words as libtdist's table). The environment, the read-once cache, the first error that
 * stops the agent and the debug log line run in child processes, each with its own environment. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "operator-agent/common/param.h"

typedef struct {
  const char *name;
  char type; /* i, d, e, s */
  const char *dflt;
  const char *allowed; /* "lo..hi" or the choices */
} expect_t;

static const expect_t k_expect[] = {
    {"TDIST_LOG_LEVEL", 'e', "info", "error|warn|warning|info|debug"},
    {"TDIST_PYTHON", 's', "python3", "1..4095"},
    {"TDIST_STALL_REPORT_SECONDS", 'd', "5", "0.001..86400"},
    {"TDIST_KUBE_API_URL", 's', NULL, "1..511"},
    {"TDIST_KUBE_SA_DIR", 's', "/var/run/secrets/kubernetes.io/serviceaccount", "1..511"},
    {"TDIST_PROGRESS_DEADLINE_SECONDS", 'd', "0", "0..86400"},
    {"TDIST_NVML_LIBRARY", 's', "libnvidia-ml.so.1", "1..4095"},
    {"TDIST_RANK_METRICS", 'i', "1", "0..1"},
    {"TDIST_PY_STACKS", 'i', "1", "0..1"},
};
#define NEXPECT (sizeof k_expect / sizeof k_expect[0])

#define CHECK_STR_EQ(a, b)                                                               \
  do {                                                                                   \
    const char *sa_ = (a), *sb_ = (b);                                                   \
    if (!sa_ || !sb_ || strcmp(sa_, sb_)) {                                              \
      fprintf(stderr, "%s:%d: '%s' != '%s'\n", __FILE__, __LINE__, sa_ ? sa_ : "(null)", \
              sb_ ? sb_ : "(null)");                                                     \
      exit(1);                                                                           \
    }                                                                                    \
  } while (0)

static agent_param_id_t id_of(const char *name) {
  for (int i = 0; i < AGENT_P_COUNT_; i++)
    if (!strcmp(agent_params[i].name, name)) return (agent_param_id_t)i;
  fprintf(stderr, "no parameter %s in the agent's table\n", name);
  exit(1);
}

static agent_param_value_t parse_ok(const char *name, const char *text) {
  agent_param_value_t v;
  char err[512] = "";
  if (agent_param_parse(id_of(name), text, &v, err, sizeof err) != 0) {
    fprintf(stderr, "%s='%s' rejected: %s\n", name, text, err);
    exit(1);
  }
  return v;
}

static void parse_bad(const char *name, const char *text, const char *want) {
  agent_param_value_t v;
  char err[512] = "";
  if (agent_param_parse(id_of(name), text, &v, err, sizeof err) == 0) {
    fprintf(stderr, "%s='%s' accepted\n", name, text);
    exit(1);
  }
  CHECK_STR_EQ(err, want);
}

static void check_table(void) {
  CHECK_EQ_INT(AGENT_P_COUNT_, NEXPECT);
  for (size_t k = 0; k < NEXPECT; k++) {
    const expect_t *e = &k_expect[k];
    const agent_param_def_t *d = &agent_params[id_of(e->name)];
    char type = d->type == AGENT_PARAM_INT      ? 'i'
                : d->type == AGENT_PARAM_DOUBLE ? 'd'
                : d->type == AGENT_PARAM_ENUM   ? 'e'
                                                : 's';
    CHECK(type == e->type);
    CHECK(!d->dflt == !e->dflt && (!d->dflt || !strcmp(d->dflt, e->dflt)));
    CHECK(d->help && strlen(d->help) > 10);
    if (!d->dflt) CHECK(d->dflt_doc && *d->dflt_doc); /* environment.md says what unset means */
    if (d->dflt) parse_ok(e->name, d->dflt);          /* every default is valid */
  }
}

/* Every variable at and past its bounds, with the exact message. */
static void check_parsing(void) {
  char bad[600], text[5000];
  /* TDIST_LOG_LEVEL: every choice in either case, and what is not one. */
  const char *e = "error|warn|warning|info|debug";
  const char *choices[] = {"error", "warn", "warning", "info", "debug"};
  const char *upper[] = {"ERROR", "WARN", "WARNING", "INFO", "DEBUG"};
  for (int i = 0; i < 5; i++) {
    CHECK_EQ_INT(parse_ok("TDIST_LOG_LEVEL", choices[i]).i, i);
    CHECK_EQ_INT(parse_ok("TDIST_LOG_LEVEL", upper[i]).i, i);
  }
  const char *nots[] = {"bogus", "", " info", "auto "};
  for (size_t i = 0; i < 4; i++) {
    snprintf(bad, sizeof bad, "TDIST_LOG_LEVEL='%s' is not one of %s", nots[i], e);
    parse_bad("TDIST_LOG_LEVEL", nots[i], bad);
  }
  /* TDIST_STALL_REPORT_SECONDS: a number in 0.001..86400. */
  CHECK(parse_ok("TDIST_STALL_REPORT_SECONDS", "0.001").d == 0.001);
  CHECK(parse_ok("TDIST_STALL_REPORT_SECONDS", "86400").d == 86400);
  CHECK(parse_ok("TDIST_STALL_REPORT_SECONDS", "2.5").d == 2.5);
  const char *nums[] = {"0", "-1", "86401", "", "x", "nan", "inf", "1e9", "5s", " 5"};
  for (size_t i = 0; i < sizeof nums / sizeof nums[0]; i++) {
    snprintf(bad, sizeof bad, "TDIST_STALL_REPORT_SECONDS='%s' is not a number in 0.001..86400",
             nums[i]);
    parse_bad("TDIST_STALL_REPORT_SECONDS", nums[i], bad);
  }
  /* TDIST_PYTHON: 1..4095 bytes; a long value is quoted up to 64 bytes, then "...". */
  memset(text, 'a', 4095);
  text[4095] = '\0';
  CHECK(strlen(parse_ok("TDIST_PYTHON", text).s) == 4095);
  text[4095] = 'a';
  text[4096] = '\0';
  snprintf(bad, sizeof bad, "TDIST_PYTHON='%.64s...' is 4096 bytes long; at most 4095 are allowed",
           text);
  parse_bad("TDIST_PYTHON", text, bad);
  parse_ok("TDIST_PYTHON", "x");
  /* Control bytes in a quoted value are shown as '?'. */
  parse_bad("TDIST_STALL_REPORT_SECONDS", "1\n2",
            "TDIST_STALL_REPORT_SECONDS='1?2' is not a number in 0.001..86400");
}

typedef void (*child_fn)(void);

/* Runs fn in a child process with stderr going to err_path (when given); 0 if it exited 0. */
static int in_child(child_fn fn, const char *err_path) {
  fflush(NULL);
  pid_t pid = fork();
  CHECK(pid >= 0);
  if (pid == 0) {
    if (err_path) CHECK(freopen(err_path, "w", stderr) != NULL);
    alarm(120); /* a hang ends the child, never the suite */
    fn();
    fflush(NULL);
    _exit(0);
  }
  int status;
  CHECK(waitpid(pid, &status, 0) == pid);
  return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
}

static void env_values(void) {
  setenv("TDIST_STALL_REPORT_SECONDS", "0.25", 1);
  unsetenv("TDIST_PYTHON");
  unsetenv("TDIST_LOG_LEVEL");
  CHECK(agent_param_double(AGENT_P_STALL_REPORT_SECONDS) == 0.25);
  CHECK_STR_EQ(agent_param_str(AGENT_P_PYTHON), "python3");
  CHECK_EQ_INT(agent_param_int(AGENT_P_LOG_LEVEL), 3);
  CHECK(agent_param_first_error() == NULL);
  /* Read once: later changes to the environment are not seen. */
  setenv("TDIST_STALL_REPORT_SECONDS", "9", 1);
  setenv("TDIST_PYTHON", "/x/python", 1);
  CHECK(agent_param_double(AGENT_P_STALL_REPORT_SECONDS) == 0.25);
  CHECK_STR_EQ(agent_param_str(AGENT_P_PYTHON), "python3");
}

static void env_bad(void) {
  setenv("TDIST_PYTHON", "", 1); /* empty = unset */
  setenv("TDIST_STALL_REPORT_SECONDS", "soon", 1);
  unsetenv("TDIST_LOG_LEVEL");
  /* The default is what is read; the error says why. */
  CHECK(agent_param_error(AGENT_P_PYTHON) == NULL);
  CHECK_STR_EQ(agent_param_str(AGENT_P_PYTHON), "python3");
  CHECK(agent_param_double(AGENT_P_STALL_REPORT_SECONDS) == 5.0);
  CHECK_STR_EQ(agent_param_first_error(),
               "TDIST_STALL_REPORT_SECONDS='soon' is not a number in 0.001..86400");
}

/* Rows are checked in table order: TDIST_LOG_LEVEL's error comes first. */
static void env_bad_two(void) {
  setenv("TDIST_STALL_REPORT_SECONDS", "0", 1);
  setenv("TDIST_LOG_LEVEL", "loud", 1);
  CHECK_STR_EQ(agent_param_first_error(),
               "TDIST_LOG_LEVEL='loud' is not one of error|warn|warning|info|debug");
  CHECK_EQ_INT(agent_param_int(AGENT_P_LOG_LEVEL), 3); /* info */
}

/* With TDIST_LOG_LEVEL=debug each first read logs one line (stderr is a file here). */
static void env_debug_log(void) {
  setenv("TDIST_LOG_LEVEL", "DEBUG", 1);
  setenv("TDIST_PYTHON", "/usr/bin/python3", 1);
  setenv("TDIST_STALL_REPORT_SECONDS", "x", 1);
  CHECK_STR_EQ(agent_param_str(AGENT_P_PYTHON), "/usr/bin/python3");
  CHECK_STR_EQ(agent_param_str(AGENT_P_PYTHON), "/usr/bin/python3");
  CHECK(agent_param_double(AGENT_P_STALL_REPORT_SECONDS) == 5.0);
}

static void check_debug_log(const char *path) {
  FILE *f = fopen(path, "r");
  CHECK(f != NULL);
  char line[1024];
  int python = 0, bad = 0, level = 0;
  while (fgets(line, sizeof line, f)) {
    CHECK(strncmp(line, "tdist-agent D ", 14) == 0);
    python += strstr(line, " param: TDIST_PYTHON=/usr/bin/python3\n") != NULL;
    bad += strstr(line,
                  " param: TDIST_STALL_REPORT_SECONDS='x' is not a number in "
                  "0.001..86400\n") != NULL;
    level += strstr(line, " param: TDIST_LOG_LEVEL=DEBUG\n") != NULL;
  }
  fclose(f);
  CHECK_EQ_INT(python, 1); /* read twice, logged once */
  CHECK_EQ_INT(bad, 1);
  CHECK_EQ_INT(level, 1);
}

int main(void) {
  check_table();
  check_parsing();
  CHECK_EQ_INT(in_child(env_values, NULL), 0);
  CHECK_EQ_INT(in_child(env_bad, NULL), 0);
  CHECK_EQ_INT(in_child(env_bad_two, NULL), 0);
  char path[600];
  const char *tmp = getenv("TEST_TMPDIR");
  snprintf(path, sizeof path, "%s/agent_param_debug.log", tmp ? tmp : "/tmp");
  CHECK_EQ_INT(in_child(env_debug_log, path), 0);
  check_debug_log(path);
  unlink(path);
  printf("ok: the agent's parameter table (%d rows)\n", (int)AGENT_P_COUNT_);
  return 0;
}
