/* tdist-agent: the in-pod launcher. One thread runs everything below as a polling loop over a
 * signalfd (SIGCHLD and the forwarded signals) with the store calls bounded by short timeouts;
 * libmicrohttpd serves /healthz, /readyz, /metrics and /status from its own thread, reading
 * agent_state_t under its lock; node rank 0 also runs the store server thread.
 *
 * Life of an agent: config -> node rank -> HTTP -> (node 0) store server -> reach the store ->
 * rendezvous round r -> start workers -> watch them, the round and the peers -> on success the
 * exit barrier and exit 0; on a failure anywhere stop the workers, count the restart and join
 * round r+1, or give up with the exit code --help documents. */
#define _GNU_SOURCE
#include <errno.h>
#include <netdb.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <tdist/status.h>
#include <tdist/store.h>
#include <tdist/version.h>

#include "operator-agent/common/log.h"
#include "operator-agent/config/config.h"
#include "operator-agent/discovery/discovery.h"
#include "operator-agent/http/http.h"
#include "operator-agent/pmix/pmix.h"
#include "operator-agent/rendezvous/rdzv.h"
#include "operator-agent/state/state.h"
#include "operator-agent/supervisor/guard.h"
#include "operator-agent/supervisor/progress.h"
#include "operator-agent/supervisor/rootcause.h"
#include "operator-agent/supervisor/rundir.h"
#include "operator-agent/supervisor/workers.h"
#include "runtime/common/param.h"

/* Exit codes (also in --help). */
enum {
  EXIT_USAGE = 64,       /* bad flags, env or YAML */
  EXIT_UNAVAILABLE = 69, /* rendezvous / master not reachable within --rdzv-timeout */
  EXIT_PEER_FAILED = 70, /* the job failed on another node; restarts exhausted */
  EXIT_INTERNAL = 71
};

#define STORE_OP_TIMEOUT_MS 5000 /* below /healthz's 10 s staleness limit */

typedef struct {
  agent_cfg_t cfg;
  agent_state_t st;
  agent_http_t *http;
  tdist_store_server_t *server;        /* the store host: the agents' store (--master-port) */
  tdist_store_server_t *worker_server; /* the store host: the workers' store of its last round */
  tdist_store_t *client, *store;       /* TCP client and its "tdist/<run_id>" prefix view */
  agent_rdzv_t rd;
  agent_workers_t ws;
  int sfd;
  pid_t guard_pid; /* the parent that kills what the agent leaves (guard.h); 0: none */
  int node_rank;
  char master_name[256]; /* what we resolve (DNS name or address); node 0: unused */
  char master_ip[64];    /* the store host as workers reach it */
  int master_port;
  /* Store failover (with --spares): the store is hosted by pod 0 (host 0) or, once pod 0 is
   * lost, by the backup host, pod nnodes_max (host 1, the first spare's pod). See
   * store_failover_setup. nhosts 1: pod 0 only. */
  int nhosts;
  int host_rank[2];            /* node ranks of the hosts */
  char host_name[2][256];      /* their DNS names */
  int host_idx;                /* the host whose store is in use (or being reached) */
  int hosting;                 /* this agent hosts the store in use: a->server runs */
  int64_t next_probe_ns;       /* a waiting store host's next look at the other host */
  int moved_from;              /* node rank of the store host lost since the last connect, or -1 */
  char run_dir[400];           /* "" until created */
  int run_dir_has_dump;        /* a flight-recorder dump was written there: keep it */
  int stop_sig;                /* a terminating signal arrived */
  int exec_failed;             /* the worker command could not be started (exit 127 if final) */
  int dump_requested;          /* SIGUSR1: dump the flight recorders */
  char last_stall_shape[1024]; /* the stall last logged, without its duration */
  int64_t next_progress_ns;
  int64_t next_round;
  int attempt, failures;
  char last_error[512];
  int backoff_ms;          /* the last wait after a failed rendezvous (0: none since success) */
  char err_last[700];      /* rdzv_error_log: the last text logged, */
  int64_t err_repeats;     /* how often it came again since, */
  int64_t err_next_log_ns; /* and when it may be logged again */
  int abort_code;          /* ROUND_ABORTED: the exit code (the rank's MPI_Abort status) */
  agent_pmix_t *pmix;      /* --backend mpi: the PMIx server of the workers (pmix.h) */
} agent_t;

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void set_state(agent_t *a, agent_run_state_t s) {
  agent_state_lock(&a->st);
  a->st.state = s;
  agent_state_unlock(&a->st);
}

/* Copies src into dst (cap bytes), truncating; always NUL-terminated. */
static void copy_str(char *dst, size_t cap, const char *src) {
  size_t n = strlen(src);
  if (n >= cap) n = cap - 1;
  memcpy(dst, src, n);
  dst[n] = 0;
}

static void set_error(agent_t *a, const char *msg) {
  copy_str(a->last_error, sizeof a->last_error, msg);
  agent_state_lock(&a->st);
  copy_str(a->st.last_error, sizeof a->st.last_error, msg);
  agent_state_unlock(&a->st);
}

/* Waits up to timeout_ms for a signal. Reaps children on SIGCHLD; forwards HUP/USR2 to the
 * workers; records TERM/INT/QUIT in a->stop_sig (and forwards them too); SIGUSR1 asks for a
 * flight-recorder dump and goes to the workers that handle it. Stamps the liveness tick read by
 * /healthz. */
static void wait_events(agent_t *a, int timeout_ms) {
  struct pollfd pfd = {a->sfd, POLLIN, 0};
  int r = poll(&pfd, 1, timeout_ms < 0 ? 0 : timeout_ms);
  if (r > 0) {
    struct signalfd_siginfo si;
    while (read(a->sfd, &si, sizeof si) == (ssize_t)sizeof si) {
      int sig = (int)si.ssi_signo;
      if (sig == SIGCHLD) continue;
      if (sig == SIGTERM || sig == SIGINT || sig == SIGQUIT) {
        if (!a->stop_sig) {
          if (sig == SIGTERM && agent_guard_gone(a->guard_pid))
            AGENT_WARN("the guard process (pid %d) is gone: stopping the workers and exiting",
                       (int)a->guard_pid);
          else
            AGENT_WARN("received %s: stopping the workers and exiting with %d", strsignal(sig),
                       128 + sig);
          a->stop_sig = sig;
        }
      } else if (sig == SIGUSR1) {
        /* Forwarded only to the workers that handle it: its default action would kill every
         * other one (unmodified PyTorch scripts among them). */
        a->dump_requested = 1;
        int n = agent_workers_signal_handlers(&a->ws, sig);
        AGENT_INFO(
            "SIGUSR1: dumping the flight recorders; forwarded to %d of %d worker(s) "
            "(those with a SIGUSR1 handler)",
            n, agent_workers_running(&a->ws));
        continue;
      } else {
        AGENT_INFO("forwarding %s to the workers", strsignal(sig));
      }
      agent_workers_signal(&a->ws, sig);
    }
  }
  if (agent_workers_reap(&a->ws) > 0) agent_workers_publish(&a->ws, &a->st);
  agent_state_lock(&a->st);
  a->st.loop_tick_ns = now_ns();
  agent_state_unlock(&a->st);
}

/* "3" or "2:4". */
static const char *nnodes_str(const agent_cfg_t *c, char *buf, size_t cap) {
  if (c->nnodes_min == c->nnodes_max)
    snprintf(buf, cap, "%d", c->nnodes_min);
  else
    snprintf(buf, cap, "%d:%d", c->nnodes_min, c->nnodes_max);
  return buf;
}

static int poll_ms(const agent_t *a) {
  int ms = (int)(a->cfg.monitor_interval_s * 1000);
  return ms < 1 ? 1 : ms;
}

/* Stops the workers: sig to every process group (unless wait_events already forwarded it) and
 * SIGCONT, SIGKILL after the grace period; then SIGKILL to every process the workers left outside
 * their groups (setsid, double fork: the agent's children now, as a subreaper or PID 1), so none
 * outlives its attempt. */
