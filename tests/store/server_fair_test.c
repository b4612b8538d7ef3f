/* The store server shares its loop fairly and does work in proportion to what arrives (issue 14),
 * against a server in a child process whose CPU time is read from /proc/<pid>/stat:
 *   - partial multi-key requests: 20 connections each buffer a CHECK of 131072 keys short of its
 *     last few hundred items, then send those one 8-byte item per segment. The server's CPU time
 *     for that trickle must stay within a small factor of the same trickle on requests that have
 *     buffered only a few items: a parser that walks the buffered items again on every segment
 *     (the old one) spends about half a millisecond per segment there, over 50 times more. The
 *     requests then complete and are answered (NOT_READY: the keys do not exist);
 *   - a client that pipelines ADDs without pause (and reads its replies) in another process: an
 *     honest client's requests are answered after a turn's share of the pipeliner's, counted in
 *     the pipeliner's ADDs that ran in between (not in time: a busy machine changes times, not
 *     this count); the old server read up to 4 MB per recv and ran every request in it before
 *     looking at anyone else (106 to 123 ms a PING here);
 *   - a client (another process) that registers 6 WAITs of 131072 missing keys and hangs up, over
 *     and over: registering and tearing down go a share per loop turn, so the server's CPU time
 *     between an honest PING and its echo (per-thread schedstat, so load changes the wall time,
 *     not this) stays small at p99; a server doing a whole WAIT in one turn runs it first.
 * Bounded in time: every read has a deadline, the pipeliner is killed at the end. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "clock.h"
#include "proc.h"
#include "server_proc.h"
#include "server_wire.h"
#include "tdist/tdist.h"

#define KEYS 131072 /* the server's default multi-key limit */
#define CONNS 20
#define TRICKLE 150 /* items each connection sends one segment at a time */

/* Waits until the server's CPU time stops growing (it has read what was sent), at most 60 s. */
static void wait_quiet(pid_t pid) {
  double last = proc_cpu_ms(pid);
  int64_t deadline = now_ms() + 60000;
  for (int still = 0; still < 3 && now_ms() < deadline;) {
    sleep_ms(100);
    double now = proc_cpu_ms(pid);
    still = now - last < 1.0 ? still + 1 : 0;
    last = now;
  }
}

