/* The store servers the benchmark compares: ours (in-process through tdist_store_server_create, or
 * the tdist-store binary as a child process) and PyTorch 1.13's TCPStore master (a child
 * /usr/bin/python3). Each one listens on an ephemeral loopback port and exposes a CPU clock so the
 * benchmark can report server CPU per operation.
 *
 * Children are started with PR_SET_PDEATHSIG and the torch child also exits when its stdin
 * reaches EOF, so no server outlives a crashed or interrupted benchmark. */
#ifndef TDIST_BENCH_STORE_SERVERS_H
#define TDIST_BENCH_STORE_SERVERS_H

#include <stdint.h>
#include <sys/types.h>

#include "tdist/tdist.h"

#define BENCH_SERVER_MAX_TIDS 16

typedef enum { BENCH_SERVER_TDIST = 0, BENCH_SERVER_TORCH = 1 } bench_server_kind_t;

typedef struct {
  bench_server_kind_t kind;
  int port;
  pid_t pid;                    /* child process, 0 when in-process */
  int stdin_fd;                 /* torch: write end of its stdin (closing it stops it), else -1 */
  tdist_store_server_t *inproc; /* in-process server, else NULL */
  pid_t tids[BENCH_SERVER_MAX_TIDS]; /* threads tdist_store_server_create started */
  int ntids;
  char tmpdir[256]; /* binary: directory of the port file, "" if none */
} bench_server_t;

/* Each returns 0 and fills *s, or -1 after printing why on stderr. */
int bench_server_start_inproc(bench_server_t *s);
int bench_server_start_binary(bench_server_t *s, const char *path);
int bench_server_start_torch(bench_server_t *s, const char *python);

/* Stops the server (SIGTERM, then SIGKILL after 5 s) and releases everything. Idempotent. */
void bench_server_stop(bench_server_t *s);

/* CPU time the server has used so far, in ns; -1 when it cannot be read. */
int64_t bench_server_cpu_ns(const bench_server_t *s);

/* CPU time of every CPU of the machine that was not idle (/proc/stat, jiffy resolution), and of
 * this process, in ns; -1 when unreadable. Their difference shows how much of the machine other
 * processes took during a measurement. */
int64_t bench_machine_busy_ns(void);
int64_t bench_self_cpu_ns(void);

/* Monotonic clock in ns. */
int64_t bench_now_ns(void);

#endif
