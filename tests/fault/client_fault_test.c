/* Fault loops over the TCPStore client (tests/testlib/fault.h): a store server runs in another
 * process (unarmed); in this one every allocation, then every socket call, the client makes to
 * connect and run every request kind (session.c) fails once in turn, and every allocation from
 * the n-th on (sticky). Each failure must return a clean status with a message naming it
 * (TDIST_ERR_NO_MEMORY for allocation; TDIST_ERR_SYSTEM or TDIST_ERR_REMOTE for sockets), never a
 * hang, a wrong answer or a leak (LeakSanitizer under --config=asan); the handle must be
 * destroyable and a fresh client must then pass the whole session. */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>

#include "tdist/tdist.h"
#include "tests/fault/session.h"
#include "tests/testlib/check.h"
#include "tests/testlib/fault.h"

typedef struct {
  fault_class_t cls;
  fault_mode_t mode;
  int port;
  char prefix[64];
  char err[512];
} ctx_t;

static int attempt(void *arg, long n) {
  ctx_t *c = arg;
  snprintf(c->prefix, sizeof c->prefix, "client-%s-%s-%ld", fault_class_name(c->cls),
           fault_mode_name(c->mode), n);
  tdist_store_t *s = NULL;
  c->err[0] = '\0';
  fault_arm(c->cls, n, c->mode);
  tdist_status_t st = session_connect(c->port, &s);
  if (st != TDIST_OK) {
    snprintf(c->err, sizeof c->err, "%s", tdist_last_error());
    CHECK(s == NULL);
  } else {
    st = session_run(s, c->prefix);
    if (st != TDIST_OK) snprintf(c->err, sizeof c->err, "%s", tdist_store_last_error(s));
    tdist_store_destroy(s);
  }
  fault_disarm();
  return st;
}

static void after(void *arg, long n, int rc) {
  ctx_t *c = arg;
  if (rc != TDIST_OK) {
    int ok;
    if (c->cls == FAULT_ALLOC) {
      ok = rc == TDIST_ERR_NO_MEMORY;
    } else {
      /* An injected ECONNRESET on ADD's or QUEUE_LEN's reply looks like PyTorch's server hanging
       * up on a non-integer value / an unknown opcode (see server_fault_test.c). */
      ok = rc == TDIST_ERR_SYSTEM || rc == TDIST_ERR_REMOTE ||
           (rc == TDIST_ERR_INVALID_USAGE && strstr(c->err, "refused to add")) ||
           (rc == TDIST_ERR_NOT_AVAILABLE && strstr(c->err, "has no queue operations"));
    }
    if (!ok || c->err[0] == '\0') {
      fprintf(stderr, "client n=%ld (%s failed): status %s, message '%s'\n", n,
              fault_last_failed_name(), tdist_status_name(rc), c->err);
      exit(1);
    }
  }
  char p[80];
  snprintf(p, sizeof p, "%s-fresh", c->prefix);
  session_must_pass(c->port, p);
}

int main(void) {
  int pid = 0;
  int port = session_fork_server(&pid);
  struct {
    fault_class_t cls;
    fault_mode_t mode;
    long min;
  } runs[] = {
      {FAULT_ALLOC, FAULT_ONCE, 8}, {FAULT_ALLOC, FAULT_STICKY, 8}, {FAULT_SOCK, FAULT_ONCE, 30}};
  for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++) {
    ctx_t c = {.cls = runs[i].cls, .mode = runs[i].mode, .port = port};
    fault_loop_t l = {"store client", c.cls, c.mode, attempt, after, &c, runs[i].min, 60};
    fault_loop_run(&l);
  }
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
  return 0;
}
