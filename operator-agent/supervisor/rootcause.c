/* See rootcause.h. */
#define _GNU_SOURCE
#include "operator-agent/supervisor/rootcause.h"

#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "operator-agent/common/log.h"
#include "operator-agent/supervisor/children.h"
#include "operator-agent/supervisor/errorfile.h"
#include "operator-agent/supervisor/oom.h"

static int64_t now_ns(clockid_t c) {
  struct timespec ts;
  clock_gettime(c, &ts);
  return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

void agent_root_cause_pick(agent_workers_t *ws) {
  int64_t mono_to_real = now_ns(CLOCK_REALTIME) - now_ns(CLOCK_MONOTONIC);
  int best = -1, best_loss = 1;
  int64_t best_t = 0;
  for (int i = 0; i < ws->n; i++) {
    const agent_worker_t *w = &ws->w[i];
    if (w->state != AGENT_WORKER_FAILED) continue;
    int64_t t = w->exit_ns + mono_to_real;
    int loss = 0;
    struct stat sb;
    if (stat(w->error_file, &sb) == 0) {
      int64_t ft = (int64_t)sb.st_mtim.tv_sec * 1000000000LL + sb.st_mtim.tv_nsec;
      if (ft < t) t = ft;
      agent_error_info_t info;
      loss = agent_errorfile_read(w->error_file, &info, NULL, 0) == 0 &&
             agent_errorfile_is_peer_loss(info.message);
    }
    if (best < 0 || loss < best_loss || (loss == best_loss && t < best_t)) {
      best = i;
      best_t = t;
      best_loss = loss;
    }
  }
  if (best >= 0) ws->first_failed = best;
}

/* The state letter of /proc/PID/stat ("pid (comm) S ..."), or 0. */
static char proc_state(pid_t pid) {
  char path[64], buf[512];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0) return 0;
  buf[n] = 0;
  const char *p = strrchr(buf, ')');
  return p && p[1] == ' ' ? p[2] : 0;
}

int agent_root_cause_stopped(const agent_workers_t *ws, int *first, char *out, size_t cap) {
  int count = 0;
  size_t len = 0;
  *first = -1;
  if (cap) out[0] = 0;
  if (!agent_proc_is_ours()) return 0; /* /proc/PID would be another namespace's process */
  for (int i = 0; i < ws->n; i++) {
    const agent_worker_t *w = &ws->w[i];
    if (w->pid <= 0) continue;
    char s = proc_state(w->pid);
    if (s != 'T' && s != 't') continue; /* T: stopped by a signal, t: stopped by a tracer */
    if (*first < 0) *first = i;
    count++;
    if (len < cap)
      len += (size_t)snprintf(out + len, cap - len, "%srank %d (local_rank %d, pid %d)",
                              count > 1 ? ", " : "", w->global_rank, w->local_rank, (int)w->pid);
  }
  return count;
}

void agent_root_cause_describe(const agent_workers_t *ws, int node_rank, char *out, size_t cap) {
  const agent_worker_t *w = &ws->w[ws->first_failed];
  char how[256];
  int64_t ooms = agent_oom_since_mark(), limit = agent_oom_limit();
  if (w->exit_code == -SIGKILL && ooms > 0 && limit > 0)
    snprintf(how, sizeof how,
             "was killed by signal 9 (Killed) by the kernel's OOM killer: over the memory limit "
             "of %" PRId64 " MiB (resources.limits.memory; raise it or use less)",
             limit >> 20);
  else if (w->exit_code == -SIGKILL && ooms > 0)
    snprintf(how, sizeof how, "was killed by signal 9 (Killed) by the kernel's OOM killer");
  else if (w->exit_code < 0)
    snprintf(how, sizeof how, "was killed by signal %d (%s)", -w->exit_code,
             strsignal(-w->exit_code));
  else
    snprintf(how, sizeof how, "exited with code %d", w->exit_code);
  agent_error_info_t info;
  char perr[256];
  int r = agent_errorfile_read(w->error_file, &info, perr, sizeof perr);
  const char *msg = r == 0 ? info.message : "";
  char stopped[256];
  int first_stopped;
  int nstopped = agent_root_cause_stopped(ws, &first_stopped, stopped, sizeof stopped);
  if (nstopped) {
    /* A stopped rank leaves no error and exits nothing: the ranks that wait for it time out,
     * and the first of those would otherwise be blamed. */
    const agent_worker_t *s = &ws->w[first_stopped];
    AGENT_ERROR(
        "worker failed (root cause): rank %d (local_rank %d, pid %d) is stopped (SIGSTOP, or a "
        "debugger holds it): the other ranks timed out waiting for it%s%s; the first to fail "
        "was rank %d (local_rank %d), which %s",
        s->global_rank, s->local_rank, (int)s->pid, nstopped > 1 ? "; stopped: " : "",
        nstopped > 1 ? stopped : "", w->global_rank, w->local_rank, how);
    snprintf(out, cap,
             "node %d rank %d (local_rank %d, pid %d) is stopped (SIGSTOP?): the others timed "
             "out waiting for it; rank %d (local_rank %d) %s%s%s",
             node_rank, s->global_rank, s->local_rank, (int)s->pid, w->global_rank, w->local_rank,
             how, msg[0] ? ": " : "", msg);
    AGENT_ERROR("  rank %d's error_file: %s", w->global_rank, r == -2 ? "<N/A>" : w->error_file);
  } else {
    AGENT_ERROR("worker failed (root cause): rank %d (local_rank %d) %s; error_file: %s",
                w->global_rank, w->local_rank, how, r == -2 ? "<N/A>" : w->error_file);
    snprintf(out, cap, "node %d rank %d (local_rank %d) %s%s%s", node_rank, w->global_rank,
             w->local_rank, how, msg[0] ? ": " : "", msg);
  }
  if (r == 0) {
    if (info.message[0]) AGENT_ERROR("  message: %s", info.message);
    if (info.traceback[0]) AGENT_ERROR("  traceback:\n%s", info.traceback);
  } else if (r == -1) {
    AGENT_WARN("  could not read the error file: %s", perr);
  }
}
