/* See rdzv.h for the key layout and the protocol. Only the public store API is used.
 * This file: joining a round and closing it (members, standbys, ranks carried over); the codec is
 * rdzv_record.c, the store helpers rdzv_store.c, a closed round's life (heartbeats, end, exit)
 * rdzv_round.c. */
#define _GNU_SOURCE
#include "operator-agent/rendezvous/rdzv.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tdist/status.h>

#include "operator-agent/common/log.h"
#include "operator-agent/rendezvous/rdzv_int.h"

/* A member record's text at most: four numbers, addr and host (63 bytes each), the port, the
 * spaces and the newline before it. */
#define RECORD_MAX (4 * 21 + 2 * 64 + 6 + 8)

void agent_rdzv_init(agent_rdzv_t *r) {
  memset(r, 0, sizeof *r);
  r->round = -1;
  r->group_rank = -1;
  r->carry_round = -1;
}

void rdzv_free_standbys(agent_rdzv_t *r) {
  free(r->standby);
  free(r->sb_hb);
  free(r->sb_change_ns);
  r->standby = NULL;
  r->sb_hb = r->sb_change_ns = NULL;
  r->nstandby = r->nstandby_live = 0;
}

void agent_rdzv_reset_round(agent_rdzv_t *r) {
  free(r->arrivals);
  r->arrivals = NULL;
  r->table_closer = 0;
  free(r->members);
  free(r->peer_hb);
  free(r->peer_hb_change_ns);
  r->members = NULL;
  r->peer_hb = r->peer_hb_change_ns = NULL;
  rdzv_free_standbys(r);
  r->closed_n = 0;
  r->idx = 0;
  r->min_seen_ns = 0;
  r->full_seen_ns = 0;
  r->nmembers = 0;
  r->group_rank = -1;
  r->world_size = r->rank_base = 0;
  r->worker_store.port = 0;
  r->next_hb_ns = 0;
  r->waiters_checked = 0;
  r->end_reason = AGENT_RESTART_PEER_LOST;
  r->end_text[0] = 0;
}

void agent_rdzv_free(agent_rdzv_t *r) {
  agent_rdzv_reset_round(r);
  free(r->carry_nodes);
  r->carry_nodes = NULL;
  r->carry_n = 0;
  r->carry_round = -1;
}

const char *agent_rdzv_result_name(agent_rdzv_result_t res) {
  switch (res) {
    case AGENT_RDZV_STORE_ERROR: return "store error";
    case AGENT_RDZV_PROTOCOL_ERROR: return "protocol error";
    case AGENT_RDZV_NO_MEMORY: return "out of memory";
    default: return "ok";
  }
}

/* Reads the records of round `round` of arrivals idx[0..n-1] into recs. An agent sets its record
 * right after taking its index, so a missing one is about to appear, or belongs to a fake joiner
 * (an ADD on <r>/joined by something else): then *missing = 1 and nothing is read, never a
 * blocking wait. */
static agent_rdzv_result_t read_idx(agent_rdzv_t *r, int64_t round, const int64_t *idx, size_t n,
                                    agent_rdzv_member_t *recs, int *missing) {
  char **keys = calloc(n, sizeof *keys);
  void **vals = calloc(n, sizeof *vals);
  size_t *lens = calloc(n, sizeof *lens);
  agent_rdzv_result_t res = AGENT_RDZV_PENDING;
  int npods = r->nnodes_max + r->spares;
  *missing = 0;
  if (!keys || !vals || !lens) {
    snprintf(r->err, sizeof r->err, "out of memory reading %zu rendezvous records", n);
    res = AGENT_RDZV_NO_MEMORY;
    goto out;
  }
  for (size_t i = 0; i < n; i++) {
    if (asprintf(&keys[i], "%" PRId64 "/node/%" PRId64, round, idx[i]) < 0) {
      keys[i] = NULL;
      snprintf(r->err, sizeof r->err, "out of memory reading rendezvous records");
      res = AGENT_RDZV_NO_MEMORY;
      goto out;
    }
  }
  int ready = 0;
  tdist_status_t st = tdist_store_check(r->store, (const char *const *)keys, n, &ready);
  if (st != TDIST_OK) {
    res = rdzv_fail(r, "check of rendezvous records", st);
    goto out;
  }
  if (!ready) {
    *missing = 1;
    goto out;
  }
  st = tdist_store_multi_get(r->store, (const char *const *)keys, n, vals, lens);
  if (st != TDIST_OK) {
    res = rdzv_fail(r, "multi_get of rendezvous records", st);
    goto out;
  }
  for (size_t i = 0; i < n; i++) {
    char buf[256];
    size_t l = lens[i] < sizeof buf - 1 ? lens[i] : sizeof buf - 1;
    memcpy(buf, vals[i], l);
    buf[l] = 0;
    agent_rdzv_member_t *m = &recs[i];
    memset(m, 0, sizeof *m);
    m->idx = (int)idx[i];
    if (l != lens[i] || strlen(buf) != l || agent_rdzv_parse_record(buf, npods, m)) {
      char want[160];
      snprintf(want, sizeof want,
               "a record 'node_rank(0..%d) nproc attempt failures addr host worker_port'",
               npods - 1);
      res = rdzv_bad_value(r, keys[i], vals[i], lens[i], want);
      goto out;
    }
  }
out:
  rdzv_free_multi(keys, vals, lens, n);
  return res;
}

