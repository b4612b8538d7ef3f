/* The rendezvous values' codec (rdzv.h): the records, counters, round ends and closed lists that
 * agents write to the store, parsed strictly (a value no agent writes is refused). Pure: no store,
 * no I/O, so it is fuzzed apart from the store traffic. */
#define _GNU_SOURCE
#include "operator-agent/rendezvous/rdzv.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "operator-agent/rendezvous/rdzv_int.h"

int agent_rdzv_parse_int(const char *s, int64_t lo, int64_t hi, int64_t *out) {
  /* Whole string, plain decimal as "%" PRId64 writes it: no '+', spaces or leading zeros, and
   * no minus zero ("-0" is not what any agent writes: two readers must never see one value
   * written two ways). */
  const char *p = s;
  if (*p == '-') p++;
  if (!*p || *p < '0' || *p > '9' || (p[0] == '0' && (p[1] || p != s))) return -1;
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
int rdzv_token(const char **s, char *tok, size_t cap) {
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
    if (rdzv_token(&p, t[i], sizeof t[i])) return -1;
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
  /* rdzv_token left both shorter than their token buffers, which fit in the fields (memcpy, not
   * snprintf: every agent parses every member's record once per round, 16 M records in all at
   * 4,096 emulated nodes, a third of that time in snprintf). */
  _Static_assert(sizeof m->addr >= sizeof t[4] && sizeof m->host >= sizeof t[5], "addr, host");
  memcpy(m->addr, t[4], strlen(t[4]) + 1);
  memcpy(m->host, t[5], strlen(t[5]) + 1);
  return 0;
}

int agent_rdzv_parse_table(const char *s, int64_t n, const int64_t *list, int nnodes_max,
                           agent_rdzv_member_t *m) {
  const char *p = s;
  for (int64_t i = 0; i < n; i++) {
    const char *e = strchr(p, '\n');
    size_t l = e ? (size_t)(e - p) : strlen(p);
    char line[256];
    if ((e == NULL) != (i == n - 1) || l >= sizeof line) return -1;
    memcpy(line, p, l);
    line[l] = 0;
    if (agent_rdzv_parse_record(line, nnodes_max, &m[i])) return -1;
    m[i].idx = (int)list[i];
    p = e ? e + 1 : p + l;
  }
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

int rdzv_cmp_i64(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return x < y ? -1 : x > y;
}

/* 1 if the n values of v (all >= 1) are distinct, -1 when out of memory; O(n) where sorting
 * would cost every member of a 4,096-node round 0.3 ms more: a bitmap when the values are at
 * most 64 n (a closer's list: arrivals 1..about n), else an open-addressing set. */
static int distinct(const int64_t *v, int64_t n) {
  int64_t max = 0;
  for (int64_t i = 0; i < n; i++)
    if (v[i] > max) max = v[i];
  int ok = 1;
  if (max <= 64 * n + 64) {
    uint64_t *bits = calloc((size_t)(max / 64 + 1), sizeof *bits);
    if (!bits) return -1;
    for (int64_t i = 0; ok && i < n; i++) {
      uint64_t bit = 1ULL << (v[i] & 63);
      ok = !(bits[v[i] / 64] & bit);
      bits[v[i] / 64] |= bit;
    }
    free(bits);
    return ok;
  }
  size_t cap = 16;
  while (cap < (size_t)n * 2) cap <<= 1;
  int64_t *set = calloc(cap, sizeof *set); /* 0: empty */
  if (!set) return -1;
  for (int64_t i = 0; ok && i < n; i++) {
    size_t h = (size_t)(((uint64_t)v[i] * 0x9E3779B97F4A7C15ULL) >> 32) & (cap - 1);
    while (set[h] && set[h] != v[i]) h = (h + 1) & (cap - 1);
    ok = set[h] != v[i];
    set[h] = v[i];
  }
  free(set);
  return ok;
}

/* Parses n comma-separated decimals in lo..hi into out; -1 unless that is all of s. */
static int parse_csv(const char *s, int64_t n, int64_t lo, int64_t hi, int64_t *out) {
  const char *p = s;
  for (int64_t i = 0; i < n; i++) {
    char tok[24];
    const char *e = strchr(p, ',');
    size_t tl = e ? (size_t)(e - p) : strlen(p);
    if ((e == NULL) != (i == n - 1) || tl >= sizeof tok) return -1;
    memcpy(tok, p, tl);
    tok[tl] = 0;
    if (agent_rdzv_parse_int(tok, lo, hi, &out[i])) return -1;
    p = e ? e + 1 : p + tl;
  }
  return 0;
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
  int64_t *l = malloc((size_t)*n * sizeof *l); /* every one written or freed: no clearing */
  if (!l || parse_csv(sp + 1, *n, 1, AGENT_RDZV_MAX_COUNT, l) || distinct(l, *n) != 1) {
    free(l);
    return -1;
  }
  *list = l;
  return 0;
}

/* The largest header: six numbers and their spaces. */
#define HEADER_LINE_MAX (6 * 21)

char *agent_rdzv_format_header(const agent_rdzv_header_t *h, int64_t n, const int *nproc) {
  int64_t ws = 0;
  int same = 1;
  for (int64_t i = 0; i < n; i++) {
    ws += nproc[i];
    same &= nproc[i] == nproc[0];
  }
  char *out = malloc(HEADER_LINE_MAX + 2 + (size_t)n * 9);
  if (!out) return NULL;
  size_t len =
      (size_t)sprintf(out, "%" PRId64 " %" PRId64 " %" PRId64 " %" PRId64 " %" PRId64 " %d", ws,
                      h->attempt, h->failures, h->worker_port, h->closer, same ? nproc[0] : 0);
  for (int64_t i = 0; !same && i < n; i++)
    len += (size_t)sprintf(out + len, "%c%d", i ? ',' : '\n', nproc[i]);
  return out;
}

int agent_rdzv_parse_header(const char *s, int64_t n, agent_rdzv_header_t *h, int64_t **bases) {
  *bases = NULL;
  if (n < 1) return -1;
  char line[HEADER_LINE_MAX + 1], t[6][24];
  const char *nl = strchr(s, '\n');
  size_t ll = nl ? (size_t)(nl - s) : strlen(s);
  if (!ll || ll >= sizeof line || s[ll - 1] == ' ') return -1;
  memcpy(line, s, ll);
  line[ll] = 0;
  const char *p = line;
  for (int i = 0; i < 6; i++)
    if (rdzv_token(&p, t[i], sizeof t[i])) return -1;
  int64_t v[6];
  const int64_t lo[6] = {1, 0, 0, 0, 1, 0};
  const int64_t hi[6] = {INT32_MAX, AGENT_RDZV_MAX_COUNT, AGENT_RDZV_MAX_COUNT,
                         65535,     AGENT_RDZV_MAX_COUNT, 1 << 20};
  for (int i = 0; i < 6; i++)
    if (agent_rdzv_parse_int(t[i], lo[i], hi[i], &v[i])) return -1;
  if (*p || (v[5] > 0) != (nl == NULL)) return -1;
  /* Both written in full before they are read (malloc: a 4,096-member header is 32 KB each). */
  int64_t *b = malloc((size_t)n * sizeof *b), *np = v[5] ? NULL : malloc((size_t)n * sizeof *np);
  if (!b || (!v[5] && (!np || parse_csv(nl + 1, n, 1, 1 << 20, np)))) goto bad;
  int64_t ws = 0;
  int same = 1;
  for (int64_t i = 0; i < n; i++) {
    int64_t k = v[5] ? v[5] : np[i];
    same &= k == (v[5] ? v[5] : np[0]);
    b[i] = ws;
    ws += k;
  }
  /* The sum is what every rank base is checked against; a list of equal counts is written as
   * one count (one value, one text). */
  if (ws != v[0] || (!v[5] && same)) goto bad;
  free(np);
  h->world_size = v[0];
  h->attempt = v[1];
  h->failures = v[2];
  h->worker_port = v[3];
  h->closer = v[4];
  h->nproc = v[5];
  *bases = b;
  return 0;
bad:
  free(b);
  free(np);
  return -1;
}
