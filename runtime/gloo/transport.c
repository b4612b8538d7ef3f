/* The gloo transport's factory (transport.h): connects the full TCP mesh (tcp/), links
 * same-host pairs through shared-memory rings where both sides can (shm/, confirmed by one flag
 * byte each way over TCP), gives each peer its link (a socket's, or the rings') and tunes
 * spinning and socket buffers. Also destroy, hangup and wake. The data path is stream.c, the
 * progress loop progress.c and wait.c. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "runtime/common/param.h"
#include "runtime/gloo/transport_internal.h"

#define SETUP_TAG (TDIST__XFER_COLL_TAG | 0x7ffffffeu) /* the pair check, before any collective */

static void mesh_destroy(tdist__transport_t *base) {
  mesh_t *t = (mesh_t *)base;
  tdist__shm_links_close(&t->shm, t->size);
  if (t->rx)
    for (int i = 0; i < t->size; i++) {
      free(t->rx[i].ahead);
      tdist__early_free(&t->rx[i]);
    }
  free(t->rx);
  free(t->busy);
  free(t->gone);
  if (t->fds)
    for (int i = 0; i < t->size; i++)
      if (t->fds[i] >= 0) close(t->fds[i]);
  free(t->fds);
  free(t->addr);
  free(t->link);
  free(t->tcp);
  free(t->pfds);
  free(t->pidx);
  if (t->wake_fd >= 0) close(t->wake_fd);
  free(t->fed);
  free(t);
}

static void mesh_hangup(tdist__transport_t *base) {
  mesh_t *t = (mesh_t *)base;
  if (t->link)
    for (int i = 0; i < t->size; i++) t->link[i]->ops->hangup(t->link[i]);
}

static void mesh_wake(tdist__transport_t *base) {
  mesh_t *t = (mesh_t *)base;
  uint64_t one = 1;
  if (write(t->wake_fd, &one, sizeof one) < 0) { /* EAGAIN: the counter is full, so it is set */
  }
  tdist__shm_links_wake(&t->shm); /* a sleep on the rings */
}

/* The transport's state for cfg, every array allocated (NULL: out of memory, nothing left). */
static mesh_t *mesh_alloc(const tdist__transport_cfg_t *cfg) {
  mesh_t *t = calloc(1, sizeof *t);
  if (!t) return NULL;
  t->wake_fd = -1;
  t->base.exchange = tdist__mesh_exchange;
  t->base.exchange_fed = tdist__mesh_exchange_fed;
  t->base.wake = mesh_wake;
  t->base.destroy = mesh_destroy;
  t->base.hangup = mesh_hangup;
  t->cfg = *cfg;
  t->rank = cfg->rank;
  t->size = cfg->size;
  size_t n = (size_t)t->size;
  t->fds = malloc(sizeof(int) * n);
  t->addr = calloc(n, sizeof *t->addr);
  t->link = calloc(n, sizeof *t->link);
  t->tcp = calloc(n, sizeof *t->tcp);
  t->pfds = calloc(3 * n + 2, sizeof *t->pfds);
  t->pidx = calloc(3 * n + 1, sizeof *t->pidx);
  int shm_r = tdist__shm_links_alloc(&t->shm, t->size);
  t->gone = calloc(n, 1);
  t->busy = calloc(n, 1);
  t->rx = calloc(n, sizeof *t->rx);
  if (t->fds)
    for (int i = 0; i < t->size; i++) t->fds[i] = -1;
  if (!t->fds || !t->addr || !t->link || !t->tcp || !t->pfds || !t->pidx || shm_r || !t->gone ||
      !t->busy || !t->rx) {
    mesh_destroy(&t->base);
    return NULL;
  }
  for (int i = 0; i < t->size; i++) { /* every pair's socket link, until shm/ links it */
    tdist__tcp_link_init(&t->tcp[i], i, t->addr[i], -1);
    t->link[i] = &t->tcp[i].base;
  }
  t->early_max = (size_t)tdist__param_int(TDIST__P_P2P_BUFFER_MB) << 20;
  t->shm_spin_ns = (int64_t)tdist__param_int(TDIST__P_SHM_SPIN_US) * 1000;
  t->yield = (int)tdist__param_int(TDIST__P_SHM_YIELD);
  return t;
}

/* Same-host pairs through shared memory: the segments (shm/), one flag byte each way over the
 * sockets (every link is still TCP), then the rings' links for the pairs both sides mapped. */
