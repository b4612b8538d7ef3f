/* Countdown fault injection (fault.h), by link-time wrapping: the `fault` target's linkopts pass
 * -Wl,--wrap=malloc (and the rest) to every binary that depends on it, so the linker sends each
 * call to malloc in our objects to __wrap_malloc here, and __real_malloc reaches libc (or ASan's
 * interceptor, which keeps leak checking intact).
 *
 * Why wrapping rather than a seam macro in runtime/common: the runtime's sources, and the library
 * that ships, stay exactly as they are; the production library cannot carry the seam, because only
 * testonly binaries link this target; and it catches every call site, including ones added later
 * by someone who does not know the seam exists. Only calls our code makes are wrapped: libc's own
 * allocations (inside strdup, fopen, getaddrinfo) and shared libraries' (libyaml) go to the real
 * functions directly, because --wrap only rewrites references in the objects being linked.
 *
 * Must never allocate, log or take a lock on the wrapped paths: it runs inside every malloc. */
#define _GNU_SOURCE
#include "tests/testlib/fault.h"

#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>

static atomic_int g_armed = -1; /* the armed class, -1 = none */
static atomic_long g_target;    /* fail call number g_target (1-based); 0 = count only */
static atomic_int g_sticky;
static atomic_long g_calls, g_failed;
static const char *_Atomic g_last_name = "";
static _Thread_local int t_exempt, t_only_next;
static _Thread_local char t_token;         /* its address names the thread */
static const char *_Atomic g_owner = NULL; /* only this thread's calls count, when set */
static const char *const *_Atomic g_names; /* only calls to these count, when set */
static const long *_Atomic g_list;         /* fail exactly these call numbers, when set */

#define SITE_SLOTS 4096
static _Atomic uintptr_t g_sites[FAULT_NCLASSES][SITE_SLOTS];
static atomic_long g_nsites[FAULT_NCLASSES];

static void note_site(int cls, uintptr_t ra) {
  size_t h = (size_t)((ra * 0x9E3779B97F4A7C15ull) >> 52) % SITE_SLOTS;
  for (size_t i = 0; i < SITE_SLOTS; i++) {
    _Atomic uintptr_t *slot = &g_sites[cls][(h + i) % SITE_SLOTS];
    uintptr_t cur = atomic_load(slot);
    if (cur == ra) return;
    if (cur == 0) {
      uintptr_t zero = 0;
      if (atomic_compare_exchange_strong(slot, &zero, ra)) {
        atomic_fetch_add(&g_nsites[cls], 1);
        return;
      }
      if (zero == ra) return;
    }
  }
}

/* 1 if this call must fail. */
static int should_fail(int cls, const char *name, void *ra) {
  if (atomic_load_explicit(&g_armed, memory_order_relaxed) != cls || t_exempt) return 0;
  const char *owner = atomic_load(&g_owner);
  if (owner && owner != &t_token) return 0;
  const char *const *names = atomic_load(&g_names);
  if (names) {
    while (*names && strcmp(*names, name) != 0) names++;
    if (!*names) return 0;
  }
  note_site(cls, (uintptr_t)ra);
  long k = atomic_fetch_add(&g_calls, 1) + 1;
  long n = atomic_load(&g_target);
  const long *list = atomic_load(&g_list);
  if (list) {
    while (*list && *list < k) list++;
    if (*list != k) return 0;
  } else if (n == 0 || k < n || (k > n && !atomic_load(&g_sticky))) {
    return 0;
  }
  atomic_fetch_add(&g_failed, 1);
  atomic_store(&g_last_name, name);
  return 1;
}

static void arm(fault_class_t cls, const char *const *names, const long *list, long n,
                fault_mode_t mode) {
  atomic_store(&g_armed, -1);
  atomic_store(&g_names, names);
  atomic_store(&g_list, list);
  atomic_store(&g_calls, 0);
  atomic_store(&g_failed, 0);
  atomic_store(&g_last_name, "");
  atomic_store(&g_target, n);
  atomic_store(&g_sticky, mode == FAULT_STICKY);
  atomic_store(&g_owner, t_only_next ? &t_token : NULL);
  t_only_next = 0;
  atomic_store(&g_armed, (int)cls);
}

void fault_arm(fault_class_t cls, long n, fault_mode_t mode) { arm(cls, NULL, NULL, n, mode); }

void fault_arm_list(fault_class_t cls, const char *const *names, const long *fail) {
  arm(cls, names, fail, 0, FAULT_ONCE);
}

