/* The per-peer link between same-host ranks (shm.h): bytes through the pair's rings, with the
 * peer's doorbell rung after every move (it may sleep on its rings), and single copies: the
 * header and the payload's address go through the ring, the receiver copies the payload
 * straight from the sender's memory (process_vm_readv) and counts it in the ring's copy counter,
 * which completes the sender's send. The pair's socket only tells when the peer dies. */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include "runtime/common/bytes.h"
#include "runtime/common/sock.h"
#include "runtime/gloo/shm/shm.h"

static ssize_t shm_send(tdist__link_t *base, const struct iovec *iov, int n) {
  tdist__shm_link_t *l = (tdist__shm_link_t *)base;
  size_t w = tdist__shm_ring_write(l->out_ring, iov, n);
  if (w == 0) return 0;
  tdist__shm_ring_doorbell(l->peer_seg); /* the owner may sleep on its rings */
  return (ssize_t)w;
}

static ssize_t shm_recv(tdist__link_t *base, const struct iovec *iov, int n) {
  tdist__shm_link_t *l = (tdist__shm_link_t *)base;
  int freed;
  size_t r = tdist__shm_ring_read(l->in_ring, iov, n, &freed);
  if (freed) tdist__shm_ring_doorbell(l->peer_seg); /* its writer may wait for space */
  return (ssize_t)r;
}

/* Rings have no descriptor: poll the socket, which only ever reports the peer's death. */
static struct pollfd shm_wait_on(tdist__link_t *base, int is_send) {
  (void)is_send;
  tdist__shm_link_t *l = (tdist__shm_link_t *)base;
  return (struct pollfd){.fd = l->fd, .events = POLLRDHUP};
}

static void shm_hangup(tdist__link_t *base) {
  tdist__shm_link_t *l = (tdist__shm_link_t *)base;
  if (l->fd >= 0) shutdown(l->fd, SHUT_RDWR);
}

static uint64_t shm_copy_post(tdist__link_t *base, uint32_t tag, const void *buf, size_t len) {
  tdist__shm_link_t *l = (tdist__shm_link_t *)base;
  uint8_t m[24];
  if (tdist__shm_ring_space(l->out_ring) < sizeof m) return 0;
  tdist__put_u32(m, MSG_MAGIC_COPY);
  tdist__put_u32(m + 4, tag);
  tdist__put_u64(m + 8, len);
  tdist__put_u64(m + 16, (uint64_t)(uintptr_t)buf);
  struct iovec iov = {m, sizeof m};
  tdist__shm_ring_write(l->out_ring, &iov, 1); /* all of it: there was room */
  tdist__shm_ring_doorbell(l->peer_seg);
  return ++l->copies_sent;
}

static int shm_copy_acked(tdist__link_t *base, uint64_t seq) {
  tdist__shm_link_t *l = (tdist__shm_link_t *)base;
  return tdist__shm_ring_copied_count(l->out_ring) >= seq;
}

static void shm_copy_revoke(tdist__link_t *base, uint64_t seq) {
  tdist__shm_link_t *l = (tdist__shm_link_t *)base;
  tdist__shm_ring_revoke(l->out_ring, seq);
}

/* Copies len bytes at addr in the peer's memory to dst and tells the peer its buffer is free. */
static int shm_copy_in(tdist__link_t *base, void *dst, uint64_t addr, size_t len, char *why,
                       size_t wcap) {
  tdist__shm_link_t *l = (tdist__shm_link_t *)base;
  size_t done = 0;
  while (done < len) {
    struct iovec lo = {(uint8_t *)dst + done, len - done},
                 r = {(void *)(uintptr_t)(addr + done), len - done};
    ssize_t n = process_vm_readv(l->pid, &lo, 1, &r, 1, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == ESRCH) return -TDIST__ECLOSED; /* it exited */
    if (n <= 0) {
      snprintf(why, wcap, "reading rank %d's (%s) message of %zu bytes from its memory: %s",
               base->peer, base->addr, len, n < 0 ? strerror(errno) : "nothing read");
      return -EPROTO;
    }
    done += (size_t)n;
  }
  if (tdist__shm_ring_is_revoked(l->in_ring, ++l->copies_recv)) {
    snprintf(why, wcap,
             "rank %d (%s) gave up on its message of %zu bytes while this rank copied it (that "
             "rank failed)",
             base->peer, base->addr, len);
    return -ECANCELED;
  }
  tdist__shm_ring_copied(l->in_ring);
  tdist__shm_ring_doorbell(l->peer_seg); /* the sender may sleep until then */
  return 1;
}

static const tdist__link_ops_t k_shm_ops = {.send = shm_send,
                                            .recv = shm_recv,
                                            .wait_on = shm_wait_on,
                                            .hangup = shm_hangup,
                                            .copy_post = shm_copy_post,
                                            .copy_acked = shm_copy_acked,
                                            .copy_revoke = shm_copy_revoke,
                                            .copy_in = shm_copy_in};

void tdist__shm_link_init(tdist__shm_link_t *sl, int peer, tdist__shm_ring_t *out_ring,
                          tdist__shm_ring_t *in_ring, tdist__shm_seg_t *peer_seg, int pid,
                          int copy_to) {
  *sl =
      (tdist__shm_link_t){.base = {.ops = &k_shm_ops, .peer = peer, .polls = 0, .copy_to = copy_to},
                          .fd = -1,
                          .out_ring = out_ring,
                          .in_ring = in_ring,
                          .peer_seg = peer_seg,
                          .pid = pid};
}

tdist__link_t *tdist__shm_link_attach(tdist__shm_links_t *l, int peer, const char *addr, int fd) {
  l->link[peer].base.addr = addr;
  l->link[peer].fd = fd;
  return &l->link[peer].base;
}
