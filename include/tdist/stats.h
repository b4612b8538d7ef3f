/* Per-rank collective statistics in a small shared-memory file.
 *
 * When the environment variable TDIST_STATS_FILE names a path (tdist-agent sets it for every
 * worker), the first process group a process creates with tdist_init_process_group maps that file
 * and keeps it current: operations, bytes, errors and a latency histogram per collective type; the
 * collective in flight (type, sequence number, start time, peer); the last completed sequence
 * number; and a flight recorder of the last TDIST_STATS_FLIGHT operations. Writers use atomic
 * stores and adds only (no locks, no system calls per operation); readers take a consistent copy
 * with tdist_stats_read. Counters cover every group of the process; the in-flight operation and the
 * sequence numbers are those of the first (world) group, the same on every rank.
 *
 * Counters come in two sets, so the common case costs no atomic read-modify-write: the first
 * thread of the process that finishes a collective owns ops..hist and updates them with plain
 * atomic stores (it is their only writer); every other thread, and a forked child, adds to the
 * shared_* set with atomic adds. A total is the sum of the two; tdist_stats_read returns the
 * sums in ops..hist (and zeros in shared_*).
 *
 * The layout is fixed and versioned (magic + version + size); fields are only ever appended. */
#ifndef TDIST_STATS_H
#define TDIST_STATS_H

#include <stdint.h>

#include "tdist/status.h"
#include "tdist/version.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TDIST_STATS_MAGIC 0x54445354u /* "TDST" */
#define TDIST_STATS_VERSION 2
#define TDIST_STATS_BUCKETS 16 /* latency histogram upper bounds: tdist_stats_bucket_le() */
#define TDIST_STATS_FLIGHT 256 /* flight-recorder entries (a ring) */

/* The collective types, X(KIND, "name"), in the order of the per-type arrays below and of
 * tdist_stats_op_name(). The library's own list of collectives (its internal enum and names)
 * is generated from this one, so there is no other list to keep in step. Append only: a new type
 * grows the file's arrays, so it comes with a new TDIST_STATS_VERSION. */
#define TDIST_STATS_OP_LIST(X)              \
  X(ALL_REDUCE, "all_reduce")               \
  X(BROADCAST, "broadcast")                 \
  X(REDUCE, "reduce")                       \
  X(ALL_GATHER_V, "all_gather")             \
  X(GATHER, "gather")                       \
  X(SCATTER, "scatter")                     \
  X(REDUCE_SCATTER, "reduce_scatter")       \
  X(ALL_TO_ALL_V, "all_to_all")             \
  X(BARRIER, "barrier")                     \
  X(MONITORED_BARRIER, "monitored_barrier") \
  X(SEND, "send")                           \
  X(RECV, "recv")
#define TDIST_STATS_OP_COUNT_ONE_(kind, name) +1
/* The number of collective types (12), a constant expression. */
#define TDIST_STATS_OPS (0 TDIST_STATS_OP_LIST(TDIST_STATS_OP_COUNT_ONE_))

/* One flight-recorder entry. */
typedef struct {
  uint64_t seq;     /* sequence number in its group (0 = empty slot) */
  int32_t op;       /* collective type, 0..TDIST_STATS_OPS-1 */
  int32_t status;   /* tdist_status_t when finished, TDIST_ERR_IN_PROGRESS while in flight */
  int64_t start_ns; /* CLOCK_REALTIME nanoseconds (CLOCK_MONOTONIC + an offset re-read
                     * every second, so a step of the wall clock shows within a second) */
  int64_t end_ns;   /* 0 while in flight */
  uint64_t bytes;   /* bytes this rank contributed (count x dtype size) */
  int32_t peer;     /* send/recv peer, broadcast/reduce/gather/scatter root, else -1 */
  int32_t group;    /* 0 = the world group, 1.. = later groups in creation order */
  uint64_t stamp;   /* internal: consistency stamp (odd while being written) */
} tdist_stats_flight_t;

/* The file. All integers are native-endian; counters only grow. */
typedef struct {
  uint32_t magic, version, size, reserved0; /* size = sizeof(tdist_stats_file_t) */
  int32_t rank, world_size, pid, reserved1;
  uint64_t ops[TDIST_STATS_OPS];
  uint64_t bytes[TDIST_STATS_OPS];
  uint64_t errors[TDIST_STATS_OPS];
  uint64_t duration_ns_sum[TDIST_STATS_OPS];
  uint64_t hist[TDIST_STATS_OPS]
               [TDIST_STATS_BUCKETS + 1]; /* per bucket (not cumulative); last: +Inf */
  /* world group: the operation in flight and the last completed one */
  uint64_t cur_stamp; /* internal: odd while the fields below change */
  uint64_t cur_seq;   /* 0 = none in flight */
  int32_t cur_op, cur_peer;
  int64_t cur_start_ns; /* CLOCK_REALTIME */
  uint64_t last_seq;    /* last completed sequence number */
  uint64_t flight_next; /* entries written so far; the ring slot of entry i is i % FLIGHT */
  tdist_stats_flight_t flight[TDIST_STATS_FLIGHT];
  /* since version 2: the counters of threads other than the owner (see above) */
  uint64_t shared_ops[TDIST_STATS_OPS];
  uint64_t shared_bytes[TDIST_STATS_OPS];
  uint64_t shared_errors[TDIST_STATS_OPS];
  uint64_t shared_duration_ns_sum[TDIST_STATS_OPS];
  uint64_t shared_hist[TDIST_STATS_OPS][TDIST_STATS_BUCKETS + 1];
} tdist_stats_file_t;

/* "all_reduce", "broadcast", ... for 0..TDIST_STATS_OPS-1; "unknown" otherwise. */
TDIST_EXTERN const char *tdist_stats_op_name(int op);

/* Upper bound in seconds of histogram bucket i (0..TDIST_STATS_BUCKETS-1). */
TDIST_EXTERN double tdist_stats_bucket_le(int i);

/* Reads a consistent copy of the stats file at path into *out (retrying while a writer is in the
 * middle of an update), with each counter's two sets summed into ops..hist. TDIST_ERR_NOT_FOUND if
 * the file does not exist (yet), TDIST_ERR_PROTOCOL if it is not a stats file of this version;
 * tdist_last_error() says why. Any thread. */
TDIST_EXTERN tdist_status_t tdist_stats_read(const char *path, tdist_stats_file_t *out);

#ifdef __cplusplus
}
#endif
#endif
