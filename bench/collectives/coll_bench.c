/* coll_bench: collectives of tdist's gloo backend against PyTorch 1.13 gloo and Open MPI, in one
 * run, printed as nccl-tests style tables with our/peer time ratios.
 *
 * Every implementation runs as real processes on this machine: tdist's ranks are this binary
 * re-executed with --worker (the parent hosts the store on an ephemeral port), the PyTorch peer is
 * torch_peer.py under /usr/bin/python3 with env:// on a free port, the Open MPI peer is
 * mpi_peer (built by run.sh with mpicc) under mpirun, once over TCP (btl self,tcp) and once over
 * shared memory (btl self,vader). tdist runs twice as well: over loopback TCP (TDIST_SHM=0) and
 * over its same-host shared-memory rings (TDIST_SHM=1); TCP is compared with the TCP peers,
 * shared memory with Open MPI's. All of them run the same plan and the same timing loop
 * (bench_common.h), check their results (#wrong) and write one TSV file per rank; this process
 * reads them back and prints the tables. Time = median over the timed iterations of each rank's
 * per-call time, the slowest rank's median (with --repeat, the best pass).
 *
 * This program measures and prints; it asserts nothing about speed (exit status 1 only when
 * something failed to run or a result was wrong). */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench_common.h"
#include "bench_tdist.h"
#include "tdist/tdist.h"

/* ---------------------------------------------------------------------------------------- */
/* Worker: one tdist rank                                                                    */

/* --worker [--impl NAME] [--group G] [--rank R --world N --store-port P] --out DIR --colls ..
 * --sizes .. --iters ..
 * --warmup .. [--timeout-s S]. Without --store-port the group is created with env:// (RANK,
 * WORLD_SIZE, MASTER_ADDR, MASTER_PORT), which lets one run a rank by hand under a profiler. */
static int worker_main(int argc, char **argv) {
  const char *dir = ".", *colls = NULL, *sizes = NULL, *iters = NULL, *warmup = NULL,
             *impl = "tdist", *group = NULL;
  int rank = -1, world = -1, port = -1;
  long timeout_s = 300;
  for (int i = 2; i + 1 < argc; i += 2) {
    const char *k = argv[i], *v = argv[i + 1];
    if (!strcmp(k, "--impl"))
      impl = v;
    else if (!strcmp(k, "--group"))
      group = v;
    else if (!strcmp(k, "--rank"))
      rank = atoi(v);
    else if (!strcmp(k, "--world"))
      world = atoi(v);
    else if (!strcmp(k, "--store-port"))
      port = atoi(v);
    else if (!strcmp(k, "--out"))
      dir = v;
    else if (!strcmp(k, "--colls"))
      colls = v;
    else if (!strcmp(k, "--sizes"))
      sizes = v;
    else if (!strcmp(k, "--iters"))
      iters = v;
    else if (!strcmp(k, "--warmup"))
      warmup = v;
    else if (!strcmp(k, "--timeout-s"))
      timeout_s = atol(v);
    else {
      fprintf(stderr, "coll_bench --worker: unknown argument %s\n", k);
      return 2;
    }
  }
  bench_plan_t plan;
  if (bench_plan_parse(&plan, colls, sizes, iters, warmup)) return 2;
  tdist_store_t *store = NULL;
  tdist_pg_options_t po = TDIST_PG_OPTIONS_INIT;
  po.timeout_ms = timeout_s * 1000;
  po.group_name = group;
  if (port >= 0) {
    tdist_tcp_store_options_t co = TDIST_TCP_STORE_OPTIONS_INIT;
    co.host = "127.0.0.1";
    co.port = port;
    co.connect_timeout_ms = po.timeout_ms;
    co.timeout_ms = po.timeout_ms;
    if (tdist_tcp_store_connect(&co, &store)) {
      fprintf(stderr, "rank %d: store: %s\n", rank, tdist_last_error());
      return 1;
    }
    po.store = store;
    po.rank = rank;
    po.world_size = world;
  }
  tdist_pg_t *pg = NULL;
  if (tdist_init_process_group(&po, &pg)) {
    fprintf(stderr, "rank %d: init_process_group: %s\n", rank, tdist_last_error());
    return 1;
  }
  rank = tdist_pg_rank(pg);
  char path[4096];
  snprintf(path, sizeof path, "%s/%s.%d.tsv", dir, impl, rank);
  FILE *f = fopen(path, "w");
  if (!f) {
    perror(path);
    return 1;
  }
  int rc = bench_sweep(&plan, tdist_pg_size(pg), rank, bench_run_tdist, pg, f, impl);
  fclose(f);
  /* A root that returns from its last broadcast may be far ahead of the receivers: meet them
   * before closing the connections. */
  if (!rc && tdist_barrier(pg)) {
    fprintf(stderr, "rank %d: final barrier: %s\n", rank, tdist_pg_last_error(pg));
    rc = 1;
  }
  if (!rc && tdist_pg_finalize(pg)) rc = 1;
  tdist_pg_destroy(pg);
  tdist_store_destroy(store);
  return rc;
}

/* ---------------------------------------------------------------------------------------- */
/* Driver: options and plan                                                                  */

/* Table order. Ratios: the TCP peers against tdist-tcp, ompi-shm against tdist-shm. */
/* tdist-mpi (tdist's mpi backend on Open MPI's shared memory) is judged against ompi-shm the
 * other way round: its time / Open MPI's, and the microseconds it adds. */
enum {
  IMPL_TDIST_TCP,
  IMPL_TORCH,
  IMPL_OMPI_TCP,
  IMPL_TDIST_SHM,
  IMPL_OMPI_SHM,
  IMPL_TDIST_MPI,
  IMPL_COUNT
};
static const char *const impl_names[IMPL_COUNT] = {"tdist-tcp", "torch-gloo", "ompi-tcp",
                                                   "tdist-shm", "ompi-shm",   "tdist-mpi"};
