/* /metrics: the agent's state in the Prometheus text format 0.0.4 (k8s-conventions §4).
 *
 * Every family is written as one group: HELP, TYPE, then its samples; names use base units and
 * counters end in _total. The state is copied out under the lock (a few hundred bytes) and
 * rendered after, so the main loop never waits on /proc reads or formatting. No pod/namespace
 * labels (service discovery adds them) and no timestamps. A value that cannot be read is left
 * out, never written as NaN. */
#include <dirent.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include <tdist/store.h>
#include <tdist/version.h>

#include "operator-agent/http/buf.h"
#include "operator-agent/http/http.h"
#include "operator-agent/http/ranks.h"

#ifndef TDIST_GIT_REVISION
#define TDIST_GIT_REVISION "unknown"
#endif

#define NSTATES AGENT_NSTATES

typedef struct {
  agent_run_state_t state;
  int node_rank, group_rank, group_world_size, world_size, nproc_per_node;
  int restart_count, max_restarts;
  int is_store_host, spares, standbys, standbys_live;
  int64_t round;
  uint64_t workers[AGENT_WORKER_NSTATES];
  uint64_t worker_exits[3];
  uint64_t restarts[AGENT_RESTART_NREASONS];
  uint64_t rdzv_total, rdzv_failures;
  uint64_t rdzv_bucket[AGENT_RDZV_BUCKETS + 1];
  double rdzv_sum_s, last_rdzv_unix;
  uint64_t dns_failures, store_reconnects;
  int have_store, have_worker_store;
  tdist_store_server_stats_t store, worker_store;
} snapshot_t;

static void take_snapshot(agent_state_t *st, snapshot_t *s) {
  memset(s, 0, sizeof *s);
  agent_state_lock(st);
  s->state = st->state;
  s->node_rank = st->node_rank;
  s->group_rank = st->group_rank;
  s->group_world_size = st->group_world_size;
  s->world_size = st->world_size;
  s->nproc_per_node = st->nproc_per_node;
  s->restart_count = st->restart_count;
  s->max_restarts = st->max_restarts;
  s->round = st->round;
  s->is_store_host = st->is_store_host;
  s->spares = st->spares;
  s->standbys = st->nstandbys;
  s->standbys_live = st->standbys_live;
  for (int i = 0; st->workers && i < st->nworkers; i++) {
    unsigned ws = (unsigned)st->workers[i].state;
    if (ws < AGENT_WORKER_NSTATES) s->workers[ws]++;
  }
  memcpy(s->worker_exits, st->worker_exits_total, sizeof s->worker_exits);
  memcpy(s->restarts, st->restarts_total, sizeof s->restarts);
  s->rdzv_total = st->rendezvous_total;
  s->rdzv_failures = st->rendezvous_failures_total;
  memcpy(s->rdzv_bucket, st->rdzv_bucket, sizeof s->rdzv_bucket);
  s->rdzv_sum_s = st->rdzv_duration_sum_s;
  s->last_rdzv_unix = st->last_rendezvous_unix;
  s->dns_failures = st->dns_resolve_failures_total;
  s->store_reconnects = st->store_reconnects_total;
  /* The server's stats are atomics; read them while the pointer is known to be alive. */
  if (st->store_server) {
    s->have_store = 1;
    tdist_store_server_stats(st->store_server, &s->store);
  }
  if (st->worker_store_server) {
    s->have_worker_store = 1;
    tdist_store_server_stats(st->worker_store_server, &s->worker_store);
  }
  agent_state_unlock(st);
}

