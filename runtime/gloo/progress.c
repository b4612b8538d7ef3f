/* The gloo transport's progress loop (transport.h's exchange and exchange_fed): tries every
 * transfer through its peer's link (stream.c) until all would block, then waits (wait.c: spin,
 * yield, sleep on the shared-memory doorbell, or poll() the sockets and the group's abort
 * eventfd) until the deadline. While nothing moves it takes send/recv messages off the streams
 * of peers it does not receive from (drain), so their sends complete. exchange_fed also takes
 * transfers posted while it runs and reports each one as it completes. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/gloo/progress.h"
#include "runtime/gloo/transport_internal.h"

/* 1 if an earlier incomplete transfer in the list uses the same peer and direction: messages
 * on one link must go in list order. */
int tdist__mesh_blocked(const tdist__xfer_t *x, int i) {
  for (int j = 0; j < i; j++)
    if (!x[j].complete && x[j].peer == x[i].peer && x[j].is_send == x[i].is_send) return 1;
  return 0;
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
static int feed_more(mesh_t *t, tdist__xfer_t **x, int n, tdist__xfer_feed_t *feed,
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

/* One pass over the transfers: drives each until it would block. *pending: how many are not
 * complete; *progressed, *completed: whether any moved, completed. TDIST_OK or a failure. */
static tdist_status_t pass(mesh_t *t, tdist__xfer_t *x, int n, tdist__what_t *what, int *pending,
                           int *progressed, int *completed) {
  tdist__what_t xwhat;
  char why[400];
  for (int i = 0; i < n; i++) {
    if (x[i].complete || tdist__mesh_blocked(x, i)) {
      *pending += !x[i].complete;
      continue;
    }
    for (;;) { /* drive this transfer until it would block */
      int r = tdist__mesh_step(t, &x[i], why, sizeof why);
      if (r < 0)
        return tdist__mesh_xfer_fail(t, &x[i], r, tdist__mesh_name_of(&x[i], what, &xwhat), why);
      if (r == 0 || x[i].complete) break;
      *progressed = 1;
    }
    if (!x[i].complete)
      (*pending)++;
    else
      *progressed = *completed = 1;
  }
  return TDIST_OK;
}

/* Nothing moved: takes send/recv messages off the streams of peers this call does not receive
 * from (rings: look; sockets: those poll found readable), so that their sends, which may be what
 * they wait in, complete. *progressed: one did; *drain_shm: a ring was looked at. */
static tdist_status_t drain_idle(mesh_t *t, const tdist__xfer_t *x, int n, tdist__what_t *what,
                                 int *progressed, int *drain_shm) {
  char why[400];
  memset(t->busy, 0, (size_t)t->size);
  for (int i = 0; i < n; i++)
    if (!x[i].complete && !x[i].is_send) t->busy[x[i].peer] = 1;
  for (int p = 0; p < t->size && !*progressed; p++) {
    rx_t *q = &t->rx[p];
    if (p == t->rank || t->busy[p] || q->drain_stop) continue;
    if (!t->link[p]->polls)
      *drain_shm = 1;
    else if (!q->readable)
      continue;
    q->readable = 0;
    int r = tdist__mesh_drain(t, p, why, sizeof why);
    if (r < 0) return tdist__mesh_drain_fail(t, p, r, what, why);
    *progressed = r;
  }
  return TDIST_OK;
}

/* Adaptive spinning (TCP): spin_ns grows while peers answer within the spin and halves when
 * we end up sleeping in poll anyway (a busy machine, or a slow peer), down to 0; at 0 it is
 * probed again every 128 calls. Spinning on a core the peer needs only delays it. */
static void spin_probe(mesh_t *t) {
  if (t->spin_ns == 0 && t->spin_max_ns > 0 && ++t->calls_without_spin >= 128) {
    t->spin_ns = t->spin_max_ns / 4;
    t->calls_without_spin = 0;
  }
}

static void spin_adapt(mesh_t *t, int slept) {
  if (t->spin_max_ns > 0) {
    if (slept)
      t->spin_ns = t->spin_ns / 2 < t->spin_max_ns / 16 ? 0 : t->spin_ns / 2;
    else if (t->spin_ns > 0)
      t->spin_ns = t->spin_ns + t->spin_max_ns / 4 > t->spin_max_ns
                       ? t->spin_max_ns
                       : t->spin_ns + t->spin_max_ns / 4;
  }
}

/* Progresses x[0..n) until all are complete. With a feed (exchange_fed), x has room for cap
 * transfers: completed ones are reported and removed as the call goes, and newly posted ones
 * are taken whenever nothing else moves; the call ends when none is left. */
static tdist_status_t exchange(mesh_t *t, tdist__xfer_t *x, int n, tdist__xfer_feed_t *feed,
                               int64_t deadline, tdist__what_t *what) {
  const tdist__transport_cfg_t *cfg = &t->cfg;
  tdist__what_t xwhat;
  tdist_status_t st;
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
  spin_probe(t);
  tdist__idle_t idle;
  tdist__idle_start(t, &idle);
  for (;;) {
    int pending = 0, progressed = 0, completed = 0;
    if ((st = pass(t, x, n, what, &pending, &progressed, &completed))) return st;
    if (feed && completed) n = settle(x, n, feed);
    if (!pending && feed) {
      FEED_MORE();
      if (n > 0) continue;
    }
    if (!pending) {
      tdist__idle_end(t, &idle);
      spin_adapt(t, idle.slept);
      return TDIST_OK;
    }
    if (atomic_load_explicit(cfg->aborted, memory_order_relaxed))
      return tdist__transport_fail(
          cfg, TDIST_ERR_ABORTED, "%s: aborted",
          tdist__what(n ? tdist__mesh_name_of(&x[0], what, &xwhat) : what));
    int drain_shm = 0;
    if (!progressed) {
      if ((st = drain_idle(t, x, n, what, &progressed, &drain_shm))) return st;
      /* Sends and receives posted since: they may be what the peers wait for. */
      if (!progressed && feed) {
        int had = n;
        FEED_MORE();
        progressed = n > had;
      }
    }
    if (progressed) {
      tdist__idle_progressed(t, &idle);
      continue;
    }
    tdist__wait_t w = {.x = x,
                       .n = n,
                       .feed = feed != NULL,
                       .deadline = deadline,
                       .first = first,
                       .what = what,
                       .drain_shm = drain_shm};
    if ((st = tdist__idle_wait(t, &idle, &w))) return st;
  }
}
#undef FEED_MORE

/* Failed with single copies still unread: their buffers go back to the caller now. */
static void revoke_unread(mesh_t *t, const tdist__xfer_t *x, int n) {
  for (int i = 0; i < n; i++)
    if (x[i].is_send && x[i].copy_seq && !x[i].complete) {
      tdist__link_t *l = t->link[x[i].peer];
      l->ops->copy_revoke(l, x[i].copy_seq);
    }
}

tdist_status_t tdist__mesh_exchange(tdist__transport_t *base, tdist__xfer_t *x, int n,
                                    int64_t deadline, tdist__what_t *what) {
  mesh_t *t = (mesh_t *)base;
  tdist_status_t st = exchange(t, x, n, NULL, deadline, what);
  if (st) revoke_unread(t, x, n);
  return st;
}

/* t->fed's slots past the transfers in flight are marked complete (settle, feed_more), so
 * revoke_unread may read them all. */
tdist_status_t tdist__mesh_exchange_fed(tdist__transport_t *base, tdist__xfer_feed_t *feed,
                                        tdist__what_t *what) {
  mesh_t *t = (mesh_t *)base;
  tdist_status_t st = exchange(t, t->fed, 0, feed, 0, what);
  if (st) revoke_unread(t, t->fed, t->fed_cap);
  return st;
}