static const int ratio_base[IMPL_COUNT] = {-1, IMPL_TDIST_TCP, IMPL_TDIST_TCP,
                                           -1, IMPL_TDIST_SHM, IMPL_OMPI_SHM};

#define MAX_WORLDS 8

typedef struct {
  int worlds[MAX_WORLDS], nworlds;
  bench_plan_t plan;
  int use[IMPL_COUNT];
  double iters_scale;
  int repeat;
  long timeout_s;
  const char *python, *torch_peer, *mpi_peer, *mpirun, *tsv_path;
  int keep;
} opts_t;

static void usage(FILE *f) {
  fprintf(
      f,
      "usage: coll_bench [options]        (normally started by bench/collectives/run.sh)\n"
      "Times all_reduce, all_gather, reduce_scatter, broadcast and all_to_all (float32, sum) with\n"
      "tdist's gloo backend (over loopback TCP and over shared memory) and with the peers\n"
      "(PyTorch 1.13 gloo, Open MPI over TCP and over shared memory), real processes on this\n"
      "machine, and prints nccl-tests style tables with tdist/peer time ratios (< 1: tdist is\n"
      "faster) and the issue's goals. Exit status 1 if a run failed or a result was wrong.\n"
      "  --ranks LIST        world sizes (default 2,4)\n"
      "  --colls LIST        collectives (default all five)\n"
      "  --min-bytes B       smallest size (default 8); sizes go 8, 64, 256, ... by 4\n"
      "  --max-bytes B       largest size (default 64M); K/M/G suffixes allowed\n"
      "  --sizes LIST        explicit sizes instead of --min/--max-bytes\n"
      "  --iters-scale F     multiply the iteration counts (default 1; minimum 3 timed)\n"
      "  --quick             2 ranks, sizes 8,4K,256K,4M,64M, --iters-scale 0.3, --repeat 1\n"
      "  --transports LIST   tdist transports: tcp,shm (default both). tcp = TDIST_SHM=0 "
      "(loopback\n"
      "                      TCP); shm = TDIST_SHM=1 (same-host shared-memory rings)\n"
      "  --peers LIST        torch,ompi-tcp,ompi-shm,tdist-mpi (default all) or none; tdist-mpi\n"
      "                      is tdist's mpi backend on Open MPI (btl self,vader), against "
      "ompi-shm\n"
      "  --repeat R          run every implementation R times, interleaved, and keep each cell's\n"
      "                      best time (machines like this one are shared and noisy; default 2,\n"
      "                      --quick: 1)\n"
      "  --python PATH       interpreter with torch (default /usr/bin/python3)\n"
      "  --torch-peer PATH   torch_peer.py (default bench/collectives/torch_peer.py)\n"
      "  --mpi-peer PATH     mpi_peer binary (built by run.sh); without it Open MPI is skipped\n"
      "  --mpirun PATH       (default mpirun)\n"
      "  --timeout-s S       limit for each implementation's run (default 300)\n"
      "  --tsv FILE          also write every rank's raw results there\n"
      "  --keep              keep the temporary directory (logs, per-rank TSV)\n"
      "Iterations per size (before --iters-scale): <=64K 100 timed + 10 warm-up, 256K 40+5,\n"
      "1M 20+3, 4M 10+2, 16M 6+1, larger 5+1; plus one checked iteration per size.\n"
      "Environment reaches every rank (e.g. TDIST_ALGO_ALLREDUCE=ring|rd, TDIST_SPIN_US).\n");
}

static int parse_bytes(const char *s, size_t *out) {
  char *end;
  unsigned long long v = strtoull(s, &end, 10);
  if (end == s) return -1;
  if (*end == 'K' || *end == 'k')
    v <<= 10, end++;
  else if (*end == 'M' || *end == 'm')
    v <<= 20, end++;
  else if (*end == 'G' || *end == 'g')
    v <<= 30, end++;
  if (*end) return -1;
  *out = (size_t)v;
  return 0;
}

static void plan_iters(size_t bytes, double scale, int *iters, int *warmup) {
  int it, wu;
  if (bytes <= (64u << 10))
    it = 100, wu = 10;
  else if (bytes <= (256u << 10))
    it = 40, wu = 5;
  else if (bytes <= (1u << 20))
    it = 20, wu = 3;
  else if (bytes <= (4u << 20))
    it = 10, wu = 2;
  else if (bytes <= (16u << 20))
    it = 6, wu = 1;
  else
    it = 5, wu = 1;
  it = (int)lround(it * scale);
  wu = (int)lround(wu * scale);
  *iters = it < 3 ? 3 : it;
  *warmup = wu < 1 ? 1 : wu;
}

