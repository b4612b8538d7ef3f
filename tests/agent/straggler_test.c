/* operator-agent/supervisor/straggler.c and arrivals.c: who the others wait for.
 *   random: random worlds (2..16 ranks over random nodes), random arrival times (a slowed rank,
 *   one that changes half-way, two alternating, nobody), fed as agents publish them (batches cut
 *   at different points per node, nodes in random order, stale lines fed again, entries lost,
 *   rooted collectives mixed in) and checked after every line against an independent model:
 *   the rank that arrived last is the one with the latest arrival time (the computation sees only
 *   durations), the wait it caused the sum of the others' arrival gaps, the rule recomputed from
 *   scratch over the window each time;
 *   fixed: a rank slowed by 5 ms is named after AGENT_STRAG_MIN_WINDOW collectives, hysteresis
 *   both ways, one long pause names nobody, a new round, world 1, malformed lines, ranks and types
 * out of range; local: the arrivals line from crafted statistics files: only new, completed,
 * successful, symmetric world-group entries, the cursor, a new process, sampling past
 *   AGENT_STRAG_MAX_PUBLISH, a short buffer; the line read back by agent_strag_feed_line;
 *   http: /metrics (promtool) and /status (python3's json) with and without a straggler, and on a
 *   node that does not compute them. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <tdist/stats.h>

#include "check.h"
#include "http_testlib.h"
#include "operator-agent/http/http.h"
#include "operator-agent/supervisor/arrivals.h"
#include "operator-agent/supervisor/straggler.h"
#include "rng.h"
#include "stats_testlib.h"

#define MAXW 16
#define WIN AGENT_STRAG_WINDOW

static long long g_analysed, g_namings, g_unnamings; /* over the random cases: proof of coverage */

/* ---------------------------------------------------------------------------------------- */
/* the model                                                                                 */

typedef struct {
  int world, straggler, leader;
  int n;                  /* collectives analysed */
  int last[4096];         /* per analysed collective: who arrived last */
  long long caused[4096]; /* ... and the wait it caused, ns */
  unsigned long long seq[4096];
  unsigned long long since_seq;
  double total[MAXW];
} model_t;

/* arrival_us[r]: when rank r arrived (any common clock: the model may use it); xfer_us: how long
 * the transfer took once the last one was there (a wait shorter than that does not count). */
static void model_collective(model_t *m, unsigned long long seq, const long long *arrival_us,
                             long long xfer_us) {
  int last = 0;
  for (int r = 0; r < m->world; r++)
    if (arrival_us[r] > arrival_us[last]) last = r;
  long long caused = 0;
  for (int r = 0; r < m->world; r++)
    if (arrival_us[last] - arrival_us[r] > xfer_us)
      caused += (arrival_us[last] - arrival_us[r] - xfer_us) * 1000;
  CHECK(m->n < 4096);
  m->last[m->n] = last;
  m->caused[m->n] = caused;
  m->seq[m->n] = seq;
  m->n++;
  g_analysed++;
  m->total[last] += (double)caused / 1e9;
  int from = m->n > WIN ? m->n - WIN : 0, k = m->n - from;
  if (m->world < 2 || k < AGENT_STRAG_MIN_WINDOW) return;
  long long w[MAXW] = {0}, sum = 0, min_on = AGENT_STRAG_WAIT_ON_NS * (m->world - 1);
  int in[MAXW] = {0}, held_on[MAXW] = {0}, held_off = 0, s = m->straggler;
  /* held: collectives of the window where r was last and each other rank waited >= T. */
  for (int i = from; i < m->n; i++) {
    int r = m->last[i];
    w[r] += m->caused[i];
    in[r] = 1;
    sum += m->caused[i];
    held_on[r] += m->caused[i] >= min_on;
    held_off += r == s && m->caused[i] >= AGENT_STRAG_WAIT_OFF_NS * (m->world - 1);
  }
  int lead = -1;
  for (int r = 0; r < m->world; r++)
    if (in[r] &&
        (lead < 0 || held_on[r] > held_on[lead] || (held_on[r] == held_on[lead] && w[r] > w[lead])))
      lead = r;
  m->leader = sum > 0 ? lead : -1;
  int on = held_on[lead] > 0 && 100 * held_on[lead] >= AGENT_STRAG_HELD_ON_PCT * k;
  int keep = s >= 0 && 100 * held_off >= AGENT_STRAG_HELD_OFF_PCT * k;
  if (keep) return;
  g_namings += on && lead != s;
  g_unnamings += !on && s >= 0;
  m->straggler = on ? lead : -1;
  if (m->straggler >= 0 && m->straggler != s) m->since_seq = seq;
  if (m->straggler < 0) m->since_seq = 0;
}

