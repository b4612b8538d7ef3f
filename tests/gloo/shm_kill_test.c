/* No shared-memory segment outlives its job: ranks of gloo groups are killed with SIGKILL at
 * random moments of their set-up and of their collectives, and afterwards /dev/shm must hold no
 * name at all. Before segments were unnamed (shm.h), a rank killed between creating its segment
 * and the moment every peer had mapped it left a 1 MiB-per-rank file in /dev/shm for ever.
 *
 * Each iteration starts a job of 2 to 4 ranks (a store in the parent, as ranks.h does) whose
 * ranks create a group and run random all_reduce / broadcast / all_gather calls (ring, slot and
 * single-copy sizes) until a peer dies or they are done, and ends it one of three ways: one
 * random rank killed after a random delay (the others fail on their own, or are killed after a
 * grace period, as an agent stops a failed attempt), every rank killed at once after a random
 * delay, or a rank killed the moment a name shows in /dev/shm (the old leak window exactly; the
 * owner in the name's pid, if any, is the victim). A first job runs to its end and checks in
 * each rank's debug log that the pairs did use shared memory, so a leak-free run is not one that
 * fell back to TCP.
 *
 * Runs in a private mount namespace on a fresh tmpfs /dev/shm, so other tests' segments never
 * count (root, as in CI; elsewhere a skip, which fails unless TDIST_TEST_ALLOW_SKIP=1). The seed
 * is printed (TDIST_TEST_SEED=N replays the choices; the timing is the machine's).
 * SHM_KILL_ITERS=N changes the number of killed jobs (default 48). */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "clock.h"
#include "ranks.h"
#include "rng.h"
#include "skip.h"

#define MAX_WORLD 4
#define BIG \
  300000 /* floats: 1.2 MB, single copies (or the ring where process_vm_readv is refused) */

static const char *g_dir;
static uint64_t g_seed;

/* Runs up to `steps` random collectives; returns when done or at the first error (a dead peer). */
static int rank_body(int rank, int world, int port, uint64_t job, int steps) {
  tdist_store_t *store;
  tdist_pg_t *pg = tdist_test_init_pg(rank, world, port, 20000, &store);
  static float buf[BIG * MAX_WORLD], in[BIG];
  const size_t sizes[] = {2, 1000, 20000, BIG};
  test_rng_t r = {0};
  test_rng_seed(&r, g_seed ^ job * 0x9E3779B97F4A7C15ull); /* the same sequence on every rank */
  for (int s = 0; s < steps; s++) {
    size_t n = sizes[test_rng_below(&r, 4)];
    int op = (int)test_rng_below(&r, 3);
    for (size_t i = 0; i < n; i++) in[i] = (float)(tdist_test_rand(job, (uint64_t)rank, i) % 64);
    tdist_status_t st;
    if (op == 0) {
      memcpy(buf, in, n * sizeof(float));
      st = tdist_all_reduce(pg, buf, n, TDIST_FLOAT32, TDIST_SUM);
    } else if (op == 1) {
      memcpy(buf, in, n * sizeof(float));
      st = tdist_broadcast(pg, buf, n, TDIST_FLOAT32, s % world);
    } else {
      st = tdist_all_gather(pg, buf, in, n, TDIST_FLOAT32);
    }
    if (st) break;    /* a peer was killed: this rank fails as a real job's would */
    size_t i = n - 1; /* one element checked: what matters here is the segments, not the sums */
    float want = 0;
    if (op == 0)
      for (int k = 0; k < world; k++) want += (float)(tdist_test_rand(job, (uint64_t)k, i) % 64);
    else if (op == 1)
      want = (float)(tdist_test_rand(job, (uint64_t)(s % world), i) % 64);
    else {
      want = (float)(tdist_test_rand(job, (uint64_t)(world - 1), i) % 64);
      i += n * (size_t)(world - 1); /* the last rank's block */
    }
    CHECK(buf[i] == want);
  }
  tdist_pg_destroy(pg);
  tdist_store_destroy(store);
  return 0;
}

typedef struct {
  pid_t pid[MAX_WORLD];
  int world;
  tdist_store_server_t *srv;
} job_t;

/* Forks the ranks first, then starts the store (no thread in the parent while it forks). Each
 * rank's stderr goes to <dir>/shmkill.<rank>. */
static void job_start(job_t *j, int world, uint64_t id, int steps) {
  int pipes[MAX_WORLD][2];
  j->world = world;
  fflush(stderr);
  for (int r = 0; r < world; r++) {
    CHECK(pipe(pipes[r]) == 0);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
      alarm(60); /* belt and braces if the parent dies */
      char path[600];
      snprintf(path, sizeof path, "%s/shmkill.%d", g_dir, r);
      int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      if (fd >= 0) dup2(fd, 2);
      close(pipes[r][1]);
      int port = 0;
      if (read(pipes[r][0], &port, sizeof port) != (ssize_t)sizeof port || port <= 0) _exit(5);
      _exit(rank_body(r, world, port, id, steps));
    }
    close(pipes[r][0]);
    j->pid[r] = pid;
  }
  tdist_store_server_options_t so = TDIST_STORE_SERVER_OPTIONS_INIT;
  so.host = "127.0.0.1";
  so.quiet = 1;
  CHECK_OK_MSG(tdist_store_server_create(&so, &j->srv), tdist_last_error());
  int port = tdist_store_server_port(j->srv);
  for (int r = 0; r < world; r++) {
    CHECK(write(pipes[r][1], &port, sizeof port) == (ssize_t)sizeof port);
    close(pipes[r][1]);
  }
}

/* Waits up to grace_ms for every rank, then kills and reaps the rest. Returns how many ranks
 * exited 0 on their own. */
