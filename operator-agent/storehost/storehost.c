/* See storehost.h. Hosting the agents' store, reaching it, probing the other host and failing
 * over; the per-round workers' store. Never waits but through h->wait. */
#define _GNU_SOURCE
#include "operator-agent/storehost/storehost.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <tdist/status.h>

#include "operator-agent/common/log.h"
#include "operator-agent/discovery/discovery.h"

#define STORE_OP_TIMEOUT_MS 5000 /* below /healthz's 10 s staleness limit */

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* Copies src into dst (cap bytes), truncating; always NUL-terminated. */
static void copy_str(char *dst, size_t cap, const char *src) {
  size_t n = strlen(src);
  if (n >= cap) n = cap - 1;
  memcpy(dst, src, n);
  dst[n] = 0;
}

static void set_error(agent_storehost_t *h, const char *msg) { agent_state_set_error(h->st, msg); }

static int cancel_cb(void *arg) {
  agent_storehost_t *h = arg;
  return h->wait(h->wait_ctx, 0);
}

/* The store op timeout: a store silent for the heartbeat timeout is as lost as a silent member
 * (so a lost store host is noticed as fast), never more than STORE_OP_TIMEOUT_MS. */
static int store_op_timeout_ms(const agent_storehost_t *h) {
  double ms = h->cfg->heartbeat_timeout_s * 1000;
  if (ms < 1000) ms = 1000;
  return ms < STORE_OP_TIMEOUT_MS ? (int)ms : STORE_OP_TIMEOUT_MS;
}

void agent_storehost_setup(agent_storehost_t *h) {
  const agent_cfg_t *c = h->cfg;
  char err[512];
  h->nhosts = 1;
  h->host_idx = 0;
  h->host_rank[0] = 0;
  copy_str(h->host_name[0], sizeof h->host_name[0], h->master_name);
  if (c->spares < 1 || c->standalone) return;
  const char *why = NULL;
  if (c->master_addr)
    why = "--master-addr names the store host";
  else if (c->master_port == 0)
    why = "--master-port 0 (a port chosen at start) cannot be found on another pod";
  else if (!(c->master_template && c->master_template[0]) && c->scheme == AGENT_SCHEME_KUBEFLOW)
    why = "the kubeflow scheme's worker pods are not named like pod 0";
  else if (agent_master_name(c, environ, NULL, NULL, h->host_name[0], sizeof h->host_name[0], err,
                             sizeof err) ||
           agent_pod_name(h->host_name[0], c->nnodes_max, h->host_name[1], sizeof h->host_name[1],
                          err, sizeof err))
    why = err;
  if (why) {
    AGENT_INFO("store failover off (%s): if pod 0 is lost the job waits for its replacement", why);
    copy_str(h->host_name[0], sizeof h->host_name[0], h->master_name); /* as check_start named it */
    return;
  }
  h->nhosts = 2;
  h->host_rank[1] = c->nnodes_max;
  AGENT_INFO("store failover: if pod 0 (%s) is lost, pod %d (%s) hosts the store", h->host_name[0],
             h->host_rank[1], h->host_name[1]);
}

agent_storehost_result_t agent_storehost_host_start(agent_storehost_t *h) {
  if (!h->server) {
    tdist_store_server_options_t so = TDIST_STORE_SERVER_OPTIONS_INIT;
    so.host = h->cfg->standalone ? "127.0.0.1" : NULL;
    so.port = h->cfg->master_port;
    if (tdist_store_server_create(&so, &h->server) != TDIST_OK) {
      char msg[400];
      snprintf(msg, sizeof msg,
               "cannot start the store on port %d: %s (choose another --master-port)",
               h->cfg->master_port, tdist_last_error());
      AGENT_ERROR("%s", msg);
      set_error(h, msg);
      return AGENT_STOREHOST_FAILED;
    }
    h->master_port = tdist_store_server_port(h->server);
    AGENT_INFO("store listening on %s:%d", h->cfg->standalone ? "127.0.0.1" : "[::]",
               h->master_port);
  }
  h->hosting = 1;
  agent_state_lock(h->st);
  h->st->store_server = h->server;
  h->st->is_store_host = 1;
  agent_state_unlock(h->st);
  return AGENT_STOREHOST_OK;
}

void agent_storehost_host_stop(agent_storehost_t *h) {
  agent_state_lock(h->st);
  h->st->store_server = h->st->worker_store_server = NULL;
  h->st->is_store_host = 0;
  agent_state_unlock(h->st);
  tdist_store_server_destroy(h->worker_server);
  tdist_store_server_destroy(h->server);
  h->worker_server = h->server = NULL;
  h->hosting = 0;
  h->master_port = h->cfg->master_port;
}

void agent_storehost_destroy(agent_storehost_t *h) {
  agent_state_lock(h->st);
  h->st->store_server = h->st->worker_store_server = NULL;
  agent_state_unlock(h->st);
  tdist_store_server_destroy(h->worker_server);
  tdist_store_server_destroy(h->server);
  h->worker_server = h->server = NULL;
}