static void check_against(const agent_strag_t *s, const model_t *m) {
  agent_strag_state_t v;
  agent_strag_view(s, &v);
  CHECK_EQ_UINT(v.analysed, (unsigned long long)m->n);
  CHECK_EQ_INT(v.straggler, m->straggler);
  CHECK_EQ_INT(v.leader, m->leader);
  CHECK_EQ_UINT(v.since_seq, m->since_seq);
  const double *t = agent_strag_caused(s);
  for (int r = 0; r < m->world; r++)
    if (t[r] < m->total[r] - 1e-6 || t[r] > m->total[r] + 1e-6)
      TEST_FAIL("rank %d caused %.9f s, the model says %.9f", r, t[r], m->total[r]);
}

/* ---------------------------------------------------------------------------------------- */
/* random arrivals, published as agents do                                                   */

#define MAXC 600

typedef struct {
  long long arrival[MAXC][MAXW], dur_us[MAXC][MAXW];
  int op[MAXC];
  long long xfer_us[MAXC];
  char lost[MAXC][MAXW];
} job_t;

static int rnd_in(int lo, int hi) { return lo + (int)rnd_below((uint64_t)(hi - lo + 1)); }

static void make_job(job_t *j, int world, int nc) {
  /* 0 nobody slowed, 1 one rank, 2 one then another, 3 two alternating, 4 one then nobody */
  int mode = rnd_in(0, 4), slow = rnd_in(0, world - 1), slow2 = rnd_in(0, world - 1);
  int jitter = rnd_in(0, 3000), extra = rnd_in(0, 8000), pct = rnd_in(40, 100);
  for (int c = 0; c < nc; c++) {
    j->op[c] = rnd_below(20) ? 0 : (rnd_below(2) ? 1 : 8); /* mostly all_reduce; broadcast */
    long long mx = 0;
    int who = mode == 1 || (mode == 2 && c < nc / 2) || (mode == 3 && c % 2) ? slow
              : mode == 2 || mode == 3                                       ? slow2
              : mode == 4 && c < nc / 2                                      ? slow
                                                                             : -1;
    for (int r = 0; r < world; r++) {
      j->arrival[c][r] = (long long)c * 20000 + rnd_in(0, jitter);
      if (r == who && (int)rnd_below(100) < pct) j->arrival[c][r] += extra;
      if (j->arrival[c][r] > mx) mx = j->arrival[c][r];
      j->lost[c][r] = rnd_below(60) == 0;
    }
    long long xfer = j->xfer_us[c] = rnd_in(5, 200);
    for (int r = 0; r < world; r++) j->dur_us[c][r] = mx - j->arrival[c][r] + xfer;
  }
}

typedef struct {
  int rank;
  int c; /* collective index; seq = c + 1 */
} ent_t;

