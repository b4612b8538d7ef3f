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
  return st == TDIST_ERR_NO_MEMORY ? AGENT_RDZV_NO_MEMORY : AGENT_RDZV_STORE_ERROR;
}

static agent_rdzv_result_t bad_value(agent_rdzv_t *r, const char *key, const void *v, size_t n,
                                     const char *want) {
  char shown[80];
  size_t l = n < sizeof shown - 1 ? n : sizeof shown - 1;
  for (size_t i = 0; i < l; i++) {
    unsigned char c = ((const unsigned char *)v)[i];
    shown[i] = c >= 0x20 && c < 0x7f ? (char)c : '?';
  }
  shown[l] = 0;
  snprintf(r->err, sizeof r->err,
           "protocol error: key %s holds '%s'%s, not %s (no agent of this job writes that)", key,
           shown, n > l ? "..." : "", want);
  return AGENT_RDZV_PROTOCOL_ERROR;
}

const char *agent_rdzv_result_name(agent_rdzv_result_t res) {
  switch (res) {
    case AGENT_RDZV_STORE_ERROR: return "store error";
    case AGENT_RDZV_PROTOCOL_ERROR: return "protocol error";
    case AGENT_RDZV_NO_MEMORY: return "out of memory";
    default: return "ok";
  }
}

int agent_rdzv_parse_int(const char *s, int64_t lo, int64_t hi, int64_t *out) {
  /* Whole string, plain decimal as "%" PRId64 writes it: no sign, spaces or leading zeros. */
  const char *p = s;
  if (*p == '-') p++;
  if (!*p || *p < '0' || *p > '9' || (p[0] == '0' && p[1])) return -1;
  int64_t v = 0;
  for (; *p; p++) {
    if (*p < '0' || *p > '9') return -1;
    int d = *p - '0';
    if (v > (INT64_MAX - d) / 10) return -1;
    v = v * 10 + d;
  }
  if (*s == '-') v = -v;
  if (v < lo || v > hi) return -1;
  *out = v;
  return 0;
}

/* Splits off the next space-separated token of *s into tok (cap bytes); -1 if none or too long. */
static int token(const char **s, char *tok, size_t cap) {
  const char *p = *s, *e = strchr(p, ' ');
  size_t n = e ? (size_t)(e - p) : strlen(p);
  if (!n || n >= cap) return -1;
  memcpy(tok, p, n);
  tok[n] = 0;
  *s = e ? e + 1 : p + n;
  return 0;
}

int agent_rdzv_parse_record(const char *s, int nnodes_max, agent_rdzv_member_t *m) {
  char t[7][64];
  const char *p = s;
  size_t len = strlen(s);
  if (!len || s[len - 1] == ' ') return -1;
  for (int i = 0; i < 7; i++)
    if (token(&p, t[i], sizeof t[i])) return -1;
  if (*p) return -1;
  int64_t v[4], port;
  const int64_t hi[4] = {nnodes_max - 1, 1 << 20, AGENT_RDZV_MAX_COUNT, AGENT_RDZV_MAX_COUNT};
  const int64_t lo[4] = {0, 1, 0, 0};
  for (int i = 0; i < 4; i++)
    if (agent_rdzv_parse_int(t[i], lo[i], hi[i], &v[i])) return -1;
  if (agent_rdzv_parse_int(t[6], 0, 65535, &port)) return -1;
  m->node_rank = (int)v[0];
  m->nproc = (int)v[1];
  m->attempt = (int)v[2];
  m->failures = (int)v[3];
  m->worker_port = (int)port;
  snprintf(m->addr, sizeof m->addr, "%s", t[4]);
  snprintf(m->host, sizeof m->host, "%s", t[5]);
  return 0;
}

int agent_rdzv_parse_end(const char *v, agent_restart_reason_t *reason, const char **text) {
  for (int i = 0; i < AGENT_RESTART_NREASONS; i++) {
    const char *name = agent_restart_reason_name((agent_restart_reason_t)i);
    size_t l = strlen(name);
    if (!strncmp(v, name, l) && v[l] == ' ' && v[l + 1]) {
      *reason = (agent_restart_reason_t)i;
      *text = v + l + 1;
      return 0;
    }
  }
  return -1;
}

static agent_rdzv_result_t get_opt(agent_rdzv_t *r, const char *key, char *out, size_t cap,
                                   int *found);

