/* See children.h. */
#define _GNU_SOURCE
#include "operator-agent/supervisor/children.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static int64_t mono_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* The parent pid in /proc/<name>/stat ("pid (comm) state ppid ..."; comm may hold spaces and
 * parentheses, hence the last ')'), or -1. */
static pid_t stat_ppid(const char *name) {
  char path[64], buf[512];
  snprintf(path, sizeof path, "/proc/%s/stat", name);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0) return -1;
  buf[n] = 0;
  char *p = strrchr(buf, ')');
  char state;
  long ppid;
  if (!p || sscanf(p + 1, " %c %ld", &state, &ppid) != 2) return -1;
  return (pid_t)ppid;
}

int agent_proc_is_ours(void) {
  char self[32];
  ssize_t l = readlink("/proc/self", self, sizeof self - 1);
  if (l <= 0) return 0;
  self[l] = 0;
  return atol(self) == (long)getpid();
}

int agent_children_list(pid_t *out, int cap) {
  /* /proc names pids as seen from the namespace it was mounted for: unless /proc/self is us,
   * a "child" found there would be some other process. */
  if (!agent_proc_is_ours()) return -1;
  pid_t me = getpid();
  DIR *d = opendir("/proc");
  if (!d) return -1;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (e->d_name[0] < '1' || e->d_name[0] > '9') continue;
    if (stat_ppid(e->d_name) != me) continue;
    if (n < cap) out[n] = (pid_t)atol(e->d_name);
    n++;
  }
  closedir(d);
  return n;
}

int agent_children_kill_all(int64_t deadline_ns, void (*on_reap)(void *arg, pid_t pid, int status),
                            void *arg, int *left) {
  int reaped = 0;
  pid_t pids[256];
  for (;;) {
    int n = agent_children_list(pids, (int)(sizeof pids / sizeof pids[0]));
    for (int i = 0; i < n && i < (int)(sizeof pids / sizeof pids[0]); i++) kill(pids[i], SIGKILL);
    int status;
    pid_t r;
    /* __WALL: a child made by clone() with another exit signal is a child all the same. */
    while ((r = waitpid(-1, &status, WNOHANG | __WALL)) > 0) {
      reaped++;
      if (on_reap) on_reap(arg, r, status);
    }
    if (r < 0 && errno == ECHILD) {
      *left = 0;
      return reaped;
    }
    if (n < 0 || mono_ns() >= deadline_ns) {
      *left = n < 0 ? -1 : n;
      return reaped;
    }
    struct timespec ts = {0, 5000000}; /* killed processes take a moment to exit */
    nanosleep(&ts, NULL);
  }
}
