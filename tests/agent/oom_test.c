/* agent_oom_* (operator-agent/supervisor/oom.h) on a real memory cgroup: a child process in a new
 * cgroup with a 32 MiB limit (no swap) reads that limit; a grandchild that touches 256 MiB is
 * killed by the kernel's OOM killer (SIGKILL) and agent_oom_since_mark counts it; a grandchild
 * killed by kill -9 is not counted. Needs root and the memory controller (cgroup v1 or v2). The
 * cgroup is removed on every path (the test's own process never joins it). */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "operator-agent/supervisor/oom.h"
#include "tests/testlib/check.h"

#define LIMIT (32LL << 20)

static char dir[256];

static int put(const char *file, const char *val) {
  char p[512];
  snprintf(p, sizeof p, "%s/%s", dir, file);
  FILE *f = fopen(p, "we");
  if (!f) return -1;
  int ok = fputs(val, f) >= 0;
  return fclose(f) == 0 && ok ? 0 : -1;
}

/* A grandchild: touches 256 MiB (OOM-killed) or sleeps (killed by kill -9); its wait status. */
static int grandchild(int oom) {
  pid_t pid = fork();
  if (pid == 0) {
    if (oom) {
      for (size_t i = 0; i < 256; i++) {
        char *p = malloc(1 << 20);
        if (p) memset(p, 1, 1 << 20);
      }
      _exit(0); /* not reached under the limit */
    }
    pause();
    _exit(0);
  }
  if (pid < 0) return -1;
  if (!oom) kill(pid, SIGKILL);
  int st;
  while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
  }
  return st;
}

/* The child in the cgroup: exit 0 when everything held, else the number of the failed step. */
static int in_cgroup(void) {
  if (put("cgroup.procs", "0") != 0) return 10;
  if (agent_oom_limit() != LIMIT) {
    fprintf(stderr, "agent_oom_limit: %lld, want %lld\n", (long long)agent_oom_limit(), LIMIT);
    return 11;
  }
  if (agent_oom_kills() != 0) return 12;
  agent_oom_mark();
  int st = grandchild(0);
  if (!WIFSIGNALED(st) || WTERMSIG(st) != SIGKILL) return 13;
  if (agent_oom_since_mark() != 0) return 14; /* kill -9 is not the OOM killer */
  st = grandchild(1);
  if (!WIFSIGNALED(st) || WTERMSIG(st) != SIGKILL) return 15;
  int64_t n = agent_oom_since_mark();
  if (n != 1) {
    fprintf(stderr, "agent_oom_since_mark after an OOM kill: %lld, want 1\n", (long long)n);
    return 16;
  }
  if (agent_oom_since_mark() != 0) return 17; /* it marked again */
  return 0;
}

int main(void) {
  CHECK_EQ_INT(geteuid(), 0);
  int v2 = access("/sys/fs/cgroup/cgroup.controllers", F_OK) == 0;
  snprintf(dir, sizeof dir, "%s/tdist-oom-test-%d", v2 ? "/sys/fs/cgroup" : "/sys/fs/cgroup/memory",
           (int)getpid());
  CHECK_EQ_INT(mkdir(dir, 0755), 0);
  char lim[32];
  snprintf(lim, sizeof lim, "%lld", LIMIT);
  int ok = v2 ? put("memory.max", lim) == 0 && (put("memory.swap.max", "0") == 0 || errno == ENOENT)
              : put("memory.limit_in_bytes", lim) == 0 &&
                    (put("memory.memsw.limit_in_bytes", lim) == 0 || errno == ENOENT);
  int rc = -1, st = 0;
  if (ok) {
    pid_t pid = fork();
    if (pid == 0) _exit(in_cgroup());
    while (pid > 0 && waitpid(pid, &st, 0) < 0 && errno == EINTR) {
    }
    rc = pid > 0 && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  }
  int rm = rmdir(dir);
  CHECK(ok);
  CHECK_EQ_INT(rc, 0);
  CHECK_EQ_INT(rm, 0);
  TEST_LOG("oom_test: all passed");
  return 0;
}
