/* operator-agent/procstat/hang.c: the hang detector's rules on synthetic samples (every 0.1 s,
 * 100 ticks per second), one case per shape of docs/agent.md "Hang reports":
 *   a rank stopped (T) or in D for the threshold is named, not a moment before, with its flat
 *   peers waiting; a rank spinning (at full speed, or at 15% of a core on a loaded node) while a
 *   peer is flat is named; nothing is named when every rank is flat (the node waits on another),
 *   when every rank runs, or in a training-like rhythm of compute and short waits; a spinning
 *   peer of a stopped rank waits, it is not named; libtdist ranks in a collective for the
 *   threshold wait on a named rank, or are named themselves; the deadline names the ranks
 *   without I/O, only when no other rule names one; a new process in a slot starts afresh; the
 *   report order (stopped first, then the lowest rank). */
#include <string.h>

#include "check.h"
#include "operator-agent/procstat/hang.h"

#define N 4
#define STEP_NS 100000000LL

typedef struct {
  agent_hang_rank_t r[N];
  int n;
  int64_t t;
  agent_hang_cfg_t c;
  int first, named;
  int rem[N]; /* tenths of a tick not counted yet */
} sim_t;

static void sim_init(sim_t *s, int n, double stall_s, double deadline_s) {
  memset(s, 0, sizeof *s);
  s->n = n;
  s->t = 1000 * STEP_NS;
  s->c.stall_s = stall_s;
  s->c.deadline_s = deadline_s;
  s->c.hz = 100;
  for (int i = 0; i < n; i++) {
    s->r[i].global_rank = 10 + i;
    s->r[i].local_rank = i;
    s->r[i].pid = 100 + i;
    s->r[i].state = 'S';
  }
}

/* One sample: each rank's CPU advances by dticks10[i] tenths of a tick (15 = 1.5 ticks). */
static void step(sim_t *s, const int *dticks10, const char *states) {
  s->t += STEP_NS;
  for (int i = 0; i < s->n; i++) {
    agent_hang_rank_t *r = &s->r[i];
    r->t_ns = s->t;
    s->rem[i] += dticks10[i];
    r->ticks += (uint64_t)(s->rem[i] / 10);
    s->rem[i] %= 10;
    r->state = states ? states[i] : 'S';
  }
  s->named = agent_hang_judge(s->r, s->n, &s->c, s->t, &s->first);
}

static void run(sim_t *s, int steps, const int *d, const char *states) {
  for (int k = 0; k < steps; k++) step(s, d, states);
}

static void case_stopped(void) {
  TEST_CASE("stopped");
  sim_t s;
  sim_init(&s, 3, 2.0, 0);
  int busy[N] = {100, 100, 100};
  run(&s, 30, busy, "RRR");
  CHECK_EQ_INT(s.named, 0);
  int d[N] = {0, 0, 0};
  run(&s, 19, d, "STS");
  CHECK_EQ_INT(s.named, 0); /* 1.9 s */
  run(&s, 2, d, "STS");
  CHECK_EQ_INT(s.named, 1);
  CHECK_EQ_INT(s.first, 1);
  CHECK_EQ_INT(s.r[1].reason, AGENT_STALL_STOPPED);
  CHECK_STR(agent_stall_reason_name(s.r[1].reason), "stopped");
  CHECK(s.r[0].waiting && s.r[2].waiting && !s.r[1].waiting);
  CHECK_CMP_INT(s.r[1].since_ns, <=, s.t - 2000000000LL);
  /* continued: running again, no longer named */
  run(&s, 1, busy, "RRR");
  CHECK_EQ_INT(s.named, 0);
  CHECK_EQ_INT(s.first, -1);
}

static void case_uninterruptible(void) {
  TEST_CASE("uninterruptible");
  sim_t s;
  sim_init(&s, 2, 1.0, 0);
  int d[N] = {0, 0};
  run(&s, 11, d, "SD");
  CHECK_EQ_INT(s.named, 1);
  CHECK_EQ_INT(s.r[1].reason, AGENT_STALL_UNINTERRUPTIBLE);
}

static void case_spinning(int speed10, const char *name) {
  TEST_CASE(name);
  sim_t s;
  sim_init(&s, 4, 2.0, 0);
  int d[N] = {0, 0, speed10, 0};
  run(&s, 19, d, "SSRS");
  CHECK_EQ_INT(s.named, 0);
  run(&s, 3, d, "SSRS");
  CHECK_EQ_INT(s.named, 1);
  CHECK_EQ_INT(s.first, 2);
  CHECK_EQ_INT(s.r[2].reason, AGENT_STALL_SPINNING);
  CHECK(s.r[0].waiting && s.r[1].waiting && s.r[3].waiting);
  CHECK(s.r[2].busy_s >= 2.0 && s.r[0].idle_s >= 2.0);
}

