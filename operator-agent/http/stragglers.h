/* Stragglers in /metrics and /status (node 0; see stragglers.c). Both take the state lock while
 * they copy and render. */
#ifndef TDIST_AGENT_HTTP_STRAGGLERS_H
#define TDIST_AGENT_HTTP_STRAGGLERS_H

#include "operator-agent/http/buf.h"
#include "operator-agent/state/state.h"

void agent_metrics_render_stragglers(agent_buf_t *b, agent_state_t *st);
/* Writes `"stragglers":{...}|null` (no surrounding braces or commas). */
void agent_status_render_stragglers(agent_buf_t *b, agent_state_t *st);

#endif
