/* See state.h. */
#include "operator-agent/state/state.h"

#include <stdlib.h>
#include <string.h>

const double agent_rdzv_bucket_le[AGENT_RDZV_BUCKETS] = {0.01, 0.05, 0.1, 0.25, 0.5, 1,
                                                         2.5,  5,    10,  30,   60,  120};

void agent_state_init(agent_state_t *st) {
  memset(st, 0, sizeof *st);
  pthread_mutex_init(&st->mu, NULL);
  st->node_rank = -1;
  st->round = -1;
  st->group_rank = -1;
}

void agent_state_destroy(agent_state_t *st) {
  free(st->members);
  free(st->standbys);
  free(st->workers);
  free(st->rank_procs);
  free(st->hang_json);
  pthread_mutex_destroy(&st->mu);
}

void agent_state_lock(agent_state_t *st) { pthread_mutex_lock(&st->mu); }
void agent_state_unlock(agent_state_t *st) { pthread_mutex_unlock(&st->mu); }

const char *agent_run_state_name(agent_run_state_t s) {
  static const char *const n[] = {"starting",  "rendezvous", "running", "stopping",
                                  "succeeded", "failed",     "standby"};
  return (unsigned)s < sizeof n / sizeof n[0] ? n[s] : "unknown";
}

const char *agent_restart_reason_name(agent_restart_reason_t r) {
  static const char *const n[] = {"worker_failed", "peer_lost", "store_lost", "membership",
                                  "protocol_error"};
  return (unsigned)r < AGENT_RESTART_NREASONS ? n[r] : "unknown";
}

const char *agent_worker_state_name(agent_worker_state_t s) {
  static const char *const n[] = {"pending", "running", "succeeded", "failed", "stopped"};
  return (unsigned)s < AGENT_WORKER_NSTATES ? n[s] : "unknown";
}

void agent_state_observe_rdzv(agent_state_t *st, double seconds) {
  int i = 0;
  while (i < AGENT_RDZV_BUCKETS && seconds > agent_rdzv_bucket_le[i]) i++;
  st->rdzv_bucket[i]++;
  st->rdzv_duration_sum_s += seconds;
  st->rendezvous_total++;
}

void agent_state_set_error(agent_state_t *st, const char *msg) {
  size_t n = strlen(msg);
  if (n >= sizeof st->last_error) n = sizeof st->last_error - 1;
  agent_state_lock(st);
  memcpy(st->last_error, msg, n);
  st->last_error[n] = 0;
  agent_state_unlock(st);
}
