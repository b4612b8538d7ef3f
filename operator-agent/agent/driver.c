/* The rendezvous driver (see agent.h): joins rounds over rendezvous/ until this agent is a member
 * of one, the store host starting each round's workers' store first (storehost.h); waits as a
 * standby in a round that closed without it; a store host whose round does not close looks at
 * the other host and gives way to it. Publishes the outcome into agent_state_t. Runs on the loop
 * thread; every wait goes through agent_loop_wait or a bounded store WAIT. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "operator-agent/agent/agent.h"
#include "operator-agent/common/log.h"

void agent_driver_publish_members(agent_t *a) {
  if (!a->rd.members) return;
  agent_member_info_t *m = calloc((size_t)(a->rd.nmembers ? a->rd.nmembers : 1), sizeof *m);
  if (!m) return; /* /status lists no members until the next try */
  for (int64_t i = 0; i < a->rd.nmembers; i++) {
    m[i].node_rank = a->rd.members[i].node_rank;
    m[i].group_rank = (int)i;
    snprintf(m[i].addr, sizeof m[i].addr, "%s", a->rd.members[i].addr);
    snprintf(m[i].host, sizeof m[i].host, "%s", a->rd.members[i].host);
  }
  agent_state_lock(&a->st);
  free(a->st.members);
  a->st.members = m;
  a->st.nmembers = (int)a->rd.nmembers;
  agent_state_unlock(&a->st);
}

/* The round's outcome into the state; the member list too once the records are read (at a
 * round's start only when closed by hand or by a test; else the first monitor reads them, after
 * the workers started: rdzv.h, agent_rdzv_load_members). */
static void publish_round(agent_t *a) {
  agent_state_lock(&a->st);
  a->st.worker_master_port = a->rd.worker_store.port;
  a->st.round = a->rd.round;
  a->st.group_rank = a->rd.group_rank;
  a->st.group_world_size = (int)a->rd.nmembers;
  a->st.world_size = a->rd.world_size;
  a->st.restart_count = a->rd.attempt + a->jip.restart_base;
  free(a->st.members);
  a->st.members = NULL;
  a->st.nmembers = 0;
  agent_state_unlock(&a->st);
  agent_driver_publish_members(a);
}

/* Joins round >= a->next_round. The store host first starts a fresh, empty store for that round's
 * workers and names its port in its record (see rdzv.h: attempt isolation); the previous round's
 * store goes once the new one is published. OK, STORE_LOST (the agents' store failed: a->rd.err),
 * FATAL (no workers' store could be started: logged) or BAD_RECORD (a->rd.err). */
static agent_rdzv_outcome_t join_round(agent_t *a) {
  agent_storehost_t *h = &a->sh;
  tdist_store_server_t *fresh = NULL;
  if (h->server &&
      agent_storehost_worker_store_open(h, &fresh, &a->rd.worker_port) != AGENT_STOREHOST_OK)
    return AGENT_RDZV_OUT_FATAL;
  agent_rdzv_result_t res = agent_rdzv_join(&a->rd, a->next_round, a->attempt, a->failures);
  if (h->server) {
    if (res < 0) {
      a->rd.worker_port = agent_storehost_worker_store_abandon(h, fresh);
    } else {
      agent_storehost_worker_store_commit(h, fresh);
      AGENT_DEBUG("workers' store of round %" PRId64 " on port %d", a->rd.round, a->rd.worker_port);
    }
  }
  if (res >= 0) return AGENT_RDZV_OUT_OK;
  return res == AGENT_RDZV_STORE_ERROR ? AGENT_RDZV_OUT_STORE_LOST : AGENT_RDZV_OUT_BAD_RECORD;
}