static agent_rdzv_result_t add(agent_rdzv_t *r, const char *key, int64_t delta, int64_t *out) {
  tdist_status_t st = tdist_store_add(r->store, key, delta, out);
  if (st == TDIST_OK) return AGENT_RDZV_PENDING;
  if (st != TDIST_ERR_INVALID_USAGE) return fail(r, key, st);
  /* The server refused: the value is not a number (the client reconnected). Show it. */
  char v[128];
  int found = 0;
  agent_rdzv_result_t res = get_opt(r, key, v, sizeof v, &found);
  if (res < 0) return res;
  return bad_value(r, key, v, strlen(v), "a decimal counter");
}

/* ADD, then the result checked against lo..hi. */
static agent_rdzv_result_t add_in(agent_rdzv_t *r, const char *key, int64_t delta, int64_t lo,
                                  int64_t hi, int64_t *out) {
  agent_rdzv_result_t res = add(r, key, delta, out);
  if (res < 0 || (*out >= lo && *out <= hi)) return res;
  char v[32], want[80];
  snprintf(v, sizeof v, "%" PRId64, *out);
  snprintf(want, sizeof want, "a count in %" PRId64 "..%" PRId64, lo, hi);
  return bad_value(r, key, v, strlen(v), want);
}

static agent_rdzv_result_t set_str(agent_rdzv_t *r, const char *key, const char *v) {
  tdist_status_t st = tdist_store_set(r->store, key, v, strlen(v));
  return st == TDIST_OK ? AGENT_RDZV_PENDING : fail(r, key, st);
}

