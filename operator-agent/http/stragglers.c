/* /metrics and /status parts of the straggler computation node 0 runs
 * (operator-agent/supervisor/straggler.h), from the copy the main loop keeps in agent_state_t:
 *   tdist_rank_wait_caused_seconds_total{rank}  counter, every global rank: how long the other
 *       ranks waited for this one in collectives it arrived last at (rank-seconds);
 *   tdist_straggler_rank                        gauge: the rank named straggler, -1 when none.
 * Nothing on other nodes, nor on node 0 before its workers ran. Rendered under the state lock:
 * one line per rank of the world. */
#include <inttypes.h>

#include "operator-agent/http/stragglers.h"

void agent_metrics_render_stragglers(agent_buf_t *b, agent_state_t *st) {
  agent_state_lock(st);
  if (st->strag_known && st->strag_caused_s) {
    agent_buf_puts(b,
                   "# HELP tdist_rank_wait_caused_seconds_total How long the other ranks waited "
                   "for this rank in the collectives it arrived last at, summed over them "
                   "(node 0).\n# TYPE tdist_rank_wait_caused_seconds_total counter\n");
    for (int r = 0; r < st->strag_world; r++) {
      agent_buf_printf(b, "tdist_rank_wait_caused_seconds_total{rank=\"%d\"} ", r);
      agent_buf_double(b, st->strag_caused_s[r]);
      agent_buf_puts(b, "\n");
    }
    agent_buf_printf(b,
                     "# HELP tdist_straggler_rank The rank named straggler (docs/agent.md), -1 "
                     "when none (node 0).\n# TYPE tdist_straggler_rank gauge\n"
                     "tdist_straggler_rank %d\n",
                     st->strag_rank);
  }
  agent_state_unlock(st);
}

void agent_status_render_stragglers(agent_buf_t *b, agent_state_t *st) {
  agent_state_lock(st);
  if (!st->strag_known) {
    agent_state_unlock(st);
    agent_buf_puts(b, "\"stragglers\":null");
    return;
  }
  agent_buf_puts(b, "\"stragglers\":{\"straggler\":");
  if (st->strag_rank >= 0) {
    agent_buf_printf(b, "%d,\"since_unix\":", st->strag_rank);
    agent_buf_double(b, st->strag_since_unix);
    agent_buf_printf(b, ",\"since_seq\":%" PRIu64 ",\"named_after\":%" PRIu64, st->strag_since_seq,
                     st->strag_named_after);
  } else {
    agent_buf_puts(b, "null,\"since_unix\":null,\"since_seq\":null,\"named_after\":null");
  }
  agent_buf_puts(b, ",\"leader\":");
  if (st->strag_leader >= 0)
    agent_buf_printf(b, "%d", st->strag_leader);
  else
    agent_buf_puts(b, "null");
  agent_buf_puts(b, ",\"share\":");
  agent_buf_double(b, st->strag_share);
  agent_buf_puts(b, ",\"mean_wait_seconds\":");
  agent_buf_double(b, st->strag_mean_wait_s);
  agent_buf_puts(b, ",\"held\":");
  agent_buf_double(b, st->strag_held);
  agent_buf_printf(b,
                   ",\"collectives_analysed\":%" PRIu64 ",\"collectives_analysed_total\":%" PRIu64
                   ",\"wait_caused_seconds\":[",
                   st->strag_analysed, st->strag_analysed_total);
  for (int r = 0; st->strag_caused_s && r < st->strag_world; r++) {
    if (r) agent_buf_puts(b, ",");
    agent_buf_double(b, st->strag_caused_s[r]);
  }
  agent_buf_puts(b, "]}");
  agent_state_unlock(st);
}
