/* A worker with a known footprint for the per-rank process metrics test (rank_metrics_test.sh):
 * it touches RSS_MB MiB, writes WRITE_BYTES bytes to DIR/out.RANK with write(2), starts THREADS
 * threads (named "rpw-N") that block on a pipe, creates DIR/ready.RANK, then waits in read(2)
 * on the FIFO DIR/fifo, as a rank waits on a peer's socket. SIGUSR2 makes it spin on the CPU
 * forever (a rank stuck in a Python loop). The rank EXIT_RANK exits 0 at once.
 *   rank_proc_worker RSS_MB WRITE_BYTES THREADS DIR EXIT_RANK */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static volatile sig_atomic_t spin;
static int block_fd[2];

static void on_usr2(int sig) {
  (void)sig;
  spin = 1;
}

static void *blocker(void *arg) {
  char name[16], c;
  snprintf(name, sizeof name, "rpw-%d", (int)(long)arg);
  pthread_setname_np(pthread_self(), name);
  while (read(block_fd[0], &c, 1) < 0 && errno == EINTR) {
  }
  return NULL;
}

int main(int argc, char **argv) {
  if (argc != 6) {
    fprintf(stderr, "usage: rank_proc_worker RSS_MB WRITE_BYTES THREADS DIR EXIT_RANK\n");
    return 2;
  }
  const char *r = getenv("RANK");
  int rank = r ? atoi(r) : 0, threads = atoi(argv[3]);
  size_t rss = (size_t)atol(argv[1]) << 20, wbytes = (size_t)atol(argv[2]);
  if (rank == atoi(argv[5])) return 0;
  char *mem = malloc(rss > wbytes ? rss : wbytes);
  if (!mem) return 3;
  memset(mem, 7, rss > wbytes ? rss : wbytes);
  char path[4096];
  snprintf(path, sizeof path, "%s/out.%d", argv[4], rank);
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return 3;
  for (size_t done = 0; done < wbytes;) {
    ssize_t w = write(fd, mem + done, wbytes - done);
    if (w <= 0) return 3;
    done += (size_t)w;
  }
  close(fd);
  if (pipe(block_fd)) return 3;
  /* SIGUSR2 must reach the main thread: the others are created with it blocked */
  sigset_t usr2;
  sigemptyset(&usr2);
  sigaddset(&usr2, SIGUSR2);
  pthread_sigmask(SIG_BLOCK, &usr2, NULL);
  for (long i = 0; i < threads; i++) {
    pthread_t t;
    if (pthread_create(&t, NULL, blocker, (void *)i)) return 3;
  }
  pthread_sigmask(SIG_UNBLOCK, &usr2, NULL);
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_usr2; /* no SA_RESTART: the read below returns EINTR */
  sigaction(SIGUSR2, &sa, NULL);
  snprintf(path, sizeof path, "%s/fifo", argv[4]);
  int ff = open(path, O_RDWR | O_CLOEXEC); /* O_RDWR: never blocks in open, never sees EOF */
  if (ff < 0) return 3;
  snprintf(path, sizeof path, "%s/ready.%d", argv[4], rank);
  close(open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0600));
  char c;
  while (!spin) {
    if (read(ff, &c, 1) == 1) break;
  }
  volatile unsigned long x = 0;
  for (;;) x++;
}