static void stop_workers(agent_t *a, int sig, int already_sent) {
  if (agent_workers_running(&a->ws)) {
    set_state(a, AGENT_STATE_STOPPING);
    agent_workers_mark_stopping(&a->ws);
    if (!already_sent) agent_workers_signal(&a->ws, sig);
    /* A stopped worker (SIGSTOP, a debugger) acts on sig only once continued (as systemd does). */
    agent_workers_signal(&a->ws, SIGCONT);
    int64_t deadline = now_ns() + (int64_t)(a->cfg.stop_grace_s * 1e9);
    while (agent_workers_running(&a->ws) && now_ns() < deadline) wait_events(a, 50);
    if (agent_workers_running(&a->ws)) {
      AGENT_WARN("%d worker(s) still running %.1f s after %s: sending SIGKILL",
                 agent_workers_running(&a->ws), a->cfg.stop_grace_s, strsignal(sig));
      agent_workers_signal(&a->ws, SIGKILL);
      deadline = now_ns() + 10000000000LL;
      while (agent_workers_running(&a->ws) && now_ns() < deadline) wait_events(a, 50);
    }
  }
  int left = 0;
  int n = agent_workers_kill_all(&a->ws, now_ns() + 10000000000LL, &left);
  if (n) AGENT_INFO("killed %d process(es) the workers left outside their process groups", n);
  if (left > 0)
    AGENT_WARN("%d child process(es) still alive 10 s after SIGKILL", left);
  else if (left < 0)
    AGENT_WARN(
        "cannot list the agent's children (/proc is not mounted for its pid namespace): "
        "processes the workers left outside their process groups may outlive them");
  agent_workers_publish(&a->ws, &a->st);
  agent_pmix_job_end(a->pmix); /* its ranks are gone: their shared memory goes too */
}

static void drop_store(agent_t *a) {
  tdist_store_destroy(a->store);
  tdist_store_destroy(a->client);
  a->store = a->client = NULL;
  a->rd.store = NULL;
}

static int cancel_cb(void *arg) {
  agent_t *a = arg;
  wait_events(a, 0);
  return a->stop_sig != 0;
}

/* The store op timeout: a store silent for the heartbeat timeout is as lost as a silent member
 * (so a lost store host is noticed as fast), never more than STORE_OP_TIMEOUT_MS. */
static int store_op_timeout_ms(const agent_t *a) {
  double ms = a->cfg.heartbeat_timeout_s * 1000;
  if (ms < 1000) ms = 1000;
  return ms < STORE_OP_TIMEOUT_MS ? (int)ms : STORE_OP_TIMEOUT_MS;
}

/* This agent starts hosting the store: its server on --master-port (kept if running). 0 ok. */
static int host_start(agent_t *a) {
  if (!a->server) {
    tdist_store_server_options_t so = TDIST_STORE_SERVER_OPTIONS_INIT;
    so.host = a->cfg.standalone ? "127.0.0.1" : NULL;
    so.port = a->cfg.master_port;
    if (tdist_store_server_create(&so, &a->server) != TDIST_OK) {
      char msg[400];
      snprintf(msg, sizeof msg,
               "cannot start the store on port %d: %s (choose another --master-port)",
               a->cfg.master_port, tdist_last_error());
      AGENT_ERROR("%s", msg);
      set_error(a, msg);
      return -1;
    }
    a->master_port = tdist_store_server_port(a->server);
    AGENT_INFO("store listening on %s:%d", a->cfg.standalone ? "127.0.0.1" : "[::]",
               a->master_port);
  }
  a->hosting = 1;
  agent_state_lock(&a->st);
  a->st.store_server = a->server;
  a->st.is_store_host = 1;
  agent_state_unlock(&a->st);
  return 0;
}

/* This agent stops hosting: its servers go, and with them every connection to them. */
static void host_stop(agent_t *a) {
  agent_state_lock(&a->st);
  a->st.store_server = a->st.worker_store_server = NULL;
  a->st.is_store_host = 0;
  agent_state_unlock(&a->st);
  tdist_store_server_destroy(a->worker_server);
  tdist_store_server_destroy(a->server);
  a->worker_server = a->server = NULL;
  a->hosting = 0;
  a->master_port = a->cfg.master_port;
}

/* The current round of a store: its number, how many agents joined it, whether it closed. */
typedef struct {
  int64_t round, joined;
  int closed;
} store_round_t;

/* Reads store_round_t from a store prefixed "tdist/<run_id>/" (prefix "" for a->store, whose view
 * has it already). 0, or -1 when the store fails or holds no round. */
static int read_store_round(agent_t *a, tdist_store_t *c, const char *prefix, store_round_t *out) {
  char key[400], num[32];
  void *v = NULL;
  size_t len = 0;
  int ready = 0;
  const char *keys[1] = {key};
  snprintf(key, sizeof key, "%sround", prefix);
  if (tdist_store_check(c, keys, 1, &ready) != TDIST_OK || !ready ||
      tdist_store_get(c, key, &v, &len) != TDIST_OK)
    return -1;
  int bad = len >= sizeof num;
  if (!bad) {
    memcpy(num, v, len);
    num[len] = 0;
    bad = agent_rdzv_parse_int(num, 0, AGENT_RDZV_MAX_ROUND, &out->round) != 0;
  }
  tdist_free(v);
  if (bad) return -1;
  snprintf(key, sizeof key, "%s%" PRId64 "/joined", prefix, out->round);
  if (tdist_store_add(c, key, 0, &out->joined) != TDIST_OK) return -1;
  snprintf(key, sizeof key, "%s%" PRId64 "/closed", prefix, out->round);
  if (tdist_store_check(c, keys, 1, &ready) != TDIST_OK) return -1;
  out->closed = ready;
  (void)a;
  return 0;
}

/* Host idx's store, asked with short timeouts: -1 unreachable (no server there: that pod does not
 * host) or holding no round of this job, else 0 with its current round in *out. */
static int probe_host(agent_t *a, int idx, store_round_t *out) {
  tdist_tcp_store_options_t o = TDIST_TCP_STORE_OPTIONS_INIT;
  o.host = a->host_name[idx]; /* resolved by the client, once, without the retries and logs */
  o.port = a->cfg.master_port;
  o.connect_timeout_ms = 200; /* a pod that does not host refuses at once */
  o.timeout_ms = 1000;
  o.dialect = TDIST_STORE_DIALECT_V2;
  tdist_store_t *c = NULL;
  if (tdist_tcp_store_connect(&o, &c) != TDIST_OK) return -1;
  char prefix[300];
  snprintf(prefix, sizeof prefix, "tdist/%s/", a->cfg.run_id);
  int r = read_store_round(a, c, prefix, out);
  tdist_store_destroy(c);
  return r;
}

/* Reaches the store of host a->host_idx: this agent's own server over loopback when it is that
 * host (starting it), else the host by name with retries until the deadline, or, with a second
 * host to try, until this one's window has passed. 0 ok, -1 timed
 * out (message logged), -2 stopped by a signal, -3 the window passed: try the other host. */
static int connect_store(agent_t *a, int64_t deadline_ns) {
  char err[512];
  const char *host;
  int idx = a->host_idx;
  int64_t until = deadline_ns, window = 0;
  a->rd.host_rank = a->host_rank[idx];
  if (a->host_rank[idx] == a->node_rank) {
    if (host_start(a)) return -1;
    host = "127.0.0.1";
  } else {
    if (a->hosting) host_stop(a);
    if (a->nhosts == 2) {
      /* Long enough for the other host to notice the loss (a store op times out) and start. */
      window = (int64_t)(2 * a->cfg.heartbeat_timeout_s * 1e9);
      if (window < 5000000000LL) window = 5000000000LL;
      if (now_ns() + window < until) until = now_ns() + window;
    }
    agent_resolve_stats_t rs = {0, 0};
    int r = agent_resolve(a->host_name[idx], a->master_port, 1, until / 1000000, cancel_cb, a,
                          a->master_ip, sizeof a->master_ip, &rs, err, sizeof err);
    agent_state_lock(&a->st);
    a->st.dns_resolve_failures_total += rs.failures;
    agent_state_unlock(&a->st);
    if (r == -2) return -2;
    if (r && until < deadline_ns) return -3;
    if (r) {
      AGENT_ERROR("cannot reach the store host: %s", err);
      set_error(a, err);
      return -1;
    }
    host = a->master_ip;
  }
  for (;;) {
    tdist_tcp_store_options_t o = TDIST_TCP_STORE_OPTIONS_INIT;
    o.host = host;
    o.port = a->master_port;
    o.connect_timeout_ms = 2000;
    o.timeout_ms = store_op_timeout_ms(a);
    o.dialect = TDIST_STORE_DIALECT_V2;
    tdist_status_t st = tdist_tcp_store_connect(&o, &a->client);
    if (st == TDIST_OK) break;
    if (now_ns() >= until) {
      if (until < deadline_ns) return -3;
      snprintf(err, sizeof err, "cannot connect to the store at %s:%d: %s", host, a->master_port,
               tdist_last_error());
      AGENT_ERROR("%s", err);
      set_error(a, err);
      return -1;
    }
    wait_events(a, 100); /* a refused connect returns at once: do not spin */
    if (a->stop_sig) return -2;
  }
  char prefix[300];
  snprintf(prefix, sizeof prefix, "tdist/%s", a->cfg.run_id);
  if (tdist_prefix_store_create(a->client, prefix, &a->store) != TDIST_OK) {
    drop_store(a);
    return -1;
  }
  a->rd.store = a->store;
  if (!a->hosting) {
    agent_local_ip(a->master_ip, a->rd.addr, sizeof a->rd.addr);
  } else {
    /* The host's workers reach the store the way the user named it (torchrun passes
     * --master-addr through), else by this pod's address: never by loopback in a multi-node
     * job, since a backend may advertise the address it used to reach the store. */
    if (a->cfg.standalone)
      snprintf(a->rd.addr, sizeof a->rd.addr, "127.0.0.1");
    else
      agent_local_ip(NULL, a->rd.addr, sizeof a->rd.addr);
    copy_str(a->master_ip, sizeof a->master_ip,
             a->cfg.master_addr ? a->cfg.master_addr : a->rd.addr);
  }
  agent_state_lock(&a->st);
  snprintf(a->st.master_addr, sizeof a->st.master_addr, "%s", a->master_ip);
  a->st.master_port = a->master_port;
  agent_state_unlock(&a->st);
  return 0;
}

