/* The agent's observable state: written by the main loop, read by the HTTP thread (/metrics,
 * /status, /healthz, /readyz). One mutex guards everything; the main loop holds it only to copy
 * small values in, the HTTP thread only while rendering. No pointer into the struct escapes the
 * lock. */
#ifndef TDIST_AGENT_STATE_H
#define TDIST_AGENT_STATE_H

#include <pthread.h>
#include <stdint.h>
#include <sys/types.h>

#include <tdist/store.h>

typedef enum {
  AGENT_STATE_STARTING = 0,   /* parsing config, discovery (DNS) */
  AGENT_STATE_RENDEZVOUS = 1, /* joining / waiting for a round */
  AGENT_STATE_RUNNING = 2,    /* workers running */
  AGENT_STATE_STOPPING = 3,   /* stopping workers (restart or shutdown) */
  AGENT_STATE_SUCCEEDED = 4,  /* all workers exited 0; exit barrier done */
  AGENT_STATE_FAILED = 5,     /* giving up; the agent is about to exit non-zero */
  AGENT_STATE_STANDBY = 6, /* a spare: in the rendezvous, no workers, takes a lost member's place */
  AGENT_NSTATES = 7
} agent_run_state_t;

/* Why a round ended and workers were restarted (label values of tdist_restarts_total{reason}). */
typedef enum {
  AGENT_RESTART_WORKER_FAILED = 0, /* "worker_failed": a worker on some node exited non-zero */
  AGENT_RESTART_PEER_LOST = 1,     /* "peer_lost": a peer agent stopped heartbeating or left */
  AGENT_RESTART_STORE_LOST = 2,    /* "store_lost": the store host went away */
  AGENT_RESTART_MEMBERSHIP = 3,    /* "membership": a node joined (scale up) or replaced another */
  AGENT_RESTART_PROTOCOL = 4,      /* "protocol_error": a store record no agent would write */
  AGENT_RESTART_NREASONS = 5
} agent_restart_reason_t;

typedef enum {
  AGENT_WORKER_PENDING = 0,   /* "pending" */
  AGENT_WORKER_RUNNING = 1,   /* "running" */
  AGENT_WORKER_SUCCEEDED = 2, /* "succeeded" */
  AGENT_WORKER_FAILED = 3,    /* "failed" */
  AGENT_WORKER_STOPPED = 4,   /* "stopped": stopped by the agent */
  AGENT_WORKER_NSTATES = 5
} agent_worker_state_t;

typedef struct {
  int local_rank, global_rank;
  pid_t pid; /* 0 when not started */
  agent_worker_state_t state;
  int exit_code;        /* >= 0 exit status, -N killed by signal N (torchrun's convention) */
  char stats_file[512]; /* TDIST_STATS_FILE of the worker ("" = none) */
} agent_worker_info_t;

typedef struct {
  int node_rank, group_rank;
  char addr[64]; /* the member's address as it reported it (IP) */
  char host[64]; /* its hostname */
} agent_member_info_t;

/* One local worker's process as the observer last sampled it (operator-agent/procstat/): the
 * tdist_rank_* process series. Counters are the process's own (a restart starts them again). */
#define AGENT_RANK_MAX_GPUS 8
typedef struct {
  int local_rank, global_rank;
  pid_t pid;
  double cpu_user_s, cpu_system_s;
  uint64_t rss_bytes, threads, vcsw, ivcsw, read_bytes, write_bytes;
  int have_io;
  char state;            /* /proc stat state letter */
  char stall_reason[16]; /* "" = not named by the hang detector, else its reason */
  int ngpus;             /* GPU use (NVML), one entry per device the process is on */
  int gpu[AGENT_RANK_MAX_GPUS], gpu_have_mem[AGENT_RANK_MAX_GPUS];
  int gpu_have_util[AGENT_RANK_MAX_GPUS];
  uint64_t gpu_mem_bytes[AGENT_RANK_MAX_GPUS];
  double gpu_util[AGENT_RANK_MAX_GPUS];
} agent_rank_proc_t;

#define AGENT_MAX_LOCAL_WORKERS 4096
#define AGENT_RDZV_BUCKETS \
  12 /* rendezvous duration histogram: le = 0.01 0.05 0.1 0.25 0.5 1 2.5 5 10 30 60 120, +Inf */

