/* Async sends and receives progress in any posting order (issue 32: PyTorch's
 * batch_isend_irecv with each rank's irecv before its isend deadlocked), on real processes over
 * every transport (shared memory with single copies where process_vm_readv is allowed,
 * shared-memory rings only, TCP), with random data checked byte for byte:
 *   A. receive first: both ranks post an irecv from the other, pause (so the worker has started
 *      the receive alone), then post the matching isend; every size from 1 byte to 8 MiB (over
 *      a shared-memory ring, and over the single-copy threshold), then waits in a random order;
 *   M. many in flight: both ranks post 24 irecvs of random sizes (0 B to 3 MiB) on 4 tags, then
 *      the 24 isends, then wait for all in a random order;
 *   L. a receive whose send comes only after more work: rank 0 posts irecv(tag 1), irecv(tag 2)
 *      and only then the isend (or a blocking send) that rank 1 waits for before it sends tags 2
 *      and 1; a blocking send after a pending irecv joins it instead of waiting for it;
 *   R. a ring of 3 ranks, each receiving from its left before sending to its right;
 *   T. the root cause after such a hang in a group of 2: rank 0 (timeout 1 s) times out in an
 *      irecv nobody sends; rank 1 (timeout 60 s) sees rank 0 hang up and must report rank 0's
 *      timeout, not only "closed its connection";
 *   K. failures while sends and receives wait together: tdist_pg_abort from another thread ends
 *      rank 0's pending irecv and isend with TDIST_ERR_ABORTED, and a later isend fails fast;
 *      rank 1, leaving without closing its group (as a crash does) while rank 0 waits in an
 *      irecv from it posted before its isend, makes both fail with TDIST_ERR_REMOTE naming it.
 * The seed is printed; TDIST_TEST_SEED=N replays a run. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "logcap.h"
#include "ranks.h"
#include "rng.h"

#define TIMEOUT_MS 20000 /* a deadlock fails within this, not at the runner's limit */

static uint64_t g_seed;

static uint8_t byte_of(uint64_t stream, size_t i) {
  return (uint8_t)(tdist_test_rand(g_seed, stream, i / 8) >> (8 * (i % 8)));
}
static void fill(uint8_t *p, size_t n, uint64_t stream) {
  for (size_t i = 0; i < n; i++) p[i] = byte_of(stream, i);
}
static int same(const uint8_t *p, size_t n, uint64_t stream) {
  for (size_t i = 0; i < n; i++)
    if (p[i] != byte_of(stream, i)) {
      TEST_LOG("  byte %zu of %zu (stream %llu) differs", i, n, (unsigned long long)stream);
      return 0;
    }
  return 1;
}
/* The data stream of message i from rank `from` (every rank derives it alike). */
static uint64_t stream_of(int from, int i) { return 1000u * (uint64_t)from + (uint64_t)i; }

static void wait_ok(tdist_pg_t *pg, tdist_work_t *w) {
  CHECK_OK_MSG(tdist_work_wait(w, -1), tdist_pg_last_error(pg));
  tdist_work_destroy(w);
}

/* Waits for the n works in an order drawn from (seed, rank, salt). */
static void wait_all_shuffled(tdist_pg_t *pg, tdist_work_t **w, int n, int rank, int salt) {
  int order[64];
  for (int i = 0; i < n; i++) order[i] = i;
  for (int i = n - 1; i > 0; i--) {
    int j = (int)(tdist_test_rand(g_seed, 7000 + (uint64_t)rank, (uint64_t)(salt * 64 + i)) %
                  (uint64_t)(i + 1));
    int t = order[i];
    order[i] = order[j];
    order[j] = t;
  }
  for (int i = 0; i < n; i++) wait_ok(pg, w[order[i]]);
}

/* ---- A: receive first, every size ------------------------------------------------------- */

static const size_t k_sizes[] = {1,      32,      1000,          4099,    65536,
                                 262145, 1 << 20, (3 << 20) + 5, 8u << 20};
#define NSIZES (int)(sizeof k_sizes / sizeof k_sizes[0])

