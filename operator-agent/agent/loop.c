/* The agent's event loop (see agent.h): one thread polls a signalfd (SIGCHLD and the forwarded
 * signals) with short timeouts, reaps the workers and stamps the liveness tick that /healthz
 * reads; every wait of the agent's loop thread goes through agent_loop_wait, so a signal or a
 * child's exit is seen within one poll. No handler runs asynchronously: signals are blocked and
 * read from the signalfd only. */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include "operator-agent/agent/agent.h"
#include "operator-agent/common/log.h"
#include "operator-agent/supervisor/guard.h"

void agent_copy_str(char *dst, size_t cap, const char *src) {
  size_t n = strlen(src);
  if (n >= cap) n = cap - 1;
  memcpy(dst, src, n);
  dst[n] = 0;
}

const char *agent_nnodes_str(const agent_cfg_t *c, char *buf, size_t cap) {
  if (c->nnodes_min == c->nnodes_max)
    snprintf(buf, cap, "%d", c->nnodes_min);
  else
    snprintf(buf, cap, "%d:%d", c->nnodes_min, c->nnodes_max);
  return buf;
}

int agent_loop_signals(agent_t *a) {
  sigset_t set;
  sigemptyset(&set);
  static const int sigs[] = {SIGCHLD, SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2};
  for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) sigaddset(&set, sigs[i]);
  int rc = pthread_sigmask(SIG_BLOCK, &set, NULL);
  if (rc) {
    errno = rc;
    return -1;
  }
  a->sfd = signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
  return a->sfd < 0 ? -1 : 0;
}

void agent_set_state(agent_t *a, agent_run_state_t s) {
  agent_state_lock(&a->st);
  a->st.state = s;
  agent_state_unlock(&a->st);
}

void agent_set_error(agent_t *a, const char *msg) { agent_state_set_error(&a->st, msg); }

/* One signal read from the signalfd. 1: forward it to the workers. */
static int on_signal(agent_t *a, int sig) {
  if (sig == SIGCHLD) return 0;
  if (sig == SIGTERM || sig == SIGINT || sig == SIGQUIT) {
    if (!a->stop_sig) {
      if (sig == SIGTERM && agent_guard_gone(a->guard_pid))
        AGENT_WARN("the guard process (pid %d) is gone: stopping the workers and exiting",
                   (int)a->guard_pid);
      else
        AGENT_WARN("received %s: stopping the workers and exiting with %d", strsignal(sig),
                   128 + sig);
      a->stop_sig = sig;
    }
  } else if (sig == SIGUSR1) {
    /* Forwarded only to the workers that handle it: its default action would kill every
     * other one (unmodified PyTorch scripts among them). */
    a->dump_requested = 1;
    int n = agent_workers_signal_handlers(&a->ws, sig);
    AGENT_INFO(
        "SIGUSR1: dumping the flight recorders; forwarded to %d of %d worker(s) "
        "(those with a SIGUSR1 handler)",
        n, agent_workers_running(&a->ws));
    return 0;
  } else {
    AGENT_INFO("forwarding %s to the workers", strsignal(sig));
  }
  return 1;
}

void agent_loop_wait(agent_t *a, int timeout_ms) {
  struct pollfd pfd = {a->sfd, POLLIN, 0};
  int r = poll(&pfd, 1, timeout_ms < 0 ? 0 : timeout_ms);
  if (r > 0) {
    struct signalfd_siginfo si;
    while (read(a->sfd, &si, sizeof si) == (ssize_t)sizeof si) {
      int sig = (int)si.ssi_signo;
      if (on_signal(a, sig)) agent_workers_signal(&a->ws, sig);
    }
  }
  if (agent_workers_reap(&a->ws) > 0) agent_workers_publish(&a->ws, &a->st);
  /* JobSet's group restart (jobset.c) stops the agent as a SIGTERM would, by every path that
   * already handles one; the exit code is JobSet's (agent_jobset_exit_code). */
  if (!a->stop_sig && agent_jobset_poll(a)) {
    a->stop_sig = SIGTERM;
    agent_workers_signal(&a->ws, SIGTERM);
  }
  agent_state_lock(&a->st);
  a->st.loop_tick_ns = agent_now_ns();
  agent_state_unlock(&a->st);
}

int agent_loop_wait_cb(void *arg, int timeout_ms) {
  agent_t *a = arg;
  agent_loop_wait(a, timeout_ms);
  return a->stop_sig != 0;
}

int agent_loop_poll_ms(const agent_t *a) {
  int ms = (int)(a->cfg.monitor_interval_s * 1000);
  return ms < 1 ? 1 : ms;
}

/* The workers' process groups: sig, then SIGKILL after the grace period. */
static void stop_groups(agent_t *a, int sig, int already_sent) {
  agent_set_state(a, AGENT_STATE_STOPPING);
  agent_workers_mark_stopping(&a->ws);
  if (!already_sent) agent_workers_signal(&a->ws, sig);
  /* A stopped worker (SIGSTOP, a debugger) acts on sig only once continued (as systemd does). */
  agent_workers_signal(&a->ws, SIGCONT);
  int64_t deadline = agent_now_ns() + (int64_t)(a->cfg.stop_grace_s * 1e9);
  while (agent_workers_running(&a->ws) && agent_now_ns() < deadline) agent_loop_wait(a, 50);
  if (agent_workers_running(&a->ws)) {
    AGENT_WARN("%d worker(s) still running %.1f s after %s: sending SIGKILL",
               agent_workers_running(&a->ws), a->cfg.stop_grace_s, strsignal(sig));
    agent_workers_signal(&a->ws, SIGKILL);
    deadline = agent_now_ns() + 10000000000LL;
    while (agent_workers_running(&a->ws) && agent_now_ns() < deadline) agent_loop_wait(a, 50);
  }
}

/* The processes the workers left outside their groups (setsid, double fork: the agent's children
 * now, as a subreaper or PID 1) are SIGKILLed too. */
void agent_loop_stop_workers(agent_t *a, int sig, int already_sent) {
  if (agent_workers_running(&a->ws)) stop_groups(a, sig, already_sent);
  int left = 0;
  int n = agent_workers_kill_all(&a->ws, agent_now_ns() + 10000000000LL, &left);
  if (n) AGENT_INFO("killed %d process(es) the workers left outside their process groups", n);
  if (left > 0)
    AGENT_WARN("%d child process(es) still alive 10 s after SIGKILL", left);
  else if (left < 0)
    AGENT_WARN(
        "cannot list the agent's children (/proc is not mounted for its pid namespace): "
        "processes the workers left outside their process groups may outlive them");
  agent_workers_publish(&a->ws, &a->st);
  agent_pmix_job_end(a->pmix); /* its ranks are gone: their shared memory goes too */
}

#define RDZV_BACKOFF_MAX_MS 5000
int agent_loop_backoff(agent_t *a, int64_t deadline_ns) {
  a->backoff_ms = a->backoff_ms ? a->backoff_ms * 2 : 100;
  if (a->backoff_ms > RDZV_BACKOFF_MAX_MS) a->backoff_ms = RDZV_BACKOFF_MAX_MS;
  int64_t until = agent_now_ns() + (int64_t)a->backoff_ms * 1000000;
  if (until > deadline_ns) until = deadline_ns;
  while (!a->stop_sig && agent_now_ns() < until) agent_loop_wait(a, 100);
  return a->stop_sig != 0;
}