static agent_rdzv_result_t read_round(agent_rdzv_t *r, int64_t *cur) {
  return add_in(r, "round", 0, 0, AGENT_RDZV_MAX_ROUND, cur);
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

/* Reads records idx first..last (1-based, inclusive) into recs. An agent sets its record right
 * after taking its index, so a missing one is about to appear, or belongs to a fake joiner (an ADD
 * on <r>/joined by something else): then *missing = 1 and nothing is read, never a blocking wait.
 */
static agent_rdzv_result_t read_records(agent_rdzv_t *r, int64_t first, int64_t last,
                                        agent_rdzv_member_t *recs, int *missing) {
  size_t n = (size_t)(last - first + 1);
  char **keys = calloc(n, sizeof *keys);
  void **vals = calloc(n, sizeof *vals);
  size_t *lens = calloc(n, sizeof *lens);
  agent_rdzv_result_t res = AGENT_RDZV_PENDING;
  *missing = 0;
  if (!keys || !vals || !lens) {
    snprintf(r->err, sizeof r->err, "out of memory reading %zu rendezvous records", n);
    res = AGENT_RDZV_NO_MEMORY;
    goto out;
  }
  for (size_t i = 0; i < n; i++) {
    if (asprintf(&keys[i], "%" PRId64 "/node/%" PRId64, r->round, first + (int64_t)i) < 0) {
      keys[i] = NULL;
      snprintf(r->err, sizeof r->err, "out of memory reading rendezvous records");
      res = AGENT_RDZV_NO_MEMORY;
      goto out;
    }
  }
  int ready = 0;
  tdist_status_t st = tdist_store_check(r->store, (const char *const *)keys, n, &ready);
  if (st != TDIST_OK) {
    res = fail(r, "check of rendezvous records", st);
    goto out;
  }
  if (!ready) {
    *missing = 1;
    goto out;
  }
  st = tdist_store_multi_get(r->store, (const char *const *)keys, n, vals, lens);
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
    if (l != lens[i] || strlen(buf) != l || agent_rdzv_parse_record(buf, r->nnodes_max, m)) {
      char want[160];
      snprintf(want, sizeof want,
               "a record 'node_rank(0..%d) nproc attempt failures addr host worker_port'",
               r->nnodes_max - 1);
      res = bad_value(r, keys[i], vals[i], lens[i], want);
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
  if (want_round > AGENT_RDZV_MAX_ROUND) {
    snprintf(r->err, sizeof r->err,
             "protocol error: round %" PRId64
             " is past the last round %lld: key round was moved "
             "out of range",
             want_round, AGENT_RDZV_MAX_ROUND);
    return AGENT_RDZV_PROTOCOL_ERROR;
  }
  if ((res = read_round(r, &cur)) < 0) return res;
  while (cur < want_round) {
    char exp[32], des[32], got[64];
    snprintf(exp, sizeof exp, "%" PRId64, cur);
    snprintf(des, sizeof des, "%" PRId64, want_round);
    if ((res = cas(r, "round", exp, des, got, sizeof got)) < 0) return res;
    if (agent_rdzv_parse_int(got, 0, AGENT_RDZV_MAX_ROUND, &cur))
      return bad_value(r, "round", got, strlen(got), "a round number");
  }
  agent_rdzv_reset_round(r);
  r->round = cur;
  r->attempt = attempt;
  r->failures = failures;
  char key[96], rec[256];
  snprintf(key, sizeof key, "%" PRId64 "/joined", cur);
  if ((res = add_in(r, key, 1, 1, AGENT_RDZV_MAX_COUNT, &r->idx)) < 0) return res;
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
 * *w (caller frees; NULL when there are none), their count into *nw: at most
 * AGENT_RDZV_MAX_WAITERS, -1 when some record is missing (none read). */
static agent_rdzv_result_t read_waiters(agent_rdzv_t *r, int64_t joined, agent_rdzv_member_t **w,
                                        int64_t *nw) {
  *w = NULL;
  int64_t first = r->nmembers + 1;
  *nw = joined >= first ? joined - first + 1 : 0;
  /* Fake joiners can push the count up without records: read a bounded window. */
  if (*nw > AGENT_RDZV_MAX_WAITERS) *nw = AGENT_RDZV_MAX_WAITERS;
  if (!*nw) return AGENT_RDZV_PENDING;
  if (!(*w = calloc((size_t)*nw, sizeof **w))) {
    snprintf(r->err, sizeof r->err, "out of memory reading %" PRId64 " waiter records", *nw);
    return AGENT_RDZV_NO_MEMORY;
  }
  int missing = 0;
  agent_rdzv_result_t res = read_records(r, first, first + *nw - 1, *w, &missing);
  if (res >= 0 && missing) *nw = -1; /* not all written yet (or fake joiners): next poll */
  return res;
}

static agent_rdzv_result_t joined_count(agent_rdzv_t *r, int64_t *joined) {
  char key[96];
  snprintf(key, sizeof key, "%" PRId64 "/joined", r->round);
  return add_in(r, key, 0, 0, AGENT_RDZV_MAX_COUNT, joined);
}

/* The store host arrived after the round closed (an elastic round that filled up without it):
 * its record, and so the workers' store, is among the waiters'. Without one the round cannot run
 * workers; ending it lets the next round include the store host. */
static agent_rdzv_result_t find_store_host(agent_rdzv_t *r) {
  int64_t joined, nw = 0;
  agent_rdzv_member_t *w = NULL;
  agent_rdzv_result_t res = joined_count(r, &joined);
  if (res >= 0) res = read_waiters(r, joined, &w, &nw);
  for (int64_t i = 0; res >= 0 && i < nw; i++) /* nw < 0: records missing, none read */
    if (w[i].node_rank == 0 && w[i].worker_port > 0) r->worker_store_port = w[i].worker_port;
  free(w);
  if (res < 0) return res;
  if (r->worker_store_port) return AGENT_RDZV_MEMBER;
  res = agent_rdzv_end(r, AGENT_RESTART_MEMBERSHIP,
                       "the round closed without the store host (node 0): it hosts the workers' "
                       "store, so the next round must include it");
  return res < 0 ? res : AGENT_RDZV_ROUND_MOVED;
}

static void free_members(agent_rdzv_t *r) {
  free(r->members);
  free(r->peer_hb);
  free(r->peer_hb_change_ns);
  r->members = NULL;
  r->peer_hb = r->peer_hb_change_ns = NULL;
}

static agent_rdzv_result_t load_members(agent_rdzv_t *r, int64_t now_ns) {
  int64_t n = r->nmembers;
  free_members(r); /* an earlier poll that failed (a bad record) may have left them */
  r->members = calloc((size_t)n, sizeof *r->members);
  r->peer_hb = calloc((size_t)n, sizeof *r->peer_hb);
  r->peer_hb_change_ns = calloc((size_t)n, sizeof *r->peer_hb_change_ns);
  if (!r->members || !r->peer_hb || !r->peer_hb_change_ns) {
    snprintf(r->err, sizeof r->err, "out of memory for %" PRId64 " members", n);
    return AGENT_RDZV_NO_MEMORY;
  }
  int missing = 0;
  agent_rdzv_result_t res = read_records(r, 1, n, r->members, &missing);
  if (res >= 0 && missing) {
    /* A member's record is not there yet (or <r>/closed counts fake joiners): poll again. */
    free_members(r);
    r->nmembers = 0;
    return AGENT_RDZV_PENDING;
  }
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
  if ((res = read_round(r, &cur)) < 0) return res;
  if (cur > r->round) return AGENT_RDZV_ROUND_MOVED;
  char key[96], val[64];
  int found = 0;
  snprintf(key, sizeof key, "%" PRId64 "/closed", r->round);
  if ((res = get_opt(r, key, val, sizeof val, &found)) < 0) return res;
  if (!found) {
    int64_t count;
    char jkey[96];
    snprintf(jkey, sizeof jkey, "%" PRId64 "/joined", r->round);
    if ((res = add_in(r, jkey, 0, 0, AGENT_RDZV_MAX_COUNT, &count)) < 0) return res;
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
  int64_t n;
  if (agent_rdzv_parse_int(val, 1, r->nnodes_max, &n)) {
    char want[64];
    snprintf(want, sizeof want, "a member count in 1..%d", r->nnodes_max);
    return bad_value(r, key, val, strlen(val), want);
  }
  if (r->idx > n) return AGENT_RDZV_WAITER;
  r->nmembers = n;
  return load_members(r, now_ns);
}

static void copy_trunc(char *dst, size_t cap, const char *src) {
  size_t n = strlen(src);
  if (n >= cap) n = cap - 1;
  memcpy(dst, src, n);
  dst[n] = 0;
}

/* r->end_reason/end_text from the value of <r>/end; one no agent writes fails the round as a
 * protocol error with the value in the text. */
static void take_end(agent_rdzv_t *r, const char *key, const char *v) {
  const char *text;
  if (!agent_rdzv_parse_end(v, &r->end_reason, &text)) {
    snprintf(r->end_text, sizeof r->end_text, "%s", text);
    return;
  }
  bad_value(r, key, v, strlen(v), "'<reason> <text>' with a known reason");
  r->end_reason = AGENT_RESTART_PROTOCOL;
  copy_trunc(r->end_text, sizeof r->end_text, r->err);
}

agent_rdzv_result_t agent_rdzv_end(agent_rdzv_t *r, agent_restart_reason_t reason,
                                   const char *text) {
  char key[96], val[320], got[320];
  snprintf(key, sizeof key, "%" PRId64 "/end", r->round);
  snprintf(val, sizeof val, "%s %s", agent_restart_reason_name(reason), text);
  agent_rdzv_result_t res = cas(r, key, "", val, got, sizeof got);
  if (res < 0) return res;
  take_end(r, key, got);
  /* r->round <= AGENT_RDZV_MAX_ROUND (validated when joined): + 1 cannot overflow. If the round
   * holds something else (moved on, or garbage), the compare_set changes nothing and the next
   * join reads and judges it. */
  char exp[32], des[32];
  snprintf(exp, sizeof exp, "%" PRId64, r->round);
  snprintf(des, sizeof des, "%" PRId64, r->round + 1);
  res = cas(r, "round", exp, des, got, sizeof got);
  return res < 0 ? res : AGENT_RDZV_ENDED;
}

/* The round counter moved from r->round to cur: find out why. */
static agent_rdzv_result_t read_end(agent_rdzv_t *r, int64_t cur) {
  char key[96], val[320];
  int found = 0;
  snprintf(key, sizeof key, "%" PRId64 "/end", r->round);
  agent_rdzv_result_t res = get_opt(r, key, val, sizeof val, &found);
  if (res < 0) return res;
  if (!found) {
    /* Agents write <r>/end before moving the round, except one that lost the store and rejoins
     * past it. Either way somebody's round failed: it counts against --max-restarts. */
    r->end_reason = AGENT_RESTART_PEER_LOST;
    snprintf(r->end_text, sizeof r->end_text,
             "key round moved from %" PRId64 " to %" PRId64
             " with no %s record (an agent that "
             "lost the store rejoined, or something else wrote the key)",
             r->round, cur, key);
    return AGENT_RDZV_ENDED;
  }
  take_end(r, key, val);
  if (r->end_reason == AGENT_RESTART_MEMBERSHIP) {
    /* A membership change is free (not counted): only believe it with a waiter in the count. */
    int64_t joined;
    char jkey[96];
    snprintf(jkey, sizeof jkey, "%" PRId64 "/joined", r->round);
    if ((res = add_in(r, jkey, 0, 0, AGENT_RDZV_MAX_COUNT, &joined)) < 0) return res;
    if (joined <= r->nmembers) {
      char text[1024];
      snprintf(text, sizeof text,
               "protocol error: key %s says 'membership %s' but no node is waiting to join "
               "(%s = %" PRId64 ", %" PRId64 " member(s))",
               key, r->end_text, jkey, joined, r->nmembers);
      r->end_reason = AGENT_RESTART_PROTOCOL;
      copy_trunc(r->end_text, sizeof r->end_text, text);
    }
  }
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
    snprintf(r->err, sizeof r->err, "out of memory reading heartbeats");
    return AGENT_RDZV_NO_MEMORY;
  }
  for (size_t i = 0; i < n; i++)
    if (asprintf(&keys[i], "%" PRId64 "/hb/%d", r->round, r->members[lo + (int64_t)i].idx) < 0)
      keys[i] = NULL;
  tdist_status_t st = TDIST_ERR_NO_MEMORY;
  snprintf(r->err, sizeof r->err, "out of memory reading heartbeats");
  int ok_keys = 1;
  for (size_t i = 0; i < n; i++) ok_keys &= keys[i] != NULL;
  if (ok_keys) st = tdist_store_multi_get(r->store, (const char *const *)keys, n, vals, lens);
  if (!ok_keys)
    res = AGENT_RDZV_NO_MEMORY;
  else if (st != TDIST_OK)
    res = fail(r, "multi_get of heartbeats", st);
  for (size_t i = 0; st == TDIST_OK && i < n; i++) {
    int64_t m = lo + (int64_t)i;
    char buf[32];
    size_t l = lens[i] < sizeof buf - 1 ? lens[i] : sizeof buf - 1;
    memcpy(buf, vals[i], l);
    buf[l] = 0;
    int64_t v;
    if (r->members[m].idx == r->idx) continue;
    if (l != lens[i] || strlen(buf) != l || agent_rdzv_parse_int(buf, 0, INT64_MAX, &v)) {
      res = bad_value(r, keys[i], vals[i], lens[i], "a heartbeat counter");
      break;
    }
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
  agent_rdzv_member_t *w;
  res = read_waiters(r, joined, &w, &nw);
  /* All records there: read once. Some missing (being written, or fake joiners): next poll. */
  if (res >= 0 && nw >= 0) r->waiters_checked = joined;
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
  if ((res = read_round(r, &cur)) < 0) return res;
  if (cur > r->round) return read_end(r, cur);
  if ((res = heartbeat(r, now_ns)) != AGENT_RDZV_PENDING) return res;
  return check_waiters(r);
}

agent_rdzv_result_t agent_rdzv_done_poll(agent_rdzv_t *r, int64_t now_ns, int *marked) {
  char key[96];
  int64_t done;
  snprintf(key, sizeof key, "%" PRId64 "/done", r->round);
  agent_rdzv_result_t res = add_in(r, key, *marked ? 0 : 1, 0, AGENT_RDZV_MAX_COUNT, &done);
  if (res < 0) return res;
  *marked = 1;
  if (done >= r->nmembers) return AGENT_RDZV_ALL_DONE;
  return agent_rdzv_monitor(r, now_ns);
}

agent_rdzv_result_t agent_rdzv_mark_exited(agent_rdzv_t *r, int64_t *exited) {
  char key[96];
  snprintf(key, sizeof key, "%" PRId64 "/exited", r->round);
  return add_in(r, key, 1, 0, AGENT_RDZV_MAX_COUNT, exited);
}

agent_rdzv_result_t agent_rdzv_exited_count(agent_rdzv_t *r, int64_t *exited) {
  char key[96];
  snprintf(key, sizeof key, "%" PRId64 "/exited", r->round);
  return add_in(r, key, 0, 0, AGENT_RDZV_MAX_COUNT, exited);
}
