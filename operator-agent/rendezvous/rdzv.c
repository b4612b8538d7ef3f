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
  r->carry_round = -1;
}

static void free_standbys(agent_rdzv_t *r) {
  free(r->standby);
  free(r->sb_hb);
  free(r->sb_change_ns);
  r->standby = NULL;
  r->sb_hb = r->sb_change_ns = NULL;
  r->nstandby = r->nstandby_live = 0;
}

void agent_rdzv_reset_round(agent_rdzv_t *r) {
  free(r->members);
  free(r->peer_hb);
  free(r->peer_hb_change_ns);
  r->members = NULL;
  r->peer_hb = r->peer_hb_change_ns = NULL;
  free_standbys(r);
  r->closed_n = 0;
  r->idx = 0;
  r->min_seen_ns = 0;
  r->full_seen_ns = 0;
  r->nmembers = 0;
  r->group_rank = -1;
  r->world_size = r->rank_base = 0;
  r->worker_store_port = 0;
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

static int cmp_i64(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return x < y ? -1 : x > y;
}

int agent_rdzv_parse_closed(const char *s, int nnodes_max, int64_t *n, int64_t **list) {
  *list = NULL;
  const char *sp = strchr(s, ' ');
  char head[24];
  size_t hl = sp ? (size_t)(sp - s) : strlen(s);
  if (hl >= sizeof head) return -1;
  memcpy(head, s, hl);
  head[hl] = 0;
  if (agent_rdzv_parse_int(head, 1, nnodes_max, n)) return -1;
  if (!sp) return 0;
  int64_t *l = calloc((size_t)*n, sizeof *l), *sorted = calloc((size_t)*n, sizeof *sorted);
  if (!l || !sorted) goto bad;
  const char *p = sp + 1;
  for (int64_t i = 0; i < *n; i++) {
    char tok[24];
    const char *e = strchr(p, ',');
    size_t tl = e ? (size_t)(e - p) : strlen(p);
    if ((e == NULL) != (i == *n - 1) || tl >= sizeof tok) goto bad;
    memcpy(tok, p, tl);
    tok[tl] = 0;
    if (agent_rdzv_parse_int(tok, 1, AGENT_RDZV_MAX_COUNT, &l[i])) goto bad;
    p = e ? e + 1 : p + tl;
  }
  memcpy(sorted, l, (size_t)*n * sizeof *l);
  qsort(sorted, (size_t)*n, sizeof *sorted, cmp_i64);
  for (int64_t i = 1; i < *n; i++)
    if (sorted[i] == sorted[i - 1]) goto bad;
  free(sorted);
  *list = l;
  return 0;
bad:
  free(l);
  free(sorted);
  return -1;
}

static agent_rdzv_result_t get_opt(agent_rdzv_t *r, const char *key, char *out, size_t cap,
                                   int *found);
static void copy_trunc(char *dst, size_t cap, const char *src);

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
    m->idx = (int)idx[i];
    if (l != lens[i] || strlen(buf) != l || agent_rdzv_parse_record(buf, npods, m)) {
      char want[160];
      snprintf(want, sizeof want,
               "a record 'node_rank(0..%d) nproc attempt failures addr host worker_port'",
               npods - 1);
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
    if ((res = get_opt(r, key, v, sizeof v, &closed)) < 0) return res;
    if (!closed) want_round = r->carry_round + 1;
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

/* The records of the agents of round r that are not members (arrivals 1..joined, members
 * skipped; of several arrivals with one node rank the latest) into *w (caller frees; NULL when
 * there are none), their count into *nw: at most AGENT_RDZV_MAX_WAITERS, -1 when some record is
 * missing (none read). */
static agent_rdzv_result_t read_waiters(agent_rdzv_t *r, int64_t joined, agent_rdzv_member_t **w,
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
  for (int64_t i = 0; i < r->nmembers; i++) mi[i] = r->members[i].idx;
  qsort(mi, (size_t)r->nmembers, sizeof *mi, cmp_i64);
  qsort(all, (size_t)m, sizeof *all, member_cmp);
  int64_t k = 0;
  for (int64_t i = 0; i < m && k < AGENT_RDZV_MAX_WAITERS; i++) {
    int64_t idx = all[i].idx;
    if (r->nmembers && bsearch(&idx, mi, (size_t)r->nmembers, sizeof *mi, cmp_i64)) continue;
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
    if (w[i].node_rank == r->host_rank && w[i].worker_port > 0)
      r->worker_store_port = w[i].worker_port;
  free(w);
  if (res < 0) return res;
  if (r->worker_store_port) return AGENT_RDZV_MEMBER;
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

/* The members of the closed round: arrivals list[0..n-1] in group-rank order, or (list NULL, a
 * bare "N") the first n arrivals in (node_rank, idx) order. */
static agent_rdzv_result_t load_members(agent_rdzv_t *r, int64_t now_ns, const int64_t *list) {
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
  agent_rdzv_result_t res = list ? read_idx(r, r->round, list, (size_t)n, r->members, &missing)
                                 : read_records(r, 1, n, r->members, &missing);
  if (res >= 0 && missing) {
    /* A member's record is not there yet (or <r>/closed counts fake joiners): poll again. */
    free_members(r);
    r->nmembers = 0;
    return AGENT_RDZV_PENDING;
  }
  if (res < 0) return res;
  if (!list) qsort(r->members, (size_t)n, sizeof *r->members, member_cmp);
  int attempt = 0, failures = 0, ws = 0;
  r->worker_store_port = 0;
  for (int64_t i = 0; i < n; i++) {
    agent_rdzv_member_t *m = &r->members[i];
    if (m->node_rank == r->host_rank && m->worker_port > 0) r->worker_store_port = m->worker_port;
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
  set_carry(r, r->members, n);
  return AGENT_RDZV_MEMBER;
}

/* The value of key, allocated (NUL-terminated; the caller frees), or *out = NULL if absent. */
static agent_rdzv_result_t get_alloc(agent_rdzv_t *r, const char *key, char **out) {
  const char *keys[1] = {key};
  int ready = 0;
  *out = NULL;
  tdist_status_t st = tdist_store_check(r->store, keys, 1, &ready);
  if (st != TDIST_OK) return fail(r, key, st);
  if (!ready) return AGENT_RDZV_PENDING;
  void *v = NULL;
  size_t n = 0;
  st = tdist_store_get(r->store, key, &v, &n);
  if (st != TDIST_OK) return fail(r, key, st);
  *out = malloc(n + 1);
  if (*out) {
    memcpy(*out, v, n);
    (*out)[n] = 0;
  }
  tdist_free(v);
  if (!*out) {
    snprintf(r->err, sizeof r->err, "out of memory reading %s (%zu bytes)", key, n);
    return AGENT_RDZV_NO_MEMORY;
  }
  return AGENT_RDZV_PENDING;
}

/* prev_ranks from "<r-1>/members" (agent_rdzv_carry_over), when round r-1 closed in another
 * store. A value this code would not write is ignored: it only costs the ranks' continuity. */
static agent_rdzv_result_t carried_ranks(agent_rdzv_t *r, int *prev, int npods) {
  char key[96], *val = NULL;
  snprintf(key, sizeof key, "%" PRId64 "/members", r->round - 1);
  agent_rdzv_result_t res = get_alloc(r, key, &val);
  if (res == AGENT_RDZV_STORE_ERROR) return res;
  int *p = calloc((size_t)npods, sizeof *p);
  int ok = val && p, g = 0;
  for (int i = 0; p && i < npods; i++) p[i] = -1;
  for (const char *q = val; ok && *q; g++) {
    char tok[16];
    int64_t nr;
    if (g >= r->nnodes_max || token(&q, tok, sizeof tok) ||
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
  agent_rdzv_result_t res = get_alloc(r, key, &val);
  if (res == AGENT_RDZV_STORE_ERROR) return res;
  if (!val) return carried_ranks(r, prev, npods);
  int64_t n, *list = NULL;
  agent_rdzv_member_t *m = NULL;
  int missing = 0;
  if (!agent_rdzv_parse_closed(val, r->nnodes_max, &n, &list) &&
      (m = calloc((size_t)n, sizeof *m))) {
    if (list) {
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
  return get_opt(r, key, v, sizeof v, gone);
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
 * <r>/closed value into *val (the caller frees); *val = NULL when the round cannot close yet (a
 * record not written, the store host not there, fewer than MIN distinct nodes, a live member of
 * round r-1 still expected within member_wait_s). */
static agent_rdzv_result_t choose_members(agent_rdzv_t *r, int64_t count, int64_t now_ns,
                                          char **val) {
  *val = NULL;
  int npods = r->nnodes_max + r->spares;
  int64_t m = count;
  if (m > r->nnodes_max + AGENT_RDZV_MAX_WAITERS) m = r->nnodes_max + AGENT_RDZV_MAX_WAITERS;
  agent_rdzv_member_t *recs = calloc((size_t)m, sizeof *recs);
  cand_t *c = calloc((size_t)m, sizeof *c);
  int *prev = calloc((size_t)npods, sizeof *prev);
  int64_t *slot = NULL;
  char *out = NULL;
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
  out = malloc(24 + (size_t)n * 21);
  res = AGENT_RDZV_NO_MEMORY;
  if (!slot || !out) goto done;
  for (int64_t g = 0; g < n; g++) slot[g] = 0;
  slot[0] = c[0].rec.idx; /* the store host */
  for (int64_t i = 1; i < n; i++)
    if (c[i].prev > 0 && c[i].prev < n && !slot[c[i].prev]) {
      slot[c[i].prev] = c[i].rec.idx;
      c[i].rec.idx = 0; /* placed */
    }
  int64_t g = 1;
  for (int64_t i = 1; i < n; i++) {
    if (!c[i].rec.idx) continue;
    while (slot[g]) g++;
    slot[g] = c[i].rec.idx;
  }
  size_t len = (size_t)sprintf(out, "%" PRId64, n);
  for (int64_t k = 0; k < n; k++)
    len += (size_t)sprintf(out + len, "%c%" PRId64, k ? ',' : ' ', slot[k]);
  *val = out;
  out = NULL;
  res = AGENT_RDZV_PENDING;
done:
  free(recs);
  free(c);
  free(prev);
  free(slot);
  free(out);
  return res;
}

/* A standby learns who the members of the round it waits in are, as a member does, so that it
 * carries them over to a store the agents move to (it gets there first: the members stop their
 * workers before they move). Best effort: a record missing or bad only loses the carry-over. */
static void remember_waited_round(agent_rdzv_t *r, const int64_t *list, int64_t n) {
  agent_rdzv_member_t *m = calloc((size_t)n, sizeof *m);
  int64_t *idx = list ? NULL : calloc((size_t)n, sizeof *idx);
  int missing = 0;
  char err[sizeof r->err];
  memcpy(err, r->err, sizeof err);
  if (m && (list || idx)) {
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
  if ((res = read_round(r, &cur)) < 0) return res;
  if (cur > r->round) return AGENT_RDZV_ROUND_MOVED;
  if (r->closed_n) return AGENT_RDZV_WAITER; /* closed without us: standby_poll follows it */
  char key[96], *val = NULL;
  snprintf(key, sizeof key, "%" PRId64 "/closed", r->round);
  if ((res = get_alloc(r, key, &val)) < 0) return res;
  if (!val) {
    /* A job that gave up never closes another round: say so instead of waiting it out. */
    char text[sizeof r->end_text];
    int found = 0;
    if ((res = get_opt(r, "failed", text, sizeof text, &found)) < 0) return res;
    if (found) {
      copy_trunc(r->end_text, sizeof r->end_text, text);
      return AGENT_RDZV_JOB_FAILED;
    }
    int64_t count;
    char jkey[96];
    snprintf(jkey, sizeof jkey, "%" PRId64 "/joined", r->round);
    if ((res = add_in(r, jkey, 0, 0, AGENT_RDZV_MAX_COUNT, &count)) < 0) return res;
    int close = 0;
    if (count >= r->nnodes_max) {
      close = 1;
    } else if (count >= r->nnodes_min) {
      if (!r->min_seen_ns) r->min_seen_ns = now_ns;
      close = now_ns - r->min_seen_ns >= (int64_t)(r->last_call_s * NS_PER_S);
    }
    if (!close) return AGENT_RDZV_PENDING;
    char *des = NULL;
    if ((res = choose_members(r, count, now_ns, &des)) < 0) return res;
    if (!des) return AGENT_RDZV_PENDING;
    void *v = NULL;
    size_t n = 0;
    tdist_status_t st = tdist_store_compare_set(r->store, key, "", 0, des, strlen(des), &v, &n);
    free(des);
    if (st != TDIST_OK) return fail(r, key, st);
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
  if (agent_rdzv_parse_closed(val, r->nnodes_max, &n, &list)) {
    char want[96];
    snprintf(want, sizeof want, "a member count in 1..%d and its distinct arrivals", r->nnodes_max);
    res = bad_value(r, key, val, strlen(val), want);
    free(val);
    return res;
  }
  free(val);
  int member = !list && r->idx <= n;
  for (int64_t i = 0; list && i < n; i++) member |= list[i] == r->idx;
  if (!member) {
    remember_waited_round(r, list, n);
    free(list);
    r->closed_n = n;
    return AGENT_RDZV_WAITER;
  }
  r->nmembers = n;
  res = load_members(r, now_ns, list);
  free(list);
  return res;
}

agent_rdzv_result_t agent_rdzv_wait_closed(agent_rdzv_t *r, int timeout_ms) {
  char key[96];
  snprintf(key, sizeof key, "%" PRId64 "/closed", r->round);
  const char *keys[1] = {key};
  tdist_status_t st = tdist_store_wait(r->store, keys, 1, timeout_ms > 0 ? timeout_ms : 1);
  if (st == TDIST_OK || st == TDIST_ERR_TIMEOUT) return AGENT_RDZV_PENDING;
  return fail(r, key, st);
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
      res = agent_rdzv_mark_gone(r, r->members[m].node_rank);
      if (res >= 0) res = agent_rdzv_end(r, AGENT_RESTART_PEER_LOST, text);
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

/* Keeps the waiters that are not a member's node rank as this round's standbys; the heartbeat
 * state of those seen before carries over. */
static void keep_standbys(agent_rdzv_t *r, const agent_rdzv_member_t *w, int64_t nw,
                          int64_t now_ns) {
  agent_rdzv_member_t *sb = calloc((size_t)(nw ? nw : 1), sizeof *sb);
  int64_t *hb = calloc((size_t)(nw ? nw : 1), sizeof *hb);
  int64_t *ch = calloc((size_t)(nw ? nw : 1), sizeof *ch);
  if (!sb || !hb || !ch) {
    free(sb);
    free(hb);
    free(ch);
    return; /* the count is only shown: try again when the waiters change */
  }
  int k = 0;
  for (int64_t i = 0; i < nw; i++) {
    int is_member = 0;
    for (int64_t m = 0; m < r->nmembers && !is_member; m++)
      is_member = r->members[m].node_rank == w[i].node_rank;
    if (is_member) continue;
    sb[k] = w[i];
    hb[k] = -1;
    ch[k] = now_ns;
    for (int j = 0; j < r->nstandby; j++)
      if (r->standby[j].idx == w[i].idx) {
        hb[k] = r->sb_hb[j];
        ch[k] = r->sb_change_ns[j];
      }
    k++;
  }
  free_standbys(r);
  r->standby = sb;
  r->sb_hb = hb;
  r->sb_change_ns = ch;
  r->nstandby = r->nstandby_live = k;
}

/* Agents that arrived after the round closed: admit them by ending the round when there is room,
 * or when one carries the node rank of a member (that member's pod was replaced); the others are
 * standbys. */
static agent_rdzv_result_t check_waiters(agent_rdzv_t *r, int64_t now_ns) {
  int64_t joined, nw;
  agent_rdzv_result_t res = joined_count(r, &joined);
  /* Spare agents that can't be admitted stay in the count: read their records once. */
  if (res < 0 || joined <= r->nmembers || joined <= r->waiters_checked) return res;
  agent_rdzv_member_t *w;
  res = read_waiters(r, joined, &w, &nw);
  /* All records there: read once. Some missing (being written, or fake joiners): next poll. */
  if (res >= 0 && nw >= 0) {
    r->waiters_checked = joined;
    keep_standbys(r, w, nw, now_ns);
  }
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

/* The leader: which standbys still heartbeat (r->nstandby_live). Best effort, like the count. */
static agent_rdzv_result_t standby_liveness(agent_rdzv_t *r, int64_t now_ns) {
  if (!r->nstandby) return AGENT_RDZV_PENDING;
  size_t n = (size_t)r->nstandby;
  char **keys = calloc(n, sizeof *keys);
  void **vals = calloc(n, sizeof *vals);
  size_t *lens = calloc(n, sizeof *lens);
  int ok = keys && vals && lens;
  for (size_t i = 0; ok && i < n; i++)
    ok = asprintf(&keys[i], "%" PRId64 "/hb/%d", r->round, r->standby[i].idx) >= 0 ||
         (keys[i] = NULL, 0);
  agent_rdzv_result_t res = AGENT_RDZV_PENDING;
  tdist_status_t st = ok ? tdist_store_multi_get(r->store, (const char *const *)keys, n, vals, lens)
                         : TDIST_ERR_NO_MEMORY;
  if (st == TDIST_OK) {
    int live = 0;
    for (size_t i = 0; i < n; i++) {
      char buf[32];
      size_t l = lens[i] < sizeof buf - 1 ? lens[i] : sizeof buf - 1;
      memcpy(buf, vals[i], l);
      buf[l] = 0;
      int64_t v;
      if (agent_rdzv_parse_int(buf, 0, INT64_MAX, &v)) v = -2; /* not a beat: never alive */
      if (v != r->sb_hb[i] && v != -2) {
        r->sb_hb[i] = v;
        r->sb_change_ns[i] = now_ns;
      }
      live +=
          v != -2 && now_ns - r->sb_change_ns[i] <= (int64_t)(r->heartbeat_timeout_s * NS_PER_S);
    }
    r->nstandby_live = live;
  } else if (st != TDIST_ERR_NO_MEMORY) {
    res = fail(r, "multi_get of standby heartbeats", st);
  }
  for (size_t i = 0; keys && i < n; i++) {
    free(keys[i]);
    if (vals) tdist_free(vals[i]);
  }
  free(keys);
  free(vals);
  free(lens);
  return res;
}

agent_rdzv_result_t agent_rdzv_monitor(agent_rdzv_t *r, int64_t now_ns) {
  agent_rdzv_result_t res;
  int64_t cur;
  if ((res = read_round(r, &cur)) < 0) return res;
  if (cur > r->round) return read_end(r, cur);
  int64_t due = r->next_hb_ns;
  if ((res = heartbeat(r, now_ns)) != AGENT_RDZV_PENDING) return res;
  if (r->group_rank == 0 && now_ns >= due && (res = standby_liveness(r, now_ns)) < 0) return res;
  return check_waiters(r, now_ns);
}

agent_rdzv_result_t agent_rdzv_standby_poll(agent_rdzv_t *r, int64_t now_ns) {
  agent_rdzv_result_t res;
  int64_t cur, done;
  if ((res = read_round(r, &cur)) < 0) return res;
  if (cur > r->round) return AGENT_RDZV_ROUND_MOVED;
  char key[96], val[32], text[sizeof r->end_text];
  if (now_ns >= r->next_hb_ns) {
    r->next_hb_ns = now_ns + (int64_t)(r->heartbeat_interval_s * NS_PER_S);
    snprintf(key, sizeof key, "%" PRId64 "/hb/%" PRId64, r->round, r->idx);
    snprintf(val, sizeof val, "%" PRId64, ++r->hb_counter);
    if ((res = set_str(r, key, val)) < 0) return res;
  }
  snprintf(key, sizeof key, "%" PRId64 "/done", r->round);
  if ((res = add_in(r, key, 0, 0, AGENT_RDZV_MAX_COUNT, &done)) < 0) return res;
  if (r->closed_n && done >= r->closed_n) return AGENT_RDZV_ALL_DONE;
  int found = 0;
  if ((res = get_opt(r, "failed", text, sizeof text, &found)) < 0) return res;
  if (!found) return AGENT_RDZV_PENDING;
  copy_trunc(r->end_text, sizeof r->end_text, text);
  return AGENT_RDZV_JOB_FAILED;
}

agent_rdzv_result_t agent_rdzv_carry_over(agent_rdzv_t *r, int lost) {
  if (r->carry_round < 0 || !r->carry_nodes) return AGENT_RDZV_PENDING;
  char key[96], got[8];
  int found = 0;
  snprintf(key, sizeof key, "%" PRId64 "/closed", r->carry_round);
  agent_rdzv_result_t res = get_opt(r, key, got, sizeof got, &found);
  if (res < 0 || found) return res < 0 ? res : AGENT_RDZV_PENDING;
  char *val = malloc((size_t)r->carry_n * 12 + 1);
  if (!val) {
    snprintf(r->err, sizeof r->err, "out of memory carrying round %" PRId64, r->carry_round);
    return AGENT_RDZV_NO_MEMORY;
  }
  size_t len = 0;
  val[0] = 0;
  for (int i = 0; i < r->carry_n; i++)
    len += (size_t)sprintf(val + len, "%s%d", i ? " " : "", r->carry_nodes[i]);
  char cur[16];
  snprintf(key, sizeof key, "%" PRId64 "/members", r->carry_round);
  res = cas(r, key, "", val, cur, sizeof cur);
  free(val);
  if (res < 0 || lost < 0) return res < 0 ? res : AGENT_RDZV_PENDING;
  snprintf(key, sizeof key, "%" PRId64 "/gone/%d", r->carry_round, lost);
  return set_str(r, key, "1");
}

agent_rdzv_result_t agent_rdzv_mark_gone(agent_rdzv_t *r, int node_rank) {
  char key[96];
  snprintf(key, sizeof key, "%" PRId64 "/gone/%d", r->round, node_rank);
  return set_str(r, key, "1");
}

agent_rdzv_result_t agent_rdzv_job_failed(agent_rdzv_t *r, const char *text) {
  return set_str(r, "failed", text[0] ? text : "the job gave up");
}

agent_rdzv_result_t agent_rdzv_standby_exited(agent_rdzv_t *r, int64_t delta, int64_t *exited) {
  return add_in(r, "standby_exited", delta, 0, AGENT_RDZV_MAX_COUNT, exited);
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
