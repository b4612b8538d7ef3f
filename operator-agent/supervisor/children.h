/* This process's child processes, found in /proc, for the sweeps that kill whatever the workers
 * left behind: the agent and its guard are subreapers (or PID 1), so every orphaned descendant
 * of a worker becomes a child of theirs, and killing their children until none is left kills
 * every descendant. Never signals a process that is not a child of this one: a child's pid cannot
 * be reused until this process reaps it, and the caller is the only thread that reaps. */
#ifndef TDIST_AGENT_CHILDREN_H
#define TDIST_AGENT_CHILDREN_H

#include <stdint.h>
#include <sys/types.h>

/* Whether /proc is mounted for this process's pid namespace (/proc/self is getpid()), so that
 * /proc/PID describes our PID and not another namespace's process of that number. */
int agent_proc_is_ours(void);

/* Puts the pids of this process's children (running, stopped or zombie) in out, up to cap of
 * them. Returns how many there are (which may exceed cap), or -1 when /proc cannot tell: not
 * mounted, or mounted for another pid namespace (its pids are not ours). Reads /proc; never
 * blocks otherwise. */
int agent_children_list(pid_t *out, int cap);

/* SIGKILLs every child, reaps them, and repeats (a killed child's own children become ours)
 * until this process has no child left or deadline_ns (CLOCK_MONOTONIC) passes. Each reaped
 * child is passed to on_reap(arg, pid, wait status) when on_reap is given. Returns how many
 * children were reaped; *left is 0 when none is left, else how many are still there (-1: some,
 * but /proc cannot name them, so they were not killed). Blocks up to the deadline. */
int agent_children_kill_all(int64_t deadline_ns, void (*on_reap)(void *arg, pid_t pid, int status),
                            void *arg, int *left);

#endif
