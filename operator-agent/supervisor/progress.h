/* Where each rank is in the job's sequence of collectives, from the per-rank statistics files
 * (include/tdist/stats.h) that workers keep: local lines for the store, a job-wide summary on
 * node 0, and flight-recorder dumps. Pure formatting and parsing plus file reads; no store calls.
 */
#ifndef TDIST_AGENT_PROGRESS_H
#define TDIST_AGENT_PROGRESS_H

#include <stddef.h>
#include <stdint.h>

#include <tdist/store.h>

#include "operator-agent/state/state.h"
#include "operator-agent/supervisor/workers.h"

/* This node's ranks as one line: "rank:last_seq:cur_seq:cur_op:age_ms ..." (cur_seq 0 and op -1
 * when not in a collective; a rank whose file is not there yet is left out). */
void agent_progress_local(const agent_workers_t *ws, int64_t now_unix_ns, char *out, size_t cap);

/* From the lines of all nodes: one sentence naming the ranks that hold the job up, e.g.
 *   "ranks 0,1,3 waiting in all_reduce #12 for 14.2 s; rank 2 not in a collective (last completed
 * #11)" or "all 4 ranks at #57". stall_s: a collective in flight at least this long counts as
 * stuck. Returns the number of ranks parsed. */
int agent_progress_summarize(const char *const *lines, size_t n, double stall_s, char *out,
                             size_t cap);

/* Writes the flight recorders of this node's ranks as one JSON document into dir and puts its
 * path in path_out. Returns 0, or -1 with err set. */
int agent_flight_dump(const agent_workers_t *ws, int node_rank, int64_t round, const char *dir,
                      const char *why, char *path_out, size_t path_cap, char *err, size_t cap);

/* Publication of the above through the agents' store (progress_publish.c: the only part of this
 * header that makes store calls), key progress/<r>/<g> (see rdzv.h's key list). */
typedef struct agent_strag agent_strag_t;
typedef struct agent_arrivals_cursor agent_arrivals_cursor_t;

/* Zero-initialised with the agent; agent_progress_pub_close frees what it holds. */
typedef struct {
  int64_t next_ns;             /* when the next publication is due (CLOCK_MONOTONIC) */
  char last_stall_shape[1024]; /* the stall last logged, without its duration */
  /* Stragglers (arrivals.h, straggler.h): what this node published last per local rank, and on
   * group rank 0 the job-wide computation, of round strag_round. */
  agent_arrivals_cursor_t *cur;
  int ncur;
  agent_strag_t *strag;
  int64_t strag_round;
  int strag_named;         /* the straggler last copied into the state */
  double strag_since_unix; /* when it was named */
} agent_progress_pub_t;

void agent_progress_pub_close(agent_progress_pub_t *p);

/* Every second (now_ns, CLOCK_MONOTONIC, past p->next_ns; due at whole seconds of
 * CLOCK_REALTIME, so that every node reads its ranks' flight recorders at about the same moment):
 * publishes where this node's ranks are as progress/<round>/<group_rank> and their new
 * collectives as arrivals/<round>/<group_rank> (arrivals.h); group rank 0 then reads every node's
 * lines, summarises the job (stall_s as in agent_progress_summarize), logs a stall once per shape,
 * feeds the arrivals to the straggler computation (straggler.h), logs a straggler when one is
 * named, and puts both into st. Best effort: a store error here is found again by the round
 * monitor. */
void agent_progress_publish(agent_progress_pub_t *p, const agent_workers_t *ws,
                            tdist_store_t *store, int64_t round, int group_rank, int64_t nmembers,
                            int world_size, double stall_s, agent_state_t *st, int64_t now_ns);

#endif
