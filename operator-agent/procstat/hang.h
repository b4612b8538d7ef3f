/* The hang detector for every worker, libtdist or not (issue 37 item 2; rules in docs/agent.md
 * "Hang reports"). Pure: the caller feeds one observation per local rank per sample, the
 * detector keeps a few reference points per rank (no history, no allocation) and names the
 * ranks that hold the job:
 *   stopped          state T/t (SIGSTOP, a debugger) for stall_s
 *   uninterruptible  state D (a hung file system, a driver) for stall_s
 *   spinning         CPU moving (>= 10% of a core) for stall_s while at least one other local
 *                    rank's CPU is flat (<= 2% of a core) for stall_s: it runs, they wait on it
 *   behind           (libtdist ranks) not in the collective that local peers have been in for
 *                    stall_s, behind it (last completed before it): they wait on this rank
 *   collective       (libtdist ranks) in one collective for stall_s, and no local rank is
 *                    named above (the holder may be on another node: node 0's summary says)
 *   deadline         deadline_s > 0 and the rank made no progress (no byte read or written by
 *                    a syscall, no libtdist collective completed) for deadline_s, and no rank
 *                    is named above
 * A rank whose CPU is flat while no peer runs is not named by CPU alone: the whole node waiting
 * (on another node, on I/O, on a sleeping job) is not a hang that points at anyone here.
 * Not thread-safe: the agent's loop thread owns it. */
#ifndef TDIST_AGENT_HANG_H
#define TDIST_AGENT_HANG_H

#include <stdint.h>
#include <sys/types.h>

typedef enum {
  AGENT_STALL_NONE = 0,
  AGENT_STALL_STOPPED = 1,         /* "stopped" */
  AGENT_STALL_UNINTERRUPTIBLE = 2, /* "uninterruptible" */
  AGENT_STALL_SPINNING = 3,        /* "spinning" */
  AGENT_STALL_COLLECTIVE = 4,      /* "collective" */
  AGENT_STALL_DEADLINE = 5,        /* "deadline" */
  AGENT_STALL_BEHIND = 6,          /* "behind" */
  AGENT_STALL_NREASONS = 7
} agent_stall_reason_t;

/* The label value ("stopped", ...; "none" for 0). */
const char *agent_stall_reason_name(agent_stall_reason_t r);

typedef struct {
  double stall_s;    /* TDIST_STALL_REPORT_SECONDS */
  double deadline_s; /* TDIST_PROGRESS_DEADLINE_SECONDS; 0 = off */
  long hz;           /* clock ticks per second of the CPU counters */
} agent_hang_cfg_t;

/* One local rank. The caller sets the inputs before each agent_hang_judge; the rest is the
 * detector's. A new process in the slot (pid changed) starts afresh. */
typedef struct {
  /* inputs */
  int global_rank, local_rank;
  pid_t pid;      /* 0: not running (exited, not started): never named, never waiting */
  int64_t t_ns;   /* CLOCK_MONOTONIC of the sample */
  uint64_t ticks; /* user + system CPU, clock ticks */
  char state;     /* stat state */
  uint64_t io;    /* rchar + wchar */
  int libtdist;   /* 1: the rank keeps a libtdist statistics file (fields below valid) */
  uint64_t cur_seq, last_seq;
  double collective_s; /* age of the collective in flight (cur_seq != 0) */
  /* detector state */
  pid_t seen_pid;
  int64_t idle_ref_ns, busy_ref_ns, state_since_ns, progress_ns;
  uint64_t idle_ref_ticks, busy_ref_ticks, progress_io, progress_seq;
  char since_state;
  /* verdict of the last agent_hang_judge */
  agent_stall_reason_t reason; /* NONE unless named as holding the job */
  int waiting;                 /* 1: a peer waiting on a named rank */
  int64_t since_ns;            /* named: since when (CLOCK_MONOTONIC) */
  double idle_s, busy_s;       /* how long its CPU has been flat / moving */
} agent_hang_rank_t;

/* Applies the rules to the n local ranks at now_ns; returns how many ranks are named. The
 * index of the rank to report first (stopped, uninterruptible, spinning, behind, collective,
 * deadline;
 * then the lowest global rank) goes to *first (-1 when none). */
int agent_hang_judge(agent_hang_rank_t *r, int n, const agent_hang_cfg_t *c, int64_t now_ns,
                     int *first);

#endif
