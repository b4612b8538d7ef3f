/* tdist_init_process_group: argument and environment errors with PyTorch's exact messages
 * (torch-contracts.md §2.9: env:// checks RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT in that
 * order; an empty variable counts as unset; the URL query and the explicit arguments take
 * precedence over RANK/WORLD_SIZE), then real rendezvous over real processes:
 *   env://           rank 0 hosts the store on MASTER_PORT, 3 processes all_reduce;
 *   tcp://H:P?rank=R&world_size=N, and tcp://H:P with rank/world_size as arguments (bogus
 *                    RANK/WORLD_SIZE in the environment must be ignored);
 *   agent store      TORCHELASTIC_USE_AGENT_STORE=True with a store served by a separate
 *                    "agent" process and TORCHELASTIC_RESTART_COUNT=3: no worker hosts, and the
 *                    group's keys land under "/worker/attempt_3/default_pg/" (read back with a
 *                    tdist TCP client, which, like PyTorch's, sends every key with a leading "/":
 *                    the wire key is "//worker/attempt_3/default_pg/...", what PyTorch 1.13
 *                    workers write, §2.3).
 * Options sizes: a caller built against version 1 of tdist_pg_options_t (smaller: no
 * socket_ifname) gets a working group of 2 ranks with that field's default, a newer caller's
 * larger struct works, and a size below version 1's or a version below 1 is refused with a
 * message naming both.
 * The agent-store check names the gloo transport's address keys (gloo/<rank>); if the backend's
 * key layout changes, update KEY_FMT. Free ports come from binding port 0 and closing it. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "clock.h"
#include "ports.h"
#include "proc.h"
#include "ranks.h"

#define KEY_FMT "/worker/attempt_3/default_pg/gloo/%d"
#define ENV_PREFIX "Error initializing torch.distributed using env:// rendezvous: "
#define N 4099

static const char *const k_env[] = {"RANK",
                                    "WORLD_SIZE",
                                    "MASTER_ADDR",
                                    "MASTER_PORT",
                                    "TORCHELASTIC_USE_AGENT_STORE",
                                    "TORCHELASTIC_RESTART_COUNT",
                                    "TDIST_DEBUG"};

static void clear_env(void) {
  for (size_t i = 0; i < sizeof k_env / sizeof k_env[0]; i++) unsetenv(k_env[i]);
}

/* Runs init with `o` and expects failure `want` with exactly `msg` (or, when prefix is set,
 * a message that starts with msg; when contains is set, one that contains msg). */
enum { EXACT, PREFIX, CONTAINS };
static void expect_fail(int line, const tdist_pg_options_t *o, tdist_status_t want, int how,
                        const char *msg) {
  tdist_pg_t *pg = (tdist_pg_t *)(uintptr_t)1;
  tdist_status_t st = tdist_init_process_group(o, &pg);
  const char *got = tdist_last_error();
  int ok = st == want && pg == NULL;
  if (ok && msg) {
    if (how == EXACT)
      ok = strcmp(got, msg) == 0;
    else if (how == PREFIX)
      ok = strncmp(got, msg, strlen(msg)) == 0;
    else
      ok = strstr(got, msg) != NULL;
  }
  if (!ok) {
    fprintf(stderr,
            "pg_init_test.c:%d: expected %s with message %s\"%s\"\n  got %s (out %s) with "
            "message \"%s\"\n",
            line, tdist_status_name(want),
            how == EXACT    ? ""
            : how == PREFIX ? "starting "
                            : "containing ",
            msg ? msg : "(any)", tdist_status_name(st), pg ? "not NULL" : "NULL", got);
    if (st == TDIST_OK && pg) tdist_pg_destroy(pg);
    exit(1);
  }
}
#define EXPECT_FAIL(o, want, how, msg) expect_fail(__LINE__, o, want, how, msg)

/* ---------------------------------------------------------------------------------------- */
/* error paths (in this process; nothing listens or connects)                                */

