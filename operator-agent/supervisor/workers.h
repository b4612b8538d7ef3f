/* Starting, watching and stopping the local worker processes.
 *
 * Each worker is fork+exec'd into its own process group (so a signal reaches the worker and
 * everything it spawned), with PR_SET_PDEATHSIG(SIGKILL) so it dies with the agent, the signal
 * mask and dispositions reset, and the torchrun environment (torch-contracts.md §2.2) on top of
 * the agent's own. exec failures are reported synchronously through a close-on-exec pipe. Never
 * blocks except agent_workers_start (fork/exec). Not thread-safe: the main loop owns it. */
#ifndef TDIST_AGENT_WORKERS_H
#define TDIST_AGENT_WORKERS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "operator-agent/config/config.h"
#include "operator-agent/state/state.h"

typedef struct {
  pid_t pid; /* 0 = not running (never started or reaped) */
  int local_rank, global_rank;
  agent_worker_state_t state;
  int exit_code;   /* >= 0 exit status, -N killed by signal N */
  int64_t exit_ns; /* CLOCK_MONOTONIC of the exit */
  char error_file[512];
  char stats_file[512];   /* TDIST_STATS_FILE (include/tdist/stats.h) */
  char pystack_file[512]; /* TDIST_PY_STACKS_FILE ("" when Python stacks are off) */
} agent_worker_t;

typedef struct {
  agent_worker_t *w;
  int n;
  int first_failed;        /* index of the first worker that failed this attempt, or -1 */
  uint64_t exits_total[3]; /* every worker exit so far, all attempts: [0] code 0, [1] non-zero
                            * code, [2] killed by a signal (agent_workers_free keeps them) */
} agent_workers_t;

/* What every worker of this attempt gets. */
typedef struct {
  const agent_cfg_t *cfg;
  int rank_base; /* global rank of local rank 0 */
  int world_size, group_rank, group_world_size, attempt;
  const char *master_addr;
  int master_port;
  const char *run_dir; /* <log_dir>/<run_id>_<pid>: error files go to attempt_N/<local>/ */
  /* Python stacks (operator-agent/pystack/pystack.h): non-NULL, the directory holding the
   * agent's sitecustomize.py, put first on PYTHONPATH with TDIST_PY_STACKS_FILE (the rank's
   * attempt_N/<local>/pystacks.txt) and TDIST_PY_STACKS_SIGNAL=py_stacks_signal. */
  const char *py_stacks_dir;
  int py_stacks_signal;
  /* Optional: more "NAME=VALUE" variables for the worker of global rank `rank`, set last
   * (the PMIx server's, --backend mpi): a NULL-terminated array freed with extra_env_free. */
  int (*extra_env)(void *ctx, int rank, char ***env, char *err, size_t cap);
  void (*extra_env_free)(char **env);
  void *extra_env_ctx;
} agent_worker_spec_t;

/* Records the open-file limit the agent was started with; call once, before anything raises it
 * (the HTTP server raises the soft limit to the hard one for its connections). Workers get the
 * recorded limit back before exec, as under torchrun: a high soft limit breaks programs that
 * still use select(2) and is not what the user set. */
void agent_workers_note_limits(void);

/* Starts cfg->nproc_per_node workers. On failure (fork, or exec of the command) the workers
 * already started are killed and reaped, and err names the command and errno text. */
int agent_workers_start(agent_workers_t *ws, const agent_worker_spec_t *spec, char *err,
                        size_t cap);

/* Reaps every exited child (waitpid(-1, WNOHANG): zombies of orphans too, as PID 1 must).
 * Returns the number of workers that exited in this call. */
int agent_workers_reap(agent_workers_t *ws);

/* Kills every remaining child of this process, the workers' process groups first, then each
 * child (workers and the processes they left behind, which became the agent's children as it is
 * a subreaper or PID 1), reaping them until none is left or deadline_ns (CLOCK_MONOTONIC).
 * Worker exits are recorded as stopped by the agent. Returns how many non-worker processes were
 * reaped; *left as agent_children_kill_all's. Blocks up to the deadline. */
int agent_workers_kill_all(agent_workers_t *ws, int64_t deadline_ns, int *left);

/* Counts of running / succeeded / failed workers. */
int agent_workers_running(const agent_workers_t *ws);
int agent_workers_all_succeeded(const agent_workers_t *ws);

/* Sends sig to the process group of every running worker. */
void agent_workers_signal(agent_workers_t *ws, int sig);

/* Sends sig to each running worker process (not its group) that has a handler installed for it
 * (SigCgt in /proc/PID/status), so a signal whose default action kills (SIGUSR1) reaches the
 * programs that asked for it and never kills one that did not. Returns how many got it. */
int agent_workers_signal_handlers(agent_workers_t *ws, int sig);

/* Marks still-running workers as stopped-by-agent (their exit later is not a failure). */
void agent_workers_mark_stopping(agent_workers_t *ws);

/* Copies the workers' view into the state (under its lock). */
void agent_workers_publish(const agent_workers_t *ws, agent_state_t *st);

void agent_workers_free(agent_workers_t *ws);

#endif
