/* The agent's PMIx server: the store thread, which does what libpmix asked of the other nodes
 * through the agents' store (fences, direct modex, publish/lookup/unpublish), and the thread that
 * serves the other nodes' direct-modex requests. Neither runs on libpmix's progress thread. */
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

/* ---- store access on the store thread and the dmodex thread ---- */

/* (Re)connects the client and its prefix store to the current job's store when the job changed.
 * Under no lock. */
static int job_store(agent_pmix_t *p, tdist_store_t **client, tdist_store_t **store,
                     uint64_t *have_gen, const char *prefix_suffix, char *err, size_t cap) {
  char host[256], prefix[600];
  int port;
  uint64_t gen;
  pthread_mutex_lock(&p->mu);
  gen = p->gen;
  snprintf(host, sizeof host, "%s", p->store_host);
  snprintf(prefix, sizeof prefix, "%s%s", prefix_suffix ? p->pub_prefix : p->prefix,
           prefix_suffix ? prefix_suffix : "");
  port = p->store_port;
  pthread_mutex_unlock(&p->mu);
  if (*store && *have_gen == gen) return 0;
  tdist_store_destroy(*store);
  tdist_store_destroy(*client);
  *store = *client = NULL;
  tdist_tcp_store_options_t o = TDIST_TCP_STORE_OPTIONS_INIT;
  o.host = host;
  o.port = port;
  o.connect_timeout_ms = 5000;
  o.timeout_ms = 30000;
  o.dialect = TDIST_STORE_DIALECT_V2;
  if (tdist_tcp_store_connect(&o, client) != TDIST_OK ||
      tdist_prefix_store_create(*client, prefix, store) != TDIST_OK) {
    snprintf(err, cap, "cannot reach the agents' store at %s:%d: %s", host, port,
             tdist_last_error());
    tdist_store_destroy(*client);
    *client = NULL;
    return -1;
  }
  *have_gen = gen;
  return 0;
}

/* Waits for every key, a slice at a time, while the job lives, up to timeout_ms. 0 ready,
 * -1 timed out, -2 the job ended, -3 store error (err). */
static int wait_keys(agent_pmix_t *p, tdist_store_t *s, uint64_t gen, const char *const *keys,
                     size_t n, int64_t timeout_ms, char *err, size_t cap) {
  int64_t until = agent_pmix__now_ms() + timeout_ms;
  for (;;) {
    if (!agent_pmix__job_live(p, gen)) return -2;
    int64_t left = until - agent_pmix__now_ms();
    if (left <= 0) return -1;
    tdist_status_t st = tdist_store_wait(s, keys, n, left < SLICE_MS ? left : SLICE_MS);
    if (st == TDIST_OK) return 0;
    if (st != TDIST_ERR_TIMEOUT) {
      snprintf(err, cap, "store wait failed: %s", tdist_last_error());
      return -3;
    }
  }
}

static void release_buf(void *cbdata) { free(cbdata); }

/* The store keys' and the log's name of a barrier op. */
static const char *op_what(op_kind_t k) {
  return k == OP_FENCE ? "fence" : k == OP_CONNECT ? "connect" : "disconnect";
}

/* Answers o with st (once: every callback is cleared). */
static void fail_op(op_t *o, pmix_status_t st) {
  if (o->modex_cb) o->modex_cb(st, NULL, 0, o->cbdata, NULL, NULL);
  if (o->lookup_cb) o->lookup_cb(st, NULL, 0, o->cbdata);
  if (o->op_cb) o->op_cb(st, o->cbdata);
  o->modex_cb = NULL;
  o->lookup_cb = NULL;
  o->op_cb = NULL;
}

/* A fence across nodes: our data under <what>/<sig>/<seq>/<node>, everyone's back, in node order
 * (what: "fence"; "connect"/"disconnect" for PMIx_Connect/Disconnect: a fence with no data and an
 * op_cb). */
