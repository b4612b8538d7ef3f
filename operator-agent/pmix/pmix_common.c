/* The agent's PMIx server: helpers its files share (see pmix_int.h): the op queue, the job's
 * node map, and bounded waits for libpmix's own callbacks. */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "operator-agent/common/log.h"
#include "operator-agent/pmix/pmix_int.h"
#include "tdist/store.h"

agent_pmix_t *agent_pmix__g_p;

int64_t agent_pmix__now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ---- waiting for libpmix's own callbacks ----
 * Bounded: libpmix 4.2 can leave a callback unanswered (seen at finalize after a failed direct
 * modex), and the agent must still stop. The object lives until both sides let go of it. */

sync_t *agent_pmix__sync_new(void) {
  sync_t *s = calloc(1, sizeof *s);
  if (!s) return NULL;
  pthread_mutex_init(&s->mu, NULL);
  pthread_cond_init(&s->cv, NULL);
  s->refs = 2; /* the waiter and the callback */
  return s;
}

void agent_pmix__sync_unref(sync_t *s) {
  pthread_mutex_lock(&s->mu);
  int left = --s->refs;
  pthread_mutex_unlock(&s->mu);
  if (left) return;
  pthread_mutex_destroy(&s->mu);
  pthread_cond_destroy(&s->cv);
  free(s);
}

void agent_pmix__sync_cb(pmix_status_t st, void *cbdata) {
  sync_t *s = cbdata;
  pthread_mutex_lock(&s->mu);
  s->st = st;
  s->done = 1;
  pthread_cond_signal(&s->cv);
  pthread_mutex_unlock(&s->mu);
  agent_pmix__sync_unref(s);
}

/* call_st: what the libpmix call returned; PMIX_SUCCESS means the callback will come. */
pmix_status_t agent_pmix__sync_wait(sync_t *s, pmix_status_t call_st) {
  if (call_st != PMIX_SUCCESS) { /* no callback: done (OPERATION_SUCCEEDED) or failed */
    agent_pmix__sync_unref(s);
    agent_pmix__sync_unref(s);
    return call_st == PMIX_OPERATION_SUCCEEDED ? PMIX_SUCCESS : call_st;
  }
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_sec += SYNC_MS / 1000;
  pthread_mutex_lock(&s->mu);
  while (!s->done)
    if (pthread_cond_timedwait(&s->cv, &s->mu, &until) == ETIMEDOUT) break;
  pmix_status_t st = s->done ? s->st : PMIX_ERR_TIMEOUT;
  pthread_mutex_unlock(&s->mu);
  agent_pmix__sync_unref(s);
  return st;
}

/* ---- the op queue ---- */

void agent_pmix__op_free(op_t *o) {
  if (!o) return;
  free(o->nodes);
  free(o->data);
  if (o->keys)
    for (char **k = o->keys; *k; k++) free(*k);
  free(o->keys);
  free(o);
}

/* Queues o for the store thread (under no lock). PMIX_SUCCESS, or an error with o freed. */
pmix_status_t agent_pmix__enqueue(agent_pmix_t *p, op_t *o) {
  pthread_mutex_lock(&p->mu);
  if (p->stop || !p->have_job) {
    pthread_mutex_unlock(&p->mu);
    agent_pmix__op_free(o);
    return PMIX_ERR_NOT_AVAILABLE;
  }
  o->gen = p->gen;
  o->next = NULL;
  if (p->tail)
    p->tail->next = o;
  else
    p->head = o;
  p->tail = o;
  pthread_cond_broadcast(&p->cv);
  pthread_mutex_unlock(&p->mu);
  return PMIX_SUCCESS;
}

/* The node of global rank r, or -1. Under mu. */
int agent_pmix__node_of(const agent_pmix_t *p, pmix_rank_t r) {
  for (int n = 0; n < p->nnodes; n++)
    if ((int64_t)r >= p->node_first[n] && (int64_t)r < p->node_first[n + 1]) return n;
  return -1;
}

int agent_pmix__job_live(agent_pmix_t *p, uint64_t gen) {
  pthread_mutex_lock(&p->mu);
  int live = !p->stop && p->have_job && p->gen == gen;
  pthread_mutex_unlock(&p->mu);
  return live;
}

void agent_pmix__mark_timed_out(agent_pmix_t *p, uint64_t gen) {
  pthread_mutex_lock(&p->mu);
  p->timed_out_gen = gen;
  pthread_mutex_unlock(&p->mu);
}
