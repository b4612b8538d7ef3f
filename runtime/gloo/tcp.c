/* Full-mesh TCP transport (transport.h), data path; tcp_setup.c connects it.
 *
 * Every message is a 16-byte header (magic, tag, length) and the payload, sent with
 * one sendmsg where possible; receives read header and payload with one readv. Progress is
 * non-blocking: try every transfer, spin briefly (small messages on loopback answer within
 * microseconds), then poll() on the sockets and the group's abort eventfd until the deadline.
 * Same-host pairs move their bytes through shared-memory rings instead (shm.c), linked at set-up
 * by shm_link.c; their socket then only tells when the peer dies.
 * Receives read each peer's stream through rx_t: a send/recv message that no receive of this
 * call is for is held as an early_t until a receive of its tag takes it; a call that waits also
 * takes such messages off the streams of peers it does not receive from (drain), so their sends
 * complete. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <stdatomic.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "runtime/common/bytes.h"
#include "runtime/common/clock.h"
#include "runtime/common/log.h"
#include "runtime/common/param.h"
#include "runtime/common/sock.h"
#include "runtime/gloo/shm.h"
#include "runtime/gloo/shm_link.h"
#include "runtime/gloo/transport.h"
#include "runtime/gloo/tcp_internal.h"

/* ---------------------------------------------------------------------------------------- */
/* Data path                                                                                 */

/* ---------------------------------------------------------------------------------------- */
/* Receive side: one byte stream per peer, early messages held by tag                        */

/* Reads from peer's stream into iov: the bytes read ahead first, then its ring or socket.
 * Returns the count, 0 when nothing is there yet, or -errno (-TDIST__ECLOSED: it closed). */
