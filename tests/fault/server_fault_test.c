/* Fault loops over the store server (tests/testlib/fault.h): every allocation and socket call of
 * tdist_store_server_create fails once in turn (then all calls from it on, the sticky mode), and
 * then (once mode) every one the server thread makes while it serves a real client over a real
 * socket (every request kind, a 300 KiB value, a WAIT answered by a later SET). Each failure must
 * give a clean status with a message (create) or a dropped connection (serving: the client sees
 * TDIST_ERR_REMOTE, never a hang or a wrong answer), leak nothing (LeakSanitizer under
 * --config=asan) and leave a server that a fresh client, or a fresh create, uses normally. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "tdist/tdist.h"
#include "tests/fault/session.h"
#include "tests/testlib/check.h"
#include "tests/testlib/fault.h"

typedef struct {
  fault_class_t cls;
  fault_mode_t mode;
  tdist_store_server_t *srv; /* the serving loop's server */
  char prefix[64];
} ctx_t;

static tdist_store_server_options_t server_opts(void) {
  tdist_store_server_options_t o = TDIST_STORE_SERVER_OPTIONS_INIT;
  o.host = "127.0.0.1";
  o.quiet = 1;
  return o;
}

/* ---- create ---- */

static tdist_store_server_t *g_created;

static int start_attempt(void *arg, long n) {
  ctx_t *c = arg;
  tdist_store_server_options_t o = server_opts();
  g_created = NULL;
  fault_arm(c->cls, n, c->mode);
  tdist_status_t st = tdist_store_server_create(&o, &g_created);
  fault_disarm();
  return st;
}

static void start_after(void *arg, long n, int rc) {
  ctx_t *c = arg;
  snprintf(c->prefix, sizeof c->prefix, "start-%s-%s-%ld", fault_class_name(c->cls),
           fault_mode_name(c->mode), n);
  if (rc != TDIST_OK) {
    int ok = c->cls == FAULT_ALLOC ? rc == TDIST_ERR_NO_MEMORY
                                   : rc == TDIST_ERR_SYSTEM || rc == TDIST_ERR_INVALID_USAGE;
    if (!ok || tdist_last_error()[0] == '\0' || g_created != NULL) {
      fprintf(stderr, "server create n=%ld (%s failed): status %s, message '%s', out %p\n", n,
              fault_last_failed_name(), tdist_status_name(rc), tdist_last_error(),
              (void *)g_created);
      exit(1);
    }
    tdist_store_server_options_t o = server_opts();
    CHECK_OK(tdist_store_server_create(&o, &g_created));
  }
  /* Created, absorbing the failure or afresh: it must serve. */
  session_must_pass(tdist_store_server_port(g_created), c->prefix);
  tdist_store_server_destroy(g_created);
  g_created = NULL;
}

/* ---- serving ---- */

typedef struct {
  int port;
  const char *key;
  tdist_status_t st;
} waiter_t;

static void *waiter_main(void *arg) {
  waiter_t *w = arg;
  fault_exempt_thread(1);
  tdist_store_t *s = NULL;
  w->st = session_connect(w->port, &s);
  if (w->st == TDIST_OK) w->st = tdist_store_wait(s, &w->key, 1, -1);
  tdist_store_destroy(s);
  return NULL;
}

static tdist_status_t serve_once(ctx_t *c, long n) {
  int port = tdist_store_server_port(c->srv);
  snprintf(c->prefix, sizeof c->prefix, "serve-%s-%s-%ld", fault_class_name(c->cls),
           fault_mode_name(c->mode), n);
  tdist_store_t *s = NULL;
  tdist_status_t st = session_connect(port, &s);
  if (st == TDIST_OK) st = session_run(s, c->prefix);
  if (st != TDIST_OK) goto done;

  /* A WAIT the server must park (wait_t, links) and answer when another connection SETs. */
  char wkey[128];
  snprintf(wkey, sizeof wkey, "%s/w", c->prefix);
  waiter_t w = {.port = port, .key = wkey, .st = TDIST_ERR_INTERNAL};
  tdist_store_server_stats_t before, now;
  tdist_store_server_stats(c->srv, &before);
  pthread_t th;
  CHECK(pthread_create(&th, NULL, waiter_main, &w) == 0);
  /* Until the server parks it (or drops it: the connection count falls back). */
  struct timespec ms = {0, 1000000};
  for (int i = 0; i < 20000; i++) {
    tdist_store_server_stats(c->srv, &now);
    if (now.waits_pending > before.waits_pending) break;
    if (now.connections_total > before.connections_total &&
        now.connections_open <= before.connections_open)
      break;
    nanosleep(&ms, NULL);
  }
  st = tdist_store_set(s, wkey, "w", 1);
  /* SET has no reply: a CHECK answered after it proves the server executed it. */
  int ready = 0;
  if (st == TDIST_OK) st = tdist_store_check(s, &w.key, 1, &ready);
  if (st != TDIST_OK) {
    /* The server dropped us, perhaps before the SET: release the waiter unarmed. */
    fault_disarm();
    tdist_store_t *s2 = NULL;
    CHECK_OK(session_connect(port, &s2));
    CHECK_OK(tdist_store_set(s2, wkey, "w", 1));
    tdist_store_destroy(s2);
  }
  pthread_join(th, NULL);
  if (st == TDIST_OK) st = w.st;
done:
  tdist_store_destroy(s);
  return st;
}

