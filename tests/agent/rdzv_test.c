/* Rendezvous protocol (operator-agent/rendezvous) against a real store server over TCP: several
 * simulated agents, each with its own client connection, driven step by step from one thread with
 * a fake clock, so every interleaving below is deterministic. */
#define _GNU_SOURCE
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <tdist/status.h>
#include <tdist/store.h>

#include "check.h"
#include "operator-agent/rendezvous/rdzv.h"

#define S 1000000000LL
#define MAXA 8

static tdist_store_server_t *server;
static int port;

typedef struct {
  tdist_store_t *client, *store;
  agent_rdzv_t r;
} sim_t;

static void sim_open(sim_t *a, const char *run_id, int node_rank, int nproc, int min, int max) {
  memset(a, 0, sizeof *a);
  tdist_tcp_store_options_t o = TDIST_TCP_STORE_OPTIONS_INIT;
  o.host = "127.0.0.1";
  o.port = port;
  o.timeout_ms = 5000;
  o.connect_timeout_ms = 300;
  o.dialect = TDIST_STORE_DIALECT_V2;
  CHECK(tdist_tcp_store_connect(&o, &a->client) == TDIST_OK);
  char prefix[64];
  snprintf(prefix, sizeof prefix, "tdist/%s", run_id);
  CHECK(tdist_prefix_store_create(a->client, prefix, &a->store) == TDIST_OK);
  agent_rdzv_init(&a->r);
  a->r.store = a->store;
  a->r.nnodes_min = min;
  a->r.nnodes_max = max;
  a->r.last_call_s = 2;
  a->r.heartbeat_interval_s = 1;
  a->r.heartbeat_timeout_s = 3;
  a->r.node_rank = node_rank;
  a->r.nproc = nproc;
  snprintf(a->r.addr, sizeof a->r.addr, "10.0.0.%d", node_rank + 1);
  snprintf(a->r.host, sizeof a->r.host, "job-%d", node_rank);
  /* The store host names the workers' store of the round it joins (main.c starts one). */
  a->r.worker_port = node_rank == 0 ? 30000 : 0;
}

static void sim_close(sim_t *a) {
  agent_rdzv_free(&a->r);
  tdist_store_destroy(a->store);
  tdist_store_destroy(a->client);
}

static void join_all(sim_t *a, int n, int64_t round) {
  for (int i = 0; i < n; i++) CHECK(agent_rdzv_join(&a[i].r, round, 0, 0) == AGENT_RDZV_PENDING);
}

/* Polls every agent until each is MEMBER or WAITER; returns how many are members. */
static int poll_until_closed(sim_t *a, int n, int64_t now) {
  int res[MAXA] = {0}, members = 0;
  for (int iter = 0; iter < 10; iter++) {
    int pending = 0;
    for (int i = 0; i < n; i++) {
      if (res[i] == AGENT_RDZV_MEMBER || res[i] == AGENT_RDZV_WAITER) continue;
      res[i] = agent_rdzv_join_poll(&a[i].r, now);
      CHECK(res[i] >= 0);
      pending += res[i] == AGENT_RDZV_PENDING;
    }
    if (!pending) break;
  }
  for (int i = 0; i < n; i++) members += res[i] == AGENT_RDZV_MEMBER;
  return members;
}

/* Fixed nnodes: joins in random order; group ranks follow node ranks; global ranks are prefix
 * sums of nproc (different per node). */
static void test_fixed(unsigned seed) {
  enum { N = 4 };
  sim_t a[N];
  int order[N] = {0, 1, 2, 3};
  srand(seed);
  for (int i = N - 1; i > 0; i--) {
    int j = rand() % (i + 1), t = order[i];
    order[i] = order[j];
    order[j] = t;
  }
  int nproc[N] = {1 + rand() % 3, 1 + rand() % 3, 1 + rand() % 3, 1 + rand() % 3};
  char run[32];
  snprintf(run, sizeof run, "fixed%u", seed);
  for (int i = 0; i < N; i++) sim_open(&a[i], run, order[i], nproc[order[i]], N, N);
  /* Three of four joined: nobody may close. */
  join_all(a, N - 1, 0);
  for (int i = 0; i < N - 1; i++)
    CHECK(agent_rdzv_join_poll(&a[i].r, 100 * S) == AGENT_RDZV_PENDING);
  join_all(a + N - 1, 1, 0);
  CHECK_EQ_INT(poll_until_closed(a, N, 0), N);
  int base = 0;
  for (int g = 0; g < N; g++) {
    for (int i = 0; i < N; i++) {
      if (a[i].r.node_rank != g) continue;
      CHECK_EQ_INT(a[i].r.group_rank, g);
      CHECK_EQ_INT(a[i].r.rank_base, base);
      CHECK_EQ_INT(a[i].r.nmembers, N);
      CHECK_EQ_INT(a[i].r.round, 0);
    }
    base += nproc[g];
  }
  for (int i = 0; i < N; i++) CHECK_EQ_INT(a[i].r.world_size, base);
  /* Every member's workers get the workers' store the store host named in its record. */
  for (int i = 0; i < N; i++) CHECK_EQ_INT(a[i].r.worker_store.port, 30000);
  for (int i = 0; i < N; i++) sim_close(&a[i]);
}

/* Attempt isolation needs the store host in every round that runs workers: an elastic round with
 * MIN nodes but without it does not close; it closes once the store host joined, naming its
 * workers' store. A bare "N" in <r>/closed (first N arrivals) that leaves the store host out
 * ends the round (membership) so the next one includes it. */
static void test_round_without_store_host(void) {
  sim_t a[3];
  for (int i = 0; i < 3; i++) sim_open(&a[i], "nohost", i, 1, 2, 3);
  join_all(a + 1, 2, 0); /* nodes 1 and 2 */
  CHECK(agent_rdzv_join_poll(&a[1].r, 10 * S) == AGENT_RDZV_PENDING);
  CHECK(agent_rdzv_join_poll(&a[2].r, 10 * S) == AGENT_RDZV_PENDING);
  CHECK(agent_rdzv_join_poll(&a[1].r, 13 * S) == AGENT_RDZV_PENDING); /* past last call */
  CHECK(agent_rdzv_join_poll(&a[2].r, 30 * S) == AGENT_RDZV_PENDING);
  a[0].r.worker_port = 30001; /* the store host's workers' store for the round it joins */
  CHECK(agent_rdzv_join(&a[0].r, 0, 0, 0) == AGENT_RDZV_PENDING);
  CHECK_EQ_INT(poll_until_closed(a, 3, 31 * S), 3); /* MAX joined */
  for (int i = 0; i < 3; i++) {
    CHECK_EQ_INT(a[i].r.round, 0);
    CHECK_EQ_INT(a[i].r.group_rank, i);
    CHECK_EQ_INT(a[i].r.worker_store.port, 30001);
  }
  for (int i = 0; i < 3; i++) sim_close(&a[i]);

  /* The bare form, written by hand: the first two arrivals, not the store host. */
  for (int i = 0; i < 3; i++) sim_open(&a[i], "nohost2", i, 1, 2, 3);
  join_all(a + 1, 2, 0);
  CHECK(tdist_store_set(a[1].store, "0/closed", "2", 1) == TDIST_OK);
  CHECK(agent_rdzv_join_poll(&a[1].r, 0) == AGENT_RDZV_ROUND_MOVED);
  CHECK(a[1].r.end_reason == AGENT_RESTART_MEMBERSHIP);
  CHECK(strstr(a[1].r.end_text, "store host") != NULL);
  CHECK(agent_rdzv_join_poll(&a[2].r, 0) == AGENT_RDZV_ROUND_MOVED);
  for (int i = 0; i < 3; i++) CHECK(agent_rdzv_join(&a[i].r, 1, 0, 0) == AGENT_RDZV_PENDING);
  CHECK_EQ_INT(poll_until_closed(a, 3, 1 * S), 3);
  for (int i = 0; i < 3; i++) CHECK_EQ_INT(a[i].r.worker_store.port, 30000);
  for (int i = 0; i < 3; i++) sim_close(&a[i]);
}

