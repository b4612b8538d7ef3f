/* See rdzv.h for the key layout and the protocol. Only the public store API is used. */
#define _GNU_SOURCE
#include "operator-agent/rendezvous/rdzv.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tdist/status.h>

#include "operator-agent/common/log.h"

#define NS_PER_S 1000000000LL

void agent_rdzv_init(agent_rdzv_t *r) {
  memset(r, 0, sizeof *r);
  r->round = -1;
  r->group_rank = -1;
}

void agent_rdzv_reset_round(agent_rdzv_t *r) {
  free(r->members);
  free(r->peer_hb);
  free(r->peer_hb_change_ns);
  r->members = NULL;
  r->peer_hb = r->peer_hb_change_ns = NULL;
  r->idx = 0;
  r->min_seen_ns = 0;
  r->nmembers = 0;
  r->group_rank = -1;
  r->world_size = r->rank_base = 0;
  r->worker_store_port = 0;
  r->next_hb_ns = 0;
  r->waiters_checked = 0;
  r->end_reason = AGENT_RESTART_PEER_LOST;
  r->end_text[0] = 0;
}

void agent_rdzv_free(agent_rdzv_t *r) { agent_rdzv_reset_round(r); }

static agent_rdzv_result_t fail(agent_rdzv_t *r, const char *what, tdist_status_t st) {
  snprintf(r->err, sizeof r->err, "store %s failed (%s): %s", what, tdist_status_name(st),
           tdist_store_last_error(r->store));
  return AGENT_RDZV_STORE_ERROR;
}

static agent_rdzv_result_t add(agent_rdzv_t *r, const char *key, int64_t delta, int64_t *out) {
  tdist_status_t st = tdist_store_add(r->store, key, delta, out);
  return st == TDIST_OK ? AGENT_RDZV_PENDING : fail(r, key, st);
}

static agent_rdzv_result_t set_str(agent_rdzv_t *r, const char *key, const char *v) {
  tdist_status_t st = tdist_store_set(r->store, key, v, strlen(v));
  return st == TDIST_OK ? AGENT_RDZV_PENDING : fail(r, key, st);
}

/* compare_set with string values; the resulting value goes to out (NUL-terminated). */
static agent_rdzv_result_t cas(agent_rdzv_t *r, const char *key, const char *expected,
                               const char *desired, char *out, size_t cap) {
  void *v = NULL;
  size_t n = 0;
  tdist_status_t st = tdist_store_compare_set(r->store, key, expected, strlen(expected), desired,
                                              strlen(desired), &v, &n);
  if (st != TDIST_OK) return fail(r, key, st);
  if (n >= cap) n = cap - 1;
  memcpy(out, v, n);
  out[n] = 0;
  tdist_free(v);
  return AGENT_RDZV_PENDING;
}

/* Value of key if it exists (*found = 1), without waiting. */
static agent_rdzv_result_t get_opt(agent_rdzv_t *r, const char *key, char *out, size_t cap,
                                   int *found) {
  const char *keys[1] = {key};
  int ready = 0;
  tdist_status_t st = tdist_store_check(r->store, keys, 1, &ready);
  if (st != TDIST_OK) return fail(r, key, st);
  *found = ready;
  out[0] = 0;
  if (!ready) return AGENT_RDZV_PENDING;
  void *v = NULL;
  size_t n = 0;
  st = tdist_store_get(r->store, key, &v, &n);
  if (st != TDIST_OK) return fail(r, key, st);
  if (n >= cap) n = cap - 1;
  memcpy(out, v, n);
  out[n] = 0;
  tdist_free(v);
  return AGENT_RDZV_PENDING;
}

/* Reads records idx first..last (1-based, inclusive) into recs. The keys exist or are about to
 * (an agent sets its record right after taking its index), so a bounded wait is fine. */
