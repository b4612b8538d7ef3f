/* A plain MPI program (mpicc) for the dynamic-process and job-data parts of tdist-agent's PMIx
 * server (tests/agent/pmix_dyn_test.sh): no libtdist, nothing but MPI.
 *   mpi_dyn accept [--seed S]   COMM_WORLD's lower half accepts, its upper half connects
 *                               (MPI_Comm_accept/MPI_Comm_connect inside one job: Open MPI
 *                               publishes and looks up with a wait, several times); the two
 *                               halves merge and all-reduce random int64s, checked against the
 *                               sum each rank computes itself; then they disconnect.
 *   mpi_dyn spawn               rank 0 of COMM_WORLD spawns one copy of itself (refused by the
 *                               agent, which must end the job: the other ranks wait in it).
 *   mpi_dyn env                 prints the variables and MPI_INFO_ENV entries mpirun gives.
 *   mpi_dyn publish [--seed S] [--hold FILE]
 *                               rank 0 publishes a name; every rank looks it up, and looks up
 *                               the reserved name "pmix.euid", which must not be found; with
 *                               --hold, rank 0 then waits (120 s at most) for FILE to exist
 *                               before it unpublishes (the test reads the store meanwhile).
 *   mpi_dyn shared [--seed S]   MPI_Comm_split_type(SHARED) must hold the agent's local ranks
 *                               (LOCAL_WORLD_SIZE), and a window from MPI_Win_allocate_shared
 *                               on it carries each rank's random data to the others; then
 *                               MPI_Allreduce over COMM_WORLD as in accept.
 * Prints "mpi_dyn: rank R of N: ..." lines; exits 0 only if every check passed. */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define COUNT 1024

static const char *hold; /* publish --hold FILE */

