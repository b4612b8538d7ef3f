/* Failure semantics of process groups, on real processes over real sockets:
 *   (a) a rank SIGKILLs itself in the middle of a stream of large all_reduces: every survivor's
 *       call fails (TDIST_ERR_REMOTE or TDIST_ERR_TIMEOUT) within the group timeout, the error
 *       names the dead rank and its address (every survivor that saw the connection drop, and at
 *       least one in all; the address checked against the kernel's view of the survivor's own
 *       sockets) and the link it lost (shared memory or TCP), and every later call fails at its
 *       entry check with the same status (sticky);
 *   (b) a rank that stalls: the others get TDIST_ERR_TIMEOUT no earlier than the timeout and
 *       within timeout + slack, naming the stalled rank and its address;
 *   (c) tdist_pg_abort from another thread unblocks a blocked all_reduce / recv / async op with
 *       TDIST_ERR_ABORTED promptly; tdist_pg_destroy with queued work whose peer is gone returns;
 *   (d) monitored_barrier with absent ranks: rank 0 names exactly those ranks;
 *   (e) mismatched calls: with TDIST_DEBUG=DETAIL the error describes both calls (count, op,
 *       dtype, collective); without it a size mismatch is still an error, not a hang; a send/recv
 *       tag mismatch is an error, not silent corruption;
 *   (f) async work: overlapped ops of several kinds polled with work_test, work_wait with a short
 *       timeout on a stalled op returns TDIST_ERR_TIMEOUT without breaking the group, destroying
 *       unfinished work.
 * Survivors keep their group open until every survivor has seen its error (a shared-memory
 * counter), so one survivor closing its sockets cannot change what another one observes.
 * Scenarios that involve the data path run once with the default transports and once with
 * TDIST_SHM=0 (TCP only). Timing slack is generous (SLACK_MS) for loaded 2-core CI with ASan:
 * the upper bounds only stop a hang past the timeout; no sub-second bound is asserted. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <ctype.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "clock.h"
#include "proc.h"
#include "shard.h"
#include "ranks.h"

#define TMO 3000      /* group timeout of the failure scenarios */
#define SLACK_MS 2500 /* scheduling slack on a loaded 2-core machine under sanitizers */
#define RUN_MS 60000  /* harness timeout of one scenario */
#define MAX_WORLD 8
#define BIG (256 * 1024) /* floats: 1 MiB, well into the ring algorithm */

typedef struct {
  _Atomic int failed;       /* survivors that have seen their error */
  _Atomic int named;        /* survivors whose error named the culprit rank */
  _Atomic int done;         /* lets stalled/absent ranks leave */
  char msg[MAX_WORLD][600]; /* each rank's error text, for the parent's report */
} shared_t;

typedef struct {
  int culprit;  /* the rank that dies / stalls / differs */
  int culprit2; /* a second absent rank (monitored barrier), or -1 */
  int strict;   /* every survivor must name the culprit */
  int variant;  /* scenario-specific */
  int tcp_only; /* TDIST_SHM=0 */
  shared_t *sh;
} scen_t;

/* 1 if msg contains the decimal number n as a whole token (not part of a longer number, not a
 * "#n" sequence number). */
static int mentions_number(const char *msg, int n) {
  char num[16];
  snprintf(num, sizeof num, "%d", n);
  size_t l = strlen(num);
  for (const char *p = strstr(msg, num); p; p = strstr(p + 1, num)) {
    /* "#12" is a sequence number, not a rank */
    int before = p > msg && (isdigit((unsigned char)p[-1]) || p[-1] == '#');
    int after = isdigit((unsigned char)p[l]);
    if (!before && !after) return 1;
  }
  return 0;
}

/* 1 if msg says "rank N" (followed by a non-digit). */
static int names_rank(const char *msg, int n) {
  char pat[32];
  snprintf(pat, sizeof pat, "rank %d", n);
  size_t l = strlen(pat);
  for (const char *p = strstr(msg, pat); p; p = strstr(p + 1, pat))
    if (!isdigit((unsigned char)p[l])) return 1;
  return 0;
}

/* The kernel's view: the "ip:port" peer address of every TCP socket of this process (at most
 * max). Taken right after the group connected, it is the independent reference for the
 * addresses failure messages name: a rank's listening address is the peer address of the
 * connections higher ranks made to it. */
typedef struct {
  char a[2 * MAX_WORLD + 8][64];
  int n;
} peers_t;

static void kernel_peers(peers_t *p) {
  p->n = 0;
  for (int fd = 0; fd < 1024 && p->n < (int)(sizeof p->a / sizeof p->a[0]); fd++) {
    int type = 0;
    socklen_t tl = sizeof type;
    struct sockaddr_in sa;
    socklen_t sl = sizeof sa;
    if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &tl) != 0 || type != SOCK_STREAM) continue;
    if (getpeername(fd, (struct sockaddr *)&sa, &sl) != 0 || sa.sin_family != AF_INET) continue;
    char ip[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &sa.sin_addr, ip, sizeof ip);
    snprintf(p->a[p->n++], sizeof p->a[0], "%s:%d", ip, ntohs(sa.sin_port));
  }
}

/* msg names rank `peer` as "rank PEER (IP:PORT" (a failure message of the transport): the
 * address must be a real one, on an IP this rank is connected to, and, when this rank is
 * higher than the peer (it connected to the peer's listening socket), exactly the address the
 * kernel has for that connection. */
