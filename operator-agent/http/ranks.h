/* Per-rank statistics in /metrics and /status (see ranks.c). Both take the state lock briefly
 * and read the workers' statistics files outside it. */
#ifndef TDIST_AGENT_HTTP_RANKS_H
#define TDIST_AGENT_HTTP_RANKS_H

#include "operator-agent/http/buf.h"
#include "operator-agent/state/state.h"

void agent_metrics_render_ranks(agent_buf_t *b, agent_state_t *st);
/* Writes `"ranks":[...],"collectives":"summary"|null` (no surrounding braces or commas). */
void agent_status_render_ranks(agent_buf_t *b, agent_state_t *st);

/* procs.c: the tdist_rank_* process series (and tdist_agent_sample_seconds_total), and
 * `"hang":{...}|null,"gpu_monitoring":{"available":bool,"reason":str|null}` for /status. */
void agent_metrics_render_procs(agent_buf_t *b, agent_state_t *st);
void agent_status_render_hang(agent_buf_t *b, agent_state_t *st);

#endif
