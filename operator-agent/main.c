/* tdist-agent: the in-pod launcher. This file does the set-up (flags and environment, node rank,
 * the store host's name, HTTP, the store server on node 0, the run directory, the PMIx server)
 * and then hands over to the state machine in agent/ (agent.h: the event loop, the rendezvous
 * driver, the round runner), which runs on this thread to the end.
 *
 * Life of an agent: config -> node rank -> HTTP -> (node 0) store server -> reach the store ->
 * rendezvous round r -> start workers -> watch them, the round and the peers -> on success the
 * exit barrier and exit 0; on a failure anywhere stop the workers, count the restart and join
 * round r+1, or give up with the exit code --help documents (agent_exit_t).
 *
 * Threads: this one (the loop thread: everything in main.c and agent/, over a signalfd); the
 * guard is a separate process (guard.h); libmicrohttpd's thread serves /healthz, /readyz,
 * /metrics and /status, reading agent_state_t under its lock; http.c's reaper thread; with
 * --backend mpi the PMIx server's threads (libpmix's, and pmix.c's store and direct-modex
 * threads); on the store host the store servers' loop threads (libtdist). */
#define _GNU_SOURCE
#include <errno.h>
#include <netdb.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#include <tdist/status.h>
#include <tdist/store.h>
#include <tdist/version.h>

#include "operator-agent/agent/agent.h"
#include "operator-agent/common/log.h"
#include "operator-agent/common/param.h"
#include "operator-agent/config/config.h"
#include "operator-agent/discovery/discovery.h"
#include "operator-agent/http/http.h"
#include "operator-agent/pmix/pmix.h"
#include "operator-agent/rendezvous/rdzv.h"
#include "operator-agent/state/state.h"
#include "operator-agent/storehost/storehost.h"
#include "operator-agent/supervisor/guard.h"
#include "operator-agent/supervisor/rundir.h"
#include "operator-agent/supervisor/workers.h"

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
  return AGENT_EXIT_USAGE;
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
      return AGENT_EXIT_USAGE;
    }
  }
  agent_log_set_node_rank(a->node_rank);
  if (!strcmp(c->backend, "mpi") && !agent_pmix_available()) {
    AGENT_ERROR(
        "--backend mpi: this tdist-agent was built without OpenPMIx, so it cannot start "
        "MPI workers; rebuild it with libpmix-dev installed (pkg-config pmix)");
    return AGENT_EXIT_USAGE;
  }
  if (a->node_rank >= c->nnodes_max + c->spares) {
    AGENT_ERROR("node rank %d is outside --nnodes %d:%d with %d spare(s) (node ranks are 0..%d)",
                a->node_rank, c->nnodes_min, c->nnodes_max, c->spares,
                c->nnodes_max + c->spares - 1);
    return AGENT_EXIT_USAGE;
  }
  a->sh.master_port = c->master_port;
  if (a->node_rank != 0) {
    if (c->master_addr) {
      snprintf(a->sh.master_name, sizeof a->sh.master_name, "%s", c->master_addr);
    } else if (agent_master_name(c, environ, NULL, NULL, a->sh.master_name,
                                 sizeof a->sh.master_name, err, sizeof err)) {
      AGENT_ERROR("cannot name the store host: %s (or pass --master-addr)", err);
      return AGENT_EXIT_USAGE;
    }
  } else if (!c->standalone && !c->master_addr && c->check_config &&
             agent_master_name(c, environ, NULL, NULL, a->sh.master_name, sizeof a->sh.master_name,
                               err, sizeof err)) {
    /* Node 0 does not need the name, the other nodes do: the same configuration fails there. */
    AGENT_ERROR("cannot name the store host: %s (or pass --master-addr)", err);
    return AGENT_EXIT_USAGE;
  }
  return check_http_host(c);
}

