/* The kernel's OOM kills in the agent's memory cgroup (in a pod: the container's, whose limit is
 * resources.limits.memory), so that a worker killed by SIGKILL can be told apart: killed by the
 * OOM killer for going over the limit, or by someone's kill -9.
 *
 * The cgroup is this process's (from /proc/self/cgroup) under /sys/fs/cgroup: cgroup v2's
 * memory.events / memory.max, or v1's memory/memory.oom_control / memory.limit_in_bytes; where
 * that path is not mounted (a container's own view of its cgroup is the mount's root), the mount's
 * root is read. Reads files only; never blocks. */
#ifndef TDIST_AGENT_OOM_H
#define TDIST_AGENT_OOM_H

#include <stdint.h>

/* The cgroup's oom_kill count (kills by the OOM killer since the cgroup was made), or -1 when it
 * cannot be read (no memory controller, not Linux). */
int64_t agent_oom_kills(void);

/* The cgroup's memory limit in bytes, or -1 when there is none (v2 "max", v1's huge default) or
 * it cannot be read. */
int64_t agent_oom_limit(void);

/* Remembers the oom_kill count now (call it when workers start). */
void agent_oom_mark(void);

/* The OOM kills since the last agent_oom_mark (or since the process started, when never marked),
 * and marks again: > 0 says a SIGKILL in between was likely the OOM killer's. */
int64_t agent_oom_since_mark(void);

#endif
