/* runtime/common/param.{h,c}: the TDIST_* parameter table.
 *
 * The table is checked against this file's own list of every variable (name, type, default and
 * what is allowed, written out by hand): a row added, removed or changed there must be changed
 * here too. Parsing is checked at and past each bound with the exact message. The read-once
 * cache, the debug log line, racing first reads and the errors at group creation (gloo and nccl)
 * run in real child processes, each with its own environment. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "runtime/common/param.h"
#include "tdist/tdist.h"

/* type: i = integer, d = number, e = one of, s = text. allowed: "lo..hi" (i, d: the range; s:
 * the length range) or the choices. dflt: the default as the variable spells it, or NULL. */
typedef struct {
  const char *name;
  char type;
  const char *dflt;
  const char *allowed;
} expect_t;

static const expect_t k_expect[] = {
    {"TDIST_LOG_LEVEL", 'e', "info", "error|warn|warning|info|debug"},
    {"TDIST_DEBUG", 'e', "OFF", "OFF|INFO|DETAIL"},
    {"TDIST_SOCKET_IFNAME", 's', NULL, "0..15"},
    {"TDIST_SHM", 'i', "1", "0..1"},
    {"TDIST_SPIN_US", 'i', NULL, "0..10000000"},
    {"TDIST_SHM_SPIN_US", 'i', "2000", "0..10000000"},
    {"TDIST_SHM_SINGLE_COPY", 'i', "1", "0..1"},
    {"TDIST_SHM_YIELD", 'i', "1", "0..1"},
    {"TDIST_P2P_BUFFER_MB", 'i', "256", "0..1048576"},
    {"TDIST_ALGO_ALLREDUCE", 'e', "auto", "auto|ring|rd|direct"},
    {"TDIST_REDUCE_KERNELS", 'e', "auto", "auto|generic"},
    {"TDIST_STATS_FILE", 's', NULL, "1..4095"},
    {"TDIST_NCCL_DEVICE", 'i', NULL, "0..2147483647"},
    {"TDIST_NCCL_COMM_SPLIT", 'i', "1", "0..1"},
    {"TDIST_NCCL_CHECK_POINTERS", 'i', "1", "0..1"},
    {"TDIST_NCCL_SPIN_US", 'i', "10000", "0..10000000"},
    {"TDIST_NCCL_LIBRARY", 's', NULL, "1..4095"},
    {"TDIST_CUDART_LIBRARY", 's', NULL, "1..4095"},
    {"TDIST_MPI_PLUGIN", 's', NULL, "1..4095"},
    {"TDIST_MPI_SPIN_US", 'i', "50", "0..10000000"},
};
/* tdist-agent's own variables (TDIST_PYTHON, TDIST_STALL_REPORT_SECONDS) are checked with its
 * table by //tests/agent:param_test. */
#define NEXPECT (sizeof k_expect / sizeof k_expect[0])

static tdist__param_id_t id_of(const char *name) {
  for (int i = 0; i < TDIST__P_COUNT_; i++)
    if (!strcmp(tdist__params[i].name, name)) return (tdist__param_id_t)i;
  fprintf(stderr, "no parameter %s in the table\n", name);
  exit(1);
}

#define CHECK_STR_EQ(a, b)                                                               \
  do {                                                                                   \
    const char *sa_ = (a), *sb_ = (b);                                                   \
    if (!sa_ || !sb_ || strcmp(sa_, sb_)) {                                              \
      fprintf(stderr, "%s:%d: '%s' != '%s'\n", __FILE__, __LINE__, sa_ ? sa_ : "(null)", \
              sb_ ? sb_ : "(null)");                                                     \
      exit(1);                                                                           \
    }                                                                                    \
  } while (0)

/* Parses text for name: expects success (err_fmt NULL) or exactly the message. */
static tdist__param_value_t parse_ok(const char *name, const char *text) {
  tdist__param_value_t v;
  char err[512] = "";
  if (tdist__param_parse(id_of(name), text, &v, err, sizeof err) != 0) {
    fprintf(stderr, "%s='%s' rejected: %s\n", name, text, err);
    exit(1);
  }
  return v;
}

