/* operator-agent/procstat/procstat.c over real processes and hostile text:
 *   self: threads (3 started, named), RSS after touching 64 MiB, bytes written by write(2) and
 *   CPU time after spinning, each checked against an independent reading (this file's own
 *   sscanf of /proc/self/status and io, getrusage);
 *   threads: the listing names every thread with its comm and state, sorted, and counts them;
 *   gone: a reaped child is -ESRCH (stat, files kept open across the reaping, the thread
 *   listing); a zombie reads as state Z with no memory;
 *   fake /proc trees: stat that does not parse is -EPROTO, io missing leaves have_io 0;
 *   parsers: comm with spaces and parentheses, every prefix of real texts (exact-length heap
 *   copies: ASan sees any read past the end), numbers that overflow, negative CPU ticks, and
 *   20,000 random mutations of real texts (flips, inserts, deletions, cuts). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "operator-agent/procstat/procstat.h"
#include "rng.h"

static int block_fd[2];

static void *blocker(void *arg) {
  char c;
  pthread_setname_np(pthread_self(), (const char *)arg);
  /* blocks until main closes the write end */
  while (read(block_fd[0], &c, 1) < 0 && errno == EINTR) {
  }
  return NULL;
}

static size_t slurp(const char *path, char *buf, size_t cap) {
  int fd = open(path, O_RDONLY);
  CHECK(fd >= 0);
  size_t n = 0;
  ssize_t r;
  while ((r = read(fd, buf + n, cap - 1 - n)) > 0) n += (size_t)r;
  close(fd);
  buf[n] = 0;
  return n;
}

/* An independent reading: "Key:   value" of /proc/self/status or io, with sscanf. */
static unsigned long long field(const char *path, const char *key) {
  char buf[8192], k[64];
  slurp(path, buf, sizeof buf);
  snprintf(k, sizeof k, "\n%s:", key);
  char *p = strstr(buf, k);
  if (!p && !strncmp(buf, k + 1, strlen(k + 1))) p = buf - 1;
  CHECK(p != NULL);
  unsigned long long v = 0;
  CHECK_EQ_INT(sscanf(p + strlen(k), " %llu", &v), 1);
  return v;
}

static double rusage_cpu_s(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + (double)ru.ru_stime.tv_sec +
         ru.ru_stime.tv_usec / 1e6;
}

