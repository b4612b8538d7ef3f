/* See progress.h. */
#define _GNU_SOURCE
#include "operator-agent/supervisor/progress.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <tdist/stats.h>

#define MAX_RANKS 65536

void agent_progress_local(const agent_workers_t *ws, int64_t now_unix_ns, char *out, size_t cap) {
  size_t n = 0;
  out[0] = 0;
  tdist_stats_file_t *f = malloc(sizeof *f);
  if (!f) return;
  for (int i = 0; i < ws->n && n + 96 < cap; i++) {
    if (!ws->w[i].stats_file[0] || tdist_stats_read(ws->w[i].stats_file, f) != TDIST_OK) continue;
    int64_t age_ms = f->cur_seq && f->cur_start_ns ? (now_unix_ns - f->cur_start_ns) / 1000000 : 0;
    n +=
        (size_t)snprintf(out + n, cap - n, "%s%d:%" PRIu64 ":%" PRIu64 ":%d:%" PRId64, n ? " " : "",
                         f->rank, f->last_seq, f->cur_seq, f->cur_op, age_ms < 0 ? 0 : age_ms);
  }
  free(f);
}

typedef struct {
  int rank;
  uint64_t last, cur;
  int op;
  int64_t age_ms;
} rank_pos_t;

static int pos_cmp(const void *a, const void *b) {
  const rank_pos_t *x = a, *y = b;
  return (x->rank > y->rank) - (x->rank < y->rank);
}

/* Appends "a,b,c" (ranks of list that match) to out. */
static size_t put_ranks(char *out, size_t cap, size_t n, const rank_pos_t *p, const int *sel,
                        size_t np, int want) {
  int first = 1, count = 0;
  for (size_t i = 0; i < np; i++)
    if (sel[i] == want) count++;
  n += (size_t)snprintf(out + n, n < cap ? cap - n : 0, "rank%s ", count == 1 ? "" : "s");
  for (size_t i = 0; i < np && n < cap; i++) {
    if (sel[i] != want) continue;
    n += (size_t)snprintf(out + n, cap - n, "%s%d", first ? "" : ",", p[i].rank);
    first = 0;
  }
  return n;
}

int agent_progress_summarize(const char *const *lines, size_t nlines, double stall_s, char *out,
                             size_t cap) {
  size_t np = 0, capn = 64;
  rank_pos_t *p = malloc(capn * sizeof *p);
  out[0] = 0;
  if (!p) return 0;
  for (size_t l = 0; l < nlines; l++) {
    const char *s = lines[l];
    while (s && *s) {
      rank_pos_t r;
      int used = 0;
      if (sscanf(s, "%d:%" SCNu64 ":%" SCNu64 ":%d:%" SCNd64 "%n", &r.rank, &r.last, &r.cur, &r.op,
                 &r.age_ms, &used) != 5 ||
          r.rank < 0 || r.rank >= MAX_RANKS)
        break;
      s += used;
      while (*s == ' ') s++;
      if (np == capn) {
        rank_pos_t *q = realloc(p, 2 * capn * sizeof *p);
        if (!q) break;
        p = q;
        capn *= 2;
      }
      p[np++] = r;
    }
  }
  if (!np) {
    free(p);
    return 0;
  }
  qsort(p, np, sizeof *p, pos_cmp);
  /* The frontier: the highest sequence number any rank has reached (completed or entered). */
  uint64_t front = 0;
  for (size_t i = 0; i < np; i++) {
    uint64_t at = p[i].cur ? p[i].cur : p[i].last;
    if (at > front) front = at;
  }
  int *sel = calloc(np, sizeof *sel); /* 1 stuck at the frontier, 2 behind, 0 fine */
  if (!sel) {
    free(p);
    return 0;
  }
  /* The frontier collective is stalled once any rank has waited in it for stall_s; then every
   * rank in it is stuck in it, however recently it entered: the ages come from lines published
   * up to a second apart, so a rank on another node can look younger than it is. */
  int stalled = 0;
  for (size_t i = 0; i < np; i++)
    if (p[i].cur && p[i].cur == front && (double)p[i].age_ms >= stall_s * 1000) stalled = 1;
  size_t nstuck = 0, nbehind = 0;
  int64_t stuck_ms = 0;
  int stuck_op = -1;
  for (size_t i = 0; i < np; i++) {
    if (stalled && p[i].cur && p[i].cur == front) {
      sel[i] = 1;
      nstuck++;
      if (p[i].age_ms > stuck_ms) stuck_ms = p[i].age_ms;
      stuck_op = p[i].op;
    } else if ((p[i].cur ? p[i].cur : p[i].last) < front || (!p[i].cur && p[i].last < front)) {
      sel[i] = 2;
      nbehind++;
    }
  }
  size_t n = 0;
  if (!nstuck && !nbehind) {
    snprintf(out, cap, "all %zu ranks at #%" PRIu64 "%s", np, front,
             front ? "" : " (no collective yet)");
  } else if (!nstuck) {
    /* Ranks behind but nobody waiting long yet: ordinary skew. */
    snprintf(out, cap, "all %zu ranks progressing (frontier #%" PRIu64 ")", np, front);
  } else {
    n = put_ranks(out, cap, n, p, sel, np, 1);
    n += (size_t)snprintf(out + n, n < cap ? cap - n : 0, " stuck in %s #%" PRIu64 " for %.1f s",
                          tdist_stats_op_name(stuck_op), front, (double)stuck_ms / 1000);
    if (nbehind) {
      n += (size_t)snprintf(out + n, n < cap ? cap - n : 0, "; ");
      n = put_ranks(out, cap, n, p, sel, np, 2);
      n += (size_t)snprintf(out + n, n < cap ? cap - n : 0, " hold%s them up (",
                            nbehind == 1 ? "s" : "");
      int firstb = 1;
      for (size_t i = 0; i < np && n < cap; i++) {
        if (sel[i] != 2) continue;
        if (p[i].cur)
          n += (size_t)snprintf(out + n, cap - n, "%s%d: in %s #%" PRIu64, firstb ? "" : "; ",
                                p[i].rank, tdist_stats_op_name(p[i].op), p[i].cur);
        else
          n += (size_t)snprintf(out + n, cap - n,
                                "%s%d: not in a collective, last completed #%" PRIu64,
                                firstb ? "" : "; ", p[i].rank, p[i].last);
        firstb = 0;
      }
      if (n < cap) snprintf(out + n, cap - n, ")");
    } else if (nstuck < np) {
      snprintf(out + n, n < cap ? cap - n : 0, "; the other %zu ranks are at #%" PRIu64 "",
               np - nstuck, front);
    }
  }
  free(sel);
  free(p);
  return (int)np;
}

