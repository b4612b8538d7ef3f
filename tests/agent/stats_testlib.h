/* A workers' statistics file (include/tdist/stats.h) made by hand for the agent's tests that read
 * them (progress, stragglers): header, rank and pid set, nothing in flight. Header-only. */
#ifndef TDIST_TESTS_AGENT_STATS_TESTLIB_H
#define TDIST_TESTS_AGENT_STATS_TESTLIB_H

#include <stdint.h>
#include <stdlib.h>

#include <tdist/stats.h>

#include "check.h"

/* A zeroed file of world size 8 for rank with pid and last completed sequence number last. */
static inline tdist_stats_file_t *test_stats_new(int rank, int pid, uint64_t last) {
  tdist_stats_file_t *f = calloc(1, sizeof *f);
  CHECK(f != NULL);
  f->magic = TDIST_STATS_MAGIC;
  f->version = TDIST_STATS_VERSION;
  f->size = sizeof *f;
  f->rank = rank;
  f->world_size = 8;
  f->pid = pid;
  f->cur_op = f->cur_peer = -1;
  f->last_seq = last;
  return f;
}

#endif
