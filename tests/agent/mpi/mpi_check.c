/* A plain MPI program (mpicc) for tdist-agent's PMIx server tests: no libtdist, nothing but MPI.
 *   mpi_check [--seed S] [--steps N] [--step-ms MS] [--abort-rank R --abort-status C]
 *             [--hang-rank R] [--publish] [--init-time]
 * Every step all-reduces 4096 random int64s (each rank's from seed S and its rank) and checks the
 * sum against the one it computes itself from every rank's seed; step 0 also all-gathers the
 * ranks' host names. --abort-rank: that rank calls MPI_Abort(C) after the first step.
 * --hang-rank: that rank (by the agent's RANK) sleeps before MPI_Init, so its node never reaches
 * the first fence. --publish: rank 0 publishes a service name and port that the others look up.
 * --init-time: each rank prints the wall-clock time MPI_Init returned (bench/agent/mpi_startup.sh).
 * Prints "mpi_check: rank R of N on HOST: ..." lines; exits 0 only if every check passed. */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define COUNT 4096

static uint64_t next(uint64_t *s) { /* splitmix64 */
  uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

static void fill(int64_t *v, uint64_t seed, int rank, int step) {
  uint64_t s = seed * 1000003ULL + (uint64_t)rank * 7919ULL + (uint64_t)step;
  for (int i = 0; i < COUNT; i++) v[i] = (int64_t)(next(&s) >> 20) - (1LL << 43);
}

int main(int argc, char **argv) {
  uint64_t seed = 1;
  int steps = 1, step_ms = 0, abort_rank = -1, abort_status = 1, hang_rank = -1, publish = 0,
      init_time = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--seed") && v)
      seed = strtoull(v, NULL, 10), i++;
    else if (!strcmp(a, "--steps") && v)
      steps = atoi(v), i++;
    else if (!strcmp(a, "--step-ms") && v)
      step_ms = atoi(v), i++;
    else if (!strcmp(a, "--abort-rank") && v)
      abort_rank = atoi(v), i++;
    else if (!strcmp(a, "--abort-status") && v)
      abort_status = atoi(v), i++;
    else if (!strcmp(a, "--hang-rank") && v)
      hang_rank = atoi(v), i++;
    else if (!strcmp(a, "--publish"))
      publish = 1;
    else if (!strcmp(a, "--init-time"))
      init_time = 1;
    else {
      fprintf(stderr, "mpi_check: unknown argument '%s'\n", a);
      return 2;
    }
  }
  const char *env_rank = getenv("RANK");
  if (hang_rank >= 0 && env_rank && atoi(env_rank) == hang_rank) {
    fprintf(stderr, "mpi_check: RANK %s hangs before MPI_Init\n", env_rank);
    for (;;) pause();
  }
  MPI_Init(&argc, &argv);
  struct timespec t_init;
  clock_gettime(CLOCK_REALTIME, &t_init);
  int rank, size, bad = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (init_time)
    printf("mpi_check: rank %d of %d: MPI_Init returned at %lld.%06ld\n", rank, size,
           (long long)t_init.tv_sec, t_init.tv_nsec / 1000);
  char host[MPI_MAX_PROCESSOR_NAME] = "";
  gethostname(host, sizeof host - 1);
  if (env_rank && atoi(env_rank) != rank) {
    printf("mpi_check: rank %d of %d on %s: MPI rank differs from RANK=%s\n", rank, size, host,
           env_rank);
    bad = 1;
  }
  char *hosts = calloc((size_t)size, sizeof host);
  MPI_Allgather(host, sizeof host, MPI_CHAR, hosts, sizeof host, MPI_CHAR, MPI_COMM_WORLD);
  int nhosts = 0;
  for (int r = 0; r < size; r++) {
    int seen = 0;
    for (int q = 0; q < r; q++)
      seen |= !strcmp(hosts + (size_t)q * sizeof host, hosts + (size_t)r * sizeof host);
    nhosts += !seen;
  }
  int64_t *mine = malloc(COUNT * sizeof *mine), *sum = malloc(COUNT * sizeof *sum),
          *want = malloc(COUNT * sizeof *want), *tmp = malloc(COUNT * sizeof *tmp);
  int step;
  for (step = 0; step < steps; step++) {
    fill(mine, seed, rank, step);
    MPI_Allreduce(mine, sum, COUNT, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
    memset(want, 0, COUNT * sizeof *want);
    for (int r = 0; r < size; r++) {
      fill(tmp, seed, r, step);
      for (int i = 0; i < COUNT; i++) want[i] += tmp[i];
    }
    if (memcmp(sum, want, COUNT * sizeof *sum)) {
      printf("mpi_check: rank %d of %d on %s: step %d: MPI_Allreduce WRONG\n", rank, size, host,
             step);
      bad = 1;
      break;
    }
    if (step == 0 && rank == abort_rank) {
      fprintf(stderr, "mpi_check: rank %d calls MPI_Abort(%d)\n", rank, abort_status);
      MPI_Abort(MPI_COMM_WORLD, abort_status);
    }
    if (rank == 0 && step % 20 == 0) printf("mpi_check: step %d\n", step), fflush(stdout);
    if (step_ms) {
      struct timespec ts = {step_ms / 1000, (long)(step_ms % 1000) * 1000000L};
      nanosleep(&ts, NULL);
    }
  }
  if (publish) {
    char port[MPI_MAX_PORT_NAME] = "";
    MPI_Info info;
    MPI_Info_create(&info);
    if (rank == 0) {
      snprintf(port, sizeof port, "tdist-port-%llu", (unsigned long long)seed);
      if (MPI_Publish_name("tdist-check", info, port) != MPI_SUCCESS) bad = 1;
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank != 0) {
      char want_port[MPI_MAX_PORT_NAME];
      snprintf(want_port, sizeof want_port, "tdist-port-%llu", (unsigned long long)seed);
      if (MPI_Lookup_name("tdist-check", info, port) != MPI_SUCCESS || strcmp(port, want_port)) {
        printf("mpi_check: rank %d: MPI_Lookup_name gave '%s', want '%s'\n", rank, port, want_port);
        bad = 1;
      } else {
        printf("mpi_check: rank %d: looked up 'tdist-check' = %s\n", rank, port);
      }
    }
    MPI_Barrier(MPI_COMM_WORLD);
    MPI_Info_free(&info);
  }
  int any_bad = 0;
  MPI_Allreduce(&bad, &any_bad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  printf("mpi_check: rank %d of %d on %s: %d step(s) of MPI_Allreduce %s, %d host(s), attempt %s\n",
         rank, size, host, step, any_bad ? "FAILED" : "OK", nhosts,
         getenv("TORCHELASTIC_RESTART_COUNT") ? getenv("TORCHELASTIC_RESTART_COUNT") : "?");
  fflush(stdout);
  free(hosts);
  free(mine);
  free(sum);
  free(want);
  free(tmp);
  MPI_Finalize();
  return any_bad;
}
