/* The round runner (see agent.h): reaches the store (storehost.h), runs the rendezvous
 * (driver.c), starts the round's workers with the rendezvous result (supervisor/workers.h; the
 * PMIx job first with --backend mpi), monitors them, the peers and the round until it ends, and
 * applies the restart policy: restart in round r+1 up to --max-restarts, or end with the exit
 * code --help documents (agent_exit_t). Runs on the loop thread. */
#define _GNU_SOURCE
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <tdist/status.h>
#include <tdist/store.h>

#include "operator-agent/agent/agent.h"
#include "operator-agent/common/log.h"
#include "operator-agent/pmix/pmix_round.h"
#include "operator-agent/pystack/pystack.h"
#include "operator-agent/supervisor/rootcause.h"

/* How a round ended (run_round). */
typedef enum {
  ROUND_SUCCEEDED,  /* every member done: exit 0 */
  ROUND_RESTART,    /* round ended: restart (rd.end_reason) */
  ROUND_STORE_LOST, /* store gone: reconnect, restart */
  ROUND_STOPPED,    /* a terminating signal */
  ROUND_ABORTED     /* a rank called MPI_Abort: the job ends (a->abort_code), no restart */
} round_outcome_t;

/* What the restart policy decided after a round (after_round). */
typedef enum {
  NEXT_RESTART, /* join round r+1 */
  NEXT_EXIT     /* exit with *code */
} next_t;

/* Logs the root cause of a local worker failure (rootcause.h) and returns a one-line summary.
 * Lets the other workers finish failing for a moment first: one failure usually brings the
 * other ranks down within milliseconds. */
