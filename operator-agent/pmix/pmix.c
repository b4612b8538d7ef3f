/* The PMIx server of tdist-agent (see pmix.h): libpmix's module functions and the server's
 * start and stop. libpmix calls the module functions on its progress thread, which must never
 * block: they queue an op for the store thread (pmix_store.c) or answer at once, and return. */
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

int agent_pmix_available(void) { return 1; }

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
  agent_pmix_t *p = agent_pmix__g_p;
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

/* o->nodes: the nodes of procs, ascending. 0; -1 a rank outside the job (or out of memory);
 * -2 a process of another namespace (another job). */
static int procs_nodes(agent_pmix_t *p, const pmix_proc_t procs[], size_t nprocs, op_t *o) {
  pthread_mutex_lock(&p->mu);
  int nn = p->nnodes, rc = 0;
  char *in = calloc((size_t)(nn ? nn : 1), 1);
  if (!in || !p->have_job) rc = -1;
  for (size_t i = 0; !rc && i < nprocs; i++) {
    if (strcmp(procs[i].nspace, p->nspace)) {
      rc = -2;
    } else if (procs[i].rank == PMIX_RANK_WILDCARD) {
      memset(in, 1, (size_t)nn);
    } else {
      int n = agent_pmix__node_of(p, procs[i].rank);
      if (n < 0)
        rc = -1;
      else
        in[n] = 1;
    }
  }
  pthread_mutex_unlock(&p->mu);
  if (!rc) {
    o->nodes = malloc((size_t)(nn ? nn : 1) * sizeof *o->nodes);
    for (int n = 0; o->nodes && n < nn; n++)
      if (in[n]) o->nodes[o->nnodes++] = n;
    if (!o->nodes || o->nnodes == 0) rc = -1;
  }
  free(in);
  return rc;
}

static pmix_status_t m_fence(const pmix_proc_t procs[], size_t nprocs, const pmix_info_t info[],
                             size_t ninfo, char *data, size_t ndata, pmix_modex_cbfunc_t cb,
                             void *cbdata) {
  (void)info;
  (void)ninfo;
  agent_pmix_t *p = agent_pmix__g_p;
  op_t *o = NULL;
  pmix_status_t st = new_op(p, OP_FENCE, cbdata, &o);
  if (st != PMIX_SUCCESS) return st;
  o->modex_cb = cb;
  int bad = procs_nodes(p, procs, nprocs, o) != 0;
  if (!bad) {
    if (ndata && (o->data = malloc(ndata))) memcpy(o->data, data, ndata);
    o->ndata = o->data ? ndata : 0;
    bad = ndata && !o->data;
  }
  if (bad) {
    agent_pmix__op_free(o);
    return PMIX_ERR_BAD_PARAM;
  }
  return agent_pmix__enqueue(p, o);
}

static pmix_status_t m_dmodex(const pmix_proc_t *proc, const pmix_info_t info[], size_t ninfo,
                              pmix_modex_cbfunc_t cb, void *cbdata) {
  (void)info;
  (void)ninfo;
  agent_pmix_t *p = agent_pmix__g_p;
  op_t *o = NULL;
  pmix_status_t st = new_op(p, OP_DMODEX, cbdata, &o);
  if (st != PMIX_SUCCESS) return st;
  o->rank = (int)proc->rank;
  o->modex_cb = cb;
  return agent_pmix__enqueue(p, o);
}

static pmix_status_t m_publish(const pmix_proc_t *proc, const pmix_info_t info[], size_t ninfo,
                               pmix_op_cbfunc_t cb, void *cbdata) {
  (void)proc;
  agent_pmix_t *p = agent_pmix__g_p;
  op_t *o = NULL;
  pmix_status_t st = new_op(p, OP_PUBLISH, cbdata, &o);
  if (st != PMIX_SUCCESS) return st;
  o->op_cb = cb;
  pmix_data_buffer_t buf;
  PMIX_DATA_BUFFER_CONSTRUCT(&buf);
  for (size_t i = 0; i < ninfo; i++) {
    /* Only the user's keys are data: PMIx reserves the "pmix." prefix for its attributes, and
     * libpmix passes its directives (range, persistence, timeout) and the publisher's
     * pmix.euid/pmix.egid here too; stored, those would collide between publishers of other
     * UIDs (PMIX_ERR_DUPLICATE_KEY) and show as names nobody published. */
    if (!strncmp(info[i].key, "pmix.", 5)) continue;
    PMIx_Data_pack(NULL, &buf, (void *)&info[i], 1, PMIX_INFO);
  }
  PMIX_DATA_BUFFER_UNLOAD(&buf, o->data, o->ndata);
  PMIX_DATA_BUFFER_DESTRUCT(&buf);
  return agent_pmix__enqueue(p, o);
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
  agent_pmix_t *p = agent_pmix__g_p;
  op_t *o = NULL;
  pmix_status_t st = new_op(p, OP_LOOKUP, cbdata, &o);
  if (st != PMIX_SUCCESS) return st;
  o->lookup_cb = cb;
  for (size_t i = 0; i < ninfo; i++)
    if (!strcmp(info[i].key, PMIX_WAIT)) o->wait = PMIX_INFO_TRUE(&info[i]);
  if (!(o->keys = copy_keys(keys))) {
    agent_pmix__op_free(o);
    return PMIX_ERR_NOMEM;
  }
  return agent_pmix__enqueue(p, o);
}