static void do_fence(agent_pmix_t *p, op_t *o, tdist_store_t *s, const char *what, const char *sig,
                     uint64_t seq, int node_id, double timeout_s) {
  char err[600] = "", key[700];
  char **keys = calloc((size_t)o->nnodes, sizeof *keys);
  void **vals = calloc((size_t)o->nnodes, sizeof *vals);
  size_t *lens = calloc((size_t)o->nnodes, sizeof *lens);
  pmix_status_t st = PMIX_ERR_NOMEM;
  if (!keys || !vals || !lens) goto out;
  for (int i = 0; i < o->nnodes; i++)
    if (asprintf(&keys[i], "%s/%s/%" PRIu64 "/%d", what, sig, seq, o->nodes[i]) < 0) {
      keys[i] = NULL;
      goto out;
    }
  snprintf(key, sizeof key, "%s/%s/%" PRIu64 "/%d", what, sig, seq, node_id);
  st = PMIX_ERROR;
  if (tdist_store_set(s, key, o->data ? o->data : "", o->ndata) != TDIST_OK) {
    snprintf(err, sizeof err, "store set failed: %s", tdist_last_error());
    goto out;
  }
  int w = wait_keys(p, s, o->gen, (const char *const *)keys, (size_t)o->nnodes,
                    (int64_t)(timeout_s * 1000), err, sizeof err);
  if (w == -1) {
    /* Name the nodes that never came. */
    char missing[400] = "";
    size_t ml = 0;
    for (int i = 0; i < o->nnodes; i++) {
      int ready = 0;
      const char *k1[1] = {keys[i]};
      if (tdist_store_check(s, k1, 1, &ready) == TDIST_OK && !ready && ml < sizeof missing - 16)
        ml += (size_t)snprintf(missing + ml, sizeof missing - ml, "%s%d", ml ? ", " : "",
                               o->nodes[i]);
    }
    AGENT_ERROR("PMIx %s %" PRIu64
                " over node(s) %s: node(s) %s never arrived within %.0f s "
                "(--rdzv-timeout); the MPI ranks waiting in it fail (a rank that hangs before "
                "MPI_Init or MPI_Finalize on those nodes is the usual cause)",
                what, seq, sig, missing[0] ? missing : "?", timeout_s);
    st = PMIX_ERR_TIMEOUT;
    agent_pmix__mark_timed_out(p, o->gen);
    goto out;
  }
  if (w == -2) {
    st = PMIX_ERR_NOT_AVAILABLE;
    goto out;
  }
  if (w < 0) goto out;
  if (tdist_store_multi_get(s, (const char *const *)keys, (size_t)o->nnodes, vals, lens) !=
      TDIST_OK) {
    snprintf(err, sizeof err, "store multi_get failed: %s", tdist_last_error());
    goto out;
  }
  size_t total = 0;
  for (int i = 0; i < o->nnodes; i++) total += lens[i];
  char *all = malloc(total ? total : 1);
  if (!all) {
    st = PMIX_ERR_NOMEM;
    goto out;
  }
  size_t off = 0;
  for (int i = 0; i < o->nnodes; i++) {
    if (lens[i]) memcpy(all + off, vals[i], lens[i]);
    off += lens[i];
  }
  if (o->modex_cb) {
    o->modex_cb(PMIX_SUCCESS, all, total, o->cbdata, release_buf, all);
    o->modex_cb = NULL;
  } else {
    free(all);
  }
  st = PMIX_SUCCESS;
out:
  if (st != PMIX_SUCCESS && err[0])
    AGENT_ERROR("PMIx %s %" PRIu64 " over node(s) %s: %s", what, seq, sig, err);
  fail_op(o, st); /* PMIX_SUCCESS for a connect */
  for (int i = 0; keys && i < o->nnodes; i++) {
    free(keys[i]);
    if (vals && vals[i]) tdist_free(vals[i]);
  }
  free(keys);
  free(vals);
  free(lens);
}

/* Another node's rank's data: a request on that node's queue, the answer under dmodex/<k>
 * (first byte 0: the data follows; else an error). */
