/* The publishing half of straggler detection (straggler.h): this node's ranks' recent
 * world-group collectives, read from their statistics files' flight recorders, as one line for
 * the store key arrivals/<r>/<g>. File reads and text only; no store calls.
 *
 * Line: one token per rank with something new, separated by spaces:
 *   "R/seq.op.dur_us,seq.op.dur_us,..."   R the global rank, op the stats.h type index, dur_us
 *   the rank's own duration of the collective in microseconds (its end minus its start, one
 * clock). Only completed, successful collectives of the world group whose type is symmetric
 * (agent_strag_symmetric_op), with a sequence number above the highest published before for the
 * same process. When more than AGENT_STRAG_MAX_PUBLISH are new, only the sequence numbers that
 * are multiples of the smallest power of two that brings them under it are sent: every node
 * samples the same numbers at the same rate, so the sampled collectives still match across
 * nodes. About 16 bytes per entry: at most ~2 KiB per rank and publication. */
#ifndef TDIST_AGENT_ARRIVALS_H
#define TDIST_AGENT_ARRIVALS_H

#include <stddef.h>
#include <stdint.h>

#include "operator-agent/supervisor/workers.h"

/* What was published for one local rank: the process (its pid in the statistics file; another
 * pid starts over) and the highest sequence number sent. */
typedef struct agent_arrivals_cursor {
  int32_t pid;
  uint64_t last_seq;
} agent_arrivals_cursor_t;

/* Builds the line for the workers ws (cur: ws->n cursors, updated) into out (cap bytes; entries
 * that do not fit are left for the next call). Returns the line's length (0: nothing new). */
size_t agent_arrivals_local(const agent_workers_t *ws, agent_arrivals_cursor_t *cur, char *out,
                            size_t cap);

#endif