static int parse_opts(int argc, char **argv, opts_t *o) {
  memset(o, 0, sizeof *o);
  o->worlds[0] = 2, o->worlds[1] = 4, o->nworlds = 2;
  for (int i = 0; i < COLL_COUNT; i++) o->plan.colls[i] = i;
  o->plan.ncolls = COLL_COUNT;
  for (int i = 0; i < IMPL_COUNT; i++) o->use[i] = 1;
  o->iters_scale = 1;
  o->repeat = 2;
  o->timeout_s = 300;
  o->python = "/usr/bin/python3";
  o->torch_peer = "bench/collectives/torch_peer.py";
  o->mpirun = "mpirun";
  size_t min_b = 8, max_b = 64u << 20;
  const char *sizes = NULL;
  int quick = 0, ranks_given = 0, scale_given = 0, repeat_given = 0;
  for (int i = 1; i < argc; i++) {
    const char *k = argv[i];
    if (!strcmp(k, "--help") || !strcmp(k, "-h")) {
      usage(stdout);
      exit(0);
    }
    if (!strcmp(k, "--quick")) {
      quick = 1;
      continue;
    }
    if (!strcmp(k, "--keep")) {
      o->keep = 1;
      continue;
    }
    if (i + 1 >= argc) {
      fprintf(stderr, "coll_bench: %s needs a value (see --help)\n", k);
      return -1;
    }
    const char *v = argv[++i];
    if (!strcmp(k, "--ranks")) {
      ranks_given = 1;
      o->nworlds = 0;
      char buf[128];
      snprintf(buf, sizeof buf, "%s", v);
      for (char *s = NULL, *t = strtok_r(buf, ",", &s); t; t = strtok_r(NULL, ",", &s)) {
        int w = atoi(t);
        if (w < 1 || w > 64 || o->nworlds == MAX_WORLDS) {
          fprintf(stderr, "coll_bench: bad --ranks %s\n", v);
          return -1;
        }
        o->worlds[o->nworlds++] = w;
      }
    } else if (!strcmp(k, "--colls")) {
      o->plan.ncolls = 0;
      char buf[256];
      snprintf(buf, sizeof buf, "%s", v);
      for (char *s = NULL, *t = strtok_r(buf, ",", &s); t; t = strtok_r(NULL, ",", &s)) {
        int c = bench_coll_parse(t);
        if (c < 0 || o->plan.ncolls == COLL_COUNT) {
          fprintf(stderr, "coll_bench: unknown collective %s\n", t);
          return -1;
        }
        o->plan.colls[o->plan.ncolls++] = c;
      }
    } else if (!strcmp(k, "--min-bytes")) {
      if (parse_bytes(v, &min_b) || !min_b) return fprintf(stderr, "bad --min-bytes\n"), -1;
    } else if (!strcmp(k, "--max-bytes")) {
      if (parse_bytes(v, &max_b)) return fprintf(stderr, "bad --max-bytes\n"), -1;
    } else if (!strcmp(k, "--sizes")) {
      sizes = v;
    } else if (!strcmp(k, "--iters-scale")) {
      o->iters_scale = atof(v);
      scale_given = 1;
      if (!(o->iters_scale > 0)) return fprintf(stderr, "bad --iters-scale\n"), -1;
    } else if (!strcmp(k, "--repeat")) {
      o->repeat = atoi(v);
      repeat_given = 1;
      if (o->repeat < 1 || o->repeat > 100) return fprintf(stderr, "bad --repeat\n"), -1;
    } else if (!strcmp(k, "--transports")) {
      o->use[IMPL_TDIST_TCP] = o->use[IMPL_TDIST_SHM] = 0;
      char buf[128];
      snprintf(buf, sizeof buf, "%s", v);
      for (char *s = NULL, *t = strtok_r(buf, ",", &s); t; t = strtok_r(NULL, ",", &s)) {
        if (!strcmp(t, "tcp"))
          o->use[IMPL_TDIST_TCP] = 1;
        else if (!strcmp(t, "shm"))
          o->use[IMPL_TDIST_SHM] = 1;
        else
          return fprintf(stderr, "coll_bench: unknown transport %s (tcp, shm)\n", t), -1;
      }
    } else if (!strcmp(k, "--peers")) {
      o->use[IMPL_TORCH] = o->use[IMPL_OMPI_TCP] = o->use[IMPL_OMPI_SHM] = 0;
      o->use[IMPL_TDIST_MPI] = 0;
      char buf[128];
      snprintf(buf, sizeof buf, "%s", v);
      for (char *s = NULL, *t = strtok_r(buf, ",", &s); t; t = strtok_r(NULL, ",", &s)) {
        if (!strcmp(t, "none")) continue;
        if (!strcmp(t, "torch") || !strcmp(t, "torch-gloo"))
          o->use[IMPL_TORCH] = 1;
        else if (!strcmp(t, "ompi-tcp"))
          o->use[IMPL_OMPI_TCP] = 1;
        else if (!strcmp(t, "ompi-shm"))
          o->use[IMPL_OMPI_SHM] = 1;
        else if (!strcmp(t, "tdist-mpi"))
          o->use[IMPL_TDIST_MPI] = 1;
        else
          return fprintf(stderr, "coll_bench: unknown peer %s\n", t), -1;
      }
    } else if (!strcmp(k, "--python")) {
      o->python = v;
    } else if (!strcmp(k, "--torch-peer")) {
      o->torch_peer = v;
    } else if (!strcmp(k, "--mpi-peer")) {
      o->mpi_peer = v;
    } else if (!strcmp(k, "--mpirun")) {
      o->mpirun = v;
    } else if (!strcmp(k, "--timeout-s")) {
      o->timeout_s = atol(v);
      if (o->timeout_s <= 0) return fprintf(stderr, "bad --timeout-s\n"), -1;
    } else if (!strcmp(k, "--tsv")) {
      o->tsv_path = v;
    } else {
      fprintf(stderr, "coll_bench: unknown option %s (see --help)\n", k);
      return -1;
    }
  }
  if (quick) {
    if (!ranks_given) o->worlds[0] = 2, o->nworlds = 1;
    if (!sizes) sizes = "8,4K,256K,4M,64M";
    if (!scale_given) o->iters_scale = 0.3;
    if (!repeat_given) o->repeat = 1;
  }
  bench_plan_t *p = &o->plan;
  p->nsizes = 0;
  if (sizes) {
    char buf[512];
    snprintf(buf, sizeof buf, "%s", sizes);
    for (char *s = NULL, *t = strtok_r(buf, ",", &s); t; t = strtok_r(NULL, ",", &s)) {
      if (p->nsizes == BENCH_MAX_SIZES || parse_bytes(t, &p->sizes[p->nsizes]))
        return fprintf(stderr, "coll_bench: bad --sizes %s\n", sizes), -1;
      p->nsizes++;
    }
  } else {
    if (max_b < min_b) return fprintf(stderr, "coll_bench: --max-bytes < --min-bytes\n"), -1;
    p->sizes[p->nsizes++] = min_b;
    size_t s = 1;
    while (s <= min_b * 4) s *= 4; /* the first power of 4 at least 8x above the start */
    for (; s <= max_b && p->nsizes < BENCH_MAX_SIZES; s *= 4) p->sizes[p->nsizes++] = s;
    if (p->sizes[p->nsizes - 1] != max_b && p->nsizes < BENCH_MAX_SIZES && max_b > min_b)
      p->sizes[p->nsizes++] = max_b;
  }
  for (int i = 0; i < p->nsizes; i++)
    plan_iters(p->sizes[i], o->iters_scale, &p->iters[i], &p->warmup[i]);
  return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* Driver: processes                                                                         */

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Starts argv in its own process group with stdout+stderr appended to `log` and `env` (NAME=V
 * strings, NULL-terminated) added to the environment. */
static pid_t spawn(char *const argv[], char *const env[], const char *log) {
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    setpgid(0, 0);
    int fd = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
    }
    int nul = open("/dev/null", O_RDONLY);
    if (nul >= 0) dup2(nul, 0);
    for (int i = 0; env && env[i]; i++) putenv(env[i]);
    execvp(argv[0], argv);
    fprintf(stderr, "exec %s: %s\n", argv[0], strerror(errno));
    _exit(127);
  }
  setpgid(pid, pid);
  return pid;
}

