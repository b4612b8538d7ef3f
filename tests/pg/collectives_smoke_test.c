/* Smoke test of every collective on real processes, over shared memory and over TCP: world
 * sizes 1..5, int64 data (exact reference), each result checked against a reference computed
 * independently from the same deterministic inputs. all_reduce runs its algorithms by size
 * (recursive doubling up to 64 KiB, above it the ring at 2 ranks and the direct algorithm at 3
 * and more, all on one host), and every rank checks in its own debug log
 * (tests/testlib/logcap.h) that the transport it meant (shared memory or TCP only) and each
 * algorithm really ran. The full dtype/op/algorithm sweep lives in collectives_sweep_test. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "logcap.h"
#include "ranks.h"

#define N 1003     /* odd, larger than any world size; 8024 bytes: recursive doubling */
#define NRING 9001 /* 72008 bytes, past the 64 KiB recursive-doubling limit: the ring */
#define NBUF (NRING > N * 5 ? NRING : N * 5)

static int64_t val(int rank, size_t i) {
  return (int64_t)(tdist_test_rand(7, (uint64_t)rank, i) % 1000) - 500;
}

static int body(int rank, int world, int port, void *arg) {
  int shm = *(const int *)arg;
  logcap_begin("smoke");
  tdist_store_t *store;
  tdist_pg_t *pg = tdist_test_init_pg(rank, world, port, 20000, &store);
  CHECK_EQ_INT(tdist_pg_rank(pg), rank);
  CHECK_EQ_INT(tdist_pg_size(pg), world);
  int64_t *buf = malloc(sizeof(int64_t) * NBUF);
  int64_t *out = malloc(sizeof(int64_t) * NBUF);
  int64_t *in = malloc(sizeof(int64_t) * NBUF);

  /* all_reduce sum, both algorithms by size: recursive doubling for 1, 7 and N, the ring for
   * NRING (0 moves nothing) */
  size_t counts[] = {0, 1, 7, N, NRING};
  for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++) {
    size_t n = counts[c];
    for (size_t i = 0; i < n; i++) buf[i] = val(rank, i);
    CHECK_OK_MSG(tdist_all_reduce(pg, buf, n, TDIST_INT64, TDIST_SUM), tdist_pg_last_error(pg));
    for (size_t i = 0; i < n; i++) {
      int64_t want = 0;
      for (int r = 0; r < world; r++) want += val(r, i);
      CHECK_EQ_INT(buf[i], want);
    }
  }
  /* max */
  for (size_t i = 0; i < N; i++) buf[i] = val(rank, i);
  CHECK_OK_MSG(tdist_all_reduce(pg, buf, N, TDIST_INT64, TDIST_MAX), tdist_pg_last_error(pg));
  for (size_t i = 0; i < N; i++) {
    int64_t want = val(0, i);
    for (int r = 1; r < world; r++) want = val(r, i) > want ? val(r, i) : want;
    CHECK_EQ_INT(buf[i], want);
  }
  /* broadcast from every root */
  for (int root = 0; root < world; root++) {
    for (size_t i = 0; i < N; i++) buf[i] = rank == root ? val(root + 10, i) : -1;
    CHECK_OK_MSG(tdist_broadcast(pg, buf, N, TDIST_INT64, root), tdist_pg_last_error(pg));
    for (size_t i = 0; i < N; i++) CHECK_EQ_INT(buf[i], val(root + 10, i));
  }
  /* reduce to every root */
  for (int root = 0; root < world; root++) {
    for (size_t i = 0; i < N; i++) buf[i] = val(rank, i);
    CHECK_OK_MSG(tdist_reduce(pg, buf, N, TDIST_INT64, TDIST_SUM, root), tdist_pg_last_error(pg));
    if (rank == root)
      for (size_t i = 0; i < N; i++) {
        int64_t want = 0;
        for (int r = 0; r < world; r++) want += val(r, i);
        CHECK_EQ_INT(buf[i], want);
      }
  }
  /* all_gather */
  for (size_t i = 0; i < N; i++) in[i] = val(rank, i);
  CHECK_OK_MSG(tdist_all_gather(pg, out, in, N, TDIST_INT64), tdist_pg_last_error(pg));
  for (int r = 0; r < world; r++)
    for (size_t i = 0; i < N; i++) CHECK_EQ_INT(out[(size_t)r * N + i], val(r, i));
  /* gather + scatter */
  for (int root = 0; root < world; root++) {
    memset(out, 0, sizeof(int64_t) * N * (size_t)world);
    CHECK_OK_MSG(tdist_gather(pg, rank == root ? out : NULL, in, N, TDIST_INT64, root),
                 tdist_pg_last_error(pg));
    if (rank == root)
      for (int r = 0; r < world; r++)
        for (size_t i = 0; i < N; i++) CHECK_EQ_INT(out[(size_t)r * N + i], val(r, i));
    if (rank == root)
      for (size_t i = 0; i < N * (size_t)world; i++) in[i] = (int64_t)i * 3 + root;
    CHECK_OK_MSG(tdist_scatter(pg, buf, rank == root ? in : NULL, N, TDIST_INT64, root),
                 tdist_pg_last_error(pg));
    for (size_t i = 0; i < N; i++) CHECK_EQ_INT(buf[i], (int64_t)((size_t)rank * N + i) * 3 + root);
    for (size_t i = 0; i < N; i++) in[i] = val(rank, i);
  }
  /* reduce_scatter */
  for (size_t i = 0; i < N * (size_t)world; i++) in[i] = val(rank, i);
  CHECK_OK_MSG(tdist_reduce_scatter(pg, buf, in, N, TDIST_INT64, TDIST_SUM),
               tdist_pg_last_error(pg));
  for (size_t i = 0; i < N; i++) {
    int64_t want = 0;
    for (int r = 0; r < world; r++) want += val(r, (size_t)rank * N + i);
    CHECK_EQ_INT(buf[i], want);
  }
  /* all_to_all: block j of rank r is val(r, j*N+i) */
  CHECK_OK_MSG(tdist_all_to_all(pg, out, in, N, TDIST_INT64), tdist_pg_last_error(pg));
  for (int r = 0; r < world; r++)
    for (size_t i = 0; i < N; i++)
      CHECK_EQ_INT(out[(size_t)r * N + i], val(r, (size_t)rank * N + i));
  CHECK_OK_MSG(tdist_barrier(pg), tdist_pg_last_error(pg));
  /* send/recv ring */
  if (world > 1) {
    int right = (rank + 1) % world, left = (rank + world - 1) % world;
    for (size_t i = 0; i < N; i++) in[i] = val(rank + 100, i);
    if (rank % 2 == 0) {
      CHECK_OK_MSG(tdist_send(pg, in, N, TDIST_INT64, right, 5), tdist_pg_last_error(pg));
      CHECK_OK_MSG(tdist_recv(pg, buf, N, TDIST_INT64, left, 5), tdist_pg_last_error(pg));
    } else {
      CHECK_OK_MSG(tdist_recv(pg, buf, N, TDIST_INT64, left, 5), tdist_pg_last_error(pg));
      CHECK_OK_MSG(tdist_send(pg, in, N, TDIST_INT64, right, 5), tdist_pg_last_error(pg));
    }
    for (size_t i = 0; i < N; i++) CHECK_EQ_INT(buf[i], val(left + 100, i));
  }
  /* async all_reduce overlapped */
  tdist_work_t *w[3];
  int64_t *bufs[3];
  for (int k = 0; k < 3; k++) {
    bufs[k] = malloc(sizeof(int64_t) * N);
    for (size_t i = 0; i < N; i++) bufs[k][i] = val(rank, i) + k;
    CHECK_OK(tdist_all_reduce_async(pg, bufs[k], N, TDIST_INT64, TDIST_SUM, &w[k]));
  }
  for (int k = 0; k < 3; k++) {
    CHECK_OK_MSG(tdist_work_wait(w[k], -1), tdist_pg_last_error(pg));
    tdist_work_destroy(w[k]);
    for (size_t i = 0; i < N; i++) {
      int64_t want = 0;
      for (int r = 0; r < world; r++) want += val(r, i) + k;
      CHECK_EQ_INT(bufs[k][i], want);
    }
    free(bufs[k]);
  }
  CHECK_OK_MSG(tdist_monitored_barrier(pg, 5000), tdist_pg_last_error(pg));
  tdist_pg_destroy(pg);
  tdist_store_destroy(store);
  free(buf);
  free(out);
  free(in);
  /* What ran: all_reduce of 1, 7, N, N (max) and 3 x N (async) by recursive doubling, NRING by
   * the ring at 2 ranks and by the direct algorithm at 3 and more (all of them on this host; a
   * world of 1 moves nothing); shared memory between every pair, or none. */
  char *log = logcap_end();
  logcap_expect_transport(log, rank, world, shm, 1);
  logcap_expect_algos3(log, rank, world == 2 ? 1 : 0, world > 1 ? 7 : 0, world > 2 ? 1 : 0);
  free(log);
  return 0;
}

