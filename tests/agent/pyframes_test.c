/* operator-agent/pystack/pyframes.h: Python stacks read from a process's memory, against what the
 * process's own interpreter says (tests/agent/pyframes/ref.py), for each interpreter given as an
 * argument (Debian 12's 3.11; the 2.6 root's 3.13, chroot'ed by its wrapper):
 *   a. location tables: a generated function with random line gaps (seeded), every instruction's
 *      line from agent_pyframes_addr2line equal to CPython's co_lines();
 *   b. a running process (main thread in time.sleep, a second thread blocked in Event.wait): both
 *      threads' frames (file, line, function, in order) equal traceback's;
 *   c. the same process stopped with SIGSTOP: the same frames, and it is still stopped after (the
 *      reader never continues it), then runs again on SIGCONT;
 *   d. a process that is not Python (sleep): refused, naming why; a dead pid: refused.
 *   args: REF_PY PYTHON...  */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "operator-agent/pystack/pyframes.h"
#include "operator-agent/pystack/pystack.h"
#include "tests/testlib/check.h"

#define OUT_CAP 65536

/* A named check that does not stop the test (the Python process is killed at the end either way).
 */
static int g_fails;
#define CHECKF(cond, ...)                  \
  do {                                     \
    int ok_ = (cond);                      \
    printf("%s: ", ok_ ? "PASS" : "FAIL"); \
    printf(__VA_ARGS__);                   \
    printf("\n");                          \
    fflush(stdout);                        \
    g_fails += !ok_;                       \
  } while (0)

