/* How the progress loop (progress.c) waits when no transfer can move (wait.c): the
 * spin/yield/doorbell policy and the poll() on sockets, the abort eventfd and the wake eventfd,
 * with the deadline's and a same-host peer's death's errors. */
#ifndef TDIST_GLOO_PROGRESS_H
#define TDIST_GLOO_PROGRESS_H

#include <stdint.h>

#include "runtime/gloo/transport_internal.h"

/* One exchange call's waiting state, from its start (idle_start) to its end (idle_end). */
typedef struct {
  int64_t spin_until; /* TCP spin: INT64_MAX spinning from the next idle pass (which reads the
                         clock) on; 0: not spinning */
  int slept;          /* the call slept in poll (spin_adapt halves the spin) */
  unsigned idle_passes;
  int64_t now;
  int64_t shm_spin_until, shm_spin_start;
  int armed; /* our doorbell says we are about to sleep */
  uint32_t doorbell_seen;
  uint8_t *gone_seen; /* peers whose death was seen once; failing on the second look */
} tdist__idle_t;

/* What the call waits for. */
typedef struct {
  tdist__xfer_t *x;
  int n;
  int feed;         /* exchange_fed: the wake eventfd is watched too */
  int64_t deadline; /* CLOCK_MONOTONIC ms */
  int first;        /* exchange_fed: the transfer whose deadline is `deadline` */
  tdist__what_t *what;
  int drain_shm; /* a same-host peer's ring was looked at for draining: look again soon */
} tdist__wait_t;

void tdist__idle_start(mesh_t *t, tdist__idle_t *w);
/* Something moved: the next wait starts its spin over. */
void tdist__idle_progressed(mesh_t *t, tdist__idle_t *w);
void tdist__idle_end(mesh_t *t, tdist__idle_t *w);
/* Nothing moved: spins, yields, sleeps on the doorbell or polls, once; then the loop looks at
 * the transfers again. TDIST_OK, or the failure (timeout, a dead same-host peer, poll). */
tdist_status_t tdist__idle_wait(mesh_t *t, tdist__idle_t *w, const tdist__wait_t *c);

int tdist__mesh_blocked(const tdist__xfer_t *x, int i);

#endif
