/* Per-rank collective statistics in the shared-memory file named by TDIST_STATS_FILE (layout and
 * contract: include/tdist/stats.h). The hot path is one atomic add (the flight-recorder slot),
 * one compare-and-swap per update of a flight entry (claiming it), plain stores to counters this
 * thread alone writes (or atomic adds on any other thread) and one clock_gettime call per
 * collective (the start time is the caller's deadline reading); no locks, no system calls. The file
 * is mapped once per process by the first (world) group and never unmapped: workers exit with it
 * mapped, and a late collective on another thread must never touch freed memory. Never fails a
 * collective: any problem with the file disables statistics with one log line. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "runtime/common/clock.h"
#include "runtime/common/log.h"
#include "runtime/common/param.h"
#include "runtime/common/status_internal.h"
#include "runtime/pg/stats.h"

static tdist_stats_file_t *g_file; /* set once, under g_mu */
static int g_owner_taken;          /* atomic: some thread owns the plain counters */
static __thread int t_role;        /* this thread: 0 = not yet known, 1 = owner, 2 = other */
static int g_groups;               /* groups registered so far */
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;

static const double k_le[TDIST_STATS_BUCKETS] = {1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2,
                                                 0.1,  0.3,  1,    3,    10,   30,   100,  300};

TDIST_EXTERN const char *tdist_stats_op_name(int op) {
  return op >= 0 && op < TDIST_STATS_OPS ? tdist__coll_name((tdist__coll_kind_t)op) : "unknown";
}

TDIST_EXTERN double tdist_stats_bucket_le(int i) {
  return i >= 0 && i < TDIST_STATS_BUCKETS ? k_le[i] : 0;
}

/* Times are taken on CLOCK_MONOTONIC (durations) and written as CLOCK_REALTIME, which is
 * CLOCK_MONOTONIC plus an offset that only a clock step (settimeofday, an NTP step) changes:
 * NTP's slewing moves both clocks alike. The offset is re-read at most once a second, so a step
 * shows within a second. It is read realtime first, so it errs low by the ~30 ns between the two
 * readings and a stamp never runs ahead of a CLOCK_REALTIME read taken after it. */
static int64_t g_rt_offset; /* CLOCK_REALTIME - CLOCK_MONOTONIC, ns (atomic) */
static int64_t g_rt_next;   /* CLOCK_MONOTONIC ns at which to re-read it (atomic) */

static void refresh_rt_offset(void) {
  struct timespec rt;
  clock_gettime(CLOCK_REALTIME, &rt);
  int64_t mono = tdist__now_ns();
  __atomic_store_n(&g_rt_offset, (int64_t)rt.tv_sec * 1000000000LL + rt.tv_nsec - mono,
                   __ATOMIC_RELAXED);
  __atomic_store_n(&g_rt_next, mono + 1000000000LL, __ATOMIC_RELAXED);
}

/* Reader: attempts at a stable copy of one stamped block; after STAMP_SPINS it yields between
 * attempts, so a preempted writer gets the CPU back (2 cores, 4 ranks + the agent). */
#define STAMP_SPINS 100
#define STAMP_TRIES 300

#define LOAD(p) __atomic_load_n((p), __ATOMIC_ACQUIRE)
#define STORE(p, v) __atomic_store_n((p), (v), __ATOMIC_RELEASE)
/* The blocks under a stamp (a seqlock: odd while being written) are read while written, so
 * their fields are atomics too, stored with release and loaded with acquire (plain moves on x86):
 * a reader that sees any field of an update also sees the stamp made odd before it, so the stamp
 * it re-reads differs. No fences: TSan does not model them (gcc refuses them under -Werror).
 * A flight entry can have two writers at once: threads share the ring, and a thread preempted
 * while writing slot i (or whose op is still running when the ring comes round to i again) meets
 * the thread whose op took slot i next. TSan saw exactly that in stats_test's four-thread case:
 * two tdist__stats_begin in one entry, the second started while the first was mid-write (both
 * made the stamp odd, then even, so a reader could take a mix of the two ops for a whole entry).
 * So a writer first claims the entry, turning its stamp from even to odd with a
 * compare-and-swap, and leaves it alone if another writer holds it: the ring loses that record
 * (it is lossy by design), never mixes two. */
#define RLX(p) __atomic_load_n((p), __ATOMIC_RELAXED)
/* 1 if this thread now holds the block whose stamp it read as *s (even) and made odd. */
#define CLAIM(stamp, s) \
  (!(*(s)&1) &&         \
   __atomic_compare_exchange_n((stamp), (s), *(s) + 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED))