/* With a backup host, the agents move to the other host's store: when theirs was lost (lost: pod
 * 0's lost means pod 0 is gone, its agent hosts the store in its own process; the lost host is
 * carried over as gone) or the other did not answer within its window. */
static void switch_host(agent_t *a, int lost) {
  if (a->nhosts < 2) return;
  int from = a->host_idx;
  a->host_idx ^= 1;
  a->backoff_ms = 0;
  if (lost) a->moved_from = a->host_rank[from];
  AGENT_WARN("store host pod %d (%s) %s: moving to the store of pod %d (%s)%s", a->host_rank[from],
             a->host_name[from], lost ? "was lost" : "is not reachable", a->host_rank[a->host_idx],
             a->host_name[a->host_idx],
             a->host_rank[a->host_idx] == a->node_rank ? ", which this agent hosts" : "");
}

/* Connects to the store, alternating between the hosts (one window each) until the deadline. */
static int reach_store(agent_t *a, int64_t deadline_ns) {
  for (;;) {
    int r = connect_store(a, deadline_ns);
    if (r != -3) return r;
    switch_host(a, 0);
  }
}

static void publish_round(agent_t *a) {
  agent_state_lock(&a->st);
  a->st.worker_master_port = a->rd.worker_store_port;
  a->st.round = a->rd.round;
  a->st.group_rank = a->rd.group_rank;
  a->st.group_world_size = (int)a->rd.nmembers;
  a->st.world_size = a->rd.world_size;
  a->st.restart_count = a->rd.attempt;
  agent_member_info_t *m = calloc((size_t)(a->rd.nmembers ? a->rd.nmembers : 1), sizeof *m);
  if (m) {
    for (int64_t i = 0; i < a->rd.nmembers; i++) {
      m[i].node_rank = a->rd.members[i].node_rank;
      m[i].group_rank = (int)i;
      snprintf(m[i].addr, sizeof m[i].addr, "%s", a->rd.members[i].addr);
      snprintf(m[i].host, sizeof m[i].host, "%s", a->rd.members[i].host);
    }
    free(a->st.members);
    a->st.members = m;
    a->st.nmembers = (int)a->rd.nmembers;
  }
  agent_state_unlock(&a->st);
}

/* Joins round >= a->next_round. The store host first starts a fresh, empty store for that round's
 * workers and names its port in its record (see rdzv.h: attempt isolation); the previous round's
 * store goes once the new one is published (that round's workers here are stopped by now, and
 * those left on other nodes only lose a store they are about to be stopped for). 0 ok, -1 the
 * agents' store failed (a->rd.err), -2 no workers' store could be started (logged). */
static int join_round(agent_t *a) {
  tdist_store_server_t *old = a->worker_server, *fresh = NULL;
  if (a->server) {
    tdist_store_server_options_t so = TDIST_STORE_SERVER_OPTIONS_INIT;
    so.host = a->cfg.standalone ? "127.0.0.1" : NULL;
    so.port = 0;
    if (tdist_store_server_create(&so, &fresh) != TDIST_OK) {
      char msg[400];
      snprintf(msg, sizeof msg, "cannot start the workers' store for the next round: %s",
               tdist_last_error());
      AGENT_ERROR("%s", msg);
      set_error(a, msg);
      return -2;
    }
    a->rd.worker_port = tdist_store_server_port(fresh);
  }
  agent_rdzv_result_t res = agent_rdzv_join(&a->rd, a->next_round, a->attempt, a->failures);
  if (a->server) {
    if (res < 0) {
      tdist_store_server_destroy(fresh); /* the old one stays: nobody was told of the new one */
      a->rd.worker_port = old ? tdist_store_server_port(old) : 0;
      return res == AGENT_RDZV_STORE_ERROR ? -1 : -3;
    }
    agent_state_lock(&a->st);
    a->st.worker_store_server = fresh;
    agent_state_unlock(&a->st);
    a->worker_server = fresh;
    tdist_store_server_destroy(old);
    AGENT_DEBUG("workers' store of round %" PRId64 " on port %d", a->rd.round, a->rd.worker_port);
  }
  return res < 0 ? (res == AGENT_RDZV_STORE_ERROR ? -1 : -3) : 0;
}

/* RDZV_STORE_LOST: the store failed (reconnect); RDZV_BAD_RECORD: a record no agent writes, or
 * out of memory (a->rd.err says which; the connection is fine). */
typedef enum {
  RDZV_OK,
  RDZV_STORE_LOST,
  RDZV_TIMEOUT,
  RDZV_STOPPED,
  RDZV_FATAL,
  RDZV_BAD_RECORD,
  RDZV_JOB_DONE,   /* standby: every member finished */
  RDZV_JOB_FAILED, /* the job gave up (a standby, or an agent that arrived after) */
  RDZV_YIELD       /* this store host gave way to the other host, which runs the job */
} rdzv_outcome_t;

static rdzv_outcome_t join_outcome(int jr) {
  return jr == -2 ? RDZV_FATAL : jr == -3 ? RDZV_BAD_RECORD : RDZV_STORE_LOST;
}

/* The store host: the round's standbys into /status and /metrics. */
static void publish_standbys(agent_t *a) {
  if (!a->hosting) return;
  agent_member_info_t *m = calloc((size_t)a->rd.nstandby + 1, sizeof *m);
  if (!m) return;
  for (int i = 0; i < a->rd.nstandby; i++) {
    m[i].node_rank = a->rd.standby[i].node_rank;
    m[i].group_rank = -1;
    snprintf(m[i].addr, sizeof m[i].addr, "%s", a->rd.standby[i].addr);
    snprintf(m[i].host, sizeof m[i].host, "%s", a->rd.standby[i].host);
  }
  agent_state_lock(&a->st);
  free(a->st.standbys);
  a->st.standbys = m;
  a->st.nstandbys = a->rd.nstandby;
  a->st.standbys_live = a->rd.nstandby_live;
  agent_state_unlock(&a->st);
}

/* A standby: this agent waits in a closed round without workers (see rdzv.h). */
static void publish_standby(agent_t *a) {
  agent_state_lock(&a->st);
  a->st.state = AGENT_STATE_STANDBY;
  a->st.round = a->rd.round;
  a->st.group_rank = -1;
  a->st.group_world_size = (int)a->rd.closed_n;
  a->st.world_size = 0;
  a->st.worker_master_port = 0;
  free(a->st.members);
  a->st.members = NULL;
  a->st.nmembers = 0;
  agent_state_unlock(&a->st);
}