void agent_storehost_drop(agent_storehost_t *h, agent_rdzv_t *rd) {
  tdist_store_destroy(h->store);
  tdist_store_destroy(h->client);
  h->store = h->client = NULL;
  rd->store = NULL;
}

/* Reads the round from a store prefixed "tdist/<run_id>/" (prefix "" for h->store, whose view
 * has it already). */
static agent_storehost_result_t read_round(tdist_store_t *c, const char *prefix,
                                           agent_storehost_round_t *out) {
  char key[400], num[32];
  void *v = NULL;
  size_t len = 0;
  int ready = 0;
  const char *keys[1] = {key};
  snprintf(key, sizeof key, "%sround", prefix);
  if (tdist_store_check(c, keys, 1, &ready) != TDIST_OK || !ready ||
      tdist_store_get(c, key, &v, &len) != TDIST_OK)
    return AGENT_STOREHOST_NO_ROUND;
  int bad = len >= sizeof num;
  if (!bad) {
    memcpy(num, v, len);
    num[len] = 0;
    bad = agent_rdzv_parse_int(num, 0, AGENT_RDZV_MAX_ROUND, &out->round) != 0;
  }
  tdist_free(v);
  if (bad) return AGENT_STOREHOST_NO_ROUND;
  snprintf(key, sizeof key, "%s%" PRId64 "/joined", prefix, out->round);
  if (tdist_store_add(c, key, 0, &out->joined) != TDIST_OK) return AGENT_STOREHOST_NO_ROUND;
  snprintf(key, sizeof key, "%s%" PRId64 "/closed", prefix, out->round);
  if (tdist_store_check(c, keys, 1, &ready) != TDIST_OK) return AGENT_STOREHOST_NO_ROUND;
  out->closed = ready;
  return AGENT_STOREHOST_OK;
}

agent_storehost_result_t agent_storehost_probe(agent_storehost_t *h, int idx,
                                               agent_storehost_round_t *out) {
  if (idx < 0) return read_round(h->store, "", out);
  tdist_tcp_store_options_t o = TDIST_TCP_STORE_OPTIONS_INIT;
  o.host = h->host_name[idx]; /* resolved by the client, once, without the retries and logs */
  o.port = h->cfg->master_port;
  o.connect_timeout_ms = 200; /* a pod that does not host refuses at once */
  o.timeout_ms = 1000;
  o.dialect = TDIST_STORE_DIALECT_V2;
  tdist_store_t *c = NULL;
  if (tdist_tcp_store_connect(&o, &c) != TDIST_OK) return AGENT_STOREHOST_NO_ROUND;
  char prefix[300];
  snprintf(prefix, sizeof prefix, "tdist/%s/", h->cfg->run_id);
  agent_storehost_result_t r = read_round(c, prefix, out);
  tdist_store_destroy(c);
  return r;
}

/* Resolves host h->host_idx by name with retries until `until`, into h->master_ip. */
static agent_storehost_result_t resolve_host(agent_storehost_t *h, int64_t until,
                                             int64_t deadline_ns) {
  char err[512];
  agent_resolve_stats_t rs = {0, 0};
  int r = agent_resolve(h->host_name[h->host_idx], h->master_port, 1, until / 1000000, cancel_cb, h,
                        h->master_ip, sizeof h->master_ip, &rs, err, sizeof err);
  agent_state_lock(h->st);
  h->st->dns_resolve_failures_total += rs.failures;
  agent_state_unlock(h->st);
  if (r == -2) return AGENT_STOREHOST_STOPPED;
  if (r && until < deadline_ns) return AGENT_STOREHOST_TRY_OTHER;
  if (r) {
    AGENT_ERROR("cannot reach the store host: %s", err);
    set_error(h, err);
    return AGENT_STOREHOST_FAILED;
  }
  return AGENT_STOREHOST_OK;
}

/* The prefix view on a connected client, and the addresses the others and the workers use. */
static agent_storehost_result_t connected(agent_storehost_t *h, agent_rdzv_t *rd) {
  char prefix[300];
  snprintf(prefix, sizeof prefix, "tdist/%s", h->cfg->run_id);
  if (tdist_prefix_store_create(h->client, prefix, &h->store) != TDIST_OK) {
    agent_storehost_drop(h, rd);
    return AGENT_STOREHOST_FAILED;
  }
  rd->store = h->store;
  if (!h->hosting) {
    agent_local_ip(h->master_ip, rd->addr, sizeof rd->addr);
  } else {
    /* The host's workers reach the store the way the user named it (torchrun passes
     * --master-addr through), else by this pod's address: never by loopback in a multi-node
     * job, since a backend may advertise the address it used to reach the store. */
    if (h->cfg->standalone)
      snprintf(rd->addr, sizeof rd->addr, "127.0.0.1");
    else
      agent_local_ip(NULL, rd->addr, sizeof rd->addr);
    copy_str(h->master_ip, sizeof h->master_ip,
             h->cfg->master_addr ? h->cfg->master_addr : rd->addr);
  }
  agent_state_lock(h->st);
  snprintf(h->st->master_addr, sizeof h->st->master_addr, "%s", h->master_ip);
  h->st->master_port = h->master_port;
  agent_state_unlock(h->st);
  return AGENT_STOREHOST_OK;
}

