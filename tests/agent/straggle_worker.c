/* A worker for the straggler test: env:// process group (gloo), STEPS steps of one all_reduce of
 * one float each, checked against the expected sum; every rank sleeps STEP_US microseconds
 * before each all_reduce and rank SLOW_RANK (-1: none) sleeps SLOW_US more, so that the others
 * wait for it in every collective. Exits 0 when all sums were right.
 *   straggle_worker STEPS STEP_US SLOW_RANK SLOW_US */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "tdist/tdist.h"

int main(int argc, char **argv) {
  if (argc != 5) {
    fprintf(stderr, "usage: straggle_worker STEPS STEP_US SLOW_RANK SLOW_US\n");
    return 2;
  }
  int steps = atoi(argv[1]), step_us = atoi(argv[2]), slow_rank = atoi(argv[3]);
  int slow_us = atoi(argv[4]);
  tdist_pg_options_t o = TDIST_PG_OPTIONS_INIT;
  tdist_pg_t *pg;
  if (tdist_init_process_group(&o, &pg) != TDIST_OK) {
    fprintf(stderr, "straggle_worker: init: %s\n", tdist_last_error());
    return 3;
  }
  int rank = tdist_pg_rank(pg), size = tdist_pg_size(pg);
  for (int i = 1; i <= steps; i++) {
    int us = step_us + (rank == slow_rank ? slow_us : 0);
    if (us > 0) usleep((useconds_t)us);
    float v = (float)(rank + i % 1000);
    if (tdist_all_reduce(pg, &v, 1, TDIST_FLOAT32, TDIST_SUM) != TDIST_OK) {
      fprintf(stderr, "straggle_worker: rank %d all_reduce %d: %s\n", rank, i, tdist_last_error());
      return 3;
    }
    float want = (float)(size * (size - 1) / 2 + size * (i % 1000));
    if (v != want) {
      fprintf(stderr, "straggle_worker: rank %d step %d: got %g want %g\n", rank, i, v, want);
      return 1;
    }
  }
  tdist_pg_destroy(pg);
  return 0;
}