typedef struct {
  pthread_mutex_t mu;

  /* identity (fixed after start-up) */
  double start_time_unix; /* process start, seconds since epoch */
  int node_rank;          /* -1 until discovered */
  int nproc_per_node;
  int nnodes_min, nnodes_max;
  char run_id[128];
  char role[64];
  char backend[16];
  int is_store_host;                         /* node rank 0: hosts the store */
  tdist_store_server_t *store_server;        /* node 0 only; the HTTP thread reads its stats */
  tdist_store_server_t *worker_store_server; /* node 0: the current round's workers' store */

  /* liveness: the main loop stamps this every iteration (CLOCK_MONOTONIC ns) */
  int64_t loop_tick_ns;
  int ready; /* up, and on node 0 the store listens */

  agent_run_state_t state;
  int64_t round;     /* current rendezvous round, -1 before the first */
  int restart_count; /* TORCHELASTIC_RESTART_COUNT of the current round's workers (set when the
                      * round is joined: `workers` shows the last attempt's until they start) */
  int max_restarts;
  int group_rank, group_world_size, world_size;
  char master_addr[256];
  int master_port;        /* the agents' store */
  int worker_master_port; /* MASTER_PORT of the running workers: their round's store */

  agent_member_info_t *members; /* group_world_size entries (owned; replace under the lock) */
  int nmembers;
  /* Node 0 (group rank 0): the standbys of the current round (group_rank -1), as last read, and
   * how many of them still heartbeat. Others: none. */
  agent_member_info_t *standbys; /* owned; replace under the lock */
  int nstandbys, standbys_live;
  int spares; /* --spares */

  agent_worker_info_t *workers; /* nproc_per_node entries */
  int nworkers;

  /* counters (monotonic) */
  uint64_t restarts_total[AGENT_RESTART_NREASONS];
  uint64_t rendezvous_total, rendezvous_failures_total;
  uint64_t rdzv_bucket[AGENT_RDZV_BUCKETS + 1]; /* non-cumulative counts; last = +Inf */
  double rdzv_duration_sum_s;
  uint64_t worker_exits_total[3]; /* [0] code 0, [1] non-zero code, [2] killed by a signal */
  uint64_t dns_resolve_failures_total;
  uint64_t store_reconnects_total;
  double last_rendezvous_unix; /* 0 = never */

  char last_error[512]; /* "" = none; the root cause of the last failure */

  /* Node 0 only: where every rank of the job is, from the progress all agents publish in the
   * store ("ranks 3,5 stuck in all_reduce #1234 for 140 s, others at #1235"); "" = unknown. */
  char progress_summary[1024];
  int64_t progress_unix; /* when it was computed (0 = never) */

  /* The observer (operator-agent/procstat/observe.h): the running workers' last samples (owned;
   * replaced under the lock), the agent's CPU spent sampling, the /status "hang" object ("" =
   * none; owned, AGENT_HANG_JSON_CAP bytes), and whether GPU series can be there. */
  agent_rank_proc_t *rank_procs;
  int nrank_procs;
  double sample_cpu_s;
  char *hang_json;
  int gpu_monitoring;           /* 1: NVML loaded */
  char gpu_monitoring_why[256]; /* why not, when 0 ("" before the observer starts) */
} agent_state_t;

void agent_state_init(agent_state_t *st);
void agent_state_destroy(agent_state_t *st);
void agent_state_lock(agent_state_t *st);
void agent_state_unlock(agent_state_t *st);

/* Label values. */
const char *agent_run_state_name(agent_run_state_t s);
const char *agent_restart_reason_name(agent_restart_reason_t r);
const char *agent_worker_state_name(agent_worker_state_t s);

/* Bucket upper bounds (seconds), AGENT_RDZV_BUCKETS entries. */
extern const double agent_rdzv_bucket_le[AGENT_RDZV_BUCKETS];

/* Under the lock: records one finished rendezvous that took `seconds`. */
void agent_state_observe_rdzv(agent_state_t *st, double seconds);

/* Takes the lock: last_error becomes msg (truncated to fit). */
void agent_state_set_error(agent_state_t *st, const char *msg);

#endif
