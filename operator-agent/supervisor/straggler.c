/* See straggler.h. Memory: a table of the collectives still incomplete, `slots` of them (slot =
 * seq % slots) with one duration per rank each, bounded to about 8 MiB whatever the world size;
 * the window; and the per-rank totals. Never allocates after agent_strag_create. */
#include "operator-agent/supervisor/straggler.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include <tdist/stats.h>

#define TABLE_ENTRIES (1 << 20) /* slots x world at most */
#define MAX_SLOTS 1024

typedef struct {
  uint64_t seq; /* 0 = free */
  int op, nseen, done;
} slot_t;

typedef struct {
  int last;
  int64_t caused_ns;
  uint64_t seq;
} win_t;

struct agent_strag {
  int world, nslots;
  slot_t *slot;
  int64_t *dur;         /* nslots x world, -1 = not seen */
  double *caused_total; /* world entries, seconds */
  int64_t *acc;         /* world entries: scratch of evaluate(), all zero between calls */
  int32_t *cnt;         /* likewise */
  win_t win[AGENT_STRAG_WINDOW];
  int win_n, win_next;
  agent_strag_state_t st;
};

int agent_strag_symmetric_op(int op) {
  /* The indexes of TDIST_STATS_OP_LIST: all_reduce 0, all_gather 3, reduce_scatter 6,
   * all_to_all 7, barrier 8, monitored_barrier 9. Rooted collectives (broadcast, reduce, gather,
   * scatter) and point-to-point ones let some ranks finish before others arrive. */
  switch (op) {
    case 0:
    case 3:
    case 6:
    case 7:
    case 8:
    case 9: return 1;
    default: return 0;
  }
}

agent_strag_t *agent_strag_create(int world) {
  if (world < 1 || world > AGENT_STRAG_MAX_WORLD) return NULL;
  agent_strag_t *s = calloc(1, sizeof *s);
  if (!s) return NULL;
  s->world = world;
  s->nslots = TABLE_ENTRIES / world;
  if (s->nslots > MAX_SLOTS) s->nslots = MAX_SLOTS;
  if (s->nslots < 4) s->nslots = 4;
  s->slot = calloc((size_t)s->nslots, sizeof *s->slot);
  s->dur = malloc((size_t)s->nslots * (size_t)world * sizeof *s->dur);
  s->caused_total = calloc((size_t)world, sizeof *s->caused_total);
  s->acc = calloc((size_t)world, sizeof *s->acc);
  s->cnt = calloc((size_t)world, sizeof *s->cnt);
  if (!s->slot || !s->dur || !s->caused_total || !s->acc || !s->cnt) {
    agent_strag_destroy(s);
    return NULL;
  }
  agent_strag_new_round(s);
  return s;
}

void agent_strag_destroy(agent_strag_t *s) {
  if (!s) return;
  free(s->slot);
  free(s->dur);
  free(s->caused_total);
  free(s->acc);
  free(s->cnt);
  free(s);
}

void agent_strag_new_round(agent_strag_t *s) {
  memset(s->slot, 0, (size_t)s->nslots * sizeof *s->slot);
  s->win_n = s->win_next = 0;
  uint64_t total = s->st.analysed_total;
  memset(&s->st, 0, sizeof s->st);
  s->st.straggler = s->st.leader = -1;
  s->st.analysed_total = total;
}

typedef unsigned __int128 u128;

/* The collectives of the window in which r arrived last and caused at least wait_ns x
 * (world - 1). */
static int held(const agent_strag_t *s, int r, int64_t wait_ns) {
  int n = 0;
  u128 min = (u128)wait_ns * (u128)(s->world - 1);
  for (int i = 0; i < s->win_n; i++) n += s->win[i].last == r && (u128)s->win[i].caused_ns >= min;
  return n;
}

/* The rule of straggler.h over the window, after a collective numbered seq was added. */
static void evaluate(agent_strag_t *s, uint64_t seq) {
  if (s->world < 2 || s->win_n < AGENT_STRAG_MIN_WINDOW) return;
  int64_t total = 0;
  int leader = -1, n = s->win_n;
  u128 min_on = (u128)AGENT_STRAG_WAIT_ON_NS * (u128)(s->world - 1);
  for (int i = 0; i < n; i++) {
    const win_t *w = &s->win[i];
    s->acc[w->last] += w->caused_ns;
    s->cnt[w->last] += (u128)w->caused_ns >= min_on;
    total += w->caused_ns;
  }
  /* The leader: held the others up most often, then caused the most wait, then the lowest. */
  for (int i = 0; i < n; i++) {
    int r = s->win[i].last;
    if (leader < 0 || s->cnt[r] > s->cnt[leader] ||
        (s->cnt[r] == s->cnt[leader] &&
         (s->acc[r] > s->acc[leader] || (s->acc[r] == s->acc[leader] && r < leader))))
      leader = r;
  }
  int64_t lw = s->acc[leader], cur_w = s->st.straggler >= 0 ? s->acc[s->st.straggler] : 0;
  int lheld = s->cnt[leader];
  for (int i = 0; i < n; i++) s->acc[s->win[i].last] = s->cnt[s->win[i].last] = 0;
  int on = lheld * 100 >= n * AGENT_STRAG_HELD_ON_PCT && lheld > 0;
  int keep = s->st.straggler >= 0 && held(s, s->st.straggler, AGENT_STRAG_WAIT_OFF_NS) * 100 >=
                                         n * AGENT_STRAG_HELD_OFF_PCT;
  if (!keep) {
    int was = s->st.straggler;
    s->st.straggler = on ? leader : -1;
    if (s->st.straggler >= 0 && s->st.straggler != was) {
      s->st.since_seq = seq;
      s->st.named_after = s->st.analysed;
    }
    if (s->st.straggler < 0) s->st.since_seq = s->st.named_after = 0;
  }
  s->st.leader = total > 0 ? leader : -1;
  int64_t w = keep ? cur_w : lw; /* the straggler's, or the leader's when none is named */
  s->st.share = total > 0 ? (double)w / (double)total : 0;
  s->st.mean_wait_s = (double)w / 1e9 / ((double)n * (double)(s->world - 1));
  s->st.held = (double)(keep ? held(s, s->st.straggler, AGENT_STRAG_WAIT_ON_NS) : lheld) / n;
}