static void parse_bad(const char *name, const char *text, const char *want) {
  tdist__param_value_t v;
  char err[512] = "";
  if (tdist__param_parse(id_of(name), text, &v, err, sizeof err) == 0) {
    fprintf(stderr, "%s='%s' accepted\n", name, text);
    exit(1);
  }
  CHECK_STR_EQ(err, want);
}

static void check_table(void) {
  CHECK_EQ_INT(TDIST__P_COUNT_, NEXPECT);
  for (size_t k = 0; k < NEXPECT; k++) {
    const expect_t *e = &k_expect[k];
    const tdist__param_def_t *d = &tdist__params[id_of(e->name)];
    char type = d->type == TDIST__PARAM_INT      ? 'i'
                : d->type == TDIST__PARAM_DOUBLE ? 'd'
                : d->type == TDIST__PARAM_ENUM   ? 'e'
                                                 : 's';
    if (type != e->type || (!d->dflt != !e->dflt) || (d->dflt && strcmp(d->dflt, e->dflt))) {
      fprintf(stderr, "%s: type %c default %s in the table\n", e->name, type,
              d->dflt ? d->dflt : "(none)");
      exit(1);
    }
    CHECK(d->help && strlen(d->help) > 10);
    CHECK(d->scope != 0);
    if (!d->dflt) CHECK(d->dflt_doc && *d->dflt_doc); /* environment.md says what unset means */
    if (d->dflt) parse_ok(e->name, d->dflt);          /* every default is valid */
  }
}

/* Every variable at and past its bounds, with the exact message. */
static void check_parsing(void) {
  char bad[600], text[5000];
  for (size_t k = 0; k < NEXPECT; k++) {
    const expect_t *e = &k_expect[k];
    if (e->type == 'e') {
      char choices[128];
      snprintf(choices, sizeof choices, "%s", e->allowed);
      long long idx = 0;
      for (char *save, *c = strtok_r(choices, "|", &save); c; c = strtok_r(NULL, "|", &save)) {
        CHECK_EQ_INT(parse_ok(e->name, c).i, idx);
        for (char *p = c; *p; p++) *p = (char)(*p ^ 0x20); /* other case: letters only */
        CHECK_EQ_INT(parse_ok(e->name, c).i, idx);
        idx++;
      }
      const char *nots[] = {"bogus", "", " info", "auto "};
      for (size_t i = 0; i < 4; i++) {
        snprintf(bad, sizeof bad, "%s='%s' is not one of %s", e->name, nots[i], e->allowed);
        parse_bad(e->name, nots[i], bad);
      }
      continue;
    }
    char lo_s[32], hi_s[32];
    const char *dots = strstr(e->allowed, "..");
    CHECK(dots && dots - e->allowed < 32 && strlen(dots + 2) < 32);
    snprintf(lo_s, sizeof lo_s, "%.*s", (int)(dots - e->allowed), e->allowed);
    snprintf(hi_s, sizeof hi_s, "%s", dots + 2);
    if (e->type == 'i') {
      long long lo = atoll(lo_s), hi = atoll(hi_s);
      CHECK_EQ_INT(parse_ok(e->name, lo_s).i, lo);
      CHECK_EQ_INT(parse_ok(e->name, hi_s).i, hi);
      CHECK_EQ_INT(parse_ok(e->name, "+1").i, 1);
      char below[32], above[32];
      snprintf(below, sizeof below, "%lld", lo - 1);
      snprintf(above, sizeof above, "%lld", hi + 1);
      const char *nots[] = {below, above, "",   "abc", "1x",
                            "0.5", " 1",  "1 ", "0x1", "99999999999999999999"};
      for (size_t i = 0; i < sizeof nots / sizeof nots[0]; i++) {
        snprintf(bad, sizeof bad, "%s='%s' is not an integer in %s", e->name, nots[i], e->allowed);
        parse_bad(e->name, nots[i], bad);
      }
    } else if (e->type == 'd') {
      CHECK(parse_ok(e->name, lo_s).d == atof(lo_s));
      CHECK(parse_ok(e->name, hi_s).d == atof(hi_s));
      CHECK(parse_ok(e->name, "2.5").d == 2.5);
      const char *nots[] = {"0", "-1", "86401", "", "x", "nan", "inf", "1e9", "5s", " 5"};
      for (size_t i = 0; i < sizeof nots / sizeof nots[0]; i++) {
        snprintf(bad, sizeof bad, "%s='%s' is not a number in %s", e->name, nots[i], e->allowed);
        parse_bad(e->name, nots[i], bad);
      }
    } else {
      size_t lo = (size_t)atoll(lo_s), hi = (size_t)atoll(hi_s);
      CHECK(hi + 1 < sizeof text);
      memset(text, 'a', hi);
      text[hi] = '\0';
      CHECK(strlen(parse_ok(e->name, text).s) == hi);
      text[hi] = 'a';
      text[hi + 1] = '\0';
      /* the value is quoted up to 64 bytes, then "..." */
      snprintf(bad, sizeof bad, "%s='%.*s%s' is %zu bytes long; at most %zu are allowed", e->name,
               hi + 1 > 64 ? 64 : (int)(hi + 1), text, hi + 1 > 64 ? "..." : "", hi + 1, hi);
      parse_bad(e->name, text, bad);
      if (lo == 1) parse_ok(e->name, "x");
    }
  }
  /* Control bytes in a quoted value are shown as '?'. */
  parse_bad("TDIST_SHM", "1\n2", "TDIST_SHM='1?2' is not an integer in 0..1");
}

