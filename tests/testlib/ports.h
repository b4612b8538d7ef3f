/* A TCP port for a test to hand to a process that binds it later (rank 0 hosting the store on
 * MASTER_PORT, a tcp:// init method): free on [::] (dual stack, like the store server) when
 * chosen, and below the kernel's ephemeral range, so that no client socket of another test on a
 * busy machine takes it in between, as a port from bind(0) can. The C twin of ports.sh. */
#ifndef TDIST_TESTLIB_PORTS_H
#define TDIST_TESTLIB_PORTS_H

#include <netinet/in.h>
#include <stdio.h>
#include <sys/socket.h>
#include <unistd.h>

#include "check.h"

static inline int test_free_port(void) {
  static unsigned next;
  int lo = 32768;
  FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
  if (f) {
    if (fscanf(f, "%d", &lo) != 1 || lo <= 10100) lo = 32768;
    fclose(f);
  }
  if (!next) next = (unsigned)getpid() * 7919u;
  for (int tries = 0; tries < 1000; tries++) {
    int port = 10000 + (int)(next++ % (unsigned)(lo - 10000));
    int fd = socket(AF_INET6, SOCK_STREAM, 0);
    CHECK(fd >= 0);
    int zero = 0;
    setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
    struct sockaddr_in6 sa = {.sin6_family = AF_INET6, .sin6_addr = in6addr_any};
    sa.sin6_port = htons((uint16_t)port);
    int ok = bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0;
    close(fd);
    if (ok) return port;
  }
  TEST_FAIL("no free TCP port below the ephemeral range (from %d)", lo);
  return -1;
}

#endif
