/* The agent's PMIx server: one round's job: its namespace, node and process maps registered
 * with libpmix, and the variables each worker needs to reach the server. */
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

/* Each node's host identity for PMIx: its host name, unless other nodes of the job report the
 * same one (several agents on one host, each with its own ranks: local multi-node testing,
 * host-network pods), where each of them is "<host>-tdist-node<n>". Open MPI takes the nodes
 * PMIx names alike for one node and hangs in MPI_Comm_split_type(SHARED) otherwise. NULL on out
 * of memory; free with free_strs. */
static char **host_ids(const agent_pmix_job_t *j) {
  char **ids = calloc((size_t)j->nnodes, sizeof *ids);
  for (int n = 0; ids && n < j->nnodes; n++) {
    int shared = 0;
    for (int m = 0; m < j->nnodes; m++) shared |= m != n && !strcmp(j->hosts[m], j->hosts[n]);
    if (shared ? asprintf(&ids[n], "%s-tdist-node%d", j->hosts[n], n) < 0
               : !(ids[n] = strdup(j->hosts[n]))) {
      ids[n] = NULL;
      for (int m = 0; m < n; m++) free(ids[m]);
      free(ids);
      return NULL;
    }
    if (shared && n == j->node_id)
      AGENT_INFO(
          "PMIx: other nodes of the job run on this host (%s) too: this node's MPI ranks "
          "see it as %s%s",
          j->hosts[n], ids[n],
          getenv("OMPI_MCA_btl_vader_backing_directory")
              ? ""
              : ", and their shared memory is this agent's own");
  }
  return ids;
}

static void free_strs(char **s, int n) {
  for (int i = 0; s && i < n; i++) free(s[i]);
  free(s);
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
  char **ids = host_ids(j);
  char *hosts = ids ? join_strs((const char *const *)ids, j->nnodes, ',') : NULL, *ppn = NULL,
       *nodemap = NULL, *procmap = NULL, *peers = NULL;
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
  PMIX_INFO_LOAD(&info[k++], PMIX_HOSTNAME, ids[me], PMIX_STRING);
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
      PMIX_INFO_LOAD(&pi[3], PMIX_HOSTNAME, ids[n], PMIX_STRING);
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
  /* no trailing '/': the prefix store puts one between prefix and key */
  snprintf(p->prefix, sizeof p->prefix, "%s", j->store_prefix);
  snprintf(p->pub_prefix, sizeof p->pub_prefix, "%s", j->publish_prefix);
  p->timeout_s = j->timeout_s > 0 ? j->timeout_s : 300;
  p->aborted = 0;
  p->abort_msg[0] = 0;
  p->refused = 0;
  p->refuse_msg[0] = 0;
  int host_shared = 0;
  for (int n = 0; n < j->nnodes; n++) host_shared |= n != me && !strcmp(j->hosts[n], j->hosts[me]);
  int cmd_rc = agent_pmix__job_cmd(p, j, host_shared, err, cap);
  /* not retried: the next round would meet the same directory (agent_pmix_refused) */
  if (cmd_rc == -2) {
    p->refused = 1;
    snprintf(p->refuse_msg, sizeof p->refuse_msg, "%s", err);
  }
  for (int i = 0; i < p->nseqs; i++) free(p->seqs[i].sig);
  p->nseqs = 0;
  pthread_mutex_unlock(&p->mu);
  if (cmd_rc) goto out;
  sync_t *s = agent_pmix__sync_new();
  if (!s) goto nomem;
  pmix_status_t st = agent_pmix__sync_wait(
      s, PMIx_server_register_nspace(j->nspace, nlocal, info, k, agent_pmix__sync_cb, s));
  if (st != PMIX_SUCCESS) {
    snprintf(err, cap, "PMIx_server_register_nspace('%s'): %s", j->nspace, PMIx_Error_string(st));
    goto out;
  }
  for (int r = p->node_first[me]; r < p->node_first[me + 1]; r++) {
    pmix_proc_t proc;
    PMIX_PROC_LOAD(&proc, j->nspace, (pmix_rank_t)r);
    st = (s = agent_pmix__sync_new())
             ? agent_pmix__sync_wait(s, PMIx_server_register_client(&proc, geteuid(), getegid(),
                                                                    NULL, agent_pmix__sync_cb, s))
             : PMIX_ERR_NOMEM;
    if (st != PMIX_SUCCESS) {
      snprintf(err, cap, "PMIx_server_register_client(rank %d): %s", r, PMIx_Error_string(st));
      if ((s = agent_pmix__sync_new())) {
        PMIx_server_deregister_nspace(j->nspace, agent_pmix__sync_cb, s);
        agent_pmix__sync_wait(s, PMIX_SUCCESS);
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
  free_strs(ids, j->nnodes);
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
  grown[++n] = NULL;
  if (agent_pmix__mpirun_env(p, rank, &grown, &n)) {
    agent_pmix_env_free(grown);
    snprintf(err, cap, "out of memory building the MPI environment");
    return -1;
  }
  *env = grown;
  return 0;
}

void agent_pmix_env_free(char **env) {
  for (char **q = env; q && *q; q++) free(*q);
  free(env);
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
  agent_pmix__shm_dir_remove(p);
  if (!had) return;
  sync_t *s = agent_pmix__sync_new();
  if (!s) return;
  PMIx_server_deregister_nspace(nspace, agent_pmix__sync_cb, s);
  if (agent_pmix__sync_wait(s, PMIX_SUCCESS) == PMIX_ERR_TIMEOUT)
    AGENT_WARN("PMIx: namespace %s not deregistered within %d s; going on", nspace, SYNC_MS / 1000);
}
