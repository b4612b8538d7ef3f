/* A store server in a child process, for the tests that read what the server costs from /proc:
 * its resident memory (VmHWM, VmRSS) and its CPU time. The child serves until it is stopped; a
 * server that crashed or was killed during the test fails it. */
#ifndef TDIST_TESTS_STORE_SERVER_PROC_H
#define TDIST_TESTS_STORE_SERVER_PROC_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* SANITIZED: built with ASan or TSan (they reserve more address space than the cap allows). */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define SANITIZED 1
#endif
#endif
#ifndef SANITIZED
#define SANITIZED 0
#endif

typedef struct {
  pid_t pid;
  int port;
} server_proc_t;

/* Forks a server on 127.0.0.1 with these budgets (0 = the default) and returns once it listens.
 * Outside the sanitizers the child runs with a 4 GiB address-space cap, so a server that
 * amplifies fails a check instead of taking the machine's memory. */
server_proc_t spawn_server(size_t conn_budget, size_t server_budget);

/* The server must still be running (no crash, no OOM kill); then it is stopped. */
void stop_server(server_proc_t *sp);

/* A VmHWM/VmRSS/... field of /proc/<pid>/status, in bytes. */
size_t proc_mem(pid_t pid, const char *field);

/* User plus system CPU time the process has used, in milliseconds (/proc/<pid>/stat). */
double proc_cpu_ms(pid_t pid);

/* CPU time all threads of the process have run, in nanoseconds (the first field of each
 * /proc/<pid>/task/<tid>/schedstat): precise where proc_cpu_ms counts clock ticks. */
int64_t proc_cpu_ns(pid_t pid);

#endif