static pmix_status_t m_unpublish(const pmix_proc_t *proc, char **keys, const pmix_info_t info[],
                                 size_t ninfo, pmix_op_cbfunc_t cb, void *cbdata) {
  (void)proc;
  (void)info;
  (void)ninfo;
  agent_pmix_t *p = agent_pmix__g_p;
  op_t *o = NULL;
  pmix_status_t st = new_op(p, OP_UNPUBLISH, cbdata, &o);
  if (st != PMIX_SUCCESS) return st;
  o->op_cb = cb;
  if (!(o->keys = copy_keys(keys))) {
    agent_pmix__op_free(o);
    return PMIX_ERR_NOMEM;
  }
  return agent_pmix__enqueue(p, o);
}

/* MPI_Comm_spawn: refused, and the job ends. Open MPI hands the refusal to the spawning root
 * only; the other ranks of the communicator wait for the spawn for ever (under mpirun, which
 * spawns, the job goes on or ends). */
static pmix_status_t m_spawn(const pmix_proc_t *proc, const pmix_info_t job_info[], size_t ninfo,
                             const pmix_app_t apps[], size_t napps, pmix_spawn_cbfunc_t cb,
                             void *cbdata) {
  (void)job_info;
  (void)ninfo;
  (void)cb;
  (void)cbdata;
  agent_pmix_t *p = agent_pmix__g_p;
  char msg[768];
  snprintf(msg, sizeof msg,
           "rank %u called MPI_Comm_spawn (PMIx_Spawn of %zu application(s): %s): refused, "
           "tdist-agent starts only the job's own workers, and the spawning ranks would wait "
           "for ever: the job ends (not retried); run every program of the job as its workers, "
           "or the job under mpirun",
           proc->rank, napps, napps && apps[0].cmd ? apps[0].cmd : "?");
  int recorded = 0; /* the main loop ends the job and logs it */
  if (p) {
    pthread_mutex_lock(&p->mu);
    if (!p->refused && !strcmp(proc->nspace, p->nspace)) {
      p->refused = recorded = 1;
      snprintf(p->refuse_msg, sizeof p->refuse_msg, "%s", msg);
    }
    pthread_mutex_unlock(&p->mu);
  }
  if (!recorded) AGENT_ERROR("%s", msg);
  return PMIX_ERR_NOT_SUPPORTED;
}

/* PMIx_Connect and PMIx_Disconnect (MPI_Comm_connect/accept, MPI_Comm_disconnect, the
 * dynamic-process calls) inside the job: the processes are all in its namespace, and their data
 * goes through the fences and direct modex already, so both are a barrier of the nodes that hold
 * them. libpmix calls these once the node's own participants arrived. Across jobs: refused. */
static pmix_status_t connect_op(op_kind_t kind, const pmix_proc_t procs[], size_t nprocs,
                                pmix_op_cbfunc_t cb, void *cbdata) {
  agent_pmix_t *p = agent_pmix__g_p;
  op_t *o = NULL;
  pmix_status_t st = new_op(p, kind, cbdata, &o);
  if (st != PMIX_SUCCESS) return st;
  o->op_cb = cb;
  int rc = procs_nodes(p, procs, nprocs, o);
  if (rc) {
    agent_pmix__op_free(o);
    if (rc == -2) {
      AGENT_ERROR(
          "PMIx_%s over %zu process(es) of another job (namespace '%s'; "
          "MPI_Comm_connect/accept across jobs): not supported by tdist-agent, which "
          "serves one job; connect/accept between ranks of one job works",
          kind == OP_CONNECT ? "Connect" : "Disconnect", nprocs, procs[0].nspace);
      return PMIX_ERR_NOT_SUPPORTED;
    }
    return PMIX_ERR_BAD_PARAM;
  }
  return agent_pmix__enqueue(p, o);
}

static pmix_status_t m_connect(const pmix_proc_t procs[], size_t nprocs, const pmix_info_t info[],
                               size_t ninfo, pmix_op_cbfunc_t cb, void *cbdata) {
  (void)info;
  (void)ninfo;
  return connect_op(OP_CONNECT, procs, nprocs, cb, cbdata);
}

static pmix_status_t m_disconnect(const pmix_proc_t procs[], size_t nprocs,
                                  const pmix_info_t info[], size_t ninfo, pmix_op_cbfunc_t cb,
                                  void *cbdata) {
  (void)info;
  (void)ninfo;
  return connect_op(OP_DISCONNECT, procs, nprocs, cb, cbdata);
}

