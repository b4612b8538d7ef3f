/* A thread that keeps the latest view of one JobSet (kube.h): a WATCH with the resourceVersion
 * of the last object seen, timeoutSeconds AGENT_KUBE_WATCH_S, reconnecting when the server ends
 * it; a GET (re-list) first and after an expired resourceVersion (410) or an error, with a
 * backoff of 1 s doubling to 30 s between failed tries. One open connection per pod and no
 * polling: what 1,000 pods can ask of an API server (a GET poll each 1 s would be 1,000 requests
 * a second; the watch costs an event per status change, fanned out by the watch cache).
 *
 * agent_kube_watcher_get is thread-safe (a mutex); start and stop run on one thread. */
#ifndef TDIST_AGENT_KUBE_WATCHER_H
#define TDIST_AGENT_KUBE_WATCHER_H

#include <stddef.h>
#include <stdint.h>

#include "operator-agent/kube/kube.h"

#define AGENT_KUBE_WATCH_S 300

typedef struct agent_kube_watcher agent_kube_watcher_t;

/* Starts the thread from a JobSet just read (its resourceVersion). NULL on failure (err). */
agent_kube_watcher_t *agent_kube_watcher_start(const agent_kube_cfg_t *cfg,
                                               const agent_kube_jobset_t *initial, char *err,
                                               size_t cap);

/* The latest JobSet seen into *out; the number of objects seen so far (a new one: it changed).
 * err gets the last error since the last object ("" when none). */
uint64_t agent_kube_watcher_get(agent_kube_watcher_t *w, agent_kube_jobset_t *out, char *err,
                                size_t cap);

/* Stops and joins the thread (within about a second) and frees w. NULL: no-op. */
void agent_kube_watcher_stop(agent_kube_watcher_t *w);

#endif
