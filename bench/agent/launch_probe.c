/* launch_probe: runs one launcher (tdist-agent or torchrun) for the agent benchmark and records
 * when it started, when it exited, its exit status, memory and CPU.
 *
 *   launch_probe --out FILE [--sample-rss] [--timeout SECONDS] -- LAUNCHER [ARGS...]
 *
 * The child reads CLOCK_REALTIME right before execvp() of the launcher (t0, in a shared page), so
 * run.sh can compare it with the workers' own stamps. FILE gets one line:
 *
 *   t0_ns end_ns status vmhwm_kb ru_maxrss_kb cpu_us own_cpu_us orphans
 *
 * status: the launcher's exit code, 128+N if killed by signal N. vmhwm_kb: the largest VmHWM
 * read from /proc/<launcher>/status every 5 ms (--sample-rss; else 0): the launcher alone, plus,
 * when the launcher has a child running its own executable (tdist-agent: the agent under its
 * guard process, operator-agent/supervisor/guard.h), that child's largest VmHWM (pages the two
 * share counted in both). ru_maxrss_kb and cpu_us: wait4()'s rusage, i.e. the launcher and the
 * workers it reaped (max RSS of any one of them; user+sys CPU of all). own_cpu_us: user+sys of
 * the launcher alone (all its threads, not its children), read from /proc/<launcher>/stat while
 * it is a zombie, in clock ticks (10 ms), plus that same-executable child's, as last sampled
 * before it exited (--sample-rss). orphans: processes left behind by the launcher.
 *
 * It must never leave anything running: it is a child subreaper, so workers a launcher abandons
 * are re-parented here and are SIGKILLed and reaped (and counted) once the launcher is gone.
 * SIGINT/SIGTERM/SIGHUP and --timeout send SIGTERM to the launcher, SIGKILL 5 s later.
 * Exit code: 0 when FILE was written (whatever the launcher's status), 2 usage, 1 system error. */
#define _GNU_SOURCE
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define KILL_GRACE_S 5

static volatile pid_t launcher_pid;
static volatile sig_atomic_t term_sent;

static int64_t realtime_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* Async-signal-safe escalation: the first signal (ours or SIGALRM) sends SIGTERM and arms the
 * grace alarm, the next SIGALRM sends SIGKILL. */
static void on_signal(int sig) {
  pid_t pid = launcher_pid;
  if (pid <= 0) return;
  if (!term_sent) {
    term_sent = 1;
    kill(pid, SIGTERM);
    alarm(KILL_GRACE_S);
  } else if (sig == SIGALRM) {
    kill(pid, SIGKILL);
  }
}

/* VmHWM of pid in kB, 0 if it is gone (a zombie has no memory lines) or unreadable. */
static long read_vmhwm_kb(pid_t pid) {
  char path[64], buf[8192];
  snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0) return 0;
  buf[n] = '\0';
  const char *p = strstr(buf, "\nVmHWM:");
  return p ? strtol(p + 7, NULL, 10) : 0;
}

