/* The group's async worker and its work handles (tdist_work_t): tdist__pg_submit queues a
 * validated collective and starts the worker thread on first use; the worker runs the queue in
 * order through tdist__pg_run (coll.c) and marks each work done under pg->mu; tdist_work_wait /
 * _test / _destroy read that state. The worker must never touch a work handle's memory after
 * marking it done unless the user already destroyed it (then the worker frees it), never hold
 * pg->mu while a collective runs, and never validate arguments (coll.c did). */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>
#include <time.h>

#include "runtime/pg/group.h"

#define TDIST__WORK_MAGIC 0x3c0a1d0bu

struct tdist_work_s {
  uint32_t magic; /* TDIST__WORK_MAGIC from submit until tdist_work_destroy */
  tdist_pg_t *pg;
  tdist__coll_t coll;
  int done;
  tdist_status_t status;
  int abandoned;         /* destroy was called before completion: the worker frees it */
  tdist_work_t *next;    /* in the queue, then in a p2p session's in-flight list */
  tdist__stats_op_t sop; /* a p2p session's: from take to done */
};

#define WORK_ENTRY(w, fn)                                                                      \
  do {                                                                                         \
    if (!(w) || (w)->magic != TDIST__WORK_MAGIC)                                               \
      return tdist__fail(TDIST_ERR_INVALID_ARGUMENT, fn ": work handle is NULL or destroyed"); \
  } while (0)

static int is_p2p(const tdist_work_t *w) {
  return w->coll.kind == TDIST__COLL_SEND || w->coll.kind == TDIST__COLL_RECV;
}

static tdist_work_t *pop(tdist_pg_t *pg) {
  tdist_work_t *w = pg->qhead;
  pg->qhead = w->next;
  if (!pg->qhead) pg->qtail = NULL;
  return w;
}

/* Under pg->mu: work w finished with st; wakes its waiters, frees it if the user destroyed it. */
static void finish(tdist_work_t *w, tdist_status_t st) {
  w->status = st;
  w->done = 1;
  if (w->abandoned) {
    tdist__coll_free_arrays(&w->coll);
    free(w);
  }
}

/* The worker's sends and receives in flight in the backend's run_p2p (the p2p_feed it takes
 * them from): they leave the queue as run_p2p takes them, live on `inflight` until done. */
typedef struct {
  tdist__p2p_feed_t base;
  tdist_pg_t *pg;
  unsigned seen;          /* pg->posted when take last looked at the queue */
  tdist_work_t *inflight; /* taken, not done (linked through next) */
} session_t;

static int session_take(tdist__p2p_feed_t *f, tdist__coll_t **c, int cap) {
  session_t *s = (session_t *)f;
  tdist_pg_t *pg = s->pg;
  unsigned posted = atomic_load_explicit(&pg->posted, memory_order_acquire);
  if (posted == s->seen) return 0;
  tdist_work_t *got[TDIST__P2P_BATCH_MAX];
  int n = 0;
  pthread_mutex_lock(&pg->mu);
  s->seen = posted;
  /* Only sends and receives at the head: a collective queued behind them runs after them. */
  while (n < cap && n < TDIST__P2P_BATCH_MAX && pg->qhead && is_p2p(pg->qhead)) got[n++] = pop(pg);
  if (n == TDIST__P2P_BATCH_MAX || n == cap) s->seen = posted - 1; /* more may be there */
  pthread_mutex_unlock(&pg->mu);
  for (int i = 0; i < n; i++) {
    tdist__pg_op_begin(pg, &got[i]->coll, &got[i]->sop);
    got[i]->next = s->inflight;
    s->inflight = got[i];
    c[i] = &got[i]->coll;
  }
  return n;
}

static void session_done(tdist__p2p_feed_t *f, tdist__coll_t *c) {
  session_t *s = (session_t *)f;
  tdist_pg_t *pg = s->pg;
  tdist_work_t *w = (tdist_work_t *)((char *)c - offsetof(tdist_work_t, coll)), **pp;
  for (pp = &s->inflight; *pp && *pp != w; pp = &(*pp)->next) {
  }
  if (*pp) *pp = w->next;
  tdist__stats_end(pg->stats_group, c, &w->sop, TDIST_OK);
  pthread_mutex_lock(&pg->mu);
  finish(w, TDIST_OK);
  pthread_cond_broadcast(&pg->cv);
  pthread_mutex_unlock(&pg->mu);
}