#define ADD(p, v) __atomic_fetch_add((p), (v), __ATOMIC_RELAXED)
/* Only for counters with a single writer: a plain add, stored whole for concurrent readers. */
#define BUMP(p, v) \
  __atomic_store_n((p), __atomic_load_n((p), __ATOMIC_RELAXED) + (v), __ATOMIC_RELAXED)

/* The first thread to ask becomes the owner of the plain counters, for the process's life. */
static int is_owner(void) {
  if (!t_role) {
    int no = 0;
    t_role =
        __atomic_compare_exchange_n(&g_owner_taken, &no, 1, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED)
            ? 1
            : 2;
  }
  return t_role == 1;
}

/* A forked child shares the mapping with its parent, whose owner keeps writing: the child's
 * threads (the forking one included, whatever its role was) use the shared set. */
static void atfork_child(void) {
  __atomic_store_n(&g_owner_taken, 1, __ATOMIC_RELAXED);
  t_role = 2;
}

static tdist_stats_file_t *map_file(const char *path, int rank, int world_size) {
  int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    tdist__log(TDIST__LOG_WARN, "stats", "TDIST_STATS_FILE=%s: open: %s; statistics disabled", path,
               strerror(errno));
    return NULL;
  }
  void *p = MAP_FAILED;
  if (ftruncate(fd, (off_t)sizeof(tdist_stats_file_t)) == 0)
    p = mmap(NULL, sizeof(tdist_stats_file_t), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  int e = errno;
  close(fd);
  if (p == MAP_FAILED) {
    tdist__log(TDIST__LOG_WARN, "stats", "TDIST_STATS_FILE=%s: %s; statistics disabled", path,
               strerror(e));
    return NULL;
  }
  tdist_stats_file_t *f = p;
  /* A new attempt reuses no file (the agent names one per attempt), but a user may: start over.
   * The magic goes last so a reader never sees a half-initialised header as valid. */
  STORE(&f->magic, 0u);
  memset((char *)f + sizeof f->magic, 0, sizeof *f - sizeof f->magic);
  f->version = TDIST_STATS_VERSION;
  f->size = (uint32_t)sizeof *f;
  f->rank = rank;
  f->world_size = world_size;
  f->pid = (int32_t)getpid();
  f->cur_op = -1;
  f->cur_peer = -1;
  STORE(&f->magic, TDIST_STATS_MAGIC);
  return f;
}

int tdist__stats_register(int rank, int world_size) {
  pthread_mutex_lock(&g_mu);
  int group = g_groups++;
  if (group == 0) {
    const char *path = tdist__param_str(TDIST__P_STATS_FILE);
    if (path) g_file = map_file(path, rank, world_size);
    if (g_file) {
      refresh_rt_offset();
      pthread_atfork(NULL, NULL, atfork_child);
    }
  }
  int enabled = g_file != NULL;
  pthread_mutex_unlock(&g_mu);
  return enabled ? group : -1;
}

static int32_t peer_of(const tdist__coll_t *c) {
  switch (c->kind) {
    case TDIST__COLL_SEND:
    case TDIST__COLL_RECV: return c->peer;
    case TDIST__COLL_BROADCAST:
    case TDIST__COLL_REDUCE:
    case TDIST__COLL_GATHER:
    case TDIST__COLL_SCATTER: return c->root;
    default: return -1;
  }
}

/* count x dtype size, except all_to_all: it has no single count (the v form leaves c->count 0),
 * so its bytes are the rank's whole input, the sum of in_counts, for the uniform form too, so
 * that both forms agree under the one op name. */
static uint64_t bytes_of(int size, const tdist__coll_t *c) {
  if (c->kind == TDIST__COLL_BARRIER || c->kind == TDIST__COLL_MONITORED_BARRIER) return 0;
  uint64_t n = c->count;
  if (c->kind == TDIST__COLL_ALL_TO_ALL_V && c->in_counts && size > 0) {
    n = 0;
    for (int r = 0; r < size; r++) n += c->in_counts[r];
  }
  return n * tdist_dtype_size(c->dtype);
}

