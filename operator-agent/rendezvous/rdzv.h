/* Rendezvous rounds in the TCPStore hosted by node rank 0 (or, after pod 0 was lost, by the backup
 * store host: host_rank; see operator-agent/storehost/storehost.h).
 *
 * Keys (all under the prefix store "tdist/<run_id>"):
 *   round                    the current round r (decimal; ADD-created). Moving it from r to r+1
 *                            (compare_set) ends round r for everybody.
 *   <r>/joined               ADD counter: arrival index of each agent that joined round r
 *   <r>/node/<idx>           the record of arrival idx:
 *                            "node_rank nproc attempt failures addr host worker_port"
 *   <r>/closed               "N a1,...,aN\nW A F P C U": the members are arrivals a1..aN, in
 *                            group-rank order (first compare_set wins), then what they agree on:
 *                            world size W, attempt A and failures F (the max over the members'
 *                            records), the workers' store port P (the store host's record), the
 *                            closer's arrival C, and U, every member's nproc when all are equal
 *                            (rank base of group rank g = g * U), else 0 and a third line
 *                            "n1,...,nN" (the nprocs in group-rank order; bases are their prefix
 *                            sums). That is all a member needs to start its workers, so joining
 *                            reads O(N) numbers and no records: at 4,096 nodes the records were
 *                            250 KB a member, 1 GB through the store per round (bench/scale).
 *                            A bare "N" means the first N arrivals, in (node_rank, idx) order,
 *                            and "N a1,...,aN" alone (no header) the records are read from
 *                            <r>/node/<idx>: written by hand or by tests, never by the closer.
 *   <r>/table/<C>            the members' records, a line each in group-rank order, as the
 *                            members wrote them: set by closer C before its compare_set of
 *                            <r>/closed (a closer that loses deletes its own). Read once per
 *                            member, lazily (agent_rdzv_load_members): by the first monitor call,
 *                            after the workers started, for /status's member list and the
 *                            carry-over; before them only where needed (the PMIx node map).
 *   failed                   the job gave up (restarts exhausted): the text; standbys exit on it
 *   standby_exited           ADD counter: standbys that left after the job ended
 *   <r>/hb/<idx>             heartbeat counter of arrival idx (set every heartbeat interval)
 *   <r>/end                  why round r ended: "<reason> <text>" (first compare_set wins)
 *   <r>/gone/<node_rank>     a member of round r that will not rejoin (the leader saw it silent
 *                            for the heartbeat timeout, or its agent was stopped): any value
 *   <r>/done, <r>/exited     exit barrier: members whose workers all succeeded; members leaving
 *   <r>/members              in a store the agents moved to (failover): round r's members by
 *                            node rank in group-rank order, "n0 n1 ...", when <r>/closed is not
 *                            there (agent_rdzv_carry_over)
   progress/<r>/<g>         where group rank g's workers are in their collectives, set every
                            second while they run ("rank:last_seq:cur_seq:cur_op:age_ms ...";
                            agent_progress_publish, operator-agent/supervisor/progress.h); group
                            rank 0 reads them all for its summary. Not read by the rendezvous.
   arrivals/<r>/<g>         group rank g's workers' world-group collectives completed since its
                            previous publication, set with progress/<r>/<g>
                            ("R/seq.op.dur_us,... ..."; operator-agent/supervisor/arrivals.h);
                            group rank 0 reads them all to name stragglers (straggler.h).
 *
 * A round closes when MAX agents joined, or when at least MIN joined and last_call seconds passed
 * since this agent first saw MIN, and in either case only once the store host (host_rank) joined.
 * The agent that closes it picks the members from the records (one per node rank, the latest
 * arrival of each): the store host first, then the members of round r-1, then the others by node
 * rank, MAX at most. Group ranks: the store host is 0, a member of round r-1 keeps its group rank,
 * the others fill the free ones in node-rank order; so a lost member's group rank goes to a standby
 * and every healthy node keeps its own. Global rank base = sum of nproc of the lower group ranks.
 * Healthy members rejoin only after stopping their workers, which takes longer than a standby
 * takes to arrive: a round that would give a place to an agent that was not a member of round
 * r-1 while a member of r-1 not marked gone has not arrived waits for it, up to member_wait_s
 * from when the round first had enough arrivals.
 *
 * Spares (--spares K, node ranks MAX..MAX+K-1) and other agents that arrive when the round is
 * full are standbys: waiters that heartbeat (<r>/hb/<idx>) and start no workers. Members see the
 * waiters and, when there is room (N < MAX) or a waiter has the node rank of a member (a
 * rescheduled pod), end the round so it can be admitted; otherwise the waiters stay standbys
 * until a round ends. A standby leaves with 0 once every member is done (<r>/done = N) and with
 * the job's failure once "failed" is set.
 *
 * Attempt isolation: the store host starts a fresh, empty store for the workers of
 * every round it joins and puts its port in its record (worker_port; 0 in everybody else's).
 * Members read it from the store host's record, so the workers of round r never see a key written
 * by those of an earlier round (PyTorch >= 2.5 workers add no per-attempt prefix and rely on this,
 * as they do on torchelastic's fresh store per retry); the agents' own keys stay in this store.
 *
 * Every function does a bounded number of store calls and never waits for peers by itself: the
 * caller polls, so signals and child exits stay responsive. Any store failure returns
 * AGENT_RDZV_STORE_ERROR with the store's message in r->err: the caller treats it as a lost store.
 *
 * Every value read back is validated (agent_rdzv_parse_*): decimal numbers in full, rounds in
 * 0..AGENT_RDZV_MAX_ROUND, node ranks in 0..nnodes_max-1, counts and attempts in
 * 0..AGENT_RDZV_MAX_COUNT, an /end naming a known reason. A value this code would never have
 * written returns AGENT_RDZV_PROTOCOL_ERROR with r->err naming the key and the value; running out
 * of memory returns AGENT_RDZV_NO_MEMORY. The bounds keep round + 1 and attempt + 1 from ever
 * overflowing.
 */
