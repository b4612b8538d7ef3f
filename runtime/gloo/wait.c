/* How the gloo transport's progress loop waits (progress.h): spinning, yielding, sleeping on
 * this rank's shared-memory doorbell, or blocking in poll() on the sockets of the transfers that
 * can move, the peers to drain, the group's abort eventfd and exchange_fed's wake eventfd, until
 * the deadline. Links that poll (sockets) wake poll; shared-memory links have no descriptor:
 * their socket only ever reports the peer's death. */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "runtime/common/clock.h"
#include "runtime/common/sock.h"
#include "runtime/gloo/progress.h"

void tdist__idle_start(mesh_t *t, tdist__idle_t *w) {
  *w = (tdist__idle_t){.spin_until = t->spin_ns > 0 ? INT64_MAX : 0, .gone_seen = t->gone};
  memset(w->gone_seen, 0, (size_t)t->size);
}

void tdist__idle_progressed(mesh_t *t, tdist__idle_t *w) {
  if (w->spin_until) w->spin_until = INT64_MAX;
  w->shm_spin_until = 0;
  w->idle_passes = 0;
  if (w->armed) tdist__shm_sleep_cancel(&t->shm.own);
  w->armed = 0;
}

void tdist__idle_end(mesh_t *t, tdist__idle_t *w) {
  if (w->armed) tdist__shm_sleep_cancel(&t->shm.own);
}

/* Spins, yields or sleeps on the doorbell before poll: 1 to look at the transfers again, 0 to
 * go on to poll. */
static int spin(mesh_t *t, tdist__idle_t *w, int on_shm, int on_tcp) {
  /* The clock costs as much as a look at the rings: read it on every 16th idle pass, and on
   * rings not before the fourth (most small messages arrive within the first few looks). */
  unsigned pass = w->idle_passes++;
  if (on_shm && !on_tcp && !w->shm_spin_until && pass < 3) {
    if (t->yield && t->pure_spin_ns == 0)
      sched_yield();
    else
      tdist__cpu_relax();
    return 1;
  }
  if ((pass & 15) == 0 || !w->shm_spin_until) w->now = tdist__now_ns();
  if (w->spin_until == INT64_MAX) w->spin_until = w->now + t->spin_ns;
  if (on_shm) {
    /* Rings have no fd to sleep on: spin a while (yielding when ranks outnumber cores), then
     * fall through to a 1 ms poll that also watches for the peer's death. */
    if (!w->shm_spin_until) {
      w->shm_spin_start = w->now;
      w->shm_spin_until = w->now + t->shm_spin_ns;
    }
    if (w->now < w->shm_spin_until) {
      /* A few microseconds of pure spinning catch a peer that is running; after that, yield
       * so a peer waiting for this core gets it. */
      if (t->yield && w->now - w->shm_spin_start >= t->pure_spin_ns)
        sched_yield();
      else
        tdist__cpu_relax();
      return 1;
    }
    if (!on_tcp) {
      /* Only rings pending: sleep on our doorbell. Arm first, make one more pass over the
       * rings (a peer that moved bytes before seeing us armed is caught there), then sleep;
       * a peer that moves bytes afterwards wakes us. The 1 ms cap bounds any lost wake-up
       * and lets the poll below (timeout 0) notice dead peers and aborts. */
      if (!w->armed) {
        w->doorbell_seen = tdist__shm_sleep_prepare(&t->shm.own);
        w->armed = 1;
        return 1;
      }
      tdist__shm_sleep(&t->shm.own, w->doorbell_seen, 1000);
      w->armed = 0;
    }
  } else if (w->spin_until && w->now < w->spin_until) {
    if (t->crowded) sched_yield();
    return 1;
  }
  return 0;
}

/* Block in poll on every transfer that can move, plus the abort eventfd. Shared-memory peers
 * have no fd to wake us: poll their TCP socket (which only ever reports the peer's death) with
 * a short timeout and look at the rings again. Fills t->pfds: the transfers' (pidx: their
 * index; *nx of them), then the sockets of peers to drain (pidx: -1 - peer), then the abort
 * eventfd; returns that one's index. */
static int fill_pollfds(mesh_t *t, const tdist__xfer_t *x, int n, int *nx) {
  int np = 0;
  for (int i = 0; i < n; i++) {
    if (x[i].complete || tdist__mesh_blocked(x, i)) continue;
    tdist__link_t *l = t->link[x[i].peer];
    t->pfds[np] = l->ops->wait_on(l, x[i].is_send);
    t->pidx[np++] = i;
    if (np == 2 * t->size) break; /* pfds holds 3 * size + 2 entries */
  }
  *nx = np;
  for (int p = 0; p < t->size; p++) {
    if (p == t->rank || t->busy[p] || t->rx[p].drain_stop || !t->link[p]->polls) continue;
    t->pfds[np] = (struct pollfd){.fd = t->fds[p], .events = POLLIN};
    t->pidx[np++] = -1 - p;
  }
  t->pfds[np] = (struct pollfd){.fd = t->cfg.abort_fd, .events = POLLIN};
  return np;
}