static void test_env_errors(void) {
  tdist_pg_options_t o = TDIST_PG_OPTIONS_INIT;
  clear_env();
  /* order: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT; empty counts as unset */
  EXPECT_FAIL(&o, TDIST_ERR_INVALID_ARGUMENT, EXACT,
              ENV_PREFIX "environment variable RANK expected, but not set");
  setenv("MASTER_ADDR", "127.0.0.1", 1); /* later variables do not change the first complaint */
  setenv("MASTER_PORT", "29500", 1);
  setenv("WORLD_SIZE", "2", 1);
  setenv("RANK", "", 1);
  EXPECT_FAIL(&o, TDIST_ERR_INVALID_ARGUMENT, EXACT,
              ENV_PREFIX "environment variable RANK expected, but not set");
  clear_env();
  setenv("RANK", "0", 1);
  EXPECT_FAIL(&o, TDIST_ERR_INVALID_ARGUMENT, EXACT,
              ENV_PREFIX "environment variable WORLD_SIZE expected, but not set");
  setenv("WORLD_SIZE", "", 1);
  EXPECT_FAIL(&o, TDIST_ERR_INVALID_ARGUMENT, EXACT,
              ENV_PREFIX "environment variable WORLD_SIZE expected, but not set");
  setenv("WORLD_SIZE", "2", 1);
  EXPECT_FAIL(&o, TDIST_ERR_INVALID_ARGUMENT, EXACT,
              ENV_PREFIX "environment variable MASTER_ADDR expected, but not set");
  setenv("MASTER_ADDR", "", 1);
  EXPECT_FAIL(&o, TDIST_ERR_INVALID_ARGUMENT, EXACT,
              ENV_PREFIX "environment variable MASTER_ADDR expected, but not set");
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  EXPECT_FAIL(&o, TDIST_ERR_INVALID_ARGUMENT, EXACT,
              ENV_PREFIX "environment variable MASTER_PORT expected, but not set");
  setenv("MASTER_PORT", "", 1);
  EXPECT_FAIL(&o, TDIST_ERR_INVALID_ARGUMENT, EXACT,
              ENV_PREFIX "environment variable MASTER_PORT expected, but not set");
  setenv("MASTER_PORT", "70000", 1);
  EXPECT_FAIL(&o, TDIST_ERR_INVALID_ARGUMENT, EXACT,
              "port must have value from 0 to 65535 but was 70000.");
  setenv("MASTER_PORT", "abc", 1);
  EXPECT_FAIL(&o, TDIST_ERR_INVALID_ARGUMENT, EXACT,
              "invalid literal for int() with base 10: 'abc'");
  /* the explicit "env://" means the same as the default */
  o.init_method = "env://";
  EXPECT_FAIL(&o, TDIST_ERR_INVALID_ARGUMENT, EXACT,
              "invalid literal for int() with base 10: 'abc'");
  o.init_method = NULL;
  /* rank/world_size from the URL query or the arguments win over (missing) RANK/WORLD_SIZE:
   * the first complaint is then about MASTER_ADDR */
  clear_env();
  o.init_method = "env://?rank=0&world_size=2";
  EXPECT_FAIL(&o, TDIST_ERR_INVALID_ARGUMENT, EXACT,
              ENV_PREFIX "environment variable MASTER_ADDR expected, but not set");
  o.init_method = NULL;
  o.rank = 1;
  o.world_size = 2;
  EXPECT_FAIL(&o, TDIST_ERR_INVALID_ARGUMENT, EXACT,
              ENV_PREFIX "environment variable MASTER_ADDR expected, but not set");
  o.world_size = -1; /* rank given, world size still from the environment */
  EXPECT_FAIL(&o, TDIST_ERR_INVALID_ARGUMENT, EXACT,
              ENV_PREFIX "environment variable WORLD_SIZE expected, but not set");
  o.rank = -1;
  /* garbage in RANK: Python's int() message */
  setenv("RANK", "abc", 1);
  setenv("WORLD_SIZE", "2", 1);
  EXPECT_FAIL(&o, TDIST_ERR_INVALID_ARGUMENT, PREFIX,
              "invalid literal for int() with base 10: 'abc'");
  /* rank >= world_size, checked before anything listens (MASTER_PORT is valid here) */
  setenv("RANK", "2", 1);
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  setenv("MASTER_PORT", "1", 1);
  EXPECT_FAIL(&o, TDIST_ERR_INVALID_ARGUMENT, CONTAINS, "2");
  setenv("RANK", "5", 1);
  EXPECT_FAIL(&o, TDIST_ERR_INVALID_ARGUMENT, CONTAINS, "5");
  setenv("RANK", "0", 1);
  setenv("WORLD_SIZE", "0", 1);
  EXPECT_FAIL(&o, TDIST_ERR_INVALID_ARGUMENT, CONTAINS, "0");
  clear_env();
}