#ifndef TDIST_AGENT_RDZV_H
#define TDIST_AGENT_RDZV_H

#include <stdint.h>

#include <tdist/store.h>

#include "operator-agent/state/state.h"

typedef enum {
  AGENT_RDZV_PENDING = 0,      /* keep polling */
  AGENT_RDZV_MEMBER = 1,       /* join: this agent is a member of the closed round */
  AGENT_RDZV_WAITER = 2,       /* join: the round closed without us; keep polling (round moves) */
  AGENT_RDZV_ROUND_MOVED = 3,  /* the round counter moved past ours: join again */
  AGENT_RDZV_ENDED = 4,        /* monitor: round ended (reason/text in r->end_*) */
  AGENT_RDZV_ALL_DONE = 5,     /* exit barrier: every member finished */
  AGENT_RDZV_JOB_FAILED = 6,   /* standby: the job gave up ("failed"; its text in r->end_text) */
  AGENT_RDZV_STORE_ERROR = -1, /* the store failed (connection, timeout): r->err */
  AGENT_RDZV_PROTOCOL_ERROR = -2, /* a record this agent would never write: r->err names it */
  AGENT_RDZV_NO_MEMORY = -3
} agent_rdzv_result_t;

#define AGENT_RDZV_MAX_ROUND 1000000000LL /* rounds 0..this; round + 1 never overflows */
#define AGENT_RDZV_MAX_COUNT 1000000000LL /* attempts, failures, arrivals, done/exited counts */
#define AGENT_RDZV_MAX_WAITERS 64         /* waiter records read per poll */

/* The round's workers' store, as the rendezvous hands it over (see worker_store below). */
typedef struct {
  int port; /* on the store host (host_rank); 0: not known yet */
} agent_rdzv_worker_store_t;

typedef struct {
  int node_rank, nproc, attempt, failures, idx, worker_port;
  char addr[64], host[64];
} agent_rdzv_member_t;