/* After poll returned r: marks the peers to drain that are readable, and fails when a
 * same-host peer's socket closed twice in a row. */
static tdist_status_t after_poll(mesh_t *t, tdist__idle_t *w, const tdist__wait_t *c, int r, int nx,
                                 int np, int on_shm) {
  tdist__what_t xwhat;
  for (int k = nx; r > 0 && k < np; k++)
    if (t->pfds[k].revents) t->rx[-1 - t->pidx[k]].readable = 1;
  if (on_shm && r > 0) {
    /* A same-host peer closed its socket: it exited. Its last messages may still sit in the
     * ring, so only fail once a full pass over the rings makes no progress. */
    for (int k = 0; k < nx; k++) {
      tdist__xfer_t *xk = &c->x[t->pidx[k]];
      if (!t->link[xk->peer]->polls && (t->pfds[k].revents & (POLLRDHUP | POLLHUP | POLLERR))) {
        if (w->gone_seen[xk->peer])
          return tdist__transport_fail(&t->cfg, TDIST_ERR_REMOTE,
                                       "%s: rank %d (%s, same host) closed its connection (did "
                                       "that process exit or crash?)",
                                       tdist__what(tdist__mesh_name_of(xk, c->what, &xwhat)),
                                       xk->peer, t->addr[xk->peer]);
        w->gone_seen[xk->peer] = 1;
      }
    }
  }
  return TDIST_OK;
}

/* The failure of a wait that reached its deadline. */
static tdist_status_t timed_out(mesh_t *t, const tdist__wait_t *c) {
  tdist__what_t xwhat;
  const tdist__xfer_t *x = c->x;
  if (c->feed) {
    const tdist__xfer_t *xf = &x[c->first]; /* the one whose deadline passed */
    return tdist__transport_fail(&t->cfg, TDIST_ERR_TIMEOUT,
                                 "%s: timed out after %lld ms waiting for rank %d (%s) (stuck, "
                                 "or no matching %s posted there?)",
                                 tdist__what(tdist__mesh_name_of(xf, c->what, &xwhat)),
                                 (long long)t->cfg.timeout_ms, xf->peer, t->addr[xf->peer],
                                 xf->is_send ? "receive" : "send");
  }
  char ranks[200] = "";
  size_t rl = 0;
  for (int i = 0; i < c->n && rl + 40 < sizeof ranks; i++)
    if (!x[i].complete)
      rl += (size_t)snprintf(ranks + rl, sizeof ranks - rl, "%s%d (%s)", rl ? ", " : "", x[i].peer,
                             t->addr[x[i].peer]);
  return tdist__transport_fail(&t->cfg, TDIST_ERR_TIMEOUT,
                               "%s: timed out after %lld ms waiting for rank %s (stuck, or not "
                               "calling the same collective?)",
                               tdist__what(c->what), (long long)t->cfg.timeout_ms, ranks);
}

tdist_status_t tdist__idle_wait(mesh_t *t, tdist__idle_t *w, const tdist__wait_t *c) {
  int on_shm = 0, on_tcp = 0;
  for (int i = 0; i < c->n; i++) {
    if (c->x[i].complete) continue;
    if (t->link[c->x[i].peer]->polls)
      on_tcp = 1;
    else
      on_shm = 1;
  }
  if (spin(t, w, on_shm, on_tcp)) return TDIST_OK;
  w->slept = 1;
  int nx, np = fill_pollfds(t, c->x, c->n, &nx);
  int nfds = np + 1;
  if (c->feed) t->pfds[nfds++] = (struct pollfd){.fd = t->wake_fd, .events = POLLIN};
  int timeout = tdist__poll_timeout(c->deadline);
  if (on_shm && timeout > 1) timeout = on_tcp ? 1 : 0; /* ring-only waits slept above */
  /* A same-host peer's ring has no fd: look at it again within 10 ms. */
  if (c->drain_shm && timeout > 10) timeout = 10;
  int r = poll(t->pfds, (nfds_t)nfds, timeout);
  if (c->feed && r > 0 && t->pfds[np + 1].revents) {
    uint64_t v;
    if (read(t->wake_fd, &v, sizeof v) < 0) { /* EAGAIN: another reader; nothing to do */
    }
  }
  tdist_status_t st = after_poll(t, w, c, r, nx, np, on_shm);
  if (st) return st;
  if (r < 0 && errno != EINTR)
    return tdist__transport_fail(&t->cfg, TDIST_ERR_SYSTEM, "%s: poll: %s", tdist__what(c->what),
                                 strerror(errno));
  if (r == 0 && tdist__now_ms() >= c->deadline) return timed_out(t, c);
  return TDIST_OK;
}