static int body_a(int rank, int world, int port, void *arg) {
  (void)arg;
  tdist_store_t *store;
  tdist_pg_t *pg = tdist_test_init_pg(rank, world, port, TIMEOUT_MS, &store);
  int peer = 1 - rank;
  for (int i = 0; i < NSIZES; i++) {
    size_t n = k_sizes[i];
    uint8_t *in = malloc(n), *out = malloc(n);
    CHECK(in && out);
    fill(out, n, stream_of(rank, i));
    tdist_work_t *w[2];
    CHECK_OK_MSG(tdist_recv_async(pg, in, n, TDIST_UINT8, peer, i % 3, &w[0]),
                 tdist_pg_last_error(pg));
    usleep(2000); /* the worker has taken the receive, alone, by now (before: it waited in it) */
    CHECK_OK_MSG(tdist_send_async(pg, out, n, TDIST_UINT8, peer, i % 3, &w[1]),
                 tdist_pg_last_error(pg));
    wait_all_shuffled(pg, w, 2, rank, i);
    CHECK(same(in, n, stream_of(peer, i)));
    free(in);
    free(out);
  }
  tdist_pg_destroy(pg);
  tdist_store_destroy(store);
  return 0;
}

/* ---- M: many in flight ------------------------------------------------------------------ */

enum { M_MSGS = 24 };

static size_t m_len(int from, int i) {
  uint64_t r = tdist_test_rand(g_seed, 2000 + (uint64_t)from, (uint64_t)i);
  switch (r % 4) {
    case 0: return r % 3 ? 1 + (r >> 8) % 100 : 0;
    case 1: return 1 + (r >> 8) % 65536;
    case 2: return (256u << 10) + (r >> 8) % (768u << 10);
    default: return (3u << 20) - (r >> 8) % 4096;
  }
}
static int m_tag(int from, int i) {
  return (int)(tdist_test_rand(g_seed, 2100 + (uint64_t)from, (uint64_t)i) % 4);
}

static int body_m(int rank, int world, int port, void *arg) {
  (void)arg;
  tdist_store_t *store;
  tdist_pg_t *pg = tdist_test_init_pg(rank, world, port, TIMEOUT_MS, &store);
  int peer = 1 - rank;
  uint8_t *in[M_MSGS], *out[M_MSGS];
  tdist_work_t *w[2 * M_MSGS];
  for (int i = 0; i < M_MSGS; i++) {
    in[i] = malloc(m_len(peer, i) + 1);
    out[i] = malloc(m_len(rank, i) + 1);
    CHECK(in[i] && out[i]);
    fill(out[i], m_len(rank, i), stream_of(rank, i));
  }
  /* Receives in the peer's sending order (messages of one tag arrive in that order). */
  for (int i = 0; i < M_MSGS; i++) {
    CHECK_OK_MSG(
        tdist_recv_async(pg, in[i], m_len(peer, i), TDIST_UINT8, peer, m_tag(peer, i), &w[i]),
        tdist_pg_last_error(pg));
    if (i == 0) usleep(2000);
  }
  for (int i = 0; i < M_MSGS; i++)
    CHECK_OK_MSG(tdist_send_async(pg, out[i], m_len(rank, i), TDIST_UINT8, peer, m_tag(rank, i),
                                  &w[M_MSGS + i]),
                 tdist_pg_last_error(pg));
  wait_all_shuffled(pg, w, 2 * M_MSGS, rank, 99);
  for (int i = 0; i < M_MSGS; i++) {
    CHECK(same(in[i], m_len(peer, i), stream_of(peer, i)));
    free(in[i]);
    free(out[i]);
  }
  /* The group still runs collectives in order afterwards. */
  int64_t v = rank + 1;
  CHECK_OK_MSG(tdist_all_reduce(pg, &v, 1, TDIST_INT64, TDIST_SUM), tdist_pg_last_error(pg));
  CHECK_EQ_INT(v, 3);
  tdist_pg_destroy(pg);
  tdist_store_destroy(store);
  return 0;
}

/* ---- L: a receive whose send comes after more work ---------------------------------------- */

