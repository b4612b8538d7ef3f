/* operator-agent/supervisor/progress.c: the job-wide summary node 0 builds from every agent's
 * progress line, the local line built from the workers' statistics files, and the flight-recorder
 * dump.
 *   summarize: the rank(s) holding the job up are named, and only they, in every shape: one idle
 *   rank, several, a rank behind in an earlier collective, ranks spread over many node lines in
 *   random order (random worlds up to 256 ranks), garbage and missing lines, all idle, all stuck
 *   with nobody behind, a rank whose line is younger than the others', skew below the stall
 *   threshold, the threshold's edge, and every output
 *   buffer size (a prefix of the full sentence, always terminated; ASan checks the bounds).
 *   local: one token per readable file, with the age of the collective in flight.
 *   dump: valid JSON (python3) with every rank, oldest entry first after the ring wrapped. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <tdist/stats.h>

#include "check.h"
#include "clock.h"
#include "rng.h"
#include "stats_testlib.h"
#include "http_testlib.h"
#include "operator-agent/supervisor/progress.h"

#define MAXW 256
#define OUTCAP 8192

static int op_index(const char *name) {
  for (int i = 0; i < TDIST_STATS_OPS; i++)
    if (!strcmp(tdist_stats_op_name(i), name)) return i;
  fprintf(stderr, "no collective type named %s\n", name);
  exit(1);
}

static int rnd_in(int lo, int hi) { return lo + (int)rnd_below((uint64_t)(hi - lo + 1)); }

/* One rank's position as an agent publishes it. */
typedef struct {
  int rank;
  unsigned long long last, cur;
  int op;
  long long age_ms;
} pos_t;

static void pos_put(char *line, size_t cap, const pos_t *p) {
  size_t n = strlen(line);
  snprintf(line + n, cap - n, "%s%d:%llu:%llu:%d:%lld", n ? " " : "", p->rank, p->last, p->cur,
           p->op, p->age_ms);
}

/* Parses "rank N" / "ranks A,B,C" at *s into mask; returns how many, or -1. */
static int parse_ranks(const char **s, char *mask) {
  const char *p = *s;
  if (!strncmp(p, "ranks ", 6))
    p += 6;
  else if (!strncmp(p, "rank ", 5))
    p += 5;
  else
    return -1;
  int n = 0;
  for (;;) {
    char *end;
    long r = strtol(p, &end, 10);
    if (end == p || r < 0 || r >= MAXW || mask[r]) return -1;
    mask[r] = 1;
    n++;
    p = end;
    if (*p != ',') break;
    p++;
  }
  *s = p;
  return n;
}

/* Splits a stall sentence into its stuck and holder sets. Returns 1 when it names stuck ranks. */
static int parse_summary(const char *out, char *stuck, char *holders, int *nstuck, int *nhold) {
  memset(stuck, 0, MAXW);
  memset(holders, 0, MAXW);
  *nstuck = *nhold = 0;
  const char *p = out;
  if ((*nstuck = parse_ranks(&p, stuck)) < 0 || strncmp(p, " stuck in ", 10)) return 0;
  const char *h = strstr(p, "; rank");
  if (h && strstr(h, " hold")) {
    h += 2;
    *nhold = parse_ranks(&h, holders);
    CHECK(*nhold > 0);
    CHECK(!strncmp(h, " holds them up (", 16) || !strncmp(h, " hold them up (", 15));
  }
  return 1;
}

static void summarize(const char *const *lines, size_t n, double stall_s, char *out,
                      int want_ranks) {
  int got = agent_progress_summarize(lines, n, stall_s, out, OUTCAP);
  CHECK_EQ_INT(got, want_ranks);
  CHECK(strlen(out) < OUTCAP);
}

/* ---------------------------------------------------------------------------------------- */
/* fixed shapes                                                                              */

