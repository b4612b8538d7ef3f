/* Socket helpers with deadlines (poll). Used by clients; the server has its own event loop.
 * Never blocks past a deadline, never raises SIGPIPE (MSG_NOSIGNAL). */
#define _GNU_SOURCE
#include "runtime/common/sock.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "runtime/common/clock.h"

int tdist__sock_set_nonblock(int fd, int on) {
  int fl = fcntl(fd, F_GETFL);
  if (fl < 0) return -errno;
  fl = on ? (fl | O_NONBLOCK) : (fl & ~O_NONBLOCK);
  return fcntl(fd, F_SETFL, fl) < 0 ? -errno : 0;
}

void tdist__sock_nodelay(int fd) {
  int one = 1;
  (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

void tdist__sockaddr_str(const struct sockaddr *sa, socklen_t len, char *buf, size_t cap) {
  char host[INET6_ADDRSTRLEN] = "?";
  int port = 0;
  (void)len;
  if (sa->sa_family == AF_INET) {
    const struct sockaddr_in *in = (const struct sockaddr_in *)sa;
    inet_ntop(AF_INET, &in->sin_addr, host, sizeof host);
    port = ntohs(in->sin_port);
    snprintf(buf, cap, "%s:%d", host, port);
  } else if (sa->sa_family == AF_INET6) {
    const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)sa;
    port = ntohs(in6->sin6_port);
    if (IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr)) {
      inet_ntop(AF_INET, &in6->sin6_addr.s6_addr[12], host, sizeof host);
      snprintf(buf, cap, "%s:%d", host, port);
    } else {
      inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof host);
      snprintf(buf, cap, "[%s]:%d", host, port);
    }
  } else {
    snprintf(buf, cap, "(family %d)", sa->sa_family);
  }
}

void tdist__sock_peer_str(int fd, char *buf, size_t cap) {
  struct sockaddr_storage ss;
  socklen_t len = sizeof ss;
  if (getpeername(fd, (struct sockaddr *)&ss, &len) != 0) {
    snprintf(buf, cap, "(unknown peer)");
    return;
  }
  tdist__sockaddr_str((struct sockaddr *)&ss, len, buf, cap);
}

static int wait_fd(int fd, short events, int64_t deadline_ms) {
  for (;;) {
    struct pollfd p = {.fd = fd, .events = events};
    int timeout = deadline_ms < 0 ? -1 : tdist__poll_timeout(deadline_ms);
    int r = poll(&p, 1, timeout);
    if (r > 0) return 0;
    if (r == 0) return -ETIMEDOUT;
    if (errno != EINTR) return -errno;
  }
}

/* A connect to a local port nobody listens on can pick that same port as its source and
 * connect to itself (TCP simultaneous open): the caller would read its own requests back.
 * Seen when a restarted store's old port is in the ephemeral range. It is a refusal. */
static int self_connected(int fd) {
  struct sockaddr_storage a, b;
  socklen_t al = sizeof a, bl = sizeof b;
  if (getsockname(fd, (struct sockaddr *)&a, &al) != 0) return 0;
  if (getpeername(fd, (struct sockaddr *)&b, &bl) != 0) return 0;
  if (a.ss_family != b.ss_family) return 0;
  if (a.ss_family == AF_INET) {
    const struct sockaddr_in *x = (const void *)&a, *y = (const void *)&b;
    return x->sin_port == y->sin_port && x->sin_addr.s_addr == y->sin_addr.s_addr;
  }
  if (a.ss_family == AF_INET6) {
    const struct sockaddr_in6 *x = (const void *)&a, *y = (const void *)&b;
    return x->sin6_port == y->sin6_port &&
           memcmp(&x->sin6_addr, &y->sin6_addr, sizeof x->sin6_addr) == 0;
  }
  return 0;
}