static int body_l(int rank, int world, int port, void *arg) {
  int blocking = *(int *)arg;
  tdist_store_t *store;
  tdist_pg_t *pg = tdist_test_init_pg(rank, world, port, TIMEOUT_MS, &store);
  size_t n1 = 32, n2 = 70000, n3 = 2u << 20;
  uint8_t *a = malloc(n1), *b = malloc(n2), *c = malloc(n3);
  CHECK(a && b && c);
  if (rank == 0) {
    tdist_work_t *w[3];
    fill(c, n3, stream_of(0, 3));
    CHECK_OK_MSG(tdist_recv_async(pg, a, n1, TDIST_UINT8, 1, 1, &w[0]), tdist_pg_last_error(pg));
    usleep(2000);
    CHECK_OK_MSG(tdist_recv_async(pg, b, n2, TDIST_UINT8, 1, 2, &w[1]), tdist_pg_last_error(pg));
    usleep(2000);
    if (blocking) {
      CHECK_OK_MSG(tdist_send(pg, c, n3, TDIST_UINT8, 1, 3), tdist_pg_last_error(pg));
      wait_all_shuffled(pg, w, 2, rank, 5);
    } else {
      CHECK_OK_MSG(tdist_send_async(pg, c, n3, TDIST_UINT8, 1, 3, &w[2]), tdist_pg_last_error(pg));
      wait_all_shuffled(pg, w, 3, rank, 5);
    }
    CHECK(same(a, n1, stream_of(1, 1)));
    CHECK(same(b, n2, stream_of(1, 2)));
  } else {
    fill(a, n1, stream_of(1, 1));
    fill(b, n2, stream_of(1, 2));
    CHECK_OK_MSG(tdist_recv(pg, c, n3, TDIST_UINT8, 0, 3), tdist_pg_last_error(pg));
    CHECK(same(c, n3, stream_of(0, 3)));
    CHECK_OK_MSG(tdist_send(pg, b, n2, TDIST_UINT8, 0, 2), tdist_pg_last_error(pg));
    CHECK_OK_MSG(tdist_send(pg, a, n1, TDIST_UINT8, 0, 1), tdist_pg_last_error(pg));
  }
  CHECK_OK_MSG(tdist_barrier(pg), tdist_pg_last_error(pg));
  free(a);
  free(b);
  free(c);
  tdist_pg_destroy(pg);
  tdist_store_destroy(store);
  return 0;
}

/* ---- R: a ring of 3, receive from the left first ---------------------------------------- */

static int body_r(int rank, int world, int port, void *arg) {
  (void)arg;
  tdist_store_t *store;
  tdist_pg_t *pg = tdist_test_init_pg(rank, world, port, TIMEOUT_MS, &store);
  int left = (rank + world - 1) % world, right = (rank + 1) % world;
  static const size_t sizes[] = {32, 5000, 1u << 20};
  for (int i = 0; i < 3; i++) {
    size_t n = sizes[i];
    uint8_t *in = malloc(n), *out = malloc(n);
    CHECK(in && out);
    fill(out, n, stream_of(rank, 50 + i));
    tdist_work_t *w[2];
    CHECK_OK_MSG(tdist_recv_async(pg, in, n, TDIST_UINT8, left, 0, &w[0]), tdist_pg_last_error(pg));
    usleep(2000);
    CHECK_OK_MSG(tdist_send_async(pg, out, n, TDIST_UINT8, right, 0, &w[1]),
                 tdist_pg_last_error(pg));
    wait_all_shuffled(pg, w, 2, rank, 200 + i);
    CHECK(same(in, n, stream_of(left, 50 + i)));
    free(in);
    free(out);
  }
  tdist_pg_destroy(pg);
  tdist_store_destroy(store);
  return 0;
}

/* ---- T: the survivor of a 2-rank hang names the timeout --------------------------------- */

static int body_t(int rank, int world, int port, void *arg) {
  (void)arg;
  tdist_store_t *store;
  tdist_pg_t *pg = tdist_test_init_pg(rank, world, port, rank == 0 ? 1000 : 60000, &store);
  uint8_t buf[32];
  tdist_work_t *w;
  CHECK_OK_MSG(tdist_recv_async(pg, buf, sizeof buf, TDIST_UINT8, 1 - rank, 0, &w),
               tdist_pg_last_error(pg));
  tdist_status_t st = tdist_work_wait(w, -1);
  tdist_work_destroy(w);
  TEST_LOG("  T: rank %d: %s", rank, tdist_pg_last_error(pg));
  CHECK_EQ_INT(st, TDIST_ERR_TIMEOUT);
  CHECK_HAS(tdist_pg_last_error(pg), "timed out after 1000 ms waiting for rank");
  if (rank == 1) CHECK_HAS(tdist_pg_last_error(pg), "first seen by rank 0");
  tdist_pg_destroy(pg);
  tdist_store_destroy(store);
  return 0;
}

/* ---- K: abort and a killed peer while sends and receives wait ----------------------------- */

static void *abort_later(void *arg) {
  usleep(200000);
  tdist_pg_abort(arg);
  return NULL;
}

