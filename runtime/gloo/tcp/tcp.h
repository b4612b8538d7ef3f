/* gloo's TCP part: connecting the full mesh among a group's ranks (connect.c: the interface to
 * listen on, addresses through the store, the hello handshake) and the per-peer link over a
 * connected socket (link.c). Every pair gets a socket, same-host pairs too: for those that then
 * talk through shared memory (shm/), it only tells when the peer dies. */
#ifndef TDIST_GLOO_TCP_TCP_H
#define TDIST_GLOO_TCP_TCP_H

#include <stdint.h>

#include "runtime/gloo/link/link.h"

#define TDIST__TCP_ADDR_MAX 80 /* "ip:port" */

/* Listens on an ephemeral port of the chosen interface, publishes "ip port hostname boot_id"
 * under gloo/<rank> in cfg->store, reads everyone's entry, connects to each lower rank and
 * accepts each higher rank (a 16-byte hello names the rank and the group's hash), all before
 * the deadline. Writes each peer's socket into fds[peer] (non-blocking; -1 for this rank),
 * its "ip:port" into addr[peer], and same[peer] = 1 where the peer runs on this host (same host
 * name and boot id). On failure (reported through cfg->fail) the sockets already connected are
 * in fds for the caller to close. */
tdist_status_t tdist__tcp_mesh_connect(const tdist__transport_cfg_t *cfg, int64_t deadline,
                                       int *fds, char (*addr)[TDIST__TCP_ADDR_MAX], int *same);

/* The link over a connected socket (fd borrowed: the caller closes it). */
typedef struct {
  tdist__link_t base;
  int fd;
} tdist__tcp_link_t;
void tdist__tcp_link_init(tdist__tcp_link_t *l, int peer, const char *addr, int fd);

/* Same-host TCP (TDIST_SHM=0, or no shared memory): a send buffer of `bytes` instead of the
 * megabytes autotuning grows to (see the transport's setup for when). */
void tdist__tcp_small_sndbuf(int fd, int bytes);

#endif
