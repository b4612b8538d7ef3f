/* scale_agents: M emulated tdist-agents doing a full rendezvous round against one job's store,
 * through the agent's own rendezvous code (operator-agent/rendezvous, the calls the agent makes:
 * agent_rdzv_join, agent_rdzv_join_poll with agent_rdzv_wait_closed between polls,
 * agent_rdzv_monitor for heartbeats), each agent with its own store connection, spread over
 * several processes (each a loop over its agents: the calls are the agent's, the threads are not).
 *
 *   scale_agents --host H --port P --agents M [--procs K] [--nproc N] [--hold-s S]
 *                [--heartbeat-s I] [--run-id ID] [--timeout-s T]
 *
 * Node rank 0 (process 0) is the store host: its record carries the workers' store port, as the
 * real store host's does. All agents connect first; then, from a common start, every agent joins
 * round 0 and polls until it is a member. Then every agent runs its monitor for S seconds
 * (heartbeats every I seconds; the leader watches every member's, the others the leader's), as
 * agents do while their workers train.
 *
 * Checked: every agent is a member; group ranks 0..M-1 each once; world size M*N; each agent's
 * rank base is its group rank times N; the store host has group rank 0; no monitor call ends the
 * round (no heartbeat missed) while held; every agent read the members' records while held.
 * Prints one line per process and a summary (key=value): joined_s (all joined), members_s (all
 * members: the round time, what every agent needs to start its workers), tables and tables_s (how
 * many agents had read the members' records, <r>/table/<C>, and when the last did: each does it
 * on its first monitor call, after the round), monitor sweep times. Exit 0 when every check passed,
 * 1 otherwise. Asserts nothing about speed. */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <tdist/store.h>
#include <tdist/tdist.h>

#include "operator-agent/rendezvous/rdzv.h"

typedef struct {
  const char *host, *run_id;
  int port, agents, procs, nproc;
  double hold_s, heartbeat_s, timeout_s;
} opts_t;

typedef struct {
  tdist_store_t *client, *store;
  agent_rdzv_t r;
  int member, table; /* table: its first monitor call read the members' records */
} emu_t;

/* What a process reports to the parent (one write on its pipe). */
typedef struct {
  int n, members, errors, dup_ranks, bad_world, bad_base, host_rank0, tables;
  int64_t joined_ns, members_ns; /* CLOCK_MONOTONIC when its last agent joined / became member */
  int64_t tables_ns; /* ... when its last agent had read the members' records (while held) */
  int64_t rank_sum;
  int64_t monitor_calls, monitor_ended;
  double sweep_max_s, sweep_mean_s;
  char err[256];
} report_t;

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void usage(void) {
  fprintf(stderr,
          "usage: scale_agents --host H --port P --agents M [--procs K] [--nproc N] "
          "[--hold-s S] [--heartbeat-s I] [--run-id ID] [--timeout-s T]\n");
  exit(2);
}

static void parse(int argc, char **argv, opts_t *o) {
  *o = (opts_t){"127.0.0.1", "scale", 0, 0, 2, 8, 3.0, 1.0, 120.0};
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!v) usage();
    if (!strcmp(a, "--host"))
      o->host = v;
    else if (!strcmp(a, "--port"))
      o->port = atoi(v);
    else if (!strcmp(a, "--agents"))
      o->agents = atoi(v);
    else if (!strcmp(a, "--procs"))
      o->procs = atoi(v);
    else if (!strcmp(a, "--nproc"))
      o->nproc = atoi(v);
    else if (!strcmp(a, "--hold-s"))
      o->hold_s = atof(v);
    else if (!strcmp(a, "--heartbeat-s"))
      o->heartbeat_s = atof(v);
    else if (!strcmp(a, "--run-id"))
      o->run_id = v;
    else if (!strcmp(a, "--timeout-s"))
      o->timeout_s = atof(v);
    else
      usage();
    i++;
  }
  if (o->port <= 0 || o->port > 65535 || o->agents < 1 || o->procs < 1 || o->nproc < 1 ||
      o->heartbeat_s <= 0 || o->hold_s < 0 || o->timeout_s <= 0) {
    fprintf(stderr,
            "scale_agents: --port 1..65535, --agents >= 1, --procs >= 1, --nproc >= 1, "
            "--heartbeat-s > 0, --hold-s >= 0, --timeout-s > 0\n");
    exit(2);
  }
  if (o->procs > o->agents) o->procs = o->agents;
}

