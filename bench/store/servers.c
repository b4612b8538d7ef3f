/* Starts and stops the servers store_bench compares, and reads their CPU clocks.
 *
 * Every wait here is bounded: a child that never reports its port is killed after a deadline.
 * This file never touches the store protocol; clients are the benchmark's business. */
#define _GNU_SOURCE
#include "servers.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* Importing torch on a loaded 2-core machine can take several seconds. */
#define START_DEADLINE_NS (120LL * 1000000000LL)

/* The TCPStore master sleeps until its stdin closes, so it also goes away when we die without
 * running any cleanup. */
static const char torch_script[] =
    "import sys, datetime\n"
    "from torch.distributed import TCPStore\n"
    "s = TCPStore('127.0.0.1', 0, is_master=True, timeout=datetime.timedelta(seconds=60))\n"
    "print(s.port, flush=True)\n"
    "sys.stdin.read()\n";

int64_t bench_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

static void init_server(bench_server_t *s, bench_server_kind_t kind) {
  memset(s, 0, sizeof(*s));
  s->kind = kind;
  s->stdin_fd = -1;
}

/* Thread ids of this process, for spotting the threads the in-process server starts. */
static int list_tids(pid_t *out, int cap) {
  DIR *d = opendir("/proc/self/task");
  if (!d) return 0;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    if (n < cap) out[n] = (pid_t)atoi(e->d_name);
    n++;
  }
  closedir(d);
  return n < cap ? n : cap;
}

int bench_server_start_inproc(bench_server_t *s) {
  init_server(s, BENCH_SERVER_TDIST);
  pid_t before[4096];
  int nbefore = list_tids(before, 4096);
  tdist_store_server_options_t opts = TDIST_STORE_SERVER_OPTIONS_INIT;
  opts.host = "127.0.0.1";
  opts.quiet = 1;
  tdist_status_t st = tdist_store_server_create(&opts, &s->inproc);
  if (st != TDIST_OK) {
    fprintf(stderr, "store_bench: tdist_store_server_create: %s: %s\n", tdist_strerror(st),
            tdist_last_error());
    return -1;
  }
  s->port = tdist_store_server_port(s->inproc);
  pid_t after[4096];
  int nafter = list_tids(after, 4096);
  for (int i = 0; i < nafter && s->ntids < BENCH_SERVER_MAX_TIDS; i++) {
    int old = 0;
    for (int j = 0; j < nbefore && !old; j++) old = before[j] == after[i];
    if (!old) s->tids[s->ntids++] = after[i];
  }
  return 0;
}

/* fork + exec with stdin/stdout optionally piped; the child dies with us (PDEATHSIG). */
static pid_t spawn(char *const argv[], int *stdin_w, int *stdout_r) {
  int in[2] = {-1, -1}, out[2] = {-1, -1};
  if (stdin_w && pipe2(in, O_CLOEXEC) != 0) return -1;
  if (stdout_r && pipe2(out, O_CLOEXEC) != 0) return -1;
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(127);
    if (stdin_w) dup2(in[0], 0);
    if (stdout_r) dup2(out[1], 1);
    signal(SIGPIPE, SIG_DFL);
    execv(argv[0], argv);
    fprintf(stderr, "store_bench: exec %s: %s\n", argv[0], strerror(errno));
    _exit(127);
  }
  if (stdin_w) {
    close(in[0]);
    *stdin_w = in[1];
  }
  if (stdout_r) {
    close(out[1]);
    *stdout_r = out[0];
  }
  return pid;
}

static int child_exited(pid_t pid) {
  int status;
  return waitpid(pid, &status, WNOHANG) == pid;
}

int bench_server_start_torch(bench_server_t *s, const char *python) {
  init_server(s, BENCH_SERVER_TORCH);
  char *argv[] = {(char *)python, "-c", (char *)torch_script, NULL};
  int out_fd = -1;
  s->pid = spawn(argv, &s->stdin_fd, &out_fd);
  if (s->pid < 0) {
    fprintf(stderr, "store_bench: spawn %s: %s\n", python, strerror(errno));
    s->pid = 0;
    return -1;
  }
  char line[64];
  size_t len = 0;
  int64_t deadline = bench_now_ns() + START_DEADLINE_NS;
  while (len < sizeof(line) - 1 && memchr(line, '\n', len) == NULL) {
    int64_t left_ms = (deadline - bench_now_ns()) / 1000000;
    if (left_ms <= 0) break;
    struct pollfd p = {out_fd, POLLIN, 0};
    int r = poll(&p, 1, (int)(left_ms > 1000 ? 1000 : left_ms));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) continue;
    ssize_t n = read(out_fd, line + len, sizeof(line) - 1 - len);
    if (n <= 0) break; /* EOF: the child died (its stderr says why) */
    len += (size_t)n;
  }
  close(out_fd);
  line[len] = '\0';
  s->port = atoi(line);
  if (memchr(line, '\n', len) == NULL || s->port <= 0 || s->port > 65535) {
    fprintf(stderr, "store_bench: %s did not report a TCPStore port (got \"%s\")\n", python, line);
    bench_server_stop(s);
    return -1;
  }
  return 0;
}