/* read_idx of arrivals first..last (1-based, inclusive) of the current round. */
static agent_rdzv_result_t read_records(agent_rdzv_t *r, int64_t first, int64_t last,
                                        agent_rdzv_member_t *recs, int *missing) {
  size_t n = (size_t)(last - first + 1);
  int64_t *idx = calloc(n, sizeof *idx);
  if (!idx) {
    snprintf(r->err, sizeof r->err, "out of memory reading %zu rendezvous records", n);
    return AGENT_RDZV_NO_MEMORY;
  }
  for (size_t i = 0; i < n; i++) idx[i] = first + (int64_t)i;
  agent_rdzv_result_t res = read_idx(r, r->round, idx, n, recs, missing);
  free(idx);
  return res;
}

/* The records of <round>/table/<closer> for the n members list[0..n-1] into m. A table missing or
 * not those records: *bad = 1 and r->err names the key and what it holds (PROTOCOL_ERROR is the
 * caller's to return: some callers only lose a best-effort extra). */
static agent_rdzv_result_t read_table(agent_rdzv_t *r, int64_t round, int64_t closer,
                                      const int64_t *list, int64_t n, agent_rdzv_member_t *m,
                                      int *bad) {
  char key[96], *val = NULL, want[96];
  snprintf(key, sizeof key, "%" PRId64 "/table/%" PRId64, round, closer);
  *bad = 0;
  agent_rdzv_result_t res = rdzv_get_alloc(r, key, &val);
  if (res < 0) return res;
  snprintf(want, sizeof want, "the %" PRId64 " members' records, a line each", n);
  if (!val) {
    snprintf(r->err, sizeof r->err,
             "protocol error: key %s is missing: the closer of round %" PRId64
             " sets it before it closes the round (did something delete it?)",
             key, round);
    *bad = 1;
  } else if (agent_rdzv_parse_table(val, n, list, r->nnodes_max + r->spares, m)) {
    rdzv_bad_value(r, key, val, strlen(val), want);
    *bad = 1;
  }
  free(val);
  return AGENT_RDZV_PENDING;
}

agent_rdzv_result_t agent_rdzv_join(agent_rdzv_t *r, int64_t want_round, int attempt,
                                    int failures) {
  agent_rdzv_result_t res;
  int64_t cur;
  if (want_round > AGENT_RDZV_MAX_ROUND) {
    snprintf(r->err, sizeof r->err,
             "protocol error: round %" PRId64
             " is past the last round %lld: key round was moved "
             "out of range",
             want_round, AGENT_RDZV_MAX_ROUND);
    return AGENT_RDZV_PROTOCOL_ERROR;
  }
  if (r->carry_nodes && r->carry_round >= want_round) {
    /* A store that never saw the round this agent last saw close (the agents moved to the backup
     * host's, or a fresh one): that round is over all the same, so a standby asking for it joins
     * the next, where the members go, never a second round of that number that newcomers could
     * close before the members arrive. On the store where it closed, a standby waits in it. */
    char key[96], v[8];
    int closed = 0;
    snprintf(key, sizeof key, "%" PRId64 "/closed", r->carry_round);
    if ((res = rdzv_get_opt(r, key, v, sizeof v, &closed)) < 0) return res;
    if (!closed) want_round = r->carry_round + 1;
  }
  if ((res = rdzv_read_round(r, &cur)) < 0) return res;
  while (cur < want_round) {
    char exp[32], des[32], got[64];
    snprintf(exp, sizeof exp, "%" PRId64, cur);
    snprintf(des, sizeof des, "%" PRId64, want_round);
    if ((res = rdzv_cas(r, "round", exp, des, got, sizeof got)) < 0) return res;
    if (agent_rdzv_parse_int(got, 0, AGENT_RDZV_MAX_ROUND, &cur))
      return rdzv_bad_value(r, "round", got, strlen(got), "a round number");
  }
  agent_rdzv_reset_round(r);
  r->round = cur;
  r->attempt = attempt;
  r->failures = failures;
  char key[96], rec[256];
  snprintf(key, sizeof key, "%" PRId64 "/joined", cur);
  if ((res = rdzv_add_in(r, key, 1, 1, AGENT_RDZV_MAX_COUNT, &r->idx)) < 0) return res;
  snprintf(key, sizeof key, "%" PRId64 "/node/%" PRId64, cur, r->idx);
  snprintf(rec, sizeof rec, "%d %d %d %d %s %s %d", r->node_rank, r->nproc, attempt, failures,
           r->addr[0] ? r->addr : "-", r->host[0] ? r->host : "-", r->worker_port);
  if ((res = rdzv_set_str(r, key, rec)) < 0) return res;
  snprintf(key, sizeof key, "%" PRId64 "/hb/%" PRId64, cur, r->idx);
  if ((res = rdzv_set_str(r, key, "0")) < 0) return res;
  AGENT_DEBUG("joined rendezvous round %" PRId64 " as arrival %" PRId64, cur, r->idx);
  return AGENT_RDZV_PENDING;
}