static agent_rdzv_result_t read_records(agent_rdzv_t *r, int64_t first, int64_t last,
                                        agent_rdzv_member_t *recs) {
  size_t n = (size_t)(last - first + 1);
  char **keys = calloc(n, sizeof *keys);
  void **vals = calloc(n, sizeof *vals);
  size_t *lens = calloc(n, sizeof *lens);
  agent_rdzv_result_t res = AGENT_RDZV_PENDING;
  if (!keys || !vals || !lens) {
    snprintf(r->err, sizeof r->err, "out of memory reading %zu rendezvous records", n);
    res = AGENT_RDZV_STORE_ERROR;
    goto out;
  }
  for (size_t i = 0; i < n; i++) {
    if (asprintf(&keys[i], "%" PRId64 "/node/%" PRId64, r->round, first + (int64_t)i) < 0) {
      keys[i] = NULL;
      snprintf(r->err, sizeof r->err, "out of memory");
      res = AGENT_RDZV_STORE_ERROR;
      goto out;
    }
  }
  tdist_status_t st = tdist_store_multi_get(r->store, (const char *const *)keys, n, vals, lens);
  if (st != TDIST_OK) {
    res = fail(r, "multi_get of rendezvous records", st);
    goto out;
  }
  for (size_t i = 0; i < n; i++) {
    char buf[256];
    size_t l = lens[i] < sizeof buf - 1 ? lens[i] : sizeof buf - 1;
    memcpy(buf, vals[i], l);
    buf[l] = 0;
    agent_rdzv_member_t *m = &recs[i];
    memset(m, 0, sizeof *m);
    m->idx = (int)(first + (int64_t)i);
    if (sscanf(buf, "%d %d %d %d %63s %63s %d", &m->node_rank, &m->nproc, &m->attempt, &m->failures,
               m->addr, m->host, &m->worker_port) != 7 ||
        m->nproc < 1 || m->worker_port < 0 || m->worker_port > 65535) {
      snprintf(r->err, sizeof r->err, "malformed rendezvous record %s: '%s'", keys[i], buf);
      res = AGENT_RDZV_STORE_ERROR;
      goto out;
    }
  }
out:
  for (size_t i = 0; keys && vals && i < n; i++) {
    free(keys[i]);
    tdist_free(vals[i]);
  }
  free(keys);
  free(vals);
  free(lens);
  return res;
}

agent_rdzv_result_t agent_rdzv_join(agent_rdzv_t *r, int64_t want_round, int attempt,
                                    int failures) {
  agent_rdzv_result_t res;
  int64_t cur;
  if ((res = add(r, "round", 0, &cur)) < 0) return res;
  while (cur < want_round) {
    char exp[32], des[32], got[64];
    snprintf(exp, sizeof exp, "%" PRId64, cur);
    snprintf(des, sizeof des, "%" PRId64, want_round);
    if ((res = cas(r, "round", exp, des, got, sizeof got)) < 0) return res;
    cur = strtoll(got, NULL, 10);
  }
  agent_rdzv_reset_round(r);
  r->round = cur;
  r->attempt = attempt;
  r->failures = failures;
  char key[96], rec[256];
  snprintf(key, sizeof key, "%" PRId64 "/joined", cur);
  if ((res = add(r, key, 1, &r->idx)) < 0) return res;
  snprintf(key, sizeof key, "%" PRId64 "/node/%" PRId64, cur, r->idx);
  snprintf(rec, sizeof rec, "%d %d %d %d %s %s %d", r->node_rank, r->nproc, attempt, failures,
           r->addr[0] ? r->addr : "-", r->host[0] ? r->host : "-", r->worker_port);
  if ((res = set_str(r, key, rec)) < 0) return res;
  snprintf(key, sizeof key, "%" PRId64 "/hb/%" PRId64, cur, r->idx);
  if ((res = set_str(r, key, "0")) < 0) return res;
  AGENT_DEBUG("joined rendezvous round %" PRId64 " as arrival %" PRId64, cur, r->idx);
  return AGENT_RDZV_PENDING;
}

static int member_cmp(const void *a, const void *b) {
  const agent_rdzv_member_t *x = a, *y = b;
  if (x->node_rank != y->node_rank) return x->node_rank < y->node_rank ? -1 : 1;
  return x->idx < y->idx ? -1 : x->idx > y->idx;
}

/* The records of the agents that arrived after round r closed (arrivals nmembers+1..joined) into
 * *w (caller frees; NULL when there are none), their count into *nw. */
static agent_rdzv_result_t read_waiters(agent_rdzv_t *r, int64_t joined, agent_rdzv_member_t **w,
                                        int64_t *nw) {
  *w = NULL;
  *nw = joined > r->nmembers ? joined - r->nmembers : 0;
  if (!*nw) return AGENT_RDZV_PENDING;
  if (!(*w = calloc((size_t)*nw, sizeof **w))) {
    snprintf(r->err, sizeof r->err, "out of memory");
    return AGENT_RDZV_STORE_ERROR;
  }
  return read_records(r, r->nmembers + 1, joined, *w);
}