/* Waits for every pid; kills the rest (whole process groups) when one fails or the deadline
 * passes. Returns 0 when all exited 0. */
static int wait_all(pid_t *pids, int n, int64_t deadline, const char *what) {
  int left = n, failed = 0;
  int *done = calloc((size_t)n, sizeof *done);
  while (left > 0) {
    int st;
    pid_t pid = waitpid(-1, &st, WNOHANG);
    if (pid > 0) {
      for (int i = 0; i < n; i++) {
        if (pids[i] != pid) continue;
        done[i] = 1;
        left--;
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
          if (!failed)
            fprintf(stderr, "[coll_bench] %s: process %d %s %d\n", what, i,
                    WIFEXITED(st) ? "exited with" : "killed by signal",
                    WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
          failed = 1;
        }
      }
      continue;
    }
    if (failed || now_ms() > deadline) {
      if (!failed) fprintf(stderr, "[coll_bench] %s: timed out; killing it\n", what);
      failed = 1;
      for (int i = 0; i < n; i++)
        if (!done[i]) kill(-pids[i], SIGKILL);
      for (int i = 0; i < n; i++)
        if (!done[i]) waitpid(pids[i], &st, 0), done[i] = 1;
      break;
    }
    usleep(5000);
  }
  free(done);
  return failed;
}

static void print_log_tail(const char *log) {
  FILE *f = fopen(log, "r");
  if (!f) return;
  static char buf[4096];
  fseek(f, 0, SEEK_END);
  long sz = ftell(f);
  fseek(f, sz > (long)sizeof buf - 1 ? sz - (long)sizeof buf + 1 : 0, SEEK_SET);
  size_t r = fread(buf, 1, sizeof buf - 1, f);
  buf[r] = '\0';
  fclose(f);
  fprintf(stderr, "---- last lines of %s ----\n%s\n----\n", log, buf);
}

/* The temporary directory is flat (logs and TSV files). */
static void remove_dir(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return;
  for (struct dirent *e; (e = readdir(d));) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    char path[4400];
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    unlink(path);
  }
  closedir(d);
  rmdir(dir);
}

static int free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t sl = sizeof sa;
  int port = -1;
  if (fd >= 0 && bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0 &&
      getsockname(fd, (struct sockaddr *)&sa, &sl) == 0)
    port = ntohs(sa.sin_port);
  if (fd >= 0) close(fd);
  return port;
}

/* The plan as worker arguments. */
typedef struct {
  char colls[256], sizes[512], iters[256], warmup[256];
} plan_args_t;

static void plan_args(const bench_plan_t *p, plan_args_t *a) {
  size_t l = 0;
  a->colls[0] = a->sizes[0] = a->iters[0] = a->warmup[0] = '\0';
  for (int i = 0; i < p->ncolls; i++)
    l += (size_t)snprintf(a->colls + l, sizeof a->colls - l, "%s%s", i ? "," : "",
                          bench_coll_names[p->colls[i]]);
  size_t ls = 0, li = 0, lw = 0;
  for (int i = 0; i < p->nsizes; i++) {
    ls += (size_t)snprintf(a->sizes + ls, sizeof a->sizes - ls, "%s%zu", i ? "," : "", p->sizes[i]);
    li += (size_t)snprintf(a->iters + li, sizeof a->iters - li, "%s%d", i ? "," : "", p->iters[i]);
    lw +=
        (size_t)snprintf(a->warmup + lw, sizeof a->warmup - lw, "%s%d", i ? "," : "", p->warmup[i]);
  }
}

/* ---------------------------------------------------------------------------------------- */
/* Driver: results                                                                           */

typedef struct {
  int impl, world, coll;
  size_t bytes;
  long long pass_med, pass_wrong; /* this pass: slowest rank's median, wrong summed over ranks */
  uint64_t pass_ranks;            /* ranks that reported this pass (bit per rank) */
  long long best_ns;              /* best pass; -1 = no complete pass */
  long long wrong;                /* over all passes */
  int passes;
} cell_t;

static cell_t *cells;
static int ncells, cap_cells;