int tdist__sock_connect(const char *host, int port, int64_t deadline_ms, int *gai_err) {
  char portstr[16];
  snprintf(portstr, sizeof portstr, "%d", port);
  struct addrinfo hints, *res = NULL;
  memset(&hints, 0, sizeof hints);
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_ADDRCONFIG;
  if (gai_err) *gai_err = 0;
  int g = getaddrinfo(host, portstr, &hints, &res);
  if (g == EAI_NONAME || g == EAI_ADDRFAMILY) {
    /* AI_ADDRCONFIG hides loopback-only families in some containers; retry without it. */
    hints.ai_flags = 0;
    g = getaddrinfo(host, portstr, &hints, &res);
  }
  if (g != 0) {
    if (gai_err) *gai_err = g;
    return g == EAI_SYSTEM ? -errno : -EHOSTUNREACH;
  }
  int last = -ECONNREFUSED;
  for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
    int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) {
      last = -errno;
      continue;
    }
    int r = connect(fd, ai->ai_addr, ai->ai_addrlen);
    if (r != 0 && errno == EINPROGRESS) {
      r = wait_fd(fd, POLLOUT, deadline_ms);
      if (r == 0) {
        int soerr = 0;
        socklen_t sl = sizeof soerr;
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl);
        r = soerr ? -soerr : 0;
      }
    } else if (r != 0) {
      r = -errno;
    }
    if (r == 0 && self_connected(fd)) r = -ECONNREFUSED;
    if (r == 0) {
      tdist__sock_nodelay(fd);
      freeaddrinfo(res);
      return fd;
    }
    last = r;
    close(fd);
    if (r == -ETIMEDOUT) break;
  }
  freeaddrinfo(res);
  return last;
}

int tdist__sock_send_all(int fd, const void *buf, size_t len, int64_t deadline_ms) {
  const char *p = buf;
  while (len > 0) {
    ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
    if (n > 0) {
      p += n;
      len -= (size_t)n;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      int r = wait_fd(fd, POLLOUT, deadline_ms);
      if (r < 0) return r;
      continue;
    }
    return n < 0 ? -errno : -EIO;
  }
  return 0;
}

int tdist__sock_recv_reply(int fd, void *buf, size_t len, int64_t deadline_ms) {
  /* A reply to a request just sent is almost never there yet: wait first and save the recv
   * that would only say EAGAIN. */
  int r = wait_fd(fd, POLLIN, deadline_ms);
  return r < 0 ? r : tdist__sock_recv_all(fd, buf, len, deadline_ms);
}

int tdist__sock_recv_all(int fd, void *buf, size_t len, int64_t deadline_ms) {
  char *p = buf;
  while (len > 0) {
    ssize_t n = recv(fd, p, len, 0);
    if (n > 0) {
      p += n;
      len -= (size_t)n;
      continue;
    }
    if (n == 0) return -TDIST__ECLOSED;
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      int r = wait_fd(fd, POLLIN, deadline_ms);
      if (r < 0) return r;
      continue;
    }
    return -errno;
  }
  return 0;
}

const char *tdist__sock_strerror(int neg_err) {
  if (neg_err == -TDIST__ECLOSED) return "connection closed by peer";
  return strerror(-neg_err);
}

int tdist__sock_local_ipv4(int fd, char *ip, size_t cap) {
  struct sockaddr_storage ss;
  socklen_t sl = sizeof ss;
  if (getsockname(fd, (struct sockaddr *)&ss, &sl) != 0) return -1;
  if (ss.ss_family == AF_INET) {
    inet_ntop(AF_INET, &((struct sockaddr_in *)&ss)->sin_addr, ip, (socklen_t)cap);
    return 0;
  }
  struct in6_addr *a6 = &((struct sockaddr_in6 *)&ss)->sin6_addr;
  if (ss.ss_family == AF_INET6 && IN6_IS_ADDR_V4MAPPED(a6)) {
    inet_ntop(AF_INET, &a6->s6_addr[12], ip, (socklen_t)cap);
    return 0;
  }
  if (ss.ss_family == AF_INET6 && IN6_IS_ADDR_LOOPBACK(a6)) {
    snprintf(ip, cap, "127.0.0.1");
    return 0;
  }
  return -1; /* IPv6-only path: the TCP transport listens on IPv4 */
}
