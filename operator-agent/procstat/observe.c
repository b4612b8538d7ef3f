/* See observe.h. One sample: per running worker three pread(2)s of its /proc files, kept open
 * while it runs (procstat.c), at most once a second its libtdist statistics file, one NVML query
 * for all devices; then the hang detector and one copy into agent_state_t under its lock.
 * Buffers grow only when the number of workers does; a steady job's samples allocate nothing.
 * The "hang" JSON (hang_report.c) is rebuilt when the hang changes shape, every
 * OBS_REPORT_REFRESH_NS while it lasts, and on agent_obs_refresh. */
#define _GNU_SOURCE
#include "operator-agent/procstat/observe.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <tdist/stats.h>

#include "operator-agent/common/log.h"
#include "operator-agent/procstat/nvml.h"
#include "operator-agent/procstat/observe_int.h"

#define STATS_PERIOD_NS 1000000000LL

static int64_t thread_cpu_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

agent_obs_t *agent_obs_create(const agent_obs_cfg_t *cfg, agent_state_t *st) {
  agent_obs_t *o = calloc(1, sizeof *o);
  if (!o) return NULL;
  o->json = malloc(AGENT_HANG_JSON_CAP);
  o->stats = malloc(sizeof *o->stats);
  if (!o->json || !o->stats) {
    free(o->json);
    free(o->stats);
    free(o);
    return NULL;
  }
  o->json[0] = 0;
  o->st = st;
  o->interval_ns = (int64_t)(cfg->interval_s * 1e9);
  o->hc.stall_s = cfg->stall_s;
  o->hc.deadline_s = cfg->deadline_s;
  o->hc.hz = sysconf(_SC_CLK_TCK);
  if (o->hc.hz <= 0) o->hc.hz = 100;
  snprintf(o->proc_root, sizeof o->proc_root, "%s", cfg->proc_root ? cfg->proc_root : "/proc");
  char why[256] = "";
  o->nvml = agent_nvml_open(cfg->nvml_lib, why, sizeof why);
  if (o->nvml)
    AGENT_INFO("GPU monitoring: NVML loaded; per-rank GPU series on /metrics");
  else
    AGENT_INFO("GPU monitoring not available: %s; no tdist_rank_gpu_* series", why);
  agent_state_lock(st);
  st->gpu_monitoring = o->nvml != NULL;
  snprintf(st->gpu_monitoring_why, sizeof st->gpu_monitoring_why, "%s", o->nvml ? "" : why);
  agent_state_unlock(st);
  return o;
}

void agent_obs_destroy(agent_obs_t *o) {
  if (!o) return;
  agent_state_lock(o->st);
  free(o->st->rank_procs);
  o->st->rank_procs = NULL;
  o->st->nrank_procs = 0;
  if (o->st->hang_json) o->st->hang_json[0] = 0;
  agent_state_unlock(o->st);
  agent_nvml_close(o->nvml);
  for (int i = 0; i < o->cap; i++) agent_procstat_close(&o->files[i]);
  free(o->files);
  free(o->hr);
  free(o->cur);
  free(o->pub);
  free(o->json);
  free(o->stats);
  free(o);
}

void agent_obs_set_hang_hooks(agent_obs_t *o, const agent_hang_hooks_t *h) {
  if (!o) return;
  if (h)
    o->hooks = *h;
  else
    memset(&o->hooks, 0, sizeof o->hooks);
}

void agent_obs_refresh(agent_obs_t *o) {
  if (o) o->refresh = 1;
}

/* Room for n workers (grows only). 0, or -1 when memory runs out. */
static int reserve(agent_obs_t *o, int n) {
  if (n <= o->cap) return 0;
  agent_hang_rank_t *hr = realloc(o->hr, (size_t)n * sizeof *hr);
  if (hr) o->hr = hr;
  agent_proc_sample_t *cur = realloc(o->cur, (size_t)n * sizeof *cur);
  if (cur) o->cur = cur;
  agent_rank_proc_t *pub = realloc(o->pub, (size_t)n * sizeof *pub);
  if (pub) o->pub = pub;
  agent_proc_files_t *files = realloc(o->files, (size_t)n * sizeof *files);
  if (files) o->files = files;
  if (!hr || !cur || !pub || !files) return -1;
  memset(o->hr + o->cap, 0, (size_t)(n - o->cap) * sizeof *hr);
  for (int i = o->cap; i < n; i++) o->files[i] = (agent_proc_files_t)AGENT_PROC_FILES_INIT;
  o->cap = n;
  return 0;
}

/* The libtdist inputs of rank i, read at most once a second (the file is ~20 KiB). */
static void read_libtdist(agent_obs_t *o, const agent_worker_t *w, agent_hang_rank_t *h,
                          int64_t now_ns, int due) {
  if (!w->stats_file[0]) {
    h->libtdist = 0;
    return;
  }
  if (!due) return;
  if (tdist_stats_read(w->stats_file, o->stats) != TDIST_OK || o->stats->pid != w->pid) {
    h->libtdist = 0;
    return;
  }
  struct timespec rt;
  clock_gettime(CLOCK_REALTIME, &rt);
  int64_t now_unix = (int64_t)rt.tv_sec * 1000000000LL + rt.tv_nsec;
  h->libtdist = 1;
  h->cur_seq = o->stats->cur_seq;
  h->last_seq = o->stats->last_seq;
  h->collective_s = o->stats->cur_seq && o->stats->cur_start_ns
                        ? (double)(now_unix - o->stats->cur_start_ns) / 1e9
                        : 0;
  (void)now_ns;
}