/* ---- the API ---- */

int agent_pmix_start(agent_pmix_t **out, const char *tmpdir, char *err, size_t cap) {
  *out = NULL;
  if (agent_pmix__g_p) {
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
  p->shm_lock_fd = -1;
  agent_pmix__shm_sweep();
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
  m.disconnect = m_disconnect;
  pmix_info_t *si;
  PMIX_INFO_CREATE(si, 2);
  PMIX_INFO_LOAD(&si[0], PMIX_SERVER_TMPDIR, tmpdir, PMIX_STRING);
  PMIX_INFO_LOAD(&si[1], PMIX_SYSTEM_TMPDIR, tmpdir, PMIX_STRING);
  /* libpmix 4.2 dereferences getpwuid()'s NULL when HOME is unset and the user has no passwd
   * entry (UID 65532 in our image, under a runtime that sets no HOME): give it what container
   * runtimes give such a user. The workers inherit it. */
  if (!getenv("HOME")) setenv("HOME", "/", 0);
  agent_pmix__g_p = p;
  pmix_status_t rc = PMIx_server_init(&m, si, 2);
  PMIX_INFO_FREE(si, 2);
  if (rc != PMIX_SUCCESS) {
    snprintf(err, cap, "PMIx_server_init (rendezvous files in %s) failed: %s", tmpdir,
             PMIx_Error_string(rc));
    agent_pmix__g_p = NULL;
    free(p);
    return -1;
  }
  if (pthread_create(&p->thr, NULL, agent_pmix__store_thread, p)) {
    snprintf(err, cap, "cannot start the PMIx store thread: %s", strerror(errno));
    PMIx_server_finalize();
    agent_pmix__g_p = NULL;
    free(p);
    return -1;
  }
  if (pthread_create(&p->dmx_thr, NULL, agent_pmix__dmx_thread, p)) {
    snprintf(err, cap, "cannot start the PMIx direct-modex thread: %s", strerror(errno));
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    pthread_join(p->thr, NULL);
    PMIx_server_finalize();
    agent_pmix__g_p = NULL;
    free(p);
    return -1;
  }
  p->threads = 1;
  AGENT_INFO("PMIx server (OpenPMIx %s) for MPI workers; rendezvous files in %s",
             PMIx_Get_version(), tmpdir);
  *out = p;
  return 0;
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

int agent_pmix_refused(agent_pmix_t *p, char *msg, size_t cap) {
  if (!p) return 0;
  pthread_mutex_lock(&p->mu);
  int r = p->refused;
  if (r) snprintf(msg, cap, "%s", p->refuse_msg);
  pthread_mutex_unlock(&p->mu);
  return r;
}

static void *finalize_thread(void *arg) {
  PMIx_server_finalize();
  agent_pmix__sync_cb(PMIX_SUCCESS, arg);
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
  /* The task threads see the job's end within a store slice (SLICE_MS), or a store call's own
   * timeout; bounded all the same, and p outlives any that do not end. */
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_sec += SYNC_MS / 1000;
  pthread_mutex_lock(&p->mu);
  while (p->nworkers > 0)
    if (pthread_cond_timedwait(&p->cv, &p->mu, &until) == ETIMEDOUT) break;
  int busy = p->nworkers;
  pthread_mutex_unlock(&p->mu);
  if (busy)
    AGENT_WARN("PMIx: %d waiting operation(s) did not end within %d s", busy, SYNC_MS / 1000);
  else
    agent_pmix__conns_close(p);
  sync_t *s = agent_pmix__sync_new();
  pthread_t t;
  if (!s || pthread_create(&t, NULL, finalize_thread, s)) {
    if (s) agent_pmix__sync_cb(PMIX_SUCCESS, s); /* no thread: finalize here, unbounded */
    PMIx_server_finalize();
  } else {
    pthread_detach(t);
  }
  if (s && agent_pmix__sync_wait(s, PMIX_SUCCESS) == PMIX_ERR_TIMEOUT) {
    /* p stays reachable (agent_pmix__g_p) for libpmix's threads, which the process exit ends */
    AGENT_WARN("PMIx: the server library did not finalize within %d s; exiting without it",
               SYNC_MS / 1000);
    return;
  }
  if (busy) return; /* p stays for the threads still running, which the process exit ends */
  agent_pmix__g_p = NULL;
  tdist_store_destroy(p->dstore);
  tdist_store_destroy(p->dclient);
  for (int i = 0; i < p->nseqs; i++) free(p->seqs[i].sig);
  free(p->seqs);
  free(p->node_first);
  free(p->cmd_name);
  free(p->cmd_args);
  free(p->wdir);
  pthread_mutex_destroy(&p->mu);
  pthread_cond_destroy(&p->cv);
  free(p);
}