/* MIN:MAX with last call: closes only after last_call once MIN joined; a later arrival is a
 * waiter and makes the members end the round (scale up); everybody lands in round 1. */
static void test_elastic(void) {
  sim_t a[3];
  for (int i = 0; i < 3; i++) sim_open(&a[i], "elastic", i, 2, 2, 3);
  join_all(a, 2, 0);
  CHECK(agent_rdzv_join_poll(&a[0].r, 10 * S) == AGENT_RDZV_PENDING); /* first sees MIN at 10 s */
  CHECK(agent_rdzv_join_poll(&a[1].r, 11 * S) == AGENT_RDZV_PENDING);
  CHECK(agent_rdzv_join_poll(&a[0].r, 11 * S) == AGENT_RDZV_PENDING); /* 1 s < last call */
  CHECK(agent_rdzv_join_poll(&a[0].r, 12 * S + 1) == AGENT_RDZV_MEMBER);
  CHECK(agent_rdzv_join_poll(&a[1].r, 12 * S) == AGENT_RDZV_MEMBER);
  CHECK_EQ_INT(a[0].r.nmembers, 2);
  CHECK_EQ_INT(a[1].r.world_size, 4);
  /* Third node arrives late. */
  CHECK(agent_rdzv_join(&a[2].r, 0, 0, 0) == AGENT_RDZV_PENDING);
  CHECK(agent_rdzv_join_poll(&a[2].r, 13 * S) == AGENT_RDZV_WAITER);
  CHECK(agent_rdzv_monitor(&a[0].r, 13 * S) == AGENT_RDZV_ENDED);
  CHECK(a[0].r.end_reason == AGENT_RESTART_MEMBERSHIP);
  CHECK(strstr(a[0].r.end_text, "node 2") != NULL);
  CHECK(agent_rdzv_monitor(&a[1].r, 13 * S) == AGENT_RDZV_ENDED);
  CHECK(a[1].r.end_reason == AGENT_RESTART_MEMBERSHIP);
  CHECK(agent_rdzv_join_poll(&a[2].r, 13 * S) == AGENT_RDZV_ROUND_MOVED);
  for (int i = 0; i < 3; i++) CHECK(agent_rdzv_join(&a[i].r, 1, 0, 0) == AGENT_RDZV_PENDING);
  CHECK_EQ_INT(poll_until_closed(a, 3, 20 * S), 3); /* MAX reached: closes at once */
  for (int i = 0; i < 3; i++) {
    CHECK_EQ_INT(a[i].r.round, 1);
    CHECK_EQ_INT(a[i].r.group_rank, i);
    CHECK_EQ_INT(a[i].r.world_size, 6);
  }
  for (int i = 0; i < 3; i++) sim_close(&a[i]);
}

/* A rescheduled pod (same node rank, new address) joining a full round ends it as peer_lost;
 * attempt and failures are agreed as the max over members. */
static void test_replaced_and_agreement(void) {
  sim_t a[3], b;
  for (int i = 0; i < 3; i++) sim_open(&a[i], "replace", i, 1, 3, 3);
  for (int i = 0; i < 3; i++) CHECK(agent_rdzv_join(&a[i].r, 0, i, i == 1 ? 2 : 0) == 0);
  CHECK_EQ_INT(poll_until_closed(a, 3, 0), 3);
  for (int i = 0; i < 3; i++) {
    CHECK_EQ_INT(a[i].r.attempt, 2);
    CHECK_EQ_INT(a[i].r.failures, 2);
  }
  sim_open(&b, "replace", 1, 1, 3, 3);
  snprintf(b.r.addr, sizeof b.r.addr, "10.0.9.9");
  CHECK(agent_rdzv_join(&b.r, 0, 0, 0) == 0);
  CHECK(agent_rdzv_join_poll(&b.r, 0) == AGENT_RDZV_WAITER);
  CHECK(agent_rdzv_monitor(&a[2].r, 1 * S) == AGENT_RDZV_ENDED);
  CHECK(a[2].r.end_reason == AGENT_RESTART_PEER_LOST);
  CHECK(strstr(a[2].r.end_text, "10.0.9.9") != NULL);
  CHECK(agent_rdzv_join_poll(&b.r, 0) == AGENT_RDZV_ROUND_MOVED);
  sim_close(&b);
  for (int i = 0; i < 3; i++) sim_close(&a[i]);
}

/* Heartbeats: the leader notices a silent member; a member notices a silent leader. */
static void test_heartbeat(void) {
  sim_t a[3];
  for (int i = 0; i < 3; i++) sim_open(&a[i], "hb", i, 1, 3, 3);
  join_all(a, 3, 0);
  CHECK_EQ_INT(poll_until_closed(a, 3, 0), 3);
  /* Everyone beats for a while. */
  for (int64_t t = 0; t <= 5 * S; t += S / 2)
    for (int i = 0; i < 3; i++) CHECK(agent_rdzv_monitor(&a[i].r, t) == AGENT_RDZV_PENDING);
  /* Node 2 goes silent; the leader ends the round after the timeout (3 s), not before. */
  int ended = 0;
  int64_t t;
  for (t = 5 * S + S / 2; t <= 12 * S && !ended; t += S / 2) {
    for (int i = 0; i < 2 && !ended; i++) {
      agent_rdzv_result_t res = agent_rdzv_monitor(&a[i].r, t);
      CHECK(res >= 0);
      if (res == AGENT_RDZV_ENDED) {
        CHECK_EQ_INT(i, 0);
        ended = 1;
      }
    }
  }
  CHECK(ended);
  CHECK(t > 8 * S);
  CHECK(a[0].r.end_reason == AGENT_RESTART_PEER_LOST);
  CHECK(strstr(a[0].r.end_text, "node 2") != NULL);
  CHECK(agent_rdzv_monitor(&a[1].r, t) == AGENT_RDZV_ENDED);
  CHECK(agent_rdzv_monitor(&a[2].r, t) == AGENT_RDZV_ENDED);
  for (int i = 0; i < 3; i++) sim_close(&a[i]);

  /* Leader silent: a member notices. */
  for (int i = 0; i < 2; i++) sim_open(&a[i], "hb2", i, 1, 2, 2);
  join_all(a, 2, 0);
  CHECK_EQ_INT(poll_until_closed(a, 2, 0), 2);
  for (int64_t u = 0; u <= 2 * S; u += S / 2)
    for (int i = 0; i < 2; i++) CHECK(agent_rdzv_monitor(&a[i].r, u) == AGENT_RDZV_PENDING);
  agent_rdzv_result_t res = AGENT_RDZV_PENDING;
  for (int64_t u = 2 * S + S / 2; u <= 10 * S && res == AGENT_RDZV_PENDING; u += S / 2)
    res = agent_rdzv_monitor(&a[1].r, u);
  CHECK(res == AGENT_RDZV_ENDED);
  CHECK(strstr(a[1].r.end_text, "node 0") != NULL);
  for (int i = 0; i < 2; i++) sim_close(&a[i]);
}

/* The first end reason wins; the exit barrier completes only when all are done; a fresh store
 * (store host replaced) is brought up to the survivors' round. */