static cell_t *cell_get(int impl, int world, int coll, size_t bytes, int create) {
  for (int i = 0; i < ncells; i++)
    if (cells[i].impl == impl && cells[i].world == world && cells[i].coll == coll &&
        cells[i].bytes == bytes)
      return &cells[i];
  if (!create) return NULL;
  if (ncells == cap_cells) {
    cap_cells = cap_cells ? 2 * cap_cells : 256;
    cells = realloc(cells, sizeof *cells * (size_t)cap_cells);
    if (!cells) abort();
  }
  cell_t *c = &cells[ncells++];
  memset(c, 0, sizeof *c);
  c->impl = impl, c->world = world, c->coll = coll, c->bytes = bytes;
  c->best_ns = -1;
  return c;
}

/* Reads DIR/NAME.RANK.tsv of every rank (then removes or renames them): a pass's time is the
 * slowest rank's median and counts only when every rank reported the cell; the kept time is the
 * best pass. */
static void collect(const char *dir, int impl, int world, int pass, int keep, FILE *raw) {
  const char *name = impl_names[impl];
  for (int i = 0; i < ncells; i++)
    cells[i].pass_med = cells[i].pass_wrong = cells[i].pass_ranks = 0;
  for (int r = 0; r < world; r++) {
    char path[4200], line[512];
    snprintf(path, sizeof path, "%s/%s.%d.tsv", dir, name, r);
    FILE *f = fopen(path, "r");
    if (!f) continue;
    while (fgets(line, sizeof line, f)) {
      if (raw) fprintf(raw, "%d\t%s", pass, line);
      char iname[64], coll[64];
      int n, rank, iters;
      size_t bytes, count;
      long long med, mn, wrong;
      if (sscanf(line, "%63s %d %d %63s %zu %zu %lld %lld %lld %d", iname, &n, &rank, coll, &bytes,
                 &count, &med, &mn, &wrong, &iters) != 10)
        continue;
      int c = bench_coll_parse(coll);
      if (c < 0) continue;
      cell_t *x = cell_get(impl, world, c, bytes, 1);
      /* Two requested sizes can round to the same bytes (whole elements per rank): such a
       * cell is measured twice and keeps the slower report. */
      if (med > x->pass_med) x->pass_med = med;
      if (!(x->pass_ranks & (1ull << (rank & 63)))) x->pass_wrong += wrong;
      x->pass_ranks |= 1ull << (rank & 63);
    }
    fclose(f);
    if (keep) {
      char kept[4300];
      snprintf(kept, sizeof kept, "%s/%s.w%d.p%d.%d.tsv", dir, name, world, pass, r);
      rename(path, kept);
    } else {
      unlink(path);
    }
  }
  for (int i = 0; i < ncells; i++) {
    cell_t *x = &cells[i];
    if (x->impl != impl || x->world != world || x->pass_ranks == 0) continue;
    x->wrong += x->pass_wrong;
    if (__builtin_popcountll(x->pass_ranks) != world) continue;
    x->passes++;
    if (x->best_ns < 0 || x->pass_med < x->best_ns) x->best_ns = x->pass_med;
  }
}

static const cell_t *result(int impl, int world, int coll, size_t bytes) {
  cell_t *c = cell_get(impl, world, coll, bytes, 0);
  return c && c->best_ns > 0 ? c : NULL;
}

/* The requested size -> the bytes actually used (rounded to whole elements per rank). */
static size_t eff_bytes(int coll, size_t bytes, int world) {
  return bench_total_count((bench_coll_t)coll, bytes, world) * sizeof(float);
}