static void describe_failure(agent_t *a, char *out, size_t cap) {
  int64_t until = agent_now_ns() + 500000000LL;
  while (agent_workers_running(&a->ws) && agent_now_ns() < until && !a->stop_sig)
    agent_loop_wait(a, 20);
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

/* Logs a rendezvous error at most once per RDZV_LOG_PERIOD_NS for the same text, with the number
 * of repeats in between: a hostile record must not flood the log. */
#define RDZV_LOG_PERIOD_NS 5000000000LL
static void rdzv_error_log(agent_t *a, const char *msg) {
  int64_t now = agent_now_ns();
  if (!strcmp(msg, a->err_last) && now < a->err_next_log_ns) {
    a->err_repeats++;
    return;
  }
  if (a->err_repeats)
    AGENT_WARN("%s (%" PRId64 " more time(s) in the last %.0f s)", msg, a->err_repeats,
               RDZV_LOG_PERIOD_NS / 1e9);
  else
    AGENT_WARN("%s", msg);
  agent_copy_str(a->err_last, sizeof a->err_last, msg);
  a->err_repeats = 0;
  a->err_next_log_ns = now + RDZV_LOG_PERIOD_NS;
}

/* A rank called PMIx_Abort (MPI_Abort), or (rank -1) the PMIx server refused what the job
 * needs (msg says what): the job ends on every node, as under mpirun. */
static round_outcome_t pmix_abort(agent_t *a, int rank, int status, const char *msg) {
  char text[800];
  a->abort_code = agent_pmix_round_abort_text(rank, status, msg, text, sizeof text);
  agent_set_error(a, text);
  agent_pmix_round_abort_announce(&a->rd, text);
  return ROUND_ABORTED;
}

/* Ends the round for everybody after a local failure (err): RESTART, or STORE_LOST. */
static round_outcome_t end_round(agent_t *a, const char *err) {
  if (agent_rdzv_end(&a->rd, AGENT_RESTART_WORKER_FAILED, err) < 0) return ROUND_STORE_LOST;
  return ROUND_RESTART;
}

/* --store-proxy on a node that does not host the store: a fresh proxy to the round's workers'
 * store (the last round's goes: its workers are gone), and the address the workers get. 0, or -1
 * with err set. */
static int open_proxy(agent_t *a, const char **addr, int *port, char *err, size_t cap) {
  tdist_store_proxy_destroy(a->proxy);
  a->proxy = NULL;
  if (!a->cfg.store_proxy || a->sh.hosting) return 0;
  tdist_store_proxy_options_t o = TDIST_STORE_PROXY_OPTIONS_INIT;
  o.upstream_host = a->sh.master_ip;
  o.upstream_port = a->rd.worker_store.port;
  o.connect_timeout_ms = 10000;
  if (tdist_store_proxy_create(&o, &a->proxy)) {
    snprintf(err, cap, "--store-proxy: %s", tdist_last_error());
    return -1;
  }
  *addr = "127.0.0.1";
  *port = tdist_store_proxy_port(a->proxy, 0);
  return 0;
}

/* Starts the round's workers: the rendezvous result gives their ranks and their store (MASTER_PORT
 * is rd.worker_store.port, on the store host, MASTER_ADDR). -1: not started (*out says how the
 * round ends). */
static int start_workers(agent_t *a, round_outcome_t *out) {
  char err[512];
  agent_worker_spec_t spec = {.cfg = &a->cfg,
                              .rank_base = a->rd.rank_base,
                              .world_size = a->rd.world_size,
                              .group_rank = a->rd.group_rank,
                              .group_world_size = (int)a->rd.nmembers,
                              .attempt = a->rd.attempt + a->jip.restart_base,
                              .master_addr = a->sh.master_ip,
                              .master_port = a->rd.worker_store.port,
                              .run_dir = a->run_dir,
                              .py_stacks_dir = a->py_dir[0] ? a->py_dir : NULL,
                              .py_stacks_signal = agent_pystack_signal()};
  if (open_proxy(a, &spec.master_addr, &spec.master_port, err, sizeof err)) {
    AGENT_ERROR("%s", err);
    agent_set_error(a, err);
    *out = end_round(a, err);
    return -1;
  }
  if (a->pmix) {
    /* The PMIx node map names every member's host and nproc: read the records now. */
    agent_rdzv_result_t lr = agent_rdzv_load_members(&a->rd);
    if (lr < 0) {
      snprintf(err, sizeof err, "reading round %" PRId64 "'s member records: %.400s", a->rd.round,
               a->rd.err);
      AGENT_ERROR("%s", err);
      agent_set_error(a, err);
      *out = lr == AGENT_RDZV_STORE_ERROR ? ROUND_STORE_LOST : end_round(a, err);
      return -1;
    }
    if (agent_pmix_round_start(a->pmix, &a->rd, &a->cfg,
                               a->sh.hosting ? "127.0.0.1" : a->sh.master_ip, a->sh.master_port,
                               err, sizeof err)) {
      if (agent_pmix_refused(a->pmix, err, sizeof err)) {
        *out = pmix_abort(a, -1, 1, err);
        return -1;
      }
      AGENT_ERROR("cannot start the MPI job's PMIx namespace: %s", err);
      agent_set_error(a, err);
      *out = end_round(a, err);
      return -1;
    }
    spec.extra_env = agent_pmix_round_env;
    spec.extra_env_free = agent_pmix_env_free;
    spec.extra_env_ctx = a->pmix;
  }
  if (agent_workers_start(&a->ws, &spec, err, sizeof err)) {
    AGENT_ERROR("%s", err);
    agent_set_error(a, err);
    a->exec_failed = 1;
    agent_workers_reap(&a->ws);
    *out = end_round(a, err);
    return -1;
  }
  agent_workers_publish(&a->ws, &a->st);
  agent_set_state(a, AGENT_STATE_RUNNING);
  AGENT_INFO("started %d worker(s): global ranks %d..%d of %d, MASTER_ADDR=%s MASTER_PORT=%d%s",
             a->ws.n, a->rd.rank_base, a->rd.rank_base + a->ws.n - 1, a->rd.world_size,
             spec.master_addr, spec.master_port, a->proxy ? " (the store proxy)" : "");
  return 0;
}

/* One look at the round while its workers run, after the local checks: the exit barrier once
 * every local worker succeeded, else progress and the round monitor. 1 with *out set: the round
 * ended. */
static int watch_round(agent_t *a, int *marked_done, round_outcome_t *out) {
  agent_rdzv_result_t res;
  if (agent_workers_all_succeeded(&a->ws)) {
    if (!*marked_done)
      AGENT_INFO("all %d local worker(s) succeeded%s", a->ws.n,
                 a->rd.nmembers > 1 ? "; waiting for the other nodes" : "");
    res = agent_rdzv_done_poll(&a->rd, agent_now_ns(), marked_done);
    if (res == AGENT_RDZV_ALL_DONE) return *out = ROUND_SUCCEEDED, 1;
  } else {
    agent_progress_publish(&a->progress, &a->ws, a->sh.store, a->rd.round, a->rd.group_rank,
                           a->rd.nmembers, a->rd.world_size, a->stall_s, &a->st, agent_now_ns());
    res = agent_rdzv_monitor(&a->rd, agent_now_ns());
  }
  if (a->rd.nstandby != a->st.nstandbys || a->rd.nstandby_live != a->st.standbys_live)
    agent_driver_publish_standbys(a);
  if (a->rd.members && !a->st.members) agent_driver_publish_members(a); /* read by the monitor */
  if (res == AGENT_RDZV_NO_MEMORY) {
    rdzv_error_log(a, a->rd.err); /* transient: the next turn tries again */
    return 0;
  }
  if (res == AGENT_RDZV_PROTOCOL_ERROR) {
    /* A record no agent of this job writes: fail this round once, with the record named. */
    char text[600];
    snprintf(text, sizeof text, "%s", a->rd.err);
    AGENT_ERROR("%s: ending round %" PRId64 " and restarting the workers", text, a->rd.round);
    agent_set_error(a, text);
    *out = agent_rdzv_end(&a->rd, AGENT_RESTART_PROTOCOL, text) == AGENT_RDZV_STORE_ERROR
               ? ROUND_STORE_LOST
               : ROUND_RESTART;
    return 1;
  }
  if (res < 0) {
    AGENT_WARN("lost the store: %s", a->rd.err);
    agent_set_error(a, a->rd.err);
    return *out = ROUND_STORE_LOST, 1;
  }
  if (res == AGENT_RDZV_ENDED) return *out = ROUND_RESTART, 1;
  return 0;
}

/* Runs the workers of one round until it ends. */
static round_outcome_t run_round(agent_t *a, int *local_failed) {
  round_outcome_t out;
  *local_failed = 0;
  if (start_workers(a, &out)) {
    *local_failed = 1;
    return out;
  }
  int marked_done = 0;
  for (;;) {
    agent_loop_wait(a, agent_loop_poll_ms(a));
    if (a->stop_sig) return ROUND_STOPPED;
    agent_obs_tick(a->obs, &a->ws, agent_now_ns());
    agent_pyhang_poll(a);
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
      agent_pyhang_flight(a, what, sizeof what);
      dump_flight(a, "worker failed");
      agent_set_error(a, what);
      *local_failed = 1;
      return end_round(a, what);
    }
    if (watch_round(a, &marked_done, &out)) return out;
  }
}