static void test_end_done_fresh(void) {
  sim_t a[2];
  for (int i = 0; i < 2; i++) sim_open(&a[i], "end", i, 1, 2, 2);
  join_all(a, 2, 0);
  CHECK_EQ_INT(poll_until_closed(a, 2, 0), 2);
  int m0 = 0, m1 = 0;
  CHECK(agent_rdzv_done_poll(&a[0].r, 0, &m0) == AGENT_RDZV_PENDING);
  CHECK(agent_rdzv_done_poll(&a[0].r, 0, &m0) == AGENT_RDZV_PENDING); /* counted once */
  CHECK(agent_rdzv_done_poll(&a[1].r, 0, &m1) == AGENT_RDZV_ALL_DONE);
  CHECK(agent_rdzv_done_poll(&a[0].r, 0, &m0) == AGENT_RDZV_ALL_DONE);
  int64_t ex = 0;
  CHECK(agent_rdzv_mark_exited(&a[1].r, &ex) == 0 && ex == 1);
  CHECK(agent_rdzv_exited_count(&a[0].r, &ex) == 0 && ex == 1);

  CHECK(agent_rdzv_end(&a[1].r, AGENT_RESTART_WORKER_FAILED, "rank 1 exited with code 3") ==
        AGENT_RDZV_ENDED);
  CHECK(agent_rdzv_end(&a[0].r, AGENT_RESTART_PEER_LOST, "other") == AGENT_RDZV_ENDED);
  CHECK(a[0].r.end_reason == AGENT_RESTART_WORKER_FAILED);
  CHECK(!strcmp(a[0].r.end_text, "rank 1 exited with code 3"));
  /* Survivor wants round 5 on a store whose round is 1; a newcomer asking for 0 gets 5. */
  CHECK(agent_rdzv_join(&a[0].r, 5, 0, 0) == 0);
  CHECK_EQ_INT(a[0].r.round, 5);
  CHECK(agent_rdzv_join(&a[1].r, 0, 0, 0) == 0);
  CHECK_EQ_INT(a[1].r.round, 5);
  CHECK_EQ_INT(poll_until_closed(a, 2, 0), 2);
  for (int i = 0; i < 2; i++) sim_close(&a[i]);
}

/* Every sim in a[0..n-1] that is not `skip` beats (monitor / standby poll) from t0 to t1. */
static void beat_all(sim_t *a, int n, int skip, int64_t t0, int64_t t1) {
  for (int64_t t = t0; t <= t1; t += S / 2)
    for (int i = 0; i < n; i++) {
      if (i == skip) continue;
      agent_rdzv_result_t res = a[i].r.group_rank >= 0 ? agent_rdzv_monitor(&a[i].r, t)
                                                       : agent_rdzv_standby_poll(&a[i].r, t);
      CHECK(res == AGENT_RDZV_PENDING);
    }
}

/* Spares: 3 nodes + 1 spare (node rank 3) joined in random order: the members are nodes 0..2 in
 * node-rank order and the spare is a standby the leader counts while it heartbeats. Node 1 is
 * lost: the spare takes its group rank 1, nodes 0 and 2 keep 0 and 2, global ranks stay prefix
 * sums, attempt and failures are agreed. Node 1's replacement arrives: it is a standby, the round
 * goes on. The members finish: the standby sees it. */
static void test_spares(unsigned seed) {
  enum { N = 4 };
  sim_t a[N + 1];
  int order[N] = {0, 1, 2, 3}, nproc[N + 1];
  srand(seed);
  for (int i = N - 1; i > 0; i--) {
    int j = rand() % (i + 1), t = order[i];
    order[i] = order[j];
    order[j] = t;
  }
  char run[32];
  snprintf(run, sizeof run, "spares%u", seed);
  for (int i = 0; i < N + 1; i++) {
    nproc[i] = 1 + rand() % 3;
    sim_open(&a[i], run, i < N ? i : 1, nproc[i], 3, 3);
    a[i].r.spares = 1;
  }
  for (int k = 0; k < N; k++)
    CHECK(agent_rdzv_join(&a[order[k]].r, 0, order[k] == 2 ? 1 : 0, 0) == AGENT_RDZV_PENDING);
  CHECK_EQ_INT(poll_until_closed(a, N, 0), 3);
  for (int i = 0; i < 3; i++) CHECK_EQ_INT(a[i].r.group_rank, i);
  CHECK_EQ_INT(a[3].r.group_rank, -1);
  CHECK_EQ_INT(a[3].r.closed_n, 3);
  CHECK(agent_rdzv_join_poll(&a[3].r, 0) == AGENT_RDZV_WAITER);
  beat_all(a, N, -1, 0, 3 * S);
  CHECK_EQ_INT(a[0].r.nstandby, 1);
  CHECK_EQ_INT(a[0].r.standby[0].node_rank, 3);
  CHECK_EQ_INT(a[0].r.nstandby_live, 1);
  /* The standby goes quiet: the leader stops counting it, the round goes on. */
  for (int64_t t = 3 * S + S / 2; t <= 8 * S; t += S / 2)
    for (int i = 0; i < 3; i++) CHECK(agent_rdzv_monitor(&a[i].r, t) == AGENT_RDZV_PENDING);
  CHECK_EQ_INT(a[0].r.nstandby_live, 0);
  beat_all(a, N, -1, 8 * S + S / 2, 10 * S);
  CHECK_EQ_INT(a[0].r.nstandby_live, 1);
  /* Node 1 is lost. */
  agent_rdzv_result_t res = AGENT_RDZV_PENDING;
  int64_t t;
  for (t = 10 * S + S / 2; t <= 20 * S && res == AGENT_RDZV_PENDING; t += S / 2) {
    CHECK(agent_rdzv_monitor(&a[2].r, t) == AGENT_RDZV_PENDING);
    CHECK(agent_rdzv_standby_poll(&a[3].r, t) == AGENT_RDZV_PENDING);
    res = agent_rdzv_monitor(&a[0].r, t);
  }
  CHECK(res == AGENT_RDZV_ENDED);
  CHECK(strstr(a[0].r.end_text, "node 1") != NULL);
  CHECK(agent_rdzv_monitor(&a[2].r, t) == AGENT_RDZV_ENDED);
  CHECK(agent_rdzv_standby_poll(&a[3].r, t) == AGENT_RDZV_ROUND_MOVED);
  CHECK(agent_rdzv_join(&a[3].r, 1, 0, 0) == AGENT_RDZV_PENDING);
  CHECK(agent_rdzv_join(&a[0].r, 1, 1, 1) == AGENT_RDZV_PENDING);
  CHECK(agent_rdzv_join_poll(&a[0].r, t) == AGENT_RDZV_PENDING); /* 2 of 3 */
  CHECK(agent_rdzv_join(&a[2].r, 1, 1, 1) == AGENT_RDZV_PENDING);
  sim_t *m[3] = {&a[0], &a[3], &a[2]};
  int base = 0;
  for (int g = 0; g < 3; g++) {
    res = AGENT_RDZV_PENDING;
    for (int k = 0; k < 3 && res == AGENT_RDZV_PENDING; k++)
      res = agent_rdzv_join_poll(&m[g]->r, t);
    CHECK(res == AGENT_RDZV_MEMBER);
    CHECK_EQ_INT(m[g]->r.group_rank, g);
    CHECK_EQ_INT(m[g]->r.rank_base, base);
    CHECK_EQ_INT(m[g]->r.attempt, 1);
    CHECK_EQ_INT(m[g]->r.failures, 1);
    CHECK_EQ_INT(m[g]->r.worker_store.port, 30000);
    base += nproc[g == 1 ? 3 : g];
  }
  for (int g = 0; g < 3; g++) CHECK_EQ_INT(m[g]->r.world_size, base);
  /* Node 1's replacement pod: a standby; the members carry on. */
  CHECK(agent_rdzv_join(&a[4].r, 0, 0, 0) == AGENT_RDZV_PENDING);
  CHECK_EQ_INT(a[4].r.round, 1);
  CHECK(agent_rdzv_join_poll(&a[4].r, t) == AGENT_RDZV_WAITER);
  for (int64_t u = t; u <= t + 3 * S; u += S / 2) {
    for (int g = 0; g < 3; g++) CHECK(agent_rdzv_monitor(&m[g]->r, u) == AGENT_RDZV_PENDING);
    CHECK(agent_rdzv_standby_poll(&a[4].r, u) == AGENT_RDZV_PENDING);
  }
  CHECK_EQ_INT(a[0].r.nstandby, 1);
  CHECK_EQ_INT(a[0].r.standby[0].node_rank, 1);
  /* The members finish; the standby sees the job done. */
  int marked[3] = {0, 0, 0};
  for (int g = 0; g < 3; g++) res = agent_rdzv_done_poll(&m[g]->r, t + 4 * S, &marked[g]);
  CHECK(res == AGENT_RDZV_ALL_DONE);
  CHECK(agent_rdzv_standby_poll(&a[4].r, t + 4 * S) == AGENT_RDZV_ALL_DONE);
  int64_t ex = -1;
  CHECK(agent_rdzv_standby_exited(&a[4].r, 1, &ex) == AGENT_RDZV_PENDING && ex == 1);
  CHECK(agent_rdzv_standby_exited(&a[0].r, 0, &ex) == AGENT_RDZV_PENDING && ex == 1);
  for (int i = 0; i < N + 1; i++) sim_close(&a[i]);
}