static void print_tables(const opts_t *o, int world, const char *notes[IMPL_COUNT]) {
  printf("\n# ======== %d ranks: float32, op sum, one host ========\n", world);
  printf(
      "# tdist-tcp: gloo backend over loopback TCP (TDIST_SHM=0); peers torch-gloo (PyTorch "
      "1.13, TCP) and ompi-tcp (Open MPI, btl self,tcp on lo)\n");
  printf(
      "# tdist-shm: gloo backend over same-host shared-memory rings (TDIST_SHM=1); peer "
      "ompi-shm (Open MPI, btl self,vader)\n");
  if (o->use[IMPL_TDIST_MPI])
    printf(
        "# tdist-mpi: tdist's mpi backend (libtdist-mpi.so) over the same Open MPI, btl "
        "self,vader; ratio = tdist-mpi / ompi-shm, +us = what the backend adds\n");
  printf(
      "# time = median of the timed iterations of each rank, slowest rank%s; algbw = size/time;"
      " busbw = algbw x nccl-tests factor\n",
      o->repeat > 1 ? ", best of the passes" : "");
  printf(
      "# ratio = tdist time / peer time (< 1: tdist faster); torch-gloo and ompi-tcp against "
      "tdist-tcp, ompi-shm against tdist-shm\n");
  for (int i = 0; i < IMPL_COUNT; i++)
    if (notes[i]) printf("# %s: %s\n", impl_names[i], notes[i]);
  for (int ci = 0; ci < o->plan.ncolls; ci++) {
    int c = o->plan.colls[ci];
    double fac = bench_busbw_factor((bench_coll_t)c, world);
    printf("#\n# %s, %d ranks (busbw factor %.3g)%s\n", bench_coll_names[c], world, fac,
           c == COLL_REDUCE_SCATTER && o->use[IMPL_TORCH]
               ? "  [torch-gloo: emulated by all_reduce; gloo in torch 1.13 has no reduce_scatter]"
               : "");
    printf("#%10s %10s %5s %5s |%10s %8s %8s %6s", "size(B)", "count", "type", "redop", "tdist-tcp",
           "algbw", "busbw", "#wrong");
    for (int i = 1; i < IMPL_COUNT; i++) {
      if (!o->use[i]) continue;
      if (i == IMPL_TDIST_SHM)
        printf(" |%10s %8s %6s", "tdist-shm", "busbw", "#wrong");
      else if (i == IMPL_TDIST_MPI)
        printf(" |%10s %6s %7s", impl_names[i], "ratio", "+us");
      else
        printf(" |%10s %6s", impl_names[i], "ratio");
    }
    printf("\n#%10s %10s %5s %5s |%10s %8s %8s %6s", "", "", "", "", "us", "GB/s", "GB/s", "");
    for (int i = 1; i < IMPL_COUNT; i++) {
      if (!o->use[i]) continue;
      if (i == IMPL_TDIST_SHM)
        printf(" |%10s %8s %6s", "us", "GB/s", "");
      else if (i == IMPL_TDIST_MPI)
        printf(" |%10s %6s %7s", "us", "", "");
      else
        printf(" |%10s %6s", "us", "");
    }
    printf("\n");
    int is_red = c == COLL_ALL_REDUCE || c == COLL_REDUCE_SCATTER;
    for (int si = 0; si < o->plan.nsizes; si++) {
      size_t b = eff_bytes(c, o->plan.sizes[si], world);
      int dup = 0;
      for (int sj = 0; sj < si; sj++) dup |= eff_bytes(c, o->plan.sizes[sj], world) == b;
      if (dup) continue;
      const cell_t *us = result(IMPL_TDIST_TCP, world, c, b);
      printf(" %10zu %10zu %5s %5s |", b, b / sizeof(float), "float", is_red ? "sum" : "none");
      if (us) {
        double algbw = (double)b / (double)us->best_ns;
        printf("%10.2f %8.3f %8.3f %6lld", us->best_ns / 1e3, algbw, algbw * fac, us->wrong);
      } else {
        printf("%10s %8s %8s %6s", "-", "-", "-", "-");
      }
      for (int i = 1; i < IMPL_COUNT; i++) {
        if (!o->use[i]) continue;
        const cell_t *pr = result(i, world, c, b);
        if (i == IMPL_TDIST_SHM) {
          if (pr)
            printf(" |%10.2f %8.3f %6lld", pr->best_ns / 1e3, (double)b / (double)pr->best_ns * fac,
                   pr->wrong);
          else
            printf(" |%10s %8s %6s", "-", "-", "-");
          continue;
        }
        const cell_t *base = result(ratio_base[i], world, c, b);
        if (i == IMPL_TDIST_MPI) {
          if (pr && base)
            printf(" |%10.2f %6.3f %7.2f", pr->best_ns / 1e3,
                   (double)pr->best_ns / (double)base->best_ns,
                   (pr->best_ns - base->best_ns) / 1e3);
          else if (pr)
            printf(" |%10.2f %6s %7s", pr->best_ns / 1e3, "-", "-");
          else
            printf(" |%10s %6s %7s", "-", "-", "-");
          continue;
        }
        if (pr)
          printf(" |%10.2f", pr->best_ns / 1e3);
        else
          printf(" |%10s", "-");
        if (pr && base)
          printf(" %6.3f", (double)base->best_ns / (double)pr->best_ns);
        else
          printf(" %6s", "-");
      }
      for (int i = 1; i < IMPL_COUNT; i++) {
        const cell_t *pr = cell_get(i, world, c, b, 0);
        if (i != IMPL_TDIST_SHM && pr && pr->wrong)
          printf("  (%s: %lld wrong)", impl_names[i], pr->wrong);
      }
      printf("\n");
    }
  }
  fflush(stdout);
}

/* The goals, 2 ranks, all_reduce: 8 B over TCP within Open MPI TCP and 1/20 of
 * torch-gloo; 64 MiB busbw 1.5x torch-gloo and at least Open MPI shared memory (judged for each
 * tdist transport measured). */
static void print_goals(void) {
  const int w = 2;
  size_t small = 8, big = 64u << 20;
  printf("\n# ======== goals (2 ranks, all_reduce float32 sum) ========\n");
  struct {
    int us, peer;
    size_t bytes;
    double want;
    const char *what;
  } g[] = {
      {IMPL_TDIST_TCP, IMPL_OMPI_TCP, small, 1.0, "8 B time <= Open MPI TCP"},
      {IMPL_TDIST_TCP, IMPL_TORCH, small, 1.0 / 20, "8 B time <= 1/20 of torch-gloo"},
      {IMPL_TDIST_TCP, IMPL_TORCH, big, 1.5, "64 MiB busbw >= 1.5x torch-gloo"},
      {IMPL_TDIST_SHM, IMPL_TORCH, big, 1.5, "64 MiB busbw >= 1.5x torch-gloo"},
      {IMPL_TDIST_TCP, IMPL_OMPI_SHM, big, 1.0, "64 MiB busbw >= Open MPI shared memory"},
      {IMPL_TDIST_SHM, IMPL_OMPI_SHM, big, 1.0, "64 MiB busbw >= Open MPI shared memory"},
  };
  for (size_t i = 0; i < sizeof g / sizeof g[0]; i++) {
    const cell_t *us = result(g[i].us, w, COLL_ALL_REDUCE, g[i].bytes);
    const cell_t *pr = result(g[i].peer, w, COLL_ALL_REDUCE, g[i].bytes);
    int bw = g[i].bytes == big;
    if (!us || !pr) {
      printf("#   %-9s %-40s not measured in this run\n", impl_names[g[i].us], g[i].what);
      continue;
    }
    double ratio =
        bw ? (double)pr->best_ns / (double)us->best_ns : (double)us->best_ns / (double)pr->best_ns;
    int met = bw ? ratio >= g[i].want : ratio <= g[i].want;
    if (bw)
      printf("#   %-9s %-40s %.3f vs %s %.3f GB/s: %.2fx (goal >= %.2fx)  %s\n",
             impl_names[g[i].us], g[i].what, (double)big / (double)us->best_ns,
             impl_names[g[i].peer], (double)big / (double)pr->best_ns, ratio, g[i].want,
             met ? "MET" : "NOT MET");
    else
      printf("#   %-9s %-40s %.2f vs %s %.2f us: ratio %.3f (goal <= %.3f)  %s\n",
             impl_names[g[i].us], g[i].what, us->best_ns / 1e3, impl_names[g[i].peer],
             pr->best_ns / 1e3, ratio, g[i].want, met ? "MET" : "NOT MET");
  }
}

