/* Writer side of the per-rank statistics file (include/tdist/stats.h). */
#ifndef TDIST_PG_STATS_H
#define TDIST_PG_STATS_H

#include "runtime/pg/backend.h"
#include "tdist/stats.h"

typedef struct {
  int64_t start_mono_ns; /* CLOCK_MONOTONIC */
  int64_t start_ns;      /* CLOCK_REALTIME, as written to the file */
  int64_t slot;          /* flight-recorder slot, -1 = statistics off */
  int flight;            /* 1: the slot's entry was written (0: another writer held it) */
  uint64_t bytes;        /* computed once at begin, counted at end */
} tdist__stats_op_t;

/* Called once per new group. The first group maps TDIST_STATS_FILE (if set). Returns the group's
 * index for the calls below, or -1 when statistics are off. */
int tdist__stats_register(int rank, int world_size);

/* group_size: the group's number of ranks (all_to_all's byte count sums its in_counts);
 * now_ns: tdist__now_ns() (CLOCK_MONOTONIC) as the caller just read it for its deadline. */
void tdist__stats_begin(int group, int group_size, const tdist__coll_t *c, int64_t now_ns,
                        tdist__stats_op_t *op);
void tdist__stats_end(int group, const tdist__coll_t *c, const tdist__stats_op_t *op,
                      tdist_status_t st);

#endif
