/* tdist-agent built without OpenPMIx (no libpmix-dev on the build machine): --backend mpi says
 * what to install instead of starting MPI workers that would each run alone. */
#include <stdio.h>

#include "operator-agent/pmix/pmix.h"

int agent_pmix_available(void) { return 0; }

int agent_pmix_start(agent_pmix_t **out, const char *tmpdir, char *err, size_t cap) {
  (void)tmpdir;
  *out = NULL;
  snprintf(err, cap,
           "this tdist-agent was built without OpenPMIx, so it cannot start MPI workers "
           "(--backend mpi): rebuild it with libpmix-dev installed (pkg-config pmix)");
  return -1;
}

int agent_pmix_job_start(agent_pmix_t *p, const agent_pmix_job_t *job, char *err, size_t cap) {
  (void)p;
  (void)job;
  snprintf(err, cap, "built without OpenPMIx");
  return -1;
}

int agent_pmix_worker_env(agent_pmix_t *p, int rank, char ***env, char *err, size_t cap) {
  (void)p;
  (void)rank;
  *env = NULL;
  snprintf(err, cap, "built without OpenPMIx");
  return -1;
}

void agent_pmix_env_free(char **env) { (void)env; }

int agent_pmix_refused(agent_pmix_t *p, char *msg, size_t cap) {
  (void)p;
  (void)msg;
  (void)cap;
  return 0;
}

int agent_pmix_aborted(agent_pmix_t *p, int *rank, int *status, char *msg, size_t cap) {
  (void)p;
  (void)rank;
  (void)status;
  (void)msg;
  (void)cap;
  return 0;
}

void agent_pmix_job_end(agent_pmix_t *p) { (void)p; }

void agent_pmix_stop(agent_pmix_t *p) { (void)p; }
