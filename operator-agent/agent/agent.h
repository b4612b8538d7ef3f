/* tdist-agent's own state and the parts of its state machine (internal to the program; after
 * torchelastic's SimpleElasticAgent: rendezvous, then start the workers, then monitor them):
 *
 *   loop.c    the event loop: the signalfd (SIGCHLD and the forwarded signals), reaping, the
 *             liveness tick /healthz reads, stopping the workers, the backoff waits
 *   driver.c  the rendezvous driver: joins rounds (the store host starting each round's workers'
 *             store first) until this agent is a member; standbys; a store host giving way
 *   round.c   the round runner: starts the workers with the rendezvous result, monitors them,
 *             the restart policy and the exit codes (agent_run)
 *   jobset.c  --jobset-in-place-restart: JobSet's in-place restart protocol (the barrier before
 *             the first rendezvous, the group restart seen while running, the exit code)
 *
 * with operator-agent/storehost/ (hosting and reaching the agents' store, failover),
 * rendezvous/ (the store protocol), supervisor/ (the workers, progress), pmix/ (--backend mpi).
 *
 * Threads: every function here runs on the loop thread (main's). Beside it run libmicrohttpd's
 * thread (/healthz, /metrics, /status: reads agent_state_t under its lock), http.c's reaper
 * thread, the PMIx server's threads (--backend mpi: libpmix's own, pmix.c's store and
 * direct-modex threads), and on the store host each store server's loop thread. */
#ifndef TDIST_AGENT_AGENT_H
#define TDIST_AGENT_AGENT_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <time.h>

#include "operator-agent/config/config.h"
#include "operator-agent/http/http.h"
#include "operator-agent/kube/kube.h"
#include "operator-agent/kube/watcher.h"
#include "operator-agent/pmix/pmix.h"
#include "operator-agent/procstat/observe.h"
#include "operator-agent/rendezvous/rdzv.h"
#include "operator-agent/state/state.h"
#include "operator-agent/storehost/storehost.h"
#include "operator-agent/supervisor/progress.h"
#include "operator-agent/supervisor/workers.h"

/* tdist-agent's exit codes (also in --help). A terminating signal N gives 128 + N. */
typedef enum {
  AGENT_EXIT_OK = 0,
  AGENT_EXIT_USAGE = 64,       /* bad flags, env or YAML */
  AGENT_EXIT_UNAVAILABLE = 69, /* rendezvous / master not reachable within --rdzv-timeout */
  AGENT_EXIT_PEER_FAILED = 70, /* the job failed on another node; restarts exhausted */
  AGENT_EXIT_INTERNAL = 71,
  AGENT_EXIT_EXEC_FAILED = 127, /* the worker command could not be started (a shell's "command
                                 * not found") */
  AGENT_EXIT_SIGNAL_BASE = 128  /* + the signal that stopped the agent */
} agent_exit_t;

/* How a rendezvous (driver.c) ended. */
typedef enum {
  AGENT_RDZV_OUT_OK,         /* a member of a closed round: rd holds the rendezvous result */
  AGENT_RDZV_OUT_STORE_LOST, /* the store failed: reconnect */
  AGENT_RDZV_OUT_TIMEOUT,    /* --rdzv-timeout passed (logged) */
  AGENT_RDZV_OUT_STOPPED,    /* a terminating signal */
  AGENT_RDZV_OUT_FATAL,      /* no workers' store could be started (logged) */
  AGENT_RDZV_OUT_BAD_RECORD, /* a record no agent writes, or out of memory (rd.err says which;
                              * the connection is fine) */
  AGENT_RDZV_OUT_JOB_DONE,   /* standby: every member finished */
  AGENT_RDZV_OUT_JOB_FAILED, /* the job gave up (a standby, or an agent that arrived after) */
  AGENT_RDZV_OUT_YIELD       /* this store host gave way to the other host, which runs the job */
} agent_rdzv_outcome_t;

/* --jobset-in-place-restart (jobset.c). */
typedef struct {
  agent_kube_cfg_t kc;
  agent_kube_watcher_t *w; /* NULL: off, bypassed, or not started yet */
  int active;              /* annotated and watching: the protocol applies */
  int restart_now;         /* the JobSet restarts the group: exit with exit_code */
  int final;               /* the exit code stands (the barrier timed out) */
  int exit_code;           /* IN_PLACE_RESTART_EXIT_CODE, default 1 */
  int64_t attempt;         /* this pod's in-place restart attempt */
  int restart_base;        /* added to TORCHELASTIC_RESTART_COUNT: attempt * (max_restarts + 1) */
  uint64_t seen;           /* the watcher's count of objects last published */
  char last_err[600];      /* the watcher's error last logged */
} agent_jip_t;