static tdist_status_t link_same_host(mesh_t *t, const int *same, int64_t deadline) {
  const int size = t->size;
  int nsame = 0;
  for (int i = 0; i < size; i++) nsame += same[i];
  if (nsame == 0) return TDIST_OK;
  uint8_t *flag_out = calloc((size_t)size, 1), *flag_in = calloc((size_t)size, 1);
  tdist__xfer_t *x = calloc(2 * (size_t)size, sizeof *x);
  tdist_status_t st;
  if (!flag_out || !flag_in || !x) {
    st = tdist__transport_fail(&t->cfg, TDIST_ERR_NO_MEMORY, "tcp transport: out of memory");
    goto done;
  }
  if ((st = tdist__shm_links_prepare(&t->shm, &t->cfg, same, deadline, flag_out))) goto done;
  int n = 0;
  for (int i = 0; i < size; i++) {
    if (!same[i]) continue;
    x[n++] =
        (tdist__xfer_t){.peer = i, .is_send = 1, .buf = &flag_out[i], .len = 1, .tag = SETUP_TAG};
    x[n++] =
        (tdist__xfer_t){.peer = i, .is_send = 0, .buf = &flag_in[i], .len = 1, .tag = SETUP_TAG};
  }
  tdist__what_t what = {.fixed = "shared-memory setup"};
  st = t->base.exchange(&t->base, x, n, deadline, &what);
  tdist__shm_links_finish(&t->shm, &t->cfg, same, flag_out, flag_in, st);
  for (int i = 0; !st && i < size; i++)
    if (t->shm.linked[i]) t->link[i] = tdist__shm_link_attach(&t->shm, i, t->addr[i], t->fds[i]);
done:
  free(flag_out);
  free(flag_in);
  free(x);
  return st;
}

/* Waiting ranks spin before they sleep (a peer that is running answers within microseconds).
 * When this host's ranks outnumber its CPUs, the peer a rank waits for may need the very core
 * it spins on: then every spin yields the CPU from the start, so the rank with work gets it
 * (4 ranks on 2 cores, 8 B..4 KiB all_reduce over rings: 21-43 us when the first 20 us of the
 * spin did not yield, 3-6 us now; over TCP, where such groups used not to spin at all: 23-30 us
 * before, 16-19 us yielding for up to 200 us). */
static void tune(mesh_t *t, const int *same) {
  long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
  int local = 1;
  for (int i = 0; i < t->size; i++) local += same[i];
  t->crowded = local > ncpu;
  t->base.single_host = local == t->size;
  t->spin_us = tdist__param_is_set(TDIST__P_SPIN_US) ? (int)tdist__param_int(TDIST__P_SPIN_US)
                                                     : (t->crowded ? 200 : 50);
  t->spin_max_ns = t->spin_ns = (int64_t)t->spin_us * 1000;
  t->pure_spin_ns = t->crowded ? 0 : SHM_PURE_SPIN_NS;
  /* TCP between ranks of one host (TDIST_SHM=0, or no shared memory): a send buffer of
   * LOCAL_SNDBUF (the kernel doubles it), not the megabytes autotuning grows to, keeps the bytes
   * in flight in cache between the sender's copy in and the receiver's copy out (2 ranks on 2
   * cores, alternating runs: 4 MiB broadcast 488-549 -> 354-380 us, 16 MiB all_reduce 4183 ->
   * 3477, all_gather 2396 -> 2077). Not when ranks outnumber cores: a sender that fills the
   * smaller buffer then waits for its receiver to get a core (4 ranks on 2 cores, 1 MiB
   * broadcast 159-186 -> 250-304 us). */
  if (!t->crowded)
    for (int i = 0; i < t->size; i++)
      if (same[i] && t->fds[i] >= 0) tdist__tcp_small_sndbuf(t->fds[i], LOCAL_SNDBUF);
}

tdist_status_t tdist__transport_create(const tdist__transport_cfg_t *cfg, int64_t deadline,
                                       tdist__transport_t **out) {
  mesh_t *t = mesh_alloc(cfg);
  if (!t) return tdist__transport_fail(cfg, TDIST_ERR_NO_MEMORY, "tcp transport: out of memory");
  t->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (t->wake_fd < 0) {
    tdist_status_t st =
        tdist__transport_fail(cfg, TDIST_ERR_SYSTEM, "tcp transport: eventfd: %s", strerror(errno));
    mesh_destroy(&t->base);
    return st;
  }
  if (t->size == 1) {
    *out = &t->base;
    return TDIST_OK;
  }
  int *same = calloc((size_t)t->size, sizeof *same);
  if (!same) {
    mesh_destroy(&t->base);
    return tdist__transport_fail(cfg, TDIST_ERR_NO_MEMORY, "tcp transport: out of memory");
  }
  tdist_status_t st = tdist__tcp_mesh_connect(&t->cfg, deadline, t->fds, t->addr, same);
  if (!st) {
    for (int i = 0; i < t->size; i++) t->tcp[i].fd = t->fds[i];
    if (tdist__param_int(TDIST__P_SHM)) st = link_same_host(t, same, deadline);
    tune(t, same);
  }
  free(same);
  if (st) {
    mesh_destroy(&t->base);
    return st;
  }
  *out = &t->base;
  return TDIST_OK;
}