static int member_cmp(const void *a, const void *b) {
  const agent_rdzv_member_t *x = a, *y = b;
  if (x->node_rank != y->node_rank) return x->node_rank < y->node_rank ? -1 : 1;
  return x->idx < y->idx ? -1 : x->idx > y->idx;
}

/* The records of the agents of round r that are not members (arrivals 1..joined, members
 * skipped; of several arrivals with one node rank the latest) into *w (caller frees; NULL when
 * there are none), their count into *nw: at most AGENT_RDZV_MAX_WAITERS, -1 when some record is
 * missing (none read). */
agent_rdzv_result_t rdzv_read_waiters(agent_rdzv_t *r, int64_t joined, agent_rdzv_member_t **w,
                                      int64_t *nw) {
  *w = NULL;
  *nw = 0;
  /* Fake joiners can push the count up without records: read a bounded window. */
  int64_t m = joined;
  if (m > r->nmembers + AGENT_RDZV_MAX_WAITERS) m = r->nmembers + AGENT_RDZV_MAX_WAITERS;
  if (m <= r->nmembers) return AGENT_RDZV_PENDING;
  agent_rdzv_member_t *all = calloc((size_t)m, sizeof *all);
  int64_t *mi = calloc((size_t)(r->nmembers ? r->nmembers : 1), sizeof *mi);
  if (!all || !mi) {
    free(all);
    free(mi);
    snprintf(r->err, sizeof r->err, "out of memory reading %" PRId64 " records", m);
    return AGENT_RDZV_NO_MEMORY;
  }
  int missing = 0;
  agent_rdzv_result_t res = read_records(r, 1, m, all, &missing);
  if (res < 0 || missing) {
    if (res >= 0) *nw = -1; /* not all written yet (or fake joiners): next poll */
    free(all);
    free(mi);
    return res;
  }
  for (int64_t i = 0; i < r->nmembers; i++) mi[i] = r->arrivals[i];
  qsort(mi, (size_t)r->nmembers, sizeof *mi, rdzv_cmp_i64);
  qsort(all, (size_t)m, sizeof *all, member_cmp);
  int64_t k = 0;
  for (int64_t i = 0; i < m && k < AGENT_RDZV_MAX_WAITERS; i++) {
    int64_t idx = all[i].idx;
    if (r->nmembers && bsearch(&idx, mi, (size_t)r->nmembers, sizeof *mi, rdzv_cmp_i64)) continue;
    if (k && all[k - 1].node_rank == all[i].node_rank)
      all[k - 1] = all[i]; /* a later arrival of that node rank */
    else
      all[k++] = all[i];
  }
  free(mi);
  if (!k) {
    free(all);
    return AGENT_RDZV_PENDING;
  }
  *w = all;
  *nw = k;
  return AGENT_RDZV_PENDING;
}

agent_rdzv_result_t rdzv_joined_count(agent_rdzv_t *r, int64_t *joined) {
  char key[96];
  snprintf(key, sizeof key, "%" PRId64 "/joined", r->round);
  return rdzv_add_in(r, key, 0, 0, AGENT_RDZV_MAX_COUNT, joined);
}

/* The store host arrived after the round closed (an elastic round that filled up without it):
 * its record, and so the workers' store, is among the waiters'. Without one the round cannot run
 * workers; ending it lets the next round include the store host. */
static agent_rdzv_result_t find_store_host(agent_rdzv_t *r) {
  int64_t joined, nw = 0;
  agent_rdzv_member_t *w = NULL;
  agent_rdzv_result_t res = rdzv_joined_count(r, &joined);
  if (res >= 0) res = rdzv_read_waiters(r, joined, &w, &nw);
  for (int64_t i = 0; res >= 0 && i < nw; i++) /* nw < 0: records missing, none read */
    if (w[i].node_rank == r->host_rank && w[i].worker_port > 0)
      r->worker_store.port = w[i].worker_port;
  free(w);
  if (res < 0) return res;
  if (r->worker_store.port) return AGENT_RDZV_MEMBER;
  res = agent_rdzv_end(r, AGENT_RESTART_MEMBERSHIP,
                       "the round closed without the store host: it hosts the workers' "
                       "store, so the next round must include it");
  return res < 0 ? res : AGENT_RDZV_ROUND_MOVED;
}

/* r->carry_* := the node ranks of the members of round r->round in group-rank order. */
static void set_carry(agent_rdzv_t *r, const agent_rdzv_member_t *m, int64_t n) {
  int *nodes = malloc((size_t)n * sizeof *nodes);
  if (!nodes) return; /* without it only the carry-over is lost */
  for (int64_t i = 0; i < n; i++) nodes[i] = m[i].node_rank;
  free(r->carry_nodes);
  r->carry_nodes = nodes;
  r->carry_n = (int)n;
  r->carry_round = r->round;
}

