/* A store server in a child process (see server_proc.h). */
#define _GNU_SOURCE
#include "server_proc.h"

#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "proc.h"
#include "server_wire.h"
#include "tdist/tdist.h"

/* Forks a server with these budgets (0 = default) and returns once it listens. */
server_proc_t spawn_server(size_t conn_budget, size_t server_budget) {
  int pfd[2];
  CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pfd) == 0);
  pid_t pid = fork();
  CHECK(pid >= 0);
  if (pid == 0) {
    close(pfd[0]);
    if (!SANITIZED) {
      struct rlimit rl = {(rlim_t)4 << 30, (rlim_t)4 << 30};
      setrlimit(RLIMIT_AS, &rl);
    }
    tdist_store_server_options_t o = TDIST_STORE_SERVER_OPTIONS_INIT;
    o.host = "127.0.0.1";
    o.max_connection_bytes = conn_budget;
    o.max_server_bytes = server_budget;
    tdist_store_server_t *s = NULL;
    if (tdist_store_server_create(&o, &s) != TDIST_OK) {
      fprintf(stderr, "child: server create: %s\n", tdist_last_error());
      _exit(3);
    }
    int port = tdist_store_server_port(s);
    if (write(pfd[1], &port, sizeof port) != (ssize_t)sizeof port) _exit(4);
    close(pfd[1]);
    for (;;) pause();
  }
  close(pfd[1]);
  server_proc_t sp = {pid, 0};
  if (read_full(pfd[0], &sp.port, sizeof sp.port, 10000) != 0)
    TEST_FAIL("the server child (pid %d) did not report its port", (int)pid);
  close(pfd[0]);
  return sp;
}

/* The server must still be running (no crash, no OOM kill); then it is stopped. */
void stop_server(server_proc_t *sp) {
  int st;
  pid_t r = waitpid(sp->pid, &st, WNOHANG);
  if (r == sp->pid) {
    char buf[64];
    TEST_FAIL("the server child ended during the test: %s", test_wait_text(st, buf, sizeof buf));
  }
  kill(sp->pid, SIGKILL);
  waitpid(sp->pid, &st, 0);
}

/* A VmHWM/VmRSS field of /proc/<pid>/status, in bytes. */
size_t proc_mem(pid_t pid, const char *field) {
  char path[64], line[256];
  snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
  FILE *f = fopen(path, "r");
  if (!f) TEST_FAIL("open %s: %s", path, strerror(errno));
  size_t kib = 0, flen = strlen(field);
  int found = 0;
  while (fgets(line, sizeof line, f)) {
    if (strncmp(line, field, flen) == 0 && line[flen] == ':') {
      kib = (size_t)strtoull(line + flen + 1, NULL, 10);
      found = 1;
    }
  }
  fclose(f);
  if (!found) TEST_FAIL("%s has no %s line", path, field);
  return kib * 1024;
}

double proc_cpu_ms(pid_t pid) {
  char path[64], buf[1024];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  FILE *f = fopen(path, "r");
  if (!f) TEST_FAIL("open %s: %s", path, strerror(errno));
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = '\0';
  /* Fields after the command name, which is in parentheses and may hold spaces: state is field
   * 3, utime 14, stime 15 (proc(5)). */
  char *p = strrchr(buf, ')');
  unsigned long long ut = 0, st = 0;
  if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) != 2)
    TEST_FAIL("%s: cannot read utime and stime from '%s'", path, buf);
  return (double)(ut + st) * 1000.0 / (double)sysconf(_SC_CLK_TCK);
}

int64_t proc_cpu_ns(pid_t pid) {
  char path[96], buf[128];
  snprintf(path, sizeof path, "/proc/%d/task", (int)pid);
  DIR *d = opendir(path);
  if (!d) TEST_FAIL("open %s: %s", path, strerror(errno));
  int64_t sum = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.') continue;
    snprintf(path, sizeof path, "/proc/%d/task/%.16s/schedstat", (int)pid, e->d_name);
    FILE *f = fopen(path, "r");
    if (!f) continue; /* the thread ended between readdir and open */
    long long ns = 0;
    if (fgets(buf, sizeof buf, f) && sscanf(buf, "%lld", &ns) == 1) sum += ns;
    fclose(f);
  }
  closedir(d);
  return sum;
}