static void msleep(int ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

static char *slurp(const char *path) {
  FILE *f = fopen(path, "r");
  if (!f) return NULL;
  char *b = calloc(1, OUT_CAP);
  size_t n = fread(b, 1, OUT_CAP - 1, f);
  b[n] = 0;
  fclose(f);
  return b;
}

/* The reader's output in ref.py's format ("T 0x...", "F file|line|name"), threads in order. */
static void to_ref_format(const char *in, char *out, size_t cap) {
  size_t n = 0;
  out[0] = 0;
  for (const char *l = in; *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : l + strlen(l)) {
    unsigned long long tid;
    char file[600], name[600];
    int line;
    int k = 0;
    if (sscanf(l, "Thread 0x%llx", &tid) == 1)
      k = snprintf(out + n, cap - n, "T 0x%llx\n", tid);
    else if (sscanf(l, "  File \"%599[^\"]\", line %d in %599[^\n]", file, &line, name) == 3)
      k = snprintf(out + n, cap - n, "F %s|%d|%s\n", file, line, name);
    if (k > 0 && (size_t)k < cap - n) n += (size_t)k;
  }
}

/* Whether every thread block of ref appears, whole and in order, in got. */
static int same_threads(const char *ref, const char *got) {
  const char *t = ref;
  while ((t = strstr(t, "T 0x"))) {
    const char *next = strstr(t + 1, "T 0x");
    size_t len = next ? (size_t)(next - t) : strlen(t);
    char *block = strndup(t, len);
    const char *at = strstr(got, block);
    /* the block must end where the reader's thread ends */
    int ok = at && (at[len] == 0 || !strncmp(at + len, "T 0x", 4));
    free(block);
    if (!ok) return 0;
    t += len;
  }
  return 1;
}

static void case_lines(const char *lines_path, const char *py) {
  FILE *f = fopen(lines_path, "r");
  CHECK(f);
  int first = 0;
  static char hex[1 << 18];
  CHECK(fscanf(f, "%d %262143s", &first, hex) == 2);
  size_t n = strlen(hex) / 2;
  unsigned char *tab = malloc(n + 1);
  for (size_t i = 0; i < n; i++) sscanf(hex + 2 * i, "%2hhx", &tab[i]);
  int s, e, line, ranges = 0, addrs = 0, bad = 0, last_line = 0;
  while (fscanf(f, "%d %d %d", &s, &e, &line) == 3) {
    ranges++;
    for (int a = s; a < e; a += 2, addrs++) {
      int got = agent_pyframes_addr2line(tab, n, first, a);
      if (got != line && bad++ < 5) printf("  addr %d: line %d, CPython says %d\n", a, got, line);
    }
    if (line > last_line) last_line = line;
  }
  fclose(f);
  free(tab);
  CHECKF(ranges > 20 && !bad,
         "%s: every instruction's line of a %zu-byte location table (first "
         "line %d, last %d) equals co_lines(): %d addresses in %d ranges, %d differ",
         py, n, first, last_line, addrs, ranges, bad);
}

static int proc_state(pid_t pid) {
  char path[64], line[256];
  snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
  FILE *f = fopen(path, "r");
  int st = '?';
  while (f && fgets(line, sizeof line, f))
    if (!strncmp(line, "State:", 6)) sscanf(line + 6, " %c", (char *)&st);
  if (f) fclose(f);
  return st;
}

/* The python3 process under pid (the 2.6 root's wrapper execs its way down: same pid). */
static void case_python(const char *ref_py, const char *python, unsigned seed) {
  char out[512], lines[600];
  snprintf(out, sizeof out, "%s/ref.%d", getenv("TEST_TMPDIR") ? getenv("TEST_TMPDIR") : "/tmp",
           (int)getpid());
  snprintf(lines, sizeof lines, "%s.lines", out);
  unlink(out);
  char seed_s[16];
  snprintf(seed_s, sizeof seed_s, "%u", seed);
  pid_t pid = fork();
  CHECK(pid >= 0);
  if (pid == 0) {
    execl(python, python, ref_py, out, seed_s, (char *)NULL);
    _exit(127);
  }
  struct stat sb;
  for (int i = 0; i < 1200 && stat(out, &sb); i++) msleep(50);
  CHECKF(!stat(out, &sb), "%s: ref.py published its stacks", python);
  case_lines(lines, python);
  char *ref = slurp(out), *got = malloc(OUT_CAP), *conv = malloc(OUT_CAP), why[600];

  ssize_t n = agent_pyframes_read(pid, got, OUT_CAP, why, sizeof why);
  to_ref_format(got, conv, OUT_CAP);
  CHECKF(n > 0 && same_threads(ref, conv),
         "%s: b. running process: both threads' frames equal traceback's (%zd bytes)%s%s%s%s",
         python, n, n > 0 ? "" : ": ", n > 0 ? "" : why, same_threads(ref, conv) ? "" : "\nref:\n",
         same_threads(ref, conv) ? "" : ref);
  if (n > 0 && !same_threads(ref, conv)) printf("read:\n%s", got);

  CHECK(!kill(pid, SIGSTOP));
  for (int i = 0; i < 100 && !agent_pystack_stopped(pid); i++) msleep(10);
  CHECKF(agent_pystack_stopped(pid), "%s: c. the process is stopped (state %c)", python,
         proc_state(pid));
  n = agent_pyframes_read(pid, got, OUT_CAP, why, sizeof why);
  to_ref_format(got, conv, OUT_CAP);
  CHECKF(n > 0 && same_threads(ref, conv), "%s: c. stopped process: the same frames%s%s", python,
         n > 0 ? "" : ": ", n > 0 ? "" : why);
  if (n > 0 && !same_threads(ref, conv)) printf("read:\n%s", got);
  msleep(100);
  CHECKF(proc_state(pid) == 'T', "%s: c. still stopped after the read (state %c)", python,
         proc_state(pid));
  CHECK(!kill(pid, SIGCONT));
  for (int i = 0; i < 100 && agent_pystack_stopped(pid); i++) msleep(10);
  CHECKF(!agent_pystack_stopped(pid) && waitpid(pid, NULL, WNOHANG) == 0,
         "%s: c. runs again on SIGCONT (state %c)", python, proc_state(pid));
  printf("%s:\n%s", python, got);
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
  free(ref);
  free(got);
  free(conv);
  unlink(out);
  unlink(lines);
}

static void case_not_python(void) {
  pid_t pid = fork();
  CHECK(pid >= 0);
  if (pid == 0) {
    execl("/bin/sleep", "sleep", "100", (char *)NULL);
    _exit(127);
  }
  msleep(200);
  char out[4096], why[600];
  ssize_t n = agent_pyframes_read(pid, out, sizeof out, why, sizeof why);
  CHECKF(n == -1 && strstr(why, "not a CPython process"), "d. sleep(1): refused: %s", why);
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
  n = agent_pyframes_read(pid, out, sizeof out, why, sizeof why);
  CHECKF(n == -1 && why[0], "d. a dead pid: refused: %s", why);
}

int main(int argc, char **argv) {
  CHECK(argc >= 3);
  const char *s = getenv("TDIST_TEST_SEED");
  unsigned seed = s ? (unsigned)strtoul(s, NULL, 10) : (unsigned)time(NULL) % 100000;
  printf("pyframes_test: seed %u (TDIST_TEST_SEED=%u replays)\n", seed, seed);
  for (int i = 2; i < argc; i++) case_python(argv[1], argv[i], seed + (unsigned)i);
  case_not_python();
  printf("pyframes_test: %d failure(s)\n", g_fails);
  return g_fails ? 1 : 0;
}
