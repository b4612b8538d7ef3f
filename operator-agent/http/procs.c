/* /metrics and /status parts built from the observer's samples (operator-agent/procstat/):
 * the tdist_rank_* process series of every running worker, the hang detector's verdict, and
 * whether GPU series can be there. The samples are copied out under the state lock and
 * rendered after it. A sample is shown only while its worker still runs (its pid is a running
 * worker's in st->workers): a rank that exited, or a round that ended, shows no series. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "operator-agent/http/buf.h"
#include "operator-agent/http/ranks.h"

typedef struct {
  agent_rank_proc_t *p;
  int n;
  double sample_cpu_s;
} procs_t;

static int running_pid(const agent_state_t *st, pid_t pid) {
  for (int i = 0; st->workers && i < st->nworkers; i++)
    if (st->workers[i].pid == pid && st->workers[i].state == AGENT_WORKER_RUNNING) return 1;
  return 0;
}

static void copy_procs(agent_state_t *st, procs_t *out) {
  memset(out, 0, sizeof *out);
  agent_state_lock(st);
  out->sample_cpu_s = st->sample_cpu_s;
  if (st->rank_procs && st->nrank_procs > 0)
    out->p = malloc((size_t)st->nrank_procs * sizeof *out->p);
  for (int i = 0; out->p && i < st->nrank_procs; i++)
    if (st->rank_procs[i].pid > 0 && running_pid(st, st->rank_procs[i].pid))
      out->p[out->n++] = st->rank_procs[i];
  agent_state_unlock(st);
}

static void family(agent_buf_t *b, const char *name, const char *type, const char *help) {
  agent_buf_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void series(agent_buf_t *b, const char *name, const agent_rank_proc_t *p) {
  agent_buf_printf(b, "%s{rank=\"%d\",local_rank=\"%d\"", name, p->global_rank, p->local_rank);
}

static void value_u(agent_buf_t *b, uint64_t v) { agent_buf_printf(b, "} %" PRIu64 "\n", v); }

static void value_d(agent_buf_t *b, double v) {
  agent_buf_puts(b, "} ");
  agent_buf_double(b, v);
  agent_buf_puts(b, "\n");
}

static void render_states(agent_buf_t *b, const procs_t *s) {
  static const char states[] = "RSDTtZI";
  family(b, "tdist_rank_process_state", "gauge",
         "The rank's process state (proc(5) stat letter): 1 for the current one, 0 for the "
         "others.");
  for (int i = 0; i < s->n; i++) {
    const agent_rank_proc_t *p = &s->p[i];
    int known = 0;
    for (const char *c = states; *c; c++) {
      series(b, "tdist_rank_process_state", p);
      agent_buf_printf(b, ",state=\"%c\"} %d\n", *c, p->state == *c);
      known |= p->state == *c;
    }
    if (!known && p->state > 0x20 && p->state < 0x7f && p->state != '"' && p->state != '\\') {
      series(b, "tdist_rank_process_state", p);
      agent_buf_printf(b, ",state=\"%c\"} 1\n", p->state);
    }
  }
}

static void render_gpus(agent_buf_t *b, const procs_t *s) {
  int any_util = 0, any_mem = 0;
  for (int i = 0; i < s->n; i++)
    for (int g = 0; g < s->p[i].ngpus; g++) {
      any_util |= s->p[i].gpu_have_util[g];
      any_mem |= s->p[i].gpu_have_mem[g];
    }
  if (any_util) {
    family(b, "tdist_rank_gpu_utilization_ratio", "gauge",
           "Share of the GPU's SM time the rank's process used over NVML's last sample period.");
    for (int i = 0; i < s->n; i++)
      for (int g = 0; g < s->p[i].ngpus; g++) {
        if (!s->p[i].gpu_have_util[g]) continue;
        series(b, "tdist_rank_gpu_utilization_ratio", &s->p[i]);
        agent_buf_printf(b, ",gpu=\"%d\"", s->p[i].gpu[g]);
        value_d(b, s->p[i].gpu_util[g]);
      }
  }
  if (any_mem) {
    family(b, "tdist_rank_gpu_memory_bytes", "gauge",
           "GPU memory used by the rank's process, per device (NVML).");
    for (int i = 0; i < s->n; i++)
      for (int g = 0; g < s->p[i].ngpus; g++) {
        if (!s->p[i].gpu_have_mem[g]) continue;
        series(b, "tdist_rank_gpu_memory_bytes", &s->p[i]);
        agent_buf_printf(b, ",gpu=\"%d\"", s->p[i].gpu[g]);
        value_u(b, s->p[i].gpu_mem_bytes[g]);
      }
  }
}

void agent_metrics_render_procs(agent_buf_t *b, agent_state_t *st) {
  procs_t s;
  copy_procs(st, &s);
  family(b, "tdist_agent_sample_seconds_total", "counter",
         "CPU time the agent spent sampling its workers' /proc and GPU use and judging hangs.");
  agent_buf_puts(b, "tdist_agent_sample_seconds_total ");
  agent_buf_double(b, s.sample_cpu_s);
  agent_buf_puts(b, "\n");
  if (!s.n) {
    free(s.p);
    return;
  }
  family(b, "tdist_rank_cpu_seconds_total", "counter",
         "CPU time of the rank's process (all its threads), by mode.");
  for (int i = 0; i < s.n; i++) {
    series(b, "tdist_rank_cpu_seconds_total", &s.p[i]);
    agent_buf_puts(b, ",mode=\"user\"");
    value_d(b, s.p[i].cpu_user_s);
    series(b, "tdist_rank_cpu_seconds_total", &s.p[i]);
    agent_buf_puts(b, ",mode=\"system\"");
    value_d(b, s.p[i].cpu_system_s);
  }
  family(b, "tdist_rank_resident_memory_bytes", "gauge",
         "Resident memory of the rank's process (VmRSS).");
  for (int i = 0; i < s.n; i++) {
    series(b, "tdist_rank_resident_memory_bytes", &s.p[i]);
    value_u(b, s.p[i].rss_bytes);
  }
  family(b, "tdist_rank_threads", "gauge", "Threads of the rank's process.");
  for (int i = 0; i < s.n; i++) {
    series(b, "tdist_rank_threads", &s.p[i]);
    value_u(b, s.p[i].threads);
  }
  render_states(b, &s);
  family(b, "tdist_rank_context_switches_total", "counter",
         "Context switches of the rank's main thread, voluntary (it waited) or involuntary "
         "(preempted).");
  for (int i = 0; i < s.n; i++) {
    series(b, "tdist_rank_context_switches_total", &s.p[i]);
    agent_buf_puts(b, ",kind=\"voluntary\"");
    value_u(b, s.p[i].vcsw);
    series(b, "tdist_rank_context_switches_total", &s.p[i]);
    agent_buf_puts(b, ",kind=\"involuntary\"");
    value_u(b, s.p[i].ivcsw);
  }
  int any_io = 0;
  for (int i = 0; i < s.n; i++) any_io |= s.p[i].have_io;
  if (any_io) {
    family(b, "tdist_rank_io_bytes_total", "counter",
           "Bytes the rank's process read or wrote through system calls (files, pipes, sockets: "
           "/proc/PID/io rchar, wchar).");
    for (int i = 0; i < s.n; i++) {
      if (!s.p[i].have_io) continue;
      series(b, "tdist_rank_io_bytes_total", &s.p[i]);
      agent_buf_puts(b, ",direction=\"read\"");
      value_u(b, s.p[i].read_bytes);
      series(b, "tdist_rank_io_bytes_total", &s.p[i]);
      agent_buf_puts(b, ",direction=\"write\"");
      value_u(b, s.p[i].write_bytes);
    }
  }
  render_gpus(b, &s);
  int any_stall = 0;
  for (int i = 0; i < s.n; i++) any_stall |= s.p[i].stall_reason[0] != 0;
  if (any_stall) {
    family(b, "tdist_rank_stalled", "gauge",
           "1 while the hang detector names the rank as holding the job, with its reason.");
    for (int i = 0; i < s.n; i++) {
      if (!s.p[i].stall_reason[0]) continue;
      series(b, "tdist_rank_stalled", &s.p[i]);
      agent_buf_puts(b, ",reason=\"");
      agent_buf_prom_label(b, s.p[i].stall_reason);
      agent_buf_puts(b, "\"} 1\n");
    }
  }
  free(s.p);
}

void agent_status_render_hang(agent_buf_t *b, agent_state_t *st) {
  agent_state_lock(st);
  agent_buf_puts(b, "\"hang\":");
  /* Built by the observer as valid JSON (hang_report.c), bounded by AGENT_HANG_JSON_CAP. */
  if (st->hang_json && st->hang_json[0])
    agent_buf_puts(b, st->hang_json);
  else
    agent_buf_puts(b, "null");
  agent_buf_printf(b, ",\"gpu_monitoring\":{\"available\":%s,\"reason\":",
                   st->gpu_monitoring ? "true" : "false");
  if (st->gpu_monitoring || !st->gpu_monitoring_why[0])
    agent_buf_puts(b, "null");
  else
    agent_buf_json_str(b, st->gpu_monitoring_why, sizeof st->gpu_monitoring_why);
  agent_buf_puts(b, "}");
  agent_state_unlock(st);
}