/* GPU use of the sampled workers: one NVML query, matched by pid. */
static void sample_gpus(agent_obs_t *o, int n) {
  for (int i = 0; i < n; i++) o->pub[i].ngpus = 0;
  if (!o->nvml) return;
  char why[256];
  int k = agent_nvml_sample(o->nvml, o->gpu, OBS_MAX_GPU_PROCS, why, sizeof why);
  if (k < 0) {
    if (!o->nvml_warned) AGENT_WARN("GPU monitoring: %s", why);
    o->nvml_warned = 1;
    return;
  }
  for (int j = 0; j < k; j++)
    for (int i = 0; i < n; i++) {
      agent_rank_proc_t *p = &o->pub[i];
      if (p->pid != o->gpu[j].pid || p->ngpus >= AGENT_RANK_MAX_GPUS) continue;
      p->gpu[p->ngpus] = o->gpu[j].gpu;
      p->gpu_have_mem[p->ngpus] = o->gpu[j].have_mem;
      p->gpu_mem_bytes[p->ngpus] = o->gpu[j].mem_bytes;
      p->gpu_have_util[p->ngpus] = o->gpu[j].have_util;
      p->gpu_util[p->ngpus] = o->gpu[j].util;
      p->ngpus++;
    }
}

static void fill_pub(agent_obs_t *o, int i, const agent_worker_t *w, int ok) {
  agent_rank_proc_t *p = &o->pub[i];
  const agent_proc_sample_t *s = &o->cur[i];
  memset(p, 0, sizeof *p);
  p->local_rank = w->local_rank;
  p->global_rank = w->global_rank;
  p->pid = ok ? w->pid : 0;
  if (!ok) return;
  p->cpu_user_s = (double)s->utime_ticks / (double)o->hc.hz;
  p->cpu_system_s = (double)s->stime_ticks / (double)o->hc.hz;
  p->rss_bytes = s->rss_bytes;
  p->threads = s->threads;
  p->vcsw = s->vcsw;
  p->ivcsw = s->ivcsw;
  p->have_io = s->have_io;
  p->read_bytes = s->rchar;
  p->write_bytes = s->wchar;
  p->state = s->state;
  if (o->hr[i].reason)
    snprintf(p->stall_reason, sizeof p->stall_reason, "%s",
             agent_stall_reason_name(o->hr[i].reason));
}

static void publish(agent_obs_t *o, int n, double spent_s) {
  agent_state_t *st = o->st;
  agent_state_lock(st);
  if (st->nrank_procs != n) {
    agent_rank_proc_t *p = n ? realloc(st->rank_procs, (size_t)n * sizeof *p) : NULL;
    if (n && !p) {
      agent_state_unlock(st);
      return;
    }
    if (!n) free(st->rank_procs);
    st->rank_procs = p;
    st->nrank_procs = n;
  }
  if (n) memcpy(st->rank_procs, o->pub, (size_t)n * sizeof *o->pub);
  st->sample_cpu_s += spent_s;
  agent_state_unlock(st);
}

void agent_obs_tick(agent_obs_t *o, const agent_workers_t *ws, int64_t now_ns) {
  if (!o || now_ns < o->next_ns) return;
  o->next_ns = now_ns + o->interval_ns;
  int64_t t0 = thread_cpu_ns();
  int n = ws->n;
  if (reserve(o, n)) return;
  int stats_due = now_ns >= o->next_stats_ns;
  if (stats_due) o->next_stats_ns = now_ns + STATS_PERIOD_NS;
  for (int i = 0; i < n; i++) {
    const agent_worker_t *w = &ws->w[i];
    agent_hang_rank_t *h = &o->hr[i];
    h->global_rank = w->global_rank;
    h->local_rank = w->local_rank;
    int ok = 0;
    agent_proc_files_t *f = &o->files[i];
    if (w->pid > 0 && w->state == AGENT_WORKER_RUNNING) {
      int rc = f->pid == w->pid ? 0 : agent_procstat_open(f, o->proc_root, w->pid);
      if (!rc) rc = agent_procstat_sample(f, &o->cur[i], o->buf, sizeof o->buf);
      if (rc) agent_procstat_close(f);
      ok = rc == 0;
      if (rc && rc != -ESRCH && !o->read_warned) {
        AGENT_WARN("cannot sample worker pid %d from %s: %s", (int)w->pid, o->proc_root,
                   strerror(-rc));
        o->read_warned = 1;
      }
    }
    if (!ok) agent_procstat_close(f); /* exited, stopped by the agent: let the files go */
    h->pid = ok ? w->pid : 0;
    if (ok) {
      h->t_ns = o->cur[i].t_ns;
      h->ticks = o->cur[i].utime_ticks + o->cur[i].stime_ticks;
      h->state = o->cur[i].state;
      h->io = o->cur[i].rchar + o->cur[i].wchar;
      read_libtdist(o, w, h, now_ns, stats_due || h->seen_pid != w->pid);
    }
  }
  int first = -1;
  agent_hang_judge(o->hr, n, &o->hc, now_ns, &first);
  for (int i = 0; i < n; i++) fill_pub(o, i, &ws->w[i], o->hr[i].pid > 0);
  sample_gpus(o, n);
  agent_obs_report(o, n, first, now_ns);
  publish(o, n, (double)(thread_cpu_ns() - t0) / 1e9);
}