static ssize_t rx_read(tcp_t *t, int peer, const struct iovec *iov, int n) {
  rx_t *q = &t->rx[peer];
  if (q->ahead_len) {
    size_t got = 0;
    for (int i = 0; i < n && q->ahead_len; i++) {
      size_t k = iov[i].iov_len < q->ahead_len ? iov[i].iov_len : q->ahead_len;
      if (k) memcpy(iov[i].iov_base, q->ahead + q->ahead_off, k);
      q->ahead_off += k;
      q->ahead_len -= k;
      got += k;
    }
    if (!q->ahead_len) {
      free(q->ahead);
      q->ahead = NULL;
      q->ahead_off = 0;
    }
    return (ssize_t)got;
  }
  if (t->shm.in_ring[peer]) {
    int freed;
    size_t r = tdist__shm_ring_read(t->shm.in_ring[peer], iov, n, &freed);
    if (freed) tdist__shm_ring_doorbell(&t->shm.peer_seg[peer]); /* its writer may wait for space */
    return (ssize_t)r;
  }
  ssize_t r = readv(t->fds[peer], iov, n);
  if (r == 0) return -TDIST__ECLOSED;
  if (r < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? 0 : -errno;
  return r;
}

/* Puts k bytes back in front of peer's stream (read for a message they did not belong to). */
static int rx_unread(rx_t *q, const uint8_t *b, size_t k) {
  if (!k) return 0;
  if (q->ahead_off >= k) {
    q->ahead_off -= k;
  } else {
    uint8_t *nb = malloc(k + q->ahead_len);
    if (!nb) return -ENOMEM;
    if (q->ahead_len) memcpy(nb + k, q->ahead + q->ahead_off, q->ahead_len);
    free(q->ahead);
    q->ahead = nb;
    q->ahead_off = 0;
  }
  memcpy(q->ahead + q->ahead_off, b, k);
  q->ahead_len += k;
  return 0;
}

/* Starts holding an early message of len bytes (its header read) whose first `got` payload bytes
 * are at `first`. 1, or -ENOBUFS past the bound (detail in why), -ENOMEM. */
static int early_start(tcp_t *t, int peer, uint32_t tag, size_t len, const uint8_t *first,
                       size_t got, char *why, size_t wcap) {
  rx_t *q = &t->rx[peer];
  if (len > t->early_max - t->early_bytes) {
    snprintf(
        why, wcap,
        "rank %d (%s) sent %zu bytes with tag %u before this rank received them, and %zu bytes "
        "of such messages are already held (TDIST_P2P_BUFFER_MB=%zu): receive earlier, or "
        "raise TDIST_P2P_BUFFER_MB",
        peer, t->addr[peer], len, tag, t->early_bytes, t->early_max >> 20);
    return -ENOBUFS;
  }
  early_t *e = calloc(1, sizeof *e);
  uint8_t *data = malloc(len ? len : 1);
  if (!e || !data) {
    free(e);
    free(data);
    return -ENOMEM;
  }
  e->tag = tag;
  e->len = len;
  e->data = data;
  e->done = got < len ? got : len;
  if (e->done) memcpy(e->data, first, e->done);
  if (got > len && rx_unread(q, first + len, got - len)) {
    free(data);
    free(e);
    return -ENOMEM;
  }
  if (q->tail)
    q->tail->next = e;
  else
    q->head = e;
  q->tail = e;
  t->early_bytes += len;
  if (e->done < len) q->filling = e;
  return 1;
}

/* Reads more of the early message the stream continues with. 1, 0 (nothing yet) or -errno. */
static int early_fill(tcp_t *t, int peer) {
  early_t *e = t->rx[peer].filling;
  struct iovec iov = {e->data + e->done, e->len - e->done};
  ssize_t r = rx_read(t, peer, &iov, 1);
  if (r <= 0) return (int)r;
  e->done += (size_t)r;
  if (e->done == e->len) t->rx[peer].filling = NULL;
  return 1;
}

/* The receive x takes the first early message of its tag, if there is one: 1 (x complete),
 * 0 (none), -EPROTO (a length mismatch; detail in why). */
static int early_take(tcp_t *t, tdist__xfer_t *x, char *why, size_t wcap) {
  rx_t *q = &t->rx[x->peer];
  early_t *prev = NULL, *e = q->head;
  while (e && e->tag != x->tag) {
    prev = e;
    e = e->next;
  }
  if (!e) return 0;
  if (e->len != x->len) {
    snprintf(why, wcap,
             "rank %d (%s) sent %zu bytes with tag %u where this rank receives %zu bytes with "
             "that tag",
             x->peer, t->addr[x->peer], e->len, e->tag, x->len);
    return -EPROTO;
  }
  if (e->len) memcpy(x->buf, e->data, e->len);
  if (prev)
    prev->next = e->next;
  else
    q->head = e->next;
  if (q->tail == e) q->tail = prev;
  t->early_bytes -= e->len;
  free(e->data);
  free(e);
  x->hdr_done = 16;
  x->done = x->len;
  x->complete = 1;
  return 1;
}

/* Checks a message header read from peer's stream: a tdist message (plain or single-copy) of a
 * plausible length. 0, or -EPROTO with the detail in why. */
static int check_hdr(tcp_t *t, int peer, const uint8_t *hdr, char *why, size_t wcap) {
  uint32_t magic = tdist__get_u32(hdr);
  uint64_t len = tdist__get_u64(hdr + 8);
  if (magic != MSG_MAGIC && magic != MSG_MAGIC_COPY) {
    snprintf(why, wcap, "rank %d (%s) sent bytes that are not a tdist message", peer,
             t->addr[peer]);
    return -EPROTO;
  }
  if (len > SIZE_MAX / 2) {
    snprintf(why, wcap, "rank %d (%s) sent a header claiming %llu bytes", peer, t->addr[peer],
             (unsigned long long)len);
    return -EPROTO;
  }
  return 0;
}

/* After a single-copy header: the payload's address, from the `got` bytes read after the header
 * into first (the rest goes back to the stream) and then the stream. 1 or -EPROTO. */
static int copy_addr(tcp_t *t, int peer, const uint8_t *first, size_t got, uint64_t *addr,
                     char *why, size_t wcap) {
  uint8_t a[8];
  size_t have = got < 8 ? got : 8;
  if (have) memcpy(a, first, have);
  if (got > 8 && rx_unread(&t->rx[peer], first + 8, got - 8)) return -ENOMEM;
  while (have < 8) { /* written with its header in one go: it is there */
    struct iovec iov = {a + have, 8 - have};
    ssize_t r = rx_read(t, peer, &iov, 1);
    if (r <= 0) {
      snprintf(why, wcap, "rank %d (%s) sent a single-copy header without its address", peer,
               t->addr[peer]);
      return -EPROTO;
    }
    have += (size_t)r;
  }
  *addr = tdist__get_u64(a);
  if (!t->shm.in_ring[peer]) {
    snprintf(why, wcap, "rank %d (%s) sent a single-copy message over TCP", peer, t->addr[peer]);
    return -EPROTO;
  }
  return 1;
}

/* Copies len bytes at addr in peer's memory to dst and tells the peer its buffer is free. */
static int copy_in(tcp_t *t, int peer, uint8_t *dst, uint64_t addr, size_t len, char *why,
                   size_t wcap) {
  size_t done = 0;
  while (done < len) {
    struct iovec l = {dst + done, len - done}, r = {(void *)(uintptr_t)(addr + done), len - done};
    ssize_t n = process_vm_readv(t->shm.pid[peer], &l, 1, &r, 1, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == ESRCH) return -TDIST__ECLOSED; /* it exited */
    if (n <= 0) {
      snprintf(why, wcap, "reading rank %d's (%s) message of %zu bytes from its memory: %s", peer,
               t->addr[peer], len, n < 0 ? strerror(errno) : "nothing read");
      return -EPROTO;
    }
    done += (size_t)n;
  }
  if (tdist__shm_ring_is_revoked(t->shm.in_ring[peer], ++t->copies_recv[peer])) {
    snprintf(why, wcap,
             "rank %d (%s) gave up on its message of %zu bytes while this rank copied it (that "
             "rank failed)",
             peer, t->addr[peer], len);
    return -ECANCELED;
  }
  tdist__shm_ring_copied(t->shm.in_ring[peer]);
  tdist__shm_ring_doorbell(&t->shm.peer_seg[peer]); /* the sender may sleep until then */
  return 1;
}

/* Holds a single-copy message (header read, address known) as an early message. */
static int early_copy(tcp_t *t, int peer, uint32_t tag, size_t len, uint64_t addr, char *why,
                      size_t wcap) {
  int r = early_start(t, peer, tag, len, NULL, 0, why, wcap);
  if (r < 0) return r;
  early_t *e = t->rx[peer].tail;
  t->rx[peer].filling = NULL;
  e->done = len;
  return copy_in(t, peer, e->data, addr, len, why, wcap);
}

static int step_recv(tcp_t *t, tdist__xfer_t *x, char *why, size_t wcap) {
  rx_t *q = &t->rx[x->peer];
  if (q->filling) return early_fill(t, x->peer); /* the stream's next bytes are its */
  if (x->hdr_done == 0 && x->done == 0 && q->head && !(x->tag & TDIST__XFER_COLL_TAG)) {
    int r = early_take(t, x, why, wcap);
    if (r) return r;
  }
  struct iovec iov[2];
  int n = 0;
  if (x->hdr_done < 16) iov[n++] = (struct iovec){x->hdr + x->hdr_done, 16 - x->hdr_done};
  if (x->done < x->len) iov[n++] = (struct iovec){(char *)x->buf + x->done, x->len - x->done};
  ssize_t r = rx_read(t, x->peer, iov, n);
  if (r <= 0) return (int)r;
  q->drain_stop = 0;
  size_t rr = (size_t)r;
  int had_hdr = x->hdr_done == 16;
  if (x->hdr_done < 16) {
    size_t h = rr < 16 - x->hdr_done ? rr : 16 - x->hdr_done;
    x->hdr_done += h;
    rr -= h;
  }
  x->done += rr;
  if (!had_hdr && x->hdr_done == 16) {
    uint32_t tag = tdist__get_u32(x->hdr + 4);
    uint64_t len = tdist__get_u64(x->hdr + 8), addr = 0;
    int bad = check_hdr(t, x->peer, x->hdr, why, wcap);
    if (bad) return bad;
    int copy = tdist__get_u32(x->hdr) == MSG_MAGIC_COPY;
    if (copy) { /* what was read after the header is the address (and maybe what follows) */
      int r = copy_addr(t, x->peer, x->buf, x->done, &addr, why, wcap);
      x->done = 0;
      if (r < 0) return r;
    }
    if (tag != x->tag && !(tag & TDIST__XFER_COLL_TAG)) {
      /* A send/recv message this receive is not for: hold it, and start over on the stream. */
      size_t got = x->done;
      x->hdr_done = x->done = 0;
      return copy ? early_copy(t, x->peer, tag, (size_t)len, addr, why, wcap)
                  : early_start(t, x->peer, tag, (size_t)len, x->buf, got, why, wcap);
    }
    if (len != x->len || tag != x->tag) {
      snprintf(why, wcap,
               "rank %d (%s) sent a message of %llu bytes with tag %u where this rank expected "
               "%zu bytes with tag %u: the ranks called different collectives or different "
               "sizes (set TDIST_DEBUG=DETAIL to compare them)",
               x->peer, t->addr[x->peer], (unsigned long long)len, tag, x->len, x->tag);
      return -EPROTO;
    }
    if (copy) {
      int r = copy_in(t, x->peer, x->buf, addr, x->len, why, wcap);
      if (r < 0) return r;
      x->done = x->len;
    }
  }
  if (x->hdr_done == 16 && x->done == x->len) x->complete = 1;
  return 1;
}

/* While a call waits and receives nothing from peer: takes a send/recv message off its stream
 * and holds it, so that a send of the peer's, which may be what the peer waits in (a send to us
 * before its receive from us, or before a collective), completes. Stops at a collective's message
 * (which only a receive of that collective may take) and at the end of the stream. 1, 0 or -errno
 * (as step). */
static int drain(tcp_t *t, int peer, char *why, size_t wcap) {
  rx_t *q = &t->rx[peer];
  if (q->filling) {
    int r = early_fill(t, peer);
    if (r == -TDIST__ECLOSED || r == -ECONNRESET) { /* its receive reports the cut message */
      q->drain_stop = 1;
      return 0;
    }
    return r;
  }
  if (q->drain_stop) return 0;
  uint8_t hdr[16];
  size_t got = 0;
  int closed = 0;
  while (got < 16) {
    struct iovec iov = {hdr + got, 16 - got};
    ssize_t r = rx_read(t, peer, &iov, 1);
    if (r < 0) { /* a peer that left (it may have finished): the receive that needs it says so */
      if (r != -TDIST__ECLOSED && r != -ECONNRESET) return (int)r;
      closed = 1;
      break;
    }
    if (r == 0) break;
    got += (size_t)r;
  }
  uint32_t tag = tdist__get_u32(hdr + 4);
  if (got < 16 || (tag & TDIST__XFER_COLL_TAG)) {
    if (rx_unread(q, hdr, got)) return -ENOMEM;
    q->drain_stop = got == 16 || closed;
    return 0;
  }
  int bad = check_hdr(t, peer, hdr, why, wcap);
  if (bad) return bad;
  uint64_t len = tdist__get_u64(hdr + 8), addr;
  if (tdist__get_u32(hdr) == MSG_MAGIC_COPY) {
    int r = copy_addr(t, peer, NULL, 0, &addr, why, wcap);
    return r < 0 ? r : early_copy(t, peer, tag, (size_t)len, addr, why, wcap);
  }
  return early_start(t, peer, tag, (size_t)len, NULL, 0, why, wcap);
}

/* 1 if an earlier incomplete transfer in the list uses the same peer and direction: messages
 * on one socket must go in list order. */
static int blocked(const tdist__xfer_t *x, int i) {
  for (int j = 0; j < i; j++)
    if (!x[j].complete && x[j].peer == x[i].peer && x[j].is_send == x[i].is_send) return 1;
  return 0;
}

/* Moves one transfer forward without blocking. 1 = progressed, 0 = would block, <0 = -errno,
 * -EPROTO = header mismatch, -ENOBUFS = too much held for receives (detail in *why). */
/* A single-copy send: the header and the payload's address into the ring, then wait until the
 * receiver says it has copied the payload. */
static int step_send_copy(tcp_t *t, tdist__xfer_t *x) {
  tdist__shm_ring_t *ring = t->shm.out_ring[x->peer];
  if (!x->copy_seq) {
    uint8_t m[24];
    if (tdist__shm_ring_space(ring) < sizeof m) return 0;
    tdist__put_u32(m, MSG_MAGIC_COPY);
    tdist__put_u32(m + 4, x->tag);
    tdist__put_u64(m + 8, x->len);
    tdist__put_u64(m + 16, (uint64_t)(uintptr_t)x->buf);
    struct iovec iov = {m, sizeof m};
    tdist__shm_ring_write(ring, &iov, 1); /* all of it: there was room */
    tdist__shm_ring_doorbell(&t->shm.peer_seg[x->peer]);
    x->copy_seq = ++t->copies_sent[x->peer];
    x->hdr_done = 16;
    return 1;
  }
  if (tdist__shm_ring_copied_count(ring) < x->copy_seq) return 0;
  x->done = x->len;
  x->complete = 1;
  return 1;
}

static int step(tcp_t *t, tdist__xfer_t *x, char *why, size_t wcap) {
  if (!x->is_send) return step_recv(t, x, why, wcap);
  if (x->len >= (x->copy_min ? x->copy_min : COPY_MIN_BYTES) && t->shm.out_ring[x->peer] &&
      t->shm.copy_to[x->peer])
    return step_send_copy(t, x);
  if (x->hdr_done == 0 && x->done == 0) {
    tdist__put_u32(x->hdr, MSG_MAGIC);
    tdist__put_u32(x->hdr + 4, x->tag);
    tdist__put_u64(x->hdr + 8, x->len);
  }
  struct iovec iov[2];
  int n = 0;
  if (x->hdr_done < 16) iov[n++] = (struct iovec){x->hdr + x->hdr_done, 16 - x->hdr_done};
  if (x->done < x->len) iov[n++] = (struct iovec){(char *)x->buf + x->done, x->len - x->done};
  ssize_t w;
  if (t->shm.out_ring[x->peer]) {
    w = (ssize_t)tdist__shm_ring_write(t->shm.out_ring[x->peer], iov, n);
    if (w == 0) return 0;
    tdist__shm_ring_doorbell(&t->shm.peer_seg[x->peer]); /* the owner may sleep on its rings */
  } else {
    struct msghdr mh = {.msg_iov = iov, .msg_iovlen = (size_t)n};
    w = sendmsg(t->fds[x->peer], &mh, MSG_NOSIGNAL);
    if (w < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? 0 : -errno;
  }
  size_t ww = (size_t)w;
  if (x->hdr_done < 16) {
    size_t h = ww < 16 - x->hdr_done ? ww : 16 - x->hdr_done;
    x->hdr_done += h;
    ww -= h;
  }
  x->done += ww;
  if (x->hdr_done == 16 && x->done == x->len) x->complete = 1;
  return 1;
}

/* The status of the failures whose detail is in why (-EPROTO, -ENOBUFS, -ECANCELED), else 0. */
static tdist_status_t why_status(int r) {
  return r == -EPROTO      ? TDIST_ERR_PROTOCOL
         : r == -ENOBUFS   ? TDIST_ERR_NO_MEMORY
         : r == -ECANCELED ? TDIST_ERR_REMOTE
                           : TDIST_OK;
}

/* The group's error for a drain of peer's stream that failed with r (<0). */
static tdist_status_t drain_fail(tcp_t *t, int peer, int r, tdist__what_t *w, const char *why) {
  const char *what = tdist__what(w);
  if (why_status(r)) return tdist__transport_fail(&t->cfg, why_status(r), "%s: %s", what, why);
  return tdist__transport_fail(&t->cfg, TDIST_ERR_SYSTEM, "%s: reading ahead from rank %d (%s): %s",
                               what, peer, t->addr[peer], strerror(-r));
}

/* The group's error for a transfer that failed with r (<0) on peer. */
static tdist_status_t xfer_fail(tcp_t *t, const tdist__xfer_t *x, int r, tdist__what_t *w,
                                const char *why) {
  const tdist__transport_cfg_t *cfg = &t->cfg;
  const char *what = tdist__what(w);
  if (why_status(r)) return tdist__transport_fail(cfg, why_status(r), "%s: %s", what, why);
  if ((r == -TDIST__ECLOSED || r == -ECONNRESET || r == -EPIPE) && t->shm.in_ring[x->peer])
    return tdist__transport_fail(
        cfg, TDIST_ERR_REMOTE, /* a single copy found the process gone */
        "%s: rank %d (%s, same host) closed its connection (did that process "
        "exit or crash?)",
        what, x->peer, t->addr[x->peer]);
  if (r == -TDIST__ECLOSED || r == -ECONNRESET || r == -EPIPE)
    return tdist__transport_fail(cfg, TDIST_ERR_REMOTE,
                                 "%s: rank %d (%s) closed the connection (did that process exit "
                                 "or crash?)",
                                 what, x->peer, t->addr[x->peer]);
  return tdist__transport_fail(cfg, TDIST_ERR_SYSTEM, "%s: %s with rank %d (%s): %s", what,
                               x->is_send ? "send" : "receive", x->peer, t->addr[x->peer],
                               strerror(-r));
}

/* exchange_fed: the name of transfer x in errors (its own (kind, seq), else the call's). */
static tdist__what_t *name_of(const tdist__xfer_t *x, tdist__what_t *call, tdist__what_t *tmp) {
  if (!x->what_seq) return call;
  *tmp = (tdist__what_t){.kind = (tdist__coll_kind_t)x->what_kind, .seq = x->what_seq};
  return tmp;
}

/* exchange_fed: reports the completed transfers to the feed and closes the gaps (the order of
 * the rest is kept: it is the order rule's). Returns the new count. */
static int settle(tdist__xfer_t *x, int n, tdist__xfer_feed_t *feed) {
  int k = 0;
  for (int i = 0; i < n; i++) {
    if (x[i].complete) {
      feed->done(feed, &x[i]);
      continue;
    }
    if (k != i) x[k] = x[i];
    k++;
  }
  for (int i = k; i < n; i++) x[i].complete = 1; /* stale copies: not to be revoked */
  return k;
}

/* exchange_fed: takes what was posted into (*x)[n..], growing t->fed (and *x) when it is full,
 * and returns the new count, or -ENOMEM; *deadline becomes the earliest deadline of the n
 * transfers, *first the index of that transfer. */
static int feed_more(tcp_t *t, tdist__xfer_t **x, int n, tdist__xfer_feed_t *feed,
                     int64_t *deadline, int *first) {
  if (n == t->fed_cap) {
    int cap = t->fed_cap ? 2 * t->fed_cap : 64;
    tdist__xfer_t *nx = realloc(t->fed, (size_t)cap * sizeof *nx);
    if (!nx) return -ENOMEM;
    for (int i = t->fed_cap; i < cap; i++) nx[i] = (tdist__xfer_t){.complete = 1};
    t->fed = *x = nx;
    t->fed_cap = cap;
  }
  n += feed->take(feed, *x + n, t->fed_cap - n);
  for (int i = 0; i < n; i++)
    if (i == 0 || (*x)[i].deadline_ms < *deadline) {
      *deadline = (*x)[i].deadline_ms;
      *first = i;
    }
  return n;
}

/* Progresses x[0..n) until all are complete. With a feed (exchange_fed), x has room for cap
 * transfers: completed ones are reported and removed as the call goes, and newly posted ones
 * are taken whenever nothing else moves; the call ends when none is left. */
static tdist_status_t exchange(tcp_t *t, tdist__xfer_t *x, int n, tdist__xfer_feed_t *feed,
                               int64_t deadline, tdist__what_t *what) {
  const tdist__transport_cfg_t *cfg = &t->cfg;
  tdist__what_t xwhat;
  int first = 0; /* exchange_fed: the transfer whose deadline is `deadline` */
#define FEED_MORE()                                                             \
  do {                                                                          \
    n = feed_more(t, &x, n, feed, &deadline, &first);                           \
    if (n < 0)                                                                  \
      return tdist__transport_fail(cfg, TDIST_ERR_NO_MEMORY,                    \
                                   "%s: out of memory for more sends/receives", \
                                   tdist__what(what));                          \
  } while (0)
  if (feed) FEED_MORE();
  /* Adaptive spinning (TCP): spin_ns grows while peers answer within the spin and halves when
   * we end up sleeping in poll anyway (a busy machine, or a slow peer), down to 0; at 0 it is
   * probed again every 128 calls. Spinning on a core the peer needs only delays it. */
  if (t->spin_ns == 0 && t->spin_max_ns > 0 && ++t->calls_without_spin >= 128) {
    t->spin_ns = t->spin_max_ns / 4;
    t->calls_without_spin = 0;
  }
  /* INT64_MAX: spinning, from the next idle pass (which reads the clock) on. */
  int64_t spin_until = t->spin_ns > 0 ? INT64_MAX : 0;
  int slept = 0;
  unsigned idle_passes = 0;
  int64_t now = 0;
  int64_t shm_spin_until = 0, shm_spin_start = 0;
  int armed = 0; /* our doorbell says we are about to sleep */
  uint32_t doorbell_seen = 0;
  uint8_t *gone_seen = t->gone; /* peers whose death was seen once; failing on the second look */
  memset(gone_seen, 0, (size_t)t->size);
  char why[400];
  for (;;) {
    int pending = 0, progressed = 0, completed = 0;
    for (int i = 0; i < n; i++) {
      if (x[i].complete || blocked(x, i)) {
        pending += !x[i].complete;
        continue;
      }
      for (;;) { /* drive this transfer until it would block */
        int r = step(t, &x[i], why, sizeof why);
        if (r < 0) return xfer_fail(t, &x[i], r, name_of(&x[i], what, &xwhat), why);
        if (r == 0 || x[i].complete) break;
        progressed = 1;
      }
      if (!x[i].complete)
        pending++;
      else
        progressed = completed = 1;
    }
    if (feed && completed) n = settle(x, n, feed);
    if (!pending && feed) {
      FEED_MORE();
      if (n > 0) continue;
    }
    if (!pending) {
      if (armed) tdist__shm_sleep_cancel(&t->shm.own);
      if (t->spin_max_ns > 0) {
        if (slept)
          t->spin_ns = t->spin_ns / 2 < t->spin_max_ns / 16 ? 0 : t->spin_ns / 2;
        else if (t->spin_ns > 0)
          t->spin_ns = t->spin_ns + t->spin_max_ns / 4 > t->spin_max_ns
                           ? t->spin_max_ns
                           : t->spin_ns + t->spin_max_ns / 4;
      }
      return TDIST_OK;
    }
    if (atomic_load_explicit(cfg->aborted, memory_order_relaxed))
      return tdist__transport_fail(cfg, TDIST_ERR_ABORTED, "%s: aborted",
                                   tdist__what(n ? name_of(&x[0], what, &xwhat) : what));
    /* Nothing moved: take send/recv messages off the streams of peers this call does not
     * receive from (rings: look; sockets: those poll found readable), so that their sends,
     * which may be what they wait in, complete. */
    int drain_shm = 0;
    if (!progressed) {
      memset(t->busy, 0, (size_t)t->size);
      for (int i = 0; i < n; i++)
        if (!x[i].complete && !x[i].is_send) t->busy[x[i].peer] = 1;
      for (int p = 0; p < t->size && !progressed; p++) {
        rx_t *q = &t->rx[p];
        if (p == t->rank || t->busy[p] || q->drain_stop) continue;
        if (t->shm.in_ring[p])
          drain_shm = 1;
        else if (!q->readable)
          continue;
        q->readable = 0;
        int r = drain(t, p, why, sizeof why);
        if (r < 0) return drain_fail(t, p, r, what, why);
        progressed = r;
      }
      /* Sends and receives posted since: they may be what the peers wait for. */
      if (!progressed && feed) {
        int had = n;
        FEED_MORE();
        progressed = n > had;
      }
    }
    if (progressed) {
      if (spin_until) spin_until = INT64_MAX;
      shm_spin_until = 0;
      idle_passes = 0;
      if (armed) tdist__shm_sleep_cancel(&t->shm.own);
      armed = 0;
      continue;
    }
    int on_shm = 0, on_tcp = 0;
    for (int i = 0; i < n; i++) {
      if (x[i].complete) continue;
      if (x[i].is_send ? t->shm.out_ring[x[i].peer] : t->shm.in_ring[x[i].peer])
        on_shm = 1;
      else
        on_tcp = 1;
    }
    /* The clock costs as much as a look at the rings: read it on every 16th idle pass, and on
     * rings not before the fourth (most small messages arrive within the first few looks). */
    unsigned pass = idle_passes++;
    if (on_shm && !on_tcp && !shm_spin_until && pass < 3) {
      if (t->yield && t->pure_spin_ns == 0)
        sched_yield();
      else
        tdist__cpu_relax();
      continue;
    }
    if ((pass & 15) == 0 || !shm_spin_until) now = tdist__now_ns();
    if (spin_until == INT64_MAX) spin_until = now + t->spin_ns;
    if (on_shm) {
      /* Rings have no fd to sleep on: spin a while (yielding when ranks outnumber cores), then
       * fall through to a 1 ms poll that also watches for the peer's death. */
      if (!shm_spin_until) {
        shm_spin_start = now;
        shm_spin_until = now + t->shm_spin_ns;
      }
      if (now < shm_spin_until) {
        /* A few microseconds of pure spinning catch a peer that is running; after that, yield
         * so a peer waiting for this core gets it. */
        if (t->yield && now - shm_spin_start >= t->pure_spin_ns)
          sched_yield();
        else
          tdist__cpu_relax();
        continue;
      }
      if (!on_tcp) {
        /* Only rings pending: sleep on our doorbell. Arm first, make one more pass over the
         * rings (a peer that moved bytes before seeing us armed is caught there), then sleep;
         * a peer that moves bytes afterwards wakes us. The 1 ms cap bounds any lost wake-up
         * and lets the poll below (timeout 0) notice dead peers and aborts. */
        if (!armed) {
          doorbell_seen = tdist__shm_sleep_prepare(&t->shm.own);
          armed = 1;
          continue;
        }
        tdist__shm_sleep(&t->shm.own, doorbell_seen, 1000);
        armed = 0;
      }
    } else if (spin_until && now < spin_until) {
      if (t->crowded) sched_yield();
      continue;
    }
    slept = 1;
    /* Block in poll on every transfer that can move, plus the abort eventfd. Shared-memory peers
     * have no fd to wake us: poll their TCP socket (which only ever reports the peer's death)
     * with a short timeout and look at the rings again. */
    int np = 0;
    for (int i = 0; i < n; i++) {
      if (x[i].complete || blocked(x, i)) continue;
      int shm =
          x[i].is_send ? t->shm.out_ring[x[i].peer] != NULL : t->shm.in_ring[x[i].peer] != NULL;
      t->pfds[np] = (struct pollfd){.fd = t->fds[x[i].peer],
                                    .events = shm ? POLLRDHUP : (x[i].is_send ? POLLOUT : POLLIN)};
      t->pidx[np++] = i;
      if (np == 2 * t->size) break; /* pfds holds 3 * size + 2 entries */
    }
    int nx = np; /* then the sockets of peers to drain (pidx: -1 - peer) */
    for (int p = 0; p < t->size; p++) {
      if (p == t->rank || t->busy[p] || t->rx[p].drain_stop || t->shm.in_ring[p]) continue;
      t->pfds[np] = (struct pollfd){.fd = t->fds[p], .events = POLLIN};
      t->pidx[np++] = -1 - p;
    }
    t->pfds[np] = (struct pollfd){.fd = cfg->abort_fd, .events = POLLIN};
    int nfds = np + 1;
    if (feed) t->pfds[nfds++] = (struct pollfd){.fd = t->wake_fd, .events = POLLIN};
    int timeout = tdist__poll_timeout(deadline);
    if (on_shm && timeout > 1) timeout = on_tcp ? 1 : 0; /* ring-only waits slept above */
    /* A same-host peer's ring has no fd: look at it again within 10 ms. */
    if (drain_shm && timeout > 10) timeout = 10;
    int r = poll(t->pfds, (nfds_t)nfds, timeout);
    if (feed && r > 0 && t->pfds[np + 1].revents) {
      uint64_t v;
      if (read(t->wake_fd, &v, sizeof v) < 0) { /* EAGAIN: another reader; nothing to do */
      }
    }
    for (int k = nx; r > 0 && k < np; k++)
      if (t->pfds[k].revents) t->rx[-1 - t->pidx[k]].readable = 1;
    if (on_shm && r > 0) {
      /* A same-host peer closed its socket: it exited. Its last messages may still sit in the
       * ring, so only fail once a full pass over the rings makes no progress. */
      for (int k = 0; k < nx; k++) {
        tdist__xfer_t *xk = &x[t->pidx[k]];
        int shm =
            xk->is_send ? t->shm.out_ring[xk->peer] != NULL : t->shm.in_ring[xk->peer] != NULL;
        if (shm && (t->pfds[k].revents & (POLLRDHUP | POLLHUP | POLLERR))) {
          if (gone_seen[xk->peer])
            return tdist__transport_fail(
                cfg, TDIST_ERR_REMOTE,
                "%s: rank %d (%s, same host) closed its connection (did that "
                "process exit or crash?)",
                tdist__what(name_of(xk, what, &xwhat)), xk->peer, t->addr[xk->peer]);
          gone_seen[xk->peer] = 1;
        }
      }
    }
    if (r < 0 && errno != EINTR)
      return tdist__transport_fail(cfg, TDIST_ERR_SYSTEM, "%s: poll: %s", tdist__what(what),
                                   strerror(errno));
    if (r == 0 && tdist__now_ms() >= deadline && feed) {
      tdist__xfer_t *xf = &x[first]; /* the one whose deadline passed */
      return tdist__transport_fail(
          cfg, TDIST_ERR_TIMEOUT,
          "%s: timed out after %lld ms waiting for rank %d (%s) (stuck, or no "
          "matching %s posted there?)",
          tdist__what(name_of(xf, what, &xwhat)), (long long)cfg->timeout_ms, xf->peer,
          t->addr[xf->peer], xf->is_send ? "receive" : "send");
    }
    if (r == 0 && tdist__now_ms() >= deadline) {
      char ranks[200] = "";
      size_t rl = 0;
      for (int i = 0; i < n && rl + 40 < sizeof ranks; i++)
        if (!x[i].complete)
          rl += (size_t)snprintf(ranks + rl, sizeof ranks - rl, "%s%d (%s)", rl ? ", " : "",
                                 x[i].peer, t->addr[x[i].peer]);
      return tdist__transport_fail(cfg, TDIST_ERR_TIMEOUT,
                                   "%s: timed out after %lld ms waiting for rank %s (stuck, or not "
                                   "calling the same collective?)",
                                   tdist__what(what), (long long)cfg->timeout_ms, ranks);
    }
  }
}
#undef FEED_MORE

/* Failed with single copies still unread: their buffers go back to the caller now. */
static void revoke_unread(tcp_t *t, const tdist__xfer_t *x, int n) {
  for (int i = 0; i < n; i++)
    if (x[i].is_send && x[i].copy_seq && !x[i].complete)
      tdist__shm_ring_revoke(t->shm.out_ring[x[i].peer], x[i].copy_seq);
}

tdist_status_t tdist__tcp_exchange(tdist__transport_t *base, tdist__xfer_t *x, int n,
                                   int64_t deadline, tdist__what_t *what) {
  tcp_t *t = (tcp_t *)base;
  tdist_status_t st = exchange(t, x, n, NULL, deadline, what);
  if (st) revoke_unread(t, x, n);
  return st;
}

/* t->fed's slots past the transfers in flight are marked complete (settle, feed_more), so
 * revoke_unread may read them all. */
tdist_status_t tdist__tcp_exchange_fed(tdist__transport_t *base, tdist__xfer_feed_t *feed,
                                       tdist__what_t *what) {
  tcp_t *t = (tcp_t *)base;
  tdist_status_t st = exchange(t, t->fed, 0, feed, 0, what);
  if (st) revoke_unread(t, t->fed, t->fed_cap);
  return st;
}

void tdist__tcp_wake(tdist__transport_t *base) {
  tcp_t *t = (tcp_t *)base;
  uint64_t one = 1;
  if (write(t->wake_fd, &one, sizeof one) < 0) { /* EAGAIN: the counter is full, so it is set */
  }
  if (t->shm.own.base) tdist__shm_ring_doorbell(&t->shm.own); /* a sleep on the rings */
}
