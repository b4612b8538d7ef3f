/* /metrics and /status parts built from the workers' statistics files (include/tdist/stats.h):
 * per local rank, counters and a latency histogram per collective type, the collective in flight
 * and the last completed sequence number. Only collective types a rank has used are written,
 * which keeps the series count proportional to what the job does. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <tdist/stats.h>

#include "operator-agent/http/buf.h"
#include "operator-agent/http/ranks.h"

typedef struct {
  int local_rank, global_rank, ok;
  char path[512];
  tdist_stats_file_t f;
} rank_t;

/* Reads every local rank's file; returns the array (free it) and *n. */
static rank_t *read_ranks(agent_state_t *st, int *n) {
  agent_state_lock(st);
  int nw = st->workers ? st->nworkers : 0;
  rank_t *r = nw ? calloc((size_t)nw, sizeof *r) : NULL;
  for (int i = 0; r && i < nw; i++) {
    r[i].local_rank = st->workers[i].local_rank;
    r[i].global_rank = st->workers[i].global_rank;
    memcpy(r[i].path, st->workers[i].stats_file, sizeof r[i].path);
  }
  agent_state_unlock(st);
  *n = r ? nw : 0;
  for (int i = 0; i < *n; i++)
    r[i].ok = r[i].path[0] && tdist_stats_read(r[i].path, &r[i].f) == TDIST_OK;
  return r;
}

static int64_t now_unix_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void labels(agent_buf_t *b, const rank_t *r, const char *op) {
  agent_buf_printf(b, "{rank=\"%d\",local_rank=\"%d\"", r->global_rank, r->local_rank);
  if (op) agent_buf_printf(b, ",op=\"%s\"", op);
}

static void counter_family(agent_buf_t *b, const rank_t *r, int n, const char *name,
                           const char *help, size_t offset) {
  agent_buf_printf(b, "# HELP %s %s\n# TYPE %s counter\n", name, help, name);
  for (int i = 0; i < n; i++) {
    if (!r[i].ok) continue;
    const uint64_t *v = (const uint64_t *)((const char *)&r[i].f + offset);
    for (int op = 0; op < TDIST_STATS_OPS; op++) {
      if (!r[i].f.ops[op] && !v[op]) continue;
      agent_buf_puts(b, name);
      labels(b, &r[i], tdist_stats_op_name(op));
      agent_buf_printf(b, "} %" PRIu64 "\n", v[op]);
    }
  }
}

