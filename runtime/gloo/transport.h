/* The transport interface that every gloo algorithm is written against (Gloo's design): a set
 * of point-to-point transfers progressed together until all complete, the deadline passes or the
 * group is aborted. Messages between two ranks arrive in the order they were sent; each carries a
 * small header so a size mismatch (ranks disagreeing about a collective) is an error, not a
 * silent desynchronisation. Collectives' messages (tags with TDIST__XFER_COLL_TAG) must be
 * received in that order. Send/recv messages (tags without it) are matched by peer and tag: one
 * that arrives before its receive (sent early, or out of tag order) is held by the transport, up
 * to TDIST_P2P_BUFFER_MB per group, until a receive of its tag takes it; while a send waits for
 * room, the transport also takes such messages off that peer's stream, so two ranks sending each
 * other large messages before receiving do not wait on each other. */
#ifndef TDIST_GLOO_TRANSPORT_H
#define TDIST_GLOO_TRANSPORT_H

#include <stddef.h>
#include <stdint.h>

#include "runtime/gloo/link/link.h"
#include "tdist/status.h"

typedef struct tdist__what tdist__what_t; /* runtime/pg/backend.h */

#define TDIST__XFER_COLL_TAG                                          \
  0x80000000u /* set in every collective's tags, never in send/recv's \
               */

typedef struct {
  int peer;     /* group rank */
  int is_send;  /* 1 send, 0 receive */
  void *buf;    /* send: data (read only); receive: destination */
  size_t len;   /* bytes; a receive must match the sender's length exactly */
  uint32_t tag; /* must match between sender and receiver */
  /* Same-host sends of at least this many bytes go by single copy (the receiver reads them
   * from the sender's memory); 0: the transport's default, for sends the receiver reduces. */
  size_t copy_min;
  /* exchange_fed only: the transfer's own deadline (CLOCK_MONOTONIC ms), the caller's handle for
   * feed->done, and the (kind, seq) that name it in errors (what_seq 0: the call's `what`). */
  int64_t deadline_ms;
  void *user;
  int what_kind;
  uint64_t what_seq;
  /* progress state, owned by the transport (zero before the call) */
  size_t done;
  uint8_t hdr[16];
  size_t hdr_done;
  uint64_t copy_seq; /* a single-copy send: its number on the pair (0: not one, or not yet sent) */
  int complete;
} tdist__xfer_t;

/* Where exchange_fed gets transfers posted while it runs (the async worker's sends and
 * receives), and whom it tells as each one completes. */
typedef struct tdist__xfer_feed tdist__xfer_feed_t;
struct tdist__xfer_feed {
  /* Writes up to cap transfers posted since the last call at x (caller fields set, progress
   * state zero) and returns how many; 0: none. Never blocks. */
  int (*take)(tdist__xfer_feed_t *f, tdist__xfer_t *x, int cap);
  /* x, which take wrote, completed (its buffer is the caller's again). */
  void (*done)(tdist__xfer_feed_t *f, tdist__xfer_t *x);
};

typedef struct tdist__transport tdist__transport_t;
struct tdist__transport {
  /* Progresses all transfers; returns when all are complete (TDIST_OK), or on the deadline
   * (TDIST_ERR_TIMEOUT), abort, or a peer failure, after writing the detail (peer rank and
   * address) through the config's fail. `what` names the collective. */
  tdist_status_t (*exchange)(tdist__transport_t *t, tdist__xfer_t *x, int n, int64_t deadline_ms,
                             tdist__what_t *what);
  /* Send/recv posted in any order: progresses the transfers feed->take gives together, taking
   * newly posted ones while it waits (as many as are posted: the transport holds them), so
   * that no transfer waits for one posted after it; each completes on its own (feed->done) or
   * fails at its deadline_ms. The order rule above still holds: per peer and direction,
   * transfers move in the order taken. Returns TDIST_OK once every transfer taken is done and
   * take gives no more; on failure (as exchange) every transfer not reported done failed. */
  tdist_status_t (*exchange_fed)(tdist__transport_t *t, tdist__xfer_feed_t *feed,
                                 tdist__what_t *what);
  /* Makes a waiting exchange_fed call take again soon (a transfer was posted). Any thread. */
  void (*wake)(tdist__transport_t *t);
  void (*destroy)(tdist__transport_t *t);
  /* Shuts down every connection (the descriptors stay open until destroy) so that peers
   * blocked on this rank see it leave at once instead of at their deadline. Any thread. */
  void (*hangup)(tdist__transport_t *t);
  /* Every rank of the group runs on this host (the same on every rank: an algorithm chosen by
   * it is chosen alike everywhere). */
  int single_host;
};

/* The factory (transport.c): connects every pair of the group's ranks by TCP (tcp/: addresses go
 * through cfg->store), then links same-host pairs through shared memory where both can (shm/),
 * before deadline_ms; each peer's transfers then go through its link, whichever it is.
 * tdist__transport_cfg_t and its fail: link/link.h. */
tdist_status_t tdist__transport_create(const tdist__transport_cfg_t *cfg, int64_t deadline_ms,
                                       tdist__transport_t **out);

#endif