/* Runs the sends and receives at the queue's head, and every one posted while they run, through
 * the backend's run_p2p (called and returning with pg->mu held). */
static void run_session(tdist_pg_t *pg) {
  session_t s = {{session_take, session_done}, pg, 0, NULL};
  s.seen = atomic_load(&pg->posted) - 1; /* the first take looks at the queue */
  pg->p2p_open = 1;
  pg->running = 1; /* tdist__pg_drain and destroy must see work that left the queue */
  pthread_mutex_unlock(&pg->mu);
  tdist_status_t st = tdist__pg_run_p2p(pg, &s.base);
  /* Taken and not done: failed with st (TDIST_OK here would be the backend's bug). */
  if (!st && s.inflight)
    st = tdist__pg_fail(pg, TDIST_ERR_INTERNAL, "send/recv: the backend left work unfinished");
  for (tdist_work_t *w = s.inflight; w; w = w->next)
    tdist__stats_end(pg->stats_group, &w->coll, &w->sop, st);
  pthread_mutex_lock(&pg->mu);
  pg->p2p_open = 0;
  pg->running = 0;
  for (tdist_work_t *w = s.inflight, *nx; w; w = nx) {
    nx = w->next;
    finish(w, st);
  }
  /* A failure before anything was taken (the group was aborted) fails the sends and receives
   * at the head too, so the loop moves on. */
  while (st && pg->qhead && is_p2p(pg->qhead)) finish(pop(pg), st);
  pthread_cond_broadcast(&pg->cv);
}

/* Runs the queue in order: a collective alone, sends and receives in a session (run_session)
 * where the backend has run_p2p. */
static void *worker_main(void *arg) {
  tdist_pg_t *pg = arg;
  pthread_mutex_lock(&pg->mu);
  for (;;) {
    while (!pg->qhead && !pg->stopping) pthread_cond_wait(&pg->cv, &pg->mu);
    if (!pg->qhead) break; /* stopping and drained */
    if (pg->be->run_p2p && is_p2p(pg->qhead)) {
      run_session(pg);
      continue;
    }
    tdist_work_t *w = pop(pg);
    pg->running = 1;
    pthread_mutex_unlock(&pg->mu);
    tdist_status_t st = tdist__pg_run(pg, &w->coll);
    pthread_mutex_lock(&pg->mu);
    pg->running = 0;
    finish(w, st);
    pthread_cond_broadcast(&pg->cv);
  }
  pthread_mutex_unlock(&pg->mu);
  return NULL;
}

tdist_status_t tdist__pg_submit(tdist_pg_t *pg, const tdist__coll_t *c, tdist_work_t **work) {
  tdist_work_t *w = calloc(1, sizeof *w);
  if (!w) return tdist__pg_fail(pg, TDIST_ERR_NO_MEMORY, "async submit: out of memory");
  w->magic = TDIST__WORK_MAGIC;
  w->pg = pg;
  w->coll = *c;
  w->coll.async = 1;
  pthread_mutex_lock(&pg->mu);
  if (!pg->worker_started) {
    if (pthread_create(&pg->worker, NULL, worker_main, pg) != 0) {
      pthread_mutex_unlock(&pg->mu);
      free(w);
      return tdist__pg_fail(pg, TDIST_ERR_SYSTEM, "async submit: cannot start worker thread");
    }
    pg->worker_started = 1;
  }
  w->coll.seq = ++pg->seq;
  if (pg->qtail)
    pg->qtail->next = w;
  else
    pg->qhead = w;
  pg->qtail = w;
  atomic_fetch_add_explicit(&pg->posted, 1, memory_order_release);
  int wake = pg->p2p_open && is_p2p(w);
  pthread_cond_broadcast(&pg->cv);
  pthread_mutex_unlock(&pg->mu);
  /* A session waiting in the backend takes it at its next look; wake it for that look. */
  if (wake && pg->be->wake_p2p) pg->be->wake_p2p(&pg->b);
  *work = w;
  return TDIST_OK;
}