static void test_option_errors(void) {
  clear_env();
  tdist_pg_options_t o = TDIST_PG_OPTIONS_INIT;
  tdist_pg_t *pg = NULL;
  CHECK_EQ_INT(tdist_init_process_group(NULL, &pg), TDIST_ERR_INVALID_ARGUMENT);
  CHECK_EQ_INT(tdist_init_process_group(&o, NULL), TDIST_ERR_INVALID_ARGUMENT);
  /* sizes and versions: test_option_sizes */

  /* backends: validated before the init method (so with RANK etc. unset too) */
  o.backend = "mpx";
  EXPECT_FAIL(&o, TDIST_ERR_INVALID_ARGUMENT, CONTAINS, "use 'gloo', 'nccl' or 'mpi'");
  /* mpi without its plugin: not available, naming the path tried (tests/mpi runs it for real) */
  setenv("TDIST_MPI_PLUGIN", "/nonexistent/libtdist-mpi.so", 1);
  o.backend = "mpi";
  EXPECT_FAIL(&o, TDIST_ERR_NOT_AVAILABLE, CONTAINS,
              "cannot load the MPI plugin: tried /nonexistent/libtdist-mpi.so (");
  o.backend = "nccl"; /* a known backend: the init method is checked next (whether NCCL and a
                       * GPU are there is //tests/nccl's business) */
  EXPECT_FAIL(&o, TDIST_ERR_INVALID_ARGUMENT, CONTAINS, "RANK");
  o.backend = "gloo";

  /* a store and an init_method at once */
  tdist_store_t *mem = NULL;
  CHECK_OK(tdist_memory_store_create(&mem));
  o.store = mem;
  o.rank = 0;
  o.world_size = 1;
  o.init_method = "env://";
  EXPECT_FAIL(&o, TDIST_ERR_INVALID_ARGUMENT, CONTAINS, NULL);
  o.init_method = "tcp://127.0.0.1:1";
  EXPECT_FAIL(&o, TDIST_ERR_INVALID_ARGUMENT, CONTAINS, NULL);
  o.init_method = NULL;
  /* explicit store: rank and world_size are required and must agree */
  o.rank = 3;
  o.world_size = 2;
  EXPECT_FAIL(&o, TDIST_ERR_INVALID_ARGUMENT, CONTAINS, "3");
  o.rank = -1;
  EXPECT_FAIL(&o, TDIST_ERR_INVALID_ARGUMENT, CONTAINS, NULL);
  o.rank = 0;
  o.world_size = -1;
  EXPECT_FAIL(&o, TDIST_ERR_INVALID_ARGUMENT, CONTAINS, NULL);
  /* and a working one-rank group on it */
  o.world_size = 1;
  o.timeout_ms = 5000;
  CHECK_OK(tdist_init_process_group(&o, &pg));
  CHECK_EQ_INT(tdist_pg_rank(pg), 0);
  CHECK_EQ_INT(tdist_pg_size(pg), 1);
  CHECK(strcmp(tdist_pg_backend(pg), "gloo") == 0);
  CHECK_EQ_INT(tdist_pg_device(pg), -1); /* host memory */
  int64_t v[3] = {1, -2, 3};
  CHECK_OK(tdist_all_reduce(pg, v, 3, TDIST_INT64, TDIST_SUM));
  CHECK(v[0] == 1 && v[1] == -2 && v[2] == 3);
  tdist_pg_destroy(pg);
  tdist_store_destroy(mem);
  o.store = NULL;
  o.rank = o.world_size = -1;
  o.timeout_ms = -5;
  o.init_method = "tcp://127.0.0.1:1?rank=0&world_size=1";
  EXPECT_FAIL(&o, TDIST_ERR_INVALID_ARGUMENT, CONTAINS, NULL);
  o.timeout_ms = 0;

  /* tcp:// parsing */
  o.init_method = "tcp://127.0.0.1";
  EXPECT_FAIL(&o, TDIST_ERR_INVALID_ARGUMENT, CONTAINS, "port number missing");
  o.init_method = "tcp://127.0.0.1?rank=0&world_size=1";
  EXPECT_FAIL(&o, TDIST_ERR_INVALID_ARGUMENT, CONTAINS, "port number missing");
  o.init_method = "tcp://127.0.0.1:?rank=0&world_size=1";
  EXPECT_FAIL(&o, TDIST_ERR_INVALID_ARGUMENT, CONTAINS, "port number missing");
  o.init_method = "tcp://127.0.0.1:70000?rank=0&world_size=1";
  EXPECT_FAIL(&o, TDIST_ERR_INVALID_ARGUMENT, EXACT,
              "port must have value from 0 to 65535 but was 70000.");
  o.init_method = "tcp://127.0.0.1:abc?rank=0&world_size=1";
  EXPECT_FAIL(&o, TDIST_ERR_INVALID_ARGUMENT, EXACT,
              "invalid literal for int() with base 10: 'abc'");
  /* tcp:// never reads RANK/WORLD_SIZE */
  setenv("RANK", "0", 1);
  setenv("WORLD_SIZE", "1", 1);
  o.init_method = "tcp://127.0.0.1:1";
  EXPECT_FAIL(&o, TDIST_ERR_INVALID_ARGUMENT, CONTAINS, "rank");
  o.init_method = "tcp://127.0.0.1:1?rank=0";
  EXPECT_FAIL(&o, TDIST_ERR_INVALID_ARGUMENT, CONTAINS, "world_size");
  o.init_method = "tcp://127.0.0.1:1?rank=4&world_size=2";
  EXPECT_FAIL(&o, TDIST_ERR_INVALID_ARGUMENT, CONTAINS, "4");
  clear_env();
  o.init_method = "redis://127.0.0.1:1";
  EXPECT_FAIL(&o, TDIST_ERR_INVALID_ARGUMENT, CONTAINS, "redis://");
}

