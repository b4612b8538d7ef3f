/* Stragglers: which rank the others wait for, from the world-group collectives' durations each
 * rank records in its flight recorder (include/tdist/stats.h), published by every agent
 * (arrivals/<r>/<g>, progress_publish.c) and combined on node 0. Pure computation and text; no
 * store calls, no clock reads (callers pass the time), one thread.
 *
 * Clocks: a symmetric collective (all_reduce, all_gather, reduce_scatter, all_to_all, barrier)
 * completes on no rank before the last rank has arrived, and on every rank soon after; so a rank's
 * own duration end - start is how long it waited for the last one plus the transfer, and the rank
 * with the shortest duration is the one that arrived last. Everything here uses only durations
 * measured on one clock each (CLOCK_MONOTONIC inside libtdist): no clock of one node is ever
 * compared with another node's, so clock skew between nodes does not matter.
 *
 * Per collective seen from every rank of the world:
 *   last     = the rank with the shortest duration (lowest rank on a tie);
 *   caused   = sum over the other ranks i of max(0, duration_i - 2 x duration_last): the
 *              rank-seconds the others spent waiting for `last`
 *              (tdist_rank_wait_caused_seconds_total{rank}). The shortest duration is the
 *              transfer itself; ranks also finish apart by up to about that much for reasons
 *              of the algorithm's own (a tree's root finishes a hop before its leaves, so its
 *              duration is systematically the shortest), so only what exceeds it counts.
 * The straggler rule, evaluated after every analysed collective over the last AGENT_STRAG_WINDOW
 * analysed collectives (once at least AGENT_STRAG_MIN_WINDOW are there), n of them:
 *   held_r(T) = how many of them r arrived last at and the others waited for it at least T each
 *   on average (caused >= T x (world - 1));
 *   the leader: the rank with the largest held(AGENT_STRAG_WAIT_ON_NS), then the most wait
 *   caused in the window, then the lowest rank;
 *   no straggler named: the leader is named when held >= AGENT_STRAG_HELD_ON_PCT % of n (at most
 *   one rank can be: 50%);
 *   rank s named: it stays named while held_s(AGENT_STRAG_WAIT_OFF_NS) >=
 *   AGENT_STRAG_HELD_OFF_PCT % of n; below that the leader is named if it passes the first test,
 *   else nobody.
 * That is what a straggler is: the rank the others wait for in most collectives. One long pause
 * (a page-in, a rank descheduled for 100 ms) is a large share of a window's wait but holds the
 * others up once, and names nobody; nor does it hide a straggler, as a rule on shares of the
 * wait would while the pause is in the window. share (W_r / W, W_r the wait r caused in the
 * window) is reported, not used.
 * All of it in integer nanoseconds (the comparisons cross-multiplied), so the verdict is exact.
 */
#ifndef TDIST_AGENT_STRAGGLER_H
#define TDIST_AGENT_STRAGGLER_H

#include <stddef.h>
#include <stdint.h>

#define AGENT_STRAG_WINDOW 64
#define AGENT_STRAG_MIN_WINDOW 16
#define AGENT_STRAG_HELD_ON_PCT 50
#define AGENT_STRAG_HELD_OFF_PCT 30
#define AGENT_STRAG_WAIT_ON_NS 1000000LL /* 1 ms */
#define AGENT_STRAG_WAIT_OFF_NS 500000LL /* 0.5 ms */
/* Longer durations count as this long (10 minutes: a hang, the stall report's business). */
#define AGENT_STRAG_MAX_DUR_NS (600LL * 1000000000LL)
/* At most this many flight entries per rank in one publication (the newest ones). */
#define AGENT_STRAG_MAX_PUBLISH 128
/* The largest world this accepts (as progress.c's summary). */
#define AGENT_STRAG_MAX_WORLD 65536

/* 1 for the collective types whose completion on any rank needs every rank's arrival. */
int agent_strag_symmetric_op(int op);

typedef struct agent_strag agent_strag_t;

/* What the rule says now (a copy; see agent_strag_view). */
typedef struct {
  int straggler;             /* global rank, -1 = none */
  uint64_t since_seq;        /* the collective after which it was named (0 = none) */
  uint64_t named_after;      /* collectives analysed in this round when it was named */
  double share, mean_wait_s; /* of the straggler, or of the leading rank when none is named: */
  double held;               /* mean_wait_s = W_r / (n x (world - 1)); held: held_r(WAIT_ON) / n */
  int leader;                /* the rank with the largest wait caused in the window, -1 = none */
  uint64_t analysed;         /* collectives analysed in this round */
  uint64_t analysed_total;   /* in all rounds */
} agent_strag_state_t;

/* world in 1..AGENT_STRAG_MAX_WORLD; NULL when out of memory or out of range. */
agent_strag_t *agent_strag_create(int world);
void agent_strag_destroy(agent_strag_t *s);
/* A new round: the workers start again at sequence number 1. Forgets the collectives not yet
 * complete, the window and the straggler; keeps the wait-caused totals. */
void agent_strag_new_round(agent_strag_t *s);

/* One flight entry of rank `rank`: collective `seq` of type op, dur_ns long. Entries of ranks out
 * of range, of other types, seen before (the same seq from the same rank) or older than the
 * oldest seq still tracked are ignored. When the entry completes seq (every rank seen), it is
 * analysed and the rule evaluated. Returns 1 when it completed a collective, else 0. */
int agent_strag_feed(agent_strag_t *s, int rank, uint64_t seq, int op, int64_t dur_ns);

/* Parses an arrivals line (agent_arrivals_local's format, progress.h) and feeds every entry.
 * Returns the number of entries fed, or -1 at the first malformed token (the entries before it
 * are fed). */
int agent_strag_feed_line(agent_strag_t *s, const char *line);

void agent_strag_view(const agent_strag_t *s, agent_strag_state_t *out);
int agent_strag_world(const agent_strag_t *s);
/* The wait caused by each rank, in seconds, since the agent started: world entries. */
const double *agent_strag_caused(const agent_strag_t *s);

#endif
