/* See bench_tdist.h. */
#include "bench_tdist.h"

#include <stdio.h>

#include "tdist/tdist.h"

int bench_run_tdist(void *ctx, bench_coll_t c, float *out, const float *in, size_t count) {
  tdist_pg_t *pg = ctx;
  tdist_status_t st;
  switch (c) {
    case COLL_ALL_REDUCE: st = tdist_all_reduce(pg, out, count, TDIST_FLOAT32, TDIST_SUM); break;
    case COLL_ALL_GATHER: st = tdist_all_gather(pg, out, in, count, TDIST_FLOAT32); break;
    case COLL_REDUCE_SCATTER:
      st = tdist_reduce_scatter(pg, out, in, count, TDIST_FLOAT32, TDIST_SUM);
      break;
    case COLL_BROADCAST: st = tdist_broadcast(pg, out, count, TDIST_FLOAT32, 0); break;
    default: st = tdist_all_to_all(pg, out, in, count, TDIST_FLOAT32);
  }
  if (st) {
    fprintf(stderr, "rank %d (%s): %s: %s: %s\n", tdist_pg_rank(pg), tdist_pg_backend(pg),
            bench_coll_names[c], tdist_strerror(st), tdist_pg_last_error(pg));
    return 1;
  }
  return 0;
}