int bench_server_start_binary(bench_server_t *s, const char *path) {
  init_server(s, BENCH_SERVER_TDIST);
  const char *base = getenv("TEST_TMPDIR");
  if (!base || !*base) base = getenv("TMPDIR");
  if (!base || !*base) base = "/tmp";
  snprintf(s->tmpdir, sizeof(s->tmpdir), "%s/store_bench.XXXXXX", base);
  if (!mkdtemp(s->tmpdir)) {
    fprintf(stderr, "store_bench: mkdtemp %s: %s\n", s->tmpdir, strerror(errno));
    s->tmpdir[0] = '\0';
    return -1;
  }
  char port_file[300];
  snprintf(port_file, sizeof(port_file), "%s/port", s->tmpdir);
  char *argv[] = {(char *)path, "serve",       "--host",  "127.0.0.1", "--port",
                  "0",          "--port-file", port_file, "--quiet",   NULL};
  s->pid = spawn(argv, NULL, NULL);
  if (s->pid < 0) {
    fprintf(stderr, "store_bench: spawn %s: %s\n", path, strerror(errno));
    s->pid = 0;
    return -1;
  }
  int64_t deadline = bench_now_ns() + START_DEADLINE_NS;
  while (bench_now_ns() < deadline) {
    FILE *f = fopen(port_file, "r");
    if (f) {
      int port = 0;
      int ok = fscanf(f, "%d", &port) == 1;
      fclose(f);
      if (ok && port > 0 && port <= 65535) {
        s->port = port;
        return 0;
      }
    }
    if (child_exited(s->pid)) {
      fprintf(stderr, "store_bench: %s exited before writing %s\n", path, port_file);
      s->pid = 0;
      bench_server_stop(s);
      return -1;
    }
    sleep_ms(10);
  }
  fprintf(stderr, "store_bench: %s wrote no port to %s\n", path, port_file);
  bench_server_stop(s);
  return -1;
}

void bench_server_stop(bench_server_t *s) {
  if (s->inproc) {
    tdist_store_server_destroy(s->inproc);
    s->inproc = NULL;
  }
  if (s->stdin_fd >= 0) {
    close(s->stdin_fd);
    s->stdin_fd = -1;
  }
  if (s->pid > 0) {
    kill(s->pid, SIGTERM);
    int64_t deadline = bench_now_ns() + 5000000000LL;
    int gone = 0;
    while (!gone && bench_now_ns() < deadline) {
      gone = child_exited(s->pid);
      if (!gone) sleep_ms(10);
    }
    if (!gone) {
      kill(s->pid, SIGKILL);
      waitpid(s->pid, NULL, 0);
    }
    s->pid = 0;
  }
  if (s->tmpdir[0]) {
    char port_file[300];
    snprintf(port_file, sizeof(port_file), "%s/port", s->tmpdir);
    unlink(port_file);
    rmdir(s->tmpdir);
    s->tmpdir[0] = '\0';
  }
  s->ntids = 0;
}

/* Linux encodes another thread's CPU clock as (~tid << 3) | CPUCLOCK_PERTHREAD | CPUCLOCK_SCHED;
 * glibc's pthread_getcpuclockid builds the same value, but we only know the tid. */
static clockid_t thread_cpu_clock(pid_t tid) { return (clockid_t)(((~(uint32_t)tid) << 3) | 6u); }

static int64_t read_clock_ns(clockid_t c) {
  struct timespec ts;
  if (clock_gettime(c, &ts) != 0) return -1;
  return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

int64_t bench_server_cpu_ns(const bench_server_t *s) {
  if (s->pid > 0) {
    clockid_t c;
    if (clock_getcpuclockid(s->pid, &c) != 0) return -1;
    return read_clock_ns(c);
  }
  if (s->inproc && s->ntids > 0) {
    int64_t sum = 0;
    for (int i = 0; i < s->ntids; i++) {
      int64_t t = read_clock_ns(thread_cpu_clock(s->tids[i]));
      if (t < 0) return -1;
      sum += t;
    }
    return sum;
  }
  return -1;
}

int64_t bench_machine_busy_ns(void) {
  FILE *f = fopen("/proc/stat", "r");
  if (!f) return -1;
  unsigned long long v[8] = {0};
  /* cpu  user nice system idle iowait irq softirq steal */
  int n = fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3],
                 &v[4], &v[5], &v[6], &v[7]);
  fclose(f);
  if (n < 7) return -1;
  unsigned long long busy = v[0] + v[1] + v[2] + v[5] + v[6];
  long hz = sysconf(_SC_CLK_TCK);
  return (int64_t)(busy * (1000000000ULL / (unsigned long long)(hz > 0 ? hz : 100)));
}

int64_t bench_self_cpu_ns(void) { return read_clock_ns(CLOCK_PROCESS_CPUTIME_ID); }
