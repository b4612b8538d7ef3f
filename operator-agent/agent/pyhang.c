/* Python stacks and PyTorch flight-recorder findings in the hang report (agent.h; the mechanism
 * is operator-agent/pystack/pystack.h, the hang detector operator-agent/procstat/observe.h).
 *
 * When the detector names a rank, on_hang asks that rank and the local peers waiting on it for
 * their stacks (a signal each: never blocks; a stopped rank, which runs no handler, has its
 * stacks read from its memory at once, pyframes.h); agent_pyhang_poll, on each turn of the loop,
 * reads what they wrote and asks the observer to rebuild the /status "hang" object, into which
 * append_json puts a "python_stacks" member. When a worker fails, agent_pyhang_flight reads the
 * NCCL flight-recorder dumps of the attempt, if any, and the failure record names the rank
 * behind. Runs on the loop thread only. */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "operator-agent/agent/agent.h"
#include "operator-agent/common/log.h"
#include "operator-agent/common/outbuf.h"
#include "operator-agent/common/param.h"
#include "operator-agent/pystack/pyframes.h"
#include "operator-agent/pystack/pystack.h"

#define PYHANG_MAX_RANKS 8       /* the named rank and up to 7 waiting peers */
#define PYHANG_STACK_MAX 16384   /* bytes of stacks kept per rank */
#define PYHANG_READ_AFTER_NS 1e8 /* a dump is read 100 ms after the signal at the earliest */
#define PYHANG_GIVE_UP_NS 3e10   /* a running rank that wrote nothing in 30 s: given up */

typedef enum { PY_NONE, PY_PENDING, PY_TAKEN, PY_UNAVAILABLE } py_state_t;

typedef struct {
  int rank;
  pid_t pid;
  char file[512];
  off_t offset;
  int64_t asked_ns;
  py_state_t state;
  char note[512];
  char stack[PYHANG_STACK_MAX];
} py_rank_t;

struct agent_pyhang_s {
  int n;
  py_rank_t r[PYHANG_MAX_RANKS];
};

static const agent_worker_t *worker_of(const agent_t *a, pid_t pid) {
  for (int i = 0; i < a->ws.n; i++)
    if (a->ws.w[i].pid == pid && pid > 0) return &a->ws.w[i];
  return NULL;
}

static void ask(agent_t *a, py_rank_t *p, int rank, pid_t pid) {
  memset(p, 0, sizeof *p - sizeof p->stack);
  p->stack[0] = 0;
  p->rank = rank;
  p->pid = pid;
  const agent_worker_t *w = worker_of(a, pid);
  if (!w || !w->pystack_file[0]) {
    p->state = PY_UNAVAILABLE;
    snprintf(p->note, sizeof p->note, "no Python stacks: %s",
             w ? "TDIST_PY_STACKS=0" : "not a running worker");
    return;
  }
  snprintf(p->file, sizeof p->file, "%s", w->pystack_file);
  if (agent_pystack_stopped(pid)) { /* no handler runs in it: its memory is read instead */
    char why[sizeof p->note];
    if (agent_pyframes_read(pid, p->stack, sizeof p->stack, why, sizeof why) > 0) {
      p->state = PY_TAKEN;
      snprintf(p->note, sizeof p->note, "read from the stopped process's memory");
      AGENT_INFO("hang report: Python stacks of stopped rank %d (pid %d) read from its memory",
                 rank, (int)pid);
      return;
    }
    AGENT_INFO("hang report: rank %d (pid %d) is stopped and its memory gave no stacks: %s", rank,
               (int)pid, why);
  }
  if (agent_pystack_request(pid, p->file, &p->offset, p->note, sizeof p->note) == 1) {
    p->state = PY_PENDING;
    p->asked_ns = agent_now_ns();
  } else {
    p->state = PY_UNAVAILABLE;
  }
}

static void on_hang(void *ctx, const agent_hang_event_t *ev) {
  agent_t *a = ctx;
  agent_pyhang_t *h = a->pyhang;
  h->n = 0;
  if (!ev) return;
  ask(a, &h->r[h->n++], ev->rank, ev->pid);
  for (int i = 0; i < ev->nwaiting && h->n < PYHANG_MAX_RANKS; i++)
    ask(a, &h->r[h->n++], ev->waiting_ranks[i], ev->waiting_pids[i]);
  AGENT_INFO("hang report: asked %d rank(s) for their Python stacks (signal %d)", h->n,
             agent_pystack_signal());
}

