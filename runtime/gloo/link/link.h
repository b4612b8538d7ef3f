/* What the gloo transport's parts share, below all of them: the configuration a transport is
 * created with (transport.h re-exports it), its error sink, the message framing every link
 * carries, and the per-peer link interface that tcp/ (a socket) and shm/ (same-host rings)
 * implement. The progress loop (runtime/gloo/progress.c) moves every message through a peer's
 * link without knowing which kind it is, except for how to wait (`polls`).
 *
 * A link carries one byte stream each way. Every message is a 16-byte header (magic, tag,
 * length) and the payload; a single-copy message (shm only) is the header with MSG_MAGIC_COPY
 * and the payload's 8-byte address in the sender's memory, which the receiver reads with
 * copy_in and acknowledges; the sender's send completes then. */
#ifndef TDIST_GLOO_LINK_LINK_H
#define TDIST_GLOO_LINK_LINK_H

#include <poll.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>

#include "tdist/status.h"
#include "tdist/store.h"

/* What a transport needs of the group that creates it (the group itself stays the backend's).
 * Everything is borrowed and must outlive the transport; the transport copies the struct. */
typedef struct tdist__transport_cfg {
  int rank, size;
  /* Where ranks exchange their addresses (keys gloo/<rank>, shm/<rank>). Borrowed: the transport
   * never changes its timeout, and its waits pass their own (tdist__store_multi_get_ms). */
  tdist_store_t *store;
  const char *name; /* the group's name: a peer's hello must carry its hash */
  const char
      *socket_ifname;   /* the interface to listen on; NULL: TDIST_SOCKET_IFNAME or automatic */
  int64_t timeout_ms;   /* the group's timeout, as error messages quote it */
  int abort_fd;         /* readable once the group is aborted */
  _Atomic int *aborted; /* nonzero once the group is aborted */
  /* Records a failure (the group's sticky error: peer rank and address in the text) and returns
   * st. Every error the transport returns went through it first. */
  tdist_status_t (*fail)(void *ctx, tdist_status_t st, const char *fmt, va_list ap);
  void *fail_ctx;
} tdist__transport_cfg_t;

/* Formats a failure and hands it to cfg->fail; returns what that returns (st). */
tdist_status_t tdist__transport_fail(const tdist__transport_cfg_t *cfg, tdist_status_t st,
                                     const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#define MSG_MAGIC 0x7d15c0deu
/* A single-copy message (same host, TDIST_SHM_SINGLE_COPY): the header, then the 8-byte address
 * of the payload in the sender's memory, which the receiver copies with process_vm_readv and
 * acknowledges through the ring's copy counter; the sender's send completes then. */
#define MSG_MAGIC_COPY 0x7d15c0dfu
#define MSG_HDR_BYTES 16

/* One peer's link. The progress loop calls it through ops (one indirect call per step). */
typedef struct tdist__link tdist__link_t;
typedef struct tdist__link_ops {
  /* Writes as many bytes of iov as fit now: the count, 0 (no room yet) or -errno. */
  ssize_t (*send)(tdist__link_t *l, const struct iovec *iov, int n);
  /* Reads what is there into iov: the count, 0 (nothing yet) or -errno (-TDIST__ECLOSED: the
   * peer closed its end). */
  ssize_t (*recv)(tdist__link_t *l, const struct iovec *iov, int n);
  /* What poll() waits on for a pending send (is_send) or receive: for a link that polls, its
   * data; else only the peer's death (the data moves without a descriptor: look again). */
  struct pollfd (*wait_on)(tdist__link_t *l, int is_send);
  /* Shuts the connection down so that the peer sees this rank leave at once. Any thread. */
  void (*hangup)(tdist__link_t *l);
  /* Single copies (NULL where the link has none, and then copy_to is 0). copy_post: the header
   * and the address of buf's len bytes to the peer: the message's number, or 0 (no room yet).
   * copy_acked: the peer has copied message seq. copy_revoke: the sender gives message seq
   * up (its buffer is the caller's again). copy_in: reads the peer's message of len bytes at
   * addr into dst and acknowledges it: 1, -TDIST__ECLOSED (the peer exited), -EPROTO or
   * -ECANCELED (the sender revoked it), with the detail in why. */
  uint64_t (*copy_post)(tdist__link_t *l, uint32_t tag, const void *buf, size_t len);
  int (*copy_acked)(tdist__link_t *l, uint64_t seq);
  void (*copy_revoke)(tdist__link_t *l, uint64_t seq);
  int (*copy_in)(tdist__link_t *l, void *dst, uint64_t addr, size_t len, char *why, size_t wcap);
} tdist__link_ops_t;

struct tdist__link {
  const tdist__link_ops_t *ops;
  int peer;         /* group rank at the other end */
  const char *addr; /* its address ("ip:port"), for error messages */
  int polls;        /* 1: poll() tells when data can move; 0: shared memory, look again */
  int copy_to;      /* 1: large sends may go as single copies (copy_post) */
};

#endif
