/* tdist-agent configuration: one typed struct filled from defaults, then the YAML file
 * (--config FILE or TDIST_CONFIG), then the environment (TDIST_* and torchrun's PET_*), then the
 * command line. Later sources win: flags > env > YAML > defaults.
 *
 * Every rejected value produces one message that names where it came from and what to do:
 *   "agent.yaml:7:16: max_restarts: 'three' is not an integer (expected 0..1000000)"
 *   "env PET_NNODES: '2:1': MIN must be <= MAX"
 *   "--nproc-per-node: '0' is out of range 1..4096"
 * Never exits or prints by itself (main does). */
#ifndef TDIST_AGENT_CONFIG_H
#define TDIST_AGENT_CONFIG_H

#include <stddef.h>
#include <stdio.h>

#include "operator-agent/common/log.h"

/* Name of the pod hosting node rank 0 ("the master"), by platform. The scheme chooses the default
 * template; `master_template` overrides it. Placeholders: {job} {service} {namespace} {domain}
 * {replicated_job} {task}. A trailing "." makes the name absolute (no search-list walk). */
typedef enum {
  AGENT_SCHEME_INDEXED_JOB = 0, /* "indexed-job": {job}-0.{service}.{namespace}.svc.{domain}.   */
  AGENT_SCHEME_KUBEFLOW = 1,    /* "kubeflow":    {job}-master-0.{namespace}.svc.{domain}.      */
  AGENT_SCHEME_JOBSET =
      2, /* "jobset":      {job}-{replicated_job}-0-0.{service}.{namespace}.svc.{domain}. */
  AGENT_SCHEME_VOLCANO = 3 /* "volcano":     {job}-{task}-0.{job}.{namespace}.svc.{domain}.  */
} agent_scheme_t;

typedef struct {
  char *name; /* worker env var name */
  char *value;
} agent_env_pair_t;

typedef struct {
  /* --- job shape --- */
  int nnodes_min, nnodes_max; /* --nnodes N or MIN:MAX; default 1:1 */
  int spares;                 /* --spares K: standby pods, node ranks nnodes_max.. ; default 0 */
  int spares_in_nnodes;       /* --spares-in-nnodes: the nnodes given counts the spares too (a
                               * Trainer v2 numNodes); cleared once nnodes is reduced to the
                               * active nodes by the loader, so the effective configuration
                               * shows nnodes active + spares standbys */
  int nproc_per_node;         /* --nproc-per-node N|cpu|gpu|auto; default 1. cpu = online CPUs;
                               * gpu = number of /dev/nvidia<N> (error if none); auto = gpu if any,
                               * else cpu */
  int node_rank;              /* --node-rank; -1 = discover (JOB_COMPLETION_INDEX, hostname) */
  char *master_addr;          /* --master-addr; NULL = discover by DNS from the scheme */
  int master_port;            /* --master-port; default 29500 (standalone: 0 = ephemeral) */
  char *run_id;               /* --rdzv-id / --run-id; default "none" (standalone: random uuid4) */
  int max_restarts;           /* --max-restarts; default 0 */
  int jobset_inplace;         /* --jobset-in-place-restart: JobSet's in-place restart protocol
                               * (agent/jobset.c); default off */
  double monitor_interval_s;  /* --monitor-interval seconds; default 0.1 */
  int standalone;             /* --standalone: nnodes 1, node rank 0, store on 127.0.0.1 */
  char *role;                 /* --role; default "default" */
  char *backend;              /* --backend gloo|nccl|mpi; default "gloo"; exported as TDIST_BACKEND;
                               * mpi: the agent is its workers' PMIx server */

  /* --- rendezvous timing --- */
  double rdzv_timeout_s; /* --rdzv-timeout: give up joining / reaching the master; default 900 */
  double last_call_s;    /* --last-call: with MIN<MAX, wait this long after MIN joined; 30 */
  double heartbeat_interval_s; /* --heartbeat-interval; default 5 */
  double heartbeat_timeout_s; /* --heartbeat-timeout: a peer silent this long is lost; default 15 */
  double stop_grace_s;        /* --stop-grace-period: SIGTERM -> SIGKILL of workers; default 30 */

  /* --- discovery (Kubernetes) --- */
  agent_scheme_t scheme; /* --scheme; default indexed-job */
  char *master_template; /* --master-template; NULL = the scheme's */
  char *job_name;        /* --job-name; NULL = hostname without its "-<index>" suffix */
  char *service;         /* --service; NULL = job_name */
  char *namespace_;      /* --namespace; NULL = POD_NAMESPACE, else the resolv.conf search list */
  char *cluster_domain;  /* --cluster-domain; NULL = from resolv.conf search, else cluster.local */
  char *replicated_job;  /* --replicated-job (jobset); default "node" */
  char *task;            /* --task (volcano); default "worker" */

  /* --- HTTP --- */
  char *http_host;      /* --http-host; default "" = all addresses (IPv4 and IPv6) */
  int http_port;        /* --http-port; default 29600; 0 = ephemeral; -1 = no HTTP server */
  char *http_port_file; /* --http-port-file: write the bound port here (tests, scripts) */

  /* --- workers --- */
  char *log_dir;         /* --log-dir: the run directory is made in it; default $TMPDIR or /tmp */
  int store_proxy;       /* --store-proxy: workers reach the store through this agent */
  int keep_run_dir;      /* --keep-run-dir: leave the run directory behind at exit */
  int omp_num_threads;   /* --omp-num-threads; 0 = torchrun's rule (1 when nproc > 1 and the
                          * agent's env has none) */
  agent_env_pair_t *env; /* YAML `env:` map added to every worker's environment */
  size_t nenv;
  char **cmd;  /* worker command: argv after "--" (or from the first argument that
                * is not an option, torchrun style), else YAML `command:` list */
  size_t ncmd; /* cmd[ncmd] == NULL */

  /* --- agent --- */
  agent_log_format_t log_format; /* --log-format text|json; default text */
  char *config_path;             /* --config / TDIST_CONFIG, or NULL */
  int check_config; /* --check-config: load and validate everything, print the effective
                     * configuration (YAML) to stdout, exit 0; no workers, no network */
} agent_cfg_t;

