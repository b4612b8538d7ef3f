/* The PMIx server of tdist-agent (see pmix.h). libpmix calls the module functions below on its
 * progress thread, which must never block: they queue an op for the store thread (or answer at
 * once) and return. */
#define _GNU_SOURCE
#include "operator-agent/pmix/pmix.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* pmix.h first: pmix_server.h uses its types. */
#include <pmix.h>
#include <pmix_server.h>

#include "operator-agent/common/log.h"
#include "tdist/store.h"

#define SLICE_MS 250 /* blocking store calls wait this long at a time, to notice a job's end */

typedef enum { OP_FENCE, OP_DMODEX, OP_PUBLISH, OP_LOOKUP, OP_UNPUBLISH } op_kind_t;

typedef struct op {
  struct op *next;
  op_kind_t kind;
  uint64_t gen; /* the job it belongs to: ops of an ended job fail at once */
  int *nodes;   /* OP_FENCE: the participating nodes, ascending */
  int nnodes;
  char *data; /* OP_FENCE: this node's contribution; OP_PUBLISH: packed infos */
  size_t ndata;
  int rank;    /* OP_DMODEX: whose data */
  char **keys; /* OP_LOOKUP / OP_UNPUBLISH (NULL-terminated copy) */
  int wait;    /* OP_LOOKUP: PMIX_WAIT given */
  pmix_modex_cbfunc_t modex_cb;
  pmix_op_cbfunc_t op_cb;
  pmix_lookup_cbfunc_t lookup_cb;
  void *cbdata;
} op_t;

typedef struct {
  char *sig; /* the participating nodes, "0.1.2" */
  uint64_t n;
} fence_seq_t;

struct agent_pmix {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int stop;
  pthread_t thr, dmx_thr;
  int threads;
  op_t *head, *tail;
  /* the current job (under mu) */
  uint64_t gen;
  uint64_t timed_out_gen; /* a fence or modex of this job timed out: the rest fail at once */
  int have_job;
  char nspace[PMIX_MAX_NSLEN + 1];
  int world_size, nnodes, node_id;
  int *node_first; /* first global rank of each node, nnodes + 1 entries */
  char store_host[256], prefix[512], pub_prefix[512];
  int store_port;
  double timeout_s;
  fence_seq_t *seqs;
  int nseqs;
  int aborted, abort_rank, abort_status;
  char abort_msg[512];
  /* the store thread's and the direct-modex thread's connections, and the job they are for */
  tdist_store_t *client, *store, *dclient, *dstore;
  uint64_t store_gen, dstore_gen;
  /* a direct-modex answer from libpmix (dmx thread waits for it) */
  int dmx_done;
  pmix_status_t dmx_status;
  char *dmx_data;
  size_t dmx_len;
};

static agent_pmix_t *g_p; /* libpmix's module functions carry no context */

int agent_pmix_available(void) { return 1; }

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ---- waiting for libpmix's own callbacks ----
 * Bounded: libpmix 4.2 can leave a callback unanswered (seen at finalize after a failed direct
 * modex), and the agent must still stop. The object lives until both sides let go of it. */

#define SYNC_MS 10000

typedef struct {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int done, refs;
  pmix_status_t st;
} sync_t;

static sync_t *sync_new(void) {
  sync_t *s = calloc(1, sizeof *s);
  if (!s) return NULL;
  pthread_mutex_init(&s->mu, NULL);
  pthread_cond_init(&s->cv, NULL);
  s->refs = 2; /* the waiter and the callback */
  return s;
}

static void sync_unref(sync_t *s) {
  pthread_mutex_lock(&s->mu);
  int left = --s->refs;
  pthread_mutex_unlock(&s->mu);
  if (left) return;
  pthread_mutex_destroy(&s->mu);
  pthread_cond_destroy(&s->cv);
  free(s);
}

static void sync_cb(pmix_status_t st, void *cbdata) {
  sync_t *s = cbdata;
  pthread_mutex_lock(&s->mu);
  s->st = st;
  s->done = 1;
  pthread_cond_signal(&s->cv);
  pthread_mutex_unlock(&s->mu);
  sync_unref(s);
}