/* ---------------------------------------------------------------------------------------- */
/* Driver: running each implementation                                                       */

static int run_tdist_ranks(const opts_t *o, int impl, int world, int pass, const char *dir,
                           int store_port, const plan_args_t *pa) {
  char exe[4096];
  ssize_t l = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (l <= 0) return 1;
  exe[l] = '\0';
  const char *name = impl_names[impl];
  char log[4200], rank_s[16], world_s[16], port_s[16], to_s[32], group[96];
  /* One store serves every run: each gets its own group name (key prefix), so no run can read
   * an earlier run's addresses. */
  snprintf(group, sizeof group, "coll_bench/%s/%d/%d", name, world, pass);
  snprintf(log, sizeof log, "%s/%s.%d.log", dir, name, world);
  snprintf(world_s, sizeof world_s, "%d", world);
  snprintf(port_s, sizeof port_s, "%d", store_port);
  snprintf(to_s, sizeof to_s, "%ld", o->timeout_s);
  char shm_env[] = "TDIST_SHM=0";
  if (impl == IMPL_TDIST_SHM) shm_env[10] = '1';
  char *envp[] = {shm_env, NULL};
  pid_t pids[64];
  for (int r = 0; r < world; r++) {
    snprintf(rank_s, sizeof rank_s, "%d", r);
    char *argv[] = {exe,
                    "--worker",
                    "--impl",
                    (char *)name,
                    "--group",
                    group,
                    "--rank",
                    rank_s,
                    "--world",
                    world_s,
                    "--store-port",
                    port_s,
                    "--out",
                    (char *)dir,
                    "--colls",
                    (char *)pa->colls,
                    "--sizes",
                    (char *)pa->sizes,
                    "--iters",
                    (char *)pa->iters,
                    "--warmup",
                    (char *)pa->warmup,
                    "--timeout-s",
                    to_s,
                    NULL};
    pids[r] = spawn(argv, envp, log);
  }
  int rc = wait_all(pids, world, now_ms() + o->timeout_s * 1000, name);
  if (rc) print_log_tail(log);
  return rc;
}

static int run_torch(const opts_t *o, int world, const char *dir, const plan_args_t *pa) {
  char log[4200], to_s[32];
  snprintf(log, sizeof log, "%s/torch-gloo.%d.log", dir, world);
  snprintf(to_s, sizeof to_s, "%ld", o->timeout_s);
  int rc = 1;
  /* The free port is found by binding 0 and closing: another process could take it before
   * rank 0 binds it, so a failed start is retried once on a new port. */
  for (int attempt = 0; attempt < 2 && rc; attempt++) {
    int port = free_port();
    pid_t pids[64];
    static char env[64][6][64];
    for (int r = 0; r < world; r++) {
      snprintf(env[r][0], 64, "MASTER_ADDR=127.0.0.1");
      snprintf(env[r][1], 64, "MASTER_PORT=%d", port);
      snprintf(env[r][2], 64, "RANK=%d", r);
      snprintf(env[r][3], 64, "LOCAL_RANK=%d", r);
      snprintf(env[r][4], 64, "WORLD_SIZE=%d", world);
      snprintf(env[r][5], 64, "OMP_NUM_THREADS=1");
      char *envp[] = {env[r][0], env[r][1], env[r][2], env[r][3], env[r][4], env[r][5], NULL};
      char *argv[] = {(char *)o->python,
                      (char *)o->torch_peer,
                      "--impl",
                      "torch-gloo",
                      "--out",
                      (char *)dir,
                      "--colls",
                      (char *)pa->colls,
                      "--sizes",
                      (char *)pa->sizes,
                      "--iters",
                      (char *)pa->iters,
                      "--warmup",
                      (char *)pa->warmup,
                      "--timeout-s",
                      to_s,
                      NULL};
      pids[r] = spawn(argv, envp, log);
    }
    rc = wait_all(pids, world, now_ms() + o->timeout_s * 1000, "torch-gloo");
  }
  if (rc) print_log_tail(log);
  return rc;
}

/* Open MPI's own collectives (tdist 0), or tdist's mpi backend on them (tdist 1: over shared
 * memory), under the same mpirun set-up. */
static int run_ompi(const opts_t *o, int world, const char *dir, const plan_args_t *pa, int shm,
                    int tdist) {
  const char *name = tdist ? "tdist-mpi" : shm ? "ompi-shm" : "ompi-tcp";
  char log[4200], np[16];
  snprintf(log, sizeof log, "%s/%s.%d.log", dir, name, world);
  snprintf(np, sizeof np, "%d", world);
  /* pml ob1 so the btl choice holds (the ucx pml would pick its own transports);
   * the TCP btl is pinned to loopback, the interface tdist and torch use here. */
  char *argv[] = {(char *)o->mpirun,
                  "--allow-run-as-root",
                  "--oversubscribe",
                  "-np",
                  np,
                  "--mca",
                  "pml",
                  "ob1",
                  "--mca",
                  "btl",
                  shm ? "self,vader" : "self,tcp",
                  "--mca",
                  "btl_tcp_if_include",
                  "lo",
                  "--mca",
                  "osc",
                  "^ucx",
                  (char *)o->mpi_peer,
                  "--impl",
                  (char *)name,
                  "--out",
                  (char *)dir,
                  "--colls",
                  (char *)pa->colls,
                  "--sizes",
                  (char *)pa->sizes,
                  "--iters",
                  (char *)pa->iters,
                  "--warmup",
                  (char *)pa->warmup,
                  tdist ? "--tdist" : NULL, /* NULL: the end, for Open MPI alone */
                  NULL};
  pid_t pid = spawn(argv, NULL, log);
  int rc = wait_all(&pid, 1, now_ms() + o->timeout_s * 1000, name);
  if (rc) print_log_tail(log);
  return rc;
}

