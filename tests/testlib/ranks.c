/* See ranks.h. */
#define _GNU_SOURCE
#include "ranks.h"
#include "clock.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

int tdist_test_run_ranks(int world, int64_t timeout_ms, tdist_test_rank_fn fn, void *arg) {
  /* Fork every rank before the parent starts any thread (the store server): a child forked while
   * another thread holds an allocator lock (ASan's, glibc's) can deadlock. The port reaches the
   * children through a pipe once the server listens. */
  pid_t *pids = calloc((size_t)world, sizeof *pids);
  int *status = calloc((size_t)world, sizeof *status);
  int *done = calloc((size_t)world, sizeof *done);
  int(*pipes)[2] = calloc((size_t)world, sizeof *pipes);
  fflush(stdout);
  fflush(stderr);
  for (int r = 0; r < world; r++) {
    if (pipe(pipes[r]) != 0) {
      perror("ranks: pipe");
      return 1;
    }
    pid_t pid = fork();
    if (pid == 0) {
      alarm((unsigned)(timeout_ms / 1000 + 5)); /* belt and braces if the parent dies */
      close(pipes[r][1]);
      int port = 0;
      if (read(pipes[r][0], &port, sizeof port) != (ssize_t)sizeof port || port <= 0) _exit(5);
      close(pipes[r][0]);
      int rc = fn(r, world, port, arg);
      fflush(stdout);
      fflush(stderr);
      _exit(rc);
    }
    close(pipes[r][0]);
    pids[r] = pid;
  }
  tdist_store_server_options_t so = TDIST_STORE_SERVER_OPTIONS_INIT;
  so.host = "127.0.0.1";
  so.quiet = 1;
  tdist_store_server_t *srv = NULL;
  int port = -1;
  if (tdist_store_server_create(&so, &srv) != TDIST_OK)
    fprintf(stderr, "ranks: cannot start store: %s\n", tdist_last_error());
  else
    port = tdist_store_server_port(srv);
  for (int r = 0; r < world; r++) {
    ssize_t w = write(pipes[r][1], &port, sizeof port); /* -1 makes the child exit 5 */
    (void)w;
    close(pipes[r][1]);
  }
  free(pipes);
  int64_t deadline = now_ms() + timeout_ms;
  int left = world, failed = 0;
  while (left > 0) {
    int st;
    pid_t pid = waitpid(-1, &st, WNOHANG);
    if (pid > 0) {
      for (int r = 0; r < world; r++) {
        if (pids[r] == pid) {
          done[r] = 1;
          status[r] = st;
          left--;
        }
      }
      continue;
    }
    if (now_ms() > deadline) {
      fprintf(stderr, "ranks: timeout after %lld ms; ranks still running:", (long long)timeout_ms);
      for (int r = 0; r < world; r++)
        if (!done[r]) fprintf(stderr, " %d", r);
      fprintf(stderr, "\n");
      for (int r = 0; r < world; r++)
        if (!done[r]) kill(pids[r], SIGKILL);
      for (int r = 0; r < world; r++)
        if (!done[r]) waitpid(pids[r], &status[r], 0);
      failed = 1;
      break;
    }
    usleep(2000);
  }
  for (int r = 0; r < world; r++) {
    if (!done[r]) continue;
    if (WIFEXITED(status[r]) && WEXITSTATUS(status[r]) == 0) continue;
    failed = 1;
    if (WIFEXITED(status[r]))
      fprintf(stderr, "ranks: rank %d exited with %d\n", r, WEXITSTATUS(status[r]));
    else
      fprintf(stderr, "ranks: rank %d killed by signal %d\n", r, WTERMSIG(status[r]));
  }
  free(pids);
  free(status);
  free(done);
  tdist_store_server_destroy(srv);
  return failed;
}

tdist_pg_t *tdist_test_init_pg(int rank, int world, int store_port, int64_t timeout_ms,
                               tdist_store_t **store) {
  tdist_tcp_store_options_t co = TDIST_TCP_STORE_OPTIONS_INIT;
  co.host = "127.0.0.1";
  co.port = store_port;
  co.connect_timeout_ms = timeout_ms;
  co.timeout_ms = timeout_ms;
  if (tdist_tcp_store_connect(&co, store) != TDIST_OK) {
    fprintf(stderr, "rank %d: store connect: %s\n", rank, tdist_last_error());
    _exit(3);
  }
  tdist_pg_options_t po = TDIST_PG_OPTIONS_INIT;
  po.store = *store;
  po.rank = rank;
  po.world_size = world;
  po.timeout_ms = timeout_ms;
  tdist_pg_t *pg = NULL;
  if (tdist_init_process_group(&po, &pg) != TDIST_OK) {
    fprintf(stderr, "rank %d: init_process_group: %s\n", rank, tdist_last_error());
    _exit(4);
  }
  return pg;
}

uint64_t tdist_test_rand(uint64_t seed, uint64_t rank, uint64_t i) {
  uint64_t z = seed * 0x9E3779B97F4A7C15ull ^ (rank + 1) * 0xBF58476D1CE4E5B9ull ^
               (i + 1) * 0x94D049BB133111EBull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