/* A store host whose round has not closed within a second looks at the other host, once a
 * second (a round that closes at once, as in a recovery, pays nothing for it). Two stores host
 * the job when pod 0's replacement starts after the agents moved to the backup host (it hosts a
 * store of its own until it finds the job there), or in a race (it came up while they were
 * moving, or the backup host alone lost pod 0 for a moment). This one gives way when the other's
 * current round has closed (the job runs there), or is a later round (the agents that moved
 * carried the job's round number; a replacement pod 0 starts at 0), or the same round with more
 * agents, or as many and this is the backup host. Giving way stops this agent's server, so the
 * agents connected to it move on too. 1: give way (host_idx already switched). */
static int should_yield(agent_t *a) {
  a->next_probe_ns = now_ns() + 1000000000LL;
  int other = a->host_idx ^ 1;
  store_round_t them = {0, 0, 0}, us = {0, 0, 0};
  if (probe_host(a, other, &them) || read_store_round(a, a->store, "", &us)) return 0;
  int yield = them.closed || them.round > us.round ||
              (them.round == us.round &&
               (them.joined > us.joined || (them.joined == us.joined && a->host_idx == 1)));
  if (!yield) return 0;
  AGENT_WARN("pod %d (%s) %s: this agent stops hosting the store and moves there",
             a->host_rank[other], a->host_name[other],
             them.closed ? "runs the job's current round" : "has the job's latest round");
  host_stop(a);
  a->host_idx = other;
  return 1;
}

/* Joins rounds until this agent is a member of one. A standby waits as long as its round runs:
 * *deadline_ns moves on while it does. */
static rdzv_outcome_t rendezvous(agent_t *a, int64_t *deadline) {
  set_state(a, AGENT_STATE_RENDEZVOUS);
  int64_t t0 = now_ns();
  a->next_probe_ns = t0 + 1000000000LL; /* should_yield: only a round that takes long */
  int jr = join_round(a);
  if (jr) return join_outcome(jr);
  agent_rdzv_result_t res;
  char nn[32];
  AGENT_INFO("joined rendezvous round %" PRId64 " (run id '%s'), waiting for %s node(s)",
             a->rd.round, a->cfg.run_id, nnodes_str(&a->cfg, nn, sizeof nn));
  int waiter_logged = 0;
  for (;;) {
    res = agent_rdzv_join_poll(&a->rd, now_ns());
    if (res == AGENT_RDZV_WAITER) {
      /* Closed without us: a standby until the round ends or the job does. */
      if (!waiter_logged) {
        AGENT_INFO("round %" PRId64 " closed with %" PRId64
                   " node(s) without this one: standby (no workers) until a member is lost or "
                   "the job ends",
                   a->rd.round, a->rd.closed_n);
        publish_standby(a);
        waiter_logged = 1;
      }
      res = agent_rdzv_standby_poll(&a->rd, now_ns());
      if (res == AGENT_RDZV_WAITER || res == AGENT_RDZV_PENDING) res = AGENT_RDZV_WAITER;
      *deadline = now_ns() + (int64_t)(a->cfg.rdzv_timeout_s * 1e9);
    }
    if (res == AGENT_RDZV_ALL_DONE) return RDZV_JOB_DONE;
    if (res == AGENT_RDZV_JOB_FAILED) return RDZV_JOB_FAILED;
    if (res < 0) return res == AGENT_RDZV_STORE_ERROR ? RDZV_STORE_LOST : RDZV_BAD_RECORD;
    if (res == AGENT_RDZV_MEMBER) break;
    if (res == AGENT_RDZV_ROUND_MOVED) {
      if (waiter_logged) set_state(a, AGENT_STATE_RENDEZVOUS);
      waiter_logged = 0;
      a->next_round = a->rd.round + 1;
      jr = join_round(a);
      if (jr) return join_outcome(jr);
    }
    if (a->hosting && a->nhosts == 2 && !waiter_logged && now_ns() >= a->next_probe_ns &&
        should_yield(a))
      return RDZV_YIELD;
    if (now_ns() >= *deadline) {
      char msg[300];
      snprintf(msg, sizeof msg,
               "rendezvous timed out after %.0f s in round %" PRId64
               " (need %d node(s); raise --rdzv-timeout or check that every pod started)",
               a->cfg.rdzv_timeout_s, a->rd.round, a->cfg.nnodes_min);
      AGENT_ERROR("%s", msg);
      set_error(a, msg);
      agent_state_lock(&a->st);
      a->st.rendezvous_failures_total++;
      agent_state_unlock(&a->st);
      return RDZV_TIMEOUT;
    }
    int ms = poll_ms(a) < 100 ? poll_ms(a) : 100;
    if (res == AGENT_RDZV_PENDING && !waiter_logged) {
      /* Not closed yet: wait on the key itself, then look at signals without waiting. */
      if (agent_rdzv_wait_closed(&a->rd, ms) < 0) return RDZV_STORE_LOST;
      ms = 0;
    }
    wait_events(a, ms);
    if (a->stop_sig) return RDZV_STOPPED;
  }
  double secs = (double)(now_ns() - t0) / 1e9;
  agent_state_lock(&a->st);
  agent_state_observe_rdzv(&a->st, secs);
  a->st.last_rendezvous_unix = (double)time(NULL);
  agent_state_unlock(&a->st);
  publish_round(a);
  AGENT_INFO("round %" PRId64 " complete in %.2f s: %" PRId64
             " node(s), group rank %d, world size %d, attempt %d, workers' store port %d",
             a->rd.round, secs, a->rd.nmembers, a->rd.group_rank, a->rd.world_size, a->rd.attempt,
             a->rd.worker_store_port);
  return RDZV_OK;
}

/* Logs the root cause of a local worker failure (rootcause.h) and returns a one-line summary.
 * Lets the other workers finish failing for a moment first: one failure usually brings the
 * other ranks down within milliseconds. */
static void describe_failure(agent_t *a, char *out, size_t cap) {
  int64_t until = now_ns() + 500000000LL;
  while (agent_workers_running(&a->ws) && now_ns() < until && !a->stop_sig) wait_events(a, 20);
  agent_root_cause_pick(&a->ws);
  agent_root_cause_describe(&a->ws, a->node_rank, out, cap);
}

static void dump_flight(agent_t *a, const char *why) {
  char path[600], err[300];
  if (agent_flight_dump(&a->ws, a->node_rank, a->rd.round, a->run_dir, why, path, sizeof path, err,
                        sizeof err))
    AGENT_WARN("flight recorder dump failed: %s", err);
  else {
    a->run_dir_has_dump = 1;
    AGENT_INFO("flight recorders of this node's ranks (%s) written to %s", why, path);
  }
}

/* Every second: publish where this node's ranks are; node 0 (group rank 0) summarises the job.
 * Best effort: a store error here is found again by the round monitor. */
static void publish_progress(agent_t *a) {
  int64_t now = now_ns();
  if (now < a->next_progress_ns) return;
  a->next_progress_ns = now + 1000000000LL;
  struct timespec rt;
  clock_gettime(CLOCK_REALTIME, &rt);
  char line[4096], key[96];
  agent_progress_local(&a->ws, (int64_t)rt.tv_sec * 1000000000LL + rt.tv_nsec, line, sizeof line);
  if (!line[0]) return;
  snprintf(key, sizeof key, "progress/%" PRId64 "/%d", a->rd.round, a->rd.group_rank);
  if (tdist_store_set(a->store, key, line, strlen(line)) != TDIST_OK || a->rd.group_rank != 0)
    return;
  size_t n = (size_t)a->rd.nmembers;
  char **lines = calloc(n, sizeof *lines);
  if (!lines) return;
  for (size_t g = 0; g < n; g++) {
    snprintf(key, sizeof key, "progress/%" PRId64 "/%zu", a->rd.round, g);
    const char *keys[1] = {key};
    int ready = 0;
    void *v = NULL;
    size_t len = 0;
    if (tdist_store_check(a->store, keys, 1, &ready) != TDIST_OK || !ready ||
        tdist_store_get(a->store, key, &v, &len) != TDIST_OK)
      continue;
    lines[g] = calloc(1, len + 1);
    if (lines[g]) memcpy(lines[g], v, len);
    tdist_free(v);
  }
  double stall_s = tdist__param_double(TDIST__P_STALL_REPORT_SECONDS); /* checked in main */
  char summary[1024];
  agent_progress_summarize((const char *const *)lines, n, stall_s > 0 ? stall_s : 5.0, summary,
                           sizeof summary);
  /* Ranks nobody reported (no statistics file yet, or a node that stopped publishing) cannot be
   * placed; when the job is stuck they are suspects, so name them. */
  int ws = a->rd.world_size;
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
    for (int r = 0; r < ws && len + 16 < sizeof summary; r++) {
      if (seen[r]) continue;
      len += (size_t)snprintf(summary + len, sizeof summary - len, "%s%d",
                              first ? "; no report from rank(s) " : ",", r);
      first = 0;
    }
  }
  free(seen);
  for (size_t g = 0; g < n; g++) free(lines[g]);
  free(lines);
  /* Log a stall once per shape (who is stuck where, who holds them up), not every second. */
  char shape[1024];
  copy_str(shape, sizeof shape, summary);
  char *f = strstr(shape, " for ");
  char *e = f ? strstr(f, " s") : NULL;
  if (f && e) memmove(f, e + 2, strlen(e + 2) + 1);
  if (strstr(summary, "stuck") && strcmp(shape, a->last_stall_shape))
    AGENT_WARN("collectives: %s", summary);
  copy_str(a->last_stall_shape, sizeof a->last_stall_shape, strstr(summary, "stuck") ? shape : "");
  agent_state_lock(&a->st);
  copy_str(a->st.progress_summary, sizeof a->st.progress_summary, summary);
  a->st.progress_unix = rt.tv_sec;
  agent_state_unlock(&a->st);
}