static void do_dmodex(agent_pmix_t *p, op_t *o, tdist_store_t *s, int owner, double timeout_s) {
  pmix_status_t st = PMIX_ERROR;
  char err[600] = "", qkey[64], rkey[64], req[64];
  int64_t k = 0, until = agent_pmix__now_ms() + (int64_t)(timeout_s * 1000);
  void *v = NULL;
  size_t n = 0;
  /* The owner answers "not found" when its libpmix does not have the data yet (its rank has not
   * started or committed): ask again until the deadline, as a direct modex waits for the data. */
  for (int tries = 0;; tries++) {
    if (tries) {
      struct timespec ts = {0, 50 * 1000000L};
      nanosleep(&ts, NULL);
    }
    tdist_free(v);
    v = NULL;
    if (tdist_store_add(s, "dmodex/n", 1, &k) != TDIST_OK) {
      snprintf(err, sizeof err, "store add failed: %s", tdist_last_error());
      goto out;
    }
    snprintf(qkey, sizeof qkey, "dmodex/q/%d", owner);
    snprintf(rkey, sizeof rkey, "dmodex/%" PRId64, k);
    snprintf(req, sizeof req, "%" PRId64 " %d", k, o->rank);
    if (tdist_store_queue_push(s, qkey, req, strlen(req)) != TDIST_OK) {
      snprintf(err, sizeof err, "store queue push failed: %s", tdist_last_error());
      goto out;
    }
    const char *keys[1] = {rkey};
    int64_t left = until - agent_pmix__now_ms();
    int w = left > 0 ? wait_keys(p, s, o->gen, keys, 1, left, err, sizeof err) : -1;
    if (w == -1) {
      snprintf(err, sizeof err, "node %d did not answer within %.0f s", owner, timeout_s);
      agent_pmix__mark_timed_out(p, o->gen);
    }
    if (w) {
      st = w == -1 ? PMIX_ERR_TIMEOUT : w == -2 ? PMIX_ERR_NOT_AVAILABLE : PMIX_ERROR;
      goto out;
    }
    if (tdist_store_get(s, rkey, &v, &n) != TDIST_OK || n < 1) {
      snprintf(err, sizeof err, "store get of %s failed: %s", rkey, tdist_last_error());
      goto out;
    }
    if (((unsigned char *)v)[0] == 0) break;
    if (agent_pmix__now_ms() >= until || !agent_pmix__job_live(p, o->gen)) {
      st = PMIX_ERR_NOT_FOUND;
      snprintf(err, sizeof err, "node %d never had it within %.0f s", owner, timeout_s);
      goto out;
    }
  }
  char *data = malloc(n > 1 ? n - 1 : 1);
  if (!data) {
    st = PMIX_ERR_NOMEM;
    goto out;
  }
  memcpy(data, (char *)v + 1, n - 1);
  AGENT_DEBUG("PMIx direct modex: rank %d's data from node %d (%zu bytes)", o->rank, owner, n - 1);
  o->modex_cb(PMIX_SUCCESS, data, n - 1, o->cbdata, release_buf, data);
  o->modex_cb = NULL;
  st = PMIX_SUCCESS;
out:
  if (st != PMIX_SUCCESS && err[0])
    AGENT_ERROR("PMIx direct modex for rank %d (node %d): %s", o->rank, owner, err);
  if (o->modex_cb) o->modex_cb(st, NULL, 0, o->cbdata, NULL, NULL);
  tdist_free(v);
}

/* publish: each packed pmix_info_t under publish/<key> (first publisher wins, as PMIx says a
 * duplicate key is an error). */
static pmix_status_t do_publish(op_t *o, tdist_store_t *s) {
  pmix_data_buffer_t buf;
  PMIX_DATA_BUFFER_CONSTRUCT(&buf);
  PMIX_DATA_BUFFER_LOAD(&buf, o->data, o->ndata);
  o->data = NULL; /* the buffer owns it now */
  pmix_status_t st = PMIX_SUCCESS;
  for (;;) {
    pmix_info_t info;
    int32_t cnt = 1;
    PMIX_INFO_CONSTRUCT(&info);
    pmix_status_t r = PMIx_Data_unpack(NULL, &buf, &info, &cnt, PMIX_INFO);
    if (r != PMIX_SUCCESS) break; /* end of the buffer */
    pmix_data_buffer_t one;
    PMIX_DATA_BUFFER_CONSTRUCT(&one);
    if (PMIx_Data_pack(NULL, &one, &info.value, 1, PMIX_VALUE) == PMIX_SUCCESS) {
      char key[PMIX_MAX_KEYLEN + 16];
      snprintf(key, sizeof key, "publish/%s", info.key);
      void *out = NULL;
      size_t outn = 0;
      if (tdist_store_compare_set(s, key, "", 0, one.base_ptr, one.bytes_used, &out, &outn) !=
          TDIST_OK)
        st = PMIX_ERROR;
      else if (outn != one.bytes_used || memcmp(out, one.base_ptr, outn))
        st = PMIX_ERR_DUPLICATE_KEY;
      tdist_free(out);
    }
    PMIX_DATA_BUFFER_DESTRUCT(&one);
    PMIX_INFO_DESTRUCT(&info);
  }
  PMIX_DATA_BUFFER_DESTRUCT(&buf);
  return st;
}

