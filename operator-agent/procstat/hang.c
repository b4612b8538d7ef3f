/* See hang.h. Each rank keeps two reference points on its CPU counter instead of a history:
 *   idle: moved on whenever the rank used more than IDLE_SHARE of a core (+ IDLE_SLACK ticks)
 *         since the point; now - point = how long its CPU has been flat;
 *   busy: moved on whenever the rank used less than BUSY_SHARE of a core (- BUSY_SLACK ticks)
 *         since the point; now - point = how long its CPU has been moving.
 * The slack absorbs the counters' tick granularity (10 ms at 100 Hz) so that one tick is never
 * a verdict. The shares are far apart on purpose: a rank blocked in a socket or a futex uses
 * ~0; a spinning one gets most of a core, or a fair fraction of one on a loaded node. */
#include "operator-agent/procstat/hang.h"

#include <stddef.h>
#include <stdint.h>

#define IDLE_SHARE 0.02
#define IDLE_SLACK 2.0
#define BUSY_SHARE 0.10
#define BUSY_SLACK 2.0

const char *agent_stall_reason_name(agent_stall_reason_t r) {
  static const char *const names[AGENT_STALL_NREASONS] = {
      "none", "stopped", "uninterruptible", "spinning", "collective", "deadline", "behind"};
  return (unsigned)r < AGENT_STALL_NREASONS ? names[r] : "none";
}

static double secs(int64_t ns) { return (double)ns / 1e9; }

static void restart(agent_hang_rank_t *r) {
  r->seen_pid = r->pid;
  r->idle_ref_ns = r->busy_ref_ns = r->state_since_ns = r->progress_ns = r->t_ns;
  r->idle_ref_ticks = r->busy_ref_ticks = r->ticks;
  r->progress_io = r->io;
  r->progress_seq = r->last_seq;
  r->since_state = r->state;
}

/* Moves the reference points on with this rank's new sample. */
static void track(agent_hang_rank_t *r, const agent_hang_cfg_t *c) {
  if (r->seen_pid != r->pid) {
    restart(r);
    return;
  }
  double hz = c->hz > 0 ? (double)c->hz : 100.0;
  double used = (double)(r->ticks - r->idle_ref_ticks);
  if (used > IDLE_SHARE * secs(r->t_ns - r->idle_ref_ns) * hz + IDLE_SLACK) {
    r->idle_ref_ns = r->t_ns;
    r->idle_ref_ticks = r->ticks;
  }
  used = (double)(r->ticks - r->busy_ref_ticks);
  if (used < BUSY_SHARE * secs(r->t_ns - r->busy_ref_ns) * hz - BUSY_SLACK) {
    r->busy_ref_ns = r->t_ns;
    r->busy_ref_ticks = r->ticks;
  }
  if (r->state != r->since_state) {
    r->since_state = r->state;
    r->state_since_ns = r->t_ns;
  }
  if (r->io != r->progress_io || r->last_seq != r->progress_seq) {
    r->progress_ns = r->t_ns;
    r->progress_io = r->io;
    r->progress_seq = r->last_seq;
  }
}

static int rank_order(agent_stall_reason_t x) {
  /* report order: stopped, uninterruptible, spinning, behind, collective, deadline */
  static const int order[AGENT_STALL_NREASONS] = {99, 0, 1, 2, 4, 5, 3};
  return (unsigned)x < AGENT_STALL_NREASONS ? order[x] : 99;
}