static void case_self(void) {
  TEST_CASE("self");
  char buf[16384];
  agent_proc_sample_t a, b;
  CHECK(pipe(block_fd) == 0);
  pthread_t th[3];
  static const char *const names[3] = {"obs-blk-0", "obs-blk-1", "obs-blk-2"};
  for (int i = 0; i < 3; i++) CHECK(pthread_create(&th[i], NULL, blocker, (void *)names[i]) == 0);
  usleep(100000);
  CHECK_EQ_INT(agent_procstat_read(NULL, getpid(), &a, buf, sizeof buf), 0);
  CHECK_EQ_UINT(a.threads, 4);
  CHECK_EQ_UINT(a.threads, field("/proc/self/status", "Threads"));
  CHECK(a.state == 'R');
  CHECK(a.have_io);

  /* RSS: 64 MiB touched */
  size_t mb64 = 64u << 20;
  char *mem = malloc(mb64);
  CHECK(mem != NULL);
  memset(mem, 1, mb64);
  CHECK_EQ_INT(agent_procstat_read(NULL, getpid(), &b, buf, sizeof buf), 0);
  unsigned long long rss_kb = field("/proc/self/status", "VmRSS");
  CHECK_CMP_UINT(b.rss_bytes, >=, a.rss_bytes + mb64 - (1u << 20));
  /* the two readings are a few syscalls apart: within 1 MiB */
  CHECK_CMP_UINT(b.rss_bytes, <=, rss_kb * 1024 + (1u << 20));
  CHECK_CMP_UINT(b.rss_bytes + (1u << 20), >=, rss_kb * 1024);

  /* bytes written: exactly what write(2) was asked for */
  const char *tmp = getenv("TEST_TMPDIR");
  char path[512];
  snprintf(path, sizeof path, "%s/procstat_out.%d", tmp ? tmp : "/tmp", (int)getpid());
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  CHECK(fd >= 0);
  CHECK_EQ_INT(agent_procstat_read(NULL, getpid(), &a, buf, sizeof buf), 0);
  CHECK_EQ_INT(write(fd, mem, 123457), 123457);
  CHECK_EQ_INT(agent_procstat_read(NULL, getpid(), &b, buf, sizeof buf), 0);
  close(fd);
  unlink(path);
  CHECK_EQ_UINT(b.wchar - a.wchar, 123457);
  /* reading stat, status and io is reading: rchar moves, by what the reader read */
  CHECK_CMP_UINT(b.rchar, >, a.rchar);
  CHECK_EQ_UINT(b.wchar, field("/proc/self/io", "wchar"));

  /* CPU: 0.3 s of spinning, as getrusage sees it, within 3 ticks (+ the reads themselves) */
  long hz = sysconf(_SC_CLK_TCK);
  double r0 = rusage_cpu_s();
  CHECK_EQ_INT(agent_procstat_read(NULL, getpid(), &a, buf, sizeof buf), 0);
  volatile unsigned long x = 0;
  while (rusage_cpu_s() - r0 < 0.3) x++;
  CHECK_EQ_INT(agent_procstat_read(NULL, getpid(), &b, buf, sizeof buf), 0);
  double r1 = rusage_cpu_s();
  double got = (double)(b.utime_ticks + b.stime_ticks - a.utime_ticks - a.stime_ticks) / hz;
  TEST_LOG("cpu: procstat %.3f s, getrusage %.3f s", got, r1 - r0);
  CHECK(got > r1 - r0 - 3.0 / hz && got < r1 - r0 + 3.0 / hz);
  CHECK_CMP_INT(b.t_ns, >, a.t_ns);
  CHECK_CMP_UINT(b.vcsw + b.ivcsw, >=, a.vcsw + a.ivcsw);

  TEST_CASE("threads");
  agent_thread_info_t t[8];
  int total = 0;
  int n = agent_procstat_threads(NULL, getpid(), t, 8, &total);
  CHECK_EQ_INT(n, 4);
  CHECK_EQ_INT(total, 4);
  CHECK_EQ_INT(t[0].tid, getpid());
  for (int i = 1; i < 4; i++) {
    CHECK_CMP_INT(t[i].tid, >, t[i - 1].tid);
    CHECK_HAS(t[i].comm, "obs-blk-");
    CHECK(t[i].state == 'S');
    TEST_LOG("thread %d %s %c wchan '%s'", (int)t[i].tid, t[i].comm, t[i].state, t[i].wchan);
  }
  n = agent_procstat_threads(NULL, getpid(), t, 2, &total);
  CHECK_EQ_INT(n, 2);
  CHECK_EQ_INT(total, 4);
  close(block_fd[1]);
  for (int i = 0; i < 3; i++) pthread_join(th[i], NULL);
  close(block_fd[0]);
  free(mem);
}