/* Two members lost with one spare: the next round (fixed size) cannot close with 2 of 3 however
 * long it waits (the caller's --rdzv-timeout ends it); once the job gives up ("failed"), a
 * standby and an agent still joining leave with its text. Several arrivals with one node rank:
 * the latest is the member. */
static void test_spares_short(void) {
  sim_t a[4];
  for (int i = 0; i < 4; i++) {
    sim_open(&a[i], "short", i, 1, 3, 3);
    a[i].r.spares = 1;
  }
  join_all(a, 4, 0);
  CHECK_EQ_INT(poll_until_closed(a, 4, 0), 3);
  CHECK(agent_rdzv_end(&a[0].r, AGENT_RESTART_PEER_LOST, "nodes 1 and 2 lost") == AGENT_RDZV_ENDED);
  CHECK(agent_rdzv_standby_poll(&a[3].r, 0) == AGENT_RDZV_ROUND_MOVED);
  CHECK(agent_rdzv_join(&a[0].r, 1, 1, 1) == AGENT_RDZV_PENDING);
  CHECK(agent_rdzv_join(&a[3].r, 1, 0, 0) == AGENT_RDZV_PENDING);
  for (int64_t t = 0; t <= 1000 * S; t += 100 * S) {
    CHECK(agent_rdzv_join_poll(&a[0].r, t) == AGENT_RDZV_PENDING);
    CHECK(agent_rdzv_join_poll(&a[3].r, t) == AGENT_RDZV_PENDING);
  }
  CHECK(agent_rdzv_job_failed(&a[0].r, "giving up after 1 restart(s)") == AGENT_RDZV_PENDING);
  CHECK(agent_rdzv_join_poll(&a[3].r, 0) == AGENT_RDZV_JOB_FAILED);
  CHECK(strstr(a[3].r.end_text, "giving up") != NULL);
  for (int i = 0; i < 4; i++) sim_close(&a[i]);

  sim_t b[4];
  for (int i = 0; i < 4; i++) {
    sim_open(&b[i], "dup", i < 3 ? i : 1, 1, 3, 3);
    b[i].r.spares = 1;
  }
  join_all(b, 4, 0); /* node 1 twice: b[1] then b[3] */
  CHECK_EQ_INT(poll_until_closed(b, 4, 0), 3);
  CHECK_EQ_INT(b[1].r.group_rank, -1);
  CHECK_EQ_INT(b[3].r.group_rank, 1);
  CHECK(agent_rdzv_job_failed(&b[0].r, "x") == AGENT_RDZV_PENDING);
  CHECK(agent_rdzv_standby_poll(&b[1].r, 0) == AGENT_RDZV_JOB_FAILED);
  for (int i = 0; i < 4; i++) sim_close(&b[i]);
}

/* Healthy members rejoin only after stopping their workers, standbys at once: 3 nodes + 2 spares,
 * node 1 lost (the leader marks it gone). The two standbys and node 0 reach round 1 before node
 * 2: the round waits for node 2 (a live member of round 0) instead of giving its place to the
 * second standby; node 2 keeps group rank 2 and the lower standby (node 3) takes group rank 1.
 * With `late` node 2 never comes: after member_wait_s the round closes with both standbys. */
static void test_spares_wait(int late) {
  enum { N = 5 };
  sim_t a[N];
  char run[32];
  snprintf(run, sizeof run, "wait%d", late);
  for (int i = 0; i < N; i++) {
    sim_open(&a[i], run, i, 1, 3, 3);
    a[i].r.spares = 2;
    a[i].r.member_wait_s = 10;
  }
  join_all(a, N, 0);
  CHECK_EQ_INT(poll_until_closed(a, N, 0), 3);
  beat_all(a, N, -1, 0, 2 * S);
  agent_rdzv_result_t res = AGENT_RDZV_PENDING;
  int64_t t;
  for (t = 2 * S + S / 2; t <= 12 * S && res == AGENT_RDZV_PENDING; t += S / 2) {
    CHECK(agent_rdzv_monitor(&a[2].r, t) == AGENT_RDZV_PENDING);
    for (int i = 3; i < N; i++) CHECK(agent_rdzv_standby_poll(&a[i].r, t) == AGENT_RDZV_PENDING);
    res = agent_rdzv_monitor(&a[0].r, t);
  }
  CHECK(res == AGENT_RDZV_ENDED);
  CHECK(strstr(a[0].r.end_text, "node 1") != NULL);
  for (int i = 3; i < N; i++) {
    CHECK(agent_rdzv_standby_poll(&a[i].r, t) == AGENT_RDZV_ROUND_MOVED);
    CHECK(agent_rdzv_join(&a[i].r, 1, 0, 0) == AGENT_RDZV_PENDING);
  }
  CHECK(agent_rdzv_join(&a[0].r, 1, 1, 1) == AGENT_RDZV_PENDING);
  /* 3 arrivals, but node 2 (not gone) is still stopping its workers. */
  for (int i = 0; i < N; i++) {
    if (i == 1 || i == 2) continue;
    CHECK(agent_rdzv_join_poll(&a[i].r, t) == AGENT_RDZV_PENDING);
    CHECK(agent_rdzv_join_poll(&a[i].r, t + 9 * S) == AGENT_RDZV_PENDING);
  }
  sim_t *m[3];
  int64_t when = t + 9 * S;
  if (!late) {
    CHECK(agent_rdzv_monitor(&a[2].r, t) == AGENT_RDZV_ENDED);
    CHECK(agent_rdzv_join(&a[2].r, 1, 1, 1) == AGENT_RDZV_PENDING);
    m[0] = &a[0], m[1] = &a[3], m[2] = &a[2];
  } else {
    when = t + 10 * S; /* member_wait_s after the round first had 3 arrivals */
    m[0] = &a[0], m[1] = &a[3], m[2] = &a[4];
  }
  for (int g = 0; g < 3; g++) {
    res = AGENT_RDZV_PENDING;
    for (int k = 0; k < 3 && res == AGENT_RDZV_PENDING; k++)
      res = agent_rdzv_join_poll(&m[g]->r, when);
    CHECK(res == AGENT_RDZV_MEMBER);
    CHECK_EQ_INT(m[g]->r.group_rank, g);
    CHECK_EQ_INT(m[g]->r.rank_base, g);
  }
  if (!late) CHECK(agent_rdzv_join_poll(&a[4].r, when) == AGENT_RDZV_WAITER);
  for (int i = 0; i < N; i++) sim_close(&a[i]);
}

