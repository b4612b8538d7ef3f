/* See watcher.h. The thread's loop: GET (re-list), then WATCH until the server ends it, again;
 * every wait is bounded (the request timeouts of kube.c) and polls the stop flag. */
#include "operator-agent/kube/watcher.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct agent_kube_watcher {
  agent_kube_cfg_t cfg;
  pthread_t thr;
  atomic_int stop;
  pthread_mutex_t mu;
  agent_kube_jobset_t js; /* under mu */
  uint64_t seen;          /* under mu */
  char err[600];          /* under mu */
};

static void on_object(void *ctx, const agent_kube_jobset_t *js) {
  agent_kube_watcher_t *w = ctx;
  pthread_mutex_lock(&w->mu);
  w->js = *js;
  w->seen++;
  w->err[0] = 0;
  pthread_mutex_unlock(&w->mu);
}

static void set_err(agent_kube_watcher_t *w, const char *e) {
  pthread_mutex_lock(&w->mu);
  snprintf(w->err, sizeof w->err, "%s", e);
  pthread_mutex_unlock(&w->mu);
}

/* Sleeps ms in 100 ms steps; 1 once stop is set. */
static int nap(agent_kube_watcher_t *w, int ms) {
  for (int t = 0; t < ms && !atomic_load(&w->stop); t += 100) {
    struct timespec ts = {0, 100000000L};
    nanosleep(&ts, NULL);
  }
  return atomic_load(&w->stop) != 0;
}

static void *run(void *arg) {
  agent_kube_watcher_t *w = arg;
  char rv[64], err[600];
  pthread_mutex_lock(&w->mu);
  snprintf(rv, sizeof rv, "%s", w->js.resource_version);
  pthread_mutex_unlock(&w->mu);
  int backoff_ms = 0, relist = rv[0] == 0;
  while (!atomic_load(&w->stop)) {
    if (relist) {
      agent_kube_jobset_t js;
      if (agent_kube_get_jobset(&w->cfg, 30, &js, err, sizeof err) == 0) {
        on_object(w, &js);
        snprintf(rv, sizeof rv, "%s", js.resource_version);
        relist = 0;
      } else {
        set_err(w, err);
        backoff_ms = backoff_ms ? (backoff_ms * 2 > 30000 ? 30000 : backoff_ms * 2) : 1000;
        if (nap(w, backoff_ms)) break;
        continue;
      }
    }
    int rc = agent_kube_watch_jobset(&w->cfg, rv, AGENT_KUBE_WATCH_S, on_object, w, &w->stop, err,
                                     sizeof err);
    if (rc == AGENT_KUBE_STOPPED) break;
    if (rc == 0) {
      backoff_ms = 0;
      continue; /* the server ended the watch (timeoutSeconds): watch on from rv */
    }
    if (rc != AGENT_KUBE_GONE) set_err(w, err);
    relist = 1;
    if (rc != AGENT_KUBE_GONE) {
      backoff_ms = backoff_ms ? (backoff_ms * 2 > 30000 ? 30000 : backoff_ms * 2) : 1000;
      if (nap(w, backoff_ms)) break;
    }
  }
  return NULL;
}

agent_kube_watcher_t *agent_kube_watcher_start(const agent_kube_cfg_t *cfg,
                                               const agent_kube_jobset_t *initial, char *err,
                                               size_t cap) {
  agent_kube_watcher_t *w = calloc(1, sizeof *w);
  if (!w) {
    snprintf(err, cap, "out of memory");
    return NULL;
  }
  w->cfg = *cfg;
  w->js = *initial;
  w->seen = 1;
  atomic_init(&w->stop, 0);
  pthread_mutex_init(&w->mu, NULL);
  int rc = pthread_create(&w->thr, NULL, run, w);
  if (rc) {
    snprintf(err, cap, "cannot start the JobSet watcher thread: %s", strerror(rc));
    pthread_mutex_destroy(&w->mu);
    free(w);
    return NULL;
  }
  return w;
}

uint64_t agent_kube_watcher_get(agent_kube_watcher_t *w, agent_kube_jobset_t *out, char *err,
                                size_t cap) {
  pthread_mutex_lock(&w->mu);
  *out = w->js;
  uint64_t n = w->seen;
  snprintf(err, cap, "%s", w->err);
  pthread_mutex_unlock(&w->mu);
  return n;
}

void agent_kube_watcher_stop(agent_kube_watcher_t *w) {
  if (!w) return;
  atomic_store(&w->stop, 1);
  pthread_join(w->thr, NULL);
  pthread_mutex_destroy(&w->mu);
  free(w);
}
