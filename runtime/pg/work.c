/* The group's async worker and its work handles (tdist_work_t): tdist__pg_submit queues a
 * validated collective and starts the worker thread on first use; the worker runs the queue in
 * order through tdist__pg_run (coll.c) and marks each work done under pg->mu; tdist_work_wait /
 * _test / _destroy read that state. The worker must never touch a work handle's memory after
 * marking it done unless the user already destroyed it (then the worker frees it), never hold
 * pg->mu while a collective runs, and never validate arguments (coll.c did). */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
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
  int abandoned; /* destroy was called before completion: the worker frees it */
  tdist_work_t *next;
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

/* Takes the next op off the queue, or, where the backend can run sends and receives together,
 * every send and receive queued in a row from there (an isend and an irecv submitted back to
 * back then progress at once instead of the first waiting for the second's peer). */
static void *worker_main(void *arg) {
  tdist_pg_t *pg = arg;
  tdist_work_t *batch[TDIST__P2P_BATCH_MAX];
  tdist__coll_t *colls[TDIST__P2P_BATCH_MAX];
  pthread_mutex_lock(&pg->mu);
  for (;;) {
    while (!pg->qhead && !pg->stopping) pthread_cond_wait(&pg->cv, &pg->mu);
    if (!pg->qhead) break; /* stopping and drained */
    int n = 0;
    batch[n++] = pop(pg);
    if (pg->be->run_p2p && is_p2p(batch[0]))
      while (n < TDIST__P2P_BATCH_MAX && pg->qhead && is_p2p(pg->qhead)) batch[n++] = pop(pg);
    pg->running = 1; /* tdist__pg_drain and destroy must see work that left the queue */
    pthread_mutex_unlock(&pg->mu);
    for (int i = 0; i < n; i++) colls[i] = &batch[i]->coll;
    tdist_status_t st = n == 1 ? tdist__pg_run(pg, colls[0]) : tdist__pg_run_p2p(pg, colls, n);
    pthread_mutex_lock(&pg->mu);
    pg->running = 0;
    for (int i = 0; i < n; i++) {
      tdist_work_t *w = batch[i];
      w->status = st;
      w->done = 1;
      if (w->abandoned) {
        tdist__coll_free_arrays(&w->coll);
        free(w);
      }
    }
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
  pthread_cond_broadcast(&pg->cv);
  pthread_mutex_unlock(&pg->mu);
  *work = w;
  return TDIST_OK;
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
  int64_t to = timeout_ms < 0 ? pg->timeout_ms : timeout_ms;
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