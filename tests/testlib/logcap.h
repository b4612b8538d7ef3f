/* Which transport and all_reduce algorithm really ran, read from libtdist's own debug log lines:
 * with TDIST_LOG_LEVEL=debug each rank logs "gloo: rank R: N peers over shared memory" once per
 * group that set up shared-memory links, and "gloo: all_reduce B bytes, W ranks: ALGO" for every
 * all_reduce that moved data (runtime/gloo/shm/setup.c, gloo.c). A rank's process captures its own
 * stderr (fd 2, where the library writes) in a file between logcap_begin and logcap_end and
 * counts those lines; a CHECK failure in between (exit) copies the capture back to stderr.
 *
 * The level is read once per process: call logcap_enable_debug() at the top of main, before
 * anything of libtdist runs (forked ranks inherit it). */
#ifndef TDIST_TESTLIB_LOGCAP_H
#define TDIST_TESTLIB_LOGCAP_H

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static inline void logcap_enable_debug(void) { setenv("TDIST_LOG_LEVEL", "debug", 1); }

static int logcap_saved_fd_ = -1; /* the real stderr while capturing */
static char logcap_path_[512];

/* Copies the capture so far to the real stderr. */
static inline void logcap_dump_(void) {
  if (logcap_saved_fd_ < 0) return;
  int fd = open(logcap_path_, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  char b[4096];
  ssize_t n;
  while ((n = read(fd, b, sizeof b)) > 0)
    if (write(logcap_saved_fd_, b, (size_t)n) != n) break;
  close(fd);
}

static inline void logcap_atexit_(void) {
  if (logcap_saved_fd_ < 0) return;
  fflush(stderr);
  logcap_dump_();
  dup2(logcap_saved_fd_, 2);
}

/* Starts capturing fd 2 in a file named after tag (unique per process). */
static inline void logcap_begin(const char *tag) {
  static int registered;
  const char *dir = getenv("TEST_TMPDIR") ? getenv("TEST_TMPDIR") : "/tmp";
  snprintf(logcap_path_, sizeof logcap_path_, "%s/logcap.%s.%d", dir, tag, (int)getpid());
  int fd = open(logcap_path_, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    fprintf(stderr, "logcap: cannot create %s\n", logcap_path_);
    exit(1);
  }
  fflush(stderr);
  logcap_saved_fd_ = dup(2);
  dup2(fd, 2);
  close(fd);
  if (!registered) atexit(logcap_atexit_);
  registered = 1;
}

/* Stops capturing; returns the captured text (malloc'd, NUL-terminated; free it). */
static inline char *logcap_end(void) {
  fflush(stderr);
  FILE *f = fopen(logcap_path_, "r");
  char *text = NULL;
  size_t len = 0;
  if (f) {
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    text = malloc(n > 0 ? (size_t)n + 1 : 1);
    if (text) len = fread(text, 1, n > 0 ? (size_t)n : 0, f);
    fclose(f);
  }
  dup2(logcap_saved_fd_, 2);
  close(logcap_saved_fd_);
  logcap_saved_fd_ = -1;
  unlink(logcap_path_);
  if (!text) {
    fprintf(stderr, "logcap: cannot read back %s\n", logcap_path_);
    exit(1);
  }
  text[len] = 0;
  return text;
}

/* Number of lines of text that contain needle. */
static inline int logcap_count(const char *text, const char *needle) {
  int n = 0;
  for (const char *p = text; *p;) {
    const char *eol = strchr(p, '\n');
    size_t l = eol ? (size_t)(eol - p) : strlen(p);
    const char *hit = strstr(p, needle);
    if (hit && hit < p + l) n++;
    p += l + (eol != NULL);
  }
  return n;
}

/* Checks the capture of one rank of a group of `world` same-host ranks: with shm set, the group
 * linked every other rank over shared memory (one "rank R: world-1 peers over shared memory"
 * line); without, no pair uses shared memory (no such line at all). Prints the capture and exits
 * 1 otherwise. groups: how many groups this rank created with the same members (each logs). */
static inline void logcap_expect_transport(const char *text, int rank, int world, int shm,
                                           int groups) {
  char want[96];
  snprintf(want, sizeof want, "gloo: rank %d: %d peers over shared memory", rank, world - 1);
  int got_any = logcap_count(text, "peers over shared memory");
  int got = logcap_count(text, want);
  int ok = shm && world > 1 ? got == groups && got_any == groups : got_any == 0;
  if (!ok) {
    fprintf(stderr,
            "%s\nlogcap: rank %d of %d: expected %s, found %d line(s) '%s' and %d mentioning "
            "shared memory (capture above)\n",
            text, rank, world,
            shm && world > 1 ? "every peer over shared memory" : "TCP only (no shared memory)", got,
            want, got_any);
    exit(1);
  }
}

/* Checks that exactly `ring` all_reduce calls ran the ring, `rd` recursive doubling and
 * `direct` the direct algorithm. */
static inline void logcap_expect_algos3(const char *text, int rank, int ring, int rd, int direct) {
  int got_ring = logcap_count(text, "ranks: ring");
  int got_rd = logcap_count(text, "ranks: recursive doubling");
  int got_direct = logcap_count(text, "ranks: direct");
  if (got_ring != ring || got_rd != rd || got_direct != direct) {
    fprintf(stderr,
            "%s\nlogcap: rank %d: all_reduce ran the ring %d time(s), recursive doubling %d and "
            "direct %d; expected %d, %d and %d (capture above)\n",
            text, rank, got_ring, got_rd, got_direct, ring, rd, direct);
    exit(1);
  }
}

static inline void logcap_expect_algos(const char *text, int rank, int ring, int rd) {
  logcap_expect_algos3(text, rank, ring, rd, 0);
}

#endif