void agent_pyhang_poll(agent_t *a) {
  agent_pyhang_t *h = a->pyhang;
  if (!h) return;
  int64_t now = agent_now_ns();
  int news = 0;
  for (int i = 0; i < h->n; i++) {
    py_rank_t *p = &h->r[i];
    if (p->state != PY_PENDING || now - p->asked_ns < (int64_t)PYHANG_READ_AFTER_NS) continue;
    ssize_t got = agent_pystack_read(p->file, p->offset, p->stack, sizeof p->stack);
    if (got > 0) {
      p->state = PY_TAKEN;
      p->note[0] = 0;
      news = 1;
      AGENT_INFO("hang report: Python stacks of rank %d (pid %d) taken", p->rank, (int)p->pid);
    } else if (!strstr(p->note, "stopped") && now - p->asked_ns > (int64_t)PYHANG_GIVE_UP_NS) {
      p->state = PY_UNAVAILABLE;
      char note[sizeof p->note]; /* not p->note directly: GCC's -Wrestrict sees p->file overlap */
      snprintf(note, sizeof note, "no Python stacks: nothing written to %s within 30 s", p->file);
      memcpy(p->note, note, sizeof note);
      news = 1;
    }
  }
  if (news) agent_obs_refresh(a->obs);
}

static const char *state_name(py_state_t s) {
  return s == PY_TAKEN ? "taken" : s == PY_PENDING ? "pending" : "unavailable";
}

/* The "python_stacks" member, built in out (outbuf.h: once a piece does not fit, nothing more is
 * written; a rank that does not fit is left out whole). */
static size_t append_json(void *ctx, const agent_hang_event_t *ev, char *out, size_t cap) {
  agent_t *a = ctx;
  agent_pyhang_t *h = a->pyhang;
  (void)ev;
  if (!h->n || cap < 2) return 0;
  agent_outbuf_t w = {out, 0, cap, 0};
  agent_outbuf_put(&w, ",\"python_stacks\":[");
  for (int i = 0; i < h->n; i++) {
    const py_rank_t *p = &h->r[i];
    size_t at = w.n;
    agent_outbuf_put(&w, "%s{\"rank\":%d,\"pid\":%d,\"status\":\"%s\",\"note\":", i ? "," : "",
                     p->rank, (int)p->pid, state_name(p->state));
    agent_outbuf_json_str(&w, p->note);
    agent_outbuf_put(&w, ",\"stacks\":");
    if (p->state == PY_TAKEN)
      agent_outbuf_json_str(&w, p->stack);
    else
      agent_outbuf_put(&w, "null");
    agent_outbuf_put(&w, "}");
    if (w.full) { /* leave this rank out whole, close the array */
      w.n = at;
      w.full = 0;
      break;
    }
  }
  agent_outbuf_put(&w, "]");
  if (w.full) return cap; /* tells the observer it did not fit */
  out[w.n] = 0;
  return w.n;
}

void agent_pyhang_setup(agent_t *a) {
  if (!a->obs || !a->run_dir[0]) return;
  if (agent_param_int(AGENT_P_PY_STACKS) == 0) {
    AGENT_INFO("Python stacks off (TDIST_PY_STACKS=0)");
  } else {
    char err[600];
    if (agent_pystack_install(a->run_dir, err, sizeof err)) {
      AGENT_WARN("Python stacks not available: %s", err);
    } else {
      agent_pystack_pydir(a->run_dir, a->py_dir, sizeof a->py_dir);
    }
  }
  a->pyhang = calloc(1, sizeof *a->pyhang);
  if (!a->pyhang) return;
  agent_hang_hooks_t hooks = {.ctx = a, .on_hang = on_hang, .append_json = append_json};
  agent_obs_set_hang_hooks(a->obs, &hooks);
}

void agent_pyhang_flight(agent_t *a, char *what, size_t cap) {
  if (!a->run_dir[0]) return;
  char prefix[600], pydir[600], behind[128], summary[1200];
  snprintf(prefix, sizeof prefix, "%s/attempt_%d/nccl_trace_rank_", a->run_dir, a->rd.attempt);
  agent_pystack_pydir(a->run_dir, pydir, sizeof pydir);
  if (!a->py_dir[0]) { /* stacks off: the analyzer still has to be there */
    char err[600];
    if (agent_pystack_install(a->run_dir, err, sizeof err)) return;
  }
  int r = agent_frtrace_analyze(agent_param_str(AGENT_P_PYTHON), pydir, prefix, a->rd.world_size,
                                10000, behind, sizeof behind, summary, sizeof summary);
  if (r == 0) return;
  a->run_dir_has_dump = 1; /* keep the dumps */
  if (r < 0) {
    AGENT_WARN("PyTorch flight-recorder dumps in %s: %s", prefix, summary);
    return;
  }
  AGENT_WARN("PyTorch flight recorder (dumps %s*): %s", prefix, summary);
  size_t l = strlen(what);
  if (l < cap) snprintf(what + l, cap - l, "; flight recorder: %s", summary);
}

void agent_pyhang_free(agent_t *a) {
  if (a->obs) agent_obs_set_hang_hooks(a->obs, NULL);
  free(a->pyhang);
  a->pyhang = NULL;
}