static void fixed_shapes(void) {
  char out[OUTCAP], stuck[MAXW], hold[MAXW];
  int ns, nh;
  int ar = op_index("all_reduce"), bc = op_index("broadcast");

  /* One idle rank on one node. */
  char l1[256];
  snprintf(l1, sizeof l1, "0:19:20:%d:6000 1:19:20:%d:6100 2:19:0:-1:0 3:19:20:%d:5900", ar, ar,
           ar);
  const char *one[] = {l1};
  summarize(one, 1, 5, out, 4);
  TEST_LOG("one idle rank: %s", out);
  CHECK(parse_summary(out, stuck, hold, &ns, &nh));
  CHECK(ns == 3 && stuck[0] && stuck[1] && stuck[3]);
  CHECK(nh == 1 && hold[2]);
  CHECK(strstr(out, " stuck in all_reduce #20 for 6.1 s") != NULL);
  CHECK(strstr(out, "2: not in a collective, last completed #19") != NULL);

  /* Several idle ranks, over two nodes, lines in reverse order, a node with no line yet. */
  char a[256], b[256];
  snprintf(a, sizeof a, "4:99:100:%d:7000 5:99:0:-1:0 6:99:100:%d:7000 7:98:0:-1:0", ar, ar);
  snprintf(b, sizeof b, "0:99:100:%d:7000 1:99:100:%d:7000 2:99:0:-1:0 3:99:100:%d:7000", ar, ar,
           ar);
  const char *two[] = {a, NULL, b};
  summarize(two, 3, 5, out, 8);
  TEST_LOG("several idle ranks: %s", out);
  CHECK(parse_summary(out, stuck, hold, &ns, &nh));
  CHECK(ns == 5 && stuck[0] && stuck[1] && stuck[3] && stuck[4] && stuck[6]);
  CHECK(nh == 3 && hold[2] && hold[5] && hold[7]);
  CHECK(strstr(out, "7: not in a collective, last completed #98") != NULL);
  CHECK(strstr(out, "ranks 0,1,3,4,6 stuck") == out); /* sorted by rank */

  /* A rank behind, still in an earlier collective (a broadcast #19) for a long time. */
  snprintf(l1, sizeof l1, "0:19:20:%d:9000 1:19:20:%d:9000 2:19:20:%d:9000 3:18:19:%d:9500", ar, ar,
           ar, bc);
  summarize(one, 1, 5, out, 4);
  TEST_LOG("a rank in an earlier collective: %s", out);
  CHECK(parse_summary(out, stuck, hold, &ns, &nh));
  CHECK(ns == 3 && !stuck[3] && nh == 1 && hold[3]);
  CHECK(strstr(out, "3: in broadcast #19") != NULL);

  /* A rank on another node whose line is a second older looks younger than the threshold: once
   * the collective is stalled it is stuck in it all the same, not left out of the sentence. */
  snprintf(a, sizeof a, "0:19:20:%d:2100 1:19:20:%d:2100", ar, ar);
  snprintf(b, sizeof b, "2:19:20:%d:1100 3:19:0:-1:0", ar);
  summarize(two, 3, 2, out, 4);
  TEST_LOG("a younger line from node 1: %s", out);
  CHECK(parse_summary(out, stuck, hold, &ns, &nh));
  CHECK(ns == 3 && stuck[0] && stuck[1] && stuck[2] && nh == 1 && hold[3]);

  /* Everybody stuck at the same collective, nobody behind (a network hang): all named stuck. */
  snprintf(l1, sizeof l1, "0:41:42:%d:8000 1:41:42:%d:8000 2:41:42:%d:8000", ar, ar, ar);
  summarize(one, 1, 5, out, 3);
  TEST_LOG("all stuck: %s", out);
  CHECK(parse_summary(out, stuck, hold, &ns, &nh));
  CHECK(ns == 3 && nh == 0);

  /* All idle at the same point; and before any collective. */
  snprintf(l1, sizeof l1, "0:57:0:-1:0 1:57:0:-1:0 2:57:0:-1:0 3:57:0:-1:0");
  summarize(one, 1, 5, out, 4);
  TEST_LOG("all idle: %s", out);
  CHECK(!strcmp(out, "all 4 ranks at #57"));
  snprintf(l1, sizeof l1, "0:0:0:-1:0 1:0:0:-1:0");
  summarize(one, 1, 5, out, 2);
  CHECK(strstr(out, "all 2 ranks at #0") == out && strstr(out, "no collective yet"));

  /* Skew without a stall: some ranks ahead in flight for less than the threshold, others a
   * collective behind (idle or in flight). Nobody is named. */
  snprintf(l1, sizeof l1, "0:10:11:%d:4999 1:9:10:%d:3000 2:10:0:-1:0 3:9:0:-1:0", ar, ar);
  summarize(one, 1, 5, out, 4);
  TEST_LOG("skew: %s", out);
  CHECK(!strstr(out, "stuck") && !strstr(out, "hold"));
  CHECK(strstr(out, "#11") != NULL);
  /* All in the same collective, young: not stuck. */
  snprintf(l1, sizeof l1, "0:10:11:%d:100 1:10:11:%d:200", ar, ar);
  summarize(one, 1, 5, out, 2);
  CHECK(!strstr(out, "stuck"));

  /* The threshold's edge: exactly stall_s counts as stuck, 1 ms less does not. */
  snprintf(l1, sizeof l1, "0:4:5:%d:2000 1:4:0:-1:0", ar);
  summarize(one, 1, 2.0, out, 2);
  CHECK(parse_summary(out, stuck, hold, &ns, &nh) && ns == 1 && stuck[0] && nh == 1 && hold[1]);
  snprintf(l1, sizeof l1, "0:4:5:%d:1999 1:4:0:-1:0", ar);
  summarize(one, 1, 2.0, out, 2);
  CHECK(!strstr(out, "stuck"));

  /* Garbage lines are ignored; the good lines still count. */
  char good[128];
  snprintf(good, sizeof good, "0:7:8:%d:9000 1:7:0:-1:0", ar);
  const char *junk[] = {
      "",   "garbage",  "1:2:3", "-1:0:0:0:0", good, "99999999:1:2:3:4", "x:1:2:3:4 0:1:2",
      NULL, "\xff\xfe", "   "};
  summarize(junk, sizeof junk / sizeof junk[0], 5, out, 2);
  TEST_LOG("garbage around one good line: %s", out);
  CHECK(parse_summary(out, stuck, hold, &ns, &nh) && ns == 1 && stuck[0] && nh == 1 && hold[1]);
  const char *only_junk[] = {"", "nothing here", NULL};
  CHECK_EQ_INT(agent_progress_summarize(only_junk, 3, 5, out, OUTCAP), 0);
  CHECK_EQ_INT(agent_progress_summarize(NULL, 0, 5, out, OUTCAP), 0);
}