static int job_end(job_t *j, int64_t grace_ms) {
  int64_t deadline = now_ms() + grace_ms;
  int ok = 0;
  for (int r = 0; r < j->world; r++) {
    int st = 0;
    for (;;) {
      pid_t w = waitpid(j->pid[r], &st, WNOHANG);
      if (w == j->pid[r]) break;
      CHECK(w == 0);
      if (now_ms() > deadline) {
        kill(j->pid[r], SIGKILL);
        CHECK(waitpid(j->pid[r], &st, 0) == j->pid[r]);
        break;
      }
      sleep_ms(1);
    }
    ok += WIFEXITED(st) && WEXITSTATUS(st) == 0;
  }
  tdist_store_server_destroy(j->srv);
  return ok;
}

/* The first entry of /dev/shm into name (cap bytes); 0 when it is empty. */
static int shm_first(char *name, size_t cap) {
  DIR *d = opendir("/dev/shm");
  CHECK(d != NULL);
  struct dirent *e;
  int found = 0;
  while (!found && (e = readdir(d)) != NULL)
    if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) {
      snprintf(name, cap, "%s", e->d_name);
      found = 1;
    }
  closedir(d);
  return found;
}

static void check_no_names(int it, const char *how) {
  char name[256];
  if (!shm_first(name, sizeof name)) return;
  TEST_LOG("FAIL: job %d (%s): /dev/shm/%s was left behind (seed %llu)", it, how, name,
           (unsigned long long)g_seed);
  DIR *d = opendir("/dev/shm");
  struct dirent *e;
  while (d && (e = readdir(d)) != NULL)
    if (e->d_name[0] != '.') TEST_LOG("  left: /dev/shm/%s", e->d_name);
  if (d) closedir(d);
  exit(1);
}

/* The rank whose pid a segment name holds (the old names were /tdist-<pid>-...), else -1. */
static int owner_of(const job_t *j, const char *name) {
  const char *p = strpbrk(name, "0123456789");
  int pid = p ? atoi(p) : 0;
  for (int r = 0; r < j->world; r++)
    if (j->pid[r] == pid) return r;
  return -1;
}

static void control_job(void) {
  job_t j;
  job_start(&j, 3, 1, 40);
  CHECK_EQ_INT(job_end(&j, 120000), 3);
  for (int r = 0; r < 3; r++) {
    char path[600], text[8192];
    snprintf(path, sizeof path, "%s/shmkill.%d", g_dir, r);
    FILE *f = fopen(path, "r");
    CHECK(f != NULL);
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = '\0';
    if (!strstr(text, "2 peers over shared memory")) {
      TEST_LOG("rank %d of the control job did not link its peers over shared memory:\n%s", r,
               text);
      CHECK(0);
    }
  }
  check_no_names(0, "ran to its end");
  TEST_LOG("control job: 3 ranks linked over shared memory, ran to the end, /dev/shm empty");
}

int main(void) {
  if (unshare(CLONE_NEWNS) != 0 || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0 ||
      mount("tdist-kill-shm", "/dev/shm", "tmpfs", 0, "size=256m") != 0) {
    test_skip("shm_kill_test: cannot mount a private tmpfs on /dev/shm (%s); needs root",
              strerror(errno));
    return 0;
  }
  setenv("TDIST_LOG_LEVEL", "debug", 1);
  g_dir = getenv("TEST_TMPDIR") ? getenv("TEST_TMPDIR") : "/tmp";
  g_seed = test_seed("shm_kill_test", 0);
  test_rng_t rng;
  test_rng_seed(&rng, g_seed);
  control_job();
  int iters = getenv("SHM_KILL_ITERS") ? atoi(getenv("SHM_KILL_ITERS")) : 48;
  int by_mode[3] = {0, 0, 0}, on_name = 0;
  for (int it = 1; it <= iters; it++) {
    int world = 2 + (int)test_rng_below(&rng, MAX_WORLD - 1);
    int mode = (int)test_rng_below(&rng, 3);
    /* Mostly inside set-up (a few ms), sometimes well into the collectives. */
    int64_t delay_us = test_rng_below(&rng, 4) ? (int64_t)test_rng_below(&rng, 30000)
                                               : (int64_t)test_rng_below(&rng, 300000);
    int victim = (int)test_rng_below(&rng, (uint64_t)world);
    job_t j;
    job_start(&j, world, (uint64_t)it + 1, 1000);
    const char *how = mode == 0 ? "one rank killed" : mode == 1 ? "all killed" : "killed on a name";
    int64_t until = now_us() + delay_us;
    if (mode == 2) {
      /* Poll for a name until the delay ends (with unnamed segments none ever shows). */
      char name[256];
      while (now_us() < until) {
        if (shm_first(name, sizeof name)) {
          int o = owner_of(&j, name);
          if (o >= 0) victim = o;
          on_name++;
          break;
        }
      }
    } else {
      usleep((useconds_t)delay_us);
    }
    if (mode == 1)
      for (int r = 0; r < world; r++) kill(j.pid[r], SIGKILL);
    else
      kill(j.pid[victim], SIGKILL);
    by_mode[mode]++;
    /* The survivors see the dead peer's socket close (or time out waiting for it at set-up):
     * what is still running after the grace period is killed, as an agent ends an attempt. */
    job_end(&j, 1500);
    check_no_names(it, how);
  }
  TEST_LOG(
      "ok: %d jobs killed (%d one rank, %d all, %d on a name of which %d saw one), "
      "/dev/shm empty after each",
      iters, by_mode[0], by_mode[1], by_mode[2], on_name);
  return 0;
}
