/* The agent's round and the PMIx server (pmix.h): one round's job described for it, the
 * per-worker environment callback of agent_worker_spec_t, and what an MPI_Abort does to the job.
 * Runs on the agent's loop thread. */
#ifndef TDIST_AGENT_PMIX_ROUND_H
#define TDIST_AGENT_PMIX_ROUND_H

#include <stddef.h>

#include "operator-agent/config/config.h"
#include "operator-agent/pmix/pmix.h"
#include "operator-agent/rendezvous/rdzv.h"

/* --backend mpi: the round's job for the PMIx server (one namespace per round: a restart never
 * meets the last attempt's fences), from rd's members; the PMIx traffic goes through the agents'
 * store at store_host:store_port. 0, or -1 with err set. */
int agent_pmix_round_start(agent_pmix_t *p, const agent_rdzv_t *rd, const agent_cfg_t *cfg,
                           const char *store_host, int store_port, char *err, size_t cap);

/* agent_worker_spec_t.extra_env with ctx the agent_pmix_t (agent_pmix_worker_env). */
int agent_pmix_round_env(void *ctx, int rank, char ***env, char *err, size_t cap);

/* A rank called PMIx_Abort (MPI_Abort), or (rank -1) the PMIx server refused what the job needs
 * (msg says what): puts the error line in text (logged) and returns the job's exit code (the
 * abort status, 1 if out of 1..255). The job ends on every node, as under mpirun: then call
 * agent_pmix_round_abort_announce. */
int agent_pmix_round_abort_text(int rank, int status, const char *msg, char *text, size_t cap);
/* Tells the other nodes: "failed" before the round's end, so the others rejoin and find it. */
void agent_pmix_round_abort_announce(agent_rdzv_t *rd, const char *text);

#endif