static void family(agent_buf_t *b, const char *name, const char *type, const char *help) {
  agent_buf_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void gauge_i(agent_buf_t *b, const char *name, const char *help, int64_t v) {
  family(b, name, "gauge", help);
  agent_buf_printf(b, "%s %" PRId64 "\n", name, v);
}

static void gauge_u(agent_buf_t *b, const char *name, const char *help, uint64_t v) {
  family(b, name, "gauge", help);
  agent_buf_printf(b, "%s %" PRIu64 "\n", name, v);
}

static void counter_u(agent_buf_t *b, const char *name, const char *help, uint64_t v) {
  family(b, name, "counter", help);
  agent_buf_printf(b, "%s %" PRIu64 "\n", name, v);
}

/* ---- process_* from /proc/self ----------------------------------------------------------- */

typedef struct {
  int have_stat, have_start, have_fds, have_max_fds;
  double cpu_s, start_unix;
  uint64_t vsize, rss_bytes, threads, open_fds, max_fds;
} proc_t;

static int read_file(const char *path, char *buf, size_t cap) {
  FILE *f = fopen(path, "re");
  if (!f) return -1;
  size_t n = fread(buf, 1, cap - 1, f);
  fclose(f);
  buf[n] = '\0';
  return (int)n;
}

static void read_proc(proc_t *p) {
  memset(p, 0, sizeof *p);
  long tck = sysconf(_SC_CLK_TCK);
  long page = sysconf(_SC_PAGESIZE);
  char buf[4096];

  /* Fields after "(comm)" — comm may contain spaces and parentheses, so start at the last ')'.
   * Counting from field 3 (state): utime 14, stime 15, num_threads 20, starttime 22, vsize 23,
   * rss 24 (proc(5)). */
  if (tck > 0 && page > 0 && read_file("/proc/self/stat", buf, sizeof buf) > 0) {
    char *r = strrchr(buf, ')');
    unsigned long long f[25] = {0};
    int got = 0;
    if (r) {
      char *save = NULL;
      int field = 3;
      for (char *tok = strtok_r(r + 1, " \n", &save); tok && field <= 24;
           tok = strtok_r(NULL, " \n", &save), field++) {
        if (field >= 14) {
          f[field] = strtoull(tok, NULL, 10);
          got = field;
        }
      }
    }
    if (got == 24) {
      p->have_stat = 1;
      p->cpu_s = (double)(f[14] + f[15]) / (double)tck;
      p->threads = f[20];
      p->vsize = f[23];
      p->rss_bytes = f[24] * (unsigned long long)page;
      /* btime comes after a line per CPU, often past the first 4 KiB: read line by line. */
      FILE *fs = fopen("/proc/stat", "re");
      char line[512];
      unsigned long long btime = 0;
      while (fs && fgets(line, sizeof line, fs))
        if (sscanf(line, "btime %llu", &btime) == 1) break;
      if (fs) fclose(fs);
      if (btime > 0) {
        p->have_start = 1;
        p->start_unix = (double)btime + (double)f[22] / (double)tck;
      }
    }
  }

  DIR *d = opendir("/proc/self/fd");
  if (d) {
    int self = dirfd(d);
    uint64_t n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
      if (e->d_name[0] == '.') continue;
      if (atoi(e->d_name) == self) continue; /* the descriptor of this listing */
      n++;
    }
    closedir(d);
    p->have_fds = 1;
    p->open_fds = n;
  }

  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) {
    p->have_max_fds = 1;
    p->max_fds = (uint64_t)rl.rlim_cur;
  }
}

static void render_process(agent_buf_t *b) {
  proc_t p;
  read_proc(&p);
  if (p.have_stat) {
    family(b, "process_cpu_seconds_total", "counter",
           "Total user and system CPU time spent in seconds.");
    agent_buf_puts(b, "process_cpu_seconds_total ");
    agent_buf_double(b, p.cpu_s);
    agent_buf_puts(b, "\n");
  }
  if (p.have_fds) {
    family(b, "process_open_fds", "gauge", "Number of open file descriptors.");
    agent_buf_printf(b, "process_open_fds %" PRIu64 "\n", p.open_fds);
  }
  if (p.have_max_fds) {
    family(b, "process_max_fds", "gauge", "Maximum number of open file descriptors.");
    agent_buf_printf(b, "process_max_fds %" PRIu64 "\n", p.max_fds);
  }
  if (p.have_stat) {
    family(b, "process_virtual_memory_bytes", "gauge", "Virtual memory size in bytes.");
    agent_buf_printf(b, "process_virtual_memory_bytes %" PRIu64 "\n", p.vsize);
    family(b, "process_resident_memory_bytes", "gauge", "Resident memory size in bytes.");
    agent_buf_printf(b, "process_resident_memory_bytes %" PRIu64 "\n", p.rss_bytes);
  }
  if (p.have_start) {
    family(b, "process_start_time_seconds", "gauge",
           "Start time of the process since unix epoch in seconds.");
    agent_buf_puts(b, "process_start_time_seconds ");
    agent_buf_double(b, p.start_unix);
    agent_buf_puts(b, "\n");
  }
  if (p.have_stat) {
    family(b, "process_threads", "gauge", "Number of OS threads in the process.");
    agent_buf_printf(b, "process_threads %" PRIu64 "\n", p.threads);
  }
}

