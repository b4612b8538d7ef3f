/* The /status "hang" object (see observe.h and docs/agent.md "Hang reports"):
 *   {"rank","local_rank","pid","reason","since_unix","reported_unix","detail",
 *    "ranks":[{"rank","local_rank","pid","role":"holding"|"waiting","reason","state",
 *              "cpu_seconds","cpu_flat_seconds","cpu_busy_seconds","threads_total",
 *              "threads":[{"tid","comm","state","wchan"}]}],
 *    ...members the hooks add, "truncated":true when the object was cut}
 * Strings from /proc are escaped byte by byte (\u00XX for control and non-ASCII bytes), so the
 * object is valid JSON whatever a thread named itself. Runs on the loop thread. */
#define _GNU_SOURCE
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "operator-agent/common/log.h"
#include "operator-agent/common/outbuf.h"
#include "operator-agent/procstat/observe_int.h"

static double unix_of(int64_t mono_ns, int64_t now_mono_ns) {
  struct timespec rt;
  clock_gettime(CLOCK_REALTIME, &rt);
  double now_unix = (double)rt.tv_sec + (double)rt.tv_nsec / 1e9;
  return now_unix - (double)(now_mono_ns - mono_ns) / 1e9;
}

/* "stopped (state T)", ... for the detail sentence. */
static const char *why_text(agent_stall_reason_t r) {
  switch (r) {
    case AGENT_STALL_STOPPED: return "is stopped (state T: SIGSTOP or a debugger)";
    case AGENT_STALL_UNINTERRUPTIBLE:
      return "is in uninterruptible sleep (state D: I/O or a driver)";
    case AGENT_STALL_SPINNING: return "runs (CPU moving) while its peers wait (CPU flat)";
    case AGENT_STALL_COLLECTIVE: return "waits in a collective";
    case AGENT_STALL_BEHIND: return "has not reached the collective its local peers wait in";
    case AGENT_STALL_DEADLINE:
      return "made no progress (no I/O, no collective) within the deadline";
    default: return "";
  }
}

static void put_rank(agent_obs_t *o, agent_outbuf_t *b, int i, int first_member) {
  const agent_hang_rank_t *h = &o->hr[i];
  agent_outbuf_put(b, "%s{\"rank\":%d,\"local_rank\":%d,\"pid\":%d,\"role\":\"%s\",\"reason\":",
                   first_member ? "" : ",", h->global_rank, h->local_rank, (int)h->pid,
                   h->reason ? "holding" : "waiting");
  if (h->reason)
    agent_outbuf_json_str(b, agent_stall_reason_name(h->reason));
  else
    agent_outbuf_put(b, "null");
  agent_outbuf_put(
      b,
      ",\"state\":\"%c\",\"cpu_seconds\":%.2f,\"cpu_flat_seconds\":%.1f,\"cpu_busy_seconds\":%.1f",
      h->state >= 0x21 && h->state < 0x7f && h->state != '"' && h->state != '\\' ? h->state : '?',
      (double)h->ticks / (double)o->hc.hz, h->idle_s, h->busy_s);
  int total = 0;
  int k = agent_procstat_threads(o->proc_root, h->pid, o->threads, OBS_MAX_THREADS, &total);
  agent_outbuf_put(b, ",\"threads_total\":%d,\"threads\":[", k < 0 ? 0 : total);
  for (int t = 0; t < k; t++) {
    const agent_thread_info_t *th = &o->threads[t];
    agent_outbuf_put(b, "%s{\"tid\":%d,\"comm\":", t ? "," : "", (int)th->tid);
    agent_outbuf_json_str(b, th->comm);
    char st[2] = {th->state, 0};
    agent_outbuf_put(b, ",\"state\":");
    agent_outbuf_json_str(b, st);
    agent_outbuf_put(b, ",\"wchan\":");
    agent_outbuf_json_str(b, th->wchan);
    agent_outbuf_put(b, "}");
  }
  agent_outbuf_put(b, "]}");
}

/* The detector's verdict as a short text: a new hang when it changes. */
static void shape_of(const agent_obs_t *o, int n, int first, char *out, size_t cap) {
  size_t k = 0;
  out[0] = 0;
  if (first < 0) return;
  for (int i = 0; i < n && k + 32 < cap; i++)
    if (o->hr[i].reason || o->hr[i].waiting)
      k += (size_t)snprintf(out + k, cap - k, "%d:%d:%d ", o->hr[i].global_rank,
                            (int)o->hr[i].reason, (int)o->hr[i].pid);
  snprintf(out + k, cap - k, "first %d", first);
}

static void event_of(agent_obs_t *o, int n, int first, int64_t now_ns, agent_hang_event_t *ev) {
  const agent_hang_rank_t *h = &o->hr[first];
  memset(ev, 0, sizeof *ev);
  ev->generation = o->generation;
  ev->rank = h->global_rank;
  ev->local_rank = h->local_rank;
  ev->pid = h->pid;
  ev->reason = h->reason;
  ev->since_unix = unix_of(h->since_ns, now_ns);
  for (int i = 0; i < n && ev->nwaiting < 64; i++)
    if (o->hr[i].waiting) {
      o->waiting_ranks[ev->nwaiting] = o->hr[i].global_rank;
      o->waiting_pids[ev->nwaiting++] = o->hr[i].pid;
    }
  ev->waiting_ranks = o->waiting_ranks;
  ev->waiting_pids = o->waiting_pids;
}

