/* A worker for the observability tests: env:// process group (gloo), STEPS all_reduces of one
 * float each checked against the expected sum; rank STALL_RANK sleeps STALL_SECONDS before
 * all_reduce number STALL_AT (1-based), so every other rank waits in that collective. Exits 0
 * when all sums were right.
 *   stall_worker STEPS STALL_RANK STALL_AT STALL_SECONDS */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "tdist/tdist.h"

int main(int argc, char **argv) {
  if (argc != 5) {
    fprintf(stderr, "usage: stall_worker STEPS STALL_RANK STALL_AT STALL_SECONDS\n");
    return 2;
  }
  int steps = atoi(argv[1]), stall_rank = atoi(argv[2]), stall_at = atoi(argv[3]);
  double stall_s = atof(argv[4]);
  tdist_pg_options_t o = TDIST_PG_OPTIONS_INIT;
  tdist_pg_t *pg;
  if (tdist_init_process_group(&o, &pg) != TDIST_OK) {
    fprintf(stderr, "stall_worker: init: %s\n", tdist_last_error());
    return 3;
  }
  int rank = tdist_pg_rank(pg), size = tdist_pg_size(pg);
  for (int i = 1; i <= steps; i++) {
    if (i == stall_at && rank == stall_rank) usleep((useconds_t)(stall_s * 1e6));
    float v = (float)(rank + i);
    if (tdist_all_reduce(pg, &v, 1, TDIST_FLOAT32, TDIST_SUM) != TDIST_OK) {
      fprintf(stderr, "stall_worker: rank %d all_reduce %d: %s\n", rank, i, tdist_last_error());
      return 3;
    }
    float want = (float)(size * (size - 1) / 2 + size * i);
    if (v != want) {
      fprintf(stderr, "stall_worker: rank %d step %d: got %g want %g\n", rank, i, v, want);
      return 1;
    }
  }
  tdist_pg_destroy(pg);
  return 0;
}
