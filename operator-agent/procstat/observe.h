/* The agent's per-rank observer (issue 37 items 1 and 2): at the monitor interval it samples
 * every running worker's /proc (procstat.h) and, where NVML is there, its GPU use (nvml.h),
 * runs the hang detector (hang.h) and publishes the results into agent_state_t for /metrics
 * (tdist_rank_* series) and /status ("hang", "gpu_monitoring"). When a hang is named it builds
 * the /status "hang" object: the rank, the reason, since when, and every thread of that rank
 * and of the peers waiting on it (comm, state, wchan).
 *
 * Extension point (obs2: Python stacks, PyTorch flight recorder): agent_obs_set_hang_hooks.
 * Every function runs on the agent's loop thread; nothing here blocks beyond /proc reads and
 * one dlopen at creation. */
#ifndef TDIST_AGENT_OBSERVE_H
#define TDIST_AGENT_OBSERVE_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "operator-agent/procstat/hang.h"
#include "operator-agent/state/state.h"
#include "operator-agent/supervisor/workers.h"

typedef struct agent_obs_s agent_obs_t;

typedef struct {
  double interval_s;     /* sampling period: --monitor-interval */
  double stall_s;        /* TDIST_STALL_REPORT_SECONDS */
  double deadline_s;     /* TDIST_PROGRESS_DEADLINE_SECONDS, 0 = off */
  const char *nvml_lib;  /* NULL = "libnvidia-ml.so.1" (tests name a missing one) */
  const char *proc_root; /* NULL = "/proc" */
} agent_obs_cfg_t;

/* Creates the observer; tries NVML once and logs one line saying whether GPU series will be
 * there and why not. NULL only when memory runs out. */
agent_obs_t *agent_obs_create(const agent_obs_cfg_t *cfg, agent_state_t *st);
/* NULL is a no-op. Clears what it published in st. */
void agent_obs_destroy(agent_obs_t *o);

/* Samples if the interval has passed since the last sample (now_ns: CLOCK_MONOTONIC), judges,
 * publishes. Cheap when not due. Workers not running (exited, not started) are left out. NULL:
 * a no-op. The agent calls it from its round loop (agent/round.c run_round) after each wait. */
void agent_obs_tick(agent_obs_t *o, const agent_workers_t *ws, int64_t now_ns);

/* What a hook is told about a named hang. Pointers are valid during the call only. */
typedef struct {
  uint64_t generation; /* changes whenever the hang changes shape (other rank, reason, peers) */
  int rank, local_rank;
  pid_t pid;
  agent_stall_reason_t reason;
  double since_unix; /* when the rank started holding the job (seconds since the epoch) */
  int nwaiting;      /* the local peers waiting on it */
  const int *waiting_ranks;
  const pid_t *waiting_pids;
} agent_hang_event_t;

typedef struct {
  void *ctx;
  /* A hang was named or changed shape (ev), or ended (ev NULL). May start work that takes time
   * (signal a worker, read a dump) but must not block; call agent_obs_refresh when findings
   * arrive. Optional. */
  void (*on_hang)(void *ctx, const agent_hang_event_t *ev);
  /* While the /status "hang" object is (re)built: write more members of that object into out
   * (cap bytes, NUL-terminated), each preceded by a comma, e.g. `,"python_stacks":{...}`; valid
   * JSON is the hook's job. Returns the bytes written (0: nothing). Optional. */
  size_t (*append_json)(void *ctx, const agent_hang_event_t *ev, char *out, size_t cap);
} agent_hang_hooks_t;

/* Installs the hooks (copied; NULL removes them). o NULL (TDIST_RANK_METRICS=0): a no-op. */
void agent_obs_set_hang_hooks(agent_obs_t *o, const agent_hang_hooks_t *h);

/* Asks for the /status "hang" object to be rebuilt at the next sample (hooks have news); NULL:
 * a no-op. */
void agent_obs_refresh(agent_obs_t *o);

/* Bytes reserved for the whole "hang" object (threads of every rank in it plus the hooks'
 * members); what does not fit is cut at a member boundary and "truncated":true added. */
#define AGENT_HANG_JSON_CAP (256 * 1024)

#endif