static int setup(const opts_t *o, emu_t *e, int node_rank, char *err, size_t cap) {
  tdist_tcp_store_options_t so = TDIST_TCP_STORE_OPTIONS_INIT;
  so.host = o->host;
  so.port = o->port;
  so.timeout_ms = (int64_t)(o->timeout_s * 1000);
  char prefix[160];
  snprintf(prefix, sizeof prefix, "tdist/%s", o->run_id);
  if (tdist_tcp_store_connect(&so, &e->client) != TDIST_OK ||
      tdist_prefix_store_create(e->client, prefix, &e->store) != TDIST_OK) {
    snprintf(err, cap, "agent %d: connect: %s", node_rank, tdist_last_error());
    return -1;
  }
  agent_rdzv_t *r = &e->r;
  agent_rdzv_init(r);
  r->store = e->store;
  r->nnodes_min = r->nnodes_max = o->agents;
  r->heartbeat_interval_s = o->heartbeat_s;
  r->heartbeat_timeout_s = o->heartbeat_s * 10 + o->timeout_s; /* a slow sweep is not a loss */
  r->node_rank = node_rank;
  r->nproc = o->nproc;
  r->host_rank = 0;
  snprintf(r->addr, sizeof r->addr, "10.%d.%d.%d", node_rank >> 16 & 255, node_rank >> 8 & 255,
           node_rank & 255);
  snprintf(r->host, sizeof r->host, "agent-%d", node_rank);
  r->worker_port = node_rank == 0 ? 29501 : 0;
  return 0;
}

/* Joins and polls every agent of this process until each is a member (or an error). */
static void join_all(emu_t *e, int n, report_t *rep, int64_t deadline) {
  for (int i = 0; i < n; i++) {
    agent_rdzv_result_t res = agent_rdzv_join(&e[i].r, 0, 0, 0);
    if (res != AGENT_RDZV_PENDING) {
      rep->errors++;
      snprintf(rep->err, sizeof rep->err, "join: %s %.200s", agent_rdzv_result_name(res),
               e[i].r.err);
    }
  }
  rep->joined_ns = now_ns();
  int left = n - rep->errors;
  while (left > 0 && now_ns() < deadline) {
    int first_pending = -1;
    for (int i = 0; i < n; i++) {
      if (e[i].member || e[i].r.idx == 0) continue;
      agent_rdzv_result_t res = agent_rdzv_join_poll(&e[i].r, now_ns());
      if (res == AGENT_RDZV_MEMBER) {
        e[i].member = 1;
        left--;
      } else if (res == AGENT_RDZV_PENDING) {
        if (first_pending < 0) first_pending = i;
      } else {
        rep->errors++;
        left--;
        e[i].r.idx = 0;
        snprintf(rep->err, sizeof rep->err, "join_poll: %s %.200s", agent_rdzv_result_name(res),
                 e[i].r.err);
      }
    }
    /* as the agent does between polls: a WAIT on <r>/closed, which returns when it is set */
    if (first_pending >= 0) agent_rdzv_wait_closed(&e[first_pending].r, 100);
  }
  rep->members_ns = now_ns();
}

static void check_members(const opts_t *o, emu_t *e, int n, report_t *rep) {
  char *seen = calloc((size_t)o->agents, 1);
  for (int i = 0; i < n; i++) {
    if (!e[i].member) continue;
    agent_rdzv_t *r = &e[i].r;
    rep->members++;
    rep->rank_sum += r->group_rank;
    if (r->group_rank < 0 || r->group_rank >= o->agents || seen[r->group_rank]++) rep->dup_ranks++;
    if (r->world_size != o->agents * o->nproc) rep->bad_world++;
    if (r->rank_base != r->group_rank * o->nproc) rep->bad_base++;
    if (r->node_rank == 0 && r->group_rank == 0) rep->host_rank0 = 1;
  }
  free(seen);
}

/* Monitor polls for hold_s, sweep after sweep over this process's agents. */
static void hold(const opts_t *o, emu_t *e, int n, report_t *rep) {
  int64_t end = now_ns() + (int64_t)(o->hold_s * 1e9);
  double sum = 0;
  int sweeps = 0;
  while (now_ns() < end) {
    int64_t t0 = now_ns();
    for (int i = 0; i < n; i++) {
      if (!e[i].member) continue;
      agent_rdzv_result_t res = agent_rdzv_monitor(&e[i].r, now_ns());
      rep->monitor_calls++;
      if (!e[i].table && e[i].r.members) {
        e[i].table = 1;
        rep->tables++;
        rep->tables_ns = now_ns();
      }
      if (res == AGENT_RDZV_ENDED)
        rep->monitor_ended++;
      else if (res != AGENT_RDZV_PENDING) {
        rep->errors++;
        snprintf(rep->err, sizeof rep->err, "monitor: %s %.200s", agent_rdzv_result_name(res),
                 e[i].r.err);
      }
    }
    double s = (double)(now_ns() - t0) / 1e9;
    sum += s;
    sweeps++;
    if (s > rep->sweep_max_s) rep->sweep_max_s = s;
    struct timespec ts = {0, 50 * 1000000L}; /* the agent's monitor interval order */
    nanosleep(&ts, NULL);
  }
  rep->sweep_mean_s = sweeps ? sum / sweeps : 0;
}

