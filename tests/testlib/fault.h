/* Countdown fault injection for allocation and socket calls (SQLite's simulated malloc failure).
 * A binary that links //tests/testlib:fault has every call our code makes to malloc, calloc,
 * realloc, strdup, strndup and to the socket layer (socket, bind, listen, accept4, connect, send,
 * recv, sendmsg, readv, poll, epoll_create1, epoll_ctl, epoll_wait, eventfd, getsockname,
 * getaddrinfo) routed through this library by the linker (-Wl,--wrap). Unarmed, every call passes
 * straight through. Armed, calls of the armed class are counted and the n-th one fails the way the
 * real call fails (NULL + ENOMEM; -1 + an errno the call can really return; EAI_MEMORY).
 * Never use it outside tests: the production library does not carry it (see fault.c). */
#ifndef TDIST_TESTLIB_FAULT_H
#define TDIST_TESTLIB_FAULT_H

#include <stddef.h>

typedef enum {
  FAULT_ALLOC = 0, /* malloc calloc realloc strdup strndup */
  FAULT_SOCK = 1,  /* the socket calls listed above */
  FAULT_NCLASSES
} fault_class_t;

typedef enum {
  FAULT_ONCE = 0,   /* the n-th call fails, every later one passes (a transient failure) */
  FAULT_STICKY = 1, /* the n-th call and every later one fail (memory stays exhausted) */
} fault_mode_t;

/* Resets the counters and arms class `cls`: counting from the next call, call number n (1-based)
 * fails. n = 0 counts calls without failing any. Any thread; calls from every thread count, except
 * threads that called fault_exempt_thread(1). */
void fault_arm(fault_class_t cls, long n, fault_mode_t mode);

/* on = 1: the next fault_arm from this thread counts this thread's calls only (a sticky failure
 * that would otherwise starve a server thread in the same process). Reset by each fault_arm. */
void fault_only_this_thread_next(int on);

/* Like fault_arm, but only calls to the functions in `names` (NULL-terminated, e.g.
 * {"accept4", "epoll_ctl", NULL}; NULL = all of the class) count, and exactly the calls numbered
 * in `fail` (increasing, 0-terminated) fail: to reach a failure that follows another one. Both
 * arrays are kept by the caller until the next arm. */
void fault_arm_list(fault_class_t cls, const char *const *names, const long *fail);

/* Stops failing and counting (the counters keep their values until the next arm). */
void fault_disarm(void);

/* Calls of the armed class seen since fault_arm, and how many of them were made to fail. */
long fault_calls(void);
long fault_failed(void);

/* Distinct call sites (return addresses) of the armed class seen since the last fault_reset_sites,
 * over every arm in between: what a loop covered. */
long fault_sites(fault_class_t cls);
void fault_reset_sites(void);

/* on = 1: calls from this thread pass through uncounted (a test's client driving a server in the
 * same process). */
void fault_exempt_thread(int on);

/* "malloc" etc. of the call that failed most recently, "" if none did. */
const char *fault_last_failed_name(void);

/* The loop: for n = 1, 2, 3, ...: attempt(arg, n) runs the code path once and arms the fault with
 * fault_arm(cls, n, mode) around the part under test (it may set things up unarmed first); the
 * driver disarms after it. If the armed call came (fault_failed() > 0), after(arg, n, rc) runs
 * unarmed: it checks that rc is a clean failure (or 0: the failure was absorbed), cleans up and
 * proves that a fresh attempt succeeds. The loop ends with the first n whose armed call never came:
 * that attempt must return 0 (after runs then too). Every attempt runs under a deadline that kills
 * the test with a message naming n (a hang). Prints one line: points (= calls of the class in the
 * completed path, each made to fail once) and distinct call sites, and fails the test (exit 1)
 * below min_points. Returns the points. */
typedef struct {
  const char *name;
  fault_class_t cls;
  fault_mode_t mode;
  int (*attempt)(void *arg, long n);
  void (*after)(void *arg, long n, int rc);
  void *arg;
  long min_points;
  int deadline_s; /* per attempt; 0 = 60 */
} fault_loop_t;

long fault_loop_run(const fault_loop_t *loop);

/* "alloc" / "sock"; "once" / "sticky". */
const char *fault_class_name(fault_class_t cls);
const char *fault_mode_name(fault_mode_t mode);

#endif
