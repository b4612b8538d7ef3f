/* The guard: a small parent process that outlives the agent to kill what the agent leaves.
 *
 * A worker's own children can leave its process group (setsid, double fork). While the agent
 * lives they become its children when orphaned (it is a subreaper) and it kills them when the
 * workers stop; but after `kill -9` of the agent they would be re-parented away and keep running.
 * So, before any thread starts, the agent forks: the original process (the pid the user, the
 * shell or the kubelet knows) becomes the guard, a subreaper that only forwards TERM, INT, QUIT,
 * HUP, USR1 and USR2 to the agent and, once the agent has exited however it died, SIGKILLs every
 * process it has inherited (the agent's leftovers) until it has no child, then exits with the
 * agent's status (128+N if a signal N killed it). The child, in a process group of its own (a
 * signal sent to the guard's group reaches it once, through the guard, and a group SIGKILL leaves
 * it alive to clean up), goes on as the agent, with PR_SET_PDEATHSIG(SIGTERM): if the guard is
 * killed, the agent stops its workers as on SIGTERM and exits.
 *
 * As PID 1 there is no guard: when PID 1 exits, however it dies, the kernel kills every process
 * of its pid namespace. */
#ifndef TDIST_AGENT_GUARD_H
#define TDIST_AGENT_GUARD_H

#include <sys/types.h>

/* Call once, single-threaded, before any thread exists. Returns in the agent: the guard's pid, or
 * 0 when there is no guard (PID 1, or fork failed: logged). In the guard it never returns. Leaves
 * TERM, INT, QUIT, HUP, USR1, USR2 and CHLD blocked in the agent (a signal sent before the agent
 * reads them stays pending). */
pid_t agent_guard_start(void);

/* In the agent: whether its guard is gone (its parent is no longer guard_pid). */
int agent_guard_gone(pid_t guard_pid);

#endif