/* ---- in child processes: the environment, the cache, the log, group creation ---- */

typedef void (*child_fn)(void *);

/* Runs fn in a child process with stderr going to err_path (when given); 0 if it exited 0. */
static int in_child(child_fn fn, void *arg, const char *err_path) {
  fflush(NULL);
  pid_t pid = fork();
  CHECK(pid >= 0);
  if (pid == 0) {
    if (err_path) CHECK(freopen(err_path, "w", stderr) != NULL);
    alarm(120); /* a hang ends the child, never the suite */
    fn(arg);
    fflush(NULL);
    _exit(0);
  }
  int status;
  CHECK(waitpid(pid, &status, 0) == pid);
  return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
}

static void env_values(void *arg) {
  (void)arg;
  setenv("TDIST_SHM", "0", 1);
  setenv("TDIST_SHM_SPIN_US", "", 1); /* empty = unset */
  setenv("TDIST_SPIN_US", "77", 1);
  setenv("TDIST_ALGO_ALLREDUCE", "RING", 1);
  setenv("TDIST_STATS_FILE", "/tmp/x", 1);
  unsetenv("TDIST_NCCL_DEVICE");
  CHECK_EQ_INT(tdist__param_int(TDIST__P_SHM), 0);
  CHECK_EQ_INT(tdist__param_is_set(TDIST__P_SHM), 1);
  CHECK_EQ_INT(tdist__param_int(TDIST__P_SHM_SPIN_US), 2000);
  CHECK_EQ_INT(tdist__param_is_set(TDIST__P_SHM_SPIN_US), 0);
  CHECK_EQ_INT(tdist__param_int(TDIST__P_SPIN_US), 77);
  CHECK_EQ_INT(tdist__param_int(TDIST__P_ALGO_ALLREDUCE), 1);
  CHECK_STR_EQ(tdist__param_str(TDIST__P_STATS_FILE), "/tmp/x");
  CHECK(tdist__param_str(TDIST__P_SOCKET_IFNAME) == NULL || getenv("TDIST_SOCKET_IFNAME"));
  CHECK_EQ_INT(tdist__param_is_set(TDIST__P_NCCL_DEVICE), 0);
  CHECK(tdist__param_first_error(NULL, 0, TDIST__PARAM_LIB) == NULL);
  /* Read once: later changes to the environment are not seen. */
  setenv("TDIST_SHM", "1", 1);
  setenv("TDIST_STATS_FILE", "/tmp/y", 1);
  CHECK_EQ_INT(tdist__param_int(TDIST__P_SHM), 0);
  CHECK_STR_EQ(tdist__param_str(TDIST__P_STATS_FILE), "/tmp/x");
}

