/* See pmix_round.h. Built with or without OpenPMIx (only pmix.h's calls). */
#include "operator-agent/pmix/pmix_round.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "operator-agent/common/log.h"

int agent_pmix_round_env(void *ctx, int rank, char ***env, char *err, size_t cap) {
  return agent_pmix_worker_env(ctx, rank, env, err, cap);
}

int agent_pmix_round_start(agent_pmix_t *p, const agent_rdzv_t *rd, const agent_cfg_t *cfg,
                           const char *store_host, int store_port, char *err, size_t cap) {
  int n = (int)rd->nmembers;
  int *nproc = calloc((size_t)n, sizeof *nproc);
  const char **hosts = calloc((size_t)n, sizeof *hosts);
  int rc = -1;
  if (!nproc || !hosts) {
    snprintf(err, cap, "out of memory describing the MPI job");
  } else {
    for (int i = 0; i < n; i++) {
      nproc[i] = rd->members[i].nproc;
      hosts[i] = rd->members[i].host;
    }
    char nspace[300], prefix[440], pub[400];
    snprintf(nspace, sizeof nspace, "tdist.%s.%" PRId64, cfg->run_id, rd->round);
    snprintf(pub, sizeof pub, "tdist/%s/pmix", cfg->run_id);
    snprintf(prefix, sizeof prefix, "%s/%" PRId64, pub, rd->round);
    agent_pmix_job_t j = {.nspace = nspace,
                          .world_size = rd->world_size,
                          .nnodes = n,
                          .node_id = rd->group_rank,
                          .node_nproc = nproc,
                          .hosts = hosts,
                          .store_host = store_host,
                          .store_port = store_port,
                          .store_prefix = prefix,
                          .publish_prefix = pub,
                          .timeout_s = cfg->rdzv_timeout_s,
                          .cmd = (const char *const *)cfg->cmd,
                          .ncmd = cfg->ncmd};
    rc = agent_pmix_job_start(p, &j, err, cap);
  }
  free(nproc);
  free(hosts);
  return rc;
}

int agent_pmix_round_abort_text(int rank, int status, const char *msg, char *text, size_t cap) {
  if (!strcmp(msg, "N/A")) msg = ""; /* Open MPI's text when the program gave none */
  if (rank >= 0)
    snprintf(text, cap,
             "rank %d called MPI_Abort (PMIx_Abort) with status %d%s%s: the job ends (an abort "
             "is not retried)",
             rank, status, msg[0] ? ": " : "", msg);
  else
    snprintf(text, cap, "%s", msg);
  AGENT_ERROR("%s", text);
  return status > 0 && status < 256 ? status : 1;
}

void agent_pmix_round_abort_announce(agent_rdzv_t *rd, const char *text) {
  agent_rdzv_job_failed(rd, text); /* before the end: the others rejoin and find it */
  if (agent_rdzv_end(rd, AGENT_RESTART_WORKER_FAILED, text) < 0)
    AGENT_WARN("could not tell the other nodes: %s", rd->err);
}