/* The store host: before leaving, give the others a moment to read the outcome. */
static void linger_for_peers(agent_t *a) {
  if (!a->sh.store) return;
  int64_t exited = 0;
  if (agent_rdzv_mark_exited(&a->rd, &exited) < 0 || !a->sh.hosting) return;
  int64_t deadline = agent_now_ns() + 10000000000LL, sb_exited = 0;
  while (exited < a->rd.nmembers && agent_now_ns() < deadline && !a->stop_sig) {
    agent_loop_wait(a, 20);
    if (agent_rdzv_exited_count(&a->rd, &exited) < 0) break;
  }
  /* and for the standbys that heartbeat to see the outcome (they poll every 100 ms) */
  while (sb_exited < a->rd.nstandby_live && agent_now_ns() < deadline && !a->stop_sig) {
    if (agent_rdzv_standby_exited(&a->rd, 0, &sb_exited) < 0) break;
    if (sb_exited < a->rd.nstandby_live) agent_loop_wait(a, 20);
  }
}

static int exit_code_of_local_failure(const agent_t *a) {
  if (a->exec_failed) return AGENT_EXIT_EXEC_FAILED;
  if (a->ws.first_failed < 0) return AGENT_EXIT_PEER_FAILED;
  int c = a->ws.w[a->ws.first_failed].exit_code;
  return c < 0 ? 128 - c : (c > 0 && c < 256 ? c : 1);
}

/* The store was lost: drop the connection, count it, and move to the other host if there is one
 * (a store host that still hosts stays). */
static void store_lost(agent_t *a) {
  agent_storehost_drop(&a->sh, &a->rd);
  agent_state_lock(&a->st);
  a->st.store_reconnects_total++;
  agent_state_unlock(&a->st);
  if (!a->sh.hosting) {
    agent_storehost_switch(&a->sh, 1);
    if (a->sh.nhosts >= 2) a->backoff_ms = 0;
  }
}

/* Reaches the store (reconnecting after a loss), then carries the last round over if the job
 * moved to another host. 0, or the exit code. */