/* ---------------------------------------------------------------------------------------- */
/* callers built against another version of pg.h (the append-only promise)                  */

/* Version 1 of tdist_pg_options_t ended at group_name; socket_ifname was appended after. */
#define V1_SIZE (offsetof(tdist_pg_options_t, group_name) + sizeof(const char *))

/* A larger struct than this build's: what a caller built against a newer pg.h passes. */
typedef struct {
  tdist_pg_options_t o;
  unsigned char newer[32];
} newer_options_t;

/* Two ranks init with options of size *arg. socket_ifname names an interface that does not
 * exist: a caller whose struct ends before it must get the default (the interface that reaches
 * the store) and a working group; with this build's size the field is read and init fails. */
static int sized_body(int rank, int world, int port, void *arg) {
  size_t size = *(const size_t *)arg;
  tdist_store_t *store;
  tdist_tcp_store_options_t co = TDIST_TCP_STORE_OPTIONS_INIT;
  co.host = "127.0.0.1";
  co.port = port;
  CHECK_OK(tdist_tcp_store_connect(&co, &store));
  newer_options_t n;
  memset(n.newer, 0xa5, sizeof n.newer); /* fields this build does not know: ignored */
  tdist_pg_options_t *po = &n.o;
  *po = (tdist_pg_options_t)TDIST_PG_OPTIONS_INIT;
  po->size = size;
  po->store = store;
  po->rank = rank;
  po->world_size = world;
  po->timeout_ms = 20000;
  po->socket_ifname = size > sizeof(tdist_pg_options_t) ? "lo" : "tdist-no-such0";
  tdist_pg_t *pg = NULL;
  tdist_status_t st = tdist_init_process_group(po, &pg);
  if (size == sizeof(tdist_pg_options_t)) {
    CHECK_EQ_INT(st, TDIST_ERR_INVALID_ARGUMENT);
    CHECK(strstr(tdist_last_error(), "'tdist-no-such0'") != NULL);
  } else {
    CHECK_OK(st);
    int64_t v = rank + 1;
    CHECK_OK_MSG(tdist_all_reduce(pg, &v, 1, TDIST_INT64, TDIST_SUM), tdist_pg_last_error(pg));
    CHECK_EQ_INT(v, world * (world + 1) / 2);
    tdist_pg_destroy(pg);
  }
  tdist_store_destroy(store);
  return 0;
}

