/* What the files of the agent's PMIx server share (see pmix.h): the server's state, the op
 * queue between libpmix's progress thread and the store thread, and waiting for libpmix's own
 * callbacks. Private to operator-agent/pmix. */
#ifndef TDIST_AGENT_PMIX_INT_H
#define TDIST_AGENT_PMIX_INT_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

/* pmix.h first: pmix_server.h uses its types. */
#include <pmix.h>
#include <pmix_server.h>

#include "operator-agent/pmix/pmix.h"
#include "tdist/store.h"

#define SLICE_MS 250 /* blocking store calls wait this long at a time, to notice a job's end */

typedef enum {
  OP_FENCE,
  OP_DMODEX,
  OP_PUBLISH,
  OP_LOOKUP,
  OP_UNPUBLISH,
  OP_CONNECT,
  OP_DISCONNECT
} op_kind_t;

typedef struct conn conn_t; /* a pooled connection to the agents' store (pmix_store.c) */

typedef struct op {
  struct op *next;
  op_kind_t kind;
  uint64_t gen; /* the job it belongs to: ops of an ended job fail at once */
  int *nodes;   /* OP_FENCE, OP_(DIS)CONNECT: the participating nodes, ascending */
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
  char *cmd_name, *cmd_args, *wdir; /* the job's command, as mpirun gives it (pmix_env.c) */
  char *shm_dir;   /* the job's ranks' shared-memory directory (pmix_env.c), or NULL */
  int shm_lock_fd; /* the flock held on it, or on the user's (pmix_env.c); -1: none */
  int refused;     /* a refused MPI_Comm_spawn: the job ends (agent_pmix_refused) */
  char refuse_msg[768];
  /* the store thread's and the direct-modex thread's connections, and the job they are for */
  tdist_store_t *dclient, *dstore; /* the direct-modex service's */
  uint64_t dstore_gen;
  conn_t *idle; /* the store thread's and its task threads' idle connections */
  int nworkers; /* task threads running (waiting ops: fences, direct modex, waiting lookups) */
  /* a direct-modex answer from libpmix (dmx thread waits for it) */
  int dmx_done;
  pmix_status_t dmx_status;
  char *dmx_data;
  size_t dmx_len;
};

extern agent_pmix_t *agent_pmix__g_p; /* libpmix's module functions carry no context */

#define SYNC_MS 10000

typedef struct {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int done, refs;
  pmix_status_t st;
} sync_t;

int64_t agent_pmix__now_ms(void);

/* A sync_t for one libpmix call with a callback (sync_cb, cbdata = the sync_t). */
sync_t *agent_pmix__sync_new(void);
void agent_pmix__sync_unref(sync_t *s);
void agent_pmix__sync_cb(pmix_status_t st, void *cbdata);
/* call_st: what the libpmix call returned; PMIX_SUCCESS means the callback will come. Waits at
 * most SYNC_MS for it (PMIX_ERR_TIMEOUT). */
pmix_status_t agent_pmix__sync_wait(sync_t *s, pmix_status_t call_st);

void agent_pmix__op_free(op_t *o);
/* Queues o for the store thread (under no lock). PMIX_SUCCESS, or an error with o freed. */
pmix_status_t agent_pmix__enqueue(agent_pmix_t *p, op_t *o);
/* The node of global rank r, or -1. Under mu. */
int agent_pmix__node_of(const agent_pmix_t *p, pmix_rank_t r);
/* 1 while job gen is the current one and the server runs. Takes mu. */
int agent_pmix__job_live(agent_pmix_t *p, uint64_t gen);
/* A fence or modex of job gen timed out: its later ones fail at once. Takes mu. */
void agent_pmix__mark_timed_out(agent_pmix_t *p, uint64_t gen);

/* pmix_env.c: the job's command and directories kept for agent_pmix__mpirun_env (err set: -1
 * out of memory, -2 the user's shared-memory directory is another agent's on this host, which
 * host_shared, other nodes of the job on this host, asks to check); the variables mpirun
 * gives rank `rank`, appended to e (n entries, NULL-terminated); the CPUs this process may use
 * (affinity, cgroup limit). Under mu. */
int agent_pmix__job_cmd(agent_pmix_t *p, const agent_pmix_job_t *j, int host_shared, char *err,
                        size_t cap);
int agent_pmix__mpirun_env(agent_pmix_t *p, int rank, char ***e, size_t *n);
int agent_pmix__usable_cpus(void);
/* Removes the job's shared-memory directory and what its ranks left there (at the job's end:
 * its ranks are gone). */
void agent_pmix__shm_dir_remove(agent_pmix_t *p);
/* Removes the shared-memory directories in /dev/shm that agents of this user made (their lock
 * marker in them) and left when they died (no lock held on them); how many. At the server's
 * start. */
int agent_pmix__shm_sweep(void);

/* The store thread (the op queue) and the thread that serves the other nodes' direct modex. */
void *agent_pmix__store_thread(void *arg);
void *agent_pmix__dmx_thread(void *arg);
/* Closes the pooled store connections (at stop, once no task thread runs). */
void agent_pmix__conns_close(agent_pmix_t *p);

#endif