/* The store going away is reported as an error, not a hang. */
static void test_store_lost(void) {
  sim_t a;
  sim_open(&a, "lost", 0, 1, 2, 2);
  CHECK(agent_rdzv_join(&a.r, 0, 0, 0) == 0);
  tdist_store_server_destroy(server);
  server = NULL;
  CHECK(agent_rdzv_join_poll(&a.r, 0) == AGENT_RDZV_STORE_ERROR);
  CHECK(a.r.err[0] != 0);
  sim_close(&a);
}

/* The validators, against hand-written cases: what agents write passes, anything else fails. */
static void test_validators(void) {
  static const struct {
    const char *s;
    int64_t lo, hi;
    int ok;
    int64_t v;
  } ints[] = {
      {"0", 0, 10, 1, 0},
      {"10", 0, 10, 1, 10},
      {"11", 0, 10, 0, 0},
      {"-1", 0, 10, 0, 0},
      {"-1", -5, 10, 1, -1},
      {"", 0, 10, 0, 0},
      {"-", -5, 10, 0, 0},
      {"-0", 0, 10, 0, 0}, /* no agent writes a minus zero (was read as 0) */
      {"-0", -5, 10, 0, 0},
      {"01", 0, 10, 0, 0},
      {" 1", 0, 10, 0, 0},
      {"1 ", 0, 10, 0, 0},
      {"+1", 0, 10, 0, 0},
      {"1x", 0, 10, 0, 0},
      {"garbage", 0, 10, 0, 0},
      {"9223372036854775807", 0, INT64_MAX, 1, INT64_MAX},
      {"9223372036854775808", 0, INT64_MAX, 0, 0},
      {"99999999999999999999", 0, INT64_MAX, 0, 0},
      {"9223372036854775807", 0, AGENT_RDZV_MAX_ROUND, 0, 0},
      {"1000000000", 0, AGENT_RDZV_MAX_ROUND, 1, AGENT_RDZV_MAX_ROUND},
      {"1000000001", 0, AGENT_RDZV_MAX_ROUND, 0, 0},
  };
  for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) {
    int64_t v = -42;
    int rc = agent_rdzv_parse_int(ints[i].s, ints[i].lo, ints[i].hi, &v);
    CHECK_EQ_INT(rc == 0, ints[i].ok);
    if (ints[i].ok) CHECK_EQ_INT(v, ints[i].v);
  }
  agent_rdzv_member_t m;
  CHECK_EQ_INT(agent_rdzv_parse_record("2 4 7 1 10.0.0.3 job-2 0", 3, &m), 0);
  CHECK(m.node_rank == 2 && m.nproc == 4 && m.attempt == 7 && m.failures == 1);
  CHECK(m.worker_port == 0 && !strcmp(m.addr, "10.0.0.3") && !strcmp(m.host, "job-2"));
  CHECK_EQ_INT(agent_rdzv_parse_record("0 1 0 0 - - 65535", 1, &m), 0);
  CHECK_EQ_INT(m.worker_port, 65535);
  static const char *const bad_recs[] = {
      "3 4 7 1 10.0.0.3 job-2 0",  /* node rank == nnodes_max */
      "-1 4 7 1 10.0.0.3 job-2 0", /* negative node rank */
      "-0 4 7 1 10.0.0.3 job-2 0", /* minus zero: no agent writes it */
      "0 1 0 0 a h -0",            /* minus zero port */
      "0 0 0 0 a h 0",             /* nproc 0 */
      "0 1 -1 0 a h 0",            /* negative attempt */
      "0 1 1000000001 0 a h 0",    /* attempt past AGENT_RDZV_MAX_COUNT */
      "0 1 0 2147483648 a h 0",    /* failures past int */
      "0 1 0 0 a h 65536",         /* port */
      "0 1 0 0 a h",               /* 6 fields */
      "0 1 0 0 a h 0 extra",       /* 8 fields */
      "0  1 0 0 a h 0",            /* empty field */
      "0 1 0 0 a h 0 ",            /* trailing space */
      "junk",                      /* */
      "",                          /* */
      "0 1 0 0 aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa h 0", /* 64 */
  };
  for (size_t i = 0; i < sizeof bad_recs / sizeof bad_recs[0]; i++)
    CHECK_EQ_INT(agent_rdzv_parse_record(bad_recs[i], 3, &m), -1);
  agent_restart_reason_t why;
  const char *text;
  CHECK_EQ_INT(agent_rdzv_parse_end("worker_failed rank 1 exited with code 3", &why, &text), 0);
  CHECK(why == AGENT_RESTART_WORKER_FAILED && !strcmp(text, "rank 1 exited with code 3"));
  CHECK_EQ_INT(agent_rdzv_parse_end("protocol_error x", &why, &text), 0);
  CHECK(why == AGENT_RESTART_PROTOCOL);
  CHECK_EQ_INT(agent_rdzv_parse_end("membership", &why, &text), -1); /* no text */
  {
    static const struct {
      const char *s;
      int ok, bare;
      int64_t n, first, last;
    } cl[] = {
        {"3", 1, 1, 3, 0, 0},
        {"3 5,1,2", 1, 0, 3, 5, 2},
        {"1 7", 1, 0, 1, 7, 7},
        {"4", 0, 0, 0, 0, 0},
        {"0", 0, 0, 0, 0, 0},
        {"3 1,2", 0, 0, 0, 0, 0},
        {"3 1,2,3,4", 0, 0, 0, 0, 0},
        {"3 1,1,2", 0, 0, 0, 0, 0},
        {"3 1,2,0", 0, 0, 0, 0, 0},
        {"3 1,2,", 0, 0, 0, 0, 0},
        {"3 1,,2", 0, 0, 0, 0, 0},
        {"3 ", 0, 0, 0, 0, 0},
        {"3 1,2,x", 0, 0, 0, 0, 0},
        {"2 1 2", 0, 0, 0, 0, 0},
        {"03 1,2,3", 0, 0, 0, 0, 0},
        {"3 1,2,01", 0, 0, 0, 0, 0},
        {"", 0, 0, 0, 0, 0},
        /* arrivals far apart (the distinctness check's set, not its bitmap) */
        {"2 1000000000,7", 1, 0, 2, 1000000000, 7},
        {"3 1000000000,7,1000000000", 0, 0, 0, 0, 0},
        {"3 999999999,1000000000,3", 1, 0, 3, 999999999, 3},
    };
    for (size_t i = 0; i < sizeof cl / sizeof cl[0]; i++) {
      int64_t n = 0, *list = NULL;
      int rc = agent_rdzv_parse_closed(cl[i].s, 3, &n, &list);
      if ((rc == 0) != cl[i].ok) {
        fprintf(stderr, "parse_closed('%s') = %d\n", cl[i].s, rc);
        CHECK(0);
      }
      if (rc == 0) {
        CHECK_EQ_INT(n, cl[i].n);
        CHECK((list == NULL) == cl[i].bare);
        if (list) CHECK(list[0] == cl[i].first && list[n - 1] == cl[i].last);
      } else {
        CHECK(list == NULL);
      }
      free(list);
    }
  }
  CHECK_EQ_INT(agent_rdzv_parse_end("membership ", &why, &text), -1); /* empty text */
  CHECK_EQ_INT(agent_rdzv_parse_end("memberships x", &why, &text), -1);
  CHECK_EQ_INT(agent_rdzv_parse_end("garbage", &why, &text), -1);
  CHECK_EQ_INT(agent_rdzv_parse_end("", &why, &text), -1);
}