/* file:// init: every rank opens the same file store; all_reduce must agree. */
static int file_body(int rank, int world, int port, void *arg) {
  (void)port;
  char im[600];
  snprintf(im, sizeof im, "file://%s?rank=%d&world_size=%d", (const char *)arg, rank, world);
  tdist_pg_options_t po = TDIST_PG_OPTIONS_INIT;
  po.init_method = im;
  po.timeout_ms = 20000;
  tdist_pg_t *pg = NULL;
  CHECK_OK(tdist_init_process_group(&po, &pg));
  int64_t v[5];
  for (int i = 0; i < 5; i++) v[i] = val(rank, (size_t)i);
  CHECK_OK_MSG(tdist_all_reduce(pg, v, 5, TDIST_INT64, TDIST_SUM), tdist_pg_last_error(pg));
  for (int i = 0; i < 5; i++) {
    int64_t want = 0;
    for (int r = 0; r < world; r++) want += val(r, (size_t)i);
    CHECK_EQ_INT(v[i], want);
  }
  tdist_pg_destroy(pg);
  return 0;
}

/* The socket_ifname option: "lo" works; an interface that does not exist is a clear error. */
static int ifname_body(int rank, int world, int port, void *arg) {
  tdist_store_t *store;
  tdist_tcp_store_options_t co = TDIST_TCP_STORE_OPTIONS_INIT;
  co.host = "127.0.0.1";
  co.port = port;
  CHECK_OK(tdist_tcp_store_connect(&co, &store));
  tdist_pg_options_t po = TDIST_PG_OPTIONS_INIT;
  po.store = store;
  po.rank = rank;
  po.world_size = world;
  po.timeout_ms = 20000;
  po.socket_ifname = (const char *)arg;
  tdist_pg_t *pg = NULL;
  tdist_status_t st = tdist_init_process_group(&po, &pg);
  if (strcmp((const char *)arg, "lo") == 0) {
    CHECK_OK(st);
    int64_t v = rank + 1;
    CHECK_OK_MSG(tdist_all_reduce(pg, &v, 1, TDIST_INT64, TDIST_SUM), tdist_pg_last_error(pg));
    CHECK_EQ_INT(v, world * (world + 1) / 2);
  } else {
    CHECK_EQ_INT(st, TDIST_ERR_INVALID_ARGUMENT);
    CHECK(strstr(tdist_last_error(), "socket_ifname option 'tdist-no-such0'") != NULL);
  }
  tdist_pg_destroy(pg);
  tdist_store_destroy(store);
  return 0;
}

