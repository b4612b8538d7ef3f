/* See guard.h. The guard runs no thread, holds no lock and allocates nothing after fork: it waits
 * in sigwaitinfo for the signals it forwards and for SIGCHLD. */
#define _GNU_SOURCE
#include "operator-agent/supervisor/guard.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "operator-agent/common/log.h"
#include "operator-agent/supervisor/children.h"

/* How long the guard keeps killing and reaping what the agent left: processes die within
 * milliseconds of SIGKILL unless stuck in the kernel (an uninterruptible wait on a dead NFS
 * server); the guard then gives up rather than hang its parent forever. */
#define GUARD_SWEEP_NS 30000000000LL

static const int forwarded[] = {SIGTERM, SIGINT, SIGQUIT, SIGHUP, SIGUSR1, SIGUSR2};

static int64_t mono_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void guard_run(pid_t agent, const sigset_t *set) {
  int status = 0;
  for (int done = 0; !done;) {
    siginfo_t si;
    int sig = sigwaitinfo(set, &si);
    if (sig < 0) continue; /* EINTR: a stop/continue */
    if (sig != SIGCHLD) {
      kill(agent, sig);
      continue;
    }
    int st;
    pid_t r;
    while ((r = waitpid(-1, &st, WNOHANG | __WALL)) > 0)
      if (r == agent) {
        status = st;
        done = 1;
      }
  }
  int rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  if (WIFSIGNALED(status))
    AGENT_WARN("the agent (pid %d) was killed by signal %d (%s): killing what it left behind",
               (int)agent, WTERMSIG(status), strsignal(WTERMSIG(status)));
  int left = 0;
  int n = agent_children_kill_all(mono_ns() + GUARD_SWEEP_NS, NULL, NULL, &left);
  if (n) AGENT_WARN("guard: killed %d process(es) the agent left behind", n);
  if (left > 0)
    AGENT_ERROR("guard: %d process(es) still alive %.0f s after SIGKILL; exiting without them",
                left, GUARD_SWEEP_NS / 1e9);
  else if (left < 0)
    AGENT_ERROR(
        "guard: cannot list its children (/proc is not mounted for this pid namespace): "
        "processes the agent left behind may survive it");
  _exit(rc);
}

pid_t agent_guard_start(void) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGCHLD);
  for (size_t i = 0; i < sizeof forwarded / sizeof forwarded[0]; i++) sigaddset(&set, forwarded[i]);
  /* Blocked before fork: a signal that comes before either process waits for it stays pending
   * instead of killing one of them. */
  sigprocmask(SIG_BLOCK, &set, NULL);
  if (getpid() == 1) return 0;
  pid_t guard = getpid();
  if (prctl(PR_SET_CHILD_SUBREAPER, 1)) {
    AGENT_WARN(
        "no guard process: PR_SET_CHILD_SUBREAPER: %s (what the workers start may outlive "
        "a kill -9 of the agent)",
        strerror(errno));
    return 0;
  }
  fflush(NULL); /* nothing buffered is written twice */
  pid_t pid = fork();
  if (pid < 0) {
    AGENT_WARN(
        "no guard process: fork: %s (what the workers start may outlive a kill -9 of the "
        "agent)",
        strerror(errno));
    return 0;
  }
  if (pid == 0) {
    setpgid(0, 0);
    /* A job-control stop of a background group (TOSTOP) must not freeze the agent; workers get
     * the default back (workers.c). */
    signal(SIGTTOU, SIG_IGN);
    signal(SIGTTIN, SIG_IGN);
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != guard) raise(SIGTERM); /* the guard died before prctl: pending, as if sent */
    return guard;
  }
  setpgid(pid, pid); /* from both sides: in place before the guard forwards anything */
  guard_run(pid, &set);
  return -1; /* not reached */
}

int agent_guard_gone(pid_t guard_pid) { return guard_pid > 0 && getppid() != guard_pid; }