static void free_members(agent_rdzv_t *r) {
  free(r->members);
  free(r->peer_hb);
  free(r->peer_hb_change_ns);
  r->members = NULL;
  r->peer_hb = r->peer_hb_change_ns = NULL;
}

/* A member of a round closed with a header (rdzv.h): its place and what the members agree on,
 * from <r>/closed alone; the records stay in <r>/table/<C> until agent_rdzv_load_members. Takes
 * list. */
static agent_rdzv_result_t from_header(agent_rdzv_t *r, int64_t now_ns, int64_t *list,
                                       const char *header) {
  int64_t n = r->nmembers, *bases = NULL;
  agent_rdzv_header_t h;
  if (agent_rdzv_parse_header(header, n, &h, &bases)) {
    char key[96], want[160];
    snprintf(key, sizeof key, "%" PRId64 "/closed", r->round);
    snprintf(want, sizeof want,
             "'world attempt failures worker_port closer nproc' for %" PRId64
             " members after the list (world = the sum of their nprocs)",
             n);
    free_members(r);
    free(list);
    r->nmembers = 0;
    return rdzv_bad_value(r, key, header, strlen(header), want);
  }
  for (int64_t i = 0; i < n; i++)
    if (list[i] == r->idx) {
      r->group_rank = (int)i;
      r->rank_base = (int)bases[i];
    }
  free(bases);
  /* The leader follows every member's heartbeat, the others the leader's (rdzv_round.c). */
  size_t nhb = r->group_rank == 0 ? (size_t)n : 1;
  r->peer_hb = malloc(nhb * sizeof *r->peer_hb);
  r->peer_hb_change_ns = malloc(nhb * sizeof *r->peer_hb_change_ns);
  if (!r->peer_hb || !r->peer_hb_change_ns) {
    free_members(r);
    free(list);
    r->nmembers = 0;
    snprintf(r->err, sizeof r->err, "out of memory for %" PRId64 " members", n);
    return AGENT_RDZV_NO_MEMORY;
  }
  for (size_t i = 0; i < nhb; i++) {
    r->peer_hb[i] = -1;
    r->peer_hb_change_ns[i] = now_ns;
  }
  r->arrivals = list;
  r->table_closer = h.closer;
  r->world_size = (int)h.world_size;
  r->attempt = (int)h.attempt;
  r->failures = (int)h.failures;
  r->worker_store.port = (int)h.worker_port;
  r->next_hb_ns = 0;
  return r->worker_store.port ? AGENT_RDZV_MEMBER : find_store_host(r);
}

/* The members of the closed round: arrivals list[0..n-1] in group-rank order, with the header
 * that follows the list (from_header), or without one their records read from <r>/node/<idx>;
 * or (list NULL, a bare "N") the first n arrivals in (node_rank, idx) order. Takes list. */
static agent_rdzv_result_t load_members(agent_rdzv_t *r, int64_t now_ns, int64_t *list,
                                        const char *header) {
  int64_t n = r->nmembers;
  free_members(r); /* an earlier poll that failed (a bad record) may have left them */
  free(r->arrivals);
  r->arrivals = NULL;
  r->table_closer = 0;
  if (header) return from_header(r, now_ns, list, header);
  r->peer_hb = calloc((size_t)n, sizeof *r->peer_hb);
  r->peer_hb_change_ns = calloc((size_t)n, sizeof *r->peer_hb_change_ns);
  r->members = calloc((size_t)n, sizeof *r->members);
  r->arrivals = calloc((size_t)n, sizeof *r->arrivals);
  if (!r->members || !r->arrivals || !r->peer_hb || !r->peer_hb_change_ns) {
    free(list);
    snprintf(r->err, sizeof r->err, "out of memory for %" PRId64 " members", n);
    return AGENT_RDZV_NO_MEMORY;
  }
  int missing = 0;
  agent_rdzv_result_t res = list ? read_idx(r, r->round, list, (size_t)n, r->members, &missing)
                                 : read_records(r, 1, n, r->members, &missing);
  int bare = !list;
  free(list);
  if (res >= 0 && missing) {
    /* A member's record is not there yet (or <r>/closed counts fake joiners): poll again. */
    free_members(r);
    r->nmembers = 0;
    return AGENT_RDZV_PENDING;
  }
  if (res < 0) return res;
  if (bare) qsort(r->members, (size_t)n, sizeof *r->members, member_cmp);
  int attempt = 0, failures = 0, ws = 0;
  r->worker_store.port = 0;
  for (int64_t i = 0; i < n; i++) {
    agent_rdzv_member_t *m = &r->members[i];
    r->arrivals[i] = m->idx;
    if (m->node_rank == r->host_rank && m->worker_port > 0) r->worker_store.port = m->worker_port;
    if (m->idx == r->idx) {
      r->group_rank = (int)i;
      r->rank_base = ws;
    }
    if (m->attempt > attempt) attempt = m->attempt;
    if (m->failures > failures) failures = m->failures;
    ws += m->nproc;
    r->peer_hb[i] = -1;
    r->peer_hb_change_ns[i] = now_ns;
  }
  r->attempt = attempt;
  r->failures = failures;
  r->world_size = ws;
  r->next_hb_ns = 0;
  if (!r->worker_store.port) return find_store_host(r);
  set_carry(r, r->members, n);
  return AGENT_RDZV_MEMBER;
}

