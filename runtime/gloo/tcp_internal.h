/* The TCP transport's state, shared by its set-up (tcp_setup.c: addresses through the store,
 * connections, shared-memory links, tuning) and its data path (tcp.c: messages, early messages,
 * exchange). Nothing outside runtime/gloo/tcp*.c includes it. */
#ifndef TDIST_GLOO_TCP_INTERNAL_H
#define TDIST_GLOO_TCP_INTERNAL_H

#include <poll.h>
#include <stddef.h>
#include <stdint.h>

#include "runtime/gloo/shm_link.h"
#include "runtime/gloo/transport.h"
#include "runtime/pg/backend.h"

#define MSG_MAGIC 0x7d15c0deu
/* A single-copy message (same host, TDIST_SHM_SINGLE_COPY): the header, then the 8-byte address
 * of the payload in the sender's memory, which the receiver copies with process_vm_readv and
 * acknowledges through the ring's copy counter; the sender's send completes then. */
#define MSG_MAGIC_COPY 0x7d15c0dfu
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
#define HELLO_MAGIC 0x7d15e110u

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
  char (*addr)[80];
  int spin_us;
  int64_t spin_max_ns, spin_ns; /* adaptive TCP spin budget (see tcp_exchange) */
  int64_t shm_spin_ns;          /* ring wait before sleeping (TDIST_SHM_SPIN_US) */
  int64_t pure_spin_ns;         /* of which the first part spins without yielding */
  int calls_without_spin;
  int crowded;         /* this host has more of the group's ranks than online CPUs */
  int yield;           /* sched_yield while spinning on rings (TDIST_SHM_YIELD, default 1) */
  struct pollfd *pfds; /* 3 * size + 2: transfers, peers to drain, abort_fd, wake_fd */
  int *pidx;
  /* Same-host peers talk through shared-memory rings (shm_link.c); their TCP socket stays open
   * only to notice when the peer dies (EOF). */
  tdist__shm_links_t shm;
  int wake_fd;        /* eventfd: written when a send/recv is posted during exchange_fed */
  tdist__xfer_t *fed; /* exchange_fed's transfers, grown as more are in flight */
  int fed_cap;
  uint8_t *gone, *busy; /* scratch for tcp_exchange */
  rx_t *rx;             /* [peer]: what was read from its stream ahead of the receives */
  uint64_t *copies_sent, *copies_recv; /* [peer]: single-copy messages sent to / read from it */
  size_t early_bytes, early_max; /* held in early_t messages; the bound (TDIST_P2P_BUFFER_MB) */
} tcp_t;

/* tcp.c */
tdist_status_t tdist__tcp_exchange(tdist__transport_t *base, tdist__xfer_t *x, int n,
                                   int64_t deadline, tdist__what_t *what);
tdist_status_t tdist__tcp_exchange_fed(tdist__transport_t *base, tdist__xfer_feed_t *feed,
                                       tdist__what_t *what);
void tdist__tcp_wake(tdist__transport_t *base);
/* tcp_setup.c */
void tdist__tcp_destroy(tdist__transport_t *base);
void tdist__tcp_hangup(tdist__transport_t *base);

#endif