/* Every rank's duration of the slot's collective is there: who arrived last, the wait it
 * caused, and the rule. */
static void analyse(agent_strag_t *s, slot_t *sl, const int64_t *d) {
  int last = 0;
  for (int r = 1; r < s->world; r++)
    if (d[r] < d[last]) last = r;
  int64_t caused = 0;
  for (int r = 0; r < s->world; r++)
    if (d[r] - d[last] > d[last]) caused += d[r] - 2 * d[last];
  s->caused_total[last] += (double)caused / 1e9;
  win_t *w = &s->win[s->win_next];
  w->last = last;
  w->caused_ns = caused;
  w->seq = sl->seq;
  s->win_next = (s->win_next + 1) % AGENT_STRAG_WINDOW;
  if (s->win_n < AGENT_STRAG_WINDOW) s->win_n++;
  s->st.analysed++;
  s->st.analysed_total++;
  evaluate(s, sl->seq);
}

int agent_strag_feed(agent_strag_t *s, int rank, uint64_t seq, int op, int64_t dur_ns) {
  if (rank < 0 || rank >= s->world || !seq || !agent_strag_symmetric_op(op) || dur_ns < 0) return 0;
  /* Capped so that sums over a window of any world fit in 63 bits (64 x 65536 x 600 s). */
  if (dur_ns > AGENT_STRAG_MAX_DUR_NS) dur_ns = AGENT_STRAG_MAX_DUR_NS;
  slot_t *sl = &s->slot[seq % (uint64_t)s->nslots];
  int64_t *d = s->dur + (size_t)(seq % (uint64_t)s->nslots) * (size_t)s->world;
  if (sl->seq > seq) return 0; /* older than what this slot tracks now: given up */
  if (sl->seq < seq) {         /* a newer collective takes the slot; the old one never completed */
    sl->seq = seq;
    sl->op = op;
    sl->nseen = sl->done = 0;
    for (int r = 0; r < s->world; r++) d[r] = -1;
  }
  if (sl->done || d[rank] >= 0 || sl->op != op) return 0;
  d[rank] = dur_ns;
  if (++sl->nseen < s->world) return 0;
  sl->done = 1;
  analyse(s, sl, d);
  return 1;
}

int agent_strag_feed_line(agent_strag_t *s, const char *line) {
  /* "R/seq.op.dur_us,seq.op.dur_us R/..." */
  int fed = 0;
  const char *p = line;
  /* Digits only where a number goes: strtol would also take signs and blanks. */
#define DIGIT_AT(q) ((q)[0] >= '0' && (q)[0] <= '9')
  while (*p) {
    while (*p == ' ') p++;
    if (!*p) break;
    char *end;
    if (!DIGIT_AT(p)) return -1;
    long r = strtol(p, &end, 10);
    if (end == p || *end != '/' || r < 0 || r >= AGENT_STRAG_MAX_WORLD) return -1;
    p = end + 1;
    for (;;) {
      if (!DIGIT_AT(p)) return -1;
      unsigned long long seq = strtoull(p, &end, 10);
      if (end == p || *end != '.') return -1;
      p = end + 1;
      if (!DIGIT_AT(p)) return -1;
      long op = strtol(p, &end, 10);
      if (end == p || *end != '.' || op < 0 || op >= TDIST_STATS_OPS) return -1;
      p = end + 1;
      if (!DIGIT_AT(p)) return -1;
      long long us = strtoll(p, &end, 10);
      if (end == p || us < 0 || us > INT64_MAX / 1000) return -1;
      p = end;
      agent_strag_feed(s, (int)r, (uint64_t)seq, (int)op, (int64_t)us * 1000);
      fed++;
      if (*p != ',') break;
      p++;
    }
    if (*p && *p != ' ') return -1;
  }
#undef DIGIT_AT
  return fed;
}

void agent_strag_view(const agent_strag_t *s, agent_strag_state_t *out) { *out = s->st; }
int agent_strag_world(const agent_strag_t *s) { return s->world; }
const double *agent_strag_caused(const agent_strag_t *s) { return s->caused_total; }
