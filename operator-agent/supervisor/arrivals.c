/* See arrivals.h. */
#include "operator-agent/supervisor/arrivals.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include <tdist/stats.h>

#include "operator-agent/supervisor/straggler.h"

/* Longest entry: ",<20 digits>.<2 digits>.<19 digits>" plus a rank prefix "<5 digits>/". */
#define ENTRY_MAX 64

/* The new entries of f after cur, completed and usable, into sel (their ring indexes, oldest
 * first); returns how many and raises *maxseq to the highest completed seq seen. */
static int new_entries(const tdist_stats_file_t *f, uint64_t after, int *sel, uint64_t *maxseq) {
  uint64_t end = f->flight_next, begin = end > TDIST_STATS_FLIGHT ? end - TDIST_STATS_FLIGHT : 0;
  int n = 0;
  for (uint64_t k = begin; k < end; k++) {
    const tdist_stats_flight_t *e = &f->flight[k % TDIST_STATS_FLIGHT];
    if (e->group != 0 || e->seq <= after || !e->end_ns) continue;
    if (e->seq > *maxseq) *maxseq = e->seq;
    if (e->status != TDIST_OK || !agent_strag_symmetric_op(e->op) || e->end_ns < e->start_ns)
      continue;
    sel[n++] = (int)(k % TDIST_STATS_FLIGHT);
  }
  return n;
}

size_t agent_arrivals_local(const agent_workers_t *ws, agent_arrivals_cursor_t *cur, char *out,
                            size_t cap) {
  size_t n = 0;
  if (cap) out[0] = 0;
  tdist_stats_file_t *f = malloc(sizeof *f);
  if (!f || cap < ENTRY_MAX) {
    free(f);
    return 0;
  }
  int sel[TDIST_STATS_FLIGHT];
  for (int i = 0; i < ws->n && n + ENTRY_MAX < cap; i++) {
    if (!ws->w[i].stats_file[0] || tdist_stats_read(ws->w[i].stats_file, f) != TDIST_OK) continue;
    if (f->pid != cur[i].pid) {
      cur[i].pid = f->pid;
      cur[i].last_seq = 0;
    }
    uint64_t maxseq = cur[i].last_seq;
    int ns = new_entries(f, cur[i].last_seq, sel, &maxseq);
    uint64_t stride = 1;
    for (;;) {
      int c = 0;
      for (int k = 0; k < ns; k++) c += f->flight[sel[k]].seq % stride == 0;
      if (c <= AGENT_STRAG_MAX_PUBLISH) break;
      stride *= 2;
    }
    int put = 0;
    uint64_t sent = cur[i].last_seq;
    for (int k = 0; k < ns && n + ENTRY_MAX < cap; k++) {
      const tdist_stats_flight_t *e = &f->flight[sel[k]];
      if (e->seq % stride) continue;
      if (!put) n += (size_t)snprintf(out + n, cap - n, "%s%d/", n ? " " : "", f->rank);
      n += (size_t)snprintf(out + n, cap - n, "%s%" PRIu64 ".%d.%" PRId64, put ? "," : "", e->seq,
                            e->op, (e->end_ns - e->start_ns) / 1000);
      put++;
      sent = e->seq;
    }
    /* Everything up to maxseq was looked at, unless the line ran out of room first. */
    cur[i].last_seq = n + ENTRY_MAX < cap ? maxseq : sent;
  }
  free(f);
  return n;
}