typedef enum {
  ROUND_SUCCEEDED,  /* every member done: exit 0 */
  ROUND_RESTART,    /* round ended: restart (rd.end_reason) */
  ROUND_STORE_LOST, /* store gone: reconnect, restart */
  ROUND_STOPPED,    /* a terminating signal */
  ROUND_ABORTED     /* a rank called MPI_Abort: the job ends (a->abort_code), no restart */
} round_outcome_t;

static void rdzv_error_log(agent_t *a, const char *msg);

static int pmix_env(void *ctx, int rank, char ***env, char *err, size_t cap) {
  return agent_pmix_worker_env(ctx, rank, env, err, cap);
}

/* --backend mpi: the round's job for the PMIx server (one namespace per round: a restart never
 * meets the last attempt's fences). */
static int pmix_job(agent_t *a, char *err, size_t cap) {
  int n = (int)a->rd.nmembers;
  int *nproc = calloc((size_t)n, sizeof *nproc);
  const char **hosts = calloc((size_t)n, sizeof *hosts);
  int rc = -1;
  if (!nproc || !hosts) {
    snprintf(err, cap, "out of memory describing the MPI job");
  } else {
    for (int i = 0; i < n; i++) {
      nproc[i] = a->rd.members[i].nproc;
      hosts[i] = a->rd.members[i].host;
    }
    char nspace[300], prefix[440], pub[400];
    snprintf(nspace, sizeof nspace, "tdist.%s.%" PRId64, a->cfg.run_id, a->rd.round);
    snprintf(pub, sizeof pub, "tdist/%s/pmix", a->cfg.run_id);
    snprintf(prefix, sizeof prefix, "%s/%" PRId64, pub, a->rd.round);
    agent_pmix_job_t j = {.nspace = nspace,
                          .world_size = a->rd.world_size,
                          .nnodes = n,
                          .node_id = a->rd.group_rank,
                          .node_nproc = nproc,
                          .hosts = hosts,
                          .store_host = a->hosting ? "127.0.0.1" : a->master_ip,
                          .store_port = a->master_port,
                          .store_prefix = prefix,
                          .publish_prefix = pub,
                          .timeout_s = a->cfg.rdzv_timeout_s,
                          .cmd = (const char *const *)a->cfg.cmd,
                          .ncmd = a->cfg.ncmd};
    rc = agent_pmix_job_start(a->pmix, &j, err, cap);
  }
  free(nproc);
  free(hosts);
  return rc;
}

/* A rank called PMIx_Abort (MPI_Abort), or (rank -1) the PMIx server refused what the job
 * needs (msg says what): the job ends on every node, as under mpirun. */
static round_outcome_t pmix_abort(agent_t *a, int rank, int status, const char *msg) {
  char text[800];
  if (!strcmp(msg, "N/A")) msg = ""; /* Open MPI's text when the program gave none */
  if (rank >= 0)
    snprintf(text, sizeof text,
             "rank %d called MPI_Abort (PMIx_Abort) with status %d%s%s: the job ends (an abort "
             "is not retried)",
             rank, status, msg[0] ? ": " : "", msg);
  else
    snprintf(text, sizeof text, "%s", msg);
  AGENT_ERROR("%s", text);
  set_error(a, text);
  a->abort_code = status > 0 && status < 256 ? status : 1;
  agent_rdzv_job_failed(&a->rd, text); /* before the end: the others rejoin and find it */
  if (agent_rdzv_end(&a->rd, AGENT_RESTART_WORKER_FAILED, text) < 0)
    AGENT_WARN("could not tell the other nodes: %s", a->rd.err);
  return ROUND_ABORTED;
}

/* Runs the workers of one round until it ends. */
static round_outcome_t run_round(agent_t *a, int *local_failed) {
  *local_failed = 0;
  char err[512];
  agent_worker_spec_t spec = {.cfg = &a->cfg,
                              .rank_base = a->rd.rank_base,
                              .world_size = a->rd.world_size,
                              .group_rank = a->rd.group_rank,
                              .group_world_size = (int)a->rd.nmembers,
                              .attempt = a->rd.attempt,
                              .master_addr = a->master_ip,
                              .master_port = a->rd.worker_store_port,
                              .run_dir = a->run_dir};
  if (a->pmix) {
    if (pmix_job(a, err, sizeof err)) {
      *local_failed = 1;
      if (agent_pmix_refused(a->pmix, err, sizeof err)) return pmix_abort(a, -1, 1, err);
      AGENT_ERROR("cannot start the MPI job's PMIx namespace: %s", err);
      set_error(a, err);
      if (agent_rdzv_end(&a->rd, AGENT_RESTART_WORKER_FAILED, err) < 0) return ROUND_STORE_LOST;
      return ROUND_RESTART;
    }
    spec.extra_env = pmix_env;
    spec.extra_env_free = agent_pmix_env_free;
    spec.extra_env_ctx = a->pmix;
  }
  if (agent_workers_start(&a->ws, &spec, err, sizeof err)) {
    AGENT_ERROR("%s", err);
    set_error(a, err);
    *local_failed = 1;
    a->exec_failed = 1;
    agent_workers_reap(&a->ws);
    if (agent_rdzv_end(&a->rd, AGENT_RESTART_WORKER_FAILED, err) < 0) return ROUND_STORE_LOST;
    return ROUND_RESTART;
  }
  agent_workers_publish(&a->ws, &a->st);
  set_state(a, AGENT_STATE_RUNNING);
  AGENT_INFO("started %d worker(s): global ranks %d..%d of %d, MASTER_ADDR=%s MASTER_PORT=%d",
             a->ws.n, a->rd.rank_base, a->rd.rank_base + a->ws.n - 1, a->rd.world_size,
             a->master_ip, a->rd.worker_store_port);
  int marked_done = 0;
  for (;;) {
    wait_events(a, poll_ms(a));
    if (a->stop_sig) return ROUND_STOPPED;
    if (a->dump_requested) {
      a->dump_requested = 0;
      dump_flight(a, "SIGUSR1");
    }
    int ab_rank, ab_status;
    char ab_msg[512];
    if (agent_pmix_aborted(a->pmix, &ab_rank, &ab_status, ab_msg, sizeof ab_msg)) {
      *local_failed = 1;
      return pmix_abort(a, ab_rank, ab_status, ab_msg);
    }
    if (agent_pmix_refused(a->pmix, ab_msg, sizeof ab_msg)) {
      *local_failed = 1;
      return pmix_abort(a, -1, 1, ab_msg);
    }
    if (a->ws.first_failed >= 0) {
      char what[400];
      describe_failure(a, what, sizeof what);
      dump_flight(a, "worker failed");
      set_error(a, what);
      *local_failed = 1;
      if (agent_rdzv_end(&a->rd, AGENT_RESTART_WORKER_FAILED, what) < 0) return ROUND_STORE_LOST;
      return ROUND_RESTART;
    }
    agent_rdzv_result_t res;
    if (agent_workers_all_succeeded(&a->ws)) {
      if (!marked_done)
        AGENT_INFO("all %d local worker(s) succeeded%s", a->ws.n,
                   a->rd.nmembers > 1 ? "; waiting for the other nodes" : "");
      res = agent_rdzv_done_poll(&a->rd, now_ns(), &marked_done);
      if (res == AGENT_RDZV_ALL_DONE) return ROUND_SUCCEEDED;
    } else {
      publish_progress(a);
      res = agent_rdzv_monitor(&a->rd, now_ns());
    }
    if (a->rd.nstandby != a->st.nstandbys || a->rd.nstandby_live != a->st.standbys_live)
      publish_standbys(a);
    if (res == AGENT_RDZV_NO_MEMORY) {
      rdzv_error_log(a, a->rd.err); /* transient: the next turn tries again */
      continue;
    }
    if (res == AGENT_RDZV_PROTOCOL_ERROR) {
      /* A record no agent of this job writes: fail this round once, with the record named. */
      char text[600];
      snprintf(text, sizeof text, "%s", a->rd.err);
      AGENT_ERROR("%s: ending round %" PRId64 " and restarting the workers", text, a->rd.round);
      set_error(a, text);
      if (agent_rdzv_end(&a->rd, AGENT_RESTART_PROTOCOL, text) == AGENT_RDZV_STORE_ERROR)
        return ROUND_STORE_LOST;
      return ROUND_RESTART;
    }
    if (res < 0) {
      AGENT_WARN("lost the store: %s", a->rd.err);
      set_error(a, a->rd.err);
      return ROUND_STORE_LOST;
    }
    if (res == AGENT_RDZV_ENDED) return ROUND_RESTART;
  }
}