static void do_lookup(agent_pmix_t *p, op_t *o, tdist_store_t *s, double timeout_s) {
  size_t n = 0;
  while (o->keys[n]) n++;
  pmix_pdata_t *pd = NULL;
  PMIX_PDATA_CREATE(pd, n ? n : 1);
  size_t got = 0;
  pmix_status_t st = PMIX_ERR_NOT_FOUND;
  char err[600];
  for (size_t i = 0; pd && i < n; i++) {
    char key[PMIX_MAX_KEYLEN + 16];
    snprintf(key, sizeof key, "publish/%s", o->keys[i]);
    const char *k1[1] = {key};
    int ready = 0;
    if (o->wait) {
      ready = wait_keys(p, s, o->gen, k1, 1, (int64_t)(timeout_s * 1000), err, sizeof err) == 0;
    } else if (tdist_store_check(s, k1, 1, &ready) != TDIST_OK) {
      ready = 0;
    }
    void *v = NULL;
    size_t vn = 0;
    if (!ready || tdist_store_get(s, key, &v, &vn) != TDIST_OK) continue;
    pmix_data_buffer_t buf;
    PMIX_DATA_BUFFER_CONSTRUCT(&buf);
    char *copy = malloc(vn ? vn : 1);
    if (copy) {
      memcpy(copy, v, vn);
      PMIX_DATA_BUFFER_LOAD(&buf, copy, vn);
      int32_t cnt = 1;
      if (PMIx_Data_unpack(NULL, &buf, &pd[got].value, &cnt, PMIX_VALUE) == PMIX_SUCCESS) {
        snprintf(pd[got].key, sizeof pd[got].key, "%s", o->keys[i]);
        pthread_mutex_lock(&p->mu);
        PMIX_PROC_LOAD(&pd[got].proc, p->nspace, PMIX_RANK_WILDCARD);
        pthread_mutex_unlock(&p->mu);
        got++;
      }
      PMIX_DATA_BUFFER_DESTRUCT(&buf);
    }
    tdist_free(v);
  }
  if (got) st = PMIX_SUCCESS;
  o->lookup_cb(st, got ? pd : NULL, got, o->cbdata);
  if (pd) PMIX_PDATA_FREE(pd, n ? n : 1);
}

static void do_unpublish(op_t *o, tdist_store_t *s) {
  for (char **k = o->keys; k && *k; k++) {
    char key[PMIX_MAX_KEYLEN + 16];
    snprintf(key, sizeof key, "publish/%s", *k);
    tdist_store_delete_key(s, key, NULL);
  }
}

/* ---- the op queue's dispatcher ----
 * The store thread takes ops in order and never waits for another node or another rank: an op
 * that waits (a fence, a direct modex, a lookup with PMIX_WAIT) runs on a thread of its own, so a
 * publish queued behind a lookup waiting for that very key is done at once (MPI_Comm_accept and
 * MPI_Comm_connect inside one job publish and wait for each other's keys, several times). Store
 * connections are pooled per job and per prefix (the round's, the run's publish keys). */

struct conn {
  struct conn *next;
  tdist_store_t *client, *store;
  uint64_t gen;
  int pub; /* 1: the run's publish prefix; 0: the round's */
};

static void conn_destroy(conn_t *c) {
  if (!c) return;
  tdist_store_destroy(c->store);
  tdist_store_destroy(c->client);
  free(c);
}