static void check_peer_addr(const char *msg, int rank, int peer, const peers_t *kp) {
  char pat[32], addr[64] = "";
  snprintf(pat, sizeof pat, "rank %d (", peer);
  const char *p = strstr(msg, pat);
  if (p) sscanf(p + strlen(pat), "%63[0-9.:]", addr);
  char *colon = strrchr(addr, ':');
  int port = colon ? atoi(colon + 1) : 0;
  int same_ip = 0, same = 0;
  for (int i = 0; colon && i < kp->n; i++) {
    same += !strcmp(kp->a[i], addr);
    same_ip += !strncmp(kp->a[i], addr, (size_t)(colon - addr + 1));
  }
  if (!p || port <= 0 || port > 65535 || !same_ip || (rank > peer && !same)) {
    fprintf(stderr, "rank %d: the error should name rank %d by its address '%s' (%s): %s\n", rank,
            peer, addr,
            rank > peer ? "the peer address of our connection to it" : "an IP we are connected to",
            msg);
    for (int i = 0; i < kp->n; i++) fprintf(stderr, "  kernel: connected to %s\n", kp->a[i]);
    exit(1);
  }
}

static void setup_env(const scen_t *s) {
  if (s->tcp_only) setenv("TDIST_SHM", "0", 1);
}

static tdist_pg_t *init(int rank, int world, int port, const scen_t *s, int64_t tmo,
                        tdist_store_t **store) {
  setup_env(s);
  return tdist_test_init_pg(rank, world, port, tmo, store);
}

/* Waits (bounded) until `n` survivors have reported. */
static void wait_count(_Atomic int *c, int n, int64_t limit_ms) {
  int64_t end = now_ms() + limit_ms;
  while (atomic_load(c) < n && now_ms() < end) usleep(2000);
}

static void fill_f32(float *b, size_t n, int rank, int it) {
  for (size_t i = 0; i < n; i++) b[i] = (float)((rank + 1) * 1000 + it) + (float)(i % 7);
}

static void check_sum_f32(const float *b, size_t n, int world, int it) {
  for (size_t i = 0; i < n; i++) {
    float want = 0;
    for (int r = 0; r < world; r++) want += (float)((r + 1) * 1000 + it) + (float)(i % 7);
    if (b[i] != want) {
      fprintf(stderr, "all_reduce iteration %d element %zu: got %g want %g\n", it, i, b[i], want);
      exit(1);
    }
  }
}

/* After the first failure `st0`, every later call must fail with the same status at its entry
 * check, without touching the network (the error says so: a call that tried the dead link again
 * would report a new timeout or a closed connection instead). */
static void check_sticky(tdist_pg_t *pg, tdist_status_t st0, float *buf) {
  static const char sticky[] = "process group is aborted after an earlier failure";
  tdist_status_t st = tdist_all_reduce(pg, buf, BIG, TDIST_FLOAT32, TDIST_SUM);
  CHECK_EQ_INT(st, st0);
  CHECK(strstr(tdist_last_error(), sticky) != NULL);
  CHECK_EQ_INT(tdist_barrier(pg), st0);
  CHECK(strstr(tdist_last_error(), sticky) != NULL);
  CHECK_EQ_INT(tdist_broadcast(pg, buf, 16, TDIST_FLOAT32, 0), st0);
  CHECK(strstr(tdist_last_error(), sticky) != NULL);
  tdist_work_t *w = NULL;
  st = tdist_all_reduce_async(pg, buf, 16, TDIST_FLOAT32, TDIST_SUM, &w);
  if (st == TDIST_OK) {
    st = tdist_work_wait(w, 5000);
    tdist_work_destroy(w);
  }
  CHECK_EQ_INT(st, st0);
}

/* Records a survivor's failure; `named` is whether it named the culprit. */
static void report(const scen_t *s, int rank, const char *msg, int named) {
  snprintf(s->sh->msg[rank], sizeof s->sh->msg[rank], "%s", msg);
  if (named) atomic_fetch_add(&s->sh->named, 1);
  atomic_fetch_add(&s->sh->failed, 1);
}

/* ---------------------------------------------------------------------------------------- */
/* (a) kill -9 mid-all_reduce                                                                */

static void *killer(void *arg) {
  (void)arg;
  usleep(1000 + (useconds_t)(getpid() % 5) * 700); /* land somewhere inside a collective */
  kill(getpid(), SIGKILL);
  return NULL;
}