/* ---------------------------------------------------------------------------------------- */
/* random shapes                                                                             */

static void random_shapes(int iters) {
  static pos_t pos[MAXW];
  static char lines_buf[8][MAXW * 48];
  char out[OUTCAP], stuck[MAXW], hold[MAXW];
  int ns, nh;
  for (int it = 0; it < iters; it++) {
    int w = rnd_in(2, it % 10 == 0 ? MAXW : 16), nodes = rnd_in(1, 8);
    unsigned long long front = (unsigned long long)rnd_in(2, 1000000);
    double stall_s = rnd_in(1, 30);
    long long stall_ms = (long long)(stall_s * 1000);
    int op = rnd_in(0, TDIST_STATS_OPS - 1);
    int nholders = rnd_in(1, w - 1 < 4 ? w - 1 : 4);
    char want_hold[MAXW] = {0};
    for (int k = 0; k < nholders;) {
      int r = rnd_in(0, w - 1);
      if (!want_hold[r]) {
        want_hold[r] = 1;
        k++;
      }
    }
    int first_waiter = 0;
    while (want_hold[first_waiter]) first_waiter++;
    for (int r = 0; r < w; r++) {
      pos_t *p = &pos[r];
      p->rank = r;
      if (!want_hold[r]) { /* waiting at the frontier: the first long enough, others any time */
        p->cur = front;
        p->last = front - 1;
        p->op = op;
        p->age_ms = r == first_waiter || rnd() % 2 ? stall_ms + rnd_in(0, 100000)
                                                   : rnd_in(0, (int)stall_ms);
      } else if (rnd() % 2) { /* idle, some collectives behind */
        p->cur = 0;
        p->last = front - (unsigned long long)rnd_in(1, front > 5 ? 5 : (int)front);
        p->op = -1;
        p->age_ms = 0;
      } else { /* in an earlier collective, for any time */
        p->cur = front - (unsigned long long)rnd_in(1, front > 5 ? 5 : (int)front - 1);
        p->last = p->cur - 1;
        p->op = rnd_in(0, TDIST_STATS_OPS - 1);
        p->age_ms = rnd_in(0, 200000);
      }
    }
    /* Shuffle, then deal the ranks to the node lines. */
    for (int i = w - 1; i > 0; i--) {
      int j = rnd_in(0, i);
      pos_t t = pos[i];
      pos[i] = pos[j];
      pos[j] = t;
    }
    const char *lines[16];
    size_t nl = 0;
    for (int n = 0; n < nodes; n++) lines_buf[n][0] = 0;
    for (int i = 0; i < w; i++) pos_put(lines_buf[i % nodes], sizeof lines_buf[0], &pos[i]);
    for (int n = 0; n < nodes; n++) {
      lines[nl++] = lines_buf[n];
      if (rnd() % 4 == 0) lines[nl++] = rnd() % 2 ? NULL : "not a progress line";
    }
    summarize(lines, nl, stall_s, out, w);
    if (!parse_summary(out, stuck, hold, &ns, &nh) || ns != w - nholders || nh != nholders ||
        memcmp(hold, want_hold, MAXW) != 0) {
      fprintf(stderr, "random shape %d (world %d, %d nodes, stall %.0f s, holders", it, w, nodes,
              stall_s);
      for (int r = 0; r < w; r++)
        if (want_hold[r]) fprintf(stderr, " %d", r);
      fprintf(stderr, "):\n  summary: %s\n", out);
      for (size_t l = 0; l < nl; l++)
        fprintf(stderr, "  line %zu: %s\n", l, lines[l] ? lines[l] : "(null)");
      exit(1);
    }
    char want[64];
    snprintf(want, sizeof want, " stuck in %s #%llu for ", tdist_stats_op_name(op), front);
    CHECK(strstr(out, want) != NULL);
    for (int i = 0; i < w; i++) { /* each holder described as it is */
      const pos_t *p = &pos[i];
      if (!want_hold[p->rank]) continue;
      if (p->cur)
        snprintf(want, sizeof want, "%d: in %s #%llu", p->rank, tdist_stats_op_name(p->op), p->cur);
      else
        snprintf(want, sizeof want, "%d: not in a collective, last completed #%llu", p->rank,
                 p->last);
      CHECK(strstr(out, want) != NULL);
    }
    /* Every output size: a terminated prefix of the full sentence, never an overrun. */
    if (it % 25 == 0) {
      size_t full = strlen(out);
      for (size_t cap = 1; cap <= full + 2; cap++) {
        char *small = malloc(cap);
        CHECK(small != NULL);
        agent_progress_summarize(lines, nl, stall_s, small, cap);
        CHECK(strlen(small) < cap);
        CHECK(!strncmp(small, out, strlen(small)));
        CHECK(strlen(small) == (full < cap ? full : cap - 1));
        free(small);
      }
    }
  }
  TEST_LOG("random shapes: %d ok", iters);
}