/* One PING round trip, in ms. */
static double ping_ms(conn_t *c, uint32_t nonce) {
  int64_t t0 = now_ns();
  expect_ping(c, nonce);
  return (double)(now_ns() - t0) / 1e6;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* CPU time the server spends on TRICKLE one-item segments per connection, each connection's
 * CHECK having `buffered` items before them; the requests are then completed and answered. */
static double trickle_cpu_ms(const server_proc_t *sp, size_t buffered, double *honest_max_ms) {
  static conn_t cs[CONNS];
  enc_t head = {0};
  for (int i = 0; i < CONNS; i++) {
    char name[32];
    snprintf(name, sizeof name, "trickle%d", i);
    cs[i] = conn_open(sp->port, 1, name);
  }
  m_op(&head, &cs[0], OP_CHECK);
  enc_u64(&head, KEYS);
  for (size_t k = 0; k < buffered; k++) enc_u64(&head, 0); /* the empty key */
  for (int i = 0; i < CONNS; i++) send_raw(&cs[i], head.p, head.len);
  free(head.p);
  wait_quiet(sp->pid);

  conn_t honest = conn_open(sp->port, 1, "honest");
  const uint8_t item[8] = {0};
  *honest_max_ms = 0;
  double before = proc_cpu_ms(sp->pid);
  for (int r = 0; r < TRICKLE; r++) {
    for (int i = 0; i < CONNS; i++) send_raw(&cs[i], item, sizeof item);
    sleep_ms(2); /* so each item is a segment of its own when the server reads it */
    if (r % 10 == 0) {
      double ms = ping_ms(&honest, (uint32_t)r);
      if (ms > *honest_max_ms) *honest_max_ms = ms;
    }
  }
  wait_quiet(sp->pid);
  double spent = proc_cpu_ms(sp->pid) - before;

  /* The rest of each request in one piece: each is answered, and only then. */
  size_t rest = KEYS - buffered - TRICKLE;
  enc_t tail = {0};
  for (size_t k = 0; k < rest; k++) enc_u64(&tail, 0);
  for (int i = 0; i < CONNS; i++) {
    expect_silent(&cs[i], i == 0 ? 50 : 0, "a CHECK still missing items");
    send_raw(&cs[i], tail.p, tail.len);
    expect_byte(&cs[i], 1, "CHECK of 131072 missing keys (NOT_READY)");
    conn_close(&cs[i]);
  }
  free(tail.p);
  expect_ping(&honest, 77);
  conn_close(&honest);
  return spent;
}

static void test_partial_multikey(void) {
  server_proc_t sp = spawn_server(0, 0);
  double h_small, h_big;
  double small = trickle_cpu_ms(&sp, 16, &h_small);
  double big = trickle_cpu_ms(&sp, KEYS - TRICKLE - 1, &h_big);
  TEST_LOG(
      "%d segments of one item: server CPU %.0f ms with 16 items buffered per request, "
      "%.0f ms with %d buffered; honest PING max %.1f / %.1f ms",
      CONNS * TRICKLE, small, big, KEYS - TRICKLE - 1, h_small, h_big);
  /* Linear: the same work either way, plus scheduling noise. Quadratic (the old parser):
   * ~0.5 ms per segment at 131k buffered items, i.e. about 1.5 s here. */
  double bound = 3 * small + 100;
  if (big > bound)
    TEST_FAIL(
        "partial multi-key requests cost %.0f ms of server CPU with %d items buffered vs "
        "%.0f ms with 16 (bound %.0f): the parser walks the buffered items again per "
        "segment",
        big, KEYS - TRICKLE - 1, small, bound);
  stop_server(&sp);
}

/* The pipeliner: one thread sends ADDs in batches of 4096 without waiting, the other reads the
 * 8-byte replies; runs until killed. */
static void *drain_replies(void *arg) {
  conn_t *c = arg;
  static uint8_t buf[1 << 16];
  for (;;) {
    ssize_t k = recv(c->fd, buf, sizeof buf, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) _exit(0);
  }
  return NULL;
}

static pid_t spawn_pipeliner(int port) {
  pid_t pid = fork();
  CHECK(pid >= 0);
  if (pid) return pid;
  conn_t c = conn_open(port, 1, "pipeliner");
  pthread_t t;
  if (pthread_create(&t, NULL, drain_replies, &c) != 0) _exit(2);
  enc_t m = {0};
  for (int i = 0; i < 4096; i++) {
    m_op(&m, &c, OP_ADD);
    enc_cstr(&m, "/pipelined");
    enc_u64(&m, 1);
  }
  for (;;) {
    const uint8_t *p = m.p;
    size_t n = m.len;
    while (n) {
      ssize_t k = send(c.fd, p, n, MSG_NOSIGNAL);
      if (k < 0 && errno == EINTR) continue;
      if (k <= 0) _exit(0);
      p += k;
      n -= (size_t)k;
    }
  }
}

static int cmp_i64(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return (x > y) - (x < y);
}

/* Fairness counted in work, not time: the honest client sends ADD 0 to the pipeliner's counter
 * again and again, and each reply says how many of the pipeliner's ADDs the server ran since the
 * honest client's previous request ran. This server runs at most TURN_REQUESTS (64) requests of
 * a connection per loop turn (server_internal.h), 64 here at the median; the old one ran a whole
 * recv of up to 4 MB, over 100,000 ADDs, before answering anyone else. A loaded machine that
 * keeps the honest client off the CPU lets the server run more turns between two of its
 * requests, so the bound (64 turns) is on the 10th percentile, which needs only one request in
 * ten to find the client awake. */
static void test_pipeliner_fairness(void) {
  enum { ROUNDS = 200, BOUND = 4096 };
  server_proc_t sp = spawn_server(0, 0);
  conn_t honest = conn_open(sp.port, 1, "honest");
  pid_t pl = spawn_pipeliner(sp.port);
  /* Until the pipeliner's ADDs are being executed. */
  int64_t deadline = now_ms() + 30000;
  int64_t prev;
  while ((prev = r_add(&honest, "/pipelined", 0)) < 100000) {
    if (now_ms() > deadline) TEST_FAIL("the pipeliner's ADDs did not reach 100000 in 30 s");
    sleep_ms(10);
  }
  static int64_t ran[ROUNDS];
  for (int i = 0; i < ROUNDS; i++) {
    int64_t now = r_add(&honest, "/pipelined", 0);
    ran[i] = now - prev;
    prev = now;
  }
  kill(pl, SIGKILL);
  int st;
  waitpid(pl, &st, 0);
  qsort(ran, ROUNDS, sizeof ran[0], cmp_i64);
  int64_t p10 = ran[ROUNDS / 10], med = ran[ROUNDS / 2], max = ran[ROUNDS - 1];
  TEST_LOG(
      "the pipeliner's ADDs run between two of an honest client's requests (%lld in all): "
      "10th percentile %lld, median %lld, max %lld",
      (long long)prev, (long long)p10, (long long)med, (long long)max);
  if (p10 > BOUND)
    TEST_FAIL(
        "the server ran %lld of the pipeliner's ADDs (10th percentile) between two requests of "
        "an honest client (bound %d, 64 turns of 64 requests; the old server ran a whole recv "
        "of up to 4 MB per turn, over 100,000)",
        (long long)p10, BOUND);
  conn_close(&honest);
  stop_server(&sp);
}

/* A child that registers BIG_WAITS WAITs of KEYS missing keys each (about 200 MiB in all, within
 * the default connection budget; the PING echo sent after them says they are in), then closes
 * the connection so they are torn down, over and over. */
#define BIG_WAITS 6
static void enc_big_waits(enc_t *m, int waits, const char *tag) {
  char key[48];
  for (int w = 0; w < waits; w++) {
    enc_u8(m, 0x06); /* WAIT, 2.x */
    enc_u64(m, KEYS);
    for (int i = 0; i < KEYS; i++) {
      snprintf(key, sizeof key, "/never-%s%d-%06d", tag, w, i);
      enc_cstr(m, key);
    }
  }
}

static pid_t spawn_big_waiter(int port) {
  pid_t pid = fork();
  CHECK(pid >= 0);
  if (pid) return pid;
  enc_t m = {0};
  enc_big_waits(&m, BIG_WAITS, "");
  for (uint32_t n = 1;; n++) {
    conn_t c = conn_open(port, 1, "big-waiter");
    send_raw(&c, m.p, m.len);
    expect_ping(&c, n);
    conn_close(&c);
  }
}

/* What registering one WAIT of KEYS missing keys costs this server alone, in server CPU ms: the
 * work a server that does a whole WAIT in one turn makes every other client wait behind. It
 * scales with the build (a sanitizer's slowdown) and the machine as the measurement does. */
static double one_wait_cpu_ms(const server_proc_t *sp) {
  conn_t c = conn_open(sp->port, 1, "calibration");
  enc_t m = {0};
  enc_big_waits(&m, 1, "calibration-");
  wait_quiet(sp->pid);
  int64_t c0 = proc_cpu_ns(sp->pid);
  send_raw(&c, m.p, m.len);
  expect_ping(&c, 99);
  double ms = (double)(proc_cpu_ns(sp->pid) - c0) / 1e6;
  free(m.p);
  conn_close(&c);
  wait_quiet(sp->pid); /* its teardown, before the measurement starts */
  return ms;
}

/* One measurement: for each of PINGS honest PINGs while the big waiter runs, the server's CPU
 * time between the PING's send and its echo (what the server ran for others before answering:
 * a busy machine stretches the wall time, not this); returns the p99 in ms. */
static double big_wait_cpu_p99(int attempt, double *one_wait_ms) {
  enum { PINGS = 300 };
  server_proc_t sp = spawn_server(0, 0);
  *one_wait_ms = one_wait_cpu_ms(&sp);
  conn_t honest = conn_open(sp.port, 1, "honest");
  double cpu0 = proc_cpu_ms(sp.pid);
  pid_t bw = spawn_big_waiter(sp.port);
  /* Until the server is busy with the waits. */
  while (proc_cpu_ms(sp.pid) - cpu0 < 200) sleep_ms(10);
  static double cpu[PINGS], wall[PINGS];
  /* The pinger runs real-time while it measures, so it reads the echo as soon as it arrives:
   * otherwise a loaded machine that leaves it waiting for a core lets the server run more of the
   * waiter's work inside the window (root may; without it, a nice of -20, else as it is). */
  struct sched_param rt = {.sched_priority = 1}, normal = {.sched_priority = 0};
  int realtime = sched_setscheduler(0, SCHED_FIFO, &rt) == 0;
  if (!realtime && setpriority(PRIO_PROCESS, 0, -20) != 0)
    TEST_LOG("neither SCHED_FIFO nor nice -20 allowed: the pinger runs at its normal priority");
  for (int i = 0; i < PINGS; i++) {
    int64_t c0 = proc_cpu_ns(sp.pid);
    wall[i] = ping_ms(&honest, (uint32_t)i);
    cpu[i] = (double)(proc_cpu_ns(sp.pid) - c0) / 1e6;
    sleep_ms(2);
  }
  if (realtime) sched_setscheduler(0, SCHED_OTHER, &normal);
  setpriority(PRIO_PROCESS, 0, 0);
  kill(bw, SIGKILL);
  int st;
  waitpid(bw, &st, 0);
  qsort(cpu, PINGS, sizeof cpu[0], cmp_double);
  qsort(wall, PINGS, sizeof wall[0], cmp_double);
  double p99 = cpu[PINGS * 99 / 100];
  TEST_LOG(
      "attempt %d: PING while another client registers and drops %d WAITs of %d keys: server CPU "
      "before the echo median %.2f ms, p99 %.2f ms, max %.2f ms (wall: median %.2f, p99 %.2f "
      "ms); one such WAIT alone: %.1f ms",
      attempt, BIG_WAITS, KEYS, cpu[PINGS / 2], p99, cpu[PINGS - 1], wall[PINGS / 2],
      wall[PINGS * 99 / 100], *one_wait_ms);
  expect_ping(&honest, 7);
  conn_close(&honest);
  stop_server(&sp);
  return p99;
}

/* A server that registers or tears down a whole WAIT in one loop turn runs that turn before an
 * honest request that arrives meanwhile, so the p99 of the server CPU before the echo is at least
 * a large part of a WAIT's registration or teardown: 354 to 398 ms (TURN_WAIT_KEYS and
 * TURN_REAP_LINKS made unbounded, under load 12 on 2 cores) where one WAIT alone costs about
 * 290 ms. This one runs a share per turn: p99 3 to 18 ms under the same load. The bound is a
 * quarter of one WAIT's registration measured alone in the same run (so a sanitizer's slowdown
 * scales both); a second try covers a stray page-fault storm. */
static void test_big_wait_fairness(void) {
  double p99 = 0, one = 0;
  for (int attempt = 1; attempt <= 2; attempt++) {
    p99 = big_wait_cpu_p99(attempt, &one);
    if (p99 <= one / 4) return;
  }
  TEST_FAIL(
      "the server ran %.1f ms of CPU (p99, 2 attempts) before answering an honest PING while %d "
      "WAITs of %d keys were registered and torn down again and again, more than a quarter of "
      "what one such WAIT costs alone (%.1f ms): WAITs are registered or torn down in one loop "
      "turn instead of a "
      "share per turn",
      p99, BIG_WAITS, KEYS, one);
}

int main(int argc, char **argv) {
  (void)argc;
  (void)argv;
  signal(SIGPIPE, SIG_IGN);
  test_partial_multikey();
  test_pipeliner_fairness();
  test_big_wait_fairness();
  TEST_LOG("PASS");
  return 0;
}