agent_rdzv_result_t agent_rdzv_load_members(agent_rdzv_t *r) {
  int64_t n = r->nmembers;
  if (r->members || n <= 0 || !r->arrivals || !r->table_closer) return AGENT_RDZV_PENDING;
  agent_rdzv_member_t *m = calloc((size_t)n, sizeof *m);
  if (!m) {
    snprintf(r->err, sizeof r->err, "out of memory for %" PRId64 " members' records", n);
    return AGENT_RDZV_NO_MEMORY;
  }
  int bad = 0;
  agent_rdzv_result_t res = read_table(r, r->round, r->table_closer, r->arrivals, n, m, &bad);
  if (res < 0 || bad) {
    free(m);
    return res < 0 ? res : AGENT_RDZV_PROTOCOL_ERROR;
  }
  /* The records must give the place <r>/closed gave: this node at its group rank, the same rank
   * base and world size. */
  int64_t ws = 0, base = -1;
  for (int64_t i = 0; i < n; i++) {
    if (i == r->group_rank) base = ws;
    ws += m[i].nproc;
  }
  if (r->group_rank < 0 || m[r->group_rank].node_rank != r->node_rank || base != r->rank_base ||
      ws != r->world_size) {
    snprintf(r->err, sizeof r->err,
             "protocol error: key %" PRId64 "/table/%" PRId64 " disagrees with %" PRId64
             "/closed: group rank %d is node %d there (this is "
             "node %d), rank base %" PRId64 " (closed: %d), world size %" PRId64 " (closed: %d)",
             r->round, r->table_closer, r->round, r->group_rank,
             r->group_rank >= 0 ? m[r->group_rank].node_rank : -1, r->node_rank, base, r->rank_base,
             ws, r->world_size);
    free(m);
    return AGENT_RDZV_PROTOCOL_ERROR;
  }
  r->members = m;
  set_carry(r, m, n);
  return AGENT_RDZV_PENDING;
}

/* prev_ranks from "<r-1>/members" (agent_rdzv_carry_over), when round r-1 closed in another
 * store. A value this code would not write is ignored: it only costs the ranks' continuity. */
static agent_rdzv_result_t carried_ranks(agent_rdzv_t *r, int *prev, int npods) {
  char key[96], *val = NULL;
  snprintf(key, sizeof key, "%" PRId64 "/members", r->round - 1);
  agent_rdzv_result_t res = rdzv_get_alloc(r, key, &val);
  if (res == AGENT_RDZV_STORE_ERROR) return res;
  int *p = calloc((size_t)npods, sizeof *p);
  int ok = val && p, g = 0;
  for (int i = 0; p && i < npods; i++) p[i] = -1;
  for (const char *q = val; ok && *q; g++) {
    char tok[16];
    int64_t nr;
    if (g >= r->nnodes_max || rdzv_token(&q, tok, sizeof tok) ||
        agent_rdzv_parse_int(tok, 0, npods - 1, &nr) || p[nr] >= 0)
      ok = 0;
    else
      p[nr] = g;
  }
  if (ok && g > 0) memcpy(prev, p, (size_t)npods * sizeof *p);
  free(p);
  free(val);
  return AGENT_RDZV_PENDING;
}

/* prev[node_rank] = the group rank that node had in round r-1 (-1: none). Best effort: a round
 * r-1 this store does not hold (a fresh store, unless the agents carried it over: carried_ranks) or
 * cannot be read leaves -1s; only a store failure is an error. */
static agent_rdzv_result_t prev_ranks(agent_rdzv_t *r, int *prev, int npods) {
  for (int i = 0; i < npods; i++) prev[i] = -1;
  if (r->round <= 0) return AGENT_RDZV_PENDING;
  char key[96], *val = NULL;
  snprintf(key, sizeof key, "%" PRId64 "/closed", r->round - 1);
  agent_rdzv_result_t res = rdzv_get_alloc(r, key, &val);
  if (res == AGENT_RDZV_STORE_ERROR) return res;
  if (!val) return carried_ranks(r, prev, npods);
  int64_t n, *list = NULL;
  agent_rdzv_member_t *m = NULL;
  int missing = 0;
  char *header = strchr(val, '\n'); /* what the members agree on, after the list (rdzv.h) */
  if (header) *header++ = 0;
  if (!agent_rdzv_parse_closed(val, r->nnodes_max, &n, &list) &&
      (m = calloc((size_t)n, sizeof *m))) {
    if (list && header) {
      agent_rdzv_header_t h;
      int64_t *bases = NULL;
      missing = agent_rdzv_parse_header(header, n, &h, &bases) != 0; /* best effort, as below */
      free(bases);
      if (!missing) res = read_table(r, r->round - 1, h.closer, list, n, m, &missing);
    } else if (list) {
      res = read_idx(r, r->round - 1, list, (size_t)n, m, &missing);
    } else {
      int64_t *idx = calloc((size_t)n, sizeof *idx);
      for (int64_t i = 0; idx && i < n; i++) idx[i] = i + 1;
      res = idx ? read_idx(r, r->round - 1, idx, (size_t)n, m, &missing) : AGENT_RDZV_NO_MEMORY;
      if (res >= 0 && !missing) qsort(m, (size_t)n, sizeof *m, member_cmp);
      free(idx);
    }
    for (int64_t i = 0; res >= 0 && !missing && i < n; i++) prev[m[i].node_rank] = (int)i;
  }
  free(val);
  free(list);
  free(m);
  if (res == AGENT_RDZV_STORE_ERROR) return res;
  r->err[0] = 0; /* a bad record of round r-1 only costs the ranks' continuity */
  return AGENT_RDZV_PENDING;
}