static void test_option_sizes(void) {
  clear_env();
  char msg[128];
  tdist_pg_options_t o = TDIST_PG_OPTIONS_INIT;
  CHECK_EQ_INT(o.size, sizeof o);
  CHECK(V1_SIZE < sizeof o); /* socket_ifname lies beyond version 1's fields */
  /* too small for version 1, or no version: refused, the message names size and version */
  size_t bad[] = {V1_SIZE - 1, sizeof(size_t) + sizeof(int), 0};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    o.size = bad[i];
    snprintf(msg, sizeof msg, "(size %zu, version 1; sizes from %zu", bad[i], (size_t)V1_SIZE);
    EXPECT_FAIL(&o, TDIST_ERR_INVALID_ARGUMENT, CONTAINS, msg);
  }
  o.size = sizeof o;
  o.version = 0;
  snprintf(msg, sizeof msg, "(size %zu, version 0;", sizeof o);
  EXPECT_FAIL(&o, TDIST_ERR_INVALID_ARGUMENT, CONTAINS, msg);
  o.version = -7;
  EXPECT_FAIL(&o, TDIST_ERR_INVALID_ARGUMENT, CONTAINS, "TDIST_PG_OPTIONS_INIT (size");
  /* version 1's size and sizes between it and this build's: socket_ifname reads as its
   * default; this build's size: it is read; a newer caller's larger size: works */
  size_t sizes[] = {V1_SIZE, sizeof o - 1, sizeof o, sizeof(newer_options_t)};
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    TEST_LOG("  options of size %zu (version 1: %zu, this build: %zu), 2 ranks", sizes[i],
             (size_t)V1_SIZE, sizeof o);
    CHECK(tdist_test_run_ranks(2, 60000, sized_body, &sizes[i]) == 0);
  }
}

/* ---------------------------------------------------------------------------------------- */
/* real rendezvous                                                                           */

typedef struct {
  int mode; /* 0 env://, 1 tcp:// with query, 2 tcp:// with arguments, 3 agent store */
  int port;
} rdzv_t;

static int64_t val(int rank, size_t i) {
  return (int64_t)(tdist_test_rand(3, (uint64_t)rank, i) % 100001) - 50000;
}

static int rdzv_body(int rank, int world, int unused_port, void *arg) {
  (void)unused_port;
  const rdzv_t *z = arg;
  clear_env();
  char num[32], url[128];
  tdist_pg_options_t o = TDIST_PG_OPTIONS_INIT;
  o.timeout_ms = 20000;
  if (z->mode == 0 || z->mode == 3) {
    snprintf(num, sizeof num, "%d", rank);
    setenv("RANK", num, 1);
    snprintf(num, sizeof num, "%d", world);
    setenv("WORLD_SIZE", num, 1);
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    snprintf(num, sizeof num, "%d", z->port);
    setenv("MASTER_PORT", num, 1);
    if (z->mode == 3) {
      setenv("TORCHELASTIC_USE_AGENT_STORE", "True", 1);
      setenv("TORCHELASTIC_RESTART_COUNT", "3", 1);
    }
  } else {
    setenv("RANK", "7", 1); /* must be ignored by tcp:// */
    setenv("WORLD_SIZE", "9", 1);
    if (z->mode == 1) {
      snprintf(url, sizeof url, "tcp://127.0.0.1:%d?rank=%d&world_size=%d", z->port, rank, world);
    } else {
      snprintf(url, sizeof url, "tcp://127.0.0.1:%d", z->port);
      o.rank = rank;
      o.world_size = world;
    }
    o.init_method = url;
  }
  tdist_pg_t *pg = NULL;
  tdist_status_t st = tdist_init_process_group(&o, &pg);
  if (st) {
    fprintf(stderr, "rank %d (mode %d): init failed: %s: %s\n", rank, z->mode,
            tdist_status_name(st), tdist_last_error());
    return 1;
  }
  CHECK_EQ_INT(tdist_pg_rank(pg), rank);
  CHECK_EQ_INT(tdist_pg_size(pg), world);
  int64_t *buf = malloc(sizeof(int64_t) * N);
  CHECK(buf != NULL);
  for (size_t i = 0; i < N; i++) buf[i] = val(rank, i);
  CHECK_OK_MSG(tdist_all_reduce(pg, buf, N, TDIST_INT64, TDIST_SUM), tdist_pg_last_error(pg));
  for (size_t i = 0; i < N; i++) {
    int64_t want = 0;
    for (int r = 0; r < world; r++) want += val(r, i);
    CHECK_EQ_INT(buf[i], want);
  }
  /* everyone is past init before rank 0 (which may host the store) tears down */
  CHECK_OK_MSG(tdist_barrier(pg), tdist_pg_last_error(pg));
  tdist_pg_destroy(pg);
  free(buf);
  return 0;
}