/* Process p: agents p, p + K, p + 2K, ... Waits for the go byte after connecting them all. */
static void child(const opts_t *o, int p, int ready_fd, int go_fd, int out_fd) {
  report_t rep;
  memset(&rep, 0, sizeof rep);
  int n = 0;
  for (int a = p; a < o->agents; a += o->procs) n++;
  emu_t *e = calloc((size_t)n, sizeof *e);
  int ok = e != NULL;
  for (int i = 0; ok && i < n; i++)
    ok = !setup(o, &e[i], p + i * o->procs, rep.err, sizeof rep.err);
  rep.n = n;
  char c = ok ? 'y' : 'n';
  if (write(ready_fd, &c, 1) != 1 || read(go_fd, &c, 1) != 1) _exit(3);
  if (ok) {
    join_all(e, n, &rep, now_ns() + (int64_t)(o->timeout_s * 1e9));
    check_members(o, e, n, &rep);
    hold(o, e, n, &rep);
  } else {
    rep.errors = n;
  }
  if (write(out_fd, &rep, sizeof rep) != (ssize_t)sizeof rep) _exit(3);
  _exit(0); /* the connections close with the process */
}

int main(int argc, char **argv) {
  opts_t o;
  parse(argc, argv, &o);
  struct rlimit rl;
  if (!getrlimit(RLIMIT_NOFILE, &rl)) {
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
  }
  int ready[2], go[2], out[2];
  if (pipe(ready) || pipe(go) || pipe(out)) return 1;
  pid_t *pids = calloc((size_t)o.procs, sizeof *pids);
  for (int p = 0; p < o.procs; p++) {
    pids[p] = fork();
    if (pids[p] == 0) child(&o, p, ready[1], go[0], out[1]);
  }
  int all_ok = 1;
  for (int p = 0; p < o.procs; p++) {
    char c = 0;
    if (read(ready[0], &c, 1) != 1 || c != 'y') all_ok = 0;
  }
  int64_t t0 = now_ns();
  char go_bytes[1024];
  memset(go_bytes, 'g', sizeof go_bytes);
  for (int left = o.procs; left > 0;) {
    int k = left < (int)sizeof go_bytes ? left : (int)sizeof go_bytes;
    if (write(go[1], go_bytes, (size_t)k) != k) return 1;
    left -= k;
  }
  report_t sum;
  memset(&sum, 0, sizeof sum);
  int64_t joined = 0, members = 0, tables = 0;
  for (int p = 0; p < o.procs; p++) {
    report_t r;
    if (read(out[0], &r, sizeof r) != (ssize_t)sizeof r) {
      all_ok = 0;
      continue;
    }
    printf(
        "process: agents=%d members=%d errors=%d joined_s=%.3f members_s=%.3f tables=%d "
        "tables_s=%.3f monitor_calls=%" PRId64 " sweep_mean_s=%.4f sweep_max_s=%.4f%s%s\n",
        r.n, r.members, r.errors, (double)(r.joined_ns - t0) / 1e9,
        (double)(r.members_ns - t0) / 1e9, r.tables, (double)(r.tables_ns - t0) / 1e9,
        r.monitor_calls, r.sweep_mean_s, r.sweep_max_s, r.err[0] ? " last_error=" : "", r.err);
    sum.members += r.members;
    sum.tables += r.tables;
    if (r.tables_ns - t0 > tables) tables = r.tables_ns - t0;
    sum.errors += r.errors;
    sum.dup_ranks += r.dup_ranks;
    sum.bad_world += r.bad_world;
    sum.bad_base += r.bad_base;
    sum.host_rank0 |= r.host_rank0;
    sum.rank_sum += r.rank_sum;
    sum.monitor_calls += r.monitor_calls;
    sum.monitor_ended += r.monitor_ended;
    if (r.sweep_max_s > sum.sweep_max_s) sum.sweep_max_s = r.sweep_max_s;
    if (r.joined_ns - t0 > joined) joined = r.joined_ns - t0;
    if (r.members_ns - t0 > members) members = r.members_ns - t0;
  }
  for (int p = 0; p < o.procs; p++) waitpid(pids[p], NULL, 0);
  int64_t m = o.agents;
  int ok = all_ok && sum.members == o.agents && !sum.errors && !sum.dup_ranks && !sum.bad_world &&
           !sum.bad_base && sum.host_rank0 && sum.rank_sum == m * (m - 1) / 2 &&
           !sum.monitor_ended && (o.hold_s <= 0 || sum.tables == o.agents);
  printf(
      "agents=%d members=%d errors=%d joined_s=%.3f members_s=%.3f tables=%d tables_s=%.3f "
      "monitor_calls=%" PRId64 " monitor_ended=%" PRId64 " sweep_max_s=%.4f checks=%s failed=%d\n",
      o.agents, sum.members, sum.errors, (double)joined / 1e9, (double)members / 1e9, sum.tables,
      (double)tables / 1e9, sum.monitor_calls, sum.monitor_ended, sum.sweep_max_s,
      ok ? "ok" : "FAILED", !ok);
  if (!ok)
    fprintf(stderr,
            "scale_agents: members %d of %d, errors %d, duplicate group ranks %d, wrong world "
            "size %d, wrong rank base %d, store host rank 0: %s, rounds ended while held %" PRId64
            ", records read by %d\n",
            sum.members, o.agents, sum.errors, sum.dup_ranks, sum.bad_world, sum.bad_base,
            sum.host_rank0 ? "yes" : "no", sum.monitor_ended, sum.tables);
  free(pids);
  return ok ? 0 : 1;
}