static int reach(agent_t *a, int64_t deadline) {
  agent_set_state(a, AGENT_STATE_RENDEZVOUS);
  int64_t switches = a->sh.switches;
  agent_storehost_result_t r = agent_storehost_reach(&a->sh, &a->rd, deadline);
  if (a->sh.switches != switches) a->backoff_ms = 0;
  if (r == AGENT_STOREHOST_STOPPED) return AGENT_EXIT_SIGNAL_BASE + a->stop_sig;
  if (r != AGENT_STOREHOST_OK) return AGENT_EXIT_UNAVAILABLE;
  if (a->sh.moved_from >= 0) {
    /* A store the job moves to: what the next round needs of the last one (a failure here
     * is met again by the rendezvous). */
    if (agent_rdzv_carry_over(&a->rd, a->sh.moved_from) < 0)
      AGENT_WARN("carrying round %" PRId64 " over to the new store: %s", a->rd.carry_round,
                 a->rd.err);
    a->sh.moved_from = -1;
  }
  return 0;
}

/* A standby's job ended (JOB_DONE or JOB_FAILED): the exit code. */
static int job_ended(agent_t *a, agent_rdzv_outcome_t ro) {
  int64_t ex = 0;
  if (ro == AGENT_RDZV_OUT_JOB_DONE) {
    AGENT_INFO("every member of round %" PRId64 " finished: the job succeeded; this %s exits 0",
               a->rd.round, a->rd.closed_n ? "standby" : "agent");
    agent_set_state(a, AGENT_STATE_SUCCEEDED);
  } else {
    char msg[600];
    snprintf(msg, sizeof msg, "the job gave up: %s", a->rd.end_text);
    AGENT_ERROR("%s", msg);
    agent_set_error(a, msg);
    agent_set_state(a, AGENT_STATE_FAILED);
  }
  agent_rdzv_standby_exited(&a->rd, 1, &ex); /* node 0 waits for it before leaving */
  return ro == AGENT_RDZV_OUT_JOB_DONE ? AGENT_EXIT_OK : AGENT_EXIT_PEER_FAILED;
}

/* A rendezvous failed but may be retried (STORE_LOST, BAD_RECORD): logs, waits the backoff. 0:
 * retry; else the exit code. */
static int rendezvous_failed(agent_t *a, agent_rdzv_outcome_t ro, int64_t deadline) {
  char msg[700];
  snprintf(msg, sizeof msg, "%s during rendezvous: %s; retrying until --rdzv-timeout",
           ro == AGENT_RDZV_OUT_STORE_LOST ? "lost the store" : "bad rendezvous state", a->rd.err);
  rdzv_error_log(a, msg);
  agent_set_error(a, a->rd.err);
  /* A bad record in round r spoils that round for everybody: retry in a fresh one (the
   * bound keeps round + 1 in range; join refuses a round past it). */
  if (ro == AGENT_RDZV_OUT_BAD_RECORD && a->rd.round >= a->next_round)
    a->next_round = a->rd.round + 1;
  if (ro == AGENT_RDZV_OUT_STORE_LOST) store_lost(a);
  if (agent_loop_backoff(a, deadline)) return AGENT_EXIT_SIGNAL_BASE + a->stop_sig;
  if (agent_now_ns() >= deadline) {
    AGENT_ERROR("giving up after --rdzv-timeout %.0f s: %s", a->cfg.rdzv_timeout_s, a->rd.err);
    agent_set_state(a, AGENT_STATE_FAILED);
    return AGENT_EXIT_UNAVAILABLE;
  }
  return 0;
}

/* The round ended with out: the restart policy. NEXT_RESTART (counters moved on for round r+1),
 * or NEXT_EXIT with *code. */