/* An idle connection of the current job for that prefix, or a new one; NULL with err. */
static conn_t *conn_get(agent_pmix_t *p, int pub, char *err, size_t cap) {
  conn_t *found = NULL, *stale = NULL;
  pthread_mutex_lock(&p->mu);
  for (conn_t **pc = &p->idle; *pc;) {
    conn_t *c = *pc;
    if (c->gen != p->gen) { /* an ended job's: close it */
      *pc = c->next;
      c->next = stale;
      stale = c;
    } else if (!found && c->pub == pub) {
      *pc = c->next;
      found = c;
    } else {
      pc = &c->next;
    }
  }
  pthread_mutex_unlock(&p->mu);
  while (stale) {
    conn_t *n = stale->next;
    conn_destroy(stale);
    stale = n;
  }
  if (found) return found;
  conn_t *c = calloc(1, sizeof *c);
  if (!c) {
    snprintf(err, cap, "out of memory connecting to the agents' store");
    return NULL;
  }
  c->pub = pub;
  if (job_store(p, &c->client, &c->store, &c->gen, pub ? "" : NULL, err, cap)) {
    free(c);
    return NULL;
  }
  return c;
}

/* Back to the pool while its job lives (a connection whose call failed is closed instead: it
 * may be out of step). */
static void conn_put(agent_pmix_t *p, conn_t *c, int ok) {
  if (!c) return;
  pthread_mutex_lock(&p->mu);
  int keep = ok && !p->stop && c->gen == p->gen;
  if (keep) {
    c->next = p->idle;
    p->idle = c;
  }
  pthread_mutex_unlock(&p->mu);
  if (!keep) conn_destroy(c);
}

void agent_pmix__conns_close(agent_pmix_t *p) {
  pthread_mutex_lock(&p->mu);
  conn_t *c = p->idle;
  p->idle = NULL;
  pthread_mutex_unlock(&p->mu);
  while (c) {
    conn_t *n = c->next;
    conn_destroy(c);
    c = n;
  }
}

typedef struct {
  agent_pmix_t *p;
  op_t *o;
  char sig[256]; /* OP_FENCE, OP_CONNECT: the participating nodes, "0.1.2" */
  uint64_t seq;
  int owner, node_id, live;
  double timeout_s;
} task_t;

static int uses_round_prefix(op_kind_t k) {
  return k == OP_FENCE || k == OP_DMODEX || k == OP_CONNECT || k == OP_DISCONNECT;
}

/* Does t's op and answers libpmix. Frees t and its op. */
static void run_task(task_t *t) {
  agent_pmix_t *p = t->p;
  op_t *o = t->o;
  char err[600];
  conn_t *c = NULL;
  if (t->live && !(c = conn_get(p, !uses_round_prefix(o->kind), err, sizeof err)))
    AGENT_ERROR("PMIx: %s", err);
  if (!c) {
    fail_op(o, PMIX_ERR_NOT_AVAILABLE);
  } else {
    switch (o->kind) {
      case OP_FENCE:
        do_fence(p, o, c->store, "fence", t->sig, t->seq, t->node_id, t->timeout_s);
        break;
      case OP_CONNECT:
      case OP_DISCONNECT:
        do_fence(p, o, c->store, op_what(o->kind), t->sig, t->seq, t->node_id, t->timeout_s);
        break;
      case OP_DMODEX:
        if (t->owner >= 0)
          do_dmodex(p, o, c->store, t->owner, t->timeout_s);
        else
          fail_op(o, PMIX_ERR_BAD_PARAM);
        break;
      case OP_PUBLISH: {
        pmix_status_t st = do_publish(o, c->store);
        if (o->op_cb) o->op_cb(st, o->cbdata);
        break;
      }
      case OP_LOOKUP: do_lookup(p, o, c->store, t->timeout_s); break;
      case OP_UNPUBLISH:
        do_unpublish(o, c->store);
        if (o->op_cb) o->op_cb(PMIX_SUCCESS, o->cbdata);
        break;
    }
  }
  conn_put(p, c, 1);
  agent_pmix__op_free(o);
  free(t);
}

static void *task_thread(void *arg) {
  task_t *t = arg;
  agent_pmix_t *p = t->p;
  run_task(t);
  pthread_mutex_lock(&p->mu);
  p->nworkers--;
  pthread_cond_broadcast(&p->cv);
  pthread_mutex_unlock(&p->mu);
  return NULL;
}

