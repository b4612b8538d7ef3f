/* One collective of the benchmark's plan through libtdist, whatever the group's backend:
 * coll_bench's workers (gloo, over TCP or shared memory) and mpi_peer --tdist (mpi). */
#ifndef TDIST_BENCH_TDIST_H
#define TDIST_BENCH_TDIST_H

#include "bench_common.h"

/* bench_sweep's run function: ctx is the tdist_pg_t. Returns 0, or 1 after printing the group's
 * error. */
int bench_run_tdist(void *ctx, bench_coll_t c, float *out, const float *in, size_t count);

#endif