static next_t after_round(agent_t *a, round_outcome_t out, int local_failed, int *code) {
  if (out == ROUND_STOPPED) {
    char text[128];
    snprintf(text, sizeof text, "node %d was stopped by %s", a->node_rank, strsignal(a->stop_sig));
    if (a->sh.store) {
      agent_rdzv_mark_gone(&a->rd, a->node_rank); /* the next round need not wait for us */
      agent_rdzv_end(&a->rd, AGENT_RESTART_PEER_LOST, text);
    }
    agent_loop_stop_workers(a, a->stop_sig, 1);
    return *code = AGENT_EXIT_SIGNAL_BASE + a->stop_sig, NEXT_EXIT;
  }
  if (out == ROUND_ABORTED) {
    agent_loop_stop_workers(a, SIGTERM, 0);
    agent_set_state(a, AGENT_STATE_FAILED);
    linger_for_peers(a);
    return *code = a->abort_code, NEXT_EXIT;
  }
  if (out == ROUND_SUCCEEDED) {
    agent_set_state(a, AGENT_STATE_SUCCEEDED);
    AGENT_INFO("all %" PRId64 " node(s) finished: job succeeded", a->rd.nmembers);
    linger_for_peers(a);
    return *code = AGENT_EXIT_OK, NEXT_EXIT;
  }
  agent_restart_reason_t reason;
  if (out == ROUND_STORE_LOST) {
    reason = AGENT_RESTART_STORE_LOST;
    char text[sizeof a->rd.end_text];
    agent_copy_str(text, sizeof text, a->rd.err);
    agent_copy_str(a->rd.end_text, sizeof a->rd.end_text, text);
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
  agent_loop_stop_workers(a, SIGTERM, 0);
  if (a->stop_sig) return *code = AGENT_EXIT_SIGNAL_BASE + a->stop_sig, NEXT_EXIT;
  int counts = reason != AGENT_RESTART_MEMBERSHIP;
  if (counts && a->rd.failures >= a->cfg.max_restarts) {
    char msg[600];
    snprintf(msg, sizeof msg, "giving up after %d restart(s) (--max-restarts %d): %s",
             a->rd.failures, a->cfg.max_restarts, a->rd.end_text);
    AGENT_ERROR("%s", msg);
    agent_set_error(a, msg);
    agent_set_state(a, AGENT_STATE_FAILED);
    if (out != ROUND_STORE_LOST) {
      agent_rdzv_job_failed(&a->rd, msg); /* standbys leave on it */
      linger_for_peers(a);
    }
    *code = local_failed ? exit_code_of_local_failure(a) : AGENT_EXIT_PEER_FAILED;
    return NEXT_EXIT;
  }
  agent_state_lock(&a->st);
  a->st.restarts_total[reason]++;
  agent_state_unlock(&a->st);
  if (counts) a->failures = a->rd.failures + 1;
  a->attempt = a->rd.attempt + 1;
  a->next_round = a->rd.round + 1;
  AGENT_INFO("restarting the workers (attempt %d, %d of %d restarts used)", a->attempt, a->failures,
             a->cfg.max_restarts);
  if (out == ROUND_STORE_LOST) store_lost(a);
  return NEXT_RESTART;
}

int agent_run(agent_t *a) {
  int64_t deadline = agent_now_ns() + (int64_t)(a->cfg.rdzv_timeout_s * 1e9);
  for (;;) {
    int code;
    if (!a->sh.store && (code = reach(a, deadline)) != 0) return code;
    agent_rdzv_outcome_t ro = agent_driver_rendezvous(a, &deadline);
    switch (ro) {
      case AGENT_RDZV_OUT_OK: break;
      case AGENT_RDZV_OUT_STOPPED: return AGENT_EXIT_SIGNAL_BASE + a->stop_sig;
      case AGENT_RDZV_OUT_JOB_DONE:
      case AGENT_RDZV_OUT_JOB_FAILED: return job_ended(a, ro);
      case AGENT_RDZV_OUT_TIMEOUT: return AGENT_EXIT_UNAVAILABLE;
      case AGENT_RDZV_OUT_FATAL: return AGENT_EXIT_INTERNAL;
      case AGENT_RDZV_OUT_YIELD:
        agent_storehost_drop(&a->sh, &a->rd);
        a->backoff_ms = 0;
        continue;
      case AGENT_RDZV_OUT_STORE_LOST:
      case AGENT_RDZV_OUT_BAD_RECORD:
        if ((code = rendezvous_failed(a, ro, deadline)) != 0) return code;
        continue;
    }
    a->backoff_ms = 0;
    a->attempt = a->rd.attempt;
    a->failures = a->rd.failures;
    a->exec_failed = 0;
    int local_failed = 0;
    round_outcome_t out = run_round(a, &local_failed);
    if (after_round(a, out, local_failed, &code) == NEXT_EXIT) return code;
    deadline = agent_now_ns() + (int64_t)(a->cfg.rdzv_timeout_s * 1e9);
  }
}