/* Records written by something else: a protocol error naming the key and the value, never a
 * store error, and the round can never be pushed past AGENT_RDZV_MAX_ROUND (no overflow). */
static void test_hostile_records(void) {
  sim_t a;
  sim_open(&a, "hostile", 0, 1, 1, 1);
  CHECK(tdist_store_set(a.store, "round", "garbage", 7) == TDIST_OK);
  CHECK(agent_rdzv_join(&a.r, 0, 0, 0) == AGENT_RDZV_PROTOCOL_ERROR);
  CHECK_HAS(a.r.err, "key round holds 'garbage'");
  CHECK(tdist_store_set(a.store, "round", "9223372036854775807", 19) == TDIST_OK);
  CHECK(agent_rdzv_join(&a.r, 0, 0, 0) == AGENT_RDZV_PROTOCOL_ERROR);
  CHECK_HAS(a.r.err, "key round holds '9223372036854775807'");
  /* The last round: ending it is fine, the next join is refused, nothing wraps. */
  CHECK(tdist_store_set(a.store, "round", "1000000000", 10) == TDIST_OK);
  CHECK(agent_rdzv_join(&a.r, 0, 0, 0) == 0);
  CHECK_EQ_INT(a.r.round, AGENT_RDZV_MAX_ROUND);
  CHECK(agent_rdzv_join_poll(&a.r, 0) == AGENT_RDZV_MEMBER);
  CHECK(agent_rdzv_end(&a.r, AGENT_RESTART_WORKER_FAILED, "x") == AGENT_RDZV_ENDED);
  CHECK(agent_rdzv_join(&a.r, a.r.round + 1, 0, 0) == AGENT_RDZV_PROTOCOL_ERROR);
  CHECK_HAS(a.r.err, "past the last round");
  /* A bad member record, a bad /closed, a bad heartbeat, a bad /end. */
  CHECK(tdist_store_set(a.store, "round", "7", 1) == TDIST_OK);
  CHECK(agent_rdzv_join(&a.r, 0, 0, 0) == 0);
  CHECK(tdist_store_set(a.store, "7/closed", "0x1", 3) == TDIST_OK);
  CHECK(agent_rdzv_join_poll(&a.r, 0) == AGENT_RDZV_PROTOCOL_ERROR);
  CHECK_HAS(a.r.err, "key 7/closed holds '0x1'");
  CHECK(tdist_store_set(a.store, "7/closed", "1", 1) == TDIST_OK);
  CHECK(tdist_store_set(a.store, "7/node/1", "5 1 0 0 a h 0", 13) == TDIST_OK);
  CHECK(agent_rdzv_join_poll(&a.r, 0) == AGENT_RDZV_PROTOCOL_ERROR);
  CHECK_HAS(a.r.err, "key 7/node/1 holds '5 1 0 0 a h 0'");
  CHECK(tdist_store_set(a.store, "7/node/1", "0 1 0 0 a h 1", 13) == TDIST_OK);
  CHECK(agent_rdzv_join_poll(&a.r, 0) == AGENT_RDZV_MEMBER);
  /* Fake joiners (no records): nothing happens, no error. */
  int64_t j;
  CHECK(tdist_store_add(a.store, "7/joined", 1000, &j) == TDIST_OK);
  CHECK(agent_rdzv_monitor(&a.r, 0) == AGENT_RDZV_PENDING);
  CHECK(agent_rdzv_monitor(&a.r, S) == AGENT_RDZV_PENDING);
  CHECK(tdist_store_set(a.store, "7/joined", "x", 1) == TDIST_OK);
  CHECK(agent_rdzv_monitor(&a.r, 2 * S) == AGENT_RDZV_PROTOCOL_ERROR);
  CHECK_HAS(a.r.err, "key 7/joined holds 'x'");
  /* A bad /end read when the round moves: the round fails as a protocol error, value named. */
  CHECK(tdist_store_set(a.store, "7/end", "reboot now", 10) == TDIST_OK);
  CHECK(tdist_store_set(a.store, "round", "8", 1) == TDIST_OK);
  CHECK(agent_rdzv_monitor(&a.r, 3 * S) == AGENT_RDZV_ENDED);
  CHECK(a.r.end_reason == AGENT_RESTART_PROTOCOL);
  CHECK_HAS(a.r.end_text, "key 7/end holds 'reboot now'");
  sim_close(&a);
}

/* Points a simulated agent at another run's keys on the server: the store the agents move to. */
static void sim_move(sim_t *a, const char *run_id, int host_rank) {
  tdist_store_destroy(a->store);
  char prefix[64];
  snprintf(prefix, sizeof prefix, "tdist/%s", run_id);
  CHECK(tdist_prefix_store_create(a->client, prefix, &a->store) == TDIST_OK);
  a->r.store = a->store;
  a->r.host_rank = host_rank;
  a->r.worker_port = a->r.node_rank == host_rank ? 31000 : 0;
}

/* Store failover: round 0 runs on pod 0's store with members 0, 2, 4 (group ranks 0, 1, 2) and
 * standbys 1 and 3; pod 0 is lost and the agents move to the store of the backup host, node 3.
 * With the carry-over (round 0's members and node 0 gone, written by whoever gets there first; a
 * standby knows the members too) round 1 closes at once although a newcomer takes a place (no
 * wait for node 0): node 3 gets group rank 0 (the store host), nodes 2 and 4 keep 1 and 2, node 1
 * stays a standby, the workers' store is node 3's; and a round that would seat a newcomer before
 * member 4 arrived waits for it (member_wait_s). Without it (a garbled "0/members" is ignored
 * like a missing one) group ranks follow node ranks after the store host's. */
