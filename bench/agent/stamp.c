/* The worker of the agent benchmark: first thing in main it reads CLOCK_REALTIME and writes
 * "<ns> <pid>\n" to $OUTDIR/$LOCAL_RANK, then sleeps argv[1] seconds (default 0) and exits 0.
 *
 * The launchers under test start it directly (tdist-agent -- stamp, torchrun --no_python stamp),
 * so the stamp marks the moment the worker exec'd. It must never link anything heavy or do work
 * before the clock read. The pid lets run.sh find and kill a worker a launcher left behind.
 * Exit codes: 0 ok, 2 no OUTDIR/LOCAL_RANK, 3 the stamp file could not be written. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

int main(int argc, char **argv) {
  struct timespec now;
  clock_gettime(CLOCK_REALTIME, &now);

  const char *dir = getenv("OUTDIR"), *rank = getenv("LOCAL_RANK");
  if (!dir || !*dir || !rank || !*rank) {
    fprintf(stderr,
            "stamp: OUTDIR (%s) and LOCAL_RANK (%s) must be set by the launcher's "
            "environment\n",
            dir ? dir : "unset", rank ? rank : "unset");
    return 2;
  }
  char path[4096], line[64];
  snprintf(path, sizeof path, "%s/%s", dir, rank);
  int n = snprintf(line, sizeof line, "%lld %d\n",
                   (long long)now.tv_sec * 1000000000LL + now.tv_nsec, (int)getpid());
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0 || write(fd, line, (size_t)n) != n || close(fd) != 0) {
    fprintf(stderr, "stamp: writing %s: %s\n", path, strerror(errno));
    return 3;
  }

  double sleep_s = argc > 1 ? strtod(argv[1], NULL) : 0.0;
  if (sleep_s > 0) {
    struct timespec d = {(time_t)sleep_s, (long)((sleep_s - (double)(time_t)sleep_s) * 1e9)};
    while (nanosleep(&d, &d) != 0 && errno == EINTR) {
    }
  }
  return 0;
}