static agent_rdzv_result_t joined_count(agent_rdzv_t *r, int64_t *joined) {
  char key[96];
  snprintf(key, sizeof key, "%" PRId64 "/joined", r->round);
  return add(r, key, 0, joined);
}

/* The store host arrived after the round closed (an elastic round that filled up without it):
 * its record, and so the workers' store, is among the waiters'. Without one the round cannot run
 * workers; ending it lets the next round include the store host. */
static agent_rdzv_result_t find_store_host(agent_rdzv_t *r) {
  int64_t joined, nw = 0;
  agent_rdzv_member_t *w = NULL;
  agent_rdzv_result_t res = joined_count(r, &joined);
  if (res >= 0) res = read_waiters(r, joined, &w, &nw);
  for (int64_t i = 0; res >= 0 && i < nw; i++)
    if (w[i].node_rank == 0 && w[i].worker_port > 0) r->worker_store_port = w[i].worker_port;
  free(w);
  if (res < 0) return res;
  if (r->worker_store_port) return AGENT_RDZV_MEMBER;
  res = agent_rdzv_end(r, AGENT_RESTART_MEMBERSHIP,
                       "the round closed without the store host (node 0): it hosts the workers' "
                       "store, so the next round must include it");
  return res < 0 ? res : AGENT_RDZV_ROUND_MOVED;
}