static void random_case(int iter) {
  static job_t j;
  static const int worlds[] = {2, 3, 4, 5, 8, 16};
  int world = worlds[rnd_below(6)], nc = rnd_in(50, MAXC);
  make_job(&j, world, nc);
  /* Nodes: ranks split into consecutive runs. */
  int node_of[MAXW], nnodes = 0;
  for (int r = 0; r < world; r++) {
    if (r == 0 || rnd_below(3) == 0) nnodes++;
    node_of[r] = nnodes - 1;
  }
  /* Each node publishes at its own cut points: after period k it has sent 0..cut[g][k]. */
  int cut[MAXW][MAXC + 2], nper = 0, pos[MAXW] = {0};
  while (1) {
    int all = 1;
    for (int g = 0; g < nnodes; g++) {
      pos[g] += rnd_in(0, 40);
      if (pos[g] > nc) pos[g] = nc;
      cut[g][nper] = pos[g];
      all &= pos[g] == nc;
    }
    nper++;
    if (all || nper == MAXC + 1) break;
  }
  for (int g = 0; g < nnodes; g++) cut[g][nper - 1] = nc;
  agent_strag_t *s = agent_strag_create(world);
  CHECK(s != NULL);
  model_t *m = calloc(1, sizeof *m);
  CHECK(m != NULL);
  m->world = world;
  m->straggler = m->leader = -1;
  int seen[MAXC] = {0};
  char *line = malloc(1 << 20), *prev[MAXW] = {0};
  CHECK(line != NULL);
  char name[64];
  snprintf(name, sizeof name, "random %d: world %d, %d nodes", iter, world, nnodes);
  TEST_CASE(name);
  for (int k = 0; k < nper; k++) {
    int order[MAXW];
    for (int g = 0; g < nnodes; g++) order[g] = g;
    for (int g = nnodes - 1; g > 0; g--) {
      int x = (int)rnd_below((uint64_t)g + 1), t = order[g];
      order[g] = order[x];
      order[x] = t;
    }
    for (int oi = 0; oi < nnodes; oi++) {
      int g = order[oi], lo = k ? cut[g][k - 1] : 0, hi = cut[g][k];
      if (prev[g] && rnd_below(8) == 0) { /* a stale read: the node's previous line again */
        CHECK_CMP_INT(agent_strag_feed_line(s, prev[g]), >=, 0);
        check_against(s, m);
      }
      size_t n = 0;
      line[0] = 0;
      ent_t ents[MAXW * MAXC];
      int ne = 0;
      for (int r = 0; r < world; r++) {
        if (node_of[r] != g) continue;
        int put = 0;
        for (int c = lo; c < hi; c++) {
          if (j.lost[c][r]) continue;
          if (put)
            line[n++] = ',';
          else
            n += (size_t)snprintf(line + n, (1 << 20) - n, "%s%d/", n ? " " : "", r);
          n += (size_t)snprintf(line + n, (1 << 20) - n, "%d.%d.%lld", c + 1, j.op[c],
                                j.dur_us[c][r]);
          put = 1;
          ents[ne++] = (ent_t){r, c};
        }
      }
      line[n] = 0;
      if (!n) continue;
      CHECK_EQ_INT(agent_strag_feed_line(s, line), ne);
      /* The model: a symmetric collective is analysed when its last rank's entry comes. */
      for (int e = 0; e < ne; e++) {
        int c = ents[e].c;
        if (j.op[c] == 1) continue;
        if (++seen[c] == world)
          model_collective(m, (unsigned long long)c + 1, j.arrival[c], j.xfer_us[c]);
      }
      check_against(s, m);
      free(prev[g]);
      prev[g] = strdup(line);
    }
  }
  TEST_CASE(NULL);
  for (int g = 0; g < MAXW; g++) free(prev[g]);
  free(line);
  free(m);
  agent_strag_destroy(s);
}

/* ---------------------------------------------------------------------------------------- */
/* fixed cases                                                                               */

/* One collective of world ranks where `last` arrived wait_us after all the others. */
static int feed_one(agent_strag_t *s, int world, unsigned long long seq, int last, int wait_us) {
  int done = 0;
  for (int r = 0; r < world; r++)
    done += agent_strag_feed(s, r, seq, 0, (long long)(r == last ? 50 : 50 + wait_us) * 1000);
  return done;
}