/* Two ranks train (both busy), then rank 0 blocks waiting on rank 1, which spins: rank 1 is
 * named within a little more than the threshold, rank 0 waits on it. Rank 0's average since its
 * busy point stays above the busy share long after it blocked: it was named "spinning" itself (as
 * the first rank), hiding rank 1 for over 10 s in the PyTorch hang test. */
static void case_spinning_after_training(void) {
  TEST_CASE("a rank that trained, then blocks, is not the spinning one");
  sim_t s;
  sim_init(&s, 2, 2.0, 0);
  int train[N] = {100, 100};
  run(&s, 100, train, "RR");
  CHECK_EQ_INT(s.named, 0);
  int d[N] = {0, 100};
  run(&s, 25, d, "SR");
  CHECK_EQ_INT(s.named, 1);
  CHECK_EQ_INT(s.first, 1);
  CHECK_EQ_INT(s.r[1].reason, AGENT_STALL_SPINNING);
  CHECK_EQ_INT(s.r[0].reason, AGENT_STALL_NONE);
  CHECK(s.r[0].waiting);
}

/* Rank 0 waits (flat), then is stopped; rank 1 computes, then blocks on it. Rank 0 is flat for
 * the threshold before it has been stopped that long: rank 1 was named "spinning" in between
 * (seen in the PyTorch hang test, 0.65 s before the stopped verdict). */
static void case_stopped_after_waiting(void) {
  TEST_CASE("a rank that waited, then is stopped: its busy peer is not named spinning");
  sim_t s;
  sim_init(&s, 2, 2.0, 0);
  int d0[N] = {0, 100};
  run(&s, 10, d0, "SR");
  CHECK_EQ_INT(s.named, 0);
  for (int k = 0; k < 30; k++) {
    step(&s, d0, "TR");
    CHECK(s.r[1].reason != AGENT_STALL_SPINNING);
  }
  CHECK_EQ_INT(s.first, 0);
  CHECK_EQ_INT(s.r[0].reason, AGENT_STALL_STOPPED);
}

static void case_not_named(void) {
  TEST_CASE("all flat");
  sim_t s;
  sim_init(&s, 3, 1.0, 0);
  int flat[N] = {0, 0, 0};
  run(&s, 100, flat, NULL);
  CHECK_EQ_INT(s.named, 0);
  TEST_CASE("all running");
  sim_init(&s, 3, 1.0, 0);
  int busy[N] = {100, 80, 100};
  run(&s, 100, busy, "RRR");
  CHECK_EQ_INT(s.named, 0);
  TEST_CASE("training rhythm: 0.8 s compute, then waits of up to 0.7 s");
  sim_init(&s, 3, 1.0, 0);
  for (int it = 0; it < 20; it++) {
    for (int k = 0; k < 15; k++) {
      int d[N];
      for (int i = 0; i < 3; i++) d[i] = k < 8 + 3 * i / 2 ? 100 : 0;
      step(&s, d, NULL);
      CHECK_EQ_INT(s.named, 0);
    }
  }
  TEST_CASE("background threads of a waiting rank (1% of a core)");
  sim_init(&s, 2, 1.0, 0);
  int d[N] = {100, 1};
  run(&s, 30, d, "RS");
  CHECK_EQ_INT(s.named, 1);
  CHECK_EQ_INT(s.first, 0);
  CHECK(s.r[1].waiting);
}

static void case_stopped_with_spinning_peer(void) {
  TEST_CASE("a peer spinning while it waits on a stopped rank (NCCL polls)");
  sim_t s;
  sim_init(&s, 3, 1.0, 0);
  int d[N] = {100, 0, 0};
  run(&s, 15, d, "RTS");
  CHECK_EQ_INT(s.named, 1);
  CHECK_EQ_INT(s.first, 1);
  CHECK_EQ_INT(s.r[0].reason, AGENT_STALL_NONE);
  CHECK(s.r[0].waiting && s.r[2].waiting);
}