static void test_failover(int carry) {
  enum { N = 5 };
  sim_t a[N];
  char run[32], moved[32];
  snprintf(run, sizeof run, "fo%d", carry);
  snprintf(moved, sizeof moved, "fo%d-b", carry);
  const int order[N] = {0, 4, 2, 3, 1}; /* 0, 4, 2 members; 3, 1 standbys */
  for (int i = 0; i < N; i++) {
    sim_open(&a[i], run, i, 1, 3, 3);
    a[i].r.spares = 2;
    a[i].r.member_wait_s = 5;
  }
  for (int k = 0; k < 3; k++) CHECK(agent_rdzv_join(&a[order[k]].r, 0, 0, 0) == AGENT_RDZV_PENDING);
  CHECK_EQ_INT(poll_until_closed(a, N, 0), 3);
  /* A member knows the others' node ranks from its first monitor call on (it reads the records
   * then, once its workers started). */
  for (int k = 0; k < 3; k++) {
    CHECK(a[order[k]].r.members == NULL);
    CHECK(agent_rdzv_monitor(&a[order[k]].r, 0) == AGENT_RDZV_PENDING);
    CHECK(a[order[k]].r.members != NULL);
  }
  for (int k = 3; k < N; k++) {
    CHECK(agent_rdzv_join(&a[order[k]].r, 0, 0, 0) == AGENT_RDZV_PENDING);
    CHECK(agent_rdzv_join_poll(&a[order[k]].r, 0) == AGENT_RDZV_WAITER);
  }
  CHECK_EQ_INT(a[0].r.group_rank, 0);
  CHECK_EQ_INT(a[2].r.group_rank, 1);
  CHECK_EQ_INT(a[4].r.group_rank, 2);
  CHECK_EQ_INT(a[2].r.carry_round, 0);
  CHECK_EQ_INT(a[2].r.carry_n, 3);
  CHECK_EQ_INT(a[1].r.carry_round, 0); /* a standby knows the members too */
  CHECK_EQ_INT(a[1].r.carry_n, 3);
  CHECK_EQ_INT(a[1].r.carry_nodes[1], 2);
  for (int i = 1; i < N; i++) sim_move(&a[i], moved, 3);
  if (carry) {
    /* The standby gets there first; a member writes the same again. */
    CHECK(agent_rdzv_carry_over(&a[1].r, 0) == AGENT_RDZV_PENDING);
    CHECK(agent_rdzv_carry_over(&a[2].r, 0) == AGENT_RDZV_PENDING);
    /* The standbys ask for round 0, the one they waited in (main.c's next_round), before any
     * member arrived: they land in round 1, where the members go, and pod 0's replacement (a
     * fresh agent) follows them there; a round 0 on this store could close with those three
     * before the members came. Node 4 (a member) is still stopping its workers: 3, 1, 2 arrive. */
    sim_t fresh0;
    sim_open(&fresh0, moved, 0, 1, 3, 3);
    fresh0.r.spares = 2;
    fresh0.r.member_wait_s = 5;
    fresh0.r.host_rank = 3;
    const int early[3] = {3, 1, 2};
    for (int k = 0; k < 2; k++) {
      CHECK(agent_rdzv_join(&a[early[k]].r, 0, 0, 0) == AGENT_RDZV_PENDING);
      CHECK_EQ_INT(a[early[k]].r.round, 1);
    }
    CHECK(agent_rdzv_join(&fresh0.r, 0, 0, 0) == AGENT_RDZV_PENDING);
    CHECK_EQ_INT(fresh0.r.round, 1);
    CHECK(agent_rdzv_join(&a[2].r, 1, 1, 0) == AGENT_RDZV_PENDING);
    for (int k = 0; k < 3; k++)
      CHECK(agent_rdzv_join_poll(&a[early[k]].r, 1 * S) == AGENT_RDZV_PENDING);
    CHECK(agent_rdzv_join_poll(&fresh0.r, 1 * S) == AGENT_RDZV_PENDING);
    CHECK(agent_rdzv_join(&a[4].r, 1, 1, 0) == AGENT_RDZV_PENDING);
    CHECK_EQ_INT(poll_until_closed(a + 1, N - 1, 2 * S), 3);
    CHECK(agent_rdzv_join_poll(&fresh0.r, 2 * S) == AGENT_RDZV_WAITER);
    sim_close(&fresh0);
    CHECK_EQ_INT(a[3].r.group_rank, 0);
    CHECK_EQ_INT(a[2].r.group_rank, 1);
    CHECK_EQ_INT(a[4].r.group_rank, 2);
    CHECK_EQ_INT(a[1].r.group_rank, -1);
    CHECK(agent_rdzv_join_poll(&a[1].r, 2 * S) == AGENT_RDZV_WAITER);
  } else {
    const char *bad = "4 4 2"; /* a value no agent writes: ignored */
    void *v = NULL;
    size_t n = 0;
    CHECK(tdist_store_compare_set(a[2].store, "0/members", "", 0, bad, strlen(bad), &v, &n) ==
          TDIST_OK);
    tdist_free(v);
    const int order1[4] = {3, 2, 4, 1};
    for (int k = 0; k < 4; k++)
      CHECK(agent_rdzv_join(&a[order1[k]].r, 1, 1, 0) == AGENT_RDZV_PENDING);
    /* Nothing known of round 0: node-rank order after the store host, nobody waited for. */
    CHECK_EQ_INT(poll_until_closed(a + 1, N - 1, 1 * S), 3);
    CHECK_EQ_INT(a[3].r.group_rank, 0);
    CHECK_EQ_INT(a[1].r.group_rank, 1);
    CHECK_EQ_INT(a[2].r.group_rank, 2);
    CHECK_EQ_INT(a[4].r.group_rank, -1);
  }
  for (int i = 1; i < N; i++) {
    if (a[i].r.group_rank < 0) continue;
    CHECK_EQ_INT(a[i].r.round, 1);
    CHECK_EQ_INT(a[i].r.attempt, 1);
    CHECK_EQ_INT(a[i].r.worker_store.port, 31000);
  }
  for (int i = 0; i < N; i++) sim_close(&a[i]);
}

/* The closer puts what the members agree on after the list in <r>/closed ("N a1,...,aN\nW A F P C
 * U", and the nprocs when they differ) and the members' records in <r>/table/<C>, set before
 * <r>/closed: the table's lines equal the <r>/node/<idx> records in group-rank order. Members that
 * poll after every record key is deleted still get their group rank, rank base, world size and
 * workers' store, without reading the table; their first monitor call reads it (peers'
 * addresses, hosts, arrivals). A header no closer writes is a protocol error naming <r>/closed;
 * a table missing or disagreeing with <r>/closed one naming the table's key. */
static void check_closed_layout(const char *run, const int *nproc) {
  enum { N = 3 };
  sim_t a[N];
  int ws = 0;
  for (int i = 0; i < N; i++) {
    sim_open(&a[i], run, i, nproc[i], N, N);
    ws += nproc[i];
  }
  join_all(a, N, 0);
  CHECK(agent_rdzv_join_poll(&a[0].r, 0) == AGENT_RDZV_MEMBER);
  void *v = NULL;
  size_t n = 0;
  CHECK(tdist_store_get(a[0].store, "0/closed", &v, &n) == TDIST_OK);
  char *val = strndup(v, n), want[1024], table[1024] = "", tkey[32];
  tdist_free(v);
  int at = snprintf(want, sizeof want, "%d", N),
      same = nproc[0] == nproc[1] && nproc[1] == nproc[2];
  for (int g = 0; g < N; g++)
    at += snprintf(want + at, sizeof want - (size_t)at, "%c%d", g ? ',' : ' ', (int)a[g].r.idx);
  at += snprintf(want + at, sizeof want - (size_t)at, "\n%d 0 0 30000 %d %d", ws, (int)a[0].r.idx,
                 same ? nproc[0] : 0);
  for (int g = 0; !same && g < N; g++)
    at += snprintf(want + at, sizeof want - (size_t)at, "%c%d", g ? ',' : '\n', nproc[g]);
  CHECK_STR(val, want);
  free(val);
  int tl = 0;
  for (int g = 0; g < N; g++) {
    char key[32];
    snprintf(key, sizeof key, "0/node/%d", (int)a[g].r.idx);
    CHECK(tdist_store_get(a[0].store, key, &v, &n) == TDIST_OK);
    tl +=
        snprintf(table + tl, sizeof table - (size_t)tl, "%s%.*s", g ? "\n" : "", (int)n, (char *)v);
    tdist_free(v);
    int deleted = 0;
    CHECK(tdist_store_delete_key(a[0].store, key, &deleted) == TDIST_OK && deleted);
  }
  snprintf(tkey, sizeof tkey, "0/table/%d", (int)a[0].r.idx);
  CHECK(tdist_store_get(a[0].store, tkey, &v, &n) == TDIST_OK);
  val = strndup(v, n);
  tdist_free(v);
  CHECK_STR(val, table);
  free(val);
  for (int i = 1; i < N; i++) {
    CHECK(agent_rdzv_join_poll(&a[i].r, 0) == AGENT_RDZV_MEMBER);
    CHECK_EQ_INT(a[i].r.group_rank, i);
    CHECK_EQ_INT(a[i].r.rank_base, i == 1 ? nproc[0] : nproc[0] + nproc[1]);
    CHECK_EQ_INT(a[i].r.world_size, ws);
    CHECK_EQ_INT(a[i].r.worker_store.port, 30000);
    CHECK(a[i].r.members == NULL); /* not read yet */
    CHECK(agent_rdzv_monitor(&a[i].r, 0) == AGENT_RDZV_PENDING);
    CHECK(a[i].r.members != NULL);
    for (int g = 0; g < N; g++) {
      CHECK_STR(a[i].r.members[g].addr, a[g].r.addr);
      CHECK_STR(a[i].r.members[g].host, a[g].r.host);
      CHECK_EQ_INT(a[i].r.members[g].idx, (int)a[g].r.idx);
      CHECK_EQ_INT(a[i].r.members[g].nproc, nproc[g]);
    }
    CHECK_EQ_INT(a[i].r.carry_n, N);
  }
  for (int i = 0; i < N; i++) sim_close(&a[i]);
}

