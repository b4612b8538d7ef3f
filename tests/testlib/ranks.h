/* Runs test ranks as real processes over real sockets: the parent hosts a TCPStore server on an
 * ephemeral port and forks one child per rank; each child runs the test function and exits with
 * its return value. Everything is bounded by a timeout: on expiry the parent SIGKILLs every child
 * and reports which ranks had not finished. */
#ifndef TDIST_TESTLIB_RANKS_H
#define TDIST_TESTLIB_RANKS_H

#include <stdint.h>

#include "tdist/tdist.h"

/* Return 0 for success. Runs in a child process. */
typedef int (*tdist_test_rank_fn)(int rank, int world, int store_port, void *arg);

/* 0 if every rank exited 0; otherwise prints each failing rank's status and returns 1. */
int tdist_test_run_ranks(int world, int64_t timeout_ms, tdist_test_rank_fn fn, void *arg);

/* In a child: connects to the parent's store and creates the process group (gloo). Exits the
 * child with a message on failure. The store handle is returned through *store (destroy it after
 * the group). */
tdist_pg_t *tdist_test_init_pg(int rank, int world, int store_port, int64_t timeout_ms,
                               tdist_store_t **store);

/* Deterministic per-(seed, rank, i) pseudo-random numbers for test data. */
uint64_t tdist_test_rand(uint64_t seed, uint64_t rank, uint64_t i);

#endif