/* utime + stime of pid itself (fields 14 and 15 of /proc/<pid>/stat) in µs, -1 if unreadable. */
static long read_own_cpu_us(pid_t pid) {
  char path[64], buf[1024];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0) return -1;
  buf[n] = '\0';
  /* After "(comm)": state ppid pgrp session tty_nr tpgid flags minflt cminflt majflt cmajflt
   * utime stime; comm may hold spaces, so start after the last ')'. */
  const char *p = strrchr(buf, ')');
  unsigned long long ut, stm;
  if (!p || sscanf(p + 1, " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &stm) != 2)
    return -1;
  long hz = sysconf(_SC_CLK_TCK);
  return hz > 0 ? (long)((ut + stm) * 1000000ULL / (unsigned long long)hz) : -1;
}

/* The child of pid that runs pid's own executable, or 0 (from /proc/PID/task/PID/children: the
 * children of its main thread, which is where tdist-agent forks the agent). */
static pid_t same_exe_child(pid_t pid) {
  char path[64], exe[4096], cexe[4096], buf[4096];
  snprintf(path, sizeof path, "/proc/%d/exe", (int)pid);
  ssize_t l = readlink(path, exe, sizeof exe - 1);
  if (l <= 0) return 0;
  exe[l] = '\0';
  snprintf(path, sizeof path, "/proc/%d/task/%d/children", (int)pid, (int)pid);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0) return 0;
  buf[n] = '\0';
  for (char *p = buf, *end; *p; p = end) {
    long c = strtol(p, &end, 10);
    if (end == p) break;
    snprintf(path, sizeof path, "/proc/%ld/exe", c);
    ssize_t cl = readlink(path, cexe, sizeof cexe - 1);
    if (cl > 0 && (cexe[cl] = '\0', !strcmp(cexe, exe))) return (pid_t)c;
  }
  return 0;
}

/* SIGKILLs every live process whose parent is us (re-parented orphans); returns how many. */
static int kill_children(void) {
  DIR *d = opendir("/proc");
  if (!d) return 0;
  int n = 0;
  pid_t self = getpid();
  struct dirent *e;
  while ((e = readdir(d))) {
    if (!isdigit((unsigned char)e->d_name[0])) continue;
    char path[300], buf[512];
    snprintf(path, sizeof path, "/proc/%s/stat", e->d_name);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    ssize_t len = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (len <= 0) continue;
    buf[len] = '\0';
    /* "pid (comm) S ppid ...": comm may hold spaces and ')', so parse after the last ')'. */
    const char *rp = strrchr(buf, ')');
    char state;
    int ppid;
    if (!rp || sscanf(rp + 1, " %c %d", &state, &ppid) != 2) continue;
    if (ppid == self && state != 'Z') {
      kill((pid_t)atoi(e->d_name), SIGKILL);
      n++;
    }
  }
  closedir(d);
  return n;
}

/* Reaps whatever the launcher left behind; returns the number of such processes. */
static int sweep_orphans(void) {
  int orphans = 0;
  for (int round = 0; round < 1000; round++) {
    pid_t r = waitpid(-1, NULL, WNOHANG);
    if (r > 0) {
      orphans++;
      continue;
    }
    if (r < 0 && errno == ECHILD) break;
    if (r < 0 && errno == EINTR) continue;
    if (kill_children() == 0) {
      struct timespec d = {0, 10 * 1000000L};
      nanosleep(&d, NULL);
    }
  }
  return orphans;
}

static int usage(void) {
  fprintf(stderr,
          "usage: launch_probe --out FILE [--sample-rss] [--timeout SECONDS] -- "
          "LAUNCHER [ARGS...]\n");
  return 2;
}