static void json_str(FILE *f, const char *s) {
  fputc('"', f);
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\')
      fprintf(f, "\\%c", c);
    else if (c < 0x20)
      fprintf(f, "\\u%04x", c);
    else
      fputc(c, f);
  }
  fputc('"', f);
}

int agent_flight_dump(const agent_workers_t *ws, int node_rank, int64_t round, const char *dir,
                      const char *why, char *path_out, size_t path_cap, char *err, size_t cap) {
  struct timespec now;
  clock_gettime(CLOCK_REALTIME, &now);
  snprintf(path_out, path_cap, "%s/flight-node%d-%lld.%03ld.json", dir, node_rank,
           (long long)now.tv_sec, now.tv_nsec / 1000000);
  FILE *f = fopen(path_out, "w");
  if (!f) {
    snprintf(err, cap, "cannot write %s: %s", path_out, strerror(errno));
    return -1;
  }
  tdist_stats_file_t *s = malloc(sizeof *s);
  if (!s) {
    fclose(f);
    snprintf(err, cap, "out of memory");
    return -1;
  }
  fprintf(f,
          "{\"node_rank\":%d,\"round\":%" PRId64 ",\"time_unix\":%lld.%03ld,\"reason\":", node_rank,
          round, (long long)now.tv_sec, now.tv_nsec / 1000000);
  json_str(f, why);
  fprintf(f, ",\"ranks\":[");
  int first = 1;
  int64_t now_ns = (int64_t)now.tv_sec * 1000000000LL + now.tv_nsec;
  for (int i = 0; i < ws->n; i++) {
    const agent_worker_t *w = &ws->w[i];
    if (!w->stats_file[0] || tdist_stats_read(w->stats_file, s) != TDIST_OK) continue;
    fprintf(f,
            "%s{\"rank\":%d,\"local_rank\":%d,\"pid\":%d,\"last_seq\":%" PRIu64 ",\"in_flight\":",
            first ? "" : ",", s->rank, w->local_rank, s->pid, s->last_seq);
    first = 0;
    if (s->cur_seq)
      fprintf(f, "{\"op\":\"%s\",\"seq\":%" PRIu64 ",\"peer\":%d,\"seconds\":%.3f}",
              tdist_stats_op_name(s->cur_op), s->cur_seq, s->cur_peer,
              (double)(now_ns - s->cur_start_ns) / 1e9);
    else
      fprintf(f, "null");
    fprintf(f, ",\"flight\":[");
    /* Oldest first: the ring holds entries flight_next-FLIGHT .. flight_next-1. */
    uint64_t end = s->flight_next, begin = end > TDIST_STATS_FLIGHT ? end - TDIST_STATS_FLIGHT : 0;
    int firste = 1;
    for (uint64_t k = begin; k < end; k++) {
      const tdist_stats_flight_t *e = &s->flight[k % TDIST_STATS_FLIGHT];
      if (!e->seq) continue;
      fprintf(f,
              "%s{\"seq\":%" PRIu64 ",\"op\":\"%s\",\"group\":%d,\"peer\":%d,\"bytes\":%" PRIu64
              ",\"start_unix\":%.6f,\"duration_s\":",
              firste ? "" : ",", e->seq, tdist_stats_op_name(e->op), e->group, e->peer, e->bytes,
              (double)e->start_ns / 1e9);
      firste = 0;
      if (e->end_ns)
        fprintf(f, "%.6f,\"status\":\"%s\"}", (double)(e->end_ns - e->start_ns) / 1e9,
                tdist_status_name((tdist_status_t)e->status));
      else
        fprintf(f, "null,\"status\":\"in_flight\"}");
    }
    fprintf(f, "]}");
  }
  fprintf(f, "]}\n");
  free(s);
  if (fclose(f)) {
    snprintf(err, cap, "cannot write %s: %s", path_out, strerror(errno));
    return -1;
  }
  return 0;
}
