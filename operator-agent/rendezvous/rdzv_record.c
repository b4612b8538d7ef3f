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
  snprintf(m->addr, sizeof m->addr, "%s", t[4]);
  snprintf(m->host, sizeof m->host, "%s", t[5]);
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
  qsort(sorted, (size_t)*n, sizeof *sorted, rdzv_cmp_i64);
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