static void test_closed_layout(void) {
  const int mixed[3] = {2, 1, 3}, same[3] = {2, 2, 2};
  check_closed_layout("layout-mixed", mixed);
  check_closed_layout("layout-same", same);
  /* Headers no closer writes. */
  const char *bad[] = {"2 1,2\n0 1 0 0 10.0.0.1 job-0 30000\nnot a record",
                       "2 1,2\n0 1 0 0 10.0.0.1 job-0 30000",
                       "2 1,2\n3 0 0 30000 1 1",      /* world size not 2 x 1 */
                       "2 1,2\n2 0 0 30000 1 0\n1,1", /* equal nprocs written as a list */
                       "2 1,2\n3 0 0 30000 1 0\n1,2,",
                       "2 1,2\n2 0 0 30000 1 1\n",
                       "2 1,2\n2 0 0 30000 0 1", /* closer 0 */
                       "2\n2 0 0 30000 1 1"};
  for (size_t k = 0; k < sizeof bad / sizeof *bad; k++) {
    char run[32];
    snprintf(run, sizeof run, "badheader%zu", k);
    sim_t b[2];
    for (int i = 0; i < 2; i++) sim_open(&b[i], run, i, 1, 3, 3);
    join_all(b, 2, 0);
    CHECK(tdist_store_set(b[0].store, "0/closed", bad[k], strlen(bad[k])) == TDIST_OK);
    CHECK(agent_rdzv_join_poll(&b[1].r, 0) == AGENT_RDZV_PROTOCOL_ERROR);
    CHECK_HAS(b[1].r.err, "key 0/closed holds");
    for (int i = 0; i < 2; i++) sim_close(&b[i]);
  }
  /* A good header, then a table that is missing, not records, or not the header's members. */
  const char *tables[] = {NULL, "garbage\nx", "1 1 0 0 a h 30000\n0 1 0 0 b h 0",
                          "0 1 0 0 a h 30000\n1 2 0 0 b h 0"};
  for (size_t k = 0; k < sizeof tables / sizeof *tables; k++) {
    char run[32];
    snprintf(run, sizeof run, "badtable%zu", k);
    sim_t b[2];
    for (int i = 0; i < 2; i++) sim_open(&b[i], run, i, 1, 2, 2);
    join_all(b, 2, 0);
    const char *closed = "2 1,2\n2 0 0 30000 1 1";
    CHECK(tdist_store_set(b[0].store, "0/closed", closed, strlen(closed)) == TDIST_OK);
    if (tables[k])
      CHECK(tdist_store_set(b[0].store, "0/table/1", tables[k], strlen(tables[k])) == TDIST_OK);
    CHECK(agent_rdzv_join_poll(&b[1].r, 0) == AGENT_RDZV_MEMBER);
    CHECK(agent_rdzv_monitor(&b[1].r, 0) == AGENT_RDZV_PROTOCOL_ERROR);
    CHECK_HAS(b[1].r.err, "0/table/1");
    for (int i = 0; i < 2; i++) sim_close(&b[i]);
  }
}

/* The header codec on random members: what format writes, parse reads back (world size, rank
 * bases as the nprocs' prefix sums, the one-count form exactly when all are equal), and the text
 * is the one format writes again. */
static void test_header_codec(unsigned seed) {
  srand(seed);
  for (int iter = 0; iter < 2000; iter++) {
    int64_t n = 1 + rand() % (iter % 10 ? 8 : 300);
    int *np = calloc((size_t)n, sizeof *np), k = rand() % 3;
    CHECK(np != NULL);
    int64_t ws = 0;
    for (int64_t i = 0; i < n; i++) {
      np[i] = k == 0 ? 8 : k == 1 ? 1 + rand() % 4 : 1 + rand() % (1 << 20);
      ws += np[i];
    }
    agent_rdzv_header_t h = {.attempt = rand() % 1000,
                             .failures = rand() % 3 ? 0 : AGENT_RDZV_MAX_COUNT,
                             .worker_port = rand() % 65536,
                             .closer = 1 + rand() % 100000},
                        g;
    char *text = agent_rdzv_format_header(&h, n, np);
    CHECK(text != NULL);
    int64_t *bases = NULL;
    CHECK_EQ_INT(agent_rdzv_parse_header(text, n, &g, &bases), 0);
    CHECK(g.world_size == ws && g.attempt == h.attempt && g.failures == h.failures);
    CHECK(g.worker_port == h.worker_port && g.closer == h.closer);
    int same = 1;
    int64_t b = 0;
    for (int64_t i = 0; i < n; i++) {
      same &= np[i] == np[0];
      CHECK(bases[i] == b);
      b += np[i];
    }
    CHECK_EQ_INT(g.nproc, same ? np[0] : 0);
    CHECK_EQ_INT(strchr(text, '\n') == NULL, same);
    char *again = agent_rdzv_format_header(&g, n, np);
    CHECK_STR(again, text);
    free(again);
    /* The same text read for one member more is refused (the world size no longer adds up). */
    int64_t *b2 = NULL;
    CHECK_EQ_INT(agent_rdzv_parse_header(text, n + 1, &g, &b2), -1);
    CHECK(b2 == NULL);
    free(bases);
    free(text);
    free(np);
  }
  /* A world of 2^31 ranks or more is refused, never wrapped into an int. */
  enum { BIG = 2049 };
  int *np = malloc(BIG * sizeof *np);
  CHECK(np != NULL);
  for (int i = 0; i < BIG; i++) np[i] = 1 << 20;
  agent_rdzv_header_t h = {.closer = 1}, g;
  char *text = agent_rdzv_format_header(&h, BIG, np);
  int64_t *bases = NULL;
  CHECK(text != NULL && agent_rdzv_parse_header(text, BIG, &g, &bases) == -1 && !bases);
  free(text);
  free(np);
}

int main(void) {
  tdist_store_server_options_t so = TDIST_STORE_SERVER_OPTIONS_INIT;
  so.host = "127.0.0.1";
  so.quiet = 1;
  CHECK(tdist_store_server_create(&so, &server) == TDIST_OK);
  port = tdist_store_server_port(server);
  unsigned seed = (unsigned)getpid();
  for (unsigned i = 0; i < 5; i++) test_fixed(seed + i);
  test_elastic();
  test_round_without_store_host();
  test_replaced_and_agreement();
  test_heartbeat();
  test_end_done_fresh();
  for (unsigned i = 0; i < 5; i++) test_spares(seed + i);
  test_spares_short();
  test_spares_wait(0);
  test_spares_wait(1);
  test_validators();
  test_hostile_records();
  test_failover(1);
  test_failover(0);
  test_closed_layout();
  test_header_codec(seed);
  test_store_lost(); /* last: it stops the server */
  printf("rdzv_test: ok (seed %u)\n", seed);
  return 0;
}
