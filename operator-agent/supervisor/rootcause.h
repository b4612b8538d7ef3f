/* The root cause of a local worker failure: which worker to blame and the lines that say so.
 *
 * One failure usually brings the other ranks down within milliseconds (their collectives break),
 * and reaping order says nothing about which came first: the worker that failed first is
 * blamed, preferring failures that do not read as a lost peer (agent_errorfile_is_peer_loss).
 * A rank that is stopped (SIGSTOP, a debugger: state T or t in /proc/PID/stat) fails nothing
 * itself while the others time out waiting for it, so a stopped worker is named as the cause
 * before any that failed. Reads error files and /proc; never signals, never blocks. */
#ifndef TDIST_AGENT_ROOTCAUSE_H
#define TDIST_AGENT_ROOTCAUSE_H

#include <stddef.h>

#include "operator-agent/supervisor/workers.h"

/* Sets ws->first_failed to the failed worker that failed first: the time of a failure is its
 * error file's mtime (PyTorch's @record writes it before the process exits; nanoseconds), or its
 * exit when it wrote none (sys.exit, a crash, a C worker); a failure that reads as a lost peer
 * loses to one that does not (a worker that calls sys.exit(3) closes its sockets while Python
 * shuts down, so its peer's "Connection closed by peer" error file can be written before the
 * first worker's process is gone). Unchanged when no worker failed. */
void agent_root_cause_pick(agent_workers_t *ws);

/* Puts "rank R (local_rank L, pid P)" for each running worker that is stopped into out, comma
 * separated ("" when none), and returns how many there are; *first gets the index of the first
 * (or -1). */
int agent_root_cause_stopped(const agent_workers_t *ws, int *first, char *out, size_t cap);

/* Logs the root cause of the failure of worker ws->first_failed (a stopped worker first, see
 * above, then the failure with its error file's message and traceback) and puts a one-line
 * summary for the job's record into out: "node N rank R (local_rank L) exited with code C:
 * message", or "node N rank R (local_rank L, pid P) is stopped (...)". */
void agent_root_cause_describe(const agent_workers_t *ws, int node_rank, char *out, size_t cap);

#endif