typedef struct {
  tdist_store_t *store; /* borrowed prefix store */
  int nnodes_min, nnodes_max;
  int spares; /* node ranks go up to nnodes_max + spares - 1 */
  double last_call_s, heartbeat_interval_s, heartbeat_timeout_s;
  double member_wait_s; /* how long a closer waits for the last round's live members before it
                         * gives their places to others (0: not at all); the agent uses
                         * --stop-grace-period + 2 s, what a member may take to stop its workers */

  /* this agent */
  int node_rank, nproc;
  int host_rank; /* the node rank of the agent hosting this store (0; the backup store host after
                  * a failover): it closes no round without it and gets group rank 0 */
  char addr[64], host[64];
  int worker_port; /* store host: the port of the workers' store it started for the
                    * round it joins next (set before agent_rdzv_join); others 0 */

  /* the round being joined / run */
  int64_t round;
  int64_t idx;                  /* our arrival index (1-based) */
  int64_t min_seen_ns;          /* when we first saw >= MIN joined (0 = not yet) */
  int64_t full_seen_ns;         /* when the round first could close without a live member of the
                                 * last round (0 = not yet): member_wait_s counts from here */
  int64_t nmembers;             /* N once closed */
  int64_t *arrivals;            /* the members' arrival indexes, in group-rank order */
  int64_t table_closer;         /* the closer whose <r>/table/<C> holds the records (0: none) */
  agent_rdzv_member_t *members; /* sorted by group rank; NULL until agent_rdzv_load_members */
  int group_rank;
  int attempt, failures; /* agreed: max over members of their records */
  int world_size, rank_base;
  /* The rendezvous result's bootstrap store (torchelastic's RendezvousInfo.bootstrap_store_info):
   * the round's workers' store, which becomes the workers' MASTER_PORT. The store host creates it
   * just before it joins (operator-agent/storehost/storehost.h, agent_storehost_worker_store_open)
   * and writes its port into its record (worker_port above, last field of <r>/node/<idx>); every
   * member reads it back from the host's record when the round closes. Its host is the agents'
   * store host. 0 until then. */
  agent_rdzv_worker_store_t worker_store;

  /* heartbeats */
  int64_t hb_counter;
  int64_t next_hb_ns;
  int64_t *peer_hb; /* last value seen per member (leader) or [0] (others) */
  int64_t *peer_hb_change_ns;

  int64_t waiters_checked; /* joined count whose waiters were already examined */
  int64_t closed_n;        /* waiters: the member count of the round that closed without us */

  /* standbys: the waiters of this round (one per node rank, not a member's), as last read; the
   * leader follows their heartbeats and counts those alive */
  agent_rdzv_member_t *standby;
  int nstandby, nstandby_live;
  int64_t *sb_hb, *sb_change_ns;

  /* why the round ended */
  agent_restart_reason_t end_reason;
  char end_text[256];

  /* The last round this agent saw close, as a member or a standby (-1: none), and its members'
   * node ranks in group-rank order: what agent_rdzv_carry_over takes to another store. Kept
   * across rounds. */
  int64_t carry_round;
  int *carry_nodes;
  int carry_n;

  char err[512];
} agent_rdzv_t;

void agent_rdzv_init(agent_rdzv_t *r);
void agent_rdzv_reset_round(agent_rdzv_t *r);
void agent_rdzv_free(agent_rdzv_t *r);

/* After the agents moved to another store (store failover, storehost.h): what the next round's
 * closer needs from the last round, which that store never saw. If this agent was a member of round
 * carry_round (or a standby in it) and the store has no "<carry_round>/closed", it writes
 * "<carry_round>/members"
 * ("n0 n1 ...": the members' node ranks in group-rank order; first compare_set wins, and every
 * member writes the same), so that members keep their group ranks; and "<carry_round>/gone/<lost>"
 * for the lost store host (lost >= 0), so that no round waits for it. */
agent_rdzv_result_t agent_rdzv_carry_over(agent_rdzv_t *r, int lost);

/* Waits up to timeout_ms for the current round's "<round>/closed" (a store WAIT, which returns
 * when the closer sets it: an agent learns of the closure at once, not at its next poll). Only a
 * store failure is an error. */
agent_rdzv_result_t agent_rdzv_wait_closed(agent_rdzv_t *r, int timeout_ms);

/* Moves the round counter up to at least `want_round` (past carry_round on a store that never saw
 * it close: that round is over), then joins the current round with our record (attempt/failures are
 * this agent's view, agreed as the max over members). */
agent_rdzv_result_t agent_rdzv_join(agent_rdzv_t *r, int64_t want_round, int attempt, int failures);

/* One poll while joining: closes the round when it is time; MEMBER fills group_rank, rank_base,
 * world_size, attempt, failures, worker_store and arrivals (not members: see below). */
agent_rdzv_result_t agent_rdzv_join_poll(agent_rdzv_t *r, int64_t now_ns);

/* A member: reads the closed round's member records (<r>/table/<C>, one GET) into r->members,
 * once, and with them what agent_rdzv_carry_over needs; a table that disagrees with <r>/closed
 * is a protocol error. No store call when they are already there. agent_rdzv_monitor calls it
 * first; call it before reading r->members elsewhere. */
agent_rdzv_result_t agent_rdzv_load_members(agent_rdzv_t *r);

/* One poll while workers run: heartbeats, round moved (reads <r>/end), waiters to admit, peers
 * silent for heartbeat_timeout (the leader watches everybody, everybody watches the leader). */
agent_rdzv_result_t agent_rdzv_monitor(agent_rdzv_t *r, int64_t now_ns);