static void case_collective(void) {
  TEST_CASE("libtdist ranks wait on a local spinning rank");
  sim_t s;
  sim_init(&s, 3, 1.0, 0);
  for (int i = 0; i < 3; i++) s.r[i].libtdist = 1;
  s.r[0].cur_seq = s.r[2].cur_seq = 8;
  s.r[1].last_seq = 7;
  int d[N] = {0, 100, 0};
  for (int k = 0; k < 15; k++) {
    s.r[0].collective_s = s.r[2].collective_s = 0.1 * (k + 1);
    step(&s, d, "SRS");
  }
  CHECK_EQ_INT(s.named, 1);
  CHECK_EQ_INT(s.r[1].reason, AGENT_STALL_SPINNING);
  CHECK(s.r[0].waiting && s.r[2].waiting);
  TEST_CASE("a libtdist rank behind the collective its peers wait in, CPU flat (sleeping)");
  sim_init(&s, 3, 1.0, 0);
  for (int i = 0; i < 3; i++) s.r[i].libtdist = 1;
  s.r[0].cur_seq = s.r[1].cur_seq = 20;
  s.r[0].last_seq = s.r[1].last_seq = 19;
  s.r[2].last_seq = 19; /* not in a collective: it has not reached #20 */
  int z[N] = {0, 0, 0};
  for (int k = 0; k < 15; k++) {
    s.r[0].collective_s = s.r[1].collective_s = 0.1 * (k + 1);
    step(&s, z, NULL);
    if (k < 9) CHECK_EQ_INT(s.named, 0);
  }
  CHECK_EQ_INT(s.named, 1);
  CHECK_EQ_INT(s.first, 2);
  CHECK_EQ_INT(s.r[2].reason, AGENT_STALL_BEHIND);
  CHECK_STR(agent_stall_reason_name(s.r[2].reason), "behind");
  CHECK(s.r[0].waiting && s.r[1].waiting);
  TEST_CASE("a libtdist rank that entered the stuck collective late is not behind");
  s.r[2].cur_seq = 20;
  s.r[2].collective_s = 0.2;
  step(&s, z, NULL);
  CHECK_EQ_INT(s.r[2].reason, AGENT_STALL_NONE);
  CHECK_EQ_INT(s.r[0].reason, AGENT_STALL_COLLECTIVE);
  TEST_CASE("libtdist ranks in a collective, nobody here holding them");
  sim_init(&s, 2, 1.0, 0);
  for (int i = 0; i < 2; i++) {
    s.r[i].libtdist = 1;
    s.r[i].cur_seq = 3;
  }
  int f[N] = {0, 0};
  for (int k = 0; k < 12; k++) {
    s.r[0].collective_s = s.r[1].collective_s = 0.1 * (k + 1);
    step(&s, f, NULL);
  }
  CHECK_EQ_INT(s.named, 2);
  CHECK_EQ_INT(s.first, 0);
  CHECK_EQ_INT(s.r[0].reason, AGENT_STALL_COLLECTIVE);
  CHECK_EQ_INT(s.r[1].reason, AGENT_STALL_COLLECTIVE);
}

static void case_deadline(void) {
  TEST_CASE("deadline: no I/O");
  sim_t s;
  sim_init(&s, 3, 100.0, 3.0);
  int d[N] = {0, 0, 0};
  for (int k = 0; k < 29; k++) {
    s.r[0].io += 100; /* rank 0 keeps writing */
    step(&s, d, NULL);
  }
  CHECK_EQ_INT(s.named, 0);
  for (int k = 0; k < 3; k++) {
    s.r[0].io += 100;
    step(&s, d, NULL);
  }
  CHECK_EQ_INT(s.named, 2);
  CHECK_EQ_INT(s.r[0].reason, AGENT_STALL_NONE);
  CHECK_EQ_INT(s.r[1].reason, AGENT_STALL_DEADLINE);
  CHECK_EQ_INT(s.first, 1);
  TEST_CASE("deadline: a completed collective is progress");
  sim_init(&s, 1, 100.0, 1.0);
  s.r[0].libtdist = 1;
  for (int k = 0; k < 30; k++) {
    s.r[0].last_seq++;
    step(&s, d, NULL);
  }
  CHECK_EQ_INT(s.named, 0);
  TEST_CASE("deadline: a stopped rank is named as stopped, the others wait");
  sim_init(&s, 2, 1.0, 1.0);
  run(&s, 15, d, "TS");
  CHECK_EQ_INT(s.named, 1);
  CHECK_EQ_INT(s.r[0].reason, AGENT_STALL_STOPPED);
  CHECK(s.r[1].waiting);
}

static void case_restart_and_order(void) {
  TEST_CASE("a new process in the slot starts afresh");
  sim_t s;
  sim_init(&s, 2, 1.0, 0);
  int d[N] = {0, 0};
  run(&s, 15, d, "ST");
  CHECK_EQ_INT(s.named, 1);
  s.r[1].pid = 555;
  run(&s, 1, d, "ST");
  CHECK_EQ_INT(s.named, 0);
  s.r[1].pid = 0; /* exited: never named, never waiting */
  run(&s, 30, d, "ST");
  CHECK_EQ_INT(s.named, 0);
  CHECK(!s.r[1].waiting);
  TEST_CASE("report order: stopped before uninterruptible, then the lowest rank");
  sim_init(&s, 4, 1.0, 0);
  run(&s, 15, d, "DTST");
  CHECK_EQ_INT(s.named, 3);
  CHECK_EQ_INT(s.first, 1);
  CHECK_STR(agent_stall_reason_name((agent_stall_reason_t)99), "none");
}

int main(void) {
  case_stopped();
  case_uninterruptible();
  case_spinning(100, "spinning at full speed");
  case_spinning(15, "spinning at 15% of a core (a loaded node)");
  case_spinning_after_training();
  case_stopped_after_waiting();
  case_not_named();
  case_stopped_with_spinning_peer();
  case_collective();
  case_deadline();
  case_restart_and_order();
  printf("hang_test: all passed\n");
  return 0;
}