void agent_metrics_render_ranks(agent_buf_t *b, agent_state_t *st) {
  int n;
  rank_t *r = read_ranks(st, &n);
  int any = 0;
  for (int i = 0; i < n; i++) any |= r[i].ok;
  if (!any) {
    free(r);
    return;
  }
  counter_family(b, r, n, "tdist_collective_ops_total", "Collectives completed, per rank and type.",
                 offsetof(tdist_stats_file_t, ops));
  counter_family(b, r, n, "tdist_collective_bytes_total",
                 "Bytes this rank contributed to collectives, per type.",
                 offsetof(tdist_stats_file_t, bytes));
  counter_family(b, r, n, "tdist_collective_errors_total", "Collectives that failed, per type.",
                 offsetof(tdist_stats_file_t, errors));
  const char *h = "tdist_collective_duration_seconds";
  agent_buf_printf(b, "# HELP %s Time in collectives, per rank and type.\n# TYPE %s histogram\n", h,
                   h);
  for (int i = 0; i < n; i++) {
    if (!r[i].ok) continue;
    for (int op = 0; op < TDIST_STATS_OPS; op++) {
      if (!r[i].f.ops[op]) continue;
      uint64_t cum = 0;
      for (int k = 0; k <= TDIST_STATS_BUCKETS; k++) {
        cum += r[i].f.hist[op][k];
        agent_buf_printf(b, "%s_bucket", h);
        labels(b, &r[i], tdist_stats_op_name(op));
        if (k < TDIST_STATS_BUCKETS) {
          agent_buf_puts(b, ",le=\"");
          agent_buf_double(b, tdist_stats_bucket_le(k));
          agent_buf_printf(b, "\"} %" PRIu64 "\n", cum);
        } else {
          agent_buf_printf(b, ",le=\"+Inf\"} %" PRIu64 "\n", cum);
        }
      }
      agent_buf_printf(b, "%s_sum", h);
      labels(b, &r[i], tdist_stats_op_name(op));
      agent_buf_puts(b, "} ");
      agent_buf_double(b, (double)r[i].f.duration_ns_sum[op] / 1e9);
      agent_buf_printf(b, "\n%s_count", h);
      labels(b, &r[i], tdist_stats_op_name(op));
      agent_buf_printf(b, "} %" PRIu64 "\n", cum);
    }
  }
  int64_t now = now_unix_ns();
  agent_buf_puts(b,
                 "# HELP tdist_rank_inflight_seconds How long the rank has been in its current "
                 "collective (0 = not in one).\n# TYPE tdist_rank_inflight_seconds gauge\n");
  for (int i = 0; i < n; i++) {
    if (!r[i].ok) continue;
    double age =
        r[i].f.cur_seq && r[i].f.cur_start_ns ? (double)(now - r[i].f.cur_start_ns) / 1e9 : 0;
    agent_buf_puts(b, "tdist_rank_inflight_seconds");
    labels(b, &r[i], NULL);
    agent_buf_puts(b, "} ");
    agent_buf_double(b, age < 0 ? 0 : age);
    agent_buf_puts(b, "\n");
  }
  agent_buf_puts(b,
                 "# HELP tdist_rank_current_seq Sequence number of the collective in flight "
                 "(0 = none).\n# TYPE tdist_rank_current_seq gauge\n");
  for (int i = 0; i < n; i++) {
    if (!r[i].ok) continue;
    agent_buf_puts(b, "tdist_rank_current_seq");
    labels(b, &r[i], NULL);
    agent_buf_printf(b, "} %" PRIu64 "\n", r[i].f.cur_seq);
  }
  agent_buf_puts(b,
                 "# HELP tdist_rank_last_seq Sequence number of the last completed collective "
                 "of the world group.\n# TYPE tdist_rank_last_seq gauge\n");
  for (int i = 0; i < n; i++) {
    if (!r[i].ok) continue;
    agent_buf_puts(b, "tdist_rank_last_seq");
    labels(b, &r[i], NULL);
    agent_buf_printf(b, "} %" PRIu64 "\n", r[i].f.last_seq);
  }
  free(r);
}

void agent_status_render_ranks(agent_buf_t *b, agent_state_t *st) {
  int n;
  rank_t *r = read_ranks(st, &n);
  int64_t now = now_unix_ns();
  agent_buf_puts(b, "\"ranks\":[");
  int first = 1;
  for (int i = 0; i < n; i++) {
    if (!r[i].ok) continue;
    agent_buf_printf(b, "%s{\"rank\":%d,\"local_rank\":%d,\"last_seq\":%" PRIu64 ",\"in_flight\":",
                     first ? "" : ",", r[i].global_rank, r[i].local_rank, r[i].f.last_seq);
    first = 0;
    if (r[i].f.cur_seq) {
      agent_buf_printf(b, "{\"op\":\"%s\",\"seq\":%" PRIu64 ",\"peer\":%d,\"seconds\":",
                       tdist_stats_op_name(r[i].f.cur_op), r[i].f.cur_seq, r[i].f.cur_peer);
      agent_buf_double(b, (double)(now - r[i].f.cur_start_ns) / 1e9);
      agent_buf_puts(b, "}}");
    } else {
      agent_buf_puts(b, "null}");
    }
  }
  agent_buf_puts(b, "],\"collectives\":");
  agent_state_lock(st);
  if (st->progress_summary[0])
    agent_buf_json_str(b, st->progress_summary, sizeof st->progress_summary);
  else
    agent_buf_puts(b, "null");
  agent_state_unlock(st);
  free(r);
}