static void case_gone(void) {
  TEST_CASE("gone");
  char buf[8192];
  agent_proc_sample_t s;
  pid_t c = fork();
  CHECK(c >= 0);
  if (c == 0) _exit(0);
  /* a zombie: readable, state Z, no memory */
  for (int i = 0; i < 200; i++) {
    CHECK_EQ_INT(agent_procstat_read(NULL, c, &s, buf, sizeof buf), 0);
    if (s.state == 'Z') break;
    usleep(10000);
  }
  CHECK(s.state == 'Z');
  CHECK_EQ_UINT(s.rss_bytes, 0);
  /* files kept open across the reaping: bound to the process, -ESRCH after it */
  agent_proc_files_t f = AGENT_PROC_FILES_INIT;
  CHECK_EQ_INT(agent_procstat_open(&f, NULL, c), 0);
  CHECK_EQ_INT(agent_procstat_sample(&f, &s, buf, sizeof buf), 0);
  CHECK(waitpid(c, NULL, 0) == c);
  CHECK_EQ_INT(agent_procstat_sample(&f, &s, buf, sizeof buf), -ESRCH);
  agent_procstat_close(&f);
  agent_procstat_close(&f);
  CHECK_EQ_INT(agent_procstat_open(&f, NULL, c), -ESRCH);
  CHECK_EQ_INT(f.fd[0], -1);
  CHECK_EQ_INT(agent_procstat_read(NULL, c, &s, buf, sizeof buf), -ESRCH);
  agent_thread_info_t t[2];
  int total;
  CHECK_EQ_INT(agent_procstat_threads(NULL, c, t, 2, &total), -ESRCH);
  CHECK_EQ_INT(agent_procstat_read(NULL, getpid(), &s, buf, 100), -EINVAL);
}

static void put_file(const char *dir, const char *name, const char *text) {
  char p[600];
  snprintf(p, sizeof p, "%s/%s", dir, name);
  FILE *f = fopen(p, "w");
  CHECK(f != NULL);
  fputs(text, f);
  fclose(f);
}

static void case_fake_proc(void) {
  TEST_CASE("fake /proc");
  const char *tmp = getenv("TEST_TMPDIR");
  char root[400], dir[500], buf[8192];
  snprintf(root, sizeof root, "%s/fakeproc.%d", tmp ? tmp : "/tmp", (int)getpid());
  snprintf(dir, sizeof dir, "%s/42", root);
  CHECK(mkdir(root, 0700) == 0 && mkdir(dir, 0700) == 0);
  char stat[1024], status[8192];
  slurp("/proc/self/stat", stat, sizeof stat);
  slurp("/proc/self/status", status, sizeof status);
  put_file(dir, "stat", stat);
  put_file(dir, "status", status);
  agent_proc_sample_t s;
  CHECK_EQ_INT(agent_procstat_read(root, 42, &s, buf, sizeof buf), 0);
  CHECK_EQ_INT(s.have_io, 0);
  put_file(dir, "io", "rchar: 12\nwchar: 34\nsyscr: 1\n");
  CHECK_EQ_INT(agent_procstat_read(root, 42, &s, buf, sizeof buf), 0);
  CHECK(s.have_io && s.rchar == 12 && s.wchar == 34);
  put_file(dir, "io", "rchar: 12\nwchar: x\n");
  CHECK_EQ_INT(agent_procstat_read(root, 42, &s, buf, sizeof buf), -EPROTO);
  put_file(dir, "io", "rchar: 12\nwchar: 34\n");
  put_file(dir, "stat", "42 (w) R 1 2 3\n");
  CHECK_EQ_INT(agent_procstat_read(root, 42, &s, buf, sizeof buf), -EPROTO);
  put_file(dir, "stat", "");
  CHECK_EQ_INT(agent_procstat_read(root, 42, &s, buf, sizeof buf), -ESRCH);
  CHECK_EQ_INT(agent_procstat_read(root, 43, &s, buf, sizeof buf), -ESRCH);
  const char *names[] = {"stat", "status", "io"};
  for (int i = 0; i < 3; i++) {
    char p[600];
    snprintf(p, sizeof p, "%s/%s", dir, names[i]);
    unlink(p);
  }
  rmdir(dir);
  rmdir(root);
}

/* Parses an exact-length heap copy (no NUL after it). */
static int parse_copy(int which, const char *text, size_t len, agent_proc_sample_t *s) {
  char *c = malloc(len ? len : 1);
  CHECK(c != NULL);
  memcpy(c, text, len);
  int r = which == 0   ? agent_procstat_parse_stat(c, len, s)
          : which == 1 ? agent_procstat_parse_status(c, len, s)
                       : agent_procstat_parse_io(c, len, s);
  free(c);
  return r;
}