void fault_disarm(void) { atomic_store(&g_armed, -1); }
long fault_calls(void) { return atomic_load(&g_calls); }
long fault_failed(void) { return atomic_load(&g_failed); }
long fault_sites(fault_class_t cls) { return atomic_load(&g_nsites[cls]); }
const char *fault_last_failed_name(void) { return atomic_load(&g_last_name); }
void fault_exempt_thread(int on) { t_exempt = on; }
void fault_only_this_thread_next(int on) { t_only_next = on; }

void fault_reset_sites(void) {
  for (int c = 0; c < FAULT_NCLASSES; c++) {
    for (size_t i = 0; i < SITE_SLOTS; i++) atomic_store(&g_sites[c][i], 0);
    atomic_store(&g_nsites[c], 0);
  }
}

#define RA __builtin_return_address(0)
#define FAIL_ALLOC(name) \
  if (should_fail(FAULT_ALLOC, name, RA)) return errno = ENOMEM, NULL
#define FAIL_SOCK(name, err) \
  if (should_fail(FAULT_SOCK, name, RA)) return errno = (err), -1

/* ---- allocation ---- */
void *__real_malloc(size_t n);
void *__real_calloc(size_t m, size_t n);
void *__real_realloc(void *p, size_t n);
char *__real_strdup(const char *s);
char *__real_strndup(const char *s, size_t n);

void *__wrap_malloc(size_t n) {
  FAIL_ALLOC("malloc");
  return __real_malloc(n);
}
void *__wrap_calloc(size_t m, size_t n) {
  FAIL_ALLOC("calloc");
  return __real_calloc(m, n);
}
void *__wrap_realloc(void *p, size_t n) {
  FAIL_ALLOC("realloc"); /* like a real failure: p is left as it was */
  return __real_realloc(p, n);
}
char *__wrap_strdup(const char *s) {
  FAIL_ALLOC("strdup");
  return __real_strdup(s);
}
char *__wrap_strndup(const char *s, size_t n) {
  FAIL_ALLOC("strndup");
  return __real_strndup(s, n);
}

/* ---- sockets: each fails with an errno its man page lists, chosen to be a hard error (not
 * EINTR/EAGAIN, which callers retry) except epoll_wait, whose only run-time error is EINTR ---- */
int __real_socket(int d, int t, int p);
int __real_bind(int fd, const struct sockaddr *a, socklen_t l);
int __real_listen(int fd, int b);
int __real_accept4(int fd, struct sockaddr *a, socklen_t *l, int f);
int __real_connect(int fd, const struct sockaddr *a, socklen_t l);
ssize_t __real_send(int fd, const void *b, size_t n, int f);
ssize_t __real_recv(int fd, void *b, size_t n, int f);
ssize_t __real_sendmsg(int fd, const struct msghdr *m, int f);
ssize_t __real_readv(int fd, const struct iovec *v, int n);
int __real_poll(struct pollfd *p, nfds_t n, int t);
int __real_epoll_create1(int f);
int __real_epoll_ctl(int ep, int op, int fd, struct epoll_event *e);
int __real_epoll_wait(int ep, struct epoll_event *e, int n, int t);
int __real_eventfd(unsigned v, int f);
int __real_getsockname(int fd, struct sockaddr *a, socklen_t *l);
int __real_getaddrinfo(const char *h, const char *s, const struct addrinfo *hi,
                       struct addrinfo **r);

