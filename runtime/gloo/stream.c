/* The per-peer message streams of the gloo transport (transport_internal.h), over any link.
 *
 * Every message is a 16-byte header (magic, tag, length) and the payload (link/link.h), sent
 * with one send of the link where possible; receives read header and payload with one receive.
 * Receives read each peer's stream through rx_t: a send/recv message that no receive of this
 * call is for is held as an early_t (early.c) until a receive of its tag takes it; a call that
 * waits also takes such messages off the streams of peers it does not receive from (drain), so
 * their sends complete. Single copies (a same-host link's copy_post/copy_in) carry the
 * payload's address instead of the payload. Never blocks: the progress loop is progress.c. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>

#include "runtime/common/bytes.h"
#include "runtime/common/sock.h"
#include "runtime/gloo/transport_internal.h"

/* Reads from peer's stream into iov: the bytes read ahead first, then its link.
 * Returns the count, 0 when nothing is there yet, or -errno (-TDIST__ECLOSED: it closed). */
static inline ssize_t rx_read(mesh_t *t, int peer, const struct iovec *iov, int n) {
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
  tdist__link_t *l = t->link[peer];
  return l->ops->recv(l, iov, n);
}

ssize_t tdist__rx_read(mesh_t *t, int peer, const struct iovec *iov, int n) {
  return rx_read(t, peer, iov, n);
}

/* Puts k bytes back in front of peer's stream (read for a message they did not belong to). */
int tdist__rx_unread(rx_t *q, const uint8_t *b, size_t k) {
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

/* Checks a message header read from peer's stream: a tdist message (plain or single-copy) of a
 * plausible length. 0, or -EPROTO with the detail in why. */
static int check_hdr(mesh_t *t, int peer, const uint8_t *hdr, char *why, size_t wcap) {
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
static int copy_addr(mesh_t *t, int peer, const uint8_t *first, size_t got, uint64_t *addr,
                     char *why, size_t wcap) {
  uint8_t a[8];
  size_t have = got < 8 ? got : 8;
  if (have) memcpy(a, first, have);
  if (got > 8 && tdist__rx_unread(&t->rx[peer], first + 8, got - 8)) return -ENOMEM;
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
  if (!t->link[peer]->ops->copy_in) {
    snprintf(why, wcap, "rank %d (%s) sent a single-copy message over TCP", peer, t->addr[peer]);
    return -EPROTO;
  }
  return 1;
}

static int step_recv(mesh_t *t, tdist__xfer_t *x, char *why, size_t wcap) {
  rx_t *q = &t->rx[x->peer];
  if (q->filling) return tdist__early_fill(t, x->peer); /* the stream's next bytes are its */
  if (x->hdr_done == 0 && x->done == 0 && q->head && !(x->tag & TDIST__XFER_COLL_TAG)) {
    int r = tdist__early_take(t, x, why, wcap);
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
      return copy ? tdist__early_copy(t, x->peer, tag, (size_t)len, addr, why, wcap)
                  : tdist__early_start(t, x->peer, tag, (size_t)len, x->buf, got, why, wcap);
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
      tdist__link_t *l = t->link[x->peer];
      int r = l->ops->copy_in(l, x->buf, addr, x->len, why, wcap);
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
int tdist__mesh_drain(mesh_t *t, int peer, char *why, size_t wcap) {
  rx_t *q = &t->rx[peer];
  if (q->filling) {
    int r = tdist__early_fill(t, peer);
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
    if (tdist__rx_unread(q, hdr, got)) return -ENOMEM;
    q->drain_stop = got == 16 || closed;
    return 0;
  }
  int bad = check_hdr(t, peer, hdr, why, wcap);
  if (bad) return bad;
  uint64_t len = tdist__get_u64(hdr + 8), addr;
  if (tdist__get_u32(hdr) == MSG_MAGIC_COPY) {
    int r = copy_addr(t, peer, NULL, 0, &addr, why, wcap);
    return r < 0 ? r : tdist__early_copy(t, peer, tag, (size_t)len, addr, why, wcap);
  }
  return tdist__early_start(t, peer, tag, (size_t)len, NULL, 0, why, wcap);
}

/* A single-copy send: the header and the payload's address into the ring, then wait until the
 * receiver says it has copied the payload. */
static int step_send_copy(tdist__link_t *l, tdist__xfer_t *x) {
  if (!x->copy_seq) {
    uint64_t seq = l->ops->copy_post(l, x->tag, x->buf, x->len);
    if (!seq) return 0;
    x->copy_seq = seq;
    x->hdr_done = 16;
    return 1;
  }
  if (!l->ops->copy_acked(l, x->copy_seq)) return 0;
  x->done = x->len;
  x->complete = 1;
  return 1;
}

/* Moves one transfer forward without blocking. 1 = progressed, 0 = would block, <0 = -errno,
 * -EPROTO = header mismatch, -ENOBUFS = too much held for receives (detail in *why). */
int tdist__mesh_step(mesh_t *t, tdist__xfer_t *x, char *why, size_t wcap) {
  if (!x->is_send) return step_recv(t, x, why, wcap);
  tdist__link_t *l = t->link[x->peer];
  if (l->copy_to && x->len >= (x->copy_min ? x->copy_min : COPY_MIN_BYTES))
    return step_send_copy(l, x);
  if (x->hdr_done == 0 && x->done == 0) {
    tdist__put_u32(x->hdr, MSG_MAGIC);
    tdist__put_u32(x->hdr + 4, x->tag);
    tdist__put_u64(x->hdr + 8, x->len);
  }
  struct iovec iov[2];
  int n = 0;
  if (x->hdr_done < 16) iov[n++] = (struct iovec){x->hdr + x->hdr_done, 16 - x->hdr_done};
  if (x->done < x->len) iov[n++] = (struct iovec){(char *)x->buf + x->done, x->len - x->done};
  ssize_t w = l->ops->send(l, iov, n);
  if (w <= 0) return (int)w;
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