/* The agent's store runs in its own process, as torchrun's does (and so that this process has
 * no thread when the ranks are forked). Returns the agent's pid; *port gets the store's port;
 * the agent stops when *stop_fd is closed. */
static pid_t start_agent(int *port, int *stop_fd) {
  int up[2], down[2];
  CHECK(pipe(up) == 0 && pipe(down) == 0);
  fflush(stderr);
  pid_t pid = fork();
  CHECK(pid >= 0);
  if (pid == 0) {
    alarm(120);
    close(up[0]);
    close(down[1]);
    tdist_store_server_options_t so = TDIST_STORE_SERVER_OPTIONS_INIT;
    so.host = "127.0.0.1";
    so.quiet = 1;
    tdist_store_server_t *srv = NULL;
    int p = -1;
    if (tdist_store_server_create(&so, &srv) == TDIST_OK) p = tdist_store_server_port(srv);
    if (write(up[1], &p, sizeof p) != (ssize_t)sizeof p) _exit(2);
    char c;
    while (read(down[0], &c, 1) > 0) {
    }
    tdist_store_server_destroy(srv);
    _exit(p > 0 ? 0 : 1);
  }
  close(up[1]);
  close(down[0]);
  CHECK(read(up[0], port, sizeof *port) == (ssize_t)sizeof *port);
  close(up[0]);
  CHECK(*port > 0);
  *stop_fd = down[1];
  return pid;
}

static void test_rendezvous(int mode, const char *name) {
  rdzv_t z = {mode, 0};
  pid_t agent = -1;
  int agent_stop = -1;
  if (mode == 3)
    agent = start_agent(&z.port, &agent_stop); /* the workers only connect */
  else
    z.port = test_free_port();
  double t0 = now_s();
  int rc = tdist_test_run_ranks(3, 60000, rdzv_body, &z);
  TEST_LOG("%s: %s in %.1f s", name, rc ? "FAILED" : "ok", now_s() - t0);
  CHECK(rc == 0);
  if (mode == 3) {
    tdist_tcp_store_options_t co = TDIST_TCP_STORE_OPTIONS_INIT;
    co.host = "127.0.0.1";
    co.port = z.port;
    co.connect_timeout_ms = 5000;
    co.timeout_ms = 5000;
    tdist_store_t *cl = NULL;
    CHECK_OK(tdist_tcp_store_connect(&co, &cl));
    for (int r = 0; r < 3; r++) {
      char key[128];
      snprintf(key, sizeof key, KEY_FMT, r);
      const char *keys[1] = {key};
      int ready = 0;
      CHECK_OK_MSG(tdist_store_check(cl, keys, 1, &ready), tdist_store_last_error(cl));
      if (!ready) {
        fprintf(stderr, "agent store: key \"%s\" (wire \"/%s\") is missing\n", key, key);
        exit(1);
      }
    }
    /* and not outside the attempt prefix */
    static const char *const absent[] = {"default_pg/gloo/0", "/worker/attempt_0/default_pg/gloo/0",
                                         "worker/attempt_3/default_pg/gloo/0"};
    for (size_t k = 0; k < sizeof absent / sizeof absent[0]; k++) {
      int ready = 1;
      CHECK_OK(tdist_store_check(cl, &absent[k], 1, &ready));
      if (ready) {
        fprintf(stderr, "agent store: unexpected key \"%s\"\n", absent[k]);
        exit(1);
      }
    }
    tdist_store_destroy(cl);
    close(agent_stop);
    CHECK(test_expect_exit(agent, 0, "agent store process") == 0);
  }
}

int main(void) {
  test_env_errors();
  TEST_LOG("env:// errors: ok");
  test_option_errors();
  TEST_LOG("option and tcp:// errors: ok");
  test_option_sizes();
  TEST_LOG("option sizes of older and newer callers: ok");
  test_rendezvous(0, "env:// (rank 0 hosts the store), 3 ranks");
  test_rendezvous(1, "tcp://127.0.0.1:PORT?rank=R&world_size=3");
  test_rendezvous(2, "tcp://127.0.0.1:PORT with rank/world_size arguments");
  test_rendezvous(3, "env:// with TORCHELASTIC_USE_AGENT_STORE=True, restart 3");
  TEST_LOG("ok");
  return 0;
}