/* The store host: before leaving, give the others a moment to read the outcome. */
static void linger_for_peers(agent_t *a) {
  if (!a->store) return;
  int64_t exited = 0;
  if (agent_rdzv_mark_exited(&a->rd, &exited) < 0 || !a->hosting) return;
  int64_t deadline = now_ns() + 10000000000LL, sb_exited = 0;
  while (exited < a->rd.nmembers && now_ns() < deadline && !a->stop_sig) {
    wait_events(a, 20);
    if (agent_rdzv_exited_count(&a->rd, &exited) < 0) break;
  }
  /* and for the standbys that heartbeat to see the outcome (they poll every 100 ms) */
  while (sb_exited < a->rd.nstandby_live && now_ns() < deadline && !a->stop_sig) {
    if (agent_rdzv_standby_exited(&a->rd, 0, &sb_exited) < 0) break;
    if (sb_exited < a->rd.nstandby_live) wait_events(a, 20);
  }
}

static int exit_code_of_local_failure(const agent_t *a) {
  if (a->exec_failed) return 127; /* like a shell's "command not found" */
  if (a->ws.first_failed < 0) return EXIT_PEER_FAILED;
  int c = a->ws.w[a->ws.first_failed].exit_code;
  return c < 0 ? 128 - c : (c > 0 && c < 256 ? c : 1);
}

/* Logs a rendezvous error at most once per RDZV_LOG_PERIOD_NS for the same text, with the number
 * of repeats in between: a hostile record must not flood the log. */
#define RDZV_LOG_PERIOD_NS 5000000000LL
static void rdzv_error_log(agent_t *a, const char *msg) {
  int64_t now = now_ns();
  if (!strcmp(msg, a->err_last) && now < a->err_next_log_ns) {
    a->err_repeats++;
    return;
  }
  if (a->err_repeats)
    AGENT_WARN("%s (%" PRId64 " more time(s) in the last %.0f s)", msg, a->err_repeats,
               RDZV_LOG_PERIOD_NS / 1e9);
  else
    AGENT_WARN("%s", msg);
  copy_str(a->err_last, sizeof a->err_last, msg);
  a->err_repeats = 0;
  a->err_next_log_ns = now + RDZV_LOG_PERIOD_NS;
}

/* Waits before the next try after a failed rendezvous: 100 ms doubling to RDZV_BACKOFF_MAX_MS,
 * never past the deadline, the signalfd watched all along. 1 if a terminating signal came. */
#define RDZV_BACKOFF_MAX_MS 5000
static int backoff(agent_t *a, int64_t deadline_ns) {
  a->backoff_ms = a->backoff_ms ? a->backoff_ms * 2 : 100;
  if (a->backoff_ms > RDZV_BACKOFF_MAX_MS) a->backoff_ms = RDZV_BACKOFF_MAX_MS;
  int64_t until = now_ns() + (int64_t)a->backoff_ms * 1000000;
  if (until > deadline_ns) until = deadline_ns;
  while (!a->stop_sig && now_ns() < until) wait_events(a, 100);
  return a->stop_sig != 0;
}

static int run(agent_t *a) {
  int64_t deadline = now_ns() + (int64_t)(a->cfg.rdzv_timeout_s * 1e9);
  for (;;) {
    if (!a->store) {
      set_state(a, AGENT_STATE_RENDEZVOUS);
      int r = reach_store(a, deadline);
      if (r == -2) return 128 + a->stop_sig;
      if (r) return EXIT_UNAVAILABLE;
      if (a->moved_from >= 0) {
        /* A store the job moves to: what the next round needs of the last one (a failure here
         * is met again by the rendezvous). */
        if (agent_rdzv_carry_over(&a->rd, a->moved_from) < 0)
          AGENT_WARN("carrying round %" PRId64 " over to the new store: %s", a->rd.carry_round,
                     a->rd.err);
        a->moved_from = -1;
      }
    }
    rdzv_outcome_t ro = rendezvous(a, &deadline);
    if (ro == RDZV_STOPPED) return 128 + a->stop_sig;
    if (ro == RDZV_JOB_DONE || ro == RDZV_JOB_FAILED) {
      int64_t ex = 0;
      if (ro == RDZV_JOB_DONE) {
        AGENT_INFO("every member of round %" PRId64 " finished: the job succeeded; this %s exits 0",
                   a->rd.round, a->rd.closed_n ? "standby" : "agent");
        set_state(a, AGENT_STATE_SUCCEEDED);
      } else {
        char msg[600];
        snprintf(msg, sizeof msg, "the job gave up: %s", a->rd.end_text);
        AGENT_ERROR("%s", msg);
        set_error(a, msg);
        set_state(a, AGENT_STATE_FAILED);
      }
      agent_rdzv_standby_exited(&a->rd, 1, &ex); /* node 0 waits for it before leaving */
      return ro == RDZV_JOB_DONE ? 0 : EXIT_PEER_FAILED;
    }
    if (ro == RDZV_TIMEOUT) return EXIT_UNAVAILABLE;
    if (ro == RDZV_FATAL) return EXIT_INTERNAL;
    if (ro == RDZV_YIELD) {
      drop_store(a);
      a->backoff_ms = 0;
      continue;
    }
    if (ro == RDZV_STORE_LOST || ro == RDZV_BAD_RECORD) {
      char msg[700];
      snprintf(msg, sizeof msg, "%s during rendezvous: %s; retrying until --rdzv-timeout",
               ro == RDZV_STORE_LOST ? "lost the store" : "bad rendezvous state", a->rd.err);
      rdzv_error_log(a, msg);
      set_error(a, a->rd.err);
      /* A bad record in round r spoils that round for everybody: retry in a fresh one (the
       * bound keeps round + 1 in range; join refuses a round past it). */
      if (ro == RDZV_BAD_RECORD && a->rd.round >= a->next_round) a->next_round = a->rd.round + 1;
      if (ro == RDZV_STORE_LOST) {
        drop_store(a);
        agent_state_lock(&a->st);
        a->st.store_reconnects_total++;
        agent_state_unlock(&a->st);
        if (!a->hosting) switch_host(a, 1);
      }
      if (backoff(a, deadline)) return 128 + a->stop_sig;
      if (now_ns() >= deadline) {
        AGENT_ERROR("giving up after --rdzv-timeout %.0f s: %s", a->cfg.rdzv_timeout_s, a->rd.err);
        set_state(a, AGENT_STATE_FAILED);
        return EXIT_UNAVAILABLE;
      }
      continue;
    }
    a->backoff_ms = 0;
    a->attempt = a->rd.attempt;
    a->failures = a->rd.failures;
    a->exec_failed = 0;
    int local_failed = 0;
    round_outcome_t out = run_round(a, &local_failed);
    if (out == ROUND_STOPPED) {
      char text[128];
      snprintf(text, sizeof text, "node %d was stopped by %s", a->node_rank,
               strsignal(a->stop_sig));
      if (a->store) {
        agent_rdzv_mark_gone(&a->rd, a->node_rank); /* the next round need not wait for us */
        agent_rdzv_end(&a->rd, AGENT_RESTART_PEER_LOST, text);
      }
      stop_workers(a, a->stop_sig, 1);
      return 128 + a->stop_sig;
    }
    if (out == ROUND_ABORTED) {
      stop_workers(a, SIGTERM, 0);
      set_state(a, AGENT_STATE_FAILED);
      linger_for_peers(a);
      return a->abort_code;
    }
    if (out == ROUND_SUCCEEDED) {
      set_state(a, AGENT_STATE_SUCCEEDED);
      AGENT_INFO("all %" PRId64 " node(s) finished: job succeeded", a->rd.nmembers);
      linger_for_peers(a);
      return 0;
    }
    agent_restart_reason_t reason;
    if (out == ROUND_STORE_LOST) {
      reason = AGENT_RESTART_STORE_LOST;
      char text[sizeof a->rd.end_text];
      copy_str(text, sizeof text, a->rd.err);
      copy_str(a->rd.end_text, sizeof a->rd.end_text, text);
    } else {
      reason = a->rd.end_reason;
    }
    if (!local_failed) {
      AGENT_WARN("round %" PRId64 " ended (%s): %s", a->rd.round, agent_restart_reason_name(reason),
                 a->rd.end_text);
      /* The failure came from elsewhere; a stopped rank here fails nothing itself but is likely
       * what the others timed out waiting for. */
      char stopped[256];
      int first;
      if (agent_root_cause_stopped(&a->ws, &first, stopped, sizeof stopped))
        AGENT_WARN(
            "stopped (SIGSTOP, or a debugger holds it) when the round ended: %s; the other ranks "
            "may have timed out waiting for it",
            stopped);
    }
    stop_workers(a, SIGTERM, 0);
    if (a->stop_sig) return 128 + a->stop_sig;
    int counts = reason != AGENT_RESTART_MEMBERSHIP;
    if (counts && a->rd.failures >= a->cfg.max_restarts) {
      char msg[600];
      snprintf(msg, sizeof msg, "giving up after %d restart(s) (--max-restarts %d): %s",
               a->rd.failures, a->cfg.max_restarts, a->rd.end_text);
      AGENT_ERROR("%s", msg);
      set_error(a, msg);
      set_state(a, AGENT_STATE_FAILED);
      if (out != ROUND_STORE_LOST) {
        agent_rdzv_job_failed(&a->rd, msg); /* standbys leave on it */
        linger_for_peers(a);
      }
      return local_failed ? exit_code_of_local_failure(a) : EXIT_PEER_FAILED;
    }
    agent_state_lock(&a->st);
    a->st.restarts_total[reason]++;
    agent_state_unlock(&a->st);
    if (counts) a->failures = a->rd.failures + 1;
    a->attempt = a->rd.attempt + 1;
    a->next_round = a->rd.round + 1;
    AGENT_INFO("restarting the workers (attempt %d, %d of %d restarts used)", a->attempt,
               a->failures, a->cfg.max_restarts);
    if (out == ROUND_STORE_LOST) {
      drop_store(a);
      agent_state_lock(&a->st);
      a->st.store_reconnects_total++;
      agent_state_unlock(&a->st);
      if (!a->hosting) switch_host(a, 1);
    }
    deadline = now_ns() + (int64_t)(a->cfg.rdzv_timeout_s * 1e9);
  }
}

