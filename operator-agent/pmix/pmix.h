/* tdist-agent as the PMIx server of its local workers (--backend mpi): MPI programs started by
 * the agent directly, with no mpirun, ssh or hostfile, the way Slurm and Flux start them.
 *
 * libpmix's server library does the work on this node (the clients' connections, their local
 * data); this module tells it who the job is (one namespace per round: ranks, node map, local
 * peers) and does what needs the other nodes through the agents' store, under the round's
 * prefix so that a restart never mixes with the last attempt:
 *   - fence_nb: each node sets its data under fence/<participants>/<n>/<node>, waits for every
 *     participating node's (up to timeout_s, naming the nodes that never came) and hands the
 *     concatenation back to libpmix;
 *   - direct_modex: a request queued to the owning node's agent, which asks its libpmix and
 *     answers under dmodex/<k>;
 *   - publish/lookup/unpublish: packed values under the run's publish/<key>;
 *   - abort: recorded for the main loop (agent_pmix_aborted), which ends the job;
 *   - spawn, connect and the tool calls: refused with a clear log line.
 * A background thread does the store work (one connection of its own); a second one serves the
 * other nodes' direct_modex requests. Not built without libpmix-dev (pmix_none.c says so). */
#ifndef TDIST_AGENT_PMIX_H
#define TDIST_AGENT_PMIX_H

#include <stddef.h>

typedef struct agent_pmix agent_pmix_t;

/* One round's job. Nodes are the round's members in group-rank order. */
typedef struct {
  const char *nspace; /* unique per round, e.g. "tdist.<run id>.<round>" */
  int world_size, nnodes, node_id;
  const int *node_nproc;    /* workers on each node (nnodes entries) */
  const char *const *hosts; /* each node's host name, as its workers' gethostname() says */
  const char *store_host;   /* the agents' store and this round's key prefix on it */
  int store_port;
  const char *store_prefix;   /* this round's keys: fences, direct modex */
  const char *publish_prefix; /* the run's keys: publish/lookup outlive a round */
  double timeout_s;           /* a fence or a lookup with PMIX_WAIT waits at most this */
  const char *const *cmd;     /* the workers' command (ncmd words), as mpirun's MPI_INFO_ENV */
  size_t ncmd;
} agent_pmix_job_t;

/* 1 when this agent was built with libpmix (else every call below fails, saying so). */
int agent_pmix_available(void);

/* Starts the PMIx server; its rendezvous files go to tmpdir (writable, e.g. the run directory).
 * Once per process. */
int agent_pmix_start(agent_pmix_t **out, const char *tmpdir, char *err, size_t cap);

/* Registers the round's namespace and this node's clients (ending the previous job's first). */
int agent_pmix_job_start(agent_pmix_t *p, const agent_pmix_job_t *job, char *err, size_t cap);

/* The variables a worker of global rank `rank` (a local one) needs to reach this server:
 * "NAME=VALUE" strings, NULL-terminated (agent_pmix_env_free). */
int agent_pmix_worker_env(agent_pmix_t *p, int rank, char ***env, char *err, size_t cap);
void agent_pmix_env_free(char **env);

/* 1 when a rank of the current job called PMIx_Abort (MPI_Abort): its rank, status, message. */
int agent_pmix_aborted(agent_pmix_t *p, int *rank, int *status, char *msg, size_t cap);

/* 1 when the current job must end because the server refused what a rank asked and the job
 * cannot go on without it (MPI_Comm_spawn: the spawning ranks would wait for ever): msg says
 * what and why. The caller ends the job, as for an abort. */
int agent_pmix_refused(agent_pmix_t *p, char *msg, size_t cap);

/* Ends the current job (its pending fences fail, its namespace is deregistered). */
void agent_pmix_job_end(agent_pmix_t *p);

/* Stops the server and the threads. NULL is fine. */
void agent_pmix_stop(agent_pmix_t *p);

#endif