typedef struct {
  agent_rdzv_member_t rec;
  int64_t key; /* priority: the store host, then the members of r-1 by group rank, then node rank */
  int prev;
} cand_t;

static int cand_cmp(const void *a, const void *b) {
  const cand_t *x = a, *y = b;
  return x->key < y->key ? -1 : x->key > y->key;
}

/* *gone = 1 when node_rank is marked gone in round (<round>/gone/<node_rank>). */
static agent_rdzv_result_t is_gone(agent_rdzv_t *r, int64_t round, int node_rank, int *gone) {
  char key[96], v[8];
  snprintf(key, sizeof key, "%" PRId64 "/gone/%d", round, node_rank);
  return rdzv_get_opt(r, key, v, sizeof v, gone);
}

/* *absent = the members of round r-1 (prev[node_rank] >= 0) that have not arrived among the u
 * candidates and are not marked gone in r-1. */
static agent_rdzv_result_t absent_members(agent_rdzv_t *r, const int *prev, int npods,
                                          const cand_t *c, int64_t u, int *absent) {
  *absent = 0;
  for (int nr = 0; nr < npods; nr++) {
    if (prev[nr] < 0) continue;
    int here = 0;
    for (int64_t i = 0; i < u && !here; i++) here = c[i].rec.node_rank == nr;
    if (here) continue;
    int found = 0;
    agent_rdzv_result_t res = is_gone(r, r->round - 1, nr, &found);
    if (res < 0) return res;
    *absent += !found;
  }
  return AGENT_RDZV_PENDING;
}

/* Picks the members of the current round among arrivals 1..count (see rdzv.h) and formats the
 * <r>/closed value into *val and the <r>/table/<idx> value into *table (the caller frees both);
 * *val = NULL when the round cannot close yet (a
 * record not written, the store host not there, fewer than MIN distinct nodes, a live member of
 * round r-1 still expected within member_wait_s). */