static int kill_body(int rank, int world, int port, void *arg) {
  const scen_t *s = arg;
  float *buf = malloc(sizeof(float) * BIG);
  CHECK(buf != NULL);
  if (rank == s->culprit) {
    /* The victim runs in a grandchild so that this rank can report "died as planned" as
     * success to the harness. */
    pid_t pid = fork();
    if (pid == 0) {
      alarm(30);
      tdist_store_t *store;
      tdist_pg_t *pg = init(rank, world, port, s, TMO, &store);
      for (int it = 0; it < 100000; it++) {
        if (it == 5) {
          pthread_t th;
          pthread_create(&th, NULL, killer, NULL);
        }
        fill_f32(buf, BIG, rank, it);
        if (tdist_all_reduce(pg, buf, BIG, TDIST_FLOAT32, TDIST_SUM) != TDIST_OK) break;
      }
      _exit(7); /* the killer did not fire */
    }
    return test_expect_killed(pid, SIGKILL, "victim rank %d", rank);
  }
  tdist_store_t *store;
  tdist_pg_t *pg = init(rank, world, port, s, TMO, &store);
  peers_t kp;
  kernel_peers(&kp);
  tdist_status_t st = TDIST_OK;
  int64_t t0 = 0;
  int it;
  for (it = 0; it < 100000; it++) {
    fill_f32(buf, BIG, rank, it);
    t0 = now_ms();
    st = tdist_all_reduce(pg, buf, BIG, TDIST_FLOAT32, TDIST_SUM);
    if (st) break;
    if (it < 3) check_sum_f32(buf, BIG, world, it);
  }
  int64_t took = now_ms() - t0;
  const char *msg = tdist_pg_last_error(pg);
  TEST_LOG("kill: rank %d failed at iteration %d after %lld ms: %s: %s", rank, it, (long long)took,
           tdist_status_name(st), msg);
  CHECK(st == TDIST_ERR_REMOTE || st == TDIST_ERR_TIMEOUT);
  CHECK(it >= 5);
  CHECK(took <= TMO + SLACK_MS);
  /* Nobody has closed a connection except the victim (survivors wait below), so a dropped
   * connection can only be the victim's. */
  if (st == TDIST_ERR_REMOTE)
    CHECK(names_rank(msg, s->culprit));
  else
    CHECK(strstr(msg, "rank ") != NULL);
  int named = names_rank(msg, s->culprit);
  if (s->strict) CHECK(named);
  if (named) check_peer_addr(msg, rank, s->culprit, &kp);
  /* The link that broke is the one the transport was meant to use with a same-host peer. */
  if (st == TDIST_ERR_REMOTE && named && (strstr(msg, "same host") != NULL) != !s->tcp_only) {
    fprintf(stderr, "rank %d: expected the %s link to rank %d to fail: %s\n", rank,
            s->tcp_only ? "TCP" : "shared-memory", s->culprit, msg);
    exit(1);
  }
  char saved[600];
  snprintf(saved, sizeof saved, "%s", msg);
  report(s, rank, saved, named);
  check_sticky(pg, st, buf);
  wait_count(&s->sh->failed, world - 1, 3 * TMO + SLACK_MS);
  CHECK_EQ_INT(tdist_pg_finalize(pg), st);
  tdist_pg_destroy(pg);
  tdist_store_destroy(store);
  free(buf);
  return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* (b) a stalled rank                                                                        */

/* variant 0: all_reduce (large); variant 1: barrier. */
static int stall_body(int rank, int world, int port, void *arg) {
  const scen_t *s = arg;
  tdist_store_t *store;
  tdist_pg_t *pg = init(rank, world, port, s, TMO, &store);
  peers_t kp;
  kernel_peers(&kp);
  float *buf = malloc(sizeof(float) * BIG);
  CHECK(buf != NULL);
  for (int it = 0; it < 3; it++) {
    fill_f32(buf, BIG, rank, it);
    CHECK_OK_MSG(tdist_all_reduce(pg, buf, BIG, TDIST_FLOAT32, TDIST_SUM), tdist_pg_last_error(pg));
    check_sum_f32(buf, BIG, world, it);
  }
  if (rank == s->culprit) {
    /* Stall: stay connected, call nothing, until every survivor has timed out. */
    wait_count(&s->sh->failed, world - 1, 3 * TMO + 2 * SLACK_MS);
  } else {
    int64_t t0 = now_ms();
    tdist_status_t st = s->variant == 1 ? tdist_barrier(pg)
                                        : tdist_all_reduce(pg, buf, BIG, TDIST_FLOAT32, TDIST_SUM);
    int64_t took = now_ms() - t0;
    const char *msg = tdist_pg_last_error(pg);
    TEST_LOG("stall: rank %d got %s after %lld ms: %s", rank, tdist_status_name(st),
             (long long)took, msg);
    CHECK_EQ_INT(st, TDIST_ERR_TIMEOUT);
    char name[32];
    unsigned long long seq = 0; /* the message names the collective: "all_reduce #4: ..." */
    CHECK(sscanf(msg, "%31[a-z_] #%llu: ", name, &seq) == 2 && seq > 0);
    CHECK(!strcmp(name, s->variant == 1 ? "barrier" : "all_reduce"));
    CHECK(took >= TMO - 50); /* never early */
    CHECK(took <= TMO + SLACK_MS);
    int named = names_rank(msg, s->culprit);
    if (s->strict) CHECK(named);
    if (named) check_peer_addr(msg, rank, s->culprit, &kp);
    char saved[600];
    snprintf(saved, sizeof saved, "%s", msg);
    report(s, rank, saved, named);
    check_sticky(pg, st, buf);
    wait_count(&s->sh->failed, world - 1, 3 * TMO + SLACK_MS);
  }
  tdist_pg_destroy(pg);
  tdist_store_destroy(store);
  free(buf);
  return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* (c) abort from another thread                                                             */

typedef struct {
  tdist_pg_t *pg;
  int delay_ms;
} aborter_t;

static void *aborter(void *arg) {
  aborter_t *a = arg;
  usleep((useconds_t)a->delay_ms * 1000);
  tdist_pg_abort(a->pg);
  return NULL;
}

static void expect_aborted(const char *what, tdist_status_t st, int64_t took, int delay_ms) {
  TEST_LOG("abort: %s returned %s after %lld ms", what, tdist_status_name(st), (long long)took);
  CHECK_EQ_INT(st, TDIST_ERR_ABORTED);
  CHECK(took >= delay_ms - 20);
  CHECK(took <= delay_ms + SLACK_MS);
}

/* variant 0: rank 0 blocks in all_reduce (rank 1 never calls) and is aborted by a thread;
 * variant 1: both ranks block in recv from each other and each is aborted by its own thread;
 * variant 2: rank 0's async all_reduce is blocked on the worker; the main thread aborts;
 * variant 3: rank 0 destroys the group with an async all_reduce blocked on the worker. */
static int abort_body(int rank, int world, int port, void *arg) {
  const scen_t *s = arg;
  tdist_store_t *store;
  /* A long group timeout: only the abort can end the blocked calls in time (and a destroy that
   * waited for the timeout instead would show as a clear failure, before the harness's limit). */
  tdist_pg_t *pg = init(rank, world, port, s, 30000, &store);
  float *buf = calloc(BIG, sizeof(float));
  CHECK(buf != NULL);
  CHECK_OK_MSG(tdist_barrier(pg), tdist_pg_last_error(pg));
  int delay = 300;
  aborter_t a = {pg, delay};
  pthread_t th;
  if (s->variant == 0 || s->variant == 1) {
    if (s->variant == 0 && rank == 1) {
      wait_count(&s->sh->done, 1, 20000); /* never joins the all_reduce */
    } else {
      pthread_create(&th, NULL, aborter, &a);
      int64_t t0 = now_ms();
      tdist_status_t st = s->variant == 0 ? tdist_all_reduce(pg, buf, BIG, TDIST_FLOAT32, TDIST_SUM)
                                          : tdist_recv(pg, buf, 1000, TDIST_FLOAT32, 1 - rank, 3);
      expect_aborted(s->variant == 0 ? "all_reduce" : "recv", st, now_ms() - t0, delay);
      pthread_join(th, NULL);
      CHECK(strstr(tdist_pg_last_error(pg), "abort") != NULL);
      /* In variant 1 the peer is blocked too: keep our connections open until it has seen
       * its own abort, or it could see our close first (TDIST_ERR_REMOTE). */
      atomic_fetch_add(&s->sh->failed, 1);
      wait_count(&s->sh->failed, s->variant == 1 ? 2 : 1, 2 * SLACK_MS);
      check_sticky(pg, TDIST_ERR_ABORTED, buf);
      tdist_pg_abort(pg); /* idempotent */
      tdist_pg_abort(NULL);
      CHECK_EQ_INT(tdist_pg_finalize(pg), TDIST_ERR_ABORTED);
      atomic_store(&s->sh->done, 1);
    }
  } else {
    if (rank == 1) {
      wait_count(&s->sh->done, 1, 20000);
    } else {
      tdist_work_t *w = NULL;
      CHECK_OK(tdist_all_reduce_async(pg, buf, BIG, TDIST_FLOAT32, TDIST_SUM, &w));
      usleep((useconds_t)delay * 1000);
      int done = -1;
      CHECK_OK(tdist_work_test(w, &done));
      CHECK_EQ_INT(done, 0);
      int64_t t0 = now_ms();
      if (s->variant == 2) {
        tdist_pg_abort(pg);
        tdist_status_t st = tdist_work_wait(w, 10000);
        expect_aborted("async all_reduce", st, now_ms() - t0, 0);
        CHECK_EQ_INT(tdist_work_test(w, &done), TDIST_ERR_ABORTED); /* the work's status */
        CHECK_EQ_INT(done, 1);
        tdist_work_destroy(w);
      } else {
        tdist_work_destroy(w); /* abandoned: the worker frees it */
        tdist_pg_destroy(pg);
        pg = NULL;
        int64_t took = now_ms() - t0;
        TEST_LOG("abort: destroy with blocked async work took %lld ms", (long long)took);
        CHECK(took < 15000); /* did not wait for the 30 s group timeout (only that is asserted) */
      }
      atomic_store(&s->sh->done, 1);
    }
  }
  tdist_pg_destroy(pg);
  tdist_store_destroy(store);
  free(buf);
  return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* (d) monitored_barrier with absent ranks                                                   */

#define MB_TIMEOUT 1500

static int monitored_body(int rank, int world, int port, void *arg) {
  const scen_t *s = arg;
  tdist_store_t *store;
  tdist_pg_t *pg = init(rank, world, port, s, 20000, &store);
  CHECK_OK_MSG(tdist_monitored_barrier(pg, 5000), tdist_pg_last_error(pg)); /* all present */
  if (rank == s->culprit || rank == s->culprit2) {
    wait_count(&s->sh->done, 1, 4 * MB_TIMEOUT + 2 * SLACK_MS); /* absent, but connected */
  } else {
    int64_t t0 = now_ms();
    tdist_status_t st = tdist_monitored_barrier(pg, MB_TIMEOUT);
    int64_t took = now_ms() - t0;
    const char *msg = tdist_pg_last_error(pg);
    TEST_LOG("monitored_barrier: rank %d got %s after %lld ms: %s", rank, tdist_status_name(st),
             (long long)took, msg);
    CHECK(st != TDIST_OK);
    CHECK(took <= MB_TIMEOUT + SLACK_MS);
    if (rank == 0) {
      CHECK_EQ_INT(st, TDIST_ERR_TIMEOUT);
      CHECK(took >= MB_TIMEOUT - 50);
      /* names exactly the absent ranks among 2..world-1 (1 is ambiguous with a count) */
      for (int r = 2; r < world; r++) {
        int absent = r == s->culprit || r == s->culprit2;
        if (mentions_number(msg, r) != absent) {
          fprintf(stderr, "monitored_barrier on rank 0: message %s rank %d: %s\n",
                  absent ? "does not name absent" : "names present", r, msg);
          exit(1);
        }
      }
      atomic_fetch_add(&s->sh->failed, 1);
    }
    /* Keep rank 0's connections open until every present rank has its answer. */
    atomic_fetch_add(&s->sh->named, 1);
    int present = world - 1 - (s->culprit2 >= 0);
    wait_count(&s->sh->named, present, MB_TIMEOUT + 2 * SLACK_MS);
    if (rank == 0) atomic_store(&s->sh->done, 1);
  }
  tdist_pg_destroy(pg);
  tdist_store_destroy(store);
  return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* (e) mismatched collectives                                                                */

/* variant 0: count 12 vs 10 (culprit), float32 SUM all_reduce;
 * variant 1: op SUM vs MAX;  variant 2: dtype float32 vs int32;
 * variant 3: all_reduce vs broadcast (culprit);
 * variant 4: send/recv tag mismatch (rank 0 sends tag 1, rank 1 receives tag 2). */
static int mismatch_body(int rank, int world, int port, void *arg) {
  const scen_t *s = arg;
  int detail = s->strict; /* strict = TDIST_DEBUG=DETAIL and a precise message */
  if (detail)
    setenv("TDIST_DEBUG", "DETAIL", 1);
  else
    unsetenv("TDIST_DEBUG");
  tdist_store_t *store;
  tdist_pg_t *pg = init(rank, world, port, s, TMO, &store);
  float buf[64] = {0};
  CHECK_OK_MSG(tdist_all_reduce(pg, buf, 64, TDIST_FLOAT32, TDIST_SUM), tdist_pg_last_error(pg));
  int me = rank == s->culprit;
  int64_t t0 = now_ms();
  tdist_status_t st;
  switch (s->variant) {
    case 0: st = tdist_all_reduce(pg, buf, me ? 10 : 12, TDIST_FLOAT32, TDIST_SUM); break;
    case 1: st = tdist_all_reduce(pg, buf, 12, TDIST_FLOAT32, me ? TDIST_MAX : TDIST_SUM); break;
    case 2: st = tdist_all_reduce(pg, buf, 12, me ? TDIST_INT32 : TDIST_FLOAT32, TDIST_SUM); break;
    case 3:
      st = me ? tdist_broadcast(pg, buf, 12, TDIST_FLOAT32, 0)
              : tdist_all_reduce(pg, buf, 12, TDIST_FLOAT32, TDIST_SUM);
      break;
    default:
      st = rank == 0 ? tdist_send(pg, buf, 12, TDIST_FLOAT32, 1, 1)
                     : tdist_recv(pg, buf, 12, TDIST_FLOAT32, 0, 2);
      break;
  }
  int64_t took = now_ms() - t0;
  const char *msg = tdist_pg_last_error(pg);
  TEST_LOG("mismatch %d (%s): rank %d got %s after %lld ms: %s", s->variant,
           detail ? "DETAIL" : "plain", rank, tdist_status_name(st), (long long)took, msg);
  if (s->variant == 4) {
    if (rank == 1) { /* the receiver must notice; the sender's bytes may already be gone */
      CHECK(st != TDIST_OK);
      CHECK(took <= TMO + SLACK_MS);
    }
  } else {
    CHECK(st != TDIST_OK); /* nobody may return success from a mismatched collective */
    CHECK(took <= TMO + SLACK_MS);
    if (detail) {
      /* found by the fingerprint exchange (a timeout would be TDIST_ERR_TIMEOUT) */
      CHECK_EQ_INT(st, TDIST_ERR_INVALID_USAGE);
      static const char *const want[][2] = {
          {"10", "12"}, {"SUM", "MAX"}, {"float32", "int32"}, {"all_reduce", "broadcast"}};
      const char *a = want[s->variant][0], *b = want[s->variant][1];
      int ok = s->variant == 0 ? mentions_number(msg, 10) && mentions_number(msg, 12)
                               : strstr(msg, a) && strstr(msg, b);
      if (!ok) {
        fprintf(stderr, "rank %d: the DETAIL message does not describe both calls (%s / %s): %s\n",
                rank, a, b, msg);
        exit(1);
      }
    }
  }
  atomic_fetch_add(&s->sh->failed, 1);
  wait_count(&s->sh->failed, world, 2 * TMO + 2 * SLACK_MS);
  tdist_pg_destroy(pg);
  tdist_store_destroy(store);
  return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* (f) async work                                                                            */

#define AN 5003

static int64_t aval(int rank, int k, size_t i) {
  return (int64_t)(tdist_test_rand(99, (uint64_t)(rank * 256 + k), i) % 2001) - 1000;
}

static int async_body(int rank, int world, int port, void *arg) {
  const scen_t *s = arg;
  tdist_store_t *store;
  tdist_pg_t *pg = init(rank, world, port, s, 20000, &store);
  /* 1. overlapped work of several kinds, polled with work_test */
  enum { NAR = 4 };
  int64_t *ar[NAR], *bc = malloc(sizeof(int64_t) * AN);
  int64_t *ag = malloc(sizeof(int64_t) * AN * (size_t)world);
  int64_t *rs_in = malloc(sizeof(int64_t) * AN * (size_t)world);
  int64_t *rs_out = malloc(sizeof(int64_t) * AN);
  int64_t *a2a_out = malloc(sizeof(int64_t) * AN * (size_t)world);
  CHECK(bc && ag && rs_in && rs_out && a2a_out);
  tdist_work_t *w[NAR + 16];
  int nw = 0;
  for (int k = 0; k < NAR; k++) {
    ar[k] = malloc(sizeof(int64_t) * AN);
    CHECK(ar[k] != NULL);
    for (size_t i = 0; i < AN; i++) ar[k][i] = aval(rank, k, i);
    CHECK_OK(tdist_all_reduce_async(pg, ar[k], AN, TDIST_INT64, k % 2 ? TDIST_MAX : TDIST_SUM,
                                    &w[nw++]));
  }
  for (size_t i = 0; i < AN; i++) bc[i] = rank == 1 % world ? aval(1, 5, i) : 0;
  CHECK_OK(tdist_broadcast_async(pg, bc, AN, TDIST_INT64, 1 % world, &w[nw++]));
  int64_t *ag_in = malloc(sizeof(int64_t) * AN);
  CHECK(ag_in != NULL);
  for (size_t i = 0; i < AN; i++) ag_in[i] = aval(rank, 10, i);
  CHECK_OK(tdist_all_gather_async(pg, ag, ag_in, AN, TDIST_INT64, &w[nw++]));
  for (size_t i = 0; i < AN * (size_t)world; i++) rs_in[i] = aval(rank, 6, i);
  CHECK_OK(tdist_reduce_scatter_async(pg, rs_out, rs_in, AN, TDIST_INT64, TDIST_SUM, &w[nw++]));
  CHECK_OK(tdist_all_to_all_async(pg, a2a_out, rs_in, AN, TDIST_INT64, &w[nw++]));
  CHECK_OK(tdist_barrier_async(pg, &w[nw++]));
  /* the forms added later: reduce, gather, scatter, the v-variants (whose count/displacement
   * arrays are copied: they are scribbled over and freed right after the call), send/recv */
  int64_t *rd = malloc(sizeof(int64_t) * AN), *ga = malloc(sizeof(int64_t) * AN * (size_t)world);
  int64_t *sc = malloc(sizeof(int64_t) * AN), *agv = malloc(sizeof(int64_t) * (size_t)world * 8);
  int64_t *a2v = malloc(sizeof(int64_t) * (size_t)world * 8), *p2p = malloc(sizeof(int64_t) * AN);
  int64_t agv_in[2];
  CHECK(rd && ga && sc && agv && a2v && p2p);
  for (size_t i = 0; i < AN; i++) rd[i] = aval(rank, 11, i);
  CHECK_OK(tdist_reduce_async(pg, rd, AN, TDIST_INT64, TDIST_SUM, 0, &w[nw++]));
  CHECK_OK(tdist_gather_async(pg, rank == world - 1 ? ga : NULL, ag_in, AN, TDIST_INT64, world - 1,
                              &w[nw++]));
  CHECK_OK(tdist_scatter_async(pg, sc, rank == 1 % world ? rs_in : NULL, AN, TDIST_INT64, 1 % world,
                               &w[nw++]));
  {
    size_t *c = malloc(sizeof(size_t) * (size_t)world * 4);
    CHECK(c != NULL);
    for (int r = 0; r < world; r++) {
      c[r] = (size_t)r % 3;         /* rank r contributes r % 3 elements ... */
      c[world + r] = (size_t)r * 8; /* ... at r * 8 */
    }
    agv_in[0] = aval(rank, 12, 0); /* a data buffer: borrowed until the work completes */
    agv_in[1] = aval(rank, 12, 1);
    memset(agv, 0, sizeof(int64_t) * (size_t)world * 8);
    CHECK_OK(tdist_all_gather_v_async(pg, agv, c, c + world, agv_in, TDIST_INT64, &w[nw++]));
    memset(c, 0xff, sizeof(size_t) * (size_t)world * 2);
    /* all_to_all_v: one element from each rank to each rank, placed at 8 * source */
    for (int r = 0; r < world; r++) {
      c[r] = 1;
      c[world + r] = (size_t)r * 8; /* out displacements */
      c[2 * world + r] = 1;
      c[3 * world + r] = (size_t)r; /* in displacements: rs_in[r] goes to rank r */
    }
    memset(a2v, 0, sizeof(int64_t) * (size_t)world * 8);
    CHECK_OK(tdist_all_to_all_v_async(pg, a2v, c, c + world, rs_in, c + 2 * world, c + 3 * world,
                                      TDIST_INT64, &w[nw++]));
    memset(c, 0xff, sizeof(size_t) * (size_t)world * 4);
    free(c);
  }
  if (world > 1 && rank <= 1) {
    for (size_t i = 0; i < AN; i++) p2p[i] = rank == 0 ? aval(0, 13, i) : 0;
    CHECK_OK(rank == 0 ? tdist_send_async(pg, p2p, AN, TDIST_INT64, 1, 77, &w[nw++])
                       : tdist_recv_async(pg, p2p, AN, TDIST_INT64, 0, 77, &w[nw++]));
  }
  int64_t end = now_ms() + 20000;
  for (int k = 0; k < nw; k++) {
    int done = 0;
    while (!done) {
      CHECK_OK_MSG(tdist_work_test(w[k], &done), tdist_pg_last_error(pg));
      if (!done) {
        CHECK(now_ms() < end);
        usleep(500);
      }
    }
    /* finished: returns at once, so a zero timeout is enough */
    CHECK_OK_MSG(tdist_work_wait(w[k], 0), tdist_pg_last_error(pg));
    tdist_work_destroy(w[k]);
  }
  for (int k = 0; k < NAR; k++) {
    for (size_t i = 0; i < AN; i++) {
      int64_t want = k % 2 ? INT64_MIN : 0;
      for (int r = 0; r < world; r++) {
        int64_t v = aval(r, k, i);
        want = k % 2 ? (v > want ? v : want) : want + v;
      }
      CHECK_EQ_INT(ar[k][i], want);
    }
  }
  for (size_t i = 0; i < AN; i++) CHECK_EQ_INT(bc[i], aval(1 % world, 5, i));
  for (int r = 0; r < world; r++)
    for (size_t i = 0; i < AN; i++) CHECK_EQ_INT(ag[(size_t)r * AN + i], aval(r, 10, i));
  for (size_t i = 0; i < AN; i++) {
    int64_t want = 0;
    for (int r = 0; r < world; r++) want += aval(r, 6, (size_t)rank * AN + i);
    CHECK_EQ_INT(rs_out[i], want);
  }
  for (int r = 0; r < world; r++)
    for (size_t i = 0; i < AN; i++)
      CHECK_EQ_INT(a2a_out[(size_t)r * AN + i], aval(r, 6, (size_t)rank * AN + i));

  if (rank == 0)
    for (size_t i = 0; i < AN; i++) {
      int64_t want = 0;
      for (int r = 0; r < world; r++) want += aval(r, 11, i);
      CHECK_EQ_INT(rd[i], want);
    }
  if (rank == world - 1)
    for (int r = 0; r < world; r++)
      for (size_t i = 0; i < AN; i++) CHECK_EQ_INT(ga[(size_t)r * AN + i], aval(r, 10, i));
  for (size_t i = 0; i < AN; i++) CHECK_EQ_INT(sc[i], aval(1 % world, 6, (size_t)rank * AN + i));
  for (int r = 0; r < world; r++)
    for (int k = 0; k < 8; k++)
      CHECK_EQ_INT(agv[r * 8 + k], k < r % 3 ? aval(r, 12, (size_t)k) : 0);
  for (int r = 0; r < world; r++)
    for (int k = 0; k < 8; k++) CHECK_EQ_INT(a2v[r * 8 + k], k == 0 ? aval(r, 6, (size_t)rank) : 0);
  if (world > 1 && rank == 1)
    for (size_t i = 0; i < AN; i++) CHECK_EQ_INT(p2p[i], aval(0, 13, i));
  free(rd);
  free(ga);
  free(sc);
  free(agv);
  free(a2v);
  free(p2p);

  /* 2. a short wait on a stalled op times out; the op still completes afterwards */
  int late = world - 1;
  for (size_t i = 0; i < AN; i++) ar[0][i] = aval(rank, 7, i);
  tdist_work_t *sw = NULL;
  if (rank == late) usleep(1500 * 1000);
  CHECK_OK(tdist_all_reduce_async(pg, ar[0], AN, TDIST_INT64, TDIST_SUM, &sw));
  if (rank != late && world > 1) {
    int64_t t0 = now_ms();
    tdist_status_t st = tdist_work_wait(sw, 200);
    int64_t took = now_ms() - t0;
    TEST_LOG("async: rank %d short wait returned %s after %lld ms", rank, tdist_status_name(st),
             (long long)took);
    CHECK_EQ_INT(st, TDIST_ERR_TIMEOUT);
    CHECK(took >= 190 && took <= 200 + SLACK_MS);
    int done = -1;
    CHECK_OK(tdist_work_test(sw, &done));
    CHECK_EQ_INT(done, 0);
  }
  CHECK_OK_MSG(tdist_work_wait(sw, -1), tdist_pg_last_error(pg));
  tdist_work_destroy(sw);
  for (size_t i = 0; i < AN; i++) {
    int64_t want = 0;
    for (int r = 0; r < world; r++) want += aval(r, 7, i);
    CHECK_EQ_INT(ar[0][i], want);
  }

  /* 3. a blocking call issued while async work is still running must run after it (the group
   * runs collectives in call order), whether the work is then waited for or destroyed
   * unfinished. Repeated: an overlap shows up as wrong sums or spurious errors. */
  for (int rep = 0; rep < 6; rep++) {
    int destroy = rep % 2;
    for (size_t i = 0; i < AN; i++) {
      ar[1][i] = aval(rank, 20 + rep, i);
      ar[2][i] = aval(rank, 40 + rep, i);
    }
    CHECK_OK(tdist_all_reduce_async(pg, ar[1], AN, TDIST_INT64, TDIST_SUM, &sw));
    if (destroy) tdist_work_destroy(sw); /* unfinished: the worker frees it */
    CHECK_OK_MSG(tdist_all_reduce(pg, ar[2], AN, TDIST_INT64, TDIST_SUM), tdist_pg_last_error(pg));
    if (!destroy) {
      CHECK_OK_MSG(tdist_work_wait(sw, -1), tdist_pg_last_error(pg));
      tdist_work_destroy(sw);
    }
    for (size_t i = 0; i < AN; i++) {
      int64_t w1 = 0, w2 = 0;
      for (int r = 0; r < world; r++) {
        w1 += aval(r, 20 + rep, i);
        w2 += aval(r, 40 + rep, i);
      }
      if (ar[1][i] != w1 || ar[2][i] != w2) {
        fprintf(stderr,
                "rank %d rep %d (%s): async result [%zu] = %lld (want %lld), blocking "
                "result = %lld (want %lld): the blocking call overlapped the async one\n",
                rank, rep, destroy ? "work destroyed" : "work waited", i, (long long)ar[1][i],
                (long long)w1, (long long)ar[2][i], (long long)w2);
        exit(1);
      }
    }
  }
  CHECK_OK(tdist_pg_finalize(pg));
  tdist_pg_destroy(pg);
  tdist_store_destroy(store);
  for (int k = 0; k < NAR; k++) free(ar[k]);
  free(bc);
  free(ag);
  free(ag_in);
  free(rs_in);
  free(rs_out);
  free(a2a_out);
  return 0;
}

/* ---------------------------------------------------------------------------------------- */

static shared_t *g_sh;

static int run(const char *name, int world, tdist_test_rank_fn fn, scen_t s) {
  memset(g_sh, 0, sizeof *g_sh);
  s.sh = g_sh;
  int64_t t0 = now_ms();
  int rc = tdist_test_run_ranks(world, RUN_MS, fn, &s);
  TEST_LOG("== %s (world %d%s): %s in %lld ms", name, world, s.tcp_only ? ", TCP only" : "",
           rc ? "FAILED" : "ok", (long long)(now_ms() - t0));
  return rc;
}

int main(void) {
  g_sh = mmap(NULL, sizeof(shared_t), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  CHECK(g_sh != MAP_FAILED);
  test_shard_t sh = test_shard_init("pg_failure_test");
  int failed = 0;
#define JOB if (test_shard_take(&sh))
  for (int tcp = 0; tcp < 2; tcp++) {
    /* (a) */
    JOB {
      failed |= run("kill -9 mid all_reduce", 2, kill_body,
                    (scen_t){.culprit = 1, .culprit2 = -1, .strict = 1, .tcp_only = tcp});
      CHECK_EQ_INT(atomic_load(&g_sh->named), 1);
    }
    JOB {
      failed |= run("kill -9 mid all_reduce", 4, kill_body,
                    (scen_t){.culprit = 1, .culprit2 = -1, .tcp_only = tcp});
      if (atomic_load(&g_sh->named) < 1) {
        fprintf(stderr, "kill -9 (world 4): no survivor named the dead rank 1:\n");
        for (int r = 0; r < 4; r++) fprintf(stderr, "  rank %d: %s\n", r, g_sh->msg[r]);
        failed = 1;
      }
    }
    /* (b) */
    JOB failed |= run("stalled rank, all_reduce", 2, stall_body,
                      (scen_t){.culprit = 1, .culprit2 = -1, .strict = 1, .tcp_only = tcp});
    JOB failed |=
        run("stalled rank, barrier", 3, stall_body,
            (scen_t){.culprit = 2, .culprit2 = -1, .strict = 1, .variant = 1, .tcp_only = tcp});
    JOB {
      failed |= run("stalled rank, all_reduce", 3, stall_body,
                    (scen_t){.culprit = 2, .culprit2 = -1, .tcp_only = tcp});
      if (atomic_load(&g_sh->named) < 1) {
        fprintf(stderr, "stall (world 3): no survivor named the stalled rank 2\n");
        failed = 1;
      }
    }
    /* (c) */
    for (int v = 0; v < 4; v++)
      JOB failed |= run(v == 0   ? "abort blocked all_reduce"
                        : v == 1 ? "abort blocked recv (both ranks)"
                        : v == 2 ? "abort blocked async all_reduce"
                                 : "destroy with blocked async work",
                        2, abort_body,
                        (scen_t){.culprit = -1, .culprit2 = -1, .variant = v, .tcp_only = tcp});
    /* (f) */
    JOB failed |=
        run("async work", 3, async_body, (scen_t){.culprit = -1, .culprit2 = -1, .tcp_only = tcp});
  }
  /* (d): the transport does not matter */
  JOB failed |= run("monitored_barrier, rank 3 absent", 4, monitored_body,
                    (scen_t){.culprit = 3, .culprit2 = -1});
  JOB failed |= run("monitored_barrier, ranks 2 and 4 absent", 5, monitored_body,
                    (scen_t){.culprit = 2, .culprit2 = 4});
  /* (e) */
  for (int v = 0; v < 4; v++) {
    JOB failed |= run("mismatch with TDIST_DEBUG=DETAIL", v == 1 ? 3 : 2, mismatch_body,
                      (scen_t){.culprit = 1, .culprit2 = -1, .strict = 1, .variant = v});
  }
  JOB failed |= run("count mismatch without DETAIL", 2, mismatch_body,
                    (scen_t){.culprit = 1, .culprit2 = -1, .variant = 0});
  JOB failed |= run("count mismatch without DETAIL", 3, mismatch_body,
                    (scen_t){.culprit = 1, .culprit2 = -1, .variant = 0});
  JOB failed |= run("send/recv tag mismatch", 2, mismatch_body,
                    (scen_t){.culprit = 1, .culprit2 = -1, .variant = 4});
#undef JOB
  munmap(g_sh, sizeof *g_sh);
  CHECK(!failed);
  TEST_LOG("ok");
  return 0;
}