static int body_k(int rank, int world, int port, void *arg) {
  int kill_peer = *(int *)arg;
  tdist_store_t *store;
  tdist_pg_t *pg = tdist_test_init_pg(rank, world, port, 60000, &store);
  uint8_t in[64], out[64] = {1};
  void *v = NULL;
  size_t vl = 0;
  if (rank == 1) {
    /* The kill: once rank 0's receive and send wait, leave as a crash does (the sockets and
     * rings close with the process). Else stay until rank 0 is done with its aborted group. */
    CHECK_OK(tdist_store_get(store, kill_peer ? "k_posted" : "k_done", &v, &vl));
    free(v);
    if (kill_peer) _exit(0);
    tdist_pg_destroy(pg);
    tdist_store_destroy(store);
    return 0;
  }
  tdist_work_t *w[2];
  CHECK_OK_MSG(tdist_recv_async(pg, in, sizeof in, TDIST_UINT8, 1, 0, &w[0]),
               tdist_pg_last_error(pg));
  /* Larger than the socket and ring buffers take at once: it waits for rank 1 too. */
  static uint8_t huge[4 << 20];
  CHECK_OK_MSG(tdist_send_async(pg, huge, sizeof huge, TDIST_UINT8, 1, 0, &w[1]),
               tdist_pg_last_error(pg));
  CHECK_OK(tdist_store_set(store, "k_posted", "1", 1));
  pthread_t th;
  if (!kill_peer) CHECK(pthread_create(&th, NULL, abort_later, pg) == 0);
  tdist_status_t want_st = kill_peer ? TDIST_ERR_REMOTE : TDIST_ERR_ABORTED;
  for (int i = 0; i < 2; i++) {
    tdist_status_t st = tdist_work_wait(w[i], -1);
    TEST_LOG("  K: %s: %s", i ? "isend" : "irecv", tdist_pg_last_error(pg));
    CHECK_EQ_INT(st, want_st);
    if (kill_peer) CHECK_HAS(tdist_pg_last_error(pg), "rank 1");
    tdist_work_destroy(w[i]);
  }
  if (!kill_peer) CHECK(pthread_join(th, NULL) == 0);
  tdist_work_t *late;
  tdist_status_t st = tdist_send_async(pg, out, sizeof out, TDIST_UINT8, 1, 0, &late);
  if (st == TDIST_OK) {
    st = tdist_work_wait(late, -1);
    tdist_work_destroy(late);
  }
  CHECK_EQ_INT(st, want_st);
  CHECK_OK(tdist_store_set(store, "k_done", "1", 1));
  tdist_pg_destroy(pg);
  tdist_store_destroy(store);
  return 0;
}

static int want(char scenario) {
  const char *only = getenv("P2P_ONLY");
  return !only || strchr(only, scenario) || strchr(only, scenario - 'A' + 'a');
}

int main(void) {
  logcap_enable_debug();
  g_seed = test_rng_init("p2p_post_order_test", 0);
  for (int pass = 0; pass < 3; pass++) {
    setenv("TDIST_SHM", pass < 2 ? "1" : "0", 1);
    setenv("TDIST_SHM_SINGLE_COPY", pass == 0 ? "1" : "0", 1);
    TEST_LOG("transport: %s", pass == 0   ? "shared memory, single copies where allowed"
                              : pass == 1 ? "shared memory, rings only"
                                          : "TCP");
    if (want('A')) {
      TEST_LOG("A: irecv before isend on both ranks, 1 B to 8 MiB");
      CHECK_EQ_INT(tdist_test_run_ranks(2, 120000, body_a, NULL), 0);
    }
    if (want('M')) {
      TEST_LOG("M: 24 irecvs then 24 isends on each rank, 4 tags");
      CHECK_EQ_INT(tdist_test_run_ranks(2, 120000, body_m, NULL), 0);
    }
    if (want('L')) {
      for (int blocking = 0; blocking < 2; blocking++) {
        TEST_LOG("L: the send a pending receive depends on comes later (%s)",
                 blocking ? "a blocking send" : "an isend");
        CHECK_EQ_INT(tdist_test_run_ranks(2, 120000, body_l, &blocking), 0);
      }
    }
    if (want('R')) {
      TEST_LOG("R: ring of 3, receive from the left first");
      CHECK_EQ_INT(tdist_test_run_ranks(3, 120000, body_r, NULL), 0);
    }
    if (want('K')) {
      TEST_LOG("K: abort, and a killed peer, while an irecv and an isend wait");
      for (int kill_peer = 0; kill_peer < 2; kill_peer++)
        CHECK_EQ_INT(tdist_test_run_ranks(2, 120000, body_k, &kill_peer), 0);
    }
    if (want('T') && pass > 0) {
      TEST_LOG("T: after a hang in a group of 2, the survivor reports the timeout");
      CHECK_EQ_INT(tdist_test_run_ranks(2, 120000, body_t, NULL), 0);
    }
  }
  TEST_LOG("p2p_post_order_test: all passed");
  return 0;
}
