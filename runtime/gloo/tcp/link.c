/* The per-peer link over a connected, non-blocking socket (tcp.h): one sendmsg or readv per
 * step; poll() on the socket tells when data can move. */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include "runtime/common/sock.h"
#include "runtime/gloo/tcp/tcp.h"

static ssize_t tcp_send(tdist__link_t *base, const struct iovec *iov, int n) {
  tdist__tcp_link_t *l = (tdist__tcp_link_t *)base;
  struct msghdr mh = {.msg_iov = (struct iovec *)iov, .msg_iovlen = (size_t)n};
  ssize_t w = sendmsg(l->fd, &mh, MSG_NOSIGNAL);
  if (w < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? 0 : -errno;
  return w;
}

static ssize_t tcp_recv(tdist__link_t *base, const struct iovec *iov, int n) {
  tdist__tcp_link_t *l = (tdist__tcp_link_t *)base;
  ssize_t r = readv(l->fd, iov, n);
  if (r == 0) return -TDIST__ECLOSED;
  if (r < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? 0 : -errno;
  return r;
}

static struct pollfd tcp_wait_on(tdist__link_t *base, int is_send) {
  tdist__tcp_link_t *l = (tdist__tcp_link_t *)base;
  return (struct pollfd){.fd = l->fd, .events = is_send ? POLLOUT : POLLIN};
}

static void tcp_hangup(tdist__link_t *base) {
  tdist__tcp_link_t *l = (tdist__tcp_link_t *)base;
  if (l->fd >= 0) shutdown(l->fd, SHUT_RDWR);
}

static const tdist__link_ops_t k_tcp_ops = {
    .send = tcp_send, .recv = tcp_recv, .wait_on = tcp_wait_on, .hangup = tcp_hangup};

void tdist__tcp_link_init(tdist__tcp_link_t *l, int peer, const char *addr, int fd) {
  *l = (tdist__tcp_link_t){.base = {.ops = &k_tcp_ops, .peer = peer, .addr = addr, .polls = 1},
                           .fd = fd};
}

void tdist__tcp_small_sndbuf(int fd, int bytes) {
  (void)setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof bytes);
}