int main(void) {
  logcap_enable_debug();
  TEST_LOG("socket_ifname lo / missing interface, world 2");
  CHECK(tdist_test_run_ranks(2, 60000, ifname_body, "lo") == 0);
  CHECK(tdist_test_run_ranks(2, 60000, ifname_body, "tdist-no-such0") == 0);
  const char *tmp = getenv("TEST_TMPDIR") ? getenv("TEST_TMPDIR") : "/tmp";
  char path[512];
  snprintf(path, sizeof path, "%s/filestore.%d", tmp, (int)getpid());
  unlink(path);
  TEST_LOG("file:// init, world 3");
  CHECK(tdist_test_run_ranks(3, 60000, file_body, path) == 0);
  unlink(path);

  int worlds[] = {1, 2, 3, 4, 5};
  /* Same-host ranks use shared memory by default; TDIST_SHM=0 forces TCP between them. */
  const char *modes[] = {"1", "0"};
  for (int m = 0; m < 2; m++) {
    setenv("TDIST_SHM", modes[m], 1);
    int shm = m == 0;
    for (size_t k = 0; k < sizeof worlds / sizeof worlds[0]; k++) {
      TEST_LOG("world %d, TDIST_SHM=%s", worlds[k], modes[m]);
      CHECK(tdist_test_run_ranks(worlds[k], 60000, body, &shm) == 0);
    }
  }
  TEST_LOG("ok");
  return 0;
}