static agent_rdzv_result_t load_members(agent_rdzv_t *r, int64_t now_ns) {
  int64_t n = r->nmembers;
  r->members = calloc((size_t)n, sizeof *r->members);
  r->peer_hb = calloc((size_t)n, sizeof *r->peer_hb);
  r->peer_hb_change_ns = calloc((size_t)n, sizeof *r->peer_hb_change_ns);
  if (!r->members || !r->peer_hb || !r->peer_hb_change_ns) {
    snprintf(r->err, sizeof r->err, "out of memory for %" PRId64 " members", n);
    return AGENT_RDZV_STORE_ERROR;
  }
  agent_rdzv_result_t res = read_records(r, 1, n, r->members);
  if (res < 0) return res;
  qsort(r->members, (size_t)n, sizeof *r->members, member_cmp);
  int attempt = 0, failures = 0, ws = 0;
  r->worker_store_port = 0;
  for (int64_t i = 0; i < n; i++) {
    agent_rdzv_member_t *m = &r->members[i];
    if (m->node_rank == 0 && m->worker_port > 0) r->worker_store_port = m->worker_port;
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
  if (!r->worker_store_port) return find_store_host(r);
  return AGENT_RDZV_MEMBER;
}

agent_rdzv_result_t agent_rdzv_join_poll(agent_rdzv_t *r, int64_t now_ns) {
  agent_rdzv_result_t res;
  int64_t cur;
  if ((res = add(r, "round", 0, &cur)) < 0) return res;
  if (cur > r->round) return AGENT_RDZV_ROUND_MOVED;
  char key[96], val[64];
  int found = 0;
  snprintf(key, sizeof key, "%" PRId64 "/closed", r->round);
  if ((res = get_opt(r, key, val, sizeof val, &found)) < 0) return res;
  if (!found) {
    int64_t count;
    char jkey[96];
    snprintf(jkey, sizeof jkey, "%" PRId64 "/joined", r->round);
    if ((res = add(r, jkey, 0, &count)) < 0) return res;
    int64_t close_n = 0;
    if (count >= r->nnodes_max) {
      close_n = r->nnodes_max;
    } else if (count >= r->nnodes_min) {
      if (!r->min_seen_ns) r->min_seen_ns = now_ns;
      if (now_ns - r->min_seen_ns >= (int64_t)(r->last_call_s * NS_PER_S)) close_n = count;
    }
    if (!close_n) return AGENT_RDZV_PENDING;
    char des[32];
    snprintf(des, sizeof des, "%" PRId64, close_n);
    if ((res = cas(r, key, "", des, val, sizeof val)) < 0) return res;
  }
  char *end;
  long long n = strtoll(val, &end, 10);
  if (*end || n < 1 || n > r->nnodes_max) {
    snprintf(r->err, sizeof r->err, "malformed rendezvous key %s: '%s'", key, val);
    return AGENT_RDZV_STORE_ERROR;
  }
  if (r->idx > n) return AGENT_RDZV_WAITER;
  r->nmembers = n;
  return load_members(r, now_ns);
}

static void parse_end(agent_rdzv_t *r, const char *v) {
  r->end_reason = AGENT_RESTART_PEER_LOST;
  for (int i = 0; i < AGENT_RESTART_NREASONS; i++) {
    const char *name = agent_restart_reason_name((agent_restart_reason_t)i);
    size_t l = strlen(name);
    if (!strncmp(v, name, l) && (v[l] == ' ' || !v[l])) {
      r->end_reason = (agent_restart_reason_t)i;
      v += l + (v[l] == ' ');
      break;
    }
  }
  snprintf(r->end_text, sizeof r->end_text, "%s", v);
}

agent_rdzv_result_t agent_rdzv_end(agent_rdzv_t *r, agent_restart_reason_t reason,
                                   const char *text) {
  char key[96], val[320], got[320];
  snprintf(key, sizeof key, "%" PRId64 "/end", r->round);
  snprintf(val, sizeof val, "%s %s", agent_restart_reason_name(reason), text);
  agent_rdzv_result_t res = cas(r, key, "", val, got, sizeof got);
  if (res < 0) return res;
  parse_end(r, got);
  char exp[32], des[32];
  snprintf(exp, sizeof exp, "%" PRId64, r->round);
  snprintf(des, sizeof des, "%" PRId64, r->round + 1);
  res = cas(r, "round", exp, des, got, sizeof got);
  return res < 0 ? res : AGENT_RDZV_ENDED;
}

/* The round counter moved: find out why. */
static agent_rdzv_result_t read_end(agent_rdzv_t *r) {
  char key[96], val[320];
  int found = 0;
  snprintf(key, sizeof key, "%" PRId64 "/end", r->round);
  agent_rdzv_result_t res = get_opt(r, key, val, sizeof val, &found);
  if (res < 0) return res;
  if (found)
    parse_end(r, val);
  else
    parse_end(r, "membership round moved on without a reason (a newer agent started)");
  return AGENT_RDZV_ENDED;
}

static agent_rdzv_result_t heartbeat(agent_rdzv_t *r, int64_t now_ns) {
  if (now_ns < r->next_hb_ns) return AGENT_RDZV_PENDING;
  int first = r->next_hb_ns == 0;
  r->next_hb_ns = now_ns + (int64_t)(r->heartbeat_interval_s * NS_PER_S);
  char key[96], val[32];
  snprintf(key, sizeof key, "%" PRId64 "/hb/%" PRId64, r->round, r->idx);
  snprintf(val, sizeof val, "%" PRId64, ++r->hb_counter);
  agent_rdzv_result_t res = set_str(r, key, val);
  if (res < 0 || first) return res;

  /* Liveness of the others: the leader reads every member, the others read the leader. */
  int64_t lo = 0, hi = r->group_rank == 0 ? r->nmembers : 1;
  size_t n = (size_t)(hi - lo);
  char **keys = calloc(n, sizeof *keys);
  void **vals = calloc(n, sizeof *vals);
  size_t *lens = calloc(n, sizeof *lens);
  if (!keys || !vals || !lens) {
    free(keys);
    free(vals);
    free(lens);
    snprintf(r->err, sizeof r->err, "out of memory");
    return AGENT_RDZV_STORE_ERROR;
  }
  for (size_t i = 0; i < n; i++)
    if (asprintf(&keys[i], "%" PRId64 "/hb/%d", r->round, r->members[lo + (int64_t)i].idx) < 0)
      keys[i] = NULL;
  tdist_status_t st = TDIST_ERR_NO_MEMORY;
  int ok_keys = 1;
  for (size_t i = 0; i < n; i++) ok_keys &= keys[i] != NULL;
  if (ok_keys) st = tdist_store_multi_get(r->store, (const char *const *)keys, n, vals, lens);
  if (st != TDIST_OK) res = fail(r, "multi_get of heartbeats", st);
  for (size_t i = 0; st == TDIST_OK && i < n; i++) {
    int64_t m = lo + (int64_t)i;
    char buf[32];
    size_t l = lens[i] < sizeof buf - 1 ? lens[i] : sizeof buf - 1;
    memcpy(buf, vals[i], l);
    buf[l] = 0;
    int64_t v = strtoll(buf, NULL, 10);
    if (r->members[m].idx == r->idx) continue;
    if (v != r->peer_hb[m]) {
      r->peer_hb[m] = v;
      r->peer_hb_change_ns[m] = now_ns;
    } else if (now_ns - r->peer_hb_change_ns[m] > (int64_t)(r->heartbeat_timeout_s * NS_PER_S)) {
      char text[200];
      snprintf(text, sizeof text, "node %d (%s) sent no heartbeat for %.1f s",
               r->members[m].node_rank, r->members[m].addr,
               (double)(now_ns - r->peer_hb_change_ns[m]) / NS_PER_S);
      res = agent_rdzv_end(r, AGENT_RESTART_PEER_LOST, text);
      break;
    }
  }
  for (size_t i = 0; i < n; i++) {
    free(keys[i]);
    tdist_free(vals[i]);
  }
  free(keys);
  free(vals);
  free(lens);
  return res;
}

/* Agents that arrived after the round closed: admit them by ending the round when there is room,
 * or when one carries the node rank of a member (that member's pod was replaced). */
static agent_rdzv_result_t check_waiters(agent_rdzv_t *r) {
  int64_t joined, nw;
  agent_rdzv_result_t res = joined_count(r, &joined);
  /* Spare agents that can't be admitted stay in the count: read their records once. */
  if (res < 0 || joined <= r->nmembers || joined <= r->waiters_checked) return res;
  r->waiters_checked = joined;
  agent_rdzv_member_t *w;
  res = read_waiters(r, joined, &w, &nw);
  char text[200] = "";
  for (int64_t i = 0; res >= 0 && i < nw && !text[0]; i++) {
    for (int64_t m = 0; m < r->nmembers; m++)
      if (r->members[m].node_rank == w[i].node_rank)
        snprintf(text, sizeof text, "node %d rejoined from %s (was %s): its pod was replaced",
                 w[i].node_rank, w[i].addr, r->members[m].addr);
    if (!text[0] && r->nmembers < r->nnodes_max)
      snprintf(text, sizeof text, "node %d (%s) is waiting to join: scaling from %" PRId64 " nodes",
               w[i].node_rank, w[i].addr, r->nmembers);
  }
  free(w);
  if (res < 0 || !text[0]) return res;
  /* A replaced pod means its old agent is gone: that is a lost peer, not a scale-up. */
  return agent_rdzv_end(
      r, strstr(text, "replaced") ? AGENT_RESTART_PEER_LOST : AGENT_RESTART_MEMBERSHIP, text);
}

agent_rdzv_result_t agent_rdzv_monitor(agent_rdzv_t *r, int64_t now_ns) {
  agent_rdzv_result_t res;
  int64_t cur;
  if ((res = add(r, "round", 0, &cur)) < 0) return res;
  if (cur > r->round) return read_end(r);
  if ((res = heartbeat(r, now_ns)) != AGENT_RDZV_PENDING) return res;
  return check_waiters(r);
}

agent_rdzv_result_t agent_rdzv_done_poll(agent_rdzv_t *r, int64_t now_ns, int *marked) {
  char key[96];
  int64_t done;
  snprintf(key, sizeof key, "%" PRId64 "/done", r->round);
  agent_rdzv_result_t res = add(r, key, *marked ? 0 : 1, &done);
  if (res < 0) return res;
  *marked = 1;
  if (done >= r->nmembers) return AGENT_RDZV_ALL_DONE;
  return agent_rdzv_monitor(r, now_ns);
}

agent_rdzv_result_t agent_rdzv_mark_exited(agent_rdzv_t *r, int64_t *exited) {
  char key[96];
  snprintf(key, sizeof key, "%" PRId64 "/exited", r->round);
  return add(r, key, 1, exited);
}

agent_rdzv_result_t agent_rdzv_exited_count(agent_rdzv_t *r, int64_t *exited) {
  char key[96];
  snprintf(key, sizeof key, "%" PRId64 "/exited", r->round);
  return add(r, key, 0, exited);
}
