/* Finding this pod's node rank and the address of node rank 0 (the store host) inside Kubernetes,
 * and resolving names with retry. See ../shared/reference/k8s-conventions.md §0, §2.1, §2.2. */
#ifndef TDIST_AGENT_DISCOVERY_H
#define TDIST_AGENT_DISCOVERY_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "operator-agent/config/config.h"

/* Node rank: cfg->node_rank if >= 0, else JOB_COMPLETION_INDEX (from envp), else the numeric
 * suffix after the last '-' of `hostname` (NULL = gethostname(); only the part before the first
 * '.'), else an error naming all three sources. Returns the rank >= 0, or -1 with err set. A
 * non-numeric or negative JOB_COMPLETION_INDEX is an error, not a fallthrough. With the kubeflow
 * scheme a hostname <job>-worker-<i> is node i+1 (Kubeflow's RANK: <job>-master-0 is node 0). */
int agent_discover_node_rank(const agent_cfg_t *cfg, char **envp, const char *hostname, char *err,
                             size_t cap);

/* Reads the search list of a resolv.conf (path NULL = /etc/resolv.conf) and derives the
 * Kubernetes namespace and cluster domain from entries "<ns>.svc.<domain>" and "svc.<domain>".
 * Either output may be left "" when not derivable. Returns 0, or -1 if the file can't be read. */
int agent_resolv_conf_k8s(const char *path, char *ns, size_t ns_cap, char *domain,
                          size_t domain_cap);

/* The DNS name of pod 0: cfg->master_template or the scheme's, with placeholders filled from cfg,
 * envp (POD_NAMESPACE) and resolv.conf (resolv_conf path; NULL = /etc/resolv.conf), and the job
 * name defaulting to the hostname (NULL = gethostname()) without its "-<digits>" suffix and,
 * per scheme, the part the platform adds: kubeflow "-master"/"-worker", jobset
 * "-<replicated_job>-<job index>", volcano "-<task>" (or "-master"/"-worker").
 * Namespace: cfg, POD_NAMESPACE, the service-account namespace file, resolv.conf. Domain: cfg,
 * resolv.conf, "cluster.local". Only the placeholders the template uses are looked up; each
 * value must be a DNS label (the domain: labels) and the result a valid host name.
 * Writes into out; returns 0, or -1 with err naming the missing piece ("job name: hostname
 * 'worker' has no -<index> suffix; pass --job-name"). Unknown placeholders are errors. */
int agent_master_name(const agent_cfg_t *cfg, char **envp, const char *hostname,
                      const char *resolv_conf, char *out, size_t out_cap, char *err, size_t cap);

/* The DNS name of the pod with the given index, from pod 0's (agent_master_name's result): the
 * first label's "-0" suffix becomes "-<index>" ("job-0.svc.ns.svc.cluster.local." -> "job-3...";
 * JobSet's "...-0-0." -> "...-0-3."). Returns 0, or -1 with err when pod 0's first label does not
 * end in "-0" (kubeflow's "<job>-master-0" does, but its workers are "<job>-worker-<i>": the
 * caller must not use this for such schemes). */
int agent_pod_name(const char *pod0_name, int index, char *out, size_t out_cap, char *err,
                   size_t cap);

/* Called between attempts so the main loop can stay responsive; return non-zero to give up
 * (e.g. a signal arrived). May be NULL. */
typedef int (*agent_cancel_fn)(void *arg);

typedef struct {
  uint64_t attempts; /* getaddrinfo calls made */
  uint64_t failures; /* of which failed (any reason) */
} agent_resolve_stats_t;

/* Resolves name:port (getaddrinfo, AF_UNSPEC, SOCK_STREAM), retrying EAI_AGAIN, EAI_NONAME,
 * EAI_NODATA/EAI_FAIL (and EAI_SYSTEM) and connect failures with exponential backoff (100 ms
 * doubling to 2 s, each sleep uniform in [d/2, d]) until deadline_ms (CLOCK_MONOTONIC
 * milliseconds); at least one attempt is made, and one more at the deadline. With
 * confirm_connect, an address only counts once a TCP connect to it succeeds (the first of the
 * returned addresses that accepts; each connect waits at most 2 s and the connection is closed
 * at once). On success writes the numeric address (no brackets) into ip and returns 0. On failure
 * returns -1 with err naming the name, the last getaddrinfo/connect error and the time spent
 * ("could not resolve 'x' after 37 attempts in 60.0 s: Name or service not known", "could not
 * connect to 'x' after ...: resolved to 10.0.0.3 but connect to port 29500 failed: Connection
 * refused"), or -2 if cancel said stop. cancel is polled at least every 100 ms; only a single
 * getaddrinfo call (the resolver's own timeout) can hold it longer. stats (may be NULL) is
 * updated on every attempt. Logs the first failure and then every 10 s at info. */
int agent_resolve(const char *name, int port, int confirm_connect, int64_t deadline_ms,
                  agent_cancel_fn cancel, void *cancel_arg, char *ip, size_t ip_cap,
                  agent_resolve_stats_t *stats, char *err, size_t cap);

/* This host's primary non-loopback IPv4/IPv6 address as text (the one a UDP "connect" towards
 * `towards` would use; towards NULL = any). Falls back to 127.0.0.1. */
void agent_local_ip(const char *towards, char *ip, size_t cap);

#endif