void tdist__stats_begin(int group, int group_size, const tdist__coll_t *c, int64_t now_ns,
                        tdist__stats_op_t *op) {
  tdist_stats_file_t *f = g_file;
  op->slot = -1;
  if (group < 0 || !f) return;
  op->bytes = bytes_of(group_size, c);
  op->start_mono_ns = now_ns;
  op->start_ns = now_ns + __atomic_load_n(&g_rt_offset, __ATOMIC_RELAXED);
  uint64_t i = ADD(&f->flight_next, 1);
  tdist_stats_flight_t *e = &f->flight[i % TDIST_STATS_FLIGHT];
  op->slot = (int64_t)(i % TDIST_STATS_FLIGHT);
  op->flight = 0;
  uint64_t s = LOAD(&e->stamp);
  if (CLAIM(&e->stamp, &s)) {
    op->flight = 1;
    STORE(&e->seq, c->seq);
    STORE(&e->op, (int32_t)c->kind);
    STORE(&e->status, (int32_t)TDIST_ERR_IN_PROGRESS);
    STORE(&e->start_ns, op->start_ns);
    STORE(&e->end_ns, (int64_t)0);
    STORE(&e->bytes, op->bytes);
    STORE(&e->peer, peer_of(c));
    STORE(&e->group, (int32_t)group);
    STORE(&e->stamp, s + 2);
  }
  if (group == 0) { /* one writer: group 0's collectives run one at a time */
    uint64_t cs = LOAD(&f->cur_stamp);
    STORE(&f->cur_stamp, cs | 1);
    STORE(&f->cur_seq, c->seq);
    STORE(&f->cur_op, (int32_t)c->kind);
    STORE(&f->cur_peer, peer_of(c));
    STORE(&f->cur_start_ns, op->start_ns);
    STORE(&f->cur_stamp, (cs | 1) + 1);
  }
}

void tdist__stats_end(int group, const tdist__coll_t *c, const tdist__stats_op_t *op,
                      tdist_status_t st) {
  tdist_stats_file_t *f = g_file;
  if (group < 0 || !f || op->slot < 0) return;
  int64_t mono = tdist__now_ns();
  if (mono >= __atomic_load_n(&g_rt_next, __ATOMIC_RELAXED)) refresh_rt_offset();
  int k = (int)c->kind;
  uint64_t dur = mono > op->start_mono_ns ? (uint64_t)(mono - op->start_mono_ns) : 0;
  int64_t end = op->start_ns + (int64_t)dur; /* on the start's timeline: never before it */
  int b = 0;
  while (b < TDIST_STATS_BUCKETS && (double)dur > k_le[b] * 1e9) b++;
  if (is_owner()) {
    BUMP(&f->ops[k], 1);
    BUMP(&f->bytes[k], op->bytes);
    if (st != TDIST_OK) BUMP(&f->errors[k], 1);
    BUMP(&f->duration_ns_sum[k], dur);
    BUMP(&f->hist[k][b], 1);
  } else {
    ADD(&f->shared_ops[k], 1);
    ADD(&f->shared_bytes[k], op->bytes);
    if (st != TDIST_OK) ADD(&f->shared_errors[k], 1);
    ADD(&f->shared_duration_ns_sum[k], dur);
    ADD(&f->shared_hist[k][b], 1);
  }
  tdist_stats_flight_t *e = &f->flight[op->slot];
  uint64_t s = LOAD(&e->stamp);
  /* Still this op's entry (not taken by a newer op since: that would have moved the stamp, and
   * the claim would fail), and no other writer in it. */
  if (op->flight && RLX(&e->seq) == c->seq && RLX(&e->start_ns) == op->start_ns &&
      CLAIM(&e->stamp, &s)) {
    STORE(&e->status, (int32_t)st);
    STORE(&e->end_ns, end);
    STORE(&e->stamp, s + 2);
  }
  if (group == 0) {
    uint64_t cs = LOAD(&f->cur_stamp);
    STORE(&f->cur_stamp, cs | 1);
    STORE(&f->cur_seq, (uint64_t)0);
    STORE(&f->cur_op, (int32_t)-1);
    STORE(&f->cur_peer, (int32_t)-1);
    STORE(&f->cur_start_ns, (int64_t)0);
    if (st == TDIST_OK) STORE(&f->last_seq, c->seq);
    STORE(&f->cur_stamp, (cs | 1) + 1);
  }
}

/* ---------------------------------------------------------------------------------------- */
/* Reader                                                                                    */

