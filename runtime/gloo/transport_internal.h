/* The gloo transport's state (transport.h), shared by its parts in runtime/gloo: set-up and the
 * factory (transport.c: the TCP mesh of tcp/, then shared-memory links of shm/ where a pair
 * can, one link per peer), the per-peer message streams (stream.c), the early p2p buffer
 * (early.c), the progress loop and its spin/yield/doorbell policy (progress.c, wait.c) and
 * error attribution (fail.c). Every byte moves through a peer's link (link/link.h), whatever
 * its kind. Nothing outside those files includes it. */
#ifndef TDIST_GLOO_TRANSPORT_INTERNAL_H
#define TDIST_GLOO_TRANSPORT_INTERNAL_H

#include <poll.h>
#include <stddef.h>
#include <stdint.h>

#include "runtime/gloo/link/link.h"
#include "runtime/gloo/shm/shm.h"
#include "runtime/gloo/tcp/tcp.h"
#include "runtime/gloo/transport.h"
#include "runtime/pg/backend.h"

/* Below this size (or the transfer's own copy_min, gloo.c) two copies through the ring are
 * faster than one single copy. */
#define COPY_MIN_BYTES (256 * 1024)
#define LOCAL_SNDBUF (256 * 1024) /* same-host TCP send buffer (see the transport's setup) */
#define SHM_PURE_SPIN_NS 20000 /* a ring wait's first part spins without yielding (not crowded) */

static inline void tdist__cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

/* A point-to-point message (tag without TDIST__XFER_COLL_TAG) that arrived before a receive for
 * it: sent early (the sender's send completed before this rank got to its receive) or in another
 * order of tags than this rank receives them (Gloo matches by peer and tag). Held per peer in
 * arrival order until a receive of its tag takes it; same-tag messages keep their order. */
typedef struct early {
  struct early *next;
  uint32_t tag;
  size_t len, done; /* done < len: its payload is still being read (rx_t.filling) */
  uint8_t *data;
} early_t;

/* Per peer: the receive side's view of its byte stream. */
typedef struct {
  uint8_t *ahead; /* bytes read past the message they were read for; consumed before the stream */
  size_t ahead_off, ahead_len;
  early_t *head, *tail; /* early messages, in arrival order */
  early_t *filling;     /* the early message whose payload the stream continues with, or NULL */
  int drain_stop; /* the stream continues with a collective's message, or ended: do not drain */
  int readable;   /* poll found its socket readable */
} rx_t;

typedef struct {
  tdist__transport_t base;
  tdist__transport_cfg_t cfg; /* the creator's, copied (what it points to is borrowed) */
  int rank, size;
  int *fds;
  char (*addr)[TDIST__TCP_ADDR_MAX];
  tdist__link_t **link;   /* [peer]: its link (this rank: a socket link without a socket) */
  tdist__tcp_link_t *tcp; /* [peer]: the socket links (every pair has one) */
  int spin_us;
  int64_t spin_max_ns, spin_ns; /* adaptive TCP spin budget (see exchange) */
  int64_t shm_spin_ns;          /* ring wait before sleeping (TDIST_SHM_SPIN_US) */
  int64_t pure_spin_ns;         /* of which the first part spins without yielding */
  int calls_without_spin;
  int crowded;         /* this host has more of the group's ranks than online CPUs */
  int yield;           /* sched_yield while spinning on rings (TDIST_SHM_YIELD, default 1) */
  struct pollfd *pfds; /* 3 * size + 2: transfers, peers to drain, abort_fd, wake_fd */
  int *pidx;
  /* Same-host peers talk through shared-memory rings (shm/); their TCP socket stays open only
   * to notice when the peer dies (EOF). */
  tdist__shm_links_t shm;
  int wake_fd;        /* eventfd: written when a send/recv is posted during exchange_fed */
  tdist__xfer_t *fed; /* exchange_fed's transfers, grown as more are in flight */
  int fed_cap;
  uint8_t *gone, *busy;          /* scratch for exchange */
  rx_t *rx;                      /* [peer]: what was read from its stream ahead of the receives */
  size_t early_bytes, early_max; /* held in early_t messages; the bound (TDIST_P2P_BUFFER_MB) */
} mesh_t;

/* stream.c: moves one transfer forward without blocking. 1 = progressed, 0 = would block,
 * <0 = -errno, -EPROTO = header mismatch, -ENOBUFS = too much held for receives (detail in
 * why). */
int tdist__mesh_step(mesh_t *t, tdist__xfer_t *x, char *why, size_t wcap);
/* stream.c: while a call waits and receives nothing from peer, takes a send/recv message off its
 * stream and holds it (early.c). 1, 0 or -errno (as step). */
int tdist__mesh_drain(mesh_t *t, int peer, char *why, size_t wcap);
/* stream.c: reads from peer's stream into iov (what was read ahead first, then its link); puts
 * k bytes back in front of it. */
ssize_t tdist__rx_read(mesh_t *t, int peer, const struct iovec *iov, int n);
int tdist__rx_unread(rx_t *q, const uint8_t *b, size_t k);

/* early.c: the early p2p buffer (see early_t). start: holds a message of len bytes (its header
 * read) whose first `got` payload bytes are at first: 1, or -ENOBUFS past the bound (detail in
 * why), -ENOMEM. fill: reads more of the one the stream continues with: 1, 0, -errno. take: the
 * receive x takes the first of its tag: 1 (x complete), 0 (none), -EPROTO. copy: holds a
 * single-copy message (header read, address known), copying it in now. free: all of peer's. */
int tdist__early_start(mesh_t *t, int peer, uint32_t tag, size_t len, const uint8_t *first,
                       size_t got, char *why, size_t wcap);
int tdist__early_fill(mesh_t *t, int peer);
int tdist__early_take(mesh_t *t, tdist__xfer_t *x, char *why, size_t wcap);
int tdist__early_copy(mesh_t *t, int peer, uint32_t tag, size_t len, uint64_t addr, char *why,
                      size_t wcap);
void tdist__early_free(rx_t *q);

/* fail.c: the group's error for a transfer (or a drain of peer's stream) that failed with r. */
tdist_status_t tdist__mesh_xfer_fail(mesh_t *t, const tdist__xfer_t *x, int r, tdist__what_t *w,
                                     const char *why);
tdist_status_t tdist__mesh_drain_fail(mesh_t *t, int peer, int r, tdist__what_t *w,
                                      const char *why);
/* exchange_fed: the name of transfer x in errors (its own (kind, seq), else the call's). */
tdist__what_t *tdist__mesh_name_of(const tdist__xfer_t *x, tdist__what_t *call, tdist__what_t *tmp);

/* progress.c */
tdist_status_t tdist__mesh_exchange(tdist__transport_t *base, tdist__xfer_t *x, int n,
                                    int64_t deadline, tdist__what_t *what);
tdist_status_t tdist__mesh_exchange_fed(tdist__transport_t *base, tdist__xfer_feed_t *feed,
                                        tdist__what_t *what);

#endif
