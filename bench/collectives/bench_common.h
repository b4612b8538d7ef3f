/* What every rank of every implementation in the collectives benchmark shares: the plan (which
 * collectives, sizes, warm-up and timed iterations), the test data, the correctness check and the
 * timing loop. tdist's worker (coll_bench.c) and the Open MPI peer (mpi_peer.c, compiled with
 * mpicc outside Bazel) both run bench_sweep(), so the two measure exactly the same thing;
 * torch_peer.py mirrors it line for line. Nothing here talks to the network or depends on tdist.
 *
 * Sizes follow nccl-tests: `bytes` is the whole buffer of the operation (all_reduce/broadcast:
 * the buffer; all_gather: the gathered output; reduce_scatter: the whole input; all_to_all: one
 * rank's input), rounded so every rank gets a whole number (at least 1) of float32 elements.
 *
 * Data: val(salt, rank, i) is an integer in [-64, 63] stored as float32, so sums over any
 * plausible number of ranks are exact and results are compared bit for bit (#wrong counts the
 * elements that differ, summed over ranks). */
#ifndef TDIST_BENCH_COLLECTIVES_COMMON_H
#define TDIST_BENCH_COLLECTIVES_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef enum {
  COLL_ALL_REDUCE = 0,
  COLL_ALL_GATHER,
  COLL_REDUCE_SCATTER,
  COLL_BROADCAST,
  COLL_ALL_TO_ALL,
  COLL_COUNT
} bench_coll_t;

#define BENCH_MAX_SIZES 32

extern const char *const bench_coll_names[COLL_COUNT];

typedef struct {
  int colls[COLL_COUNT];
  int ncolls;
  size_t sizes[BENCH_MAX_SIZES];
  int iters[BENCH_MAX_SIZES];
  int warmup[BENCH_MAX_SIZES];
  int nsizes;
} bench_plan_t;

/* "all_reduce" -> COLL_ALL_REDUCE; -1 if unknown. */
int bench_coll_parse(const char *name);

/* Fills the plan from the comma lists given on a worker's command line. 0 or -1 (message on
 * stderr). */
int bench_plan_parse(bench_plan_t *p, const char *colls, const char *sizes, const char *iters,
                     const char *warmup);

/* Total float32 elements of the operation for `bytes` with n ranks (see the top comment). */
size_t bench_total_count(bench_coll_t c, size_t bytes, int n);
/* busbw = algbw * factor (nccl-tests, doc/PERFORMANCE.md). */
double bench_busbw_factor(bench_coll_t c, int n);

/* The data pattern; exact small integers. */
static inline float bench_val(uint64_t salt, uint64_t rank, uint64_t i) {
  uint64_t h = i * 2654435761ull + rank * 40503ull + salt * 97ull;
  return (float)((int)((h >> 5) & 127) - 64);
}

/* Runs one collective: all_reduce and broadcast (root 0) work in place on `out` (count = total
 * elements); all_gather, reduce_scatter and all_to_all take `count` = elements per rank block
 * (the API's count). Returns 0, or non-zero after printing why. */
typedef int (*bench_run_fn)(void *ctx, bench_coll_t c, float *out, const float *in, size_t count);

/* After a start-up warm-up (0.3 s of one-float all_reduces, see bench_common.c), for each
 * collective and size of the plan: warm-up iterations, one checked iteration on the
 * pattern data, then timed iterations (each one timed on its own; all_reduce runs on zeros so the
 * in-place sums stay bounded). Writes one TSV line per cell to `tsv`:
 *   impl nranks rank coll bytes total_count median_ns min_ns wrong iters
 * Returns 0, or the first non-zero from `run`. */
int bench_sweep(const bench_plan_t *p, int n, int rank, bench_run_fn run, void *ctx, FILE *tsv,
                const char *impl);

#endif
