/* Fault loops over tdist_init_process_group (tests/testlib/fault.h), gloo over real sockets:
 *  - world 1: this process is rank 0 of tcp://127.0.0.1:PORT?rank=0&world_size=1, so it hosts
 *    the store server, connects its client and its gloo transport; then an all_reduce, a barrier
 *    and tdist_pg_destroy. Every allocation and every socket call in this process (the store
 *    server's thread included) fails once in turn, and every allocation of this thread from the
 *    n-th on.
 *  - world 2: a forked, unarmed rank 0 hosts the store; this process is rank 1 and its calls
 *    fail in turn while it joins, all-reduces with rank 0 and leaves. Then the other way round:
 *    this process is rank 0 (its own thread's calls fail, not the store server thread's) and
 *    the child is rank 1.
 * Each failure must return a clean status with a message (never TDIST_ERR_TIMEOUT: a hang), leak
 * nothing (LeakSanitizer under --config=asan), and a fresh group must then work. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tdist/tdist.h"
#include "tests/testlib/check.h"
#include "tests/testlib/fault.h"
#include "tests/testlib/ports.h"

#define TIMEOUT_MS 10000

typedef struct {
  fault_class_t cls;
  fault_mode_t mode;
  int world;
  int me; /* the armed rank; the other (world 2) runs unarmed in a child */
  int port;
  pid_t peer;
  char err[512];
} ctx_t;

/* One rank's whole life: init, all_reduce (checked), barrier, destroy. */
static tdist_status_t rank_run(int rank, int world, int port, char *err, size_t cap) {
  char im[128];
  snprintf(im, sizeof im, "tcp://127.0.0.1:%d?rank=%d&world_size=%d", port, rank, world);
  tdist_pg_options_t o = TDIST_PG_OPTIONS_INIT;
  o.init_method = im;
  o.timeout_ms = TIMEOUT_MS;
  tdist_pg_t *pg = NULL;
  tdist_status_t st = tdist_init_process_group(&o, &pg);
  if (st != TDIST_OK) {
    snprintf(err, cap, "init: %s", tdist_last_error());
    CHECK(pg == NULL);
    return st;
  }
  float buf[1024];
  for (int i = 0; i < 1024; i++) buf[i] = (float)(rank + 1) * (float)i;
  st = tdist_all_reduce(pg, buf, 1024, TDIST_FLOAT32, TDIST_SUM);
  if (st == TDIST_OK) {
    float f = (float)(world * (world + 1) / 2);
    for (int i = 0; i < 1024; i++) CHECK(buf[i] == f * (float)i);
    st = tdist_barrier(pg);
  }
  if (st != TDIST_OK) snprintf(err, cap, "collective: %s", tdist_pg_last_error(pg));
  tdist_pg_destroy(pg);
  return st;
}

/* World 2's other rank, unarmed, in a child. */
static pid_t fork_peer(int rank, int port) {
  pid_t c = fork();
  CHECK(c >= 0);
  if (c == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    char err[512];
    tdist_status_t st = rank_run(rank, 2, port, err, sizeof err);
    _exit(st == TDIST_OK ? 0 : 1);
  }
  return c;
}

static int attempt(void *arg, long n) {
  ctx_t *c = arg;
  c->port = test_free_port();
  c->peer = c->world == 2 ? fork_peer(1 - c->me, c->port) : 0;
  c->err[0] = '\0';
  /* Where this process hosts the store: sticky in world 1, or with a peer, fail only this
   * thread's calls. Else the store server's thread could starve or drop a connection for good
   * (world 1: never accept ours again; world 2: drop the peer's), which we would only learn at
   * the deadline. */
  fault_only_this_thread_next(c->me == 0 && (c->mode == FAULT_STICKY || c->world == 2));
  fault_arm(c->cls, n, c->mode);
  tdist_status_t st = rank_run(c->me, c->world, c->port, c->err, sizeof c->err);
  fault_disarm();
  return st;
}

static void reap_peer(ctx_t *c, int ok) {
  if (!c->peer) return;
  int ws = 0;
  if (!ok) kill(c->peer, SIGKILL); /* it waits for us in vain */
  CHECK(waitpid(c->peer, &ws, 0) == c->peer);
  if (ok) CHECK(WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
  c->peer = 0;
}

static void after(void *arg, long n, int rc) {
  ctx_t *c = arg;
  reap_peer(c, rc == TDIST_OK);
  if (rc != TDIST_OK) {
    /* Allocation: NO_MEMORY where this rank's code failed; REMOTE where the store server (world
     * 1: our own thread) dropped a connection for it. Sockets: SYSTEM or REMOTE, INVALID_USAGE
     * for a failed bind/listen of the store (reported as the port being in use). */
    int ok = rc == TDIST_ERR_REMOTE || rc == TDIST_ERR_SYSTEM ||
             (c->cls == FAULT_ALLOC ? rc == TDIST_ERR_NO_MEMORY : rc == TDIST_ERR_INVALID_USAGE);
    /* Known limit, not a hang: rank 0 cannot tell a peer whose hello it failed to read from a
     * stray connection, drops it and waits for that rank, which does not connect again; the
     * wait ends at the group's deadline (TIMEOUT, naming the rank). */
    if (c->world == 2 && c->me == 0 && rc == TDIST_ERR_TIMEOUT &&
        !strcmp(fault_last_failed_name(), "recv") && strstr(c->err, "waited for connections"))
      ok = 1;
    /* The message carries the failed call's errno text (listen's injected EADDRINUSE). */
    if (!strcmp(fault_last_failed_name(), "listen") && !strstr(c->err, "Address already in use"))
      ok = 0;
    if (!ok || c->err[0] == '\0') {
      fprintf(stderr, "pg world %d n=%ld (%s failed): status %s, message '%s'\n", c->world, n,
              fault_last_failed_name(), tdist_status_name(rc), c->err);
      exit(1);
    }
  }
  /* A fresh group works. */
  c->port = test_free_port();
  c->peer = c->world == 2 ? fork_peer(1 - c->me, c->port) : 0;
  char err[512] = "";
  tdist_status_t st = rank_run(c->me, c->world, c->port, err, sizeof err);
  CHECK_OK_MSG(st, err);
  reap_peer(c, 1);
}

int main(void) {
  struct {
    int world, me;
    fault_class_t cls;
    fault_mode_t mode;
    long min;
  } runs[] = {
      {1, 0, FAULT_ALLOC, FAULT_ONCE, 20},   {1, 0, FAULT_ALLOC, FAULT_STICKY, 20},
      {1, 0, FAULT_SOCK, FAULT_ONCE, 20},    {2, 1, FAULT_ALLOC, FAULT_ONCE, 20},
      {2, 1, FAULT_ALLOC, FAULT_STICKY, 20}, {2, 1, FAULT_SOCK, FAULT_ONCE, 20},
      {2, 0, FAULT_ALLOC, FAULT_ONCE, 20},   {2, 0, FAULT_SOCK, FAULT_ONCE, 20},
  };
  for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++) {
    ctx_t c = {.cls = runs[i].cls, .mode = runs[i].mode, .world = runs[i].world, .me = runs[i].me};
    char name[64];
    snprintf(name, sizeof name, "init_process_group w%d rank %d", c.world, c.me);
    fault_loop_t l = {name, c.cls, c.mode, attempt, after, &c, runs[i].min, 90};
    fault_loop_run(&l);
  }
  return 0;
}
