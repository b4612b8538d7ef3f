/* The agent's HTTP endpoints, served by libmicrohttpd on its own thread:
 *   GET /healthz  200 "ok" while the main loop ticked within the last max(10 s, 20 monitor
 *                 intervals); 503 with the age otherwise, and 503 while loop_tick_ns is still 0
 *                 (the loop has not started). Never depends on peers or the agent's state.
 *   GET /readyz   200 once st->ready and, on the store host (is_store_host), st->store_server is
 *                 set (the store listens); 503 otherwise. Never depends on peers or rendezvous
 *                 (k8s-conventions takeaway 3).
 *   GET /metrics  Prometheus text 0.0.4, Content-Type "text/plain; version=0.0.4; charset=utf-8".
 *                 Families: see metrics.c. The restart count of the running workers is the gauge
 *                 tdist_restart_attempt (promtool's lint reserves the _count suffix).
 *   GET /status   JSON: state, round, members, workers (pids, states, exit codes), last error:
 *                 Also "ranks" (each local rank: last completed collective, the one in flight)
 *                 and "collectives" (node 0: a sentence naming ranks that hold the job up),
 *                 "hang" (null, or the hang detector's report: procstat/hang_report.c),
 *                 "gpu_monitoring" ({"available","reason"}: NVML loaded, or why not) and
 *                 "stragglers" (node 0, else null: see stragglers.c and docs/agent.md).
 *                 {"state","node_rank","run_id","role","backend","round","restart_count",
 *                  "max_restarts","group_rank","group_world_size","world_size","master_addr",
 *                  "master_port","worker_master_port","is_store_host",
 *                  "members":[{"node_rank","group_rank","addr","host"}],
 *                  "spares","standbys_live","standbys":[{"node_rank","addr","host"}],
 *                  "workers":[{"local_rank","global_rank","pid","state","exit_code"}],
 *                  "jobset_in_place_restart":null (flag off) or {"bypass","barrier_down",
 *                   "attempt","current","previous"} (this pod's attempt, the JobSet's status;
 *                   null when unset), "last_error"}
 *                 Numbers are the struct's values as they are (-1 = not known yet for node_rank,
 *                 group_rank and round; pid 0 = not started). A worker's exit_code is null until
 *                 it has exited: it is a number only when pid > 0 and its state is succeeded,
 *                 failed or stopped (>= 0 exit status, -N killed by signal N). last_error is null
 *                 when empty. "spares" is --spares; on node 0 "standbys" lists the standby
 *                 agents of the round (waiters that start no workers) and "standbys_live" how
 *                 many of them still heartbeat; elsewhere [] and null. A standby's own "state"
 *                 is "standby" (group_rank -1, no members). "members" is [] from the round's
 *                 start until the agent read the members' records, at its first monitor poll
 *                 after its workers started (rendezvous/rdzv.h: <r>/table/<C>). Strings are
 *                 made valid UTF-8 (malformed bytes become U+FFFD).
 *   GET /barrier-is-down  JobSet's in-place restart barrier (the startup probe's path): 200 once
 *                 lifted, or when --jobset-in-place-restart is off or bypassed; else 503 saying
 *                 what it waits for.
 *   GET /         a small HTML page linking the above. HEAD is answered like
 * GET without a body. A path that is none of these: 404 whatever the method; a known path with
 * another method: 405 with an "Allow: GET, HEAD" header. The query string is ignored. Every answer
 * carries "Cache-Control: no-store". Reads agent_state_t under its lock only.
 *
 * Connections: at most 8192 at once (half of RLIMIT_NOFILE when that is lower; start-up raises
 * the soft limit to the hard one), at most 1024 from one IP address; each closed after 10 s
 * without traffic, or 10 s after connecting (or after its previous request) without complete
 * request headers. A new connection from a client at its limit, or while the table is full,
 * evicts the oldest connection still waiting for its headers, so slow clients cannot starve the
 * probes (see http.c). */
#ifndef TDIST_AGENT_HTTP_H
#define TDIST_AGENT_HTTP_H

#include <stddef.h>

#include "operator-agent/state/state.h"

typedef struct agent_http_s agent_http_t;

/* Binds host:port and starts serving. host: an IP address, IPv4 or IPv6 ("[::1]" accepted), never
 * a name (no DNS lookup at start-up); "" or NULL = all addresses, dual stack ("::" accepting IPv4
 * too), or 0.0.0.0 where the kernel has no IPv6. port 0 = ephemeral (read it back with
 * agent_http_port). The listening socket is close-on-exec. monitor_interval_s (>= 0) sets the
 * /healthz staleness limit. Blocking only for bind/listen; st must outlive the server.
 * The server thread inherits the caller's signal mask: block the signals the main loop takes
 * (signalfd) before calling this.
 * On failure returns NULL with err naming the syscall, the address and the errno text. */
agent_http_t *agent_http_start(agent_state_t *st, const char *host, int port,
                               double monitor_interval_s, char *err, size_t cap);

/* The bound port; -1 for NULL. */
int agent_http_port(const agent_http_t *h);

/* Stops the server thread, closes the listening socket and every connection, frees. Waits for a
 * request being rendered to finish. NULL is a no-op. */
void agent_http_stop(agent_http_t *h);

/* Renders the bodies into malloc'd NUL-terminated strings (also used by tests and by the agent's
 * shutdown log); *len (may be NULL) gets the length. They take the state lock themselves: never
 * call them holding it. NULL when memory runs out or the text would pass 16 MiB. */
char *agent_metrics_render(agent_state_t *st, size_t *len);
char *agent_status_render(agent_state_t *st, size_t *len);

#endif