void agent_driver_publish_standbys(agent_t *a) {
  if (!a->sh.hosting) return;
  agent_member_info_t *m = calloc((size_t)a->rd.nstandby + 1, sizeof *m);
  if (!m) return;
  for (int i = 0; i < a->rd.nstandby; i++) {
    m[i].node_rank = a->rd.standby[i].node_rank;
    m[i].group_rank = -1;
    snprintf(m[i].addr, sizeof m[i].addr, "%s", a->rd.standby[i].addr);
    snprintf(m[i].host, sizeof m[i].host, "%s", a->rd.standby[i].host);
  }
  agent_state_lock(&a->st);
  free(a->st.standbys);
  a->st.standbys = m;
  a->st.nstandbys = a->rd.nstandby;
  a->st.standbys_live = a->rd.nstandby_live;
  agent_state_unlock(&a->st);
}

/* A standby: this agent waits in a closed round without workers (see rdzv.h). */
static void publish_standby(agent_t *a) {
  agent_state_lock(&a->st);
  a->st.state = AGENT_STATE_STANDBY;
  a->st.round = a->rd.round;
  a->st.group_rank = -1;
  a->st.group_world_size = (int)a->rd.closed_n;
  a->st.world_size = 0;
  a->st.worker_master_port = 0;
  free(a->st.members);
  a->st.members = NULL;
  a->st.nmembers = 0;
  agent_state_unlock(&a->st);
}

/* A store host whose round has not closed within a second looks at the other host, once a
 * second (a round that closes at once, as in a recovery, pays nothing for it). Two stores host
 * the job when pod 0's replacement starts after the agents moved to the backup host (it hosts a
 * store of its own until it finds the job there), or in a race (it came up while they were
 * moving, or the backup host alone lost pod 0 for a moment). This one gives way when the other's
 * current round has closed (the job runs there), or is a later round (the agents that moved
 * carried the job's round number; a replacement pod 0 starts at 0), or the same round with more
 * agents, or as many and this is the backup host. Giving way stops this agent's server, so the
 * agents connected to it move on too. 1: give way (host_idx already switched). */
static int should_yield(agent_t *a) {
  agent_storehost_t *h = &a->sh;
  a->next_probe_ns = agent_now_ns() + 1000000000LL;
  int other = h->host_idx ^ 1;
  agent_storehost_round_t them = {0, 0, 0}, us = {0, 0, 0};
  if (agent_storehost_probe(h, other, &them) != AGENT_STOREHOST_OK ||
      agent_storehost_probe(h, -1, &us) != AGENT_STOREHOST_OK)
    return 0;
  int yield = them.closed || them.round > us.round ||
              (them.round == us.round &&
               (them.joined > us.joined || (them.joined == us.joined && h->host_idx == 1)));
  if (!yield) return 0;
  AGENT_WARN("pod %d (%s) %s: this agent stops hosting the store and moves there",
             h->host_rank[other], h->host_name[other],
             them.closed ? "runs the job's current round" : "has the job's latest round");
  agent_storehost_host_stop(h);
  h->host_idx = other;
  return 1;
}

/* The rendezvous timed out in a->rd.round: logged, counted. */
static agent_rdzv_outcome_t timed_out(agent_t *a) {
  char msg[300];
  snprintf(msg, sizeof msg,
           "rendezvous timed out after %.0f s in round %" PRId64
           " (need %d node(s); raise --rdzv-timeout or check that every pod started)",
           a->cfg.rdzv_timeout_s, a->rd.round, a->cfg.nnodes_min);
  AGENT_ERROR("%s", msg);
  agent_set_error(a, msg);
  agent_state_lock(&a->st);
  a->st.rendezvous_failures_total++;
  agent_state_unlock(&a->st);
  return AGENT_RDZV_OUT_TIMEOUT;
}

