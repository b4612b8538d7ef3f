/* See progress.h: agent_progress_publish, the progress lines through the agents' store
 * (progress/<r>/<g>) and node 0's job-wide summary. Runs on the agent's loop thread. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <tdist/status.h>

#include "operator-agent/common/log.h"
#include "operator-agent/supervisor/progress.h"

/* Copies src into dst (cap bytes), truncating; always NUL-terminated. */
static void copy_str(char *dst, size_t cap, const char *src) {
  size_t n = strlen(src);
  if (n >= cap) n = cap - 1;
  memcpy(dst, src, n);
  dst[n] = 0;
}

/* Every node's line of this round (lines[g] NULL where none), n = nmembers. */
static char **read_lines(tdist_store_t *store, int64_t round, size_t n) {
  char key[96];
  char **lines = calloc(n, sizeof *lines);
  if (!lines) return NULL;
  for (size_t g = 0; g < n; g++) {
    snprintf(key, sizeof key, "progress/%" PRId64 "/%zu", round, g);
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

void agent_progress_publish(agent_progress_pub_t *p, const agent_workers_t *ws,
                            tdist_store_t *store, int64_t round, int group_rank, int64_t nmembers,
                            int world_size, double stall_s, agent_state_t *st, int64_t now_ns) {
  if (now_ns < p->next_ns) return;
  p->next_ns = now_ns + 1000000000LL;
  struct timespec rt;
  clock_gettime(CLOCK_REALTIME, &rt);
  char line[4096], key[96];
  agent_progress_local(ws, (int64_t)rt.tv_sec * 1000000000LL + rt.tv_nsec, line, sizeof line);
  if (!line[0]) return;
  snprintf(key, sizeof key, "progress/%" PRId64 "/%d", round, group_rank);
  if (tdist_store_set(store, key, line, strlen(line)) != TDIST_OK || group_rank != 0) return;
  size_t n = (size_t)nmembers;
  char **lines = read_lines(store, round, n);
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