static int setup(agent_t *a) {
  char err[512];
  agent_cfg_t *c = &a->cfg;
  int crc = check_start(a);
  if (crc) return crc;
  a->sh.node_rank = a->node_rank;

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
  st->loop_tick_ns = agent_now_ns();

  if (c->http_port >= 0) {
    a->http =
        agent_http_start(st, c->http_host, c->http_port, c->monitor_interval_s, err, sizeof err);
    if (!a->http) {
      AGENT_ERROR("cannot serve HTTP: %s%s", err,
                  strstr(err, "--http-") ? "" : " (--http-port -1 disables HTTP)");
      return AGENT_EXIT_UNAVAILABLE;
    }
    int port = agent_http_port(a->http);
    AGENT_INFO("serving /healthz /readyz /metrics /status on port %d", port);
    if (c->http_port_file) {
      char tmp[600];
      snprintf(tmp, sizeof tmp, "%s.tmp", c->http_port_file);
      FILE *f = fopen(tmp, "w");
      if (!f || fprintf(f, "%d\n", port) < 0 || fclose(f) || rename(tmp, c->http_port_file)) {
        AGENT_ERROR("cannot write --http-port-file %s: %s", c->http_port_file, strerror(errno));
        return AGENT_EXIT_USAGE;
      }
    }
  }

  agent_storehost_setup(&a->sh);
  if (a->node_rank == 0) {
    /* A replacement pod 0 finds the job on the backup host, if the agents moved there when the
     * first pod 0 was lost, a second into its first round (should_yield). */
    if (agent_storehost_host_start(&a->sh) != AGENT_STOREHOST_OK) return AGENT_EXIT_UNAVAILABLE;
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
    return AGENT_EXIT_USAGE;
  }
  AGENT_INFO("run directory %s (%s at exit)", a->run_dir,
             c->keep_run_dir ? "kept: --keep-run-dir" : "removed");
  agent_pyhang_setup(a); /* writes into the run directory */
  if (!strcmp(c->backend, "mpi") && agent_pmix_start(&a->pmix, a->run_dir, err, sizeof err)) {
    AGENT_ERROR("--backend mpi: %s", err);
    return AGENT_EXIT_USAGE;
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
    return AGENT_EXIT_USAGE;
  }
  /* The agent's own TDIST_* parameters (TDIST_LOG_LEVEL, TDIST_PYTHON, ...): bad ones stop it. */
  const char *bad = agent_param_first_error();
  if (bad) {
    fprintf(stderr, "tdist-agent: error: %s\n", bad);
    agent_cfg_free(&a->cfg);
    return AGENT_EXIT_USAGE;
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
  if (agent_loop_signals(a)) {
    fprintf(stderr, "tdist-agent: signalfd: %s\n", strerror(errno));
    return AGENT_EXIT_INTERNAL;
  }
  signal(SIGPIPE, SIG_IGN);
  /* Orphans of the workers must be reaped by us, as PID 1 would. */
  if (getpid() != 1) prctl(PR_SET_CHILD_SUBREAPER, 1);

  agent_state_init(&a->st);
  agent_rdzv_init(&a->rd);
  a->sh.cfg = &a->cfg;
  a->sh.st = &a->st;
  a->sh.wait = agent_loop_wait_cb;
  a->sh.wait_ctx = a;
  a->sh.moved_from = -1;
  a->stall_s = agent_param_double(AGENT_P_STALL_REPORT_SECONDS); /* checked above */
  a->ws.first_failed = -1;
  agent_obs_cfg_t ocfg = {.interval_s = a->cfg.monitor_interval_s,
                          .stall_s = a->stall_s,
                          .deadline_s = agent_param_double(AGENT_P_PROGRESS_DEADLINE_SECONDS),
                          .nvml_lib = agent_param_str(AGENT_P_NVML_LIBRARY)};
  if (agent_param_int(AGENT_P_RANK_METRICS))
    a->obs = agent_obs_create(&ocfg, &a->st);
  else
    AGENT_INFO("TDIST_RANK_METRICS=0: no per-rank process metrics, no hang reports but libtdist's");
  char nn[32];
  AGENT_INFO(
      "tdist-agent %s starting: nnodes %s, nproc_per_node %d, max_restarts %d, "
      "run id '%s'%s",
      tdist_version(), agent_nnodes_str(&a->cfg, nn, sizeof nn), a->cfg.nproc_per_node,
      a->cfg.max_restarts, a->cfg.run_id, a->cfg.standalone ? ", standalone" : "");
  int rc = setup(a);
  if (!rc) rc = agent_jobset_begin(a);
  if (!rc) rc = agent_run(a);
  rc = agent_jobset_exit_code(a, rc);
  if (rc == 0)
    agent_set_state(a, AGENT_STATE_SUCCEEDED);
  else
    agent_set_state(a, AGENT_STATE_FAILED);
  agent_loop_stop_workers(a, SIGKILL, 0);
  agent_pmix_stop(a->pmix); /* before the run directory: its rendezvous files are there */
  a->pmix = NULL;
  if (a->run_dir[0] && !a->cfg.keep_run_dir) {
    if (a->run_dir_has_dump)
      AGENT_INFO("keeping the run directory %s: it holds a flight-recorder dump", a->run_dir);
    else if (agent_run_dir_remove(a->run_dir, err, sizeof err))
      AGENT_WARN("cannot remove the run directory: %s", err);
  }
  agent_jobset_end(a);
  AGENT_INFO("exiting with code %d", rc);
  agent_storehost_drop(&a->sh, &a->rd);
  agent_http_stop(a->http);
  tdist_store_proxy_destroy(a->proxy);
  agent_storehost_destroy(&a->sh);
  agent_workers_free(&a->ws);
  agent_pyhang_free(a);
  agent_obs_destroy(a->obs);
  agent_progress_pub_close(&a->progress);
  agent_rdzv_free(&a->rd);
  agent_state_destroy(&a->st);
  agent_cfg_free(&a->cfg);
  close(a->sfd);
  return rc;
}