static void env_bad(void *arg) {
  (void)arg;
  setenv("TDIST_SHM_SPIN_US", "-5", 1);
  /* The default is what is read; the error says why. */
  CHECK_EQ_INT(tdist__param_int(TDIST__P_SHM_SPIN_US), 2000);
  CHECK_EQ_INT(tdist__param_is_set(TDIST__P_SHM_SPIN_US), 0);
  CHECK_STR_EQ(tdist__param_error(TDIST__P_SHM_SPIN_US),
               "TDIST_SHM_SPIN_US='-5' is not an integer in 0..10000000");
  const tdist__param_id_t ids[] = {TDIST__P_SHM, TDIST__P_SHM_SPIN_US};
  CHECK_STR_EQ(tdist__param_first_error(ids, 2, 0), tdist__param_error(TDIST__P_SHM_SPIN_US));
  CHECK_STR_EQ(tdist__param_first_error(NULL, 0, TDIST__PARAM_LIB),
               "TDIST_SHM_SPIN_US='-5' is not an integer in 0..10000000");
}

/* With TDIST_LOG_LEVEL=debug each first read logs one line (stderr is a file here). */
static void env_debug_log(void *arg) {
  (void)arg;
  setenv("TDIST_LOG_LEVEL", "DEBUG", 1);
  setenv("TDIST_SHM_SPIN_US", "7", 1);
  setenv("TDIST_NCCL_SPIN_US", "x", 1);
  unsetenv("TDIST_SHM_YIELD");
  CHECK_EQ_INT(tdist__param_int(TDIST__P_SHM_SPIN_US), 7);
  CHECK_EQ_INT(tdist__param_int(TDIST__P_SHM_SPIN_US), 7);
  CHECK_EQ_INT(tdist__param_int(TDIST__P_NCCL_SPIN_US), 10000);
  CHECK_EQ_INT(tdist__param_int(TDIST__P_SHM_YIELD), 1);
}

static void check_debug_log(const char *path) {
  FILE *f = fopen(path, "r");
  CHECK(f != NULL);
  char line[1024];
  int spin = 0, bad = 0, yield = 0, level = 0;
  while (fgets(line, sizeof line, f)) {
    CHECK(strncmp(line, "tdist D ", 8) == 0);
    spin += strstr(line, " param: TDIST_SHM_SPIN_US=7\n") != NULL;
    bad += strstr(line, " param: TDIST_NCCL_SPIN_US='x' is not an integer in 0..10000000\n") != 0;
    yield += strstr(line, " param: TDIST_SHM_YIELD unset: default 1\n") != NULL;
    level += strstr(line, " param: TDIST_LOG_LEVEL=DEBUG\n") != NULL;
  }
  fclose(f);
  CHECK_EQ_INT(spin, 1); /* read twice, logged once */
  CHECK_EQ_INT(bad, 1);
  CHECK_EQ_INT(yield, 1);
  CHECK_EQ_INT(level, 1);
}

#define NTHREADS 8
static pthread_barrier_t g_barrier;
static void *racer(void *arg) {
  pthread_barrier_wait(&g_barrier);
  *(long long *)arg = tdist__param_int(TDIST__P_NCCL_DEVICE) * 100 +
                      tdist__param_int(TDIST__P_DEBUG) * 10 + tdist__param_int(TDIST__P_SHM);
  return NULL;
}

/* First reads racing from many threads all see the same value (run under TSan too). */
static void env_race(void *arg) {
  (void)arg;
  setenv("TDIST_NCCL_DEVICE", "3", 1);
  setenv("TDIST_DEBUG", "detail", 1);
  setenv("TDIST_SHM", "1", 1);
  pthread_t t[NTHREADS];
  long long got[NTHREADS];
  CHECK(pthread_barrier_init(&g_barrier, NULL, NTHREADS) == 0);
  for (int i = 0; i < NTHREADS; i++) CHECK(pthread_create(&t[i], NULL, racer, &got[i]) == 0);
  for (int i = 0; i < NTHREADS; i++) {
    CHECK(pthread_join(t[i], NULL) == 0);
    CHECK_EQ_INT(got[i], 321);
  }
}

