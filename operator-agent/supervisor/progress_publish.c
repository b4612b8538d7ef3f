/* See progress.h: agent_progress_publish, the progress lines through the agents' store
 * (progress/<r>/<g>) and node 0's job-wide summary; the arrivals lines (arrivals/<r>/<g>) and
 * node 0's straggler computation. Runs on the agent's loop thread. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <tdist/status.h>

#include "operator-agent/common/log.h"
#include "operator-agent/supervisor/arrivals.h"
#include "operator-agent/supervisor/progress.h"
#include "operator-agent/supervisor/straggler.h"

/* Copies src into dst (cap bytes), truncating; always NUL-terminated. */
static void copy_str(char *dst, size_t cap, const char *src) {
  size_t n = strlen(src);
  if (n >= cap) n = cap - 1;
  memcpy(dst, src, n);
  dst[n] = 0;
}

/* Every node's line of this round under what/ (lines[g] NULL where none), n = nmembers. */
static char **read_lines(tdist_store_t *store, const char *what, int64_t round, size_t n) {
  char key[96];
  char **lines = calloc(n, sizeof *lines);
  if (!lines) return NULL;
  for (size_t g = 0; g < n; g++) {
    snprintf(key, sizeof key, "%s/%" PRId64 "/%zu", what, round, g);
    const char *keys[1] = {key};
    int ready = 0;
    void *v = NULL;
    size_t len = 0;
    if (tdist_store_check(store, keys, 1, &ready) != TDIST_OK || !ready ||
        tdist_store_get(store, key, &v, &len) != TDIST_OK)
      continue;
    lines[g] = calloc(1, len + 1);
    if (lines[g]) memcpy(lines[g], v, len);
    tdist_free(v);
  }
  return lines;
}

/* Ranks nobody reported (no statistics file yet, or a node that stopped publishing) cannot be
 * placed; when the job is stuck they are suspects, so name them. */
static void name_silent_ranks(char **lines, size_t n, int ws, char *summary, size_t cap) {
  unsigned char *seen = ws > 0 ? calloc((size_t)ws, 1) : NULL;
  if (seen && strstr(summary, "stuck")) {
    for (size_t g = 0; g < n; g++) {
      for (const char *q = lines[g]; q && *q;) {
        int r = atoi(q);
        if (r >= 0 && r < ws) seen[r] = 1;
        q = strchr(q, ' ');
        if (q) q++;
      }
    }
    size_t len = strlen(summary);
    int first = 1;
    for (int r = 0; r < ws && len + 16 < cap; r++) {
      if (seen[r]) continue;
      len += (size_t)snprintf(summary + len, cap - len, "%s%d",
                              first ? "; no report from rank(s) " : ",", r);
      first = 0;
    }
  }
  free(seen);
}

/* This node's new collectives as arrivals/<round>/<group_rank> (arrivals.h). */
static void arrivals_publish(agent_progress_pub_t *p, const agent_workers_t *ws,
                             tdist_store_t *store, int64_t round, int group_rank) {
  if (p->strag_round != round || p->ncur != ws->n) {
    free(p->cur);
    p->cur = ws->n > 0 ? calloc((size_t)ws->n, sizeof *p->cur) : NULL;
    p->ncur = p->cur ? ws->n : 0;
  }
  if (!p->ncur) return;
  /* At most AGENT_STRAG_MAX_PUBLISH entries of at most ~45 bytes per rank. */
  size_t cap = (size_t)ws->n * (AGENT_STRAG_MAX_PUBLISH * 48 + 16) + 64;
  char *line = malloc(cap), key[96];
  size_t len = line ? agent_arrivals_local(ws, p->cur, line, cap) : 0;
  if (len) {
    snprintf(key, sizeof key, "arrivals/%" PRId64 "/%d", round, group_rank);
    (void)tdist_store_set(store, key, line, len); /* best effort, as progress/ */
    AGENT_DEBUG("arrivals: published %zu bytes for %d rank(s)", len, ws->n);
  }
  free(line);
}

