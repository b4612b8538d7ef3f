/* /status: the agent's state as one JSON object (schema and null rules in http.h).
 *
 * Rendered under the state lock straight from the struct: the members and workers arrays may be
 * replaced by the main loop at any time, so no pointer into them outlives the lock. The output is
 * bounded by the struct (at most AGENT_MAX_LOCAL_WORKERS workers and group_world_size members).
 * Fixed-size char fields are read with their size as a bound, never trusted to hold a NUL. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "operator-agent/http/buf.h"
#include "operator-agent/http/http.h"
#include "operator-agent/http/ranks.h"

#define JSON_FIELD(b, s, f) agent_buf_json_str((b), (s)->f, sizeof(s)->f)

static int worker_exited(const agent_worker_info_t *w) {
  return w->pid > 0 && (w->state == AGENT_WORKER_SUCCEEDED || w->state == AGENT_WORKER_FAILED ||
                        w->state == AGENT_WORKER_STOPPED);
}

static void render(agent_buf_t *b, const agent_state_t *st) {
  agent_buf_puts(b, "{\"state\":");
  agent_buf_json_str(b, agent_run_state_name(st->state), 64);
  agent_buf_printf(b, ",\"node_rank\":%d,\"run_id\":", st->node_rank);
  JSON_FIELD(b, st, run_id);
  agent_buf_puts(b, ",\"role\":");
  JSON_FIELD(b, st, role);
  agent_buf_puts(b, ",\"backend\":");
  JSON_FIELD(b, st, backend);
  agent_buf_printf(b,
                   ",\"round\":%" PRId64
                   ",\"restart_count\":%d,\"max_restarts\":%d"
                   ",\"group_rank\":%d,\"group_world_size\":%d,\"world_size\":%d"
                   ",\"master_addr\":",
                   st->round, st->restart_count, st->max_restarts, st->group_rank,
                   st->group_world_size, st->world_size);
  JSON_FIELD(b, st, master_addr);
  agent_buf_printf(b,
                   ",\"master_port\":%d,\"worker_master_port\":%d,\"is_store_host\":%s"
                   ",\"members\":[",
                   st->master_port, st->worker_master_port, st->is_store_host ? "true" : "false");
  for (int i = 0; st->members && i < st->nmembers; i++) {
    const agent_member_info_t *m = &st->members[i];
    agent_buf_printf(b, "%s{\"node_rank\":%d,\"group_rank\":%d,\"addr\":", i ? "," : "",
                     m->node_rank, m->group_rank);
    JSON_FIELD(b, m, addr);
    agent_buf_puts(b, ",\"host\":");
    JSON_FIELD(b, m, host);
    agent_buf_puts(b, "}");
  }
  agent_buf_printf(b, "],\"spares\":%d,\"standbys_live\":", st->spares);
  if (st->is_store_host)
    agent_buf_printf(b, "%d", st->standbys_live);
  else
    agent_buf_puts(b, "null");
  agent_buf_puts(b, ",\"standbys\":[");
  for (int i = 0; st->standbys && i < st->nstandbys; i++) {
    const agent_member_info_t *m = &st->standbys[i];
    agent_buf_printf(b, "%s{\"node_rank\":%d,\"addr\":", i ? "," : "", m->node_rank);
    JSON_FIELD(b, m, addr);
    agent_buf_puts(b, ",\"host\":");
    JSON_FIELD(b, m, host);
    agent_buf_puts(b, "}");
  }
  agent_buf_puts(b, "],\"workers\":[");
  for (int i = 0; st->workers && i < st->nworkers; i++) {
    const agent_worker_info_t *w = &st->workers[i];
    agent_buf_printf(b,
                     "%s{\"local_rank\":%d,\"global_rank\":%d,\"pid\":%ld,\"state\":", i ? "," : "",
                     w->local_rank, w->global_rank, (long)w->pid);
    agent_buf_json_str(b, agent_worker_state_name(w->state), 64);
    if (worker_exited(w))
      agent_buf_printf(b, ",\"exit_code\":%d}", w->exit_code);
    else
      agent_buf_puts(b, ",\"exit_code\":null}");
  }
  agent_buf_puts(b, "],\"last_error\":");
  if (st->last_error[0])
    JSON_FIELD(b, st, last_error);
  else
    agent_buf_puts(b, "null");
}

char *agent_status_render(agent_state_t *st, size_t *len) {
  agent_buf_t b;
  agent_buf_init(&b);
  agent_state_lock(st);
  render(&b, st);
  agent_state_unlock(st);
  agent_buf_puts(&b, ",");
  agent_status_render_ranks(&b, st);
  agent_buf_puts(&b, ",");
  agent_status_render_hang(&b, st);
  agent_buf_puts(&b, "}\n");
  return agent_buf_finish(&b, len);
}