#define MAX_WORKERS 1024

/* Runs t on a thread of its own; on the caller's thread (logged) when none can start. */
static void run_apart(task_t *t) {
  agent_pmix_t *p = t->p;
  pthread_mutex_lock(&p->mu);
  int n = p->nworkers < MAX_WORKERS ? ++p->nworkers : -1;
  pthread_mutex_unlock(&p->mu);
  pthread_t thr;
  pthread_attr_t a;
  int started = 0;
  if (n > 0 && !pthread_attr_init(&a)) {
    pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
    started = !pthread_create(&thr, &a, task_thread, t);
    pthread_attr_destroy(&a);
  }
  if (started) return;
  if (n > 0) {
    pthread_mutex_lock(&p->mu);
    p->nworkers--;
    pthread_mutex_unlock(&p->mu);
  }
  AGENT_WARN(
      "PMIx: cannot start a thread for a waiting operation (%d running): it runs on the "
      "store thread, which other requests then wait behind",
      n > 0 ? n : MAX_WORKERS);
  run_task(t);
}

/* The next sequence number of fences (or connects) over the nodes in sig. Under mu; -1 on out of
 * memory. */
static int64_t next_seq(agent_pmix_t *p, const char *kind, const char *sig) {
  char full[300];
  snprintf(full, sizeof full, "%s/%s", kind, sig);
  int j = 0;
  while (j < p->nseqs && strcmp(p->seqs[j].sig, full)) j++;
  if (j == p->nseqs) {
    fence_seq_t *ns = realloc(p->seqs, (size_t)(p->nseqs + 1) * sizeof *ns);
    if (ns) p->seqs = ns;
    char *dup = ns ? strdup(full) : NULL;
    if (!dup) return -1;
    ns[j].sig = dup;
    ns[j].n = 0;
    p->nseqs++;
  }
  return (int64_t)p->seqs[j].n++;
}

void *agent_pmix__store_thread(void *arg) {
  agent_pmix_t *p = arg;
  for (;;) {
    pthread_mutex_lock(&p->mu);
    while (!p->stop && !p->head) pthread_cond_wait(&p->cv, &p->mu);
    op_t *o = p->head;
    if (o) {
      p->head = o->next;
      if (!p->head) p->tail = NULL;
    }
    int stop = p->stop;
    task_t *t = o ? calloc(1, sizeof *t) : NULL;
    int live = t && p->have_job && o->gen == p->gen;
    /* A node that missed one fence misses the next: fail at once rather than wait again. */
    int dead = live && uses_round_prefix(o->kind) && p->timed_out_gen == o->gen;
    if (t) {
      t->p = p;
      t->o = o;
      t->node_id = p->node_id;
      t->timeout_s = p->timeout_s;
      t->owner = -1;
    }
    if (live && o->nodes) {
      size_t l = 0;
      for (int i = 0; i < o->nnodes && l < sizeof t->sig - 12; i++)
        l += (size_t)snprintf(t->sig + l, sizeof t->sig - l, "%s%d", i ? "." : "", o->nodes[i]);
      int64_t seq = next_seq(p, op_what(o->kind), t->sig);
      if (seq < 0) live = 0;
      t->seq = (uint64_t)(seq < 0 ? 0 : seq);
    }
    if (live && o->kind == OP_DMODEX) t->owner = agent_pmix__node_of(p, (pmix_rank_t)o->rank);
    pthread_mutex_unlock(&p->mu);
    if (!o) {
      if (stop) break;
      continue;
    }
    if (!t || dead) {
      fail_op(o, dead ? PMIX_ERR_TIMEOUT : PMIX_ERR_NOMEM);
      agent_pmix__op_free(o);
      free(t);
      continue;
    }
    t->live = live;
    int waits = live && (uses_round_prefix(o->kind) || (o->kind == OP_LOOKUP && o->wait));
    if (waits)
      run_apart(t);
    else
      run_task(t);
  }
  return NULL;
}

/* ---- serving the other nodes' direct-modex requests ---- */

