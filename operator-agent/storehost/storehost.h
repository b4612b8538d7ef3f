/* The agents' store as tdist-agent reaches and hosts it: which pod hosts it (pod 0, or with
 * --spares the backup host, pod nnodes_max, once pod 0 is lost), this agent's own store servers
 * when it is the host, the client connection every agent holds, the probe a waiting host makes
 * of the other host, and the failover between the two. Also the per-round workers' store: the
 * store host starts a fresh, empty one for every round it joins (attempt isolation, rdzv.h).
 *
 * Where a worker's MASTER_PORT comes from, hop by hop: agent_storehost_worker_store_open() starts
 * the workers' store on port 0 on the store host and returns the port the kernel chose; the
 * driver (operator-agent/agent/driver.c) puts it in agent_rdzv_t.worker_port, which
 * agent_rdzv_join() writes into the host's rendezvous record (<r>/node/<idx>, last field); every
 * member reads it back from the host's record when the round closes, into the rendezvous result
 * agent_rdzv_t.worker_store.port (rdzv.h); the round runner (operator-agent/agent/round.c) passes
 * it to the workers as MASTER_PORT (agent_worker_spec_t.master_port), and MASTER_ADDR is the
 * store host's address (agent_storehost_t.master_ip). The agents' own store (--master-port) is
 * a different one and stays for the whole job.
 *
 * Runs on the agent's loop thread only; the servers it starts run their own loop thread each
 * (libtdist's store server). Waits (DNS, connect retries) go through the caller's wait callback,
 * so signals and child exits stay handled and a terminating signal ends them. */
#ifndef TDIST_AGENT_STOREHOST_H
#define TDIST_AGENT_STOREHOST_H

#include <stdint.h>

#include <tdist/store.h>

#include "operator-agent/config/config.h"
#include "operator-agent/rendezvous/rdzv.h"
#include "operator-agent/state/state.h"

/* What the functions below return. */
typedef enum {
  AGENT_STOREHOST_OK = 0,
  AGENT_STOREHOST_FAILED = 1,    /* cannot host, or cannot reach the store by the deadline
                                  * (logged, and put in the state's last_error) */
  AGENT_STOREHOST_STOPPED = 2,   /* a terminating signal came while waiting */
  AGENT_STOREHOST_TRY_OTHER = 3, /* connect: this host's window passed; try the other host */
  AGENT_STOREHOST_NO_ROUND = 4   /* probe/read: no answer, or no round of this job there */
} agent_storehost_result_t;

/* The current round of a store: its number, how many agents joined it, whether it closed. */
typedef struct {
  int64_t round, joined;
  int closed;
} agent_storehost_round_t;

typedef struct {
  /* Set by the caller before use. */
  const agent_cfg_t *cfg;
  agent_state_t *st; /* store_server, master_addr/port, counters: written under its lock */
  int node_rank;
  int (*wait)(void *ctx, int timeout_ms); /* the agent's loop: waits up to timeout_ms for
                                           * events; nonzero once a terminating signal came */
  void *wait_ctx;
  char master_name[256]; /* what we resolve (DNS name or address); node 0: unused */
  int master_port;       /* --master-port, then the port the host's server got */

  tdist_store_server_t *server;        /* the store host: the agents' store (--master-port) */
  tdist_store_server_t *worker_server; /* the store host: the workers' store of its last round */
  tdist_store_t *client, *store;       /* TCP client and its "tdist/<run_id>" prefix view */
  char master_ip[64];                  /* the store host as workers reach it */
  /* Store failover (with --spares): the store is hosted by pod 0 (host 0) or, once pod 0 is
   * lost, by the backup host, pod nnodes_max (host 1, the first spare's pod). See
   * agent_storehost_setup. nhosts 1: pod 0 only. */
  int nhosts;
  int host_rank[2];       /* node ranks of the hosts */
  char host_name[2][256]; /* their DNS names */
  int host_idx;           /* the host whose store is in use (or being reached) */
  int hosting;            /* this agent hosts the store in use: server runs */
  int moved_from;         /* node rank of the store host lost since the last connect, or -1 */
  int64_t switches;       /* how often agent_storehost_switch moved to the other host */
} agent_storehost_t;

/* Decides the store hosts once master_name is set: with --spares, pod nnodes_max (the first
 * spare's pod) hosts the store if pod 0 is lost, so that the job goes on at once on a standby
 * instead of waiting for pod 0's replacement; that replacement then joins on the backup host as a
 * standby. Needs the pods' names (not --master-addr, not the kubeflow scheme, whose worker pods
 * are named otherwise) and a fixed --master-port. Logs which. */
void agent_storehost_setup(agent_storehost_t *h);

/* This agent starts hosting the store: its server on --master-port (kept if running). OK or
 * FAILED. */
agent_storehost_result_t agent_storehost_host_start(agent_storehost_t *h);

/* This agent stops hosting: its servers go, and with them every connection to them. */
void agent_storehost_host_stop(agent_storehost_t *h);

/* Connects to the store, alternating between the hosts (one window each) until deadline_ns
 * (CLOCK_MONOTONIC): this agent's own server over loopback when it is that host (starting it),
 * else the host by name with retries. On OK sets rd->store (the prefix view), rd->host_rank and
 * rd->addr (how the others reach this agent). OK, FAILED (timed out: logged) or STOPPED. */
agent_storehost_result_t agent_storehost_reach(agent_storehost_t *h, agent_rdzv_t *rd,
                                               int64_t deadline_ns);

/* Drops the connection (and rd->store); the servers, if any, stay. */
void agent_storehost_drop(agent_storehost_t *h, agent_rdzv_t *rd);

/* With a backup host, the agents move to the other host's store: when theirs was lost (lost:
 * the lost host is carried over as gone) or the other did not answer within its window. */
void agent_storehost_switch(agent_storehost_t *h, int lost);

/* Host idx's store, asked with short timeouts, or (idx -1) the store in use: OK with its current
 * round in *out, or NO_ROUND (unreachable: that pod does not host; or no round of this job). */
agent_storehost_result_t agent_storehost_probe(agent_storehost_t *h, int idx,
                                               agent_storehost_round_t *out);

/* The store host, before each round it joins: starts a fresh, empty workers' store on a port the
 * kernel picks (*port). OK, or FAILED (logged). The previous round's store stays until
 * agent_storehost_worker_store_commit: nobody was told of the new one yet. */
agent_storehost_result_t agent_storehost_worker_store_open(agent_storehost_t *h,
                                                           tdist_store_server_t **fresh, int *port);
/* The round was joined with fresh's port in the host's record: fresh becomes the workers' store
 * and the previous one goes (that round's workers here are stopped by now, and those left on
 * other nodes only lose a store they are about to be stopped for). */
void agent_storehost_worker_store_commit(agent_storehost_t *h, tdist_store_server_t *fresh);
/* The join failed: fresh goes; returns the port of the workers' store still in use (0: none). */
int agent_storehost_worker_store_abandon(agent_storehost_t *h, tdist_store_server_t *fresh);

/* At exit: both servers go (after the HTTP thread stopped reading them). */
void agent_storehost_destroy(agent_storehost_t *h);

#endif
