/* The early p2p buffer (transport_internal.h's early_t): send/recv messages that arrived before
 * a receive for them, held per peer in arrival order up to TDIST_P2P_BUFFER_MB per group until a
 * receive of their tag takes them. stream.c reads them off a peer's stream; exchange's drain
 * (progress.c) calls it for peers it does not receive from, so their sends complete. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/gloo/transport_internal.h"

/* Starts holding an early message of len bytes (its header read) whose first `got` payload bytes
 * are at `first`. 1, or -ENOBUFS past the bound (detail in why), -ENOMEM. */
int tdist__early_start(mesh_t *t, int peer, uint32_t tag, size_t len, const uint8_t *first,
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
  if (got > len && tdist__rx_unread(q, first + len, got - len)) {
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
int tdist__early_fill(mesh_t *t, int peer) {
  early_t *e = t->rx[peer].filling;
  struct iovec iov = {e->data + e->done, e->len - e->done};
  ssize_t r = tdist__rx_read(t, peer, &iov, 1);
  if (r <= 0) return (int)r;
  e->done += (size_t)r;
  if (e->done == e->len) t->rx[peer].filling = NULL;
  return 1;
}

/* The receive x takes the first early message of its tag, if there is one: 1 (x complete),
 * 0 (none), -EPROTO (a length mismatch; detail in why). */
int tdist__early_take(mesh_t *t, tdist__xfer_t *x, char *why, size_t wcap) {
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

/* Holds a single-copy message (header read, address known) as an early message. */
int tdist__early_copy(mesh_t *t, int peer, uint32_t tag, size_t len, uint64_t addr, char *why,
                      size_t wcap) {
  int r = tdist__early_start(t, peer, tag, len, NULL, 0, why, wcap);
  if (r < 0) return r;
  early_t *e = t->rx[peer].tail;
  t->rx[peer].filling = NULL;
  e->done = len;
  tdist__link_t *l = t->link[peer];
  return l->ops->copy_in(l, e->data, addr, len, why, wcap);
}

void tdist__early_free(rx_t *q) {
  for (early_t *e = q->head, *nx; e; e = nx) {
    nx = e->next;
    free(e->data);
    free(e);
  }
  q->head = q->tail = q->filling = NULL;
}
