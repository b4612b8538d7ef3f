/* The option table of tdist-agent (see config_internal.h): one row per setting with its flag,
 * environment and YAML names, type, range, default and help text. The loader, the YAML reader and
 * writer and --help are all driven by it, so a setting is added here once. */
#include <stddef.h>

#include "operator-agent/config/config_internal.h"

#define OFF(f) offsetof(agent_cfg_t, f)
#define IDCHARS "A-Z a-z 0-9 . _ : -"

/* One option per block, its fields grouped by meaning: kept as written. */
/* clang-format off */
const cfg_opt_t agent_cfg__opts[CFG_NOPTS] = {
    [CFG_NNODES] = {.flag = "nnodes", .yaml = "nnodes", .pet = "PET_NNODES",
                    .type = CFG_T_NNODES, .off = OFF(nnodes_min), .group = "Job shape",
                    .metavar = "N|MIN:MAX", .def = "1:1",
                    .help = "Number of nodes, 1..65536. With MIN:MAX the job starts once MIN "
                            "nodes joined and admits up to MAX."},
    [CFG_SPARES] = {.flag = "spares", .yaml = "spares", .type = CFG_T_INT, .min = 0,
                    .max = 65535, .off = OFF(spares), .metavar = "K", .def = "0",
                    .help = "Warm spare pods beyond the nodes, 0..65535: pods with node ranks "
                            "nnodes..nnodes+K-1 join as standbys (started, store reached, no "
                            "workers) and take the place of a lost member at the next round. "
                            "Pod nnodes also hosts the store if pod 0 is lost (store failover). "
                            "A standby exits 0 once the job succeeded."},
    [CFG_SPARES_IN_NNODES] = {.flag = "spares-in-nnodes", .yaml = "spares_in_nnodes",
                              .type = CFG_T_BOOL, .off = OFF(spares_in_nnodes), .def = "off",
                              .help = "The node count given (--nnodes, PET_NNODES) counts every "
                                      "pod, the spares included: the job runs nnodes - spares "
                                      "active nodes and the pods with node ranks from there up "
                                      "are the standbys. For Kubeflow Trainer v2, whose "
                                      "PET_NNODES is numNodes. Needs a fixed nnodes (not "
                                      "MIN:MAX) greater than --spares."},
    [CFG_NPROC] = {.flag = "nproc-per-node", .yaml = "nproc_per_node",
                   .pet = "PET_NPROC_PER_NODE", .type = CFG_T_NPROC, .off = OFF(nproc_per_node),
                   .metavar = "N|cpu|gpu|auto", .def = "1",
                   .help = "Workers on this node, 1..4096. cpu = online CPUs; gpu = number of "
                           "/dev/nvidia<N> devices (an error if none); auto = gpu if any, else "
                           "cpu."},
    [CFG_NODE_RANK] = {.flag = "node-rank", .yaml = "node_rank", .pet = "PET_NODE_RANK",
                       .type = CFG_T_INT, .min = 0, .max = 65535, .nullable = 1,
                       .off = OFF(node_rank), .metavar = "N", .def = "discover",
                       .help = "This node's rank, 0..65535. Unset: JOB_COMPLETION_INDEX, else the "
                               "numeric -<index> suffix of the hostname (YAML: null)."},
    [CFG_MASTER_ADDR] = {.flag = "master-addr", .yaml = "master_addr", .pet = "PET_MASTER_ADDR",
                         .plain = "MASTER_ADDR", .type = CFG_T_STR, .sclass = CFG_S_HOST,
                         .nullable = 1, .off = OFF(master_addr), .metavar = "HOST",
                         .def = "discover",
                         .help = "Host of node rank 0, where the store runs. Unset: the DNS name "
                                 "of pod 0 from --scheme (YAML: null)."},
    [CFG_MASTER_PORT] = {.flag = "master-port", .yaml = "master_port", .pet = "PET_MASTER_PORT",
                         .plain = "MASTER_PORT", .type = CFG_T_INT, .min = 0, .max = 65535,
                         .off = OFF(master_port), .metavar = "PORT",
                         .def = "29500 (standalone: 0 = ephemeral)",
                         .help = "Port of the agents' store on node rank 0, 1..65535 (0 only "
                                 "with --standalone). Workers get MASTER_PORT of their own "
                                 "store instead: a fresh one per attempt, on an ephemeral port "
                                 "of node rank 0."},
    [CFG_STORE_PROXY] = {.flag = "store-proxy", .yaml = "store_proxy", .type = CFG_T_BOOL,
                         .off = OFF(store_proxy), .def = "off",
                         .help = "The workers of a node other than node rank 0 reach their store "
                                 "through a proxy in this agent (MASTER_ADDR 127.0.0.1, "
                                 "MASTER_PORT the proxy's), which carries them all over one "
                                 "connection: the store host then holds one connection per node "
                                 "instead of one per rank. For jobs of thousands of ranks; every "
                                 "store operation keeps its semantics (docs/agent.md)."},
    [CFG_RUN_ID] = {.flag = "run-id", .flag2 = "rdzv-id", .yaml = "run_id", .yaml2 = "rdzv_id",
                    .pet = "PET_RDZV_ID", .type = CFG_T_STR, .sclass = CFG_S_ID,
                    .off = OFF(run_id), .metavar = "ID",
                    .def = "none (standalone: a random uuid4)",
                    .help = "Job id, the same on every node: 1..128 of " IDCHARS},
    [CFG_MAX_RESTARTS] = {.flag = "max-restarts", .yaml = "max_restarts",
                          .pet = "PET_MAX_RESTARTS", .type = CFG_T_INT, .min = 0,
                          .max = 1000000, .off = OFF(max_restarts), .metavar = "N", .def = "0",
                          .help = "Restarts of the whole worker group after a failure before "
                                  "giving up, 0..1000000."},
    [CFG_JOBSET_IN_PLACE_RESTART] = {
        .flag = "jobset-in-place-restart", .yaml = "jobset_in_place_restart", .type = CFG_T_BOOL,
        .off = OFF(jobset_inplace), .def = "off",
        .help = "JobSet's in-place restart protocol (JobSet failurePolicy restartStrategy "
                "InPlaceRestart): before the first rendezvous, annotate this pod "
                "(JOBSET_NAME, POD_NAME, the service account's namespace and token) and wait at "
                "the barrier until the JobSet lifts it; when --max-restarts is used up, a "
                "rendezvous cannot complete, or the JobSet restarts the group, exit with "
                "IN_PLACE_RESTART_EXIT_CODE (default 1) so the kubelet restarts the container in "
                "place. /barrier-is-down answers 200 once the barrier is lifted. A JobSet without "
                "InPlaceRestart, or annotated jobset.sigs.k8s.io/disable-in-place-restart, "
                "bypasses it. See docs/orchestrators.md."},
    [CFG_MONITOR_INTERVAL] = {.flag = "monitor-interval", .yaml = "monitor_interval",
                              .pet = "PET_MONITOR_INTERVAL", .type = CFG_T_DUR, .min = 1,
                              .off = OFF(monitor_interval_s), .metavar = "DURATION",
                              .def = "0.1", .help = "How often the workers are checked."},
    [CFG_STANDALONE] = {.flag = "standalone", .yaml = "standalone", .pet = "PET_STANDALONE",
                        .type = CFG_T_BOOL, .off = OFF(standalone), .def = "off",
                        .help = "One node: nnodes 1:1, node rank 0, the store on 127.0.0.1 on an "
                                "ephemeral port (unless a master port is given), a random run "
                                "id (unless one is given). Plain MASTER_ADDR/MASTER_PORT are "
                                "ignored; other settings that contradict it are errors."},
    [CFG_ROLE] = {.flag = "role", .yaml = "role", .pet = "PET_ROLE", .type = CFG_T_STR,
                  .sclass = CFG_S_ID, .off = OFF(role), .metavar = "NAME", .def = "default",
                  .help = "Worker role (ROLE_NAME): 1..128 of " IDCHARS},
    [CFG_BACKEND] = {.flag = "backend", .yaml = "backend", .type = CFG_T_BACKEND,
                     .off = OFF(backend), .metavar = "gloo|nccl|mpi", .def = "gloo",
                     .help = "Process-group backend, exported to the workers as TDIST_BACKEND. mpi: the "
                             "agent is the PMIx server of its workers, which are plain MPI "
                             "programs (mpicc) started directly: no mpirun, ssh or hostfile."},
    [CFG_RDZV_TIMEOUT] = {.flag = "rdzv-timeout", .yaml = "rdzv_timeout", .type = CFG_T_DUR,
                          .min = 1, .off = OFF(rdzv_timeout_s), .group = "Rendezvous timing",
                          .metavar = "DURATION", .def = "900",
                          .help = "Give up joining the rendezvous or reaching the master after "
                                  "this long (exit 69)."},
    [CFG_LAST_CALL] = {.flag = "last-call", .yaml = "last_call", .type = CFG_T_DUR,
                       .off = OFF(last_call_s), .metavar = "DURATION", .def = "30",
                       .help = "With MIN < MAX nodes: once MIN joined, wait this long for more. "
                               "Must be below --rdzv-timeout."},
    [CFG_HB_INTERVAL] = {.flag = "heartbeat-interval", .yaml = "heartbeat_interval",
                         .type = CFG_T_DUR, .min = 1, .off = OFF(heartbeat_interval_s),
                         .metavar = "DURATION", .def = "5",
                         .help = "How often each agent tells the others it is alive."},
    [CFG_HB_TIMEOUT] = {.flag = "heartbeat-timeout", .yaml = "heartbeat_timeout",
                        .type = CFG_T_DUR, .min = 1, .off = OFF(heartbeat_timeout_s),
                        .metavar = "DURATION", .def = "15",
                        .help = "A peer silent this long is lost and the group restarts. Must "
                                "exceed --heartbeat-interval."},
    [CFG_STOP_GRACE] = {.flag = "stop-grace-period", .yaml = "stop_grace_period",
                        .type = CFG_T_DUR, .off = OFF(stop_grace_s), .metavar = "DURATION",
                        .def = "30", .help = "Time between SIGTERM and SIGKILL of workers."},
    [CFG_SCHEME] = {.flag = "scheme", .yaml = "scheme", .discovery = 1, .type = CFG_T_SCHEME,
                    .off = OFF(scheme),
                    .group = "Discovery of node rank 0 in Kubernetes (YAML keys under discovery:)",
                    .metavar = "indexed-job|kubeflow|jobset|volcano", .def = "indexed-job",
                    .help = "DNS name of pod 0 by platform: indexed-job "
                            "{job}-0.{service}.{namespace}.svc.{domain}. | kubeflow "
                            "{job}-master-0.{namespace}.svc.{domain}. | jobset "
                            "{job}-{replicated_job}-0-0.{service}.{namespace}.svc.{domain}. | "
                            "volcano {job}-{task}-0.{job}.{namespace}.svc.{domain}."},
    [CFG_MASTER_TEMPLATE] = {.flag = "master-template", .yaml = "master_template",
                             .discovery = 1, .type = CFG_T_STR, .sclass = CFG_S_TEMPLATE,
                             .nullable = 1, .off = OFF(master_template),
                             .metavar = "TEMPLATE", .def = "the scheme's",
                             .help = "Replaces the scheme's name. Placeholders {job} {service} "
                                     "{namespace} {domain} {replicated_job} {task}; a trailing "
                                     "'.' makes the name absolute."},
    [CFG_JOB_NAME] = {.flag = "job-name", .yaml = "job_name", .discovery = 1, .type = CFG_T_STR,
                      .sclass = CFG_S_HOST, .nullable = 1, .off = OFF(job_name),
                      .metavar = "NAME", .def = "the hostname without its -<index> suffix",
                      .help = "{job}."},
    [CFG_SERVICE] = {.flag = "service", .yaml = "service", .discovery = 1, .type = CFG_T_STR,
                     .sclass = CFG_S_HOST, .nullable = 1, .off = OFF(service),
                     .metavar = "NAME", .def = "the job name",
                     .help = "{service}: the headless Service."},
    [CFG_NAMESPACE] = {.flag = "namespace", .yaml = "namespace", .discovery = 1,
                       .type = CFG_T_STR, .sclass = CFG_S_HOST, .nullable = 1,
                       .off = OFF(namespace_), .metavar = "NAME",
                       .def = "POD_NAMESPACE, else the resolv.conf search list",
                       .help = "{namespace}."},
    [CFG_CLUSTER_DOMAIN] = {.flag = "cluster-domain", .yaml = "cluster_domain", .discovery = 1,
                            .type = CFG_T_STR, .sclass = CFG_S_HOST, .nullable = 1,
                            .off = OFF(cluster_domain), .metavar = "DOMAIN",
                            .def = "from the resolv.conf search list, else cluster.local",
                            .help = "{domain}."},
    [CFG_REPLICATED_JOB] = {.flag = "replicated-job", .yaml = "replicated_job", .discovery = 1,
                            .type = CFG_T_STR, .sclass = CFG_S_HOST,
                            .off = OFF(replicated_job), .metavar = "NAME", .def = "node",
                            .help = "{replicated_job} (jobset)."},
    [CFG_TASK] = {.flag = "task", .yaml = "task", .discovery = 1, .type = CFG_T_STR,
                  .sclass = CFG_S_HOST, .off = OFF(task), .metavar = "NAME", .def = "worker",
                  .help = "{task} (volcano)."},
    [CFG_HTTP_HOST] = {.flag = "http-host", .yaml = "http_host", .type = CFG_T_STR,
                       .sclass = CFG_S_HOST0, .off = OFF(http_host),
                       .group = "HTTP (/healthz /readyz /metrics /status)", .metavar = "HOST",
                       .def = "\"\" (all addresses, IPv4 and IPv6)",
                       .help = "Address the HTTP server binds."},
    [CFG_HTTP_PORT] = {.flag = "http-port", .yaml = "http_port", .type = CFG_T_INT, .min = -1,
                       .max = 65535, .off = OFF(http_port), .metavar = "PORT", .def = "29600",
                       .help = "HTTP port; 0 = ephemeral, -1 = no HTTP server."},
    [CFG_HTTP_PORT_FILE] = {.flag = "http-port-file", .yaml = "http_port_file",
                            .type = CFG_T_STR, .sclass = CFG_S_PATH, .nullable = 1,
                            .off = OFF(http_port_file), .metavar = "FILE", .def = "none",
                            .help = "Write the bound HTTP port to FILE (for scripts and tests)."},
    [CFG_LOG_DIR] = {.flag = "log-dir", .yaml = "log_dir", .pet = "PET_LOG_DIR",
                     .type = CFG_T_STR, .sclass = CFG_S_PATH, .off = OFF(log_dir),
                     .group = "Workers", .metavar = "DIR", .def = "$TMPDIR, else /tmp",
                     .help = "Directory in which the run directory tdist-<run id>_<random> "
                             "(mode 0700: the workers' error and stats files, flight-recorder "
                             "dumps) is created. The agent removes it at exit unless "
                             "--keep-run-dir is given or it holds a flight-recorder dump."},
    [CFG_KEEP_RUN_DIR] = {.flag = "keep-run-dir", .yaml = "keep_run_dir", .type = CFG_T_BOOL,
                          .off = OFF(keep_run_dir), .def = "off",
                          .help = "Leave the run directory behind at exit (its path is "
                                  "logged at start)."},
    [CFG_OMP] = {.flag = "omp-num-threads", .yaml = "omp_num_threads", .type = CFG_T_INT,
                 .min = 0, .max = 65536, .off = OFF(omp_num_threads), .metavar = "N",
                 .def = "0",
                 .help = "OMP_NUM_THREADS of the workers; 0 = torchrun's rule: 1 when "
                         "nproc-per-node > 1 and the agent's environment has none."},
    [CFG_LOG_FORMAT] = {.flag = "log-format", .yaml = "log_format", .type = CFG_T_LOGFMT,
                        .off = OFF(log_format), .group = "Agent", .metavar = "text|json",
                        .def = "text", .help = "Agent log lines on stderr as text or JSON."},
    [CFG_CONFIG] = {.flag = "config", .type = CFG_T_STR, .sclass = CFG_S_PATH,
                    .off = OFF(config_path), .metavar = "FILE", .def = "none",
                    .help = "YAML file with settings (see \"YAML file\" below)."},
    [CFG_CHECK_CONFIG] = {.flag = "check-config", .type = CFG_T_BOOL, .off = OFF(check_config),
                          .def = "off",
                          .help = "Load and check every setting, print the effective "
                                  "configuration as YAML to stdout and exit 0 (64 if invalid). "
                                  "Starts no workers, uses no network; a command is optional."},
    [CFG_HELP] = {.flag = "help", .type = CFG_T_ACTION, .help = "Print this help and exit."},
    [CFG_VERSION] = {.flag = "version", .type = CFG_T_ACTION,
                     .help = "Print \"tdist-agent VERSION\" and exit."},
};
/* clang-format on */