static agent_rdzv_result_t choose_members(agent_rdzv_t *r, int64_t count, int64_t now_ns,
                                          char **val, char **table) {
  *val = *table = NULL;
  int npods = r->nnodes_max + r->spares;
  int64_t m = count;
  if (m > r->nnodes_max + AGENT_RDZV_MAX_WAITERS) m = r->nnodes_max + AGENT_RDZV_MAX_WAITERS;
  agent_rdzv_member_t *recs = calloc((size_t)m, sizeof *recs);
  cand_t *c = calloc((size_t)m, sizeof *c);
  int *prev = calloc((size_t)npods, sizeof *prev);
  int64_t *slot = NULL;
  const agent_rdzv_member_t **srec = NULL;
  char *out = NULL, *tab = NULL, *header = NULL;
  int *nproc = NULL;
  int missing = 0;
  agent_rdzv_result_t res = AGENT_RDZV_NO_MEMORY;
  snprintf(r->err, sizeof r->err, "out of memory choosing the members of %" PRId64 " arrivals", m);
  if (!recs || !c || !prev) goto done;
  res = read_records(r, 1, m, recs, &missing);
  if (res < 0 || missing) goto done;
  /* One candidate per node rank: its latest arrival (an earlier one is a pod since replaced). */
  qsort(recs, (size_t)m, sizeof *recs, member_cmp);
  int64_t u = 0;
  int have0 = 0;
  for (int64_t i = 0; i < m; i++) {
    if (i + 1 < m && recs[i + 1].node_rank == recs[i].node_rank) continue;
    c[u++].rec = recs[i];
    have0 |= recs[i].node_rank == r->host_rank;
  }
  if (!have0 || u < r->nnodes_min) goto done;
  if ((res = prev_ranks(r, prev, npods)) < 0) goto done;
  for (int64_t i = 0; i < u; i++) {
    int nr = c[i].rec.node_rank, g = prev[nr];
    if (g >= 0 && nr != r->host_rank) {
      /* A member of r-1 marked gone that is here again is a new pod with its node rank (the lost
       * store host's replacement, or a member's that came back late): a newcomer, which waits
       * for the healthy members like any other. */
      int gone = 0;
      if ((res = is_gone(r, r->round - 1, nr, &gone)) < 0) goto done;
      if (gone) g = -1;
    }
    c[i].prev = g;
    c[i].key = nr == r->host_rank ? 0 : g >= 0 ? 1 + g : 1 + (int64_t)npods + nr;
  }
  qsort(c, (size_t)u, sizeof *c, cand_cmp);
  int64_t n = u < r->nnodes_max ? u : r->nnodes_max;
  /* A place for a newcomer (a standby) while a live member of r-1 is still on its way (stopping
   * its workers): wait for it, so that healthy nodes keep their group ranks. */
  int newcomer = 0, absent = 0;
  for (int64_t i = 1; i < n; i++) newcomer |= c[i].prev < 0;
  if (newcomer && r->member_wait_s > 0) {
    if ((res = absent_members(r, prev, npods, c, u, &absent)) < 0) goto done;
    if (absent) {
      if (!r->full_seen_ns) r->full_seen_ns = now_ns;
      if (now_ns - r->full_seen_ns < (int64_t)(r->member_wait_s * NS_PER_S)) {
        res = AGENT_RDZV_PENDING;
        goto done;
      }
    }
  }
  slot = malloc((size_t)n * sizeof *slot);
  srec = malloc((size_t)n * sizeof *srec);
  nproc = malloc((size_t)n * sizeof *nproc);
  tab = malloc(1 + (size_t)n * RECORD_MAX);
  res = AGENT_RDZV_NO_MEMORY;
  if (!slot || !srec || !nproc || !tab) goto done;
  for (int64_t g = 0; g < n; g++) slot[g] = 0;
  slot[0] = c[0].rec.idx; /* the store host */
  srec[0] = &c[0].rec;
  for (int64_t i = 1; i < n; i++)
    if (c[i].prev > 0 && c[i].prev < n && !slot[c[i].prev]) {
      slot[c[i].prev] = c[i].rec.idx;
      srec[c[i].prev] = &c[i].rec;
      c[i].rec.idx = 0; /* placed */
    }
  int64_t g = 1;
  for (int64_t i = 1; i < n; i++) {
    if (!c[i].rec.idx) continue;
    while (slot[g]) g++;
    slot[g] = c[i].rec.idx;
    srec[g] = &c[i].rec;
  }
  /* What the members agree on (rdzv.h): the max attempt and failures, the store host's (group
   * rank 0) workers' store, and this closer's table. */
  agent_rdzv_header_t h = {.worker_port = srec[0]->worker_port, .closer = r->idx};
  size_t tl = 0;
  for (int64_t k = 0; k < n; k++) {
    nproc[k] = srec[k]->nproc;
    if (srec[k]->attempt > h.attempt) h.attempt = srec[k]->attempt;
    if (srec[k]->failures > h.failures) h.failures = srec[k]->failures;
    tl += (size_t)sprintf(tab + tl, "%s%d %d %d %d %s %s %d", k ? "\n" : "", srec[k]->node_rank,
                          srec[k]->nproc, srec[k]->attempt, srec[k]->failures, srec[k]->addr,
                          srec[k]->host, srec[k]->worker_port);
  }
  header = agent_rdzv_format_header(&h, n, nproc);
  out = header ? malloc(24 + (size_t)n * 21 + strlen(header) + 2) : NULL;
  if (!out) goto done;
  size_t len = (size_t)sprintf(out, "%" PRId64, n);
  for (int64_t k = 0; k < n; k++)
    len += (size_t)sprintf(out + len, "%c%" PRId64, k ? ',' : ' ', slot[k]);
  sprintf(out + len, "\n%s", header);
  *val = out;
  *table = tab;
  out = tab = NULL;
  res = AGENT_RDZV_PENDING;
done:
  free(recs);
  free(c);
  free(prev);
  free(slot);
  free(srec);
  free(nproc);
  free(header);
  free(tab);
  free(out);
  return res;
}

/* A standby learns who the members of the round it waits in are, as a member does, so that it
 * carries them over to a store the agents move to (it gets there first: the members stop their
 * workers before they move). Best effort: a record missing or bad only loses the carry-over. */
static void remember_waited_round(agent_rdzv_t *r, const int64_t *list, int64_t n,
                                  const char *header) {
  if (n <= 0) return; /* parse_closed gives 1..nnodes_max */
  agent_rdzv_member_t *m = calloc((size_t)n, sizeof *m);
  int64_t *idx = list ? NULL : calloc((size_t)n, sizeof *idx);
  int missing = 0;
  char err[sizeof r->err];
  memcpy(err, r->err, sizeof err);
  if (m && list && header) {
    agent_rdzv_header_t h;
    int64_t *bases = NULL;
    int bad = agent_rdzv_parse_header(header, n, &h, &bases) != 0;
    free(bases);
    if (!bad && read_table(r, r->round, h.closer, list, n, m, &bad) >= 0 && !bad)
      set_carry(r, m, n);
  } else if (m && (list || idx)) {
    for (int64_t i = 0; idx && i < n; i++) idx[i] = i + 1;
    agent_rdzv_result_t res = read_idx(r, r->round, list ? list : idx, (size_t)n, m, &missing);
    if (res >= 0 && !missing) {
      if (!list) qsort(m, (size_t)n, sizeof *m, member_cmp);
      set_carry(r, m, n);
    }
  }
  memcpy(r->err, err, sizeof err);
  free(m);
  free(idx);
}

