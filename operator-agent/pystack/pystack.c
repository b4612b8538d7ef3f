/* See pystack.h. The analyzer runs as a child with a deadline: waitpid on its own pid (the agent's
 * reaper only runs on the loop thread, which is here), SIGKILL past the deadline. */
#define _GNU_SOURCE
#include "operator-agent/pystack/pystack.h"

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
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "operator-agent/pystack/pystack_files.h"

int agent_pystack_signal(void) { return SIGRTMIN + 5; }

void agent_pystack_pydir(const char *run_dir, char *out, size_t cap) {
  snprintf(out, cap, "%s/python", run_dir);
}

static int write_file(const char *dir, const char *name, const unsigned char *data, size_t n,
                      char *err, size_t cap) {
  char path[4200];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd < 0) {
    snprintf(err, cap, "cannot create %s: %s", path, strerror(errno));
    return -1;
  }
  size_t off = 0;
  while (off < n) {
    ssize_t w = write(fd, data + off, n - off);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      snprintf(err, cap, "cannot write %s: %s", path, strerror(errno));
      close(fd);
      return -1;
    }
    off += (size_t)w;
  }
  if (close(fd)) {
    snprintf(err, cap, "cannot write %s: %s", path, strerror(errno));
    return -1;
  }
  return 0;
}

int agent_pystack_install(const char *run_dir, char *err, size_t cap) {
  char dir[4096];
  agent_pystack_pydir(run_dir, dir, sizeof dir);
  if (mkdir(dir, 0755) && errno != EEXIST) {
    snprintf(err, cap, "cannot create %s: %s", dir, strerror(errno));
    return -1;
  }
  if (write_file(dir, "sitecustomize.py", py_sitecustomize, sizeof py_sitecustomize, err, cap) ||
      write_file(dir, "tdist_frtrace.py", py_tdist_frtrace, sizeof py_tdist_frtrace, err, cap))
    return -1;
  return 0;
}

/* The value of the first "name\t..." line of /proc/PID/status into out; 0, or -1. */
static int status_field(pid_t pid, const char *name, char *out, size_t cap) {
  char path[64], line[256];
  snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
  FILE *f = fopen(path, "re");
  if (!f) return -1;
  size_t l = strlen(name);
  int rc = -1;
  while (fgets(line, sizeof line, f)) {
    if (strncmp(line, name, l) || line[l] != ':') continue;
    char *v = line + l + 1;
    v += strspn(v, " \t");
    v[strcspn(v, "\n")] = 0;
    snprintf(out, cap, "%s", v);
    rc = 0;
    break;
  }
  fclose(f);
  return rc;
}

/* 1 when pid's State (into state) is T or t: stopped, by a signal or a tracer. */
static int stopped_state(pid_t pid, char *state, size_t cap) {
  return pid > 0 && !status_field(pid, "State", state, cap) && (state[0] == 'T' || state[0] == 't');
}

int agent_pystack_catches(pid_t pid, int sig) {
  char v[64];
  if (sig < 1 || sig > 64 || status_field(pid, "SigCgt", v, sizeof v)) return 0;
  unsigned long long mask = strtoull(v, NULL, 16);
  return (int)((mask >> (sig - 1)) & 1ULL);
}

int agent_pystack_request(pid_t pid, const char *file, off_t *offset, char *why, size_t cap) {
  int sig = agent_pystack_signal();
  struct stat sb;
  why[0] = 0;
  if (pid <= 0) {
    snprintf(why, cap, "not running");
    return 0;
  }
  if (stat(file, &sb)) {
    snprintf(why, cap,
             "no Python stacks: %s is missing (not a Python worker, or Python started without "
             "tdist's sitecustomize: python -I/-E, or TDIST_PY_STACKS=0)",
             file);
    return 0;
  }
  if (!agent_pystack_catches(pid, sig)) {
    snprintf(why, cap,
             "no Python stacks: pid %d does not catch signal %d (the Python process is a child "
             "of the worker, or the program replaced the handler)",
             (int)pid, sig);
    return 0;
  }
  *offset = sb.st_size;
  if (kill(pid, sig)) {
    snprintf(why, cap, "cannot signal pid %d: %s", (int)pid, strerror(errno));
    return 0;
  }
  char state[64];
  if (stopped_state(pid, state, sizeof state))
    snprintf(why, cap, "the process is stopped (%s): its stacks come when it continues", state);
  return 1;
}

int agent_pystack_stopped(pid_t pid) {
  char state[64];
  return stopped_state(pid, state, sizeof state);
}