/* Reaches the store of host h->host_idx: this agent's own server over loopback when it is that
 * host (starting it), else the host by name with retries until the deadline, or, with a second
 * host to try, until this one's window has passed. OK, FAILED (timed out, logged), STOPPED, or
 * TRY_OTHER (the window passed). */
static agent_storehost_result_t connect_store(agent_storehost_t *h, agent_rdzv_t *rd,
                                              int64_t deadline_ns) {
  char err[512];
  const char *host;
  int idx = h->host_idx;
  int64_t until = deadline_ns, window = 0;
  rd->host_rank = h->host_rank[idx];
  if (h->host_rank[idx] == h->node_rank) {
    if (agent_storehost_host_start(h) != AGENT_STOREHOST_OK) return AGENT_STOREHOST_FAILED;
    host = "127.0.0.1";
  } else {
    if (h->hosting) agent_storehost_host_stop(h);
    if (h->nhosts == 2) {
      /* Long enough for the other host to notice the loss (a store op times out) and start. */
      window = (int64_t)(2 * h->cfg->heartbeat_timeout_s * 1e9);
      if (window < 5000000000LL) window = 5000000000LL;
      if (now_ns() + window < until) until = now_ns() + window;
    }
    agent_storehost_result_t r = resolve_host(h, until, deadline_ns);
    if (r != AGENT_STOREHOST_OK) return r;
    host = h->master_ip;
  }
  for (;;) {
    tdist_tcp_store_options_t o = TDIST_TCP_STORE_OPTIONS_INIT;
    o.host = host;
    o.port = h->master_port;
    o.connect_timeout_ms = 2000;
    o.timeout_ms = store_op_timeout_ms(h);
    o.dialect = TDIST_STORE_DIALECT_V2;
    tdist_status_t st = tdist_tcp_store_connect(&o, &h->client);
    if (st == TDIST_OK) break;
    if (now_ns() >= until) {
      if (until < deadline_ns) return AGENT_STOREHOST_TRY_OTHER;
      snprintf(err, sizeof err, "cannot connect to the store at %s:%d: %s", host, h->master_port,
               tdist_last_error());
      AGENT_ERROR("%s", err);
      set_error(h, err);
      return AGENT_STOREHOST_FAILED;
    }
    /* a refused connect returns at once: do not spin */
    if (h->wait(h->wait_ctx, 100)) return AGENT_STOREHOST_STOPPED;
  }
  return connected(h, rd);
}

void agent_storehost_switch(agent_storehost_t *h, int lost) {
  if (h->nhosts < 2) return;
  int from = h->host_idx;
  h->host_idx ^= 1;
  h->switches++;
  if (lost) h->moved_from = h->host_rank[from];
  AGENT_WARN("store host pod %d (%s) %s: moving to the store of pod %d (%s)%s", h->host_rank[from],
             h->host_name[from], lost ? "was lost" : "is not reachable", h->host_rank[h->host_idx],
             h->host_name[h->host_idx],
             h->host_rank[h->host_idx] == h->node_rank ? ", which this agent hosts" : "");
}

agent_storehost_result_t agent_storehost_reach(agent_storehost_t *h, agent_rdzv_t *rd,
                                               int64_t deadline_ns) {
  for (;;) {
    agent_storehost_result_t r = connect_store(h, rd, deadline_ns);
    if (r != AGENT_STOREHOST_TRY_OTHER) return r;
    agent_storehost_switch(h, 0);
  }
}

agent_storehost_result_t agent_storehost_worker_store_open(agent_storehost_t *h,
                                                           tdist_store_server_t **fresh,
                                                           int *port) {
  tdist_store_server_options_t so = TDIST_STORE_SERVER_OPTIONS_INIT;
  so.host = h->cfg->standalone ? "127.0.0.1" : NULL;
  so.port = 0;
  if (tdist_store_server_create(&so, fresh) != TDIST_OK) {
    char msg[400];
    snprintf(msg, sizeof msg, "cannot start the workers' store for the next round: %s",
             tdist_last_error());
    AGENT_ERROR("%s", msg);
    set_error(h, msg);
    return AGENT_STOREHOST_FAILED;
  }
  *port = tdist_store_server_port(*fresh);
  return AGENT_STOREHOST_OK;
}

void agent_storehost_worker_store_commit(agent_storehost_t *h, tdist_store_server_t *fresh) {
  tdist_store_server_t *old = h->worker_server;
  agent_state_lock(h->st);
  h->st->worker_store_server = fresh;
  agent_state_unlock(h->st);
  h->worker_server = fresh;
  tdist_store_server_destroy(old);
}

int agent_storehost_worker_store_abandon(agent_storehost_t *h, tdist_store_server_t *fresh) {
  tdist_store_server_destroy(fresh); /* the old one stays: nobody was told of the new one */
  return h->worker_server ? tdist_store_server_port(h->worker_server) : 0;
}