/* Ends round r (if still current) with a reason; idempotent, first writer's reason wins.
 * Afterwards r->end_reason/end_text hold the winning reason. */
agent_rdzv_result_t agent_rdzv_end(agent_rdzv_t *r, agent_restart_reason_t reason,
                                   const char *text);

/* Exit barrier: mark this member done (once), then poll: ALL_DONE when every member is done,
 * ENDED if the round ended first, PENDING otherwise (heartbeats continue). */
agent_rdzv_result_t agent_rdzv_done_poll(agent_rdzv_t *r, int64_t now_ns, int *marked);

/* One poll of a standby (a waiter of a closed round): heartbeats, then ALL_DONE once every member
 * of the round is done, JOB_FAILED once the job gave up, ROUND_MOVED when the round ended (join
 * the next), PENDING otherwise. */
agent_rdzv_result_t agent_rdzv_standby_poll(agent_rdzv_t *r, int64_t now_ns);

/* Marks node_rank as a member of the current round that will not rejoin (<r>/gone/<node_rank>),
 * so the next round does not wait for it: the leader does it for a silent member, an agent that
 * is stopped for itself. */
agent_rdzv_result_t agent_rdzv_mark_gone(agent_rdzv_t *r, int node_rank);

/* The job gave up: sets "failed" to text (standbys read it and leave). */
agent_rdzv_result_t agent_rdzv_job_failed(agent_rdzv_t *r, const char *text);

/* Standbys leaving at the job's end: ADD standby_exited (delta 1, or 0 to read it). */
agent_rdzv_result_t agent_rdzv_standby_exited(agent_rdzv_t *r, int64_t delta, int64_t *exited);

/* Counts this agent as gone (ADD <r>/exited) and returns the count so far in *exited. */
agent_rdzv_result_t agent_rdzv_mark_exited(agent_rdzv_t *r, int64_t *exited);
agent_rdzv_result_t agent_rdzv_exited_count(agent_rdzv_t *r, int64_t *exited);

/* Validators of the values read back (also unit-tested). Each returns 0 and fills its output,
 * or -1 for a value that is not what an agent writes (see the top of this file). */
int agent_rdzv_parse_int(const char *s, int64_t lo, int64_t hi, int64_t *out);
int agent_rdzv_parse_record(const char *s, int nnodes_max, agent_rdzv_member_t *m);
int agent_rdzv_parse_end(const char *s, agent_restart_reason_t *reason, const char **text);
/* "<r>/closed": *n members in 1..nnodes_max; *list (caller frees) the arrivals in group-rank order,
 * distinct, in 1..AGENT_RDZV_MAX_COUNT, or NULL for a bare "N". */
int agent_rdzv_parse_closed(const char *s, int nnodes_max, int64_t *n, int64_t **list);

/* What <r>/closed agrees on after its list (see the top of this file). */
typedef struct {
  int64_t world_size;        /* 1..INT32_MAX: the sum of the members' nproc */
  int64_t attempt, failures; /* 0..AGENT_RDZV_MAX_COUNT */
  int64_t worker_port;       /* 0..65535 */
  int64_t closer;            /* 1..AGENT_RDZV_MAX_COUNT: <r>/table/<closer> */
  int64_t nproc;             /* every member's, 1..2^20; 0: they differ (a list follows) */
} agent_rdzv_header_t;

/* The header of n members with these nprocs (world size and nproc computed from them; attempt,
 * failures, worker_port and closer taken from h): malloc'd text, NULL when out of memory. */
char *agent_rdzv_format_header(const agent_rdzv_header_t *h, int64_t n, const int *nproc);
/* The header after the list of n members: 0 with *h and *bases (n rank bases, the caller frees),
 * or -1 for text agent_rdzv_format_header never writes (the world size not the nprocs' sum, an
 * nproc list of equal counts, a field out of range, anything extra). */
int agent_rdzv_parse_header(const char *s, int64_t n, agent_rdzv_header_t *h, int64_t **bases);

/* The records of <r>/table/<C>: n lines, line i parsed into m[i] as
 * agent_rdzv_parse_record does, with m[i].idx = list[i] (the arrival the list names for it); -1
 * if a line is not a record an agent writes or the line count is not n. */
int agent_rdzv_parse_table(const char *s, int64_t n, const int64_t *list, int nnodes_max,
                           agent_rdzv_member_t *m);

/* "malformed record", "fake joiner", ...: the name of a negative result, for log lines. */
const char *agent_rdzv_result_name(agent_rdzv_result_t res);

#endif