int main(int argc, char **argv) {
  if (argc > 1 && !strcmp(argv[1], "--worker")) return worker_main(argc, argv);
  opts_t o;
  if (parse_opts(argc, argv, &o)) return 2;
  const char *notes[IMPL_COUNT] = {0};
  if (o.use[IMPL_TORCH] && access(o.torch_peer, R_OK) != 0) {
    notes[IMPL_TORCH] = "skipped (torch_peer.py not found; pass --torch-peer)";
    o.use[IMPL_TORCH] = 0;
  }
  if ((o.use[IMPL_OMPI_TCP] || o.use[IMPL_OMPI_SHM] || o.use[IMPL_TDIST_MPI]) &&
      (!o.mpi_peer || access(o.mpi_peer, X_OK))) {
    for (int i = IMPL_OMPI_TCP; i < IMPL_COUNT; i++)
      if (o.use[i] && (i == IMPL_OMPI_TCP || i == IMPL_OMPI_SHM || i == IMPL_TDIST_MPI))
        notes[i] = "skipped (no --mpi-peer binary; bench/collectives/run.sh builds it)";
    o.use[IMPL_OMPI_TCP] = o.use[IMPL_OMPI_SHM] = o.use[IMPL_TDIST_MPI] = 0;
  }
  if (o.use[IMPL_TDIST_MPI] && !getenv("TDIST_MPI_PLUGIN")) {
    notes[IMPL_TDIST_MPI] = "skipped (TDIST_MPI_PLUGIN unset; bench/collectives/run.sh sets it)";
    o.use[IMPL_TDIST_MPI] = 0;
  }
  const char *tmpenv = getenv("TEST_TMPDIR");
  char dir[4096];
  snprintf(dir, sizeof dir, "%s/coll_bench.XXXXXX", tmpenv && *tmpenv ? tmpenv : "/tmp");
  if (!mkdtemp(dir)) {
    perror("mkdtemp");
    return 1;
  }
  FILE *raw = NULL;
  if (o.tsv_path && !(raw = fopen(o.tsv_path, "w"))) {
    perror(o.tsv_path);
    return 1;
  }
  if (raw)
    fprintf(raw, "pass\timpl\tnranks\trank\tcoll\tbytes\tcount\tmedian_ns\tmin_ns\twrong\titers\n");
  tdist_store_server_options_t so = TDIST_STORE_SERVER_OPTIONS_INIT;
  so.host = "127.0.0.1";
  so.quiet = 1;
  tdist_store_server_t *srv = NULL;
  if (tdist_store_server_create(&so, &srv)) {
    fprintf(stderr, "coll_bench: cannot start the store: %s\n", tdist_last_error());
    return 1;
  }
  plan_args_t pa;
  plan_args(&o.plan, &pa);
  printf("# coll_bench (tdist %s): %ld CPUs; sizes %s; timed iterations %s; warm-up %s%s\n",
         tdist_version(), sysconf(_SC_NPROCESSORS_ONLN), pa.sizes, pa.iters, pa.warmup,
         o.repeat > 1 ? "; best of several passes" : "");
  fflush(stdout);
  int failures = 0;
  char failed_what[512] = "";
  for (int wi = 0; wi < o.nworlds; wi++) {
    int world = o.worlds[wi];
    for (int pass = 0; pass < o.repeat; pass++) {
      for (int impl = 0; impl < IMPL_COUNT; impl++) {
        if (!o.use[impl]) continue;
        int64_t t0 = now_ms();
        fprintf(stderr, "[coll_bench] %s, %d ranks%s ...\n", impl_names[impl], world,
                o.repeat > 1 ? " (pass)" : "");
        int rc;
        if (impl == IMPL_TDIST_TCP || impl == IMPL_TDIST_SHM)
          rc = run_tdist_ranks(&o, impl, world, pass, dir, tdist_store_server_port(srv), &pa);
        else if (impl == IMPL_TORCH)
          rc = run_torch(&o, world, dir, &pa);
        else
          rc = run_ompi(&o, world, dir, &pa, impl != IMPL_OMPI_TCP, impl == IMPL_TDIST_MPI);
        fprintf(stderr, "[coll_bench] %s, %d ranks: %s in %.1f s\n", impl_names[impl], world,
                rc ? "FAILED" : "done", (now_ms() - t0) / 1e3);
        if (rc) {
          failures++;
          size_t fl = strlen(failed_what);
          snprintf(failed_what + fl, sizeof failed_what - fl, " %s/%d", impl_names[impl], world);
        }
        collect(dir, impl, world, pass, o.keep, raw);
      }
    }
    print_tables(&o, world, notes);
  }
  int wrong = 0;
  for (int i = 0; i < ncells; i++) wrong += cells[i].wrong != 0;
  print_goals();
  if (raw) fclose(raw);
  tdist_store_server_destroy(srv);
  if (o.keep)
    fprintf(stderr, "[coll_bench] logs and per-rank results kept in %s\n", dir);
  else
    remove_dir(dir);
  if (failures) fprintf(stderr, "[coll_bench] failed runs:%s\n", failed_what);
  if (wrong) fprintf(stderr, "[coll_bench] %d cells had wrong results\n", wrong);
  free(cells);
  return failures || wrong ? 1 : 0;
}