/* ---- tdist_* -------------------------------------------------------------------------------- */

static void render_agent(agent_buf_t *b, const snapshot_t *s) {
  family(b, "tdist_build_info", "gauge",
         "Build information of tdist-agent; the value is always 1.");
  agent_buf_puts(b, "tdist_build_info{version=\"");
  agent_buf_prom_label(b, tdist_version());
  agent_buf_puts(b, "\",revision=\"");
  agent_buf_prom_label(b, TDIST_GIT_REVISION);
  agent_buf_puts(b, "\"} 1\n");

  family(b, "tdist_agent_state", "gauge",
         "Current state of the agent: 1 for the current state, 0 for the others.");
  for (int i = 0; i < NSTATES; i++)
    agent_buf_printf(b, "tdist_agent_state{state=\"%s\"} %d\n",
                     agent_run_state_name((agent_run_state_t)i), (int)s->state == i);

  gauge_i(b, "tdist_node_rank", "Rank of this node (pod) in the job; -1 until known.",
          s->node_rank);
  gauge_i(b, "tdist_group_rank", "Rank of this node in the current round; -1 before one.",
          s->group_rank);
  gauge_i(b, "tdist_group_world_size", "Number of nodes in the current rendezvous round.",
          s->group_world_size);
  gauge_i(b, "tdist_world_size", "Number of workers (processes) in the current round, all nodes.",
          s->world_size);
  gauge_i(b, "tdist_nproc_per_node", "Number of workers this agent runs.", s->nproc_per_node);
  gauge_i(b, "tdist_rendezvous_round", "Current rendezvous round; -1 before the first.", s->round);
  /* Not "tdist_restart_count": promtool's lint reserves _count for histograms and summaries. */
  gauge_i(b, "tdist_restart_attempt",
          "Restart attempt of the running workers (their TORCHELASTIC_RESTART_COUNT).",
          s->restart_count);
  gauge_i(b, "tdist_max_restarts", "Restarts allowed before the agent gives up.", s->max_restarts);
  gauge_i(b, "tdist_spares", "Warm spare pods configured (--spares).", s->spares);
  if (s->is_store_host) {
    /* Only node 0 follows the standbys (the other nodes would report a stale 0). */
    gauge_i(b, "tdist_standbys",
            "Node 0: standby agents of the current round that still heartbeat (ready to take a "
            "lost member's place).",
            s->standbys_live);
  }

  family(b, "tdist_workers", "gauge", "Number of local workers in each state.");
  for (int i = 0; i < AGENT_WORKER_NSTATES; i++)
    agent_buf_printf(b, "tdist_workers{state=\"%s\"} %" PRIu64 "\n",
                     agent_worker_state_name((agent_worker_state_t)i), s->workers[i]);

  static const char *const code_class[3] = {"zero", "nonzero", "signal"};
  family(b, "tdist_worker_exits_total", "counter",
         "Local worker exits by class: exit code zero, non-zero exit code, killed by a signal.");
  for (int i = 0; i < 3; i++)
    agent_buf_printf(b, "tdist_worker_exits_total{code_class=\"%s\"} %" PRIu64 "\n", code_class[i],
                     s->worker_exits[i]);

  family(b, "tdist_restarts_total", "counter", "Worker group restarts by reason.");
  for (int i = 0; i < AGENT_RESTART_NREASONS; i++)
    agent_buf_printf(b, "tdist_restarts_total{reason=\"%s\"} %" PRIu64 "\n",
                     agent_restart_reason_name((agent_restart_reason_t)i), s->restarts[i]);

  counter_u(b, "tdist_rendezvous_total", "Rendezvous rounds completed.", s->rdzv_total);
  counter_u(b, "tdist_rendezvous_failures_total", "Rendezvous attempts that failed.",
            s->rdzv_failures);

  family(b, "tdist_rendezvous_duration_seconds", "histogram",
         "Time from joining a rendezvous to its completion, in seconds.");
  uint64_t cum = 0;
  for (int i = 0; i < AGENT_RDZV_BUCKETS; i++) {
    cum += s->rdzv_bucket[i];
    agent_buf_puts(b, "tdist_rendezvous_duration_seconds_bucket{le=\"");
    agent_buf_double(b, agent_rdzv_bucket_le[i]);
    agent_buf_printf(b, "\"} %" PRIu64 "\n", cum);
  }
  cum += s->rdzv_bucket[AGENT_RDZV_BUCKETS];
  agent_buf_printf(b, "tdist_rendezvous_duration_seconds_bucket{le=\"+Inf\"} %" PRIu64 "\n", cum);
  agent_buf_puts(b, "tdist_rendezvous_duration_seconds_sum ");
  agent_buf_double(b, s->rdzv_sum_s);
  agent_buf_printf(b, "\ntdist_rendezvous_duration_seconds_count %" PRIu64 "\n", cum);

  if (s->last_rdzv_unix > 0) {
    family(b, "tdist_last_rendezvous_timestamp_seconds", "gauge",
           "Unix time at which the last rendezvous round completed.");
    agent_buf_puts(b, "tdist_last_rendezvous_timestamp_seconds ");
    agent_buf_double(b, s->last_rdzv_unix);
    agent_buf_puts(b, "\n");
  }

  counter_u(b, "tdist_dns_resolve_failures_total", "Failed DNS lookups of peers or the store host.",
            s->dns_failures);
  counter_u(b, "tdist_store_reconnects_total", "Reconnections of this agent's store client.",
            s->store_reconnects);

  if (s->have_store) {
    counter_u(b, "tdist_store_requests_total", "Requests executed by the store this agent hosts.",
              s->store.requests_total);
    counter_u(b, "tdist_store_connections_total", "Connections accepted by the hosted store.",
              s->store.connections_total);
    gauge_u(b, "tdist_store_clients", "Open connections to the hosted store.",
            s->store.connections_open);
    counter_u(b, "tdist_store_connections_dropped_total",
              "Connections the hosted store closed for a protocol error or a limit.",
              s->store.connections_dropped);
    gauge_u(b, "tdist_store_keys", "Keys in the hosted store.", s->store.keys);
    gauge_u(b, "tdist_store_waits_pending", "WAIT requests the hosted store has not answered yet.",
            s->store.waits_pending);
  }
  if (s->have_worker_store) {
    /* A fresh store per round (attempt isolation): its counters start again, so gauges only. */
    gauge_u(b, "tdist_worker_store_clients",
            "Open connections to the workers' store of the current round (node 0).",
            s->worker_store.connections_open);
    gauge_u(b, "tdist_worker_store_keys",
            "Keys in the workers' store of the current round (node 0).", s->worker_store.keys);
  }
}

char *agent_metrics_render(agent_state_t *st, size_t *len) {
  snapshot_t s;
  take_snapshot(st, &s);
  agent_buf_t b;
  agent_buf_init(&b);
  render_agent(&b, &s);
  agent_metrics_render_ranks(&b, st);
  agent_metrics_render_procs(&b, st);
  render_process(&b);
  return agent_buf_finish(&b, len);
}