static void fixed_cases(void) {
  TEST_CASE("slowed rank named after the minimum window");
  agent_strag_t *s = agent_strag_create(4);
  agent_strag_state_t v;
  unsigned long long seq = 1;
  for (int i = 1; i < AGENT_STRAG_MIN_WINDOW; i++) CHECK_EQ_INT(feed_one(s, 4, seq++, 2, 5000), 1);
  agent_strag_view(s, &v);
  CHECK_EQ_INT(v.straggler, -1);
  feed_one(s, 4, seq++, 2, 5000);
  agent_strag_view(s, &v);
  CHECK_EQ_INT(v.straggler, 2);
  CHECK_EQ_UINT(v.named_after, AGENT_STRAG_MIN_WINDOW);
  CHECK_EQ_UINT(v.since_seq, AGENT_STRAG_MIN_WINDOW);
  CHECK(v.share == 1.0);
  CHECK(v.mean_wait_s > 0.00494 && v.mean_wait_s < 0.00496); /* 5 ms less the 50 us transfer */
  CHECK(agent_strag_caused(s)[2] > 3 * 0.00495 * 16 - 1e-9);

  TEST_CASE("hysteresis: held between the two thresholds keeps it");
  /* 64 collectives: rank 2 held the others up in 26 (40%), rank 1 in 38 (59%: it passes the
   * upper threshold, but rank 2 is above the lower one and stays). */
  for (int i = 0; i < WIN; i++) feed_one(s, 4, seq++, i % 5 < 2 ? 2 : 1, i % 5 < 2 ? 5000 : 5200);
  agent_strag_view(s, &v);
  CHECK_EQ_INT(v.straggler, 2);
  CHECK_EQ_INT(v.leader, 1);
  TEST_CASE("hysteresis: below the lower threshold it goes, the leader passes the upper");
  for (int i = 0; i < WIN; i++) feed_one(s, 4, seq++, 1, 3000);
  agent_strag_view(s, &v);
  CHECK_EQ_INT(v.straggler, 1);
  TEST_CASE("waits under the threshold: nobody");
  for (int i = 0; i < WIN; i++) feed_one(s, 4, seq++, 1, 100);
  agent_strag_view(s, &v);
  CHECK_EQ_INT(v.straggler, -1);
  CHECK_EQ_INT(v.leader, 1);
  TEST_CASE("one long pause is most of the wait but names nobody");
  for (int i = 0; i < WIN; i++) feed_one(s, 4, seq++, i == 40 ? 3 : i % 4, i == 40 ? 300000 : 900);
  agent_strag_view(s, &v);
  CHECK_EQ_INT(v.straggler, -1);
  CHECK_EQ_INT(v.leader, 3);
  CHECK(v.share > 0.8); /* 0.9 s of 1.06 s */
  TEST_CASE("a new round forgets the window, keeps the totals");
  double before = agent_strag_caused(s)[1];
  agent_strag_new_round(s);
  agent_strag_view(s, &v);
  CHECK_EQ_UINT(v.analysed, 0);
  CHECK_CMP_UINT(v.analysed_total, >, 0);
  CHECK(agent_strag_caused(s)[1] == before);
  CHECK_EQ_INT(feed_one(s, 4, 1, 3, 1000), 1); /* seq 1 again: a fresh collective */

  TEST_CASE("entries that do not count");
  CHECK_EQ_INT(agent_strag_feed(s, 4, 2, 0, 1000), 0); /* rank out of range */
  CHECK_EQ_INT(agent_strag_feed(s, -1, 2, 0, 1000), 0);
  CHECK_EQ_INT(agent_strag_feed(s, 0, 2, 1, 1000), 0);  /* broadcast: rooted */
  CHECK_EQ_INT(agent_strag_feed(s, 0, 2, 10, 1000), 0); /* send */
  CHECK_EQ_INT(agent_strag_feed(s, 0, 0, 0, 1000), 0);  /* seq 0 */
  CHECK_EQ_INT(agent_strag_feed(s, 0, 2, 0, -1), 0);
  for (int r = 0; r < 3; r++) CHECK_EQ_INT(agent_strag_feed(s, r, 2, 0, 1000), 0);
  CHECK_EQ_INT(agent_strag_feed(s, 0, 2, 0, 1000), 0); /* a duplicate */
  CHECK_EQ_INT(agent_strag_feed(s, 3, 2, 8, 1000), 0); /* another type under the same seq */
  CHECK_EQ_INT(agent_strag_feed(s, 3, 2, 0, 1000), 1);
  CHECK_EQ_INT(agent_strag_feed(s, 3, 2, 0, 1000), 0); /* after completion */

  TEST_CASE("malformed lines");
  static const char *const bad[] = {
      "x",        "1",        "1/",       "1/2",      "1/2.0",    "1/2.0.",   "1/2.0.5,",
      "1/2.0.5;", "-1/2.0.5", "1/-2.0.5", "1/2.99.5", "1/2.0.-5", "1/ 2.0.5", "99999999/2.0.5",
      "1/2.0.5 x"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    TEST_CASE(bad[i]);
    CHECK_EQ_INT(agent_strag_feed_line(s, bad[i]), -1);
  }
  TEST_CASE("good lines");
  CHECK_EQ_INT(agent_strag_feed_line(s, ""), 0);
  CHECK_EQ_INT(agent_strag_feed_line(s, "  "), 0);
  CHECK_EQ_INT(agent_strag_feed_line(s, "0/9.0.5,10.0.5 1/9.0.7  9/9.0.1"), 4);
  agent_strag_destroy(s);

  TEST_CASE("world 1: analysed, never named");
  s = agent_strag_create(1);
  for (unsigned long long q = 1; q <= 100; q++)
    CHECK_EQ_INT(agent_strag_feed(s, 0, q, 0, 5000000), 1);
  agent_strag_view(s, &v);
  CHECK_EQ_INT(v.straggler, -1);
  CHECK_EQ_UINT(v.analysed, 100);
  agent_strag_destroy(s);
  CHECK(agent_strag_create(0) == NULL);
  CHECK(agent_strag_create(AGENT_STRAG_MAX_WORLD + 1) == NULL);
  s = agent_strag_create(AGENT_STRAG_MAX_WORLD); /* the table shrinks to stay bounded */
  CHECK(s != NULL);
  agent_strag_destroy(s);
  agent_strag_destroy(NULL);
  TEST_CASE(NULL);
}