/* --http-host must be a numeric address (http.c binds without DNS): checked before anything
 * starts, and by --check-config. */
static int check_http_host(const agent_cfg_t *c) {
  const char *host = c->http_host;
  if (c->http_port < 0 || !host || !host[0]) return 0;
  char h[256];
  size_t n = strlen(host);
  if (n >= sizeof h) n = sizeof h - 1;
  memcpy(h, host, n);
  h[n] = 0;
  if (n >= 2 && h[0] == '[' && h[n - 1] == ']') {
    memmove(h, h + 1, n - 2);
    h[n - 2] = 0;
  }
  struct addrinfo hints = {.ai_flags = AI_NUMERICHOST | AI_PASSIVE, .ai_socktype = SOCK_STREAM};
  struct addrinfo *ai = NULL;
  int rc = getaddrinfo(h, NULL, &hints, &ai);
  if (ai) freeaddrinfo(ai);
  if (rc == 0) return 0;
  AGENT_ERROR(
      "--http-host '%s' is not an IP address (%s): give one such as 0.0.0.0, :: or the "
      "pod IP, or \"\" for all addresses",
      host, gai_strerror(rc));
  return EXIT_USAGE;
}

/* The checks of a real start that need no network and start nothing: node rank, the store
 * host's name (the --master-template), --http-host. Shared by setup() and --check-config. */
static int check_start(agent_t *a) {
  char err[512];
  agent_cfg_t *c = &a->cfg;
  if (c->standalone) {
    a->node_rank = 0;
  } else {
    a->node_rank = agent_discover_node_rank(c, environ, NULL, err, sizeof err);
    if (a->node_rank < 0) {
      AGENT_ERROR("%s", err);
      return EXIT_USAGE;
    }
  }
  agent_log_set_node_rank(a->node_rank);
  if (!strcmp(c->backend, "mpi") && !agent_pmix_available()) {
    AGENT_ERROR(
        "--backend mpi: this tdist-agent was built without OpenPMIx, so it cannot start "
        "MPI workers; rebuild it with libpmix-dev installed (pkg-config pmix)");
    return EXIT_USAGE;
  }
  if (a->node_rank >= c->nnodes_max + c->spares) {
    AGENT_ERROR("node rank %d is outside --nnodes %d:%d with %d spare(s) (node ranks are 0..%d)",
                a->node_rank, c->nnodes_min, c->nnodes_max, c->spares,
                c->nnodes_max + c->spares - 1);
    return EXIT_USAGE;
  }
  a->master_port = c->master_port;
  if (a->node_rank != 0) {
    if (c->master_addr) {
      snprintf(a->master_name, sizeof a->master_name, "%s", c->master_addr);
    } else if (agent_master_name(c, environ, NULL, NULL, a->master_name, sizeof a->master_name, err,
                                 sizeof err)) {
      AGENT_ERROR("cannot name the store host: %s (or pass --master-addr)", err);
      return EXIT_USAGE;
    }
  } else if (!c->standalone && !c->master_addr && c->check_config &&
             agent_master_name(c, environ, NULL, NULL, a->master_name, sizeof a->master_name, err,
                               sizeof err)) {
    /* Node 0 does not need the name, the other nodes do: the same configuration fails there. */
    AGENT_ERROR("cannot name the store host: %s (or pass --master-addr)", err);
    return EXIT_USAGE;
  }
  return check_http_host(c);
}

/* With --spares, a second store host: pod nnodes_max (the first spare's pod) hosts the store if
 * pod 0 is lost, so that the job goes on at once on a standby instead of waiting for pod 0's
 * replacement; that replacement then joins on the backup host as a standby. Needs the pods'
 * names (not --master-addr, not the kubeflow scheme, whose worker pods are named otherwise) and
 * a fixed --master-port. */
static void store_failover_setup(agent_t *a) {
  const agent_cfg_t *c = &a->cfg;
  char err[512];
  a->nhosts = 1;
  a->host_idx = 0;
  a->host_rank[0] = 0;
  copy_str(a->host_name[0], sizeof a->host_name[0], a->master_name);
  if (c->spares < 1 || c->standalone) return;
  const char *why = NULL;
  if (c->master_addr)
    why = "--master-addr names the store host";
  else if (c->master_port == 0)
    why = "--master-port 0 (a port chosen at start) cannot be found on another pod";
  else if (!(c->master_template && c->master_template[0]) && c->scheme == AGENT_SCHEME_KUBEFLOW)
    why = "the kubeflow scheme's worker pods are not named like pod 0";
  else if (agent_master_name(c, environ, NULL, NULL, a->host_name[0], sizeof a->host_name[0], err,
                             sizeof err) ||
           agent_pod_name(a->host_name[0], c->nnodes_max, a->host_name[1], sizeof a->host_name[1],
                          err, sizeof err))
    why = err;
  if (why) {
    AGENT_INFO("store failover off (%s): if pod 0 is lost the job waits for its replacement", why);
    copy_str(a->host_name[0], sizeof a->host_name[0], a->master_name); /* as check_start named it */
    return;
  }
  a->nhosts = 2;
  a->host_rank[1] = c->nnodes_max;
  AGENT_INFO("store failover: if pod 0 (%s) is lost, pod %d (%s) hosts the store", a->host_name[0],
             a->host_rank[1], a->host_name[1]);
}

