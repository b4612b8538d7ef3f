/* Socket helpers with deadlines. Every function returns >= 0 on success or -errno; nothing here
 * keeps state. Deadlines are monotonic milliseconds (clock.h); a negative deadline means none. */
#ifndef TDIST_COMMON_SOCK_H
#define TDIST_COMMON_SOCK_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

/* Returned by recv helpers when the peer closed the connection cleanly. */
#define TDIST__ECLOSED 100000

int tdist__sock_set_nonblock(int fd, int on);
void tdist__sock_nodelay(int fd);

/* "[::1]:29500", "10.0.0.3:29500" (v4-mapped v6 addresses are shown as v4). */
void tdist__sockaddr_str(const struct sockaddr *sa, socklen_t len, char *buf, size_t cap);
void tdist__sock_peer_str(int fd, char *buf, size_t cap);

/* One connect attempt to every address of host:port (AF_UNSPEC), each bounded by the deadline.
 * Returns a connected non-blocking, TCP_NODELAY, CLOEXEC fd, or -errno of the last failure
 * (-EHOSTUNREACH when the name does not resolve; *gai_err then holds the getaddrinfo code). */
int tdist__sock_connect(const char *host, int port, int64_t deadline_ms, int *gai_err);

/* Sends/receives exactly len bytes on a non-blocking fd, polling until the deadline.
 * -ETIMEDOUT at the deadline, -TDIST__ECLOSED if the peer closed, else -errno. */
int tdist__sock_send_all(int fd, const void *buf, size_t len, int64_t deadline_ms);
int tdist__sock_recv_all(int fd, void *buf, size_t len, int64_t deadline_ms);
/* Like recv_all, but polls before the first read: for the first bytes of a reply. */
int tdist__sock_recv_reply(int fd, void *buf, size_t len, int64_t deadline_ms);

/* The local address of connected socket fd as IPv4 text (a v4-mapped address as v4, IPv6
 * loopback as 127.0.0.1). 0, or -1 for an IPv6-only path or a getsockname failure. */
int tdist__sock_local_ipv4(int fd, char *ip, size_t cap);

/* Text for a negative return of the functions above ("connection closed by peer", strerror). */
const char *tdist__sock_strerror(int neg_err);

#endif
