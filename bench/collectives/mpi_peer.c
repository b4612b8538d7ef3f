/* The Open MPI peer of the collectives benchmark: the same sweep as tdist's worker
 * (bench_common.c) with MPI_Allreduce (in place), MPI_Allgather, MPI_Reduce_scatter_block,
 * MPI_Bcast and MPI_Alltoall. Built by bench/collectives/run.sh with mpicc, outside Bazel (so the
 * Bazel build never needs Open MPI), and started by coll_bench through mpirun with the transport
 * chosen there (--mca btl self,tcp or self,vader).
 *
 * usage: mpi_peer --impl NAME --out DIR --colls LIST --sizes LIST --iters LIST --warmup LIST
 * Each rank writes DIR/NAME.RANK.tsv. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_common.h"

static int run_mpi(void *ctx, bench_coll_t c, float *out, const float *in, size_t count) {
  (void)ctx;
  int rc;
  int cnt = (int)count;
  switch (c) {
    case COLL_ALL_REDUCE:
      rc = MPI_Allreduce(MPI_IN_PLACE, out, cnt, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      break;
    case COLL_ALL_GATHER:
      rc = MPI_Allgather(in, cnt, MPI_FLOAT, out, cnt, MPI_FLOAT, MPI_COMM_WORLD);
      break;
    case COLL_REDUCE_SCATTER:
      rc = MPI_Reduce_scatter_block(in, out, cnt, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      break;
    case COLL_BROADCAST: rc = MPI_Bcast(out, cnt, MPI_FLOAT, 0, MPI_COMM_WORLD); break;
    default: rc = MPI_Alltoall(in, cnt, MPI_FLOAT, out, cnt, MPI_FLOAT, MPI_COMM_WORLD);
  }
  if (rc != MPI_SUCCESS) fprintf(stderr, "mpi_peer: %s failed: %d\n", bench_coll_names[c], rc);
  return rc != MPI_SUCCESS;
}

int main(int argc, char **argv) {
  const char *impl = "mpi", *dir = ".", *colls = NULL, *sizes = NULL, *iters = NULL, *warmup = NULL;
  MPI_Init(&argc, &argv);
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--impl"))
      impl = argv[i + 1];
    else if (!strcmp(argv[i], "--out"))
      dir = argv[i + 1];
    else if (!strcmp(argv[i], "--colls"))
      colls = argv[i + 1];
    else if (!strcmp(argv[i], "--sizes"))
      sizes = argv[i + 1];
    else if (!strcmp(argv[i], "--iters"))
      iters = argv[i + 1];
    else if (!strcmp(argv[i], "--warmup"))
      warmup = argv[i + 1];
    else {
      fprintf(stderr, "mpi_peer: unknown argument %s\n", argv[i]);
      MPI_Abort(MPI_COMM_WORLD, 2);
    }
  }
  int rank, n;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  bench_plan_t plan;
  if (bench_plan_parse(&plan, colls, sizes, iters, warmup)) MPI_Abort(MPI_COMM_WORLD, 2);
  char path[4096];
  snprintf(path, sizeof path, "%s/%s.%d.tsv", dir, impl, rank);
  FILE *f = fopen(path, "w");
  if (!f) {
    perror(path);
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  int rc = bench_sweep(&plan, n, rank, run_mpi, NULL, f, impl);
  fclose(f);
  if (rc) MPI_Abort(MPI_COMM_WORLD, 1);
  MPI_Finalize();
  return 0;
}