static int serve_attempt(void *arg, long n) {
  ctx_t *c = arg;
  fault_exempt_thread(1); /* count the server thread only */
  fault_arm(c->cls, n, c->mode);
  tdist_status_t st = serve_once(c, n);
  fault_disarm();
  fault_exempt_thread(0);
  return st;
}

static void serve_after(void *arg, long n, int rc) {
  ctx_t *c = arg;
  /* The server's only way to fail a request is to drop the connection. On ADD the protocol cannot
   * tell that from PyTorch's answer to a value that is not an integer (a hang-up too), so the
   * client reports INVALID_USAGE then, and says it refused that key; likewise a hang-up on the
   * QUEUE_LEN probe reads as a server without queues (NOT_AVAILABLE, for that handle only). */
  int add_drop = rc == TDIST_ERR_INVALID_USAGE && strstr(tdist_last_error(), "refused to add");
  int probe_drop =
      rc == TDIST_ERR_NOT_AVAILABLE && strstr(tdist_last_error(), "has no queue operations");
  if (rc != TDIST_OK && rc != TDIST_ERR_REMOTE && !add_drop && !probe_drop) {
    fprintf(stderr, "server serving n=%ld (%s failed): client saw %s: %s\n", n,
            fault_last_failed_name(), tdist_status_name(rc), tdist_last_error());
    exit(1);
  }
  char p[80];
  snprintf(p, sizeof p, "%s-fresh", c->prefix);
  session_must_pass(tdist_store_server_port(c->srv), p);
}

/* ---- accept paused (out of descriptors), then re-adding the listener fails too ---- */

typedef struct {
  int port;
  tdist_status_t st;
  char err[512];
} client_t;

static void *client_main(void *arg) {
  client_t *cl = arg;
  fault_exempt_thread(1);
  tdist_store_t *s = NULL;
  cl->st = session_connect(cl->port, &s);
  if (cl->st == TDIST_OK) cl->st = session_run(s, "paused");
  snprintf(cl->err, sizeof cl->err, "%s", s ? tdist_store_last_error(s) : tdist_last_error());
  tdist_store_destroy(s);
  return NULL;
}

static void accept_pause_case(void) {
  tdist_store_server_options_t o = server_opts();
  tdist_store_server_t *srv = NULL;
  CHECK_OK(tdist_store_server_create(&o, &srv));
  /* Of the server thread's accept4 and epoll_ctl calls: the first accept4 fails (EMFILE: accepts
   * pause for 100 ms), the listener's EPOLL_CTL_DEL passes, and its EPOLL_CTL_ADD when the pause
   * ends fails. The server must try again later rather than stop accepting for good. */
  static const char *const names[] = {"accept4", "epoll_ctl", NULL};
  static const long fail[] = {1, 3, 0};
  fault_arm_list(FAULT_SOCK, names, fail);
  client_t cl = {.port = tdist_store_server_port(srv)};
  client_main(&cl);
  long failed = fault_failed();
  const char *last = fault_last_failed_name();
  fault_disarm();
  fault_exempt_thread(0);
  printf("accept pause case: %ld calls failed (last %s), then the client got %s\n", failed, last,
         tdist_status_name(cl.st));
  CHECK_EQ_INT(failed, 2);
  CHECK(strcmp(last, "epoll_ctl") == 0);
  CHECK_OK_MSG(cl.st, cl.err);
  tdist_store_server_destroy(srv);
}

int main(void) {
  accept_pause_case();
  for (int cls = 0; cls < FAULT_NCLASSES; cls++) {
    for (int mode = 0; mode < 2; mode++) {
      ctx_t c = {.cls = (fault_class_t)cls, .mode = (fault_mode_t)mode};
      fault_loop_t start = {
          "store server create",      c.cls, c.mode, start_attempt, start_after, &c,
          cls == FAULT_ALLOC ? 2 : 5, 60};
      fault_loop_run(&start);

      /* Sticky failures while serving only starve every client until its deadline. */
      if (c.mode == FAULT_STICKY) continue;
      tdist_store_server_options_t o = server_opts();
      CHECK_OK(tdist_store_server_create(&o, &c.srv));
      fault_loop_t serve = {
          "store server serving",       c.cls, c.mode, serve_attempt, serve_after, &c,
          cls == FAULT_ALLOC ? 10 : 10, 60};
      fault_loop_run(&serve);
      tdist_store_server_destroy(c.srv);
    }
  }
  return 0;
}