ssize_t agent_pystack_read(const char *file, off_t offset, char *out, size_t cap) {
  if (cap) out[0] = 0;
  int fd = open(file, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return -1;
  struct stat sb;
  if (fstat(fd, &sb)) {
    close(fd);
    return -1;
  }
  if (sb.st_size <= offset || cap < 64) {
    close(fd);
    return 0;
  }
  size_t total = (size_t)(sb.st_size - offset);
  size_t want = total < cap - 40 ? total : cap - 40;
  ssize_t got = pread(fd, out, want, offset);
  close(fd);
  if (got < 0) return -1;
  out[got] = 0;
  /* the registration line of a process that (re)started its interpreter since is not a stack */
  char *reg = strstr(out, "tdist: pid ");
  while (reg && (reg == out || reg[-1] == '\n')) {
    char *eol = strchr(reg, '\n');
    size_t rest = eol ? strlen(eol + 1) : 0;
    memmove(reg, eol ? eol + 1 : reg + strlen(reg), rest + 1);
    reg = strstr(reg, "tdist: pid ");
  }
  if (total > (size_t)got)
    snprintf(out + strlen(out), cap - strlen(out), "\n[... %zu more bytes]", total - (size_t)got);
  return (ssize_t)total;
}

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Whether any PREFIX<digits> file exists. */
static int dumps_exist(const char *prefix) {
  char dir[4096];
  snprintf(dir, sizeof dir, "%s", prefix);
  char *slash = strrchr(dir, '/');
  const char *base = prefix;
  if (slash) {
    *slash = 0;
    base = prefix + (slash - dir) + 1;
  } else {
    snprintf(dir, sizeof dir, ".");
  }
  size_t bl = strlen(base);
  int found = 0;
  DIR *d = opendir(dir);
  if (!d) return 0;
  struct dirent *e;
  while (!found && (e = readdir(d))) {
    if (strncmp(e->d_name, base, bl) || !e->d_name[bl]) continue;
    found = strspn(e->d_name + bl, "0123456789") == strlen(e->d_name + bl);
  }
  closedir(d);
  return found;
}

#ifndef CLOSE_RANGE_CLOEXEC
#define CLOSE_RANGE_CLOEXEC (1U << 2)
#endif

int agent_frtrace_analyze(const char *python, const char *pydir, const char *prefix, int world_size,
                          int timeout_ms, char *behind, size_t behind_cap, char *summary,
                          size_t summary_cap) {
  behind[0] = summary[0] = 0;
  if (!dumps_exist(prefix)) return 0;
  char script[4200], world[16];
  snprintf(script, sizeof script, "%s/tdist_frtrace.py", pydir);
  snprintf(world, sizeof world, "%d", world_size);
  char *argv[] = {(char *)python, script, "--brief", (char *)prefix, world, NULL};
  int pfd[2];
  if (pipe2(pfd, O_CLOEXEC)) {
    snprintf(summary, summary_cap, "flight-recorder analyzer: pipe2: %s", strerror(errno));
    return -1;
  }
  pid_t pid = fork();
  if (pid < 0) {
    snprintf(summary, summary_cap, "flight-recorder analyzer: fork: %s", strerror(errno));
    close(pfd[0]);
    close(pfd[1]);
    return -1;
  }
  if (pid == 0) { /* async-signal-safe calls only: the agent has threads */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    dup2(pfd[1], 1);
    dup2(pfd[1], 2);
    syscall(SYS_close_range, 3U, ~0U, CLOSE_RANGE_CLOEXEC);
    execvp(python, argv);
    static const char msg[] = "cannot execute the workers' python (TDIST_PYTHON)\n";
    ssize_t w = write(2, msg, sizeof msg - 1);
    (void)w;
    _exit(127);
  }
  close(pfd[1]);
  char out[4096];
  size_t n = 0;
  int64_t deadline = now_ms() + timeout_ms;
  int timed_out = 0;
  for (;;) {
    int left = (int)(deadline - now_ms());
    if (left <= 0) {
      timed_out = 1;
      break;
    }
    struct pollfd p = {.fd = pfd[0], .events = POLLIN};
    int r = poll(&p, 1, left);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) continue;
    ssize_t got = read(pfd[0], out + n, sizeof out - 1 - n);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;
    n += (size_t)got;
    if (n == sizeof out - 1) break;
  }
  close(pfd[0]);
  out[n] = 0;
  if (timed_out) kill(pid, SIGKILL);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  char *tab = NULL, *line = out;
  for (char *l = out; l && *l;) { /* the last line holding a tab is the verdict */
    char *eol = strchr(l, '\n');
    if (eol) *eol = 0;
    if (strchr(l, '\t')) line = l, tab = strchr(l, '\t');
    l = eol ? eol + 1 : NULL;
  }
  if (timed_out || !WIFEXITED(status) || WEXITSTATUS(status) != 0 || !tab) {
    snprintf(summary, summary_cap, "flight-recorder analyzer %s: %.300s",
             timed_out ? "timed out" : "failed", n ? out + (n > 300 ? n - 300 : 0) : "no output");
    return -1;
  }
  *tab = 0;
  snprintf(behind, behind_cap, "%s", strcmp(line, "-") ? line : "");
  snprintf(summary, summary_cap, "%s", tab + 1);
  return 1;
}