static void build(agent_obs_t *o, int n, int first, int64_t now_ns, const agent_hang_event_t *ev) {
  const agent_hang_rank_t *h = &o->hr[first];
  agent_outbuf_t b = {o->json, 0, AGENT_HANG_JSON_CAP - 64, 0};
  agent_outbuf_put(&b, "{\"rank\":%d,\"local_rank\":%d,\"pid\":%d,\"reason\":", h->global_rank,
                   h->local_rank, (int)h->pid);
  agent_outbuf_json_str(&b, agent_stall_reason_name(h->reason));
  agent_outbuf_put(&b, ",\"since_unix\":%.3f,\"reported_unix\":%.3f,\"detail\":", ev->since_unix,
                   unix_of(now_ns, now_ns));
  char detail[512];
  int k = snprintf(detail, sizeof detail, "rank %d (pid %d) %s for %.1f s", h->global_rank,
                   (int)h->pid, why_text(h->reason), (double)(now_ns - h->since_ns) / 1e9);
  if (ev->nwaiting && k > 0 && (size_t)k < sizeof detail) {
    k += snprintf(detail + k, sizeof detail - (size_t)k, "; rank%s ", ev->nwaiting > 1 ? "s" : "");
    for (int i = 0; i < ev->nwaiting && (size_t)k < sizeof detail; i++)
      k += snprintf(detail + k, sizeof detail - (size_t)k, "%s%d", i ? "," : "",
                    ev->waiting_ranks[i]);
    if ((size_t)k < sizeof detail)
      snprintf(detail + k, sizeof detail - (size_t)k, " wait%s on it", ev->nwaiting > 1 ? "" : "s");
  }
  agent_outbuf_json_str(&b, detail);
  agent_outbuf_put(&b, ",\"ranks\":[");
  /* the named ranks first (the reported one first of all), then the waiting ones; a rank that
   * does not fit is left out whole */
  int truncated = 0, members = 0;
  for (int pass = 0; pass < 3 && !truncated; pass++)
    for (int i = 0; i < n && !truncated; i++) {
      int take = pass == 0 ? i == first
                           : i != first && (pass == 1 ? o->hr[i].reason != 0 : o->hr[i].waiting);
      if (!take) continue;
      size_t at = b.n;
      put_rank(o, &b, i, members == 0);
      if (b.full) {
        b.n = at;
        b.p[b.n] = 0;
        b.full = 0;
        truncated = 1;
      } else {
        members++;
      }
    }
  agent_outbuf_put(&b, "]");
  if (o->hooks.append_json && !b.full && b.cap - b.n > 1) {
    size_t w = o->hooks.append_json(o->hooks.ctx, ev, b.p + b.n, b.cap - b.n);
    if (w < b.cap - b.n)
      b.n += w;
    else
      truncated = 1;
    b.p[b.n] = 0;
  }
  /* the 64 bytes held back close the object whatever happened above */
  b.cap = AGENT_HANG_JSON_CAP;
  b.full = 0;
  agent_outbuf_put(&b, "%s}", truncated ? ",\"truncated\":true" : "");
}

void agent_obs_report(agent_obs_t *o, int n, int first, int64_t now_ns) {
  char shape[sizeof o->shape];
  shape_of(o, n, first, shape, sizeof shape);
  int changed = strcmp(shape, o->shape) != 0;
  if (!changed && !o->refresh && (first < 0 || now_ns - o->report_ns < OBS_REPORT_REFRESH_NS))
    return;
  o->refresh = 0;
  o->report_ns = now_ns;
  snprintf(o->shape, sizeof o->shape, "%s", shape);
  if (first < 0) {
    if (o->hooks.on_hang && changed) o->hooks.on_hang(o->hooks.ctx, NULL);
    if (changed) AGENT_INFO("hang report: no rank is named any more");
    o->json[0] = 0;
  } else {
    if (changed) o->generation++;
    agent_hang_event_t ev;
    event_of(o, n, first, now_ns, &ev);
    if (changed) {
      AGENT_WARN("hang report: rank %d (pid %d) holds the job: %s (%d local peer(s) waiting)",
                 ev.rank, (int)ev.pid, agent_stall_reason_name(ev.reason), ev.nwaiting);
      if (o->hooks.on_hang) o->hooks.on_hang(o->hooks.ctx, &ev);
    }
    build(o, n, first, now_ns, &ev);
  }
  size_t len = strlen(o->json) + 1;
  agent_state_lock(o->st);
  if (!o->st->hang_json) o->st->hang_json = malloc(AGENT_HANG_JSON_CAP);
  if (o->st->hang_json) memcpy(o->st->hang_json, o->json, len);
  agent_state_unlock(o->st);
}