int agent_hang_judge(agent_hang_rank_t *r, int n, const agent_hang_cfg_t *c, int64_t now_ns,
                     int *first) {
  int64_t stall_ns = (int64_t)(c->stall_s * 1e9);
  int named = 0;
  *first = -1;
  for (int i = 0; i < n; i++) {
    r[i].reason = AGENT_STALL_NONE;
    r[i].waiting = 0;
    r[i].since_ns = 0;
    r[i].idle_s = r[i].busy_s = 0;
    if (r[i].pid <= 0) {
      r[i].seen_pid = 0;
      continue;
    }
    track(&r[i], c);
    /* the sample may be a little younger than now_ns */
    r[i].idle_s = now_ns > r[i].idle_ref_ns ? secs(now_ns - r[i].idle_ref_ns) : 0;
    r[i].busy_s = now_ns > r[i].busy_ref_ns ? secs(now_ns - r[i].busy_ref_ns) : 0;
  }
  /* stopped and uninterruptible: the state alone, held for the threshold */
  for (int i = 0; i < n; i++) {
    if (r[i].pid <= 0 || now_ns - r[i].state_since_ns < stall_ns) continue;
    if (r[i].state == 'T' || r[i].state == 't')
      r[i].reason = AGENT_STALL_STOPPED;
    else if (r[i].state == 'D')
      r[i].reason = AGENT_STALL_UNINTERRUPTIBLE;
    if (r[i].reason) r[i].since_ns = r[i].state_since_ns;
  }
  /* spinning: moving for the threshold while a peer is flat for it; not while a rank is stopped
   * (its peers may spin waiting for it: NCCL polls) */
  int stopped = 0; /* named above, or stopped for less than the threshold (it will be named) */
  for (int i = 0; i < n; i++)
    stopped |= r[i].reason != AGENT_STALL_NONE ||
               (r[i].pid > 0 && (r[i].state == 'T' || r[i].state == 't'));
  int64_t flat_since = 0;
  int any_flat = 0;
  for (int i = 0; i < n; i++) {
    if (r[i].pid <= 0 || r[i].reason || r[i].idle_s < c->stall_s) continue;
    if (!any_flat || r[i].idle_ref_ns < flat_since) flat_since = r[i].idle_ref_ns;
    any_flat = 1;
  }
  for (int i = 0; any_flat && !stopped && i < n; i++) {
    /* flat for the threshold: it waits, whatever its average since the busy point says (that
     * average stays above the share long after a rank that computed for a while blocks) */
    if (r[i].pid <= 0 || r[i].reason || r[i].busy_s < c->stall_s || r[i].idle_s >= c->stall_s)
      continue;
    r[i].reason = AGENT_STALL_SPINNING;
    r[i].since_ns = r[i].busy_ref_ns > flat_since ? r[i].busy_ref_ns : flat_since;
  }
  /* libtdist ranks behind the collective local peers are stuck in (the oldest such collective):
   * they hold those peers, whatever their CPU does */
  uint64_t stuck_seq = 0;
  int64_t stuck_since = 0;
  for (int i = 0; i < n; i++) {
    if (r[i].pid <= 0 || !r[i].libtdist || !r[i].cur_seq || r[i].collective_s < c->stall_s)
      continue;
    if (!stuck_seq || r[i].cur_seq < stuck_seq) stuck_seq = r[i].cur_seq;
    int64_t since = now_ns - (int64_t)(r[i].collective_s * 1e9);
    if (!stuck_since || since < stuck_since) stuck_since = since;
  }
  for (int i = 0; stuck_seq && i < n; i++) {
    if (r[i].pid <= 0 || r[i].reason || !r[i].libtdist) continue;
    uint64_t at = r[i].cur_seq ? r[i].cur_seq : r[i].last_seq;
    if (at >= stuck_seq) continue;
    r[i].reason = AGENT_STALL_BEHIND;
    r[i].since_ns = stuck_since;
  }
  int holder = 0;
  for (int i = 0; i < n; i++) holder |= r[i].reason != AGENT_STALL_NONE;
  /* libtdist ranks in a collective for the threshold: waiting on a named rank, or named */
  for (int i = 0; i < n; i++) {
    if (r[i].pid <= 0 || r[i].reason || !r[i].libtdist || !r[i].cur_seq ||
        r[i].collective_s < c->stall_s)
      continue;
    if (holder) {
      r[i].waiting = 1;
    } else {
      r[i].reason = AGENT_STALL_COLLECTIVE;
      r[i].since_ns = now_ns - (int64_t)(r[i].collective_s * 1e9);
    }
  }
  for (int i = 0; i < n; i++) holder |= r[i].reason != AGENT_STALL_NONE;
  /* the user's deadline: no progress at all */
  if (c->deadline_s > 0 && !holder) {
    int64_t dl_ns = (int64_t)(c->deadline_s * 1e9);
    for (int i = 0; i < n; i++) {
      if (r[i].pid <= 0 || now_ns - r[i].progress_ns < dl_ns) continue;
      r[i].reason = AGENT_STALL_DEADLINE;
      r[i].since_ns = r[i].progress_ns;
    }
  }
  /* the peers a named rank holds up: flat for the threshold (or in a collective, above) */
  for (int i = 0; i < n; i++) {
    if (r[i].pid <= 0) continue;
    if (r[i].reason) {
      named++;
      if (*first < 0 || rank_order(r[i].reason) < rank_order(r[*first].reason) ||
          (r[i].reason == r[*first].reason && r[i].global_rank < r[*first].global_rank))
        *first = i;
    } else if (holder && (r[i].idle_s >= c->stall_s || (stopped && r[i].busy_s >= c->stall_s))) {
      r[i].waiting = 1;
    }
  }
  return named;
}