/* ---------------------------------------------------------------------------------------- */
/* the arrivals line from statistics files                                                   */

/* Appends a flight entry: dur_us < 0 = still in flight. */
static void flight_add(tdist_stats_file_t *f, uint64_t seq, int op, int group, int status,
                       long long dur_us) {
  tdist_stats_flight_t *e = &f->flight[f->flight_next++ % TDIST_STATS_FLIGHT];
  memset(e, 0, sizeof *e);
  e->seq = seq;
  e->op = op;
  e->group = group;
  e->status = status;
  e->start_ns = 1700000000LL * 1000000000LL + (long long)seq * 1000000;
  e->end_ns = dur_us < 0 ? 0 : e->start_ns + dur_us * 1000;
}

static void local_line(void) {
  TEST_CASE("arrivals line");
  char dir[400], cmd[600];
  snprintf(dir, sizeof dir, "%.300s/straggler_test.%d", test_tmpdir(), (int)getpid());
  snprintf(cmd, sizeof cmd, "mkdir -p '%s'", dir);
  CHECK_EQ_INT(system(cmd), 0);
  agent_worker_t w[3];
  memset(w, 0, sizeof w);
  agent_workers_t ws = {.w = w, .n = 3};
  snprintf(w[0].stats_file, sizeof w[0].stats_file, "%s/s0", dir);
  snprintf(w[1].stats_file, sizeof w[1].stats_file, "%s/s1", dir);
  snprintf(w[2].stats_file, sizeof w[2].stats_file, "%s/missing", dir);
  tdist_stats_file_t *a = test_stats_new(4, 100, 0), *b = test_stats_new(5, 101, 0);
  flight_add(a, 1, 0, 0, TDIST_OK, 700);        /* all_reduce */
  flight_add(a, 1, 0, 1, TDIST_OK, 9);          /* another group */
  flight_add(a, 2, 1, 0, TDIST_OK, 9);          /* broadcast */
  flight_add(a, 3, 8, 0, TDIST_OK, 1500);       /* barrier */
  flight_add(a, 4, 0, 0, TDIST_ERR_TIMEOUT, 9); /* failed */
  flight_add(a, 5, 0, 0, TDIST_ERR_IN_PROGRESS, -1);
  flight_add(b, 1, 0, 0, TDIST_OK, 20);
  test_write_file(w[0].stats_file, (const char *)a, sizeof *a);
  test_write_file(w[1].stats_file, (const char *)b, sizeof *b);
  agent_arrivals_cursor_t cur[3];
  memset(cur, 0, sizeof cur);
  char line[65536];
  CHECK_EQ_UINT(agent_arrivals_local(&ws, cur, line, sizeof line), strlen(line));
  CHECK_STR(line, "4/1.0.700,3.8.1500 5/1.0.20");
  TEST_CASE("arrivals line: nothing new");
  CHECK_EQ_UINT(agent_arrivals_local(&ws, cur, line, sizeof line), 0);
  CHECK_STR(line, "");
  TEST_CASE("arrivals line: the entry in flight completes");
  a->flight[5].status = TDIST_OK;
  a->flight[5].end_ns = a->flight[5].start_ns + 42000;
  flight_add(a, 6, 3, 0, TDIST_OK, 1); /* all_gather */
  test_write_file(w[0].stats_file, (const char *)a, sizeof *a);
  agent_arrivals_local(&ws, cur, line, sizeof line);
  CHECK_STR(line, "4/5.0.42,6.3.1");
  TEST_CASE("arrivals line: a new process starts over");
  tdist_stats_file_t *c = test_stats_new(5, 202, 0);
  flight_add(c, 1, 0, 0, TDIST_OK, 33);
  test_write_file(w[1].stats_file, (const char *)c, sizeof *c);
  agent_arrivals_local(&ws, cur, line, sizeof line);
  CHECK_STR(line, "5/1.0.33");
  TEST_CASE("arrivals line: sampled past the bound");
  for (uint64_t q = 2; q <= 201; q++) flight_add(c, q, 0, 0, TDIST_OK, (long long)q);
  test_write_file(w[1].stats_file, (const char *)c, sizeof *c);
  agent_arrivals_local(&ws, cur, line, sizeof line);
  /* 200 new: every 2nd, 2..200 (100 of them). */
  agent_strag_t *s = agent_strag_create(8);
  CHECK_EQ_INT(agent_strag_feed_line(s, line), 100);
  CHECK(!strncmp(line, "5/2.0.2,4.0.4,", 14));
  CHECK(strstr(line, ",200.0.200") && line[strlen(line) - 1] == '0');
  agent_strag_destroy(s);
  TEST_CASE("arrivals line: a short buffer leaves the rest for later");
  for (uint64_t q = 202; q <= 260; q++) flight_add(c, q, 0, 0, TDIST_OK, 7);
  test_write_file(w[1].stats_file, (const char *)c, sizeof *c);
  char small[300];
  size_t n = agent_arrivals_local(&ws, cur, small, sizeof small);
  CHECK_CMP_UINT(n, <, sizeof small);
  CHECK(!strncmp(small, "5/202.0.7,203.0.7", 17));
  int got = agent_strag_feed_line(s = agent_strag_create(8), small);
  CHECK_CMP_INT(got, >, 5);
  agent_arrivals_local(&ws, cur, line, sizeof line);
  char want[32];
  snprintf(want, sizeof want, "5/%d.0.7,", 202 + got);
  CHECK(!strncmp(line, want, strlen(want)));
  CHECK_EQ_INT(agent_strag_feed_line(s, line), 59 - got);
  agent_strag_destroy(s);
  CHECK_EQ_UINT(agent_arrivals_local(&ws, cur, small, 10), 0); /* too small for any entry */
  free(a);
  free(b);
  free(c);
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  CHECK_EQ_INT(system(cmd), 0);
  TEST_CASE(NULL);
}