TDIST_EXTERN tdist_status_t tdist_stats_read(const char *path, tdist_stats_file_t *out) {
  if (!path || !out)
    return tdist__fail(TDIST_ERR_INVALID_ARGUMENT, "tdist_stats_read: NULL argument");
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int e = errno;
    return tdist__fail(e == ENOENT ? TDIST_ERR_NOT_FOUND : TDIST_ERR_SYSTEM, "stats file %s: %s",
                       path, strerror(e));
  }
  struct stat sb = {0};
  void *p = MAP_FAILED;
  if (fstat(fd, &sb) == 0 && sb.st_size >= (off_t)sizeof(tdist_stats_file_t))
    p = mmap(NULL, sizeof(tdist_stats_file_t), PROT_READ, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED)
    return tdist__fail(TDIST_ERR_PROTOCOL, "stats file %s: not a tdist stats file (size %lld)",
                       path, (long long)sb.st_size);
  const tdist_stats_file_t *f = p;
  tdist_status_t rc = TDIST_OK;
  if (LOAD(&f->magic) != TDIST_STATS_MAGIC || f->version != TDIST_STATS_VERSION ||
      f->size != sizeof *f) {
    rc = tdist__fail(TDIST_ERR_PROTOCOL, "stats file %s: magic/version/size mismatch", path);
    goto out;
  }
  /* Counters are independent and each stored whole: each is loaded once (atomically: writers
   * store them meanwhile) and the two sets are summed. The in-flight block and each flight
   * entry are copied under their stamps. A writer preempted in the middle of an update keeps its
   * stamp odd for a while: spin briefly, then yield to it. One that never finishes (killed or
   * stopped mid-update) leaves a half-written block that no retry can make whole: it reads as
   * not in flight / an empty slot, never as a torn copy. */
  memset(out, 0, sizeof *out);
  out->magic = f->magic;
  out->version = f->version;
  out->size = f->size;
  out->rank = f->rank;
  out->world_size = f->world_size;
  out->pid = f->pid;
  for (int k = 0; k < TDIST_STATS_OPS; k++) {
    out->ops[k] = RLX(&f->ops[k]) + RLX(&f->shared_ops[k]);
    out->bytes[k] = RLX(&f->bytes[k]) + RLX(&f->shared_bytes[k]);
    out->errors[k] = RLX(&f->errors[k]) + RLX(&f->shared_errors[k]);
    out->duration_ns_sum[k] = RLX(&f->duration_ns_sum[k]) + RLX(&f->shared_duration_ns_sum[k]);
    for (int b = 0; b <= TDIST_STATS_BUCKETS; b++)
      out->hist[k][b] = RLX(&f->hist[k][b]) + RLX(&f->shared_hist[k][b]);
  }
  out->flight_next = RLX(&f->flight_next);
  int got = 0;
  for (int tries = 0; tries < STAMP_TRIES && !got; tries++) {
    if (tries >= STAMP_SPINS) sched_yield();
    uint64_t s1 = LOAD(&f->cur_stamp);
    if (s1 & 1) continue;
    out->cur_seq = LOAD(&f->cur_seq);
    out->cur_op = LOAD(&f->cur_op);
    out->cur_peer = LOAD(&f->cur_peer);
    out->cur_start_ns = LOAD(&f->cur_start_ns);
    out->last_seq = LOAD(&f->last_seq);
    got = LOAD(&f->cur_stamp) == s1;
    out->cur_stamp = s1;
  }
  if (!got) {
    out->cur_seq = 0;
    out->cur_op = -1;
    out->cur_peer = -1;
    out->cur_start_ns = 0;
    out->last_seq = LOAD(&f->last_seq);
  }
  for (int i = 0; i < TDIST_STATS_FLIGHT; i++) {
    const tdist_stats_flight_t *e = &f->flight[i];
    tdist_stats_flight_t *o = &out->flight[i];
    got = 0;
    for (int tries = 0; tries < STAMP_TRIES && !got; tries++) {
      if (tries >= STAMP_SPINS) sched_yield();
      uint64_t s1 = LOAD(&e->stamp);
      if (s1 & 1) continue;
      o->seq = LOAD(&e->seq);
      o->op = LOAD(&e->op);
      o->status = LOAD(&e->status);
      o->start_ns = LOAD(&e->start_ns);
      o->end_ns = LOAD(&e->end_ns);
      o->bytes = LOAD(&e->bytes);
      o->peer = LOAD(&e->peer);
      o->group = LOAD(&e->group);
      o->stamp = s1;
      got = LOAD(&e->stamp) == s1;
    }
    if (!got) memset(o, 0, sizeof *o);
  }
out:
  munmap(p, sizeof(tdist_stats_file_t));
  return rc;
}
