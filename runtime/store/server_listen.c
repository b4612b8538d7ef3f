/* The store server's listening socket and log helpers (split out of server.c). */
#define _GNU_SOURCE
#include "runtime/store/server_listen.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "runtime/common/sock.h"

void tdist__store_key_str(const uint8_t *k, size_t n, char *buf, size_t cap) {
  size_t j = 0;
  for (size_t i = 0; i < n && j + 5 < cap; i++) {
    if (i >= 64) {
      j += (size_t)snprintf(buf + j, cap - j, "...");
      break;
    }
    if (k[i] >= 0x20 && k[i] < 0x7f && k[i] != '\\')
      buf[j++] = (char)k[i];
    else
      j += (size_t)snprintf(buf + j, cap - j, "\\x%02x", k[i]);
  }
  buf[j] = '\0';
}

int tdist__store_somaxconn(void) {
  FILE *f = fopen("/proc/sys/net/core/somaxconn", "r");
  int v = 4096;
  if (f) {
    if (fscanf(f, "%d", &v) != 1) v = 4096;
    fclose(f);
  }
  return v > 0 ? v : 4096;
}

/* Binds and listens. Returns the fd or -errno; *where gets the address tried. */
int tdist__store_listen(const char *host, int port, int backlog, char *where, size_t wcap) {
  char portstr[16];
  snprintf(portstr, sizeof portstr, "%d", port);
  int dual = !host || !*host;
  struct addrinfo hints, *res = NULL;
  memset(&hints, 0, sizeof hints);
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  hints.ai_family = dual ? AF_INET6 : AF_UNSPEC;
  int g = getaddrinfo(dual ? "::" : host, portstr, &hints, &res);
  if (g != 0 && dual) {
    hints.ai_family = AF_INET; /* no IPv6 on this host */
    g = getaddrinfo("0.0.0.0", portstr, &hints, &res);
  }
  if (g != 0) {
    snprintf(where, wcap, "%s:%d (%s)", host ? host : "::", port, gai_strerror(g));
    return -EADDRNOTAVAIL;
  }
  int err = -EADDRNOTAVAIL;
  for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
    tdist__sockaddr_str(ai->ai_addr, ai->ai_addrlen, where, wcap);
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      err = -errno;
      continue;
    }
    int one = 1, zero = 0;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (ai->ai_family == AF_INET6) setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
    /* Accepted sockets inherit TCP_NODELAY from the listening one (Linux): no setsockopt per
     * connection, one syscall less for each of 100,000 ranks. */
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, backlog) != 0) {
      err = -errno;
      close(fd);
      continue;
    }
    freeaddrinfo(res);
    return fd;
  }
  freeaddrinfo(res);
  return err;
}