static int setup(agent_t *a) {
  char err[512];
  agent_cfg_t *c = &a->cfg;
  int crc = check_start(a);
  if (crc) return crc;

  agent_state_t *st = &a->st;
  st->start_time_unix = (double)time(NULL);
  st->node_rank = a->node_rank;
  st->nproc_per_node = c->nproc_per_node;
  st->nnodes_min = c->nnodes_min;
  st->nnodes_max = c->nnodes_max;
  st->max_restarts = c->max_restarts;
  st->spares = c->spares;
  snprintf(st->run_id, sizeof st->run_id, "%s", c->run_id);
  snprintf(st->role, sizeof st->role, "%s", c->role ? c->role : "default");
  snprintf(st->backend, sizeof st->backend, "%s", c->backend ? c->backend : "gloo");
  st->loop_tick_ns = now_ns();

  if (c->http_port >= 0) {
    a->http =
        agent_http_start(st, c->http_host, c->http_port, c->monitor_interval_s, err, sizeof err);
    if (!a->http) {
      AGENT_ERROR("cannot serve HTTP: %s%s", err,
                  strstr(err, "--http-") ? "" : " (--http-port -1 disables HTTP)");
      return EXIT_UNAVAILABLE;
    }
    int port = agent_http_port(a->http);
    AGENT_INFO("serving /healthz /readyz /metrics /status on port %d", port);
    if (c->http_port_file) {
      char tmp[600];
      snprintf(tmp, sizeof tmp, "%s.tmp", c->http_port_file);
      FILE *f = fopen(tmp, "w");
      if (!f || fprintf(f, "%d\n", port) < 0 || fclose(f) || rename(tmp, c->http_port_file)) {
        AGENT_ERROR("cannot write --http-port-file %s: %s", c->http_port_file, strerror(errno));
        return EXIT_USAGE;
      }
    }
  }

  store_failover_setup(a);
  if (a->node_rank == 0) {
    /* A replacement pod 0 finds the job on the backup host, if the agents moved there when the
     * first pod 0 was lost, a second into its first round (should_yield). */
    if (host_start(a)) return EXIT_UNAVAILABLE;
  }
  agent_state_lock(st);
  st->ready = 1;
  agent_state_unlock(st);

  const char *tmp = getenv("TMPDIR");
  const char *base = c->log_dir ? c->log_dir : (tmp && *tmp ? tmp : "/tmp");
  if (agent_run_dir_create(base, c->run_id, a->run_dir, sizeof a->run_dir, err, sizeof err)) {
    a->run_dir[0] = 0;
    AGENT_ERROR("cannot create the run directory: %s (check --log-dir, default $TMPDIR or /tmp)",
                err);
    return EXIT_USAGE;
  }
  AGENT_INFO("run directory %s (%s at exit)", a->run_dir,
             c->keep_run_dir ? "kept: --keep-run-dir" : "removed");
  if (!strcmp(c->backend, "mpi") && agent_pmix_start(&a->pmix, a->run_dir, err, sizeof err)) {
    AGENT_ERROR("--backend mpi: %s", err);
    return EXIT_USAGE;
  }
  a->rd.nnodes_min = c->nnodes_min;
  a->rd.nnodes_max = c->nnodes_max;
  a->rd.spares = c->spares;
  a->rd.last_call_s = c->nnodes_min == c->nnodes_max ? 0 : c->last_call_s;
  a->rd.heartbeat_interval_s = c->heartbeat_interval_s;
  a->rd.heartbeat_timeout_s = c->heartbeat_timeout_s;
  a->rd.member_wait_s = c->stop_grace_s + 2;
  a->rd.node_rank = a->node_rank;
  a->rd.nproc = c->nproc_per_node;
  char host[64] = "-";
  if (gethostname(host, sizeof host - 1)) snprintf(host, sizeof host, "-");
  for (char *p = host; *p; p++)
    if (*p == ' ') *p = '_';
  snprintf(a->rd.host, sizeof a->rd.host, "%s", host);
  return 0;
}

int main(int argc, char **argv) {
  static agent_t agent;
  agent_t *a = &agent;
  char err[1024];
  agent_cfg_result_t cr = agent_cfg_load(&a->cfg, argc, argv, environ, err, sizeof err);
  if (cr == AGENT_CFG_HELP) {
    fputs(agent_cfg_usage(), stdout);
    agent_cfg_free(&a->cfg);
    return 0;
  }
  if (cr == AGENT_CFG_VERSION) {
    printf("tdist-agent %s\n", tdist_version());
    agent_cfg_free(&a->cfg);
    return 0;
  }
  if (cr != AGENT_CFG_OK) {
    fprintf(stderr, "tdist-agent: error: %s\nRun 'tdist-agent --help' for usage.\n", err);
    agent_cfg_free(&a->cfg);
    return EXIT_USAGE;
  }
  /* The agent's own TDIST_* parameters (TDIST_LOG_LEVEL, TDIST_PYTHON, ...): bad ones stop it. */
  const char *bad = tdist__param_first_error(NULL, 0, TDIST__PARAM_AGENT);
  if (bad) {
    fprintf(stderr, "tdist-agent: error: %s\n", bad);
    agent_cfg_free(&a->cfg);
    return EXIT_USAGE;
  }
  if (a->cfg.check_config) {
    int crc = check_start(a);
    if (crc) {
      agent_cfg_free(&a->cfg);
      return crc;
    }
    agent_cfg_dump_yaml(&a->cfg, stdout);
    agent_cfg_free(&a->cfg);
    return 0;
  }
  agent_log_set_format(a->cfg.log_format);
  /* Before any thread: the original process becomes the guard and never returns from here. */
  a->guard_pid = agent_guard_start();
  agent_workers_note_limits();

  /* Signals arrive through the signalfd only; children get a clean mask back before exec. */
  sigset_t set;
  sigemptyset(&set);
  static const int sigs[] = {SIGCHLD, SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2};
  for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) sigaddset(&set, sigs[i]);
  if (pthread_sigmask(SIG_BLOCK, &set, NULL) ||
      (a->sfd = signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC)) < 0) {
    fprintf(stderr, "tdist-agent: signalfd: %s\n", strerror(errno));
    return EXIT_INTERNAL;
  }
  signal(SIGPIPE, SIG_IGN);
  /* Orphans of the workers must be reaped by us, as PID 1 would. */
  if (getpid() != 1) prctl(PR_SET_CHILD_SUBREAPER, 1);

  agent_state_init(&a->st);
  agent_rdzv_init(&a->rd);
  a->moved_from = -1;
  a->ws.first_failed = -1;
  char nn[32];
  AGENT_INFO(
      "tdist-agent %s starting: nnodes %s, nproc_per_node %d, max_restarts %d, "
      "run id '%s'%s",
      tdist_version(), nnodes_str(&a->cfg, nn, sizeof nn), a->cfg.nproc_per_node,
      a->cfg.max_restarts, a->cfg.run_id, a->cfg.standalone ? ", standalone" : "");
  int rc = setup(a);
  if (!rc) rc = run(a);
  if (rc == 0)
    set_state(a, AGENT_STATE_SUCCEEDED);
  else
    set_state(a, AGENT_STATE_FAILED);
  stop_workers(a, SIGKILL, 0);
  agent_pmix_stop(a->pmix); /* before the run directory: its rendezvous files are there */
  a->pmix = NULL;
  if (a->run_dir[0] && !a->cfg.keep_run_dir) {
    if (a->run_dir_has_dump)
      AGENT_INFO("keeping the run directory %s: it holds a flight-recorder dump", a->run_dir);
    else if (agent_run_dir_remove(a->run_dir, err, sizeof err))
      AGENT_WARN("cannot remove the run directory: %s", err);
  }
  AGENT_INFO("exiting with code %d", rc);
  drop_store(a);
  agent_http_stop(a->http);
  agent_state_lock(&a->st);
  a->st.store_server = a->st.worker_store_server = NULL;
  agent_state_unlock(&a->st);
  tdist_store_server_destroy(a->worker_server);
  tdist_store_server_destroy(a->server);
  agent_workers_free(&a->ws);
  agent_rdzv_free(&a->rd);
  agent_state_destroy(&a->st);
  agent_cfg_free(&a->cfg);
  close(a->sfd);
  return rc;
}