/* ---------------------------------------------------------------------------------------- */
/* local line and flight dump from crafted statistics files                                  */

static void write_stats(const char *path, const tdist_stats_file_t *f) {
  test_write_file(path, (const char *)f, sizeof *f);
}

static const char *k_dump_check =
    "import json, sys\n"
    "d = json.load(open(sys.argv[1]))\n"
    "assert d['node_rank'] == 1 and d['round'] == 3, d\n"
    "assert d['reason'] == 'why \"quoted\"\\n', d['reason']\n"
    "rs = {r['rank']: r for r in d['ranks']}\n"
    "assert sorted(rs) == [4, 5], sorted(rs)\n"
    "a, b = rs[4], rs[5]\n"
    "assert a['local_rank'] == 0 and a['pid'] == 1004 and a['last_seq'] == 299, a\n"
    "assert a['in_flight']['op'] == 'broadcast' and a['in_flight']['seq'] == 300, a['in_flight']\n"
    "assert a['in_flight']['peer'] == 2 and 2.0 < a['in_flight']['seconds'] < 60, a['in_flight']\n"
    "seqs = [e['seq'] for e in a['flight']]\n"
    "assert seqs == list(range(300 - 256 + 1, 301)), seqs[:3] + seqs[-3:]\n"
    "assert a['flight'][-1]['status'] == 'in_flight' and a['flight'][-1]['duration_s'] is None\n"
    "assert all(e['status'] == 'TDIST_OK' for e in a['flight'][:-1]), a['flight'][0]\n"
    "assert all(e['op'] == 'all_reduce' and e['bytes'] == 4 * e['seq'] for e in a['flight'][:-1])\n"
    "assert b['in_flight'] is None and b['last_seq'] == 2 and len(b['flight']) == 2, b\n"
    "assert b['flight'][1]['status'] == 'TDIST_ERR_REMOTE', b['flight'][1]\n"
    "print('dump ok')\n";