tdist_status_t tdist__pg_submit_wait(tdist_pg_t *pg, const tdist__coll_t *c) {
  tdist_work_t *w;
  tdist_status_t st = tdist__pg_submit(pg, c, &w);
  if (st) return st;
  /* Bounded: the op fails at its own deadline, as everything queued before it does. */
  pthread_mutex_lock(&pg->mu);
  while (!w->done) pthread_cond_wait(&pg->cv, &pg->mu);
  st = w->status;
  pthread_mutex_unlock(&pg->mu);
  w->magic = 0;
  free(w);
  if (st) tdist__fail(st, "%s", pg->err);
  return st;
}

void tdist__pg_drain(tdist_pg_t *pg) {
  if (!pg->worker_started) return;
  pthread_mutex_lock(&pg->mu);
  while (pg->qhead || pg->running) pthread_cond_wait(&pg->cv, &pg->mu);
  pthread_mutex_unlock(&pg->mu);
}

int tdist__pg_work_pending(tdist_pg_t *pg) {
  pthread_mutex_lock(&pg->mu);
  int busy = pg->qhead != NULL || pg->running;
  pthread_mutex_unlock(&pg->mu);
  return busy;
}

void tdist__pg_stop_worker(tdist_pg_t *pg) {
  pthread_mutex_lock(&pg->mu);
  int started = pg->worker_started;
  pg->stopping = 1;
  pthread_cond_broadcast(&pg->cv);
  pthread_mutex_unlock(&pg->mu);
  if (started) pthread_join(pg->worker, NULL);
  pg->worker_started = 0;
}

TDIST_EXTERN tdist_status_t tdist_work_wait(tdist_work_t *w, int64_t timeout_ms) {
  WORK_ENTRY(w, "tdist_work_wait");
  tdist_pg_t *pg = w->pg;
  /* The group's timeout: the op fails at its own deadline, which began when it started, with
   * the detail (the peer) that this wait cannot give; the second more lets that come first. */
  int64_t to = timeout_ms < 0 ? pg->b.timeout_ms + 1000 : timeout_ms;
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  ts.tv_sec += to / 1000;
  ts.tv_nsec += (to % 1000) * 1000000;
  if (ts.tv_nsec >= 1000000000) {
    ts.tv_sec++;
    ts.tv_nsec -= 1000000000;
  }
  pthread_mutex_lock(&pg->mu);
  while (!w->done) {
    if (pthread_cond_timedwait(&pg->cv, &pg->mu, &ts) == ETIMEDOUT && !w->done) {
      pthread_mutex_unlock(&pg->mu);
      return tdist__fail(TDIST_ERR_TIMEOUT, "%s #%llu still running after %lld ms",
                         tdist__coll_name(w->coll.kind), (unsigned long long)w->coll.seq,
                         (long long)to);
    }
  }
  tdist_status_t st = w->status;
  pthread_mutex_unlock(&pg->mu);
  if (st) tdist__fail(st, "%s", pg->err);
  return st;
}

TDIST_EXTERN tdist_status_t tdist_work_test(tdist_work_t *w, int *done) {
  WORK_ENTRY(w, "tdist_work_test");
  if (!done) return tdist__fail(TDIST_ERR_INVALID_ARGUMENT, "tdist_work_test: done is NULL");
  pthread_mutex_lock(&w->pg->mu);
  *done = w->done;
  tdist_status_t st = w->done ? w->status : TDIST_OK;
  pthread_mutex_unlock(&w->pg->mu);
  return st;
}

TDIST_EXTERN void tdist_work_destroy(tdist_work_t *w) {
  if (!w || w->magic != TDIST__WORK_MAGIC) return;
  tdist_pg_t *pg = w->pg;
  w->magic = 0; /* refused from now on, also while the worker still holds abandoned work */
  pthread_mutex_lock(&pg->mu);
  if (!w->done) {
    w->abandoned = 1; /* the worker frees it when it finishes */
    pthread_mutex_unlock(&pg->mu);
    return;
  }
  pthread_mutex_unlock(&pg->mu);
  tdist__coll_free_arrays(&w->coll);
  free(w);
}