/* A gloo group of one over file://: the bad variable is the error of group creation. */
static void group_fails(const char *backend, const char *want) {
  char im[600];
  const char *tmp = getenv("TEST_TMPDIR");
  snprintf(im, sizeof im, "file://%s/param_store_%d?rank=0&world_size=1", tmp ? tmp : "/tmp",
           (int)getpid());
  tdist_pg_options_t o = TDIST_PG_OPTIONS_INIT;
  o.backend = backend;
  o.init_method = im;
  o.timeout_ms = 20000;
  tdist_pg_t *pg = NULL;
  tdist_status_t st = tdist_init_process_group(&o, &pg);
  if (st != TDIST_ERR_INVALID_ARGUMENT || !strstr(tdist_last_error(), want)) {
    fprintf(stderr, "%s group: status %d (%s), '%s'; wanted '%s'\n", backend, (int)st,
            tdist_strerror(st), tdist_last_error(), want);
    exit(1);
  }
  CHECK(pg == NULL);
}

static void env_gloo_algo(void *arg) {
  (void)arg;
  setenv("TDIST_ALGO_ALLREDUCE", "tree", 1);
  group_fails("gloo", "TDIST_ALGO_ALLREDUCE='tree' is not one of auto|ring|rd|direct");
}

static void env_gloo_log_level(void *arg) {
  (void)arg;
  setenv("TDIST_LOG_LEVEL", "loud", 1);
  group_fails("gloo", "TDIST_LOG_LEVEL='loud' is not one of error|warn|warning|info|debug");
}

static void env_gloo_shm(void *arg) {
  (void)arg;
  setenv("TDIST_SHM", "off", 1);
  group_fails("gloo", "TDIST_SHM='off' is not an integer in 0..1");
}

static void env_gloo_good(void *arg) {
  (void)arg;
  setenv("TDIST_ALGO_ALLREDUCE", "rd", 1);
  setenv("TDIST_SHM", "0", 1);
  char im[600];
  const char *tmp = getenv("TEST_TMPDIR");
  snprintf(im, sizeof im, "file://%s/param_good_%d?rank=0&world_size=1", tmp ? tmp : "/tmp",
           (int)getpid());
  tdist_pg_options_t o = TDIST_PG_OPTIONS_INIT;
  o.init_method = im;
  tdist_pg_t *pg = NULL;
  CHECK_OK(tdist_init_process_group(&o, &pg));
  int64_t v = 41;
  CHECK_OK_MSG(tdist_all_reduce(pg, &v, 1, TDIST_INT64, TDIST_SUM), tdist_pg_last_error(pg));
  CHECK_EQ_INT(v, 41);
  tdist_pg_destroy(pg);
}

static void env_nccl_spin(void *arg) {
  (void)arg;
  setenv("TDIST_NCCL_SPIN_US", "-1", 1);
  group_fails("nccl", "TDIST_NCCL_SPIN_US='-1' is not an integer in 0..10000000");
}

int main(void) {
  check_table();
  check_parsing();
  TEST_LOG("table and parsing: %d variables", (int)NEXPECT);
  CHECK(in_child(env_values, NULL, NULL) == 0);
  CHECK(in_child(env_bad, NULL, NULL) == 0);
  char path[512];
  const char *tmp = getenv("TEST_TMPDIR");
  snprintf(path, sizeof path, "%s/param_debug.log", tmp ? tmp : "/tmp");
  CHECK(in_child(env_debug_log, NULL, path) == 0);
  check_debug_log(path);
  CHECK(in_child(env_race, NULL, NULL) == 0);
  CHECK(in_child(env_gloo_algo, NULL, NULL) == 0);
  CHECK(in_child(env_gloo_log_level, NULL, NULL) == 0);
  CHECK(in_child(env_gloo_shm, NULL, NULL) == 0);
  CHECK(in_child(env_gloo_good, NULL, NULL) == 0);
  CHECK(in_child(env_nccl_spin, NULL, NULL) == 0);
  TEST_LOG("ok");
  return 0;
}