static void dmx_answer(pmix_status_t st, char *data, size_t sz, void *cbdata) {
  agent_pmix_t *p = cbdata;
  pthread_mutex_lock(&p->mu);
  p->dmx_status = st;
  p->dmx_data = NULL;
  p->dmx_len = 0;
  if (st == PMIX_SUCCESS && (p->dmx_data = malloc(sz + 1)) != NULL) {
    p->dmx_data[0] = 0;
    if (sz) memcpy(p->dmx_data + 1, data, sz);
    p->dmx_len = sz + 1;
  }
  p->dmx_done = 1;
  pthread_cond_broadcast(&p->cv);
  pthread_mutex_unlock(&p->mu);
}

void *agent_pmix__dmx_thread(void *arg) {
  agent_pmix_t *p = arg;
  for (;;) {
    pthread_mutex_lock(&p->mu);
    while (!p->stop && !p->have_job) pthread_cond_wait(&p->cv, &p->mu);
    int stop = p->stop;
    int node_id = p->node_id;
    uint64_t gen = p->gen;
    char nspace[PMIX_MAX_NSLEN + 1];
    snprintf(nspace, sizeof nspace, "%s", p->nspace);
    pthread_mutex_unlock(&p->mu);
    if (stop) break;
    char err[600], qkey[64];
    if (job_store(p, &p->dclient, &p->dstore, &p->dstore_gen, NULL, err, sizeof err)) {
      AGENT_WARN("PMIx direct modex service: %s", err);
      struct timespec ts = {0, SLICE_MS * 1000000L};
      nanosleep(&ts, NULL);
      continue;
    }
    snprintf(qkey, sizeof qkey, "dmodex/q/%d", node_id);
    void *v = NULL;
    size_t n = 0;
    tdist_status_t st = tdist_store_queue_pop(p->dstore, qkey, SLICE_MS, &v, &n);
    if (st != TDIST_OK) {
      if (st != TDIST_ERR_TIMEOUT && st != TDIST_ERR_NOT_FOUND && agent_pmix__job_live(p, gen)) {
        AGENT_WARN("PMIx direct modex service: store queue pop: %s", tdist_last_error());
        struct timespec ts = {0, SLICE_MS * 1000000L};
        nanosleep(&ts, NULL);
      }
      continue;
    }
    char req[64];
    size_t l = n < sizeof req - 1 ? n : sizeof req - 1;
    memcpy(req, v, l);
    req[l] = 0;
    tdist_free(v);
    int64_t k;
    int rank;
    if (sscanf(req, "%" SCNd64 " %d", &k, &rank) != 2 || rank < 0) {
      AGENT_WARN("PMIx direct modex service: ignored a request '%s' (not 'K RANK')", req);
      continue;
    }
    pmix_proc_t proc;
    PMIX_PROC_LOAD(&proc, nspace, (pmix_rank_t)rank);
    pthread_mutex_lock(&p->mu);
    p->dmx_done = 0;
    pthread_mutex_unlock(&p->mu);
    char nf = 1;
    const char *ans = &nf;
    size_t alen = 1;
    pmix_status_t rs = PMIx_server_dmodex_request(&proc, dmx_answer, p);
    if (rs == PMIX_SUCCESS) {
      pthread_mutex_lock(&p->mu);
      while (!p->dmx_done && !p->stop) pthread_cond_wait(&p->cv, &p->mu);
      rs = p->dmx_done ? p->dmx_status : PMIX_ERR_NOT_AVAILABLE;
      if (p->dmx_done && p->dmx_data) {
        ans = p->dmx_data;
        alen = p->dmx_len;
      }
      pthread_mutex_unlock(&p->mu);
    }
    if (rs != PMIX_SUCCESS) /* the asker asks again while its deadline allows */
      AGENT_DEBUG("PMIx direct modex: rank %d's data (request %" PRId64 "): %s", rank, k,
                  PMIx_Error_string(rs));
    char rkey[64];
    snprintf(rkey, sizeof rkey, "dmodex/%" PRId64, k);
    tdist_store_set(p->dstore, rkey, ans, alen);
    pthread_mutex_lock(&p->mu);
    free(p->dmx_data);
    p->dmx_data = NULL;
    pthread_mutex_unlock(&p->mu);
  }
  return NULL;
}