typedef enum {
  AGENT_CFG_OK = 0,
  AGENT_CFG_ERROR = 1,  /* bad value: err holds the message */
  AGENT_CFG_HELP = 2,   /* --help / -h was given: print agent_cfg_usage() to stdout, exit 0 */
  AGENT_CFG_VERSION = 3 /* --version: print "tdist-agent <tdist_version()>", exit 0 */
} agent_cfg_result_t;

/* Fills *cfg from all sources. `envp` is the environment to read (environ in main; tests pass
 * their own). On AGENT_CFG_ERROR, err (cap bytes) holds one line without a trailing newline.
 * *cfg must be released with agent_cfg_free() whatever the result. */
agent_cfg_result_t agent_cfg_load(agent_cfg_t *cfg, int argc, char **argv, char **envp, char *err,
                                  size_t cap);

/* Only the YAML step, on top of whatever *cfg holds (for tests and for checking a ConfigMap:
 * `tdist-agent --config FILE --check-config`). `path` is used in messages. */
int agent_cfg_load_yaml(agent_cfg_t *cfg, const char *path, char *err, size_t cap);

/* Defaults (what agent_cfg_load starts from). */
void agent_cfg_defaults(agent_cfg_t *cfg);

void agent_cfg_free(agent_cfg_t *cfg);

/* The i-th TDIST_* environment name the loader reads (TDIST_<FLAG> of each option, with
 * TDIST_CONFIG), copied to buf; 0 past the last one. For docs and tests: runtime/common/param.h
 * holds the agent's other TDIST_* variables. */
int agent_cfg_tdist_env_name(size_t i, char *buf, size_t cap);

/* The --help text (accurate: every flag, its env names, YAML key and default). */
const char *agent_cfg_usage(void);

/* Writes the effective configuration to `out` as YAML that agent_cfg_load_yaml() reads back to
 * an equal struct (every setting except config_path and check_config, which are not YAML keys).
 * Strings are written double-quoted and ASCII-only (escapes for the rest); a worker command
 * argument that is not valid UTF-8 cannot be represented exactly. Returns 0, or -1 if writing
 * failed (ferror). */
int agent_cfg_dump_yaml(const agent_cfg_t *cfg, FILE *out);

/* "indexed-job" etc.; NULL for an unknown value. */
const char *agent_scheme_name(agent_scheme_t scheme);

#endif