/* call_st: what the libpmix call returned; PMIX_SUCCESS means the callback will come. */
static pmix_status_t sync_wait(sync_t *s, pmix_status_t call_st) {
  if (call_st != PMIX_SUCCESS) { /* no callback: done (OPERATION_SUCCEEDED) or failed */
    sync_unref(s);
    sync_unref(s);
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
  sync_unref(s);
  return st;
}

/* ---- the op queue ---- */

static void op_free(op_t *o) {
  if (!o) return;
  free(o->nodes);
  free(o->data);
  if (o->keys)
    for (char **k = o->keys; *k; k++) free(*k);
  free(o->keys);
  free(o);
}

/* Queues o for the store thread (under no lock). PMIX_SUCCESS, or an error with o freed. */
static pmix_status_t enqueue(agent_pmix_t *p, op_t *o) {
  pthread_mutex_lock(&p->mu);
  if (p->stop || !p->have_job) {
    pthread_mutex_unlock(&p->mu);
    op_free(o);
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
static int node_of(const agent_pmix_t *p, pmix_rank_t r) {
  for (int n = 0; n < p->nnodes; n++)
    if ((int64_t)r >= p->node_first[n] && (int64_t)r < p->node_first[n + 1]) return n;
  return -1;
}

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

static int job_live(agent_pmix_t *p, uint64_t gen) {
  pthread_mutex_lock(&p->mu);
  int live = !p->stop && p->have_job && p->gen == gen;
  pthread_mutex_unlock(&p->mu);
  return live;
}

/* Waits for every key, a slice at a time, while the job lives, up to timeout_ms. 0 ready,
 * -1 timed out, -2 the job ended, -3 store error (err). */
static int wait_keys(agent_pmix_t *p, tdist_store_t *s, uint64_t gen, const char *const *keys,
                     size_t n, int64_t timeout_ms, char *err, size_t cap) {
  int64_t until = now_ms() + timeout_ms;
  for (;;) {
    if (!job_live(p, gen)) return -2;
    int64_t left = until - now_ms();
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

static void mark_timed_out(agent_pmix_t *p, uint64_t gen) {
  pthread_mutex_lock(&p->mu);
  p->timed_out_gen = gen;
  pthread_mutex_unlock(&p->mu);
}

/* A fence across nodes: our data under fence/<sig>/<seq>/<node>, everyone's back, in node order. */
static void do_fence(agent_pmix_t *p, op_t *o, tdist_store_t *s, const char *sig, uint64_t seq,
                     int node_id, double timeout_s) {
  char err[600] = "", key[700];
  char **keys = calloc((size_t)o->nnodes, sizeof *keys);
  void **vals = calloc((size_t)o->nnodes, sizeof *vals);
  size_t *lens = calloc((size_t)o->nnodes, sizeof *lens);
  pmix_status_t st = PMIX_ERR_NOMEM;
  if (!keys || !vals || !lens) goto out;
  for (int i = 0; i < o->nnodes; i++)
    if (asprintf(&keys[i], "fence/%s/%" PRIu64 "/%d", sig, seq, o->nodes[i]) < 0) {
      keys[i] = NULL;
      goto out;
    }
  snprintf(key, sizeof key, "fence/%s/%" PRIu64 "/%d", sig, seq, node_id);
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
    AGENT_ERROR("PMIx fence %" PRIu64
                " over node(s) %s: node(s) %s never arrived within %.0f s "
                "(--rdzv-timeout); the MPI ranks waiting in it fail (a rank that hangs before "
                "MPI_Init or MPI_Finalize on those nodes is the usual cause)",
                seq, sig, missing[0] ? missing : "?", timeout_s);
    st = PMIX_ERR_TIMEOUT;
    mark_timed_out(p, o->gen);
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
  o->modex_cb(PMIX_SUCCESS, all, total, o->cbdata, release_buf, all);
  o->modex_cb = NULL;
  st = PMIX_SUCCESS;
out:
  if (st != PMIX_SUCCESS && err[0])
    AGENT_ERROR("PMIx fence %" PRIu64 " over node(s) %s: %s", seq, sig, err);
  if (o->modex_cb) o->modex_cb(st, NULL, 0, o->cbdata, NULL, NULL);
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
  int64_t k = 0, until = now_ms() + (int64_t)(timeout_s * 1000);
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
    int64_t left = until - now_ms();
    int w = left > 0 ? wait_keys(p, s, o->gen, keys, 1, left, err, sizeof err) : -1;
    if (w == -1) {
      snprintf(err, sizeof err, "node %d did not answer within %.0f s", owner, timeout_s);
      mark_timed_out(p, o->gen);
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
    if (now_ms() >= until || !job_live(p, o->gen)) {
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

static void *store_thread(void *arg) {
  agent_pmix_t *p = arg;
  tdist_store_t *pclient = NULL, *pstore = NULL;
  uint64_t pgen = 0;
  for (;;) {
    pthread_mutex_lock(&p->mu);
    while (!p->stop && !p->head) pthread_cond_wait(&p->cv, &p->mu);
    op_t *o = p->head;
    if (o) {
      p->head = o->next;
      if (!p->head) p->tail = NULL;
    }
    int stop = p->stop;
    int live = o && p->have_job && o->gen == p->gen;
    /* A node that missed one fence misses the next: fail at once rather than wait again. */
    int dead = live && o->kind <= OP_DMODEX && p->timed_out_gen == o->gen;
    int node_id = p->node_id;
    double timeout_s = p->timeout_s;
    char sig[256] = "";
    uint64_t seq = 0;
    int owner = -1;
    if (o && live && o->kind == OP_FENCE) {
      size_t l = 0;
      for (int i = 0; i < o->nnodes && l < sizeof sig - 12; i++)
        l += (size_t)snprintf(sig + l, sizeof sig - l, "%s%d", i ? "." : "", o->nodes[i]);
      int j = 0;
      while (j < p->nseqs && strcmp(p->seqs[j].sig, sig)) j++;
      if (j == p->nseqs) {
        fence_seq_t *ns = realloc(p->seqs, (size_t)(p->nseqs + 1) * sizeof *ns);
        char *dup = strdup(sig);
        if (ns && dup) {
          p->seqs = ns;
          ns[j].sig = dup;
          ns[j].n = 0;
          p->nseqs++;
        } else {
          if (ns) p->seqs = ns;
          free(dup);
          live = 0;
        }
      }
      if (live) seq = p->seqs[j].n++;
    }
    if (o && live && o->kind == OP_DMODEX) owner = node_of(p, (pmix_rank_t)o->rank);
    pthread_mutex_unlock(&p->mu);
    if (!o) {
      if (stop) break;
      continue;
    }
    if (dead) {
      o->modex_cb(PMIX_ERR_TIMEOUT, NULL, 0, o->cbdata, NULL, NULL);
      op_free(o);
      continue;
    }
    char err[600];
    int sok = live;
    if (sok && o->kind <= OP_DMODEX &&
        job_store(p, &p->client, &p->store, &p->store_gen, NULL, err, sizeof err)) {
      AGENT_ERROR("PMIx: %s", err);
      sok = 0;
    }
    if (sok && o->kind > OP_DMODEX && job_store(p, &pclient, &pstore, &pgen, "", err, sizeof err)) {
      AGENT_ERROR("PMIx: %s", err);
      sok = 0;
    }
    switch (o->kind) {
      case OP_FENCE:
        if (sok)
          do_fence(p, o, p->store, sig, seq, node_id, timeout_s);
        else
          o->modex_cb(PMIX_ERR_NOT_AVAILABLE, NULL, 0, o->cbdata, NULL, NULL);
        break;
      case OP_DMODEX:
        if (sok && owner >= 0)
          do_dmodex(p, o, p->store, owner, timeout_s);
        else
          o->modex_cb(sok ? PMIX_ERR_BAD_PARAM : PMIX_ERR_NOT_AVAILABLE, NULL, 0, o->cbdata, NULL,
                      NULL);
        break;
      case OP_PUBLISH: {
        pmix_status_t st = sok ? do_publish(o, pstore) : PMIX_ERR_NOT_AVAILABLE;
        if (o->op_cb) o->op_cb(st, o->cbdata);
        break;
      }
      case OP_LOOKUP:
        if (sok)
          do_lookup(p, o, pstore, timeout_s);
        else
          o->lookup_cb(PMIX_ERR_NOT_AVAILABLE, NULL, 0, o->cbdata);
        break;
      case OP_UNPUBLISH:
        if (sok) do_unpublish(o, pstore);
        if (o->op_cb) o->op_cb(sok ? PMIX_SUCCESS : PMIX_ERR_NOT_AVAILABLE, o->cbdata);
        break;
    }
    op_free(o);
  }
  tdist_store_destroy(pstore);
  tdist_store_destroy(pclient);
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

static void *dmx_thread(void *arg) {
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
      if (st != TDIST_ERR_TIMEOUT && st != TDIST_ERR_NOT_FOUND && job_live(p, gen)) {
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

/* ---- libpmix's module functions (its progress thread: never block) ---- */

/* client_connected and client_finalized: nothing to do (the agent watches its workers itself). */
static pmix_status_t m_client_noop(const pmix_proc_t *proc, void *so, pmix_op_cbfunc_t cb,
                                   void *cbdata) {
  (void)proc;
  (void)so;
  (void)cb;
  (void)cbdata;
  return PMIX_OPERATION_SUCCEEDED;
}

static pmix_status_t m_abort(const pmix_proc_t *proc, void *so, int status, const char msg[],
                             pmix_proc_t procs[], size_t nprocs, pmix_op_cbfunc_t cb,
                             void *cbdata) {
  (void)so;
  (void)procs;
  (void)nprocs;
  (void)cb;
  (void)cbdata;
  agent_pmix_t *p = g_p;
  if (!p) return PMIX_OPERATION_SUCCEEDED;
  pthread_mutex_lock(&p->mu);
  if (!p->aborted && !strcmp(proc->nspace, p->nspace)) {
    p->aborted = 1;
    p->abort_rank = (int)proc->rank;
    p->abort_status = status;
    snprintf(p->abort_msg, sizeof p->abort_msg, "%s", msg ? msg : "");
  }
  pthread_mutex_unlock(&p->mu);
  return PMIX_OPERATION_SUCCEEDED;
}

/* A new op of the current server (libpmix's module functions carry no context) for cbdata. */
static pmix_status_t new_op(agent_pmix_t *p, op_kind_t kind, void *cbdata, op_t **out) {
  if (!p) return PMIX_ERR_NOT_AVAILABLE;
  op_t *o = calloc(1, sizeof *o);
  if (!o) return PMIX_ERR_NOMEM;
  o->kind = kind;
  o->cbdata = cbdata;
  *out = o;
  return PMIX_SUCCESS;
}

static int cmp_int(const void *a, const void *b) {
  int x = *(const int *)a, y = *(const int *)b;
  return x < y ? -1 : x > y;
}

static pmix_status_t m_fence(const pmix_proc_t procs[], size_t nprocs, const pmix_info_t info[],
                             size_t ninfo, char *data, size_t ndata, pmix_modex_cbfunc_t cb,
                             void *cbdata) {
  (void)info;
  (void)ninfo;
  agent_pmix_t *p = g_p;
  op_t *o = NULL;
  pmix_status_t st = new_op(p, OP_FENCE, cbdata, &o);
  if (st != PMIX_SUCCESS) return st;
  o->modex_cb = cb;
  pthread_mutex_lock(&p->mu);
  int nn = p->nnodes;
  char *in = calloc((size_t)(nn ? nn : 1), 1);
  int bad = !in || !p->have_job;
  for (size_t i = 0; !bad && i < nprocs; i++) {
    if (strcmp(procs[i].nspace, p->nspace)) {
      bad = 1;
    } else if (procs[i].rank == PMIX_RANK_WILDCARD) {
      memset(in, 1, (size_t)nn);
    } else {
      int n = node_of(p, procs[i].rank);
      if (n < 0)
        bad = 1;
      else
        in[n] = 1;
    }
  }
  pthread_mutex_unlock(&p->mu);
  if (!bad) {
    o->nodes = malloc((size_t)(nn ? nn : 1) * sizeof *o->nodes);
    for (int n = 0; o->nodes && n < nn; n++)
      if (in[n]) o->nodes[o->nnodes++] = n;
    qsort(o->nodes, (size_t)o->nnodes, sizeof *o->nodes, cmp_int);
    if (ndata && (o->data = malloc(ndata))) memcpy(o->data, data, ndata);
    o->ndata = o->data ? ndata : 0;
    bad = !o->nodes || o->nnodes == 0 || (ndata && !o->data);
  }
  free(in);
  if (bad) {
    op_free(o);
    return PMIX_ERR_BAD_PARAM;
  }
  return enqueue(p, o);
}

static pmix_status_t m_dmodex(const pmix_proc_t *proc, const pmix_info_t info[], size_t ninfo,
                              pmix_modex_cbfunc_t cb, void *cbdata) {
  (void)info;
  (void)ninfo;
  agent_pmix_t *p = g_p;
  op_t *o = NULL;
  pmix_status_t st = new_op(p, OP_DMODEX, cbdata, &o);
  if (st != PMIX_SUCCESS) return st;
  o->rank = (int)proc->rank;
  o->modex_cb = cb;
  return enqueue(p, o);
}

static pmix_status_t m_publish(const pmix_proc_t *proc, const pmix_info_t info[], size_t ninfo,
                               pmix_op_cbfunc_t cb, void *cbdata) {
  (void)proc;
  agent_pmix_t *p = g_p;
  op_t *o = NULL;
  pmix_status_t st = new_op(p, OP_PUBLISH, cbdata, &o);
  if (st != PMIX_SUCCESS) return st;
  o->op_cb = cb;
  pmix_data_buffer_t buf;
  PMIX_DATA_BUFFER_CONSTRUCT(&buf);
  for (size_t i = 0; i < ninfo; i++) {
    /* directives (range, persistence) are not data */
    if (!strcmp(info[i].key, PMIX_RANGE) || !strcmp(info[i].key, PMIX_PERSISTENCE)) continue;
    PMIx_Data_pack(NULL, &buf, (void *)&info[i], 1, PMIX_INFO);
  }
  PMIX_DATA_BUFFER_UNLOAD(&buf, o->data, o->ndata);
  PMIX_DATA_BUFFER_DESTRUCT(&buf);
  return enqueue(p, o);
}

static char **copy_keys(char **keys) {
  size_t n = 0;
  while (keys && keys[n]) n++;
  char **c = calloc(n + 1, sizeof *c);
  for (size_t i = 0; c && i < n; i++)
    if (!(c[i] = strdup(keys[i]))) {
      for (size_t j = 0; j < i; j++) free(c[j]);
      free(c);
      return NULL;
    }
  return c;
}

static pmix_status_t m_lookup(const pmix_proc_t *proc, char **keys, const pmix_info_t info[],
                              size_t ninfo, pmix_lookup_cbfunc_t cb, void *cbdata) {
  (void)proc;
  agent_pmix_t *p = g_p;
  op_t *o = NULL;
  pmix_status_t st = new_op(p, OP_LOOKUP, cbdata, &o);
  if (st != PMIX_SUCCESS) return st;
  o->lookup_cb = cb;
  for (size_t i = 0; i < ninfo; i++)
    if (!strcmp(info[i].key, PMIX_WAIT)) o->wait = PMIX_INFO_TRUE(&info[i]);
  if (!(o->keys = copy_keys(keys))) {
    op_free(o);
    return PMIX_ERR_NOMEM;
  }
  return enqueue(p, o);
}

static pmix_status_t m_unpublish(const pmix_proc_t *proc, char **keys, const pmix_info_t info[],
                                 size_t ninfo, pmix_op_cbfunc_t cb, void *cbdata) {
  (void)proc;
  (void)info;
  (void)ninfo;
  agent_pmix_t *p = g_p;
  op_t *o = NULL;
  pmix_status_t st = new_op(p, OP_UNPUBLISH, cbdata, &o);
  if (st != PMIX_SUCCESS) return st;
  o->op_cb = cb;
  if (!(o->keys = copy_keys(keys))) {
    op_free(o);
    return PMIX_ERR_NOMEM;
  }
  return enqueue(p, o);
}

static pmix_status_t m_spawn(const pmix_proc_t *proc, const pmix_info_t job_info[], size_t ninfo,
                             const pmix_app_t apps[], size_t napps, pmix_spawn_cbfunc_t cb,
                             void *cbdata) {
  (void)job_info;
  (void)ninfo;
  (void)cb;
  (void)cbdata;
  AGENT_ERROR(
      "rank %u asked to spawn %zu application(s) (%s, MPI_Comm_spawn): tdist-agent does "
      "not start processes on request; run every program of the job as its workers",
      proc->rank, napps, napps && apps[0].cmd ? apps[0].cmd : "?");
  return PMIX_ERR_NOT_SUPPORTED;
}

static pmix_status_t m_connect(const pmix_proc_t procs[], size_t nprocs, const pmix_info_t info[],
                               size_t ninfo, pmix_op_cbfunc_t cb, void *cbdata) {
  (void)procs;
  (void)info;
  (void)ninfo;
  (void)cb;
  (void)cbdata;
  AGENT_ERROR(
      "PMIx_Connect over %zu process(es) (MPI_Comm_connect/accept across jobs): not "
      "supported by tdist-agent",
      nprocs);
  return PMIX_ERR_NOT_SUPPORTED;
}

/* ---- the API ---- */

int agent_pmix_start(agent_pmix_t **out, const char *tmpdir, char *err, size_t cap) {
  *out = NULL;
  if (g_p) {
    snprintf(err, cap, "the PMIx server is already running in this process");
    return -1;
  }
  agent_pmix_t *p = calloc(1, sizeof *p);
  if (!p) {
    snprintf(err, cap, "out of memory starting the PMIx server");
    return -1;
  }
  pthread_mutex_init(&p->mu, NULL);
  pthread_cond_init(&p->cv, NULL);
  static pmix_server_module_t m;
  memset(&m, 0, sizeof m);
  m.client_connected = m_client_noop;
  m.client_finalized = m_client_noop;
  m.abort = m_abort;
  m.fence_nb = m_fence;
  m.direct_modex = m_dmodex;
  m.publish = m_publish;
  m.lookup = m_lookup;
  m.unpublish = m_unpublish;
  m.spawn = m_spawn;
  m.connect = m_connect;
  pmix_info_t *si;
  PMIX_INFO_CREATE(si, 2);
  PMIX_INFO_LOAD(&si[0], PMIX_SERVER_TMPDIR, tmpdir, PMIX_STRING);
  PMIX_INFO_LOAD(&si[1], PMIX_SYSTEM_TMPDIR, tmpdir, PMIX_STRING);
  /* libpmix 4.2 dereferences getpwuid()'s NULL when HOME is unset and the user has no passwd
   * entry (UID 65532 in our image, under a runtime that sets no HOME): give it what container
   * runtimes give such a user. The workers inherit it. */
  if (!getenv("HOME")) setenv("HOME", "/", 0);
  g_p = p;
  pmix_status_t rc = PMIx_server_init(&m, si, 2);
  PMIX_INFO_FREE(si, 2);
  if (rc != PMIX_SUCCESS) {
    snprintf(err, cap, "PMIx_server_init (rendezvous files in %s) failed: %s", tmpdir,
             PMIx_Error_string(rc));
    g_p = NULL;
    free(p);
    return -1;
  }
  if (pthread_create(&p->thr, NULL, store_thread, p)) {
    snprintf(err, cap, "cannot start the PMIx store thread: %s", strerror(errno));
    PMIx_server_finalize();
    g_p = NULL;
    free(p);
    return -1;
  }
  if (pthread_create(&p->dmx_thr, NULL, dmx_thread, p)) {
    snprintf(err, cap, "cannot start the PMIx direct-modex thread: %s", strerror(errno));
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    pthread_join(p->thr, NULL);
    PMIx_server_finalize();
    g_p = NULL;
    free(p);
    return -1;
  }
  p->threads = 1;
  AGENT_INFO("PMIx server (OpenPMIx %s) for MPI workers; rendezvous files in %s",
             PMIx_Get_version(), tmpdir);
  *out = p;
  return 0;
}

/* "a,b,c" of n strings; NULL on out of memory. */
static char *join_strs(const char *const *s, int n, char sep) {
  size_t len = 1;
  for (int i = 0; i < n; i++) len += strlen(s[i]) + 1;
  char *out = malloc(len), *q = out;
  if (!out) return NULL;
  for (int i = 0; i < n; i++) q += sprintf(q, "%s%s", i ? (char[]){sep, 0} : "", s[i]);
  *q = 0;
  return out;
}

/* "first,first+1,...,last" for ranks [a, b). */
static char *rank_list(int a, int b) {
  char *out = malloc((size_t)(b - a) * 12 + 1), *q = out;
  if (!out) return NULL;
  *q = 0;
  for (int r = a; r < b; r++) q += sprintf(q, "%s%d", r > a ? "," : "", r);
  return out;
}

int agent_pmix_job_start(agent_pmix_t *p, const agent_pmix_job_t *j, char *err, size_t cap) {
  agent_pmix_job_end(p);
  if (j->nnodes < 1 || j->node_id < 0 || j->node_id >= j->nnodes ||
      strlen(j->nspace) > PMIX_MAX_NSLEN) {
    snprintf(err, cap, "bad PMIx job (namespace '%s', node %d of %d)", j->nspace, j->node_id,
             j->nnodes);
    return -1;
  }
  int *first = malloc((size_t)(j->nnodes + 1) * sizeof *first);
  char **maps = calloc((size_t)j->nnodes, sizeof *maps);
  char *hosts = join_strs(j->hosts, j->nnodes, ','), *ppn = NULL, *nodemap = NULL, *procmap = NULL,
       *peers = NULL;
  int rc = -1;
  pmix_info_t *info = NULL;
  size_t ninfo = 0;
  if (!first || !maps || !hosts) goto nomem;
  first[0] = 0;
  for (int n = 0; n < j->nnodes; n++) first[n + 1] = first[n] + j->node_nproc[n];
  if (first[j->nnodes] != j->world_size) {
    snprintf(err, cap, "PMIx job: %d ranks on the nodes, world size %d", first[j->nnodes],
             j->world_size);
    goto out;
  }
  for (int n = 0; n < j->nnodes; n++)
    if (!(maps[n] = rank_list(first[n], first[n + 1]))) goto nomem;
  if (!(ppn = join_strs((const char *const *)maps, j->nnodes, ';'))) goto nomem;
  if (PMIx_generate_regex(hosts, &nodemap) != PMIX_SUCCESS ||
      PMIx_generate_ppn(ppn, &procmap) != PMIX_SUCCESS) {
    snprintf(err, cap, "PMIx could not encode the node map '%s' / process map '%s'", hosts, ppn);
    goto out;
  }
  int me = j->node_id, nlocal = j->node_nproc[me];
  if (!(peers = rank_list(first[me], first[me + 1]))) goto nomem;
  uint32_t u_ws = (uint32_t)j->world_size, u_nl = (uint32_t)nlocal, u_nn = (uint32_t)j->nnodes,
           u_me = (uint32_t)me, zero = 0;
  pmix_rank_t ldr = (pmix_rank_t)first[me];
  ninfo = 14 + (size_t)j->world_size;
  PMIX_INFO_CREATE(info, ninfo);
  if (!info) goto nomem;
  size_t k = 0;
  PMIX_INFO_LOAD(&info[k++], PMIX_UNIV_SIZE, &u_ws, PMIX_UINT32);
  PMIX_INFO_LOAD(&info[k++], PMIX_JOB_SIZE, &u_ws, PMIX_UINT32);
  PMIX_INFO_LOAD(&info[k++], PMIX_MAX_PROCS, &u_ws, PMIX_UINT32);
  PMIX_INFO_LOAD(&info[k++], PMIX_APP_SIZE, &u_ws, PMIX_UINT32);
  PMIX_INFO_LOAD(&info[k++], PMIX_LOCAL_SIZE, &u_nl, PMIX_UINT32);
  PMIX_INFO_LOAD(&info[k++], PMIX_LOCAL_PEERS, peers, PMIX_STRING);
  PMIX_INFO_LOAD(&info[k++], PMIX_LOCALLDR, &ldr, PMIX_PROC_RANK);
  PMIX_INFO_LOAD(&info[k++], PMIX_NODE_MAP, nodemap, PMIX_REGEX);
  PMIX_INFO_LOAD(&info[k++], PMIX_PROC_MAP, procmap, PMIX_REGEX);
  PMIX_INFO_LOAD(&info[k++], PMIX_JOBID, j->nspace, PMIX_STRING);
  PMIX_INFO_LOAD(&info[k++], PMIX_APPNUM, &zero, PMIX_UINT32);
  PMIX_INFO_LOAD(&info[k++], PMIX_NUM_NODES, &u_nn, PMIX_UINT32);
  PMIX_INFO_LOAD(&info[k++], PMIX_NODEID, &u_me, PMIX_UINT32);
  PMIX_INFO_LOAD(&info[k++], PMIX_HOSTNAME, j->hosts[me], PMIX_STRING);
  for (int n = 0; n < j->nnodes; n++) {
    for (int r = first[n]; r < first[n + 1]; r++) {
      pmix_data_array_t *da;
      PMIX_DATA_ARRAY_CREATE(da, 5, PMIX_INFO);
      if (!da) goto nomem;
      pmix_info_t *pi = (pmix_info_t *)da->array;
      pmix_rank_t pr = (pmix_rank_t)r;
      uint16_t lr = (uint16_t)(r - first[n]);
      uint32_t nid = (uint32_t)n;
      PMIX_INFO_LOAD(&pi[0], PMIX_RANK, &pr, PMIX_PROC_RANK);
      PMIX_INFO_LOAD(&pi[1], PMIX_LOCAL_RANK, &lr, PMIX_UINT16);
      PMIX_INFO_LOAD(&pi[2], PMIX_NODE_RANK, &lr, PMIX_UINT16);
      PMIX_INFO_LOAD(&pi[3], PMIX_HOSTNAME, j->hosts[n], PMIX_STRING);
      PMIX_INFO_LOAD(&pi[4], PMIX_NODEID, &nid, PMIX_UINT32);
      PMIX_INFO_LOAD(&info[k], PMIX_PROC_DATA, da, PMIX_DATA_ARRAY);
      PMIX_DATA_ARRAY_FREE(da);
      k++;
    }
  }
  pthread_mutex_lock(&p->mu);
  snprintf(p->nspace, sizeof p->nspace, "%s", j->nspace);
  free(p->node_first);
  p->node_first = first;
  first = NULL;
  p->world_size = j->world_size;
  p->nnodes = j->nnodes;
  p->node_id = me;
  snprintf(p->store_host, sizeof p->store_host, "%s", j->store_host);
  p->store_port = j->store_port;
  snprintf(p->prefix, sizeof p->prefix, "%s/", j->store_prefix);
  snprintf(p->pub_prefix, sizeof p->pub_prefix, "%s/", j->publish_prefix);
  p->timeout_s = j->timeout_s > 0 ? j->timeout_s : 300;
  p->aborted = 0;
  p->abort_msg[0] = 0;
  for (int i = 0; i < p->nseqs; i++) free(p->seqs[i].sig);
  p->nseqs = 0;
  pthread_mutex_unlock(&p->mu);
  sync_t *s = sync_new();
  if (!s) goto nomem;
  pmix_status_t st =
      sync_wait(s, PMIx_server_register_nspace(j->nspace, nlocal, info, k, sync_cb, s));
  if (st != PMIX_SUCCESS) {
    snprintf(err, cap, "PMIx_server_register_nspace('%s'): %s", j->nspace, PMIx_Error_string(st));
    goto out;
  }
  for (int r = p->node_first[me]; r < p->node_first[me + 1]; r++) {
    pmix_proc_t proc;
    PMIX_PROC_LOAD(&proc, j->nspace, (pmix_rank_t)r);
    st = (s = sync_new()) ? sync_wait(s, PMIx_server_register_client(&proc, geteuid(), getegid(),
                                                                     NULL, sync_cb, s))
                          : PMIX_ERR_NOMEM;
    if (st != PMIX_SUCCESS) {
      snprintf(err, cap, "PMIx_server_register_client(rank %d): %s", r, PMIx_Error_string(st));
      if ((s = sync_new())) {
        PMIx_server_deregister_nspace(j->nspace, sync_cb, s);
        sync_wait(s, PMIX_SUCCESS);
      }
      goto out;
    }
  }
  pthread_mutex_lock(&p->mu);
  p->have_job = 1;
  p->gen++;
  pthread_cond_broadcast(&p->cv);
  pthread_mutex_unlock(&p->mu);
  rc = 0;
  goto out;
nomem:
  snprintf(err, cap, "out of memory registering the PMIx job");
out:
  if (info) PMIX_INFO_FREE(info, ninfo);
  for (int n = 0; maps && n < j->nnodes; n++) free(maps[n]);
  free(maps);
  free(first);
  free(hosts);
  free(ppn);
  free(nodemap);
  free(procmap);
  free(peers);
  return rc;
}

int agent_pmix_worker_env(agent_pmix_t *p, int rank, char ***env, char *err, size_t cap) {
  *env = NULL;
  pmix_proc_t proc;
  pthread_mutex_lock(&p->mu);
  PMIX_PROC_LOAD(&proc, p->nspace, (pmix_rank_t)rank);
  pthread_mutex_unlock(&p->mu);
  char **e = NULL;
  pmix_status_t st = PMIx_server_setup_fork(&proc, &e);
  if (st != PMIX_SUCCESS) {
    snprintf(err, cap, "PMIx_server_setup_fork(rank %d): %s", rank, PMIx_Error_string(st));
    agent_pmix_env_free(e);
    return -1;
  }
  /* Open MPI 4 starts each rank as a singleton (world size 1) unless its schizo framework sees a
   * launcher it knows: mpirun (a daemon URI), Slurm, or Flux, whose marker selects the direct
   * launch by a PMIx server (ess pmi), which is what this is. Open MPI 5 and MPICH need none. */
  size_t n = 0;
  while (e && e[n]) n++;
  char **grown = realloc(e, (n + 2) * sizeof *grown);
  if (!grown || !(grown[n] = strdup("FLUX_JOB_ID=tdist-agent"))) {
    agent_pmix_env_free(grown ? grown : e);
    snprintf(err, cap, "out of memory building the PMIx environment");
    return -1;
  }
  grown[n + 1] = NULL;
  *env = grown;
  return 0;
}

void agent_pmix_env_free(char **env) {
  for (char **q = env; q && *q; q++) free(*q);
  free(env);
}

int agent_pmix_aborted(agent_pmix_t *p, int *rank, int *status, char *msg, size_t cap) {
  if (!p) return 0;
  pthread_mutex_lock(&p->mu);
  int a = p->aborted;
  if (a) {
    *rank = p->abort_rank;
    *status = p->abort_status;
    snprintf(msg, cap, "%s", p->abort_msg);
  }
  pthread_mutex_unlock(&p->mu);
  return a;
}

void agent_pmix_job_end(agent_pmix_t *p) {
  if (!p) return;
  pthread_mutex_lock(&p->mu);
  int had = p->have_job;
  p->have_job = 0;
  p->gen++;
  char nspace[PMIX_MAX_NSLEN + 1];
  snprintf(nspace, sizeof nspace, "%s", p->nspace);
  pthread_cond_broadcast(&p->cv);
  pthread_mutex_unlock(&p->mu);
  if (!had) return;
  sync_t *s = sync_new();
  if (!s) return;
  PMIx_server_deregister_nspace(nspace, sync_cb, s);
  if (sync_wait(s, PMIX_SUCCESS) == PMIX_ERR_TIMEOUT)
    AGENT_WARN("PMIx: namespace %s not deregistered within %d s; going on", nspace, SYNC_MS / 1000);
}

static void *finalize_thread(void *arg) {
  PMIx_server_finalize();
  sync_cb(PMIX_SUCCESS, arg);
  return NULL;
}

void agent_pmix_stop(agent_pmix_t *p) {
  if (!p) return;
  agent_pmix_job_end(p);
  pthread_mutex_lock(&p->mu);
  p->stop = 1;
  pthread_cond_broadcast(&p->cv);
  pthread_mutex_unlock(&p->mu);
  if (p->threads) {
    pthread_join(p->thr, NULL);
    pthread_join(p->dmx_thr, NULL);
  }
  sync_t *s = sync_new();
  pthread_t t;
  if (!s || pthread_create(&t, NULL, finalize_thread, s)) {
    if (s) sync_cb(PMIX_SUCCESS, s); /* no thread: finalize here, unbounded */
    PMIx_server_finalize();
  } else {
    pthread_detach(t);
  }
  if (s && sync_wait(s, PMIX_SUCCESS) == PMIX_ERR_TIMEOUT) {
    /* p stays reachable (g_p) for libpmix's threads, which the process exit ends */
    AGENT_WARN("PMIx: the server library did not finalize within %d s; exiting without it",
               SYNC_MS / 1000);
    return;
  }
  g_p = NULL;
  tdist_store_destroy(p->store);
  tdist_store_destroy(p->client);
  tdist_store_destroy(p->dstore);
  tdist_store_destroy(p->dclient);
  for (int i = 0; i < p->nseqs; i++) free(p->seqs[i].sig);
  free(p->seqs);
  free(p->node_first);
  pthread_mutex_destroy(&p->mu);
  pthread_cond_destroy(&p->cv);
  free(p);
}