/* Group rank 0: every node's arrivals into the computation, its verdict into st. */
static void stragglers_update(agent_progress_pub_t *p, tdist_store_t *store, int64_t round,
                              size_t n, int world_size, agent_state_t *st, double now_unix) {
  if (p->strag && agent_strag_world(p->strag) != world_size) {
    agent_strag_destroy(p->strag);
    p->strag = NULL;
  }
  if (!p->strag) {
    p->strag = agent_strag_create(world_size);
    p->strag_named = -1;
    if (!p->strag) return;
  } else if (p->strag_round != round) {
    agent_strag_new_round(p->strag);
  }
  char **lines = read_lines(store, "arrivals", round, n);
  if (!lines) return;
  for (size_t g = 0; g < n; g++) {
    if (lines[g] && agent_strag_feed_line(p->strag, lines[g]) < 0)
      AGENT_WARN("arrivals/%" PRId64 "/%zu: malformed entry, the rest of the line ignored", round,
                 g);
    free(lines[g]);
  }
  free(lines);
  agent_strag_state_t v;
  agent_strag_view(p->strag, &v);
  if (v.straggler != p->strag_named) {
    p->strag_since_unix = v.straggler >= 0 ? now_unix : 0;
    if (v.straggler >= 0)
      AGENT_WARN(
          "straggler: rank %d: the others waited for it %.1f ms per collective on average "
          "(%.0f%% of all waiting) over the last %d collectives (named after #%" PRIu64 ")",
          v.straggler, v.mean_wait_s * 1e3, v.share * 100, AGENT_STRAG_WINDOW, v.since_seq);
    else
      AGENT_INFO("straggler: rank %d is no longer named", p->strag_named);
    p->strag_named = v.straggler;
  }
  int w = agent_strag_world(p->strag);
  double *caused = malloc((size_t)w * sizeof *caused);
  if (caused) memcpy(caused, agent_strag_caused(p->strag), (size_t)w * sizeof *caused);
  agent_state_lock(st);
  st->strag_known = 1;
  st->strag_rank = v.straggler;
  st->strag_leader = v.leader;
  st->strag_since_seq = v.since_seq;
  st->strag_named_after = v.named_after;
  st->strag_analysed = v.analysed;
  st->strag_analysed_total = v.analysed_total;
  st->strag_since_unix = p->strag_since_unix;
  st->strag_share = v.share;
  st->strag_mean_wait_s = v.mean_wait_s;
  st->strag_held = v.held;
  if (caused) {
    free(st->strag_caused_s);
    st->strag_caused_s = caused;
    st->strag_world = w;
  }
  agent_state_unlock(st);
}

void agent_progress_pub_close(agent_progress_pub_t *p) {
  free(p->cur);
  p->cur = NULL;
  p->ncur = 0;
  agent_strag_destroy(p->strag);
  p->strag = NULL;
}

void agent_progress_publish(agent_progress_pub_t *p, const agent_workers_t *ws,
                            tdist_store_t *store, int64_t round, int group_rank, int64_t nmembers,
                            int world_size, double stall_s, agent_state_t *st, int64_t now_ns) {
  if (now_ns < p->next_ns) return;
  struct timespec rt;
  clock_gettime(CLOCK_REALTIME, &rt);
  /* Due at the next whole second of the wall clock: every node then reads its ranks' flight
   * recorders at about the same moment, so their newest entries overlap (arrivals.h). */
  int64_t to_next = 1000000000LL - rt.tv_nsec;
  p->next_ns = now_ns + (to_next < 200000000LL ? to_next + 1000000000LL : to_next);
  char line[4096], key[96];
  agent_progress_local(ws, (int64_t)rt.tv_sec * 1000000000LL + rt.tv_nsec, line, sizeof line);
  if (!line[0]) return;
  arrivals_publish(p, ws, store, round, group_rank);
  snprintf(key, sizeof key, "progress/%" PRId64 "/%d", round, group_rank);
  if (tdist_store_set(store, key, line, strlen(line)) != TDIST_OK || group_rank != 0) {
    p->strag_round = round;
    return;
  }
  size_t n = (size_t)nmembers;
  stragglers_update(p, store, round, n, world_size, st,
                    (double)rt.tv_sec + (double)rt.tv_nsec / 1e9);
  p->strag_round = round;
  char **lines = read_lines(store, "progress", round, n);
  if (!lines) return;
  char summary[1024];
  agent_progress_summarize((const char *const *)lines, n, stall_s > 0 ? stall_s : 5.0, summary,
                           sizeof summary);
  name_silent_ranks(lines, n, world_size, summary, sizeof summary);
  for (size_t g = 0; g < n; g++) free(lines[g]);
  free(lines);
  /* Log a stall once per shape (who is stuck where, who holds them up), not every second. */
  char shape[1024];
  copy_str(shape, sizeof shape, summary);
  char *f = strstr(shape, " for ");
  char *e = f ? strstr(f, " s") : NULL;
  if (f && e) memmove(f, e + 2, strlen(e + 2) + 1);
  if (strstr(summary, "stuck") && strcmp(shape, p->last_stall_shape))
    AGENT_WARN("collectives: %s", summary);
  copy_str(p->last_stall_shape, sizeof p->last_stall_shape, strstr(summary, "stuck") ? shape : "");
  agent_state_lock(st);
  copy_str(st->progress_summary, sizeof st->progress_summary, summary);
  st->progress_unix = rt.tv_sec;
  agent_state_unlock(st);
}