static uint64_t next(uint64_t *s) { /* splitmix64 */
  uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

static void fill(int64_t *v, uint64_t seed, int rank) {
  uint64_t s = seed * 1000003ULL + (uint64_t)rank * 7919ULL;
  for (int i = 0; i < COUNT; i++) v[i] = (int64_t)(next(&s) >> 20) - (1LL << 43);
}

static int accept_connect(int rank, int size, uint64_t seed) {
  if (size < 2) {
    printf("mpi_dyn: rank %d of %d: accept needs 2 ranks or more\n", rank, size);
    return 1;
  }
  int color = rank < size / 2 ? 0 : 1, bad = 0;
  MPI_Comm half, inter, merged;
  MPI_Comm_split(MPI_COMM_WORLD, color, rank, &half);
  char port[MPI_MAX_PORT_NAME] = "";
  if (rank == 0 && MPI_Open_port(MPI_INFO_NULL, port) != MPI_SUCCESS) port[0] = 0;
  MPI_Bcast(port, MPI_MAX_PORT_NAME, MPI_CHAR, 0, MPI_COMM_WORLD);
  int rc = color == 0 ? MPI_Comm_accept(port, MPI_INFO_NULL, 0, half, &inter)
                      : MPI_Comm_connect(port, MPI_INFO_NULL, 0, half, &inter);
  if (rc != MPI_SUCCESS) {
    printf("mpi_dyn: rank %d of %d: MPI_Comm_%s failed (%d)\n", rank, size,
           color ? "connect" : "accept", rc);
    return 1;
  }
  int remote = 0;
  MPI_Comm_remote_size(inter, &remote);
  MPI_Intercomm_merge(inter, color, &merged);
  int msize = 0;
  MPI_Comm_size(merged, &msize);
  int64_t *mine = malloc(COUNT * sizeof *mine), *sum = malloc(COUNT * sizeof *sum),
          *want = calloc(COUNT, sizeof *want), *tmp = malloc(COUNT * sizeof *tmp);
  fill(mine, seed, rank);
  MPI_Allreduce(mine, sum, COUNT, MPI_INT64_T, MPI_SUM, merged);
  for (int r = 0; r < size; r++) {
    fill(tmp, seed, r);
    for (int i = 0; i < COUNT; i++) want[i] += tmp[i];
  }
  bad = memcmp(sum, want, COUNT * sizeof *sum) != 0 || msize != size ||
        remote != (color ? size / 2 : size - size / 2);
  printf("mpi_dyn: rank %d of %d: %s, remote group of %d, merged %d ranks: all-reduce %s\n", rank,
         size, color ? "connected" : "accepted", remote, msize, bad ? "WRONG" : "OK");
  free(mine);
  free(sum);
  free(want);
  free(tmp);
  MPI_Comm_free(&merged);
  MPI_Comm_disconnect(&inter);
  MPI_Comm_free(&half);
  if (rank == 0) MPI_Close_port(port);
  return bad;
}

static int shared(int rank, int size, uint64_t seed) {
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
  int nrank, nsize, bad = 0;
  MPI_Comm_rank(node, &nrank);
  MPI_Comm_size(node, &nsize);
  const char *lws = getenv("LOCAL_WORLD_SIZE");
  if (!lws || atoi(lws) != nsize) bad = 1;
  fprintf(stderr, "mpi_dyn: rank %d: MPI_Comm_split_type(SHARED): %d rank(s)\n", rank, nsize);
  int64_t *base = NULL;
  MPI_Win win;
  MPI_Win_allocate_shared(COUNT * sizeof(int64_t), sizeof(int64_t), MPI_INFO_NULL, node, &base,
                          &win);
  MPI_Win_lock_all(0, win);
  fill(base, seed, rank);
  MPI_Win_sync(win);
  MPI_Barrier(node);
  MPI_Win_sync(win);
  int ranks_ok = 0;
  int64_t *want = malloc(COUNT * sizeof *want), *sum = malloc(COUNT * sizeof *sum),
          *all = calloc(COUNT, sizeof *all);
  for (int r = 0; r < nsize; r++) {
    MPI_Aint sz;
    int du, world = -1;
    int64_t *peer;
    MPI_Win_shared_query(win, r, &sz, &du, &peer);
    MPI_Group g, wg;
    MPI_Comm_group(node, &g);
    MPI_Comm_group(MPI_COMM_WORLD, &wg);
    MPI_Group_translate_ranks(g, 1, &r, wg, &world);
    MPI_Group_free(&g);
    MPI_Group_free(&wg);
    fill(want, seed, world);
    ranks_ok += !memcmp(peer, want, COUNT * sizeof *want);
  }
  MPI_Win_unlock_all(win);
  MPI_Barrier(node);
  MPI_Win_free(&win);
  fill(want, seed, rank);
  MPI_Allreduce(want, sum, COUNT, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
  for (int r = 0; r < size; r++) {
    fill(want, seed, r);
    for (int i = 0; i < COUNT; i++) all[i] += want[i];
  }
  bad |= ranks_ok != nsize || memcmp(sum, all, COUNT * sizeof *sum) != 0;
  printf(
      "mpi_dyn: rank %d of %d: shared-memory node of %d rank(s) (LOCAL_WORLD_SIZE %s), %d "
      "window(s) right, all-reduce %s\n",
      rank, size, nsize, lws ? lws : "?", ranks_ok,
      memcmp(sum, all, COUNT * sizeof *sum) ? "WRONG" : "OK");
  free(want);
  free(sum);
  free(all);
  MPI_Comm_free(&node);
  return bad;
}

static int spawn(int rank, int size, const char *self) {
  MPI_Comm inter;
  int err = 0;
  char *args[] = {"env", NULL};
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  printf("mpi_dyn: rank %d of %d: calling MPI_Comm_spawn\n", rank, size);
  fflush(stdout);
  int rc = MPI_Comm_spawn(self, args, 1, MPI_INFO_NULL, 0, MPI_COMM_WORLD, &inter, &err);
  printf("mpi_dyn: rank %d of %d: MPI_Comm_spawn returned %d\n", rank, size, rc);
  return rc == MPI_SUCCESS ? 0 : 1;
}

static void env(int rank, int size) {
  static const char *vars[] = {"OMPI_COMM_WORLD_SIZE",       "OMPI_COMM_WORLD_RANK",
                               "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE",
                               "OMPI_COMM_WORLD_NODE_RANK",  "OMPI_UNIVERSE_SIZE",
                               "OMPI_MCA_mpi_oversubscribe", NULL};
  for (const char **v = vars; *v; v++)
    printf("mpi_dyn: rank %d of %d: env %s=%s\n", rank, size, *v, getenv(*v) ? getenv(*v) : "");
  static const char *keys[] = {"command", "argv", "maxprocs",     "soft", "host",
                               "arch",    "wdir", "thread_level", NULL};
  for (const char **k = keys; *k; k++) {
    char val[4096] = "";
    int flag = 0;
    MPI_Info_get(MPI_INFO_ENV, *k, sizeof val - 1, val, &flag);
    printf("mpi_dyn: rank %d of %d: info %s=%s\n", rank, size, *k, flag ? val : "");
  }
  char cwd[4096] = "";
  if (!getcwd(cwd, sizeof cwd)) cwd[0] = 0;
  printf("mpi_dyn: rank %d of %d: cwd %s\n", rank, size, cwd);
}

static int publish(int rank, int size, uint64_t seed) {
  char port[MPI_MAX_PORT_NAME] = "", want[MPI_MAX_PORT_NAME], name[64];
  int bad = 0;
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  snprintf(want, sizeof want, "tdist-port-%llu", (unsigned long long)seed);
  snprintf(name, sizeof name, "tdist-dyn-%llu", (unsigned long long)seed);
  if (rank == 0 && MPI_Publish_name(name, MPI_INFO_NULL, want) != MPI_SUCCESS) bad = 1;
  MPI_Barrier(MPI_COMM_WORLD);
  if (MPI_Lookup_name(name, MPI_INFO_NULL, port) != MPI_SUCCESS || strcmp(port, want)) bad = 1;
  char euid[MPI_MAX_PORT_NAME] = "";
  int found = MPI_Lookup_name("pmix.euid", MPI_INFO_NULL, euid) == MPI_SUCCESS;
  printf("mpi_dyn: rank %d of %d: looked up %s = '%s'; 'pmix.euid' %s\n", rank, size, name, port,
         found ? "FOUND (a published key the user never published)" : "not published");
  if (rank == 0 && hold) {
    printf("mpi_dyn: rank 0 of %d: published %s, holding until %s exists\n", size, name, hold);
    fflush(stdout);
    for (int i = 0; i < 1200 && access(hold, F_OK); i++) {
      struct timespec ts = {0, 100 * 1000000L};
      nanosleep(&ts, NULL);
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0 && MPI_Unpublish_name(name, MPI_INFO_NULL, want) != MPI_SUCCESS) bad = 1;
  return bad || found;
}

int main(int argc, char **argv) {
  uint64_t seed = 1;
  const char *mode = argc > 1 ? argv[1] : "";
  for (int i = 2; i < argc; i++) {
    if (!strcmp(argv[i], "--seed") && i + 1 < argc) {
      seed = strtoull(argv[++i], NULL, 10);
    } else if (!strcmp(argv[i], "--hold") && i + 1 < argc) {
      hold = argv[++i];
    } else {
      fprintf(stderr, "mpi_dyn: unknown argument '%s'\n", argv[i]);
      return 2;
    }
  }
  MPI_Init(&argc, &argv);
  int rank, size, bad = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (!strcmp(mode, "accept")) {
    bad = accept_connect(rank, size, seed);
  } else if (!strcmp(mode, "shared")) {
    bad = shared(rank, size, seed);
  } else if (!strcmp(mode, "spawn")) {
    bad = spawn(rank, size, argv[0]);
  } else if (!strcmp(mode, "env")) {
    env(rank, size);
  } else if (!strcmp(mode, "publish")) {
    bad = publish(rank, size, seed);
  } else {
    fprintf(stderr, "mpi_dyn: unknown mode '%s' (accept, spawn, env, publish)\n", mode);
    bad = 2;
  }
  int any_bad = 0;
  MPI_Allreduce(&bad, &any_bad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  printf("mpi_dyn: rank %d of %d: %s %s\n", rank, size, mode, any_bad ? "FAILED" : "OK");
  fflush(stdout);
  MPI_Finalize();
  return any_bad;
}
