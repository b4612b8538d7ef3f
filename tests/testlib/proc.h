/* Child processes in tests: waiting with a deadline, and checking how a child ended, with a
 * message naming the child and what it did instead. Header-only. */
#ifndef TDIST_TESTLIB_PROC_H
#define TDIST_TESTLIB_PROC_H

#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/testlib/clock.h"

/* Writes how a waitpid status ended ("exited with 3", "killed by signal 9 (Killed)"). */
static inline const char *test_wait_text(int st, char *buf, size_t cap) {
  if (WIFEXITED(st))
    snprintf(buf, cap, "exited with %d", WEXITSTATUS(st));
  else if (WIFSIGNALED(st))
    snprintf(buf, cap, "killed by signal %d (%s)", WTERMSIG(st), strsignal(WTERMSIG(st)));
  else
    snprintf(buf, cap, "status 0x%x", st);
  return buf;
}

/* Waits for pid for at most timeout_ms (< 0: no limit); on expiry SIGKILLs it and reaps it.
 * Returns the waitpid status, or -1 (with a message) when it had to be killed or could not be
 * waited for. */
static inline int test_wait(pid_t pid, int64_t timeout_ms) {
  int st = 0;
  int64_t deadline = now_ms() + timeout_ms;
  for (;;) {
    pid_t r = waitpid(pid, &st, timeout_ms < 0 ? 0 : WNOHANG);
    if (r == pid) return st;
    if (r < 0) {
      fprintf(stderr, "waitpid(%d): %s\n", (int)pid, strerror(errno));
      return -1;
    }
    if (now_ms() > deadline) {
      fprintf(stderr, "process %d still running after %lld ms: killed\n", (int)pid,
              (long long)timeout_ms);
      kill(pid, SIGKILL);
      waitpid(pid, &st, 0);
      return -1;
    }
    sleep_ms(2);
  }
}

static inline int test_expect_end_(pid_t pid, int want_exit, int want_sig, const char *fmt,
                                   va_list ap) {
  int st = test_wait(pid, -1);
  if (st != -1 && want_sig == 0 && WIFEXITED(st) && WEXITSTATUS(st) == want_exit) return 0;
  if (st != -1 && want_sig != 0 && WIFSIGNALED(st) && WTERMSIG(st) == want_sig) return 0;
  char what[96];
  vfprintf(stderr, fmt, ap);
  if (want_sig)
    fprintf(stderr, ": expected death by signal %d (%s), ", want_sig, strsignal(want_sig));
  else
    fprintf(stderr, ": expected exit status %d, ", want_exit);
  fprintf(stderr, "%s\n",
          st == -1 ? "could not wait for it" : test_wait_text(st, what, sizeof what));
  return 1;
}

/* Reaps pid: 0 when it exited with want, else 1 after a message "<who>: expected ...". */
static inline int test_expect_exit(pid_t pid, int want, const char *who, ...)
    __attribute__((format(printf, 3, 4)));
static inline int test_expect_exit(pid_t pid, int want, const char *who, ...) {
  va_list ap;
  va_start(ap, who);
  int rc = test_expect_end_(pid, want, 0, who, ap);
  va_end(ap);
  return rc;
}

/* Reaps pid: 0 when signal sig killed it, else 1 after a message "<who>: expected ...". */
static inline int test_expect_killed(pid_t pid, int sig, const char *who, ...)
    __attribute__((format(printf, 3, 4)));
static inline int test_expect_killed(pid_t pid, int sig, const char *who, ...) {
  va_list ap;
  va_start(ap, who);
  int rc = test_expect_end_(pid, 0, sig, who, ap);
  va_end(ap);
  return rc;
}

#endif