/* A member of a->rd.round since t0: the rendezvous result into /status and /metrics. */
static void joined(agent_t *a, int64_t t0) {
  double secs = (double)(agent_now_ns() - t0) / 1e9;
  agent_state_lock(&a->st);
  agent_state_observe_rdzv(&a->st, secs);
  a->st.last_rendezvous_unix = (double)time(NULL);
  agent_state_unlock(&a->st);
  publish_round(a);
  AGENT_INFO("round %" PRId64 " complete in %.2f s: %" PRId64
             " node(s), group rank %d, world size %d, attempt %d, workers' store port %d",
             a->rd.round, secs, a->rd.nmembers, a->rd.group_rank, a->rd.world_size, a->rd.attempt,
             a->rd.worker_store.port);
}

agent_rdzv_outcome_t agent_driver_rendezvous(agent_t *a, int64_t *deadline) {
  agent_set_state(a, AGENT_STATE_RENDEZVOUS);
  int64_t t0 = agent_now_ns();
  a->next_probe_ns = t0 + 1000000000LL; /* should_yield: only a round that takes long */
  agent_rdzv_outcome_t jr = join_round(a);
  if (jr != AGENT_RDZV_OUT_OK) return jr;
  agent_rdzv_result_t res;
  char nn[32];
  AGENT_INFO("joined rendezvous round %" PRId64 " (run id '%s'), waiting for %s node(s)",
             a->rd.round, a->cfg.run_id, agent_nnodes_str(&a->cfg, nn, sizeof nn));
  int waiter_logged = 0;
  for (;;) {
    res = agent_rdzv_join_poll(&a->rd, agent_now_ns());
    if (res == AGENT_RDZV_WAITER) {
      /* Closed without us: a standby until the round ends or the job does. */
      if (!waiter_logged) {
        AGENT_INFO("round %" PRId64 " closed with %" PRId64
                   " node(s) without this one: standby (no workers) until a member is lost or "
                   "the job ends",
                   a->rd.round, a->rd.closed_n);
        publish_standby(a);
        waiter_logged = 1;
      }
      res = agent_rdzv_standby_poll(&a->rd, agent_now_ns());
      if (res == AGENT_RDZV_WAITER || res == AGENT_RDZV_PENDING) res = AGENT_RDZV_WAITER;
      *deadline = agent_now_ns() + (int64_t)(a->cfg.rdzv_timeout_s * 1e9);
    }
    if (res == AGENT_RDZV_ALL_DONE) return AGENT_RDZV_OUT_JOB_DONE;
    if (res == AGENT_RDZV_JOB_FAILED) return AGENT_RDZV_OUT_JOB_FAILED;
    if (res < 0)
      return res == AGENT_RDZV_STORE_ERROR ? AGENT_RDZV_OUT_STORE_LOST : AGENT_RDZV_OUT_BAD_RECORD;
    if (res == AGENT_RDZV_MEMBER) break;
    if (res == AGENT_RDZV_ROUND_MOVED) {
      if (waiter_logged) agent_set_state(a, AGENT_STATE_RENDEZVOUS);
      waiter_logged = 0;
      a->next_round = a->rd.round + 1;
      jr = join_round(a);
      if (jr != AGENT_RDZV_OUT_OK) return jr;
    }
    if (a->sh.hosting && a->sh.nhosts == 2 && !waiter_logged &&
        agent_now_ns() >= a->next_probe_ns && should_yield(a))
      return AGENT_RDZV_OUT_YIELD;
    if (agent_now_ns() >= *deadline) return timed_out(a);
    int ms = agent_loop_poll_ms(a) < 100 ? agent_loop_poll_ms(a) : 100;
    if (res == AGENT_RDZV_PENDING && !waiter_logged) {
      /* Not closed yet: wait on the key itself, then look at signals without waiting. */
      if (agent_rdzv_wait_closed(&a->rd, ms) < 0) return AGENT_RDZV_OUT_STORE_LOST;
      ms = 0;
    }
    agent_loop_wait(a, ms);
    if (a->stop_sig) return AGENT_RDZV_OUT_STOPPED;
  }
  joined(a, t0);
  return AGENT_RDZV_OUT_OK;
}