int __wrap_socket(int d, int t, int p) {
  FAIL_SOCK("socket", EMFILE);
  return __real_socket(d, t, p);
}
int __wrap_bind(int fd, const struct sockaddr *a, socklen_t l) {
  FAIL_SOCK("bind", EADDRINUSE);
  return __real_bind(fd, a, l);
}
int __wrap_listen(int fd, int b) {
  FAIL_SOCK("listen", EADDRINUSE);
  return __real_listen(fd, b);
}
int __wrap_accept4(int fd, struct sockaddr *a, socklen_t *l, int f) {
  FAIL_SOCK("accept4", EMFILE);
  return __real_accept4(fd, a, l, f);
}
int __wrap_connect(int fd, const struct sockaddr *a, socklen_t l) {
  FAIL_SOCK("connect", ECONNREFUSED);
  return __real_connect(fd, a, l);
}
ssize_t __wrap_send(int fd, const void *b, size_t n, int f) {
  FAIL_SOCK("send", ECONNRESET);
  return __real_send(fd, b, n, f);
}
ssize_t __wrap_recv(int fd, void *b, size_t n, int f) {
  FAIL_SOCK("recv", ECONNRESET);
  return __real_recv(fd, b, n, f);
}
ssize_t __wrap_sendmsg(int fd, const struct msghdr *m, int f) {
  FAIL_SOCK("sendmsg", ECONNRESET);
  return __real_sendmsg(fd, m, f);
}
ssize_t __wrap_readv(int fd, const struct iovec *v, int n) {
  FAIL_SOCK("readv", ECONNRESET);
  return __real_readv(fd, v, n);
}
int __wrap_poll(struct pollfd *p, nfds_t n, int t) {
  FAIL_SOCK("poll", ENOMEM);
  return __real_poll(p, n, t);
}
int __wrap_epoll_create1(int f) {
  FAIL_SOCK("epoll_create1", EMFILE);
  return __real_epoll_create1(f);
}
int __wrap_epoll_ctl(int ep, int op, int fd, struct epoll_event *e) {
  FAIL_SOCK("epoll_ctl", ENOMEM);
  return __real_epoll_ctl(ep, op, fd, e);
}
int __wrap_epoll_wait(int ep, struct epoll_event *e, int n, int t) {
  FAIL_SOCK("epoll_wait", EINTR);
  return __real_epoll_wait(ep, e, n, t);
}
int __wrap_eventfd(unsigned v, int f) {
  FAIL_SOCK("eventfd", EMFILE);
  return __real_eventfd(v, f);
}
int __wrap_getsockname(int fd, struct sockaddr *a, socklen_t *l) {
  FAIL_SOCK("getsockname", ENOBUFS);
  return __real_getsockname(fd, a, l);
}
int __wrap_getaddrinfo(const char *h, const char *s, const struct addrinfo *hi,
                       struct addrinfo **r) {
  if (should_fail(FAULT_SOCK, "getaddrinfo", RA)) return EAI_MEMORY;
  return __real_getaddrinfo(h, s, hi, r);
}

/* ---- the loop driver (runs unarmed: may allocate and print) ---- */
#include <signal.h>
#include <stdio.h>
#include <unistd.h>

static const fault_loop_t *g_loop;
static volatile sig_atomic_t g_loop_n;

static void on_deadline(int sig) {
  (void)sig;
  char msg[200];
  int len = snprintf(msg, sizeof msg, "fault loop %s (%s, %s): attempt n=%ld hung past %d s\n",
                     g_loop->name, fault_class_name(g_loop->cls), fault_mode_name(g_loop->mode),
                     (long)g_loop_n, g_loop->deadline_s ? g_loop->deadline_s : 60);
  if (len > 0) (void)!write(STDERR_FILENO, msg, (size_t)len);
  _exit(3);
}

const char *fault_class_name(fault_class_t cls) { return cls == FAULT_ALLOC ? "alloc" : "sock"; }
const char *fault_mode_name(fault_mode_t mode) { return mode == FAULT_ONCE ? "once" : "sticky"; }

long fault_loop_run(const fault_loop_t *l) {
  g_loop = l;
  struct sigaction sa = {.sa_handler = on_deadline};
  sigaction(SIGALRM, &sa, NULL);
  fault_reset_sites();
  long failures = 0, absorbed = 0;
  for (long n = 1;; n++) {
    g_loop_n = n;
    alarm((unsigned)(l->deadline_s ? l->deadline_s : 60));
    int rc = l->attempt(l->arg, n);
    fault_disarm();
    long failed = fault_failed(), calls = fault_calls();
    const char *what = fault_last_failed_name();
    if (failed == 0 && rc != 0) {
      fprintf(stderr, "fault loop %s: n=%ld: failed (rc %d) with no fault injected (%ld calls)\n",
              l->name, n, rc, calls);
      exit(1);
    }
    if (failed > 0) {
      if (rc != 0)
        failures++;
      else
        absorbed++;
    }
    if (getenv("TDIST_FAULT_VERBOSE"))
      fprintf(stderr, "  %s %s n=%ld: %s failed -> rc %d\n", l->name, fault_mode_name(l->mode), n,
              failed ? what : "(nothing)", rc);
    l->after(l->arg, n, rc);
    alarm(0);
    if (failed == 0) {
      long points = n - 1;
      printf(
          "fault loop %-28s %-5s %-6s: %4ld points, %3ld sites; %ld clean failures, "
          "%ld absorbed\n",
          l->name, fault_class_name(l->cls), fault_mode_name(l->mode), points, fault_sites(l->cls),
          failures, absorbed);
      fflush(stdout);
      if (points < l->min_points) {
        fprintf(stderr,
                "fault loop %s: only %ld %s points (expected at least %ld): is the seam "
                "still wired?\n",
                l->name, points, fault_class_name(l->cls), l->min_points);
        exit(1);
      }
      return points;
    }
  }
}