/* ---------------------------------------------------------------------------------------- */
/* /metrics and /status                                                                      */

static const char kStragPy[] =
    "import json, sys\n"
    "g = json.load(open(sys.argv[1]))['stragglers']\n"
    "print('null' if g is None else json.dumps(g, sort_keys=True))\n";

static char *status_stragglers(agent_state_t *st) {
  size_t len;
  char *s = agent_status_render(st, &len), file[512];
  CHECK(s != NULL);
  snprintf(file, sizeof file, "%s/strag_status.json", test_tmpdir());
  test_write_file(file, s, len);
  free(s);
  return test_python("strag_status.py", kStragPy, file);
}

static void http_render(void) {
  TEST_CASE("http: a node that does not compute them");
  agent_state_t st;
  agent_state_init(&st);
  size_t len;
  char *m = agent_metrics_render(&st, &len);
  CHECK(strstr(m, "straggler") == NULL && strstr(m, "wait_caused") == NULL);
  free(m);
  char *g = status_stragglers(&st);
  CHECK_STR(g, "null\n");
  free(g);
  TEST_CASE("http: node 0, rank 2 named");
  st.strag_known = 1;
  st.strag_rank = st.strag_leader = 2;
  st.strag_world = 3;
  st.strag_caused_s = calloc(3, sizeof(double));
  st.strag_caused_s[0] = 0.25;
  st.strag_caused_s[2] = 12.5;
  st.strag_since_unix = 1700000000.5;
  st.strag_since_seq = 40;
  st.strag_named_after = 16;
  st.strag_analysed = 100;
  st.strag_analysed_total = 300;
  st.strag_share = 0.75;
  st.strag_held = 0.5;
  st.strag_mean_wait_s = 0.005;
  m = agent_metrics_render(&st, &len);
  test_promtool_check(m, len, "stragglers");
  prom_check(m, "tdist_straggler_rank", 2);
  prom_check(m, "tdist_rank_wait_caused_seconds_total{rank=\"0\"}", 0.25);
  prom_check(m, "tdist_rank_wait_caused_seconds_total{rank=\"1\"}", 0);
  prom_check(m, "tdist_rank_wait_caused_seconds_total{rank=\"2\"}", 12.5);
  CHECK_HAS(m, "# TYPE tdist_rank_wait_caused_seconds_total counter\n");
  CHECK_HAS(m, "# TYPE tdist_straggler_rank gauge\n");
  free(m);
  g = status_stragglers(&st);
  CHECK_STR(g,
            "{\"collectives_analysed\": 100, \"collectives_analysed_total\": 300, \"held\": 0.5, "
            "\"leader\": 2, \"mean_wait_seconds\": 0.005, \"named_after\": 16, \"share\": 0.75, "
            "\"since_seq\": 40, \"since_unix\": 1700000000.5, \"straggler\": 2, "
            "\"wait_caused_seconds\": [0.25, 0, 12.5]}\n");
  free(g);
  TEST_CASE("http: node 0, nobody named");
  st.strag_rank = st.strag_leader = -1;
  m = agent_metrics_render(&st, &len);
  prom_check(m, "tdist_straggler_rank", -1);
  free(m);
  g = status_stragglers(&st);
  CHECK_HAS(g, "\"leader\": null");
  CHECK_HAS(g, "\"named_after\": null");
  CHECK_HAS(g, "\"since_seq\": null, \"since_unix\": null, \"straggler\": null");
  free(g);
  agent_state_destroy(&st);
  TEST_CASE(NULL);
}

int main(void) {
  test_rng_init("straggler_test", 0); /* a fresh seed each run, printed */
  fixed_cases();
  local_line();
  http_render();
  for (int i = 0; i < 300; i++) random_case(i);
  TEST_LOG("random: %lld collectives analysed, %lld namings, %lld straggler dropped", g_analysed,
           g_namings, g_unnamings);
  CHECK(g_namings > 100 && g_unnamings > 10);
  TEST_LOG("straggler_test: ok");
  return 0;
}