int main(int argc, char **argv) {
  const char *out = NULL;
  int sample_rss = 0;
  unsigned timeout_s = 0;
  int i = 1;
  for (; i < argc; i++) {
    if (!strcmp(argv[i], "--")) {
      i++;
      break;
    } else if (!strcmp(argv[i], "--out") && i + 1 < argc) {
      out = argv[++i];
    } else if (!strcmp(argv[i], "--sample-rss")) {
      sample_rss = 1;
    } else if (!strcmp(argv[i], "--timeout") && i + 1 < argc) {
      char *end;
      long v = strtol(argv[++i], &end, 10);
      if (*end || v < 1 || v > 86400) {
        fprintf(stderr, "launch_probe: --timeout %s: want whole seconds, 1..86400\n", argv[i]);
        return 2;
      }
      timeout_s = (unsigned)v;
    } else {
      fprintf(stderr, "launch_probe: unknown argument '%s'\n", argv[i]);
      return usage();
    }
  }
  if (!out || i >= argc) return usage();

  FILE *of = fopen(out, "w");
  if (!of) {
    fprintf(stderr, "launch_probe: --out %s: %s\n", out, strerror(errno));
    return 1;
  }
  int64_t *t0 = mmap(NULL, sizeof *t0, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (t0 == MAP_FAILED) {
    perror("launch_probe: mmap");
    return 1;
  }
  if (prctl(PR_SET_CHILD_SUBREAPER, 1) != 0) {
    perror("launch_probe: prctl(PR_SET_CHILD_SUBREAPER)");
    return 1;
  }

  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal; /* no SA_RESTART: wait4 returns EINTR and the loop goes on */
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGHUP, &sa, NULL);
  sigaction(SIGALRM, &sa, NULL);

  /* Block the signals across fork so none is handled before launcher_pid is known. */
  sigset_t block, old;
  sigemptyset(&block);
  sigaddset(&block, SIGINT);
  sigaddset(&block, SIGTERM);
  sigaddset(&block, SIGHUP);
  sigaddset(&block, SIGALRM);
  sigprocmask(SIG_BLOCK, &block, &old);
  pid_t pid = fork();
  if (pid < 0) {
    perror("launch_probe: fork");
    return 1;
  }
  if (pid == 0) {
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    signal(SIGHUP, SIG_DFL);
    signal(SIGALRM, SIG_DFL);
    sigprocmask(SIG_SETMASK, &old, NULL);
    *t0 = realtime_ns();
    execvp(argv[i], argv + i);
    fprintf(stderr, "launch_probe: exec %s: %s\n", argv[i], strerror(errno));
    _exit(127);
  }
  launcher_pid = pid;
  if (timeout_s) alarm(timeout_s);
  sigprocmask(SIG_SETMASK, &old, NULL);

  /* Wait for the exit without reaping (WNOWAIT), so the zombie's /proc/<pid>/stat still holds
   * its own CPU times; then reap it with wait4 for the rusage. */
  long hwm = 0, child_hwm = 0, child_cpu_us = 0;
  pid_t child = 0;
  for (;;) {
    siginfo_t si;
    memset(&si, 0, sizeof si);
    int r = waitid(P_PID, (id_t)pid, &si, WEXITED | WNOWAIT | (sample_rss ? WNOHANG : 0));
    if (r == 0 && si.si_pid == pid) break;
    if (r < 0 && errno != EINTR) {
      perror("launch_probe: waitid");
      return 1;
    }
    if (r == 0) {
      long v = read_vmhwm_kb(pid);
      if (v > hwm) hwm = v;
      if (!child) child = same_exe_child(pid);
      if (child) {
        v = read_vmhwm_kb(child);
        if (v > child_hwm) child_hwm = v;
        long c = read_own_cpu_us(child);
        if (c > child_cpu_us) child_cpu_us = c;
      }
      struct timespec d = {0, 5 * 1000000L};
      nanosleep(&d, NULL);
    }
  }
  int64_t end = realtime_ns();
  long own_cpu_us = read_own_cpu_us(pid);
  if (own_cpu_us >= 0) own_cpu_us += child_cpu_us;
  hwm += child_hwm;
  int st = 0;
  struct rusage ru;
  memset(&ru, 0, sizeof ru);
  while (wait4(pid, &st, 0, &ru) < 0) {
    if (errno != EINTR) {
      perror("launch_probe: wait4");
      return 1;
    }
  }
  launcher_pid = 0;
  alarm(0);
  int status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  int orphans = sweep_orphans();
  long cpu_us = (long)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1000000L +
                (long)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
  fprintf(of, "%lld %lld %d %ld %ld %ld %ld %d\n", (long long)*t0, (long long)end, status, hwm,
          ru.ru_maxrss, cpu_us, own_cpu_us, orphans);
  if (fclose(of) != 0) {
    fprintf(stderr, "launch_probe: writing %s: %s\n", out, strerror(errno));
    return 1;
  }
  return 0;
}
