/* Test driver for dns_test.sh: runs agent_resolve (and optionally agent_master_name) once, so that
 * the shell test exercises the real code against a real DNS server, and prints one line:
 *   ok name=N ip=A attempts=X failures=Y elapsed_ms=T              (exit 0)
 *   fail rc=R name=N attempts=X failures=Y elapsed_ms=T err=TEXT   (exit 1; 2 = usage/setup)
 *
 * usage: resolve_driver [--timeout-ms MS] [--confirm] [--listen-after MS]
 *                       (NAME [PORT] | --master-from-host HOSTNAME [--scheme S])
 *   --listen-after MS   bind 127.0.0.1:0 now, listen() only after MS (the port is PORT; implies
 *                       --confirm), so early connects are refused
 *   --master-from-host  NAME = agent_master_name() for that hostname, everything else derived
 *                       (job from the hostname, namespace and domain from /etc/resolv.conf) */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "operator-agent/discovery/discovery.h"
#include "tests/testlib/clock.h"

static int g_fd = -1, g_listen_after = -1;

static void *listen_later(void *arg) {
  (void)arg;
  usleep((useconds_t)g_listen_after * 1000);
  if (listen(g_fd, 16) != 0) perror("listen");
  return NULL;
}

static int usage(void) {
  fprintf(stderr,
          "usage: resolve_driver [--timeout-ms MS] [--confirm] [--listen-after MS] "
          "(NAME [PORT] | --master-from-host HOSTNAME [--scheme S])\n");
  return 2;
}

int main(int argc, char **argv) {
  int64_t timeout = 10000;
  int confirm = 0, port = 80;
  const char *name = NULL, *master_host = NULL;
  agent_cfg_t cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.node_rank = -1;
  cfg.scheme = AGENT_SCHEME_INDEXED_JOB;
  int i = 1;
  for (; i < argc && strncmp(argv[i], "--", 2) == 0; i++) {
    if (!strcmp(argv[i], "--confirm")) {
      confirm = 1;
    } else if (i + 1 < argc && !strcmp(argv[i], "--timeout-ms")) {
      timeout = strtoll(argv[++i], NULL, 10);
    } else if (i + 1 < argc && !strcmp(argv[i], "--listen-after")) {
      g_listen_after = atoi(argv[++i]);
      confirm = 1;
    } else if (i + 1 < argc && !strcmp(argv[i], "--master-from-host")) {
      master_host = argv[++i];
    } else if (i + 1 < argc && !strcmp(argv[i], "--scheme")) {
      const char *s = argv[++i];
      cfg.scheme = !strcmp(s, "kubeflow")  ? AGENT_SCHEME_KUBEFLOW
                   : !strcmp(s, "jobset")  ? AGENT_SCHEME_JOBSET
                   : !strcmp(s, "volcano") ? AGENT_SCHEME_VOLCANO
                                           : AGENT_SCHEME_INDEXED_JOB;
    } else {
      return usage();
    }
  }
  char master[300], err[1024];
  if (master_host != NULL) {
    char *envp[] = {NULL}; /* no POD_NAMESPACE: the namespace comes from /etc/resolv.conf */
    if (agent_master_name(&cfg, envp, master_host, NULL, master, sizeof master, err, sizeof err) !=
        0) {
      printf("fail rc=-1 name=- attempts=0 failures=0 elapsed_ms=0 err=%s\n", err);
      return 1;
    }
    name = master;
  } else {
    if (i >= argc) return usage();
    name = argv[i++];
  }
  if (i < argc) port = atoi(argv[i++]);
  if (g_listen_after >= 0) {
    g_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    if (g_fd < 0 || bind(g_fd, (struct sockaddr *)&a, sizeof a) != 0 ||
        getsockname(g_fd, (struct sockaddr *)&a, &len) != 0) {
      perror("bind 127.0.0.1:0");
      return 2;
    }
    port = ntohs(a.sin_port);
    pthread_t t;
    if (pthread_create(&t, NULL, listen_later, NULL) != 0) return 2;
    pthread_detach(t);
  }
  agent_resolve_stats_t st = {0, 0};
  char ip[64];
  int64_t t0 = now_ms();
  int rc = agent_resolve(name, port, confirm, t0 + timeout, NULL, NULL, ip, sizeof ip, &st, err,
                         sizeof err);
  int64_t took = now_ms() - t0;
  if (rc == 0) {
    printf("ok name=%s ip=%s attempts=%" PRIu64 " failures=%" PRIu64 " elapsed_ms=%" PRId64 "\n",
           name, ip, st.attempts, st.failures, took);
    return 0;
  }
  printf("fail rc=%d name=%s attempts=%" PRIu64 " failures=%" PRIu64 " elapsed_ms=%" PRId64
         " err=%s\n",
         rc, name, st.attempts, st.failures, took, err);
  return 1;
}