agent_rdzv_result_t agent_rdzv_join_poll(agent_rdzv_t *r, int64_t now_ns) {
  agent_rdzv_result_t res;
  int64_t cur;
  if ((res = rdzv_read_round(r, &cur)) < 0) return res;
  if (cur > r->round) return AGENT_RDZV_ROUND_MOVED;
  if (r->closed_n) return AGENT_RDZV_WAITER; /* closed without us: standby_poll follows it */
  char key[96], *val = NULL;
  snprintf(key, sizeof key, "%" PRId64 "/closed", r->round);
  if ((res = rdzv_get_alloc(r, key, &val)) < 0) return res;
  if (!val) {
    /* A job that gave up never closes another round: say so instead of waiting it out. */
    char text[sizeof r->end_text];
    int found = 0;
    if ((res = rdzv_get_opt(r, "failed", text, sizeof text, &found)) < 0) return res;
    if (found) {
      rdzv_copy_trunc(r->end_text, sizeof r->end_text, text);
      return AGENT_RDZV_JOB_FAILED;
    }
    int64_t count;
    char jkey[96];
    snprintf(jkey, sizeof jkey, "%" PRId64 "/joined", r->round);
    if ((res = rdzv_add_in(r, jkey, 0, 0, AGENT_RDZV_MAX_COUNT, &count)) < 0) return res;
    int close = 0;
    if (count >= r->nnodes_max) {
      close = 1;
    } else if (count >= r->nnodes_min) {
      if (!r->min_seen_ns) r->min_seen_ns = now_ns;
      close = now_ns - r->min_seen_ns >= (int64_t)(r->last_call_s * NS_PER_S);
    }
    if (!close) return AGENT_RDZV_PENDING;
    char *des = NULL, *table = NULL, tkey[96];
    if ((res = choose_members(r, count, now_ns, &des, &table)) < 0) return res;
    if (!des) return AGENT_RDZV_PENDING;
    /* The table first: whoever sees the round closed finds the records its closer names. */
    snprintf(tkey, sizeof tkey, "%" PRId64 "/table/%" PRId64, r->round, r->idx);
    res = rdzv_set_str(r, tkey, table);
    free(table);
    if (res < 0) {
      free(des);
      return res;
    }
    void *v = NULL;
    size_t n = 0;
    tdist_status_t st = tdist_store_compare_set(r->store, key, "", 0, des, strlen(des), &v, &n);
    int lost = st == TDIST_OK && (n != strlen(des) || memcmp(v, des, n));
    free(des);
    if (st != TDIST_OK) return rdzv_fail(r, key, st);
    int deleted = 0; /* another closer won: its table is the one named */
    if (lost && (st = tdist_store_delete_key(r->store, tkey, &deleted)) != TDIST_OK) {
      tdist_free(v);
      return rdzv_fail(r, tkey, st);
    }
    val = malloc(n + 1);
    if (val) {
      memcpy(val, v, n);
      val[n] = 0;
    }
    tdist_free(v);
    if (!val) {
      snprintf(r->err, sizeof r->err, "out of memory reading %s (%zu bytes)", key, n);
      return AGENT_RDZV_NO_MEMORY;
    }
  }
  int64_t n, *list = NULL;
  char *header = strchr(val, '\n'); /* what the members agree on follows the list (rdzv.h) */
  if (header) *header++ = 0;
  if (agent_rdzv_parse_closed(val, r->nnodes_max, &n, &list) || (header && !list)) {
    char want[96];
    snprintf(want, sizeof want, "a member count in 1..%d and its distinct arrivals", r->nnodes_max);
    res = rdzv_bad_value(r, key, val, strlen(val), want);
    free(val);
    return res;
  }
  int member = !list && r->idx <= n;
  for (int64_t i = 0; list && i < n; i++) member |= list[i] == r->idx;
  if (!member) {
    remember_waited_round(r, list, n, header);
    free(list);
    free(val);
    r->closed_n = n;
    return AGENT_RDZV_WAITER;
  }
  r->nmembers = n;
  res = load_members(r, now_ns, list, header);
  free(val);
  return res;
}

agent_rdzv_result_t agent_rdzv_wait_closed(agent_rdzv_t *r, int timeout_ms) {
  char key[96];
  snprintf(key, sizeof key, "%" PRId64 "/closed", r->round);
  const char *keys[1] = {key};
  tdist_status_t st = tdist_store_wait(r->store, keys, 1, timeout_ms > 0 ? timeout_ms : 1);
  if (st == TDIST_OK || st == TDIST_ERR_TIMEOUT) return AGENT_RDZV_PENDING;
  return rdzv_fail(r, key, st);
}
