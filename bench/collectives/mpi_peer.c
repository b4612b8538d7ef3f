/* The Open MPI peer of the collectives benchmark: the same sweep as tdist's worker
 * (bench_common.c) with MPI_Allreduce (in place), MPI_Allgather, MPI_Reduce_scatter_block,
 * MPI_Bcast and MPI_Alltoall. Built by bench/collectives/run.sh with mpicc, outside Bazel (so the
 * Bazel build never needs Open MPI), and started by coll_bench through mpirun with the transport
 * chosen there (--mca btl self,tcp or self,vader).
 *
 * With --tdist it runs the same sweep through tdist's "mpi" backend instead (libtdist.so and
 * libtdist-mpi.so, which run.sh builds and links), in the same mpirun set-up: the difference
 * between the two is what the backend adds over raw MPI.
 *
 * usage: mpi_peer [--tdist] --impl NAME --out DIR --colls LIST --sizes LIST --iters LIST
 *                 --warmup LIST
 * Each rank writes DIR/NAME.RANK.tsv. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_common.h"
#include "bench_tdist.h"
#include "tdist/tdist.h"

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
  int tdist = 0;
  MPI_Init(&argc, &argv);
  for (int i = 1; i < argc; i += 2) {
    if (!strcmp(argv[i], "--tdist")) {
      tdist = 1;
      i--;
    } else if (i + 1 >= argc) {
      fprintf(stderr, "mpi_peer: %s needs a value\n", argv[i]);
      MPI_Abort(MPI_COMM_WORLD, 2);
    } else if (!strcmp(argv[i], "--impl"))
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
  tdist_pg_t *pg = NULL;
  if (tdist) {
    tdist_pg_options_t po = TDIST_PG_OPTIONS_INIT;
    po.backend = "mpi";
    if (tdist_init_process_group(&po, &pg)) {
      fprintf(stderr, "mpi_peer --tdist: %s\n", tdist_last_error());
      MPI_Abort(MPI_COMM_WORLD, 2);
    }
  }
  int rc = tdist ? bench_sweep(&plan, n, rank, bench_run_tdist, pg, f, impl)
                 : bench_sweep(&plan, n, rank, run_mpi, NULL, f, impl);
  fclose(f);
  tdist_pg_destroy(pg); /* MPI_Init was the program's: tdist does not finalize it */
  if (rc) MPI_Abort(MPI_COMM_WORLD, 1);
  MPI_Finalize();
  return 0;
}