static void local_and_dump(void) {
  const char *tmp = test_tmpdir();
  char dir[400];
  snprintf(dir, sizeof dir, "%.300s/progress_test.%d", tmp, (int)getpid());
  char cmd[600];
  snprintf(cmd, sizeof cmd, "mkdir -p '%s'", dir);
  CHECK(system(cmd) == 0);
  int ar = op_index("all_reduce"), bc = op_index("broadcast");
  int64_t now = realtime_ns();
  agent_worker_t w[4];
  memset(w, 0, sizeof w);
  for (int i = 0; i < 4; i++) {
    w[i].local_rank = i;
    w[i].global_rank = 4 + i;
  }
  /* local 0 (rank 4): broadcast #300 from root 2 in flight for 2.5 s; the ring wrapped. */
  tdist_stats_file_t *f = test_stats_new(4, 1004, 299);
  f->cur_seq = 300;
  f->cur_op = bc;
  f->cur_peer = 2;
  f->cur_start_ns = now - 2500000000LL;
  f->flight_next = 300;
  for (uint64_t i = 0; i < 300; i++) {
    tdist_stats_flight_t *e = &f->flight[i % TDIST_STATS_FLIGHT];
    *e = (tdist_stats_flight_t){.seq = i + 1,
                                .op = ar,
                                .status = TDIST_OK,
                                .start_ns = now - 9000000000LL + (int64_t)i * 1000000,
                                .end_ns = now - 9000000000LL + (int64_t)i * 1000000 + 5000,
                                .bytes = 4 * (i + 1),
                                .peer = -1,
                                .stamp = 2};
  }
  tdist_stats_flight_t *cur = &f->flight[299 % TDIST_STATS_FLIGHT];
  cur->op = bc;
  cur->peer = 2;
  cur->status = TDIST_ERR_IN_PROGRESS;
  cur->end_ns = 0;
  cur->start_ns = f->cur_start_ns;
  snprintf(w[0].stats_file, sizeof w[0].stats_file, "%s/stats0", dir);
  write_stats(w[0].stats_file, f);
  /* local 1 (rank 5): idle after #2, which failed. */
  tdist_stats_file_t *g = test_stats_new(5, 1005, 2);
  g->flight_next = 2;
  g->flight[0] = (tdist_stats_flight_t){.seq = 1,
                                        .op = ar,
                                        .status = TDIST_OK,
                                        .start_ns = now - 10,
                                        .end_ns = now - 5,
                                        .peer = -1,
                                        .stamp = 2};
  g->flight[1] = (tdist_stats_flight_t){.seq = 2,
                                        .op = ar,
                                        .status = TDIST_ERR_REMOTE,
                                        .start_ns = now - 4,
                                        .end_ns = now - 1,
                                        .peer = -1,
                                        .stamp = 2};
  snprintf(w[1].stats_file, sizeof w[1].stats_file, "%s/stats1", dir);
  write_stats(w[1].stats_file, g);
  /* local 2: no statistics file configured; local 3: the file is not there (yet). */
  snprintf(w[3].stats_file, sizeof w[3].stats_file, "%s/missing", dir);
  agent_workers_t ws = {w, 4, -1, {0, 0, 0}};

  char line[512];
  agent_progress_local(&ws, now, line, sizeof line);
  TEST_LOG("local line: %s", line);
  int r1, op1, r2, op2, used = 0;
  unsigned long long l1, c1, l2, c2;
  long long a1, a2;
  CHECK(sscanf(line, "%d:%llu:%llu:%d:%lld %d:%llu:%llu:%d:%lld%n", &r1, &l1, &c1, &op1, &a1, &r2,
               &l2, &c2, &op2, &a2, &used) == 10);
  CHECK_EQ_INT(used, strlen(line));
  CHECK(r1 == 4 && l1 == 299 && c1 == 300 && op1 == bc && a1 >= 2490 && a1 <= 2510);
  CHECK(r2 == 5 && l2 == 2 && c2 == 0 && op2 == -1 && a2 == 0);
  /* The line round-trips through the summary (rank 5 holds up rank 4 in broadcast #300). */
  const char *lines[] = {line};
  char out[OUTCAP], stuck[MAXW], hold[MAXW];
  int ns, nh;
  summarize(lines, 1, 2, out, 2);
  CHECK(parse_summary(out, stuck, hold, &ns, &nh) && ns == 1 && stuck[4] && nh == 1 && hold[5]);
  /* A buffer too small for even one token stays empty and terminated. */
  char tiny[8] = "xxxxxxx";
  agent_progress_local(&ws, now, tiny, sizeof tiny);
  CHECK_EQ_INT(tiny[0], 0);

  /* The dump: valid JSON, both readable ranks, oldest first after the wrap. */
  char path[1024], err[300];
  CHECK_EQ_INT(
      agent_flight_dump(&ws, 1, 3, dir, "why \"quoted\"\n", path, sizeof path, err, sizeof err), 0);
  CHECK(!strncmp(path, dir, strlen(dir)));
  char *res = test_python("progress_dump_check.py", k_dump_check, path);
  CHECK(strstr(res, "dump ok") != NULL);
  free(res);
  TEST_LOG("dump: ok (%s)", path);
  /* An unwritable directory: -1 and a message naming the path. */
  char bad[600];
  snprintf(bad, sizeof bad, "%s/no/such/dir", dir);
  CHECK_EQ_INT(agent_flight_dump(&ws, 1, 3, bad, "x", path, sizeof path, err, sizeof err), -1);
  CHECK(strstr(err, bad) != NULL);
  TEST_LOG("dump into a missing directory: %s", err);
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  CHECK(system(cmd) == 0);
  free(f);
  free(g);
}

int main(void) {
  test_rng_init("progress_test", 0); /* a fresh seed each run, printed */
  fixed_shapes();
  random_shapes(2000);
  local_and_dump();
  return 0;
}