static void case_parsers(void) {
  TEST_CASE("parsers");
  agent_proc_sample_t s;
  const char *odd = "7 (a) b) (c ) S 1 2 3 4 -1 6 7 8 9 10 250 17 -3 -4 20 3 0 99 4096 12\n";
  CHECK_EQ_INT(parse_copy(0, odd, strlen(odd), &s), 0);
  CHECK(s.state == 'S' && s.utime_ticks == 250 && s.stime_ticks == 17);
  const char *neg = "7 (a) S 1 2 3 4 -1 6 7 8 9 10 -250 17 -3 -4 20 3\n";
  CHECK_EQ_INT(parse_copy(0, neg, strlen(neg), &s), -1);
  const char *big = "7 (a) S 1 2 3 4 -1 6 7 8 9 10 99999999999999999999999 17 -3 -4 20 3\n";
  CHECK_EQ_INT(parse_copy(0, big, strlen(big), &s), -1);
  const char *st =
      "Name:\tx\nThreads:\t5\nVmRSS:\t   100 kB\nvoluntary_ctxt_switches:\t7\n"
      "nonvoluntary_ctxt_switches:\t8\n";
  CHECK_EQ_INT(parse_copy(1, st, strlen(st), &s), 0);
  CHECK(s.threads == 5 && s.rss_bytes == 102400 && s.vcsw == 7 && s.ivcsw == 8);
  const char *bad_rss =
      "Name:\tx\nThreads:\t5\nVmRSS:\t100 MB\nvoluntary_ctxt_switches:\t7\n"
      "nonvoluntary_ctxt_switches:\t8\n";
  CHECK_EQ_INT(parse_copy(1, bad_rss, strlen(bad_rss), &s), -1);

  /* every prefix of the real texts: before the last needed field, a failure */
  char real[3][8192];
  size_t rl[3];
  rl[0] = slurp("/proc/self/stat", real[0], sizeof real[0]);
  rl[1] = slurp("/proc/self/status", real[1], sizeof real[1]);
  rl[2] = slurp("/proc/self/io", real[2], sizeof real[2]);
  for (int w = 0; w < 3; w++) {
    CHECK_EQ_INT(parse_copy(w, real[w], rl[w], &s), 0);
    int ok_prefixes = 0;
    for (size_t len = 0; len < rl[w]; len++) ok_prefixes += parse_copy(w, real[w], len, &s) == 0;
    /* stat: only prefixes past field 20; status/io: only those past the last needed line */
    CHECK_CMP_UINT(ok_prefixes, <, rl[w]);
  }

  /* random mutations: never a crash or an over-read; a success has sane fields */
  test_rng_init("procstat_test", 0);
  char m[9000];
  for (int it = 0; it < 20000; it++) {
    int w = (int)rnd_below(3);
    size_t len = rl[w];
    memcpy(m, real[w], len);
    int edits = 1 + (int)rnd_below(4);
    for (int e = 0; e < edits; e++) {
      size_t at = len ? rnd_below(len) : 0;
      switch (rnd_below(4)) {
        case 0:
          if (len) m[at] = (char)rnd();
          break;
        case 1:
          if (len < sizeof m - 1) {
            memmove(m + at + 1, m + at, len - at);
            m[at] = "0123456789 ():\n-kB\t"[rnd_below(19)];
            len++;
          }
          break;
        case 2:
          if (len) {
            memmove(m + at, m + at + 1, len - at - 1);
            len--;
          }
          break;
        default: len = at;
      }
    }
    memset(&s, 0, sizeof s);
    if (parse_copy(w, m, len, &s) == 0 && w == 0) CHECK(s.state >= 'A' && s.state <= 'z');
  }
}

int main(void) {
  case_self();
  case_gone();
  case_fake_proc();
  case_parsers();
  printf("procstat_test: all passed\n");
  return 0;
}
