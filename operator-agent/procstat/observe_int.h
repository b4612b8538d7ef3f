/* Inside the observer (observe.c, hang_report.c): its struct. */
#ifndef TDIST_AGENT_OBSERVE_INT_H
#define TDIST_AGENT_OBSERVE_INT_H

#include <tdist/stats.h>

#include "operator-agent/procstat/hang.h"
#include "operator-agent/procstat/nvml.h"
#include "operator-agent/procstat/observe.h"
#include "operator-agent/procstat/procstat.h"

#define OBS_MAX_GPU_PROCS 512
#define OBS_MAX_THREADS 128                /* threads listed per rank in the hang report */
#define OBS_REPORT_REFRESH_NS 5000000000LL /* a lasting hang's report is rebuilt this often */

struct agent_obs_s {
  agent_state_t *st;
  agent_hang_cfg_t hc;
  int64_t interval_ns, next_ns, next_stats_ns;
  char proc_root[256];
  agent_nvml_t *nvml;
  int nvml_warned, read_warned;
  int cap;               /* entries in hr, cur, pub */
  agent_hang_rank_t *hr; /* the detector's per-rank state */
  agent_proc_sample_t *cur;
  agent_proc_files_t *files; /* each worker's /proc files, open while it runs */
  agent_rank_proc_t *pub;    /* what goes to st->rank_procs */
  tdist_stats_file_t *stats;
  agent_gpu_use_t gpu[OBS_MAX_GPU_PROCS];
  char buf[16384]; /* /proc file scratch */
  agent_thread_info_t threads[OBS_MAX_THREADS];
  /* the hang report */
  agent_hang_hooks_t hooks;
  int refresh;
  uint64_t generation;
  char shape[512];       /* the last hang's shape ("" = none) */
  int64_t report_ns;     /* when the report was last built */
  char *json;            /* AGENT_HANG_JSON_CAP */
  int waiting_ranks[64]; /* for agent_hang_event_t */
  pid_t waiting_pids[64];
};

/* hang_report.c: builds (or clears) the /status "hang" object after a judgement and copies it
 * into st; calls the hooks. */
void agent_obs_report(agent_obs_t *o, int n, int first, int64_t now_ns);

#endif