typedef struct {
  agent_cfg_t cfg;
  agent_state_t st;
  agent_http_t *http;
  agent_storehost_t sh; /* the agents' store: hosted here or reached (storehost.h) */
  agent_rdzv_t rd;
  agent_workers_t ws;
  int sfd;
  pid_t guard_pid; /* the parent that kills what the agent leaves (guard.h); 0: none */
  int node_rank;
  int64_t next_probe_ns; /* a waiting store host's next look at the other host */
  char run_dir[400];     /* "" until created */
  int run_dir_has_dump;  /* a flight-recorder dump was written there: keep it */
  int stop_sig;          /* a terminating signal arrived */
  int exec_failed;       /* the worker command could not be started (exit 127 if final) */
  int dump_requested;    /* SIGUSR1: dump the flight recorders */
  agent_progress_pub_t progress;
  double stall_s; /* TDIST_STALL_REPORT_SECONDS, read at start-up */
  int64_t next_round;
  int attempt, failures;
  int backoff_ms;          /* the last wait after a failed rendezvous (0: none since success) */
  char err_last[700];      /* agent_rdzv_error_log: the last text logged, */
  int64_t err_repeats;     /* how often it came again since, */
  int64_t err_next_log_ns; /* and when it may be logged again */
  int abort_code;          /* ROUND_ABORTED: the exit code (the rank's MPI_Abort status) */
  agent_pmix_t *pmix;      /* --backend mpi: the PMIx server of the workers (pmix.h) */
  agent_jip_t jip;         /* --jobset-in-place-restart */
  agent_obs_t *obs;        /* per-rank process metrics and hang reports (observe.h); NULL: none */
  struct agent_pyhang_s *pyhang; /* pyhang.c's state; NULL: none */
  char py_dir[460]; /* RUN_DIR/python, holding the agent's sitecustomize.py; "": stacks off */
  struct tdist_store_proxy_s *proxy; /* --store-proxy: the round's workers' (NULL: none) */
} agent_t;

static inline int64_t agent_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* Copies src into dst (cap bytes), truncating; always NUL-terminated. */
void agent_copy_str(char *dst, size_t cap, const char *src);
/* "3" or "2:4". */
const char *agent_nnodes_str(const agent_cfg_t *c, char *buf, size_t cap);

/* loop.c */
/* Blocks the signals the agent handles and opens the signalfd on them (a->sfd); children get a
 * clean mask back before exec. 0, or -1 with errno set. Before any thread starts. */
int agent_loop_signals(agent_t *a);
void agent_set_state(agent_t *a, agent_run_state_t s);
void agent_set_error(agent_t *a, const char *msg);
/* Waits up to timeout_ms for a signal. Reaps children on SIGCHLD; forwards HUP/USR2 to the
 * workers; records TERM/INT/QUIT in a->stop_sig (and forwards them too); SIGUSR1 asks for a
 * flight-recorder dump and goes to the workers that handle it. Stamps the liveness tick read by
 * /healthz. */
void agent_loop_wait(agent_t *a, int timeout_ms);
/* agent_storehost_t.wait: agent_loop_wait, then nonzero once a terminating signal came. */
int agent_loop_wait_cb(void *a, int timeout_ms);
/* --monitor-interval in ms, at least 1. */
int agent_loop_poll_ms(const agent_t *a);
/* Stops the workers: sig to every process group (unless agent_loop_wait already forwarded it)
 * and SIGCONT, SIGKILL after the grace period; then SIGKILL to every process the workers left
 * outside their groups, so none outlives its attempt. */
void agent_loop_stop_workers(agent_t *a, int sig, int already_sent);
/* Waits before the next try after a failed rendezvous: 100 ms doubling to 5 s, never past the
 * deadline, the signalfd watched all along. 1 if a terminating signal came. */
int agent_loop_backoff(agent_t *a, int64_t deadline_ns);

/* driver.c */
/* Joins rounds (>= a->next_round) until this agent is a member of one. A standby waits as long as
 * its round runs: *deadline_ns moves on while it does. */
agent_rdzv_outcome_t agent_driver_rendezvous(agent_t *a, int64_t *deadline_ns);
/* The store host: the round's standbys into /status and /metrics. */
void agent_driver_publish_standbys(agent_t *a);
/* The round's members (rd.members, once read) into the state for /status. */
void agent_driver_publish_members(agent_t *a);

/* pyhang.c: Python stacks and PyTorch flight-recorder findings in hang reports */
typedef struct agent_pyhang_s agent_pyhang_t;
/* After the run directory and the observer exist: installs sitecustomize.py (unless
 * TDIST_PY_STACKS=0) and the observer's hang hooks. */
void agent_pyhang_setup(agent_t *a);
/* Each turn of the round's loop: reads the stacks asked for; never blocks. */
void agent_pyhang_poll(agent_t *a);
/* A worker failed: reads the attempt's NCCL flight-recorder dumps, if any (up to 10 s), logs the
 * verdict and appends it to what (the failure record). */
void agent_pyhang_flight(agent_t *a, char *what, size_t cap);
void agent_pyhang_free(agent_t *a);

/* round.c */
/* Reaches the store, runs rendezvous and rounds with the restart policy until the job ends or
 * this agent gives up: the exit code (agent_exit_t, a worker's code, or 128 + a signal). */
int agent_run(agent_t *a);

/* jobset.c (--jobset-in-place-restart; each a no-op when it is off) */
/* Before the first rendezvous: reads the JobSet; unless it bypasses the protocol, annotates this
 * pod with its attempt and waits at the barrier (--rdzv-timeout) until the JobSet lifts it. 0:
 * go on; else the exit code. */
int agent_jobset_begin(agent_t *a);
/* One look at the watched JobSet (from agent_loop_wait): 1 once the JobSet restarts the group
 * (previousInPlaceRestartAttempt >= this pod's attempt): the agent must stop and exit. */
int agent_jobset_poll(agent_t *a);
/* The exit code to use instead of rc: IN_PLACE_RESTART_EXIT_CODE when the JobSet restarts the
 * group, or when the agent gives up (restarts used up, a rendezvous that cannot complete, a
 * failure) under the protocol; else rc. */
int agent_jobset_exit_code(agent_t *a, int rc);
/* Stops the watcher. */
void agent_jobset_end(agent_t *a);

#endif
