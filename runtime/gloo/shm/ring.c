/* See ring.h. Never blocks; the caller decides how to wait. Never names a segment. */
#define _GNU_SOURCE
#include "runtime/gloo/shm/ring.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <linux/futex.h>
#include <linux/membarrier.h>
#include <pthread.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14 */
#endif

/* The segment starts with the owner's doorbell: a futex word that every writer into the owner's
 * rings (and every reader that frees space in a ring the owner writes) bumps when the owner
 * says it is sleeping. One cache line, before the rings.
 *
 * A writer stores its bytes, then loads `sleeping`; the owner stores `sleeping`, then looks at
 * its rings again before it sleeps. Each side needs a store-load barrier between the two, or
 * both can miss the other (a lost wake-up, which the sleep's 1 ms cap bounds). A full fence on
 * the writer's side costs the wait for its store to reach the reader's core on every message:
 * 40% of an 8-byte all_reduce's samples, and a streaming broadcast root 0.28 us a call against
 * 0.16 without it. So the barrier is asymmetric where the kernel allows (Linux's membarrier,
 * as userspace RCU uses it): the owner, about to sleep, makes every CPU that runs a registered
 * process execute a full barrier (MEMBARRIER_CMD_GLOBAL_EXPEDITED, a few microseconds, once per
 * sleep), and the writers, registered, need only keep the compiler from reordering. `asym`
 * says that the owner does this; a writer drops its fence only when it is registered itself
 * (the owner's barrier reaches it) and the owner's `asym` is set. Otherwise (an old kernel, a
 * seccomp profile without membarrier) both sides fence as before. */
typedef struct {
  _Alignas(64) _Atomic uint32_t doorbell;
  _Atomic uint32_t sleeping;
  _Atomic uint32_t asym; /* the owner issues the membarrier before sleeping */
  uint64_t cookie;       /* set at creation, before any peer maps it; checked by peers */
} seg_hdr_t;

/* This process is registered for MEMBARRIER_CMD_GLOBAL_EXPEDITED (set once, at the first
 * segment it creates or maps). */
static _Atomic int g_membarrier;
static pthread_once_t g_membarrier_once = PTHREAD_ONCE_INIT;

static void membarrier_register(void) {
  long cmds = syscall(SYS_membarrier, MEMBARRIER_CMD_QUERY, 0, 0);
  int ok = cmds > 0 && (cmds & MEMBARRIER_CMD_GLOBAL_EXPEDITED) &&
           syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED, 0, 0) == 0;
  atomic_store_explicit(&g_membarrier, ok, memory_order_relaxed);
}

static int membarrier_registered(void) {
  pthread_once(&g_membarrier_once, membarrier_register);
  return atomic_load_explicit(&g_membarrier, memory_order_relaxed);
}

/* Small writes go through slots instead of the byte ring when the ring holds nothing unread:
 * a slot is one cache line, its stamp and up to 56 bytes, and a write of up to 448 bytes takes
 * as many consecutive slots as it needs, each a piece of the stream with its own stamp. The
 * consumer then finds each line complete by its own stamp, so a small message moves only its
 * lines to the consumer, not also the head's, and the loads of several lines overlap (Open
 * MPI's vader calls these fast boxes). The stamp is (slot write number + 1) << 16 | length,
 * stored last. The stream stays in order because the producer uses slots only when the consumer
 * has read every ring byte written before, and the consumer reads waiting slots before any ring
 * byte: ring bytes written after a slot come after it. Slots are freed in order (fb_tail); when
 * too few are free, or the ring holds unread bytes, writes go to the ring. 2 ranks, against
 * one-slot writes: 64 B all_reduce 0.51 -> 0.30 us, 256 B 0.55 -> 0.47. A stream the consumer
 * lags behind is faster through the ring (several messages a line, lines not in the consumer's
 * cache): once the slots run out, small writes stay there a while (fb_write). */
#define FB_SLOTS 16
#define FB_BYTES 64
#define FB_DATA (FB_BYTES - 8)
#define FB_MAX_LINES 8 /* writes of up to 8 slots' data (448 bytes) go through the slots */
/* While the ring is busy, small writes look whether it emptied this often (fb_write). */
#define FB_RECHECK 16

typedef struct {
  _Alignas(64) _Atomic uint64_t stamp;
  uint8_t data[FB_DATA];
} fb_slot_t;

/* Each side keeps the other's counter as it last read it and reads the real one only when that
 * copy says the ring is full (producer) or empty (consumer): a message through the ring then
 * moves its data's and the head's lines to the consumer, and nothing back. The producer's own
 * state has a line of its own, not the head's: the consumer reads the head on every empty look,
 * so a slot write that bumped a counter on the head's line would pull that line away from the
 * consumer on every message, and its next look would wait for it before it saw the slot. */
struct tdist__shm_ring {
  _Alignas(64) _Atomic uint64_t head; /* bytes ever written (producer) */
  _Alignas(64) uint64_t tail_seen;    /* producer's copy of tail */
  uint64_t fb_head;                   /* slot writes ever made (producer) */
  uint64_t fb_tail_seen;              /* producer's copy of fb_tail */
  uint64_t ring_streak; /* small writes to the ring since the slots ran out (0: they did not) */
  _Alignas(64) _Atomic uint64_t tail;   /* bytes ever read (consumer) */
  uint64_t head_seen;                   /* consumer's copy of head */
  _Atomic uint64_t fb_tail;             /* slots ever read to the end (consumer) */
  uint64_t fb_off;                      /* bytes of slot fb_tail read so far (consumer) */
  _Alignas(64) _Atomic uint64_t copied; /* single-copy messages the consumer has copied */
  _Atomic uint64_t revoked; /* the last single-copy message its producer gave up on (it failed) */
  fb_slot_t fb[FB_SLOTS];
  _Alignas(64) uint8_t data[TDIST__SHM_RING_BYTES];
};

/* Where the kernel lacks O_TMPFILE on tmpfs (before 3.11), an anonymous memfd: it has no name
 * either, but /dev/shm's size limit does not apply to it. */
static int unnamed_file(void) {
  int fd = open("/dev/shm", O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (fd >= 0 || (errno != EOPNOTSUPP && errno != EISDIR && errno != EINVAL)) return fd;
  return memfd_create("tdist-gloo-shm", MFD_CLOEXEC);
}

static uint64_t fold_dev_ino(const struct stat *st) {
  return (uint64_t)st->st_dev * 0x9E3779B97F4A7C15ull ^ (uint64_t)st->st_ino;
}

int tdist__shm_seg_create(tdist__shm_seg_t *seg, int nslots) {
  seg->len = sizeof(seg_hdr_t) + sizeof(struct tdist__shm_ring) * (size_t)nslots;
  int fd = unnamed_file();
  if (fd < 0) return -errno;
  struct stat st;
  int e = 0;
  if (ftruncate(fd, (off_t)seg->len) != 0 || fstat(fd, &st) != 0) e = errno;
  seg->base = e ? MAP_FAILED : mmap(NULL, seg->len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (seg->base == MAP_FAILED) {
    e = e ? e : errno;
    seg->base = NULL;
    close(fd);
    return -e;
  }
  /* The doorbell's page now: with /dev/shm full, its first use would be SIGBUS. Each ring's
   * pages come when its pair is linked (tdist__shm_ring_prefault). */
  if (madvise(seg->base, (size_t)sysconf(_SC_PAGESIZE), MADV_POPULATE_WRITE) != 0 &&
      errno != EINVAL) {
    e = errno;
    munmap(seg->base, seg->len);
    seg->base = NULL;
    close(fd);
    return -e;
  }
  if (getrandom(&seg->cookie, sizeof seg->cookie, GRND_NONBLOCK) != (ssize_t)sizeof seg->cookie)
    seg->cookie = (uint64_t)(uintptr_t)seg->base ^ (uint64_t)getpid() << 32 ^ (uint64_t)st.st_ino;
  seg->cookie |= 1; /* never 0, the header of a file that is not a segment */
  seg->dev_ino = fold_dev_ino(&st);
  seg->fd = fd;
  seg->has_fd = 1;
  /* Before any peer maps it. */
  seg_hdr_t *h = seg->base;
  h->cookie = seg->cookie;
  atomic_store_explicit(&h->asym, (uint32_t)membarrier_registered(), memory_order_relaxed);
  return 0; /* a fresh tmpfs file is zero-filled: every ring starts empty */
}

int tdist__shm_seg_describe(const tdist__shm_seg_t *seg, char *buf, size_t cap) {
  return snprintf(buf, cap, "%d %d %llx %llx", (int)getpid(), seg->fd,
                  (unsigned long long)seg->dev_ino, (unsigned long long)seg->cookie);
}

int tdist__shm_seg_open(tdist__shm_seg_t *seg, const char *desc, int nslots) {
  int pid = 0, ofd = -1;
  unsigned long long dev_ino = 0, cookie = 0;
  if (sscanf(desc, "%d %d %llx %llx", &pid, &ofd, &dev_ino, &cookie) != 4 || pid <= 0 || ofd < 0)
    return -EINVAL;
  seg->len = sizeof(seg_hdr_t) + sizeof(struct tdist__shm_ring) * (size_t)nslots;
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/fd/%d", pid, ofd);
  /* In another pid namespace the path leads to some other process's file, maybe a device whose
   * open has effects: look at it through O_PATH (no open of the file itself), and open it for
   * real only once it is the segment's inode. */
  int pfd = open(path, O_PATH | O_CLOEXEC);
  if (pfd < 0) return -errno;
  struct stat st;
  if (fstat(pfd, &st) != 0 || !S_ISREG(st.st_mode) || fold_dev_ino(&st) != dev_ino ||
      (size_t)st.st_size != seg->len) {
    close(pfd);
    return -ESTALE;
  }
  snprintf(path, sizeof path, "/proc/self/fd/%d", pfd);
  int fd = open(path, O_RDWR | O_CLOEXEC);
  int e = errno;
  close(pfd);
  if (fd < 0) return -e;
  seg->base = mmap(NULL, seg->len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  e = errno;
  close(fd);
  if (seg->base == MAP_FAILED) {
    seg->base = NULL;
    return -e;
  }
  if (((seg_hdr_t *)seg->base)->cookie != cookie) {
    tdist__shm_seg_close(seg);
    return -ESTALE;
  }
  seg->cookie = cookie;
  membarrier_registered(); /* before this process writes into the owner's rings */
  return 0;
}

void tdist__shm_seg_release(tdist__shm_seg_t *seg) {
  if (seg->has_fd) close(seg->fd);
  seg->has_fd = 0;
  seg->fd = -1;
}

void tdist__shm_seg_close(tdist__shm_seg_t *seg) {
  tdist__shm_seg_release(seg);
  if (seg->base) munmap(seg->base, seg->len);
  seg->base = NULL;
}

tdist__shm_ring_t *tdist__shm_slot(tdist__shm_seg_t *seg, int i) {
  return (tdist__shm_ring_t *)((seg_hdr_t *)seg->base + 1) + i;
}

static long futex(_Atomic uint32_t *addr, int op, uint32_t val, const struct timespec *ts) {
  return syscall(SYS_futex, (uint32_t *)addr, op, val, ts, NULL, 0);
}

/* A full barrier (store-load included). On x86-64 a locked no-op costs less than mfence and
 * orders ordinary memory the same (Linux's smp_mb). */
static inline void full_fence(void) {
#if defined(__x86_64__)
  __asm__ __volatile__("lock; orl $0, (%%rsp)" ::: "memory", "cc");
#else
  atomic_thread_fence(memory_order_seq_cst);
#endif
}

void tdist__shm_ring_doorbell(tdist__shm_seg_t *seg) {
  seg_hdr_t *h = seg->base;
  /* Pairs with the barrier in tdist__shm_sleep_prepare: either the sleeper sees our ring update
   * on its re-check, or we see it sleeping here. */
  if (atomic_load_explicit(&g_membarrier, memory_order_relaxed) &&
      atomic_load_explicit(&h->asym, memory_order_relaxed))
    __asm__ __volatile__("" ::: "memory");
  else
    full_fence();
  if (atomic_load_explicit(&h->sleeping, memory_order_relaxed)) {
    atomic_fetch_add_explicit(&h->doorbell, 1, memory_order_release);
    futex(&h->doorbell, FUTEX_WAKE, 1, NULL);
  }
}

uint32_t tdist__shm_sleep_prepare(tdist__shm_seg_t *own) {
  seg_hdr_t *h = own->base;
  uint32_t seen = atomic_load_explicit(&h->doorbell, memory_order_acquire);
  atomic_store_explicit(&h->sleeping, 1, memory_order_relaxed);
  if (atomic_load_explicit(&h->asym, memory_order_relaxed)) {
    if (syscall(SYS_membarrier, MEMBARRIER_CMD_GLOBAL_EXPEDITED, 0, 0) == 0) return seen;
    /* Refused now though registration worked: writers fence from here on. One of them may
     * have skipped its fence during this call; the sleep's cap bounds that wake-up. */
    atomic_store_explicit(&h->asym, 0, memory_order_relaxed);
  }
  full_fence();
  return seen;
}

int tdist__shm_sleep(tdist__shm_seg_t *own, uint32_t seen, int timeout_us) {
  seg_hdr_t *h = own->base;
  struct timespec ts = {timeout_us / 1000000, (long)(timeout_us % 1000000) * 1000};
  long r = futex(&h->doorbell, FUTEX_WAIT, seen, &ts);
  int timed_out = r != 0 && errno == ETIMEDOUT;
  atomic_store_explicit(&h->sleeping, 0, memory_order_relaxed);
  return timed_out;
}

void tdist__shm_sleep_cancel(tdist__shm_seg_t *own) {
  atomic_store_explicit(&((seg_hdr_t *)own->base)->sleeping, 0, memory_order_relaxed);
}

/* The whole write into as many slots as it takes (consecutive, each a piece of the stream), or 0
 * (the ring holds unread bytes, or too few slots are free). */
static size_t fb_write(tdist__shm_ring_t *r, uint64_t head, const struct iovec *iov, int n,
                       size_t want) {
  if (r->tail_seen != head) {
    /* The ring may hold unread bytes. Finding out loads the tail, whose line the consumer takes
     * back on every read. While a stream keeps the ring busy (the slots ran out: the consumer
     * lags), look only on every FB_RECHECK-th write and let the others go to the ring: a root
     * streaming 8 B broadcasts spent a quarter of its time on that load (2 ranks, 0.12-0.18 ->
     * 0.06-0.08 us per broadcast; the ring's lines, several messages each, are not in the
     * consumer's cache, the slots' are). After a write too big for the slots, look every time:
     * the consumer is likely done with it, and slots are what a waiting consumer sees first. */
    if (r->ring_streak && r->ring_streak++ % FB_RECHECK) return 0;
    r->tail_seen = atomic_load_explicit(&r->tail, memory_order_acquire);
    if (r->tail_seen != head) return 0;
  }
  r->ring_streak = 0;
  uint64_t lines = (want + FB_DATA - 1) / FB_DATA;
  if (r->fb_head + lines - r->fb_tail_seen > FB_SLOTS) {
    r->fb_tail_seen = atomic_load_explicit(&r->fb_tail, memory_order_acquire);
    if (r->fb_head + lines - r->fb_tail_seen > FB_SLOTS) {
      r->ring_streak = 1;
      return 0;
    }
  }
  int k = 0;
  size_t koff = 0, left = want;
  while (left) {
    fb_slot_t *s = &r->fb[r->fb_head % FB_SLOTS];
    size_t len = left < FB_DATA ? left : FB_DATA, off = 0;
    while (off < len) {
      size_t c = iov[k].iov_len - koff < len - off ? iov[k].iov_len - koff : len - off;
      memcpy(s->data + off, (const uint8_t *)iov[k].iov_base + koff, c);
      off += c;
      koff += c;
      if (koff == iov[k].iov_len) {
        k++;
        koff = 0;
      }
    }
    r->fb_head++;
    atomic_store_explicit(&s->stamp, r->fb_head << 16 | len, memory_order_release);
    left -= len;
  }
  return want;
}

size_t tdist__shm_ring_write(tdist__shm_ring_t *r, const struct iovec *iov, int n) {
  uint64_t head = atomic_load_explicit(&r->head, memory_order_relaxed);
  size_t want = 0;
  for (int k = 0; k < n; k++) want += iov[k].iov_len;
  if (want > 0 && want <= FB_MAX_LINES * FB_DATA) {
    size_t w = fb_write(r, head, iov, n, want);
    if (w) return w;
  }
  size_t space = TDIST__SHM_RING_BYTES - (size_t)(head - r->tail_seen), total = 0;
  if (space < want) {
    r->tail_seen = atomic_load_explicit(&r->tail, memory_order_acquire);
    space = TDIST__SHM_RING_BYTES - (size_t)(head - r->tail_seen);
  }
  for (int k = 0; k < n && space > 0; k++) {
    const uint8_t *src = iov[k].iov_base;
    size_t len = iov[k].iov_len < space ? iov[k].iov_len : space;
    size_t off = (size_t)(head % TDIST__SHM_RING_BYTES);
    size_t first = TDIST__SHM_RING_BYTES - off < len ? TDIST__SHM_RING_BYTES - off : len;
    memcpy(r->data + off, src, first);
    if (len > first) memcpy(r->data, src + first, len - first);
    head += len;
    space -= len;
    total += len;
    if (len < iov[k].iov_len) break;
  }
  if (total) atomic_store_explicit(&r->head, head, memory_order_release);
  return total;
}

/* Reads from the slots next in line, as many as are written and iov holds: returns the bytes
 * copied into iov. */
static size_t fb_read(tdist__shm_ring_t *r, const struct iovec *iov, int n) {
  uint64_t first = atomic_load_explicit(&r->fb_tail, memory_order_relaxed), next = first;
  size_t total = 0, koff = 0;
  int k = 0;
  while (k < n) {
    fb_slot_t *s = &r->fb[next % FB_SLOTS];
    uint64_t stamp = atomic_load_explicit(&s->stamp, memory_order_acquire);
    if (stamp >> 16 != next + 1) break;
    size_t len = (size_t)(stamp & 0xffff);
    while (k < n && r->fb_off < len) {
      size_t room = iov[k].iov_len - koff;
      size_t c = room < len - r->fb_off ? room : len - r->fb_off;
      memcpy((uint8_t *)iov[k].iov_base + koff, s->data + r->fb_off, c);
      r->fb_off += c;
      koff += c;
      total += c;
      if (koff == iov[k].iov_len) {
        k++;
        koff = 0;
      }
    }
    if (r->fb_off < len) break; /* iov is full */
    r->fb_off = 0;
    next++;
  }
  if (next != first) atomic_store_explicit(&r->fb_tail, next, memory_order_release);
  return total;
}

size_t tdist__shm_ring_read(tdist__shm_ring_t *r, const struct iovec *iov, int n, int *freed) {
  /* Written slots come before every unread ring byte (see fb_slot_t). Only slots in a call that
   * reads any: what they hold may not fill iov, and the caller asks again for the rest. */
  *freed = 0;
  size_t got = fb_read(r, iov, n);
  if (got) return got;
  uint64_t tail = atomic_load_explicit(&r->tail, memory_order_relaxed);
  size_t want = 0;
  for (int k = 0; k < n; k++) want += iov[k].iov_len;
  size_t avail = (size_t)(r->head_seen - tail), total = 0;
  if (avail < want) {
    uint64_t old = r->head_seen;
    r->head_seen = atomic_load_explicit(&r->head, memory_order_acquire);
    avail = (size_t)(r->head_seen - tail);
    /* Bytes written after a slot can show here before the look at the slots above saw it: now
     * that the head was read (acquire), such a slot is visible, and goes first. */
    if (r->head_seen != old && (got = fb_read(r, iov, n)) != 0) return got;
  }
  for (int k = 0; k < n && avail > 0; k++) {
    uint8_t *dst = iov[k].iov_base;
    size_t len = iov[k].iov_len < avail ? iov[k].iov_len : avail;
    size_t off = (size_t)(tail % TDIST__SHM_RING_BYTES);
    size_t first = TDIST__SHM_RING_BYTES - off < len ? TDIST__SHM_RING_BYTES - off : len;
    memcpy(dst, r->data + off, first);
    if (len > first) memcpy(dst + first, r->data, len - first);
    tail += len;
    avail -= len;
    total += len;
    if (len < iov[k].iov_len) break;
  }
  if (total) atomic_store_explicit(&r->tail, tail, memory_order_release);
  *freed = total > 0;
  return total;
}

size_t tdist__shm_ring_space(tdist__shm_ring_t *r) {
  uint64_t head = atomic_load_explicit(&r->head, memory_order_relaxed);
  r->tail_seen = atomic_load_explicit(&r->tail, memory_order_acquire);
  return TDIST__SHM_RING_BYTES - (size_t)(head - r->tail_seen);
}

size_t tdist__shm_ring_size(void) { return sizeof(struct tdist__shm_ring); }

int tdist__shm_ring_prefault(tdist__shm_ring_t *r) {
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  uintptr_t a = (uintptr_t)r & ~(uintptr_t)(page - 1);
  uintptr_t b = ((uintptr_t)(r + 1) + page - 1) & ~(uintptr_t)(page - 1);
  if (madvise((void *)a, b - a, MADV_POPULATE_WRITE) != 0)
    return errno == EINVAL ? 0 : -errno; /* EINVAL: a kernel without it; pages come on first use */
  /* The pages are ours now; touch each for writing through this mapping too. On a guest whose
   * hypervisor maps guest memory on first access (this machine: a PVM guest), populating the
   * page tables is not enough: the first write to each page of a ring cost a trap invisible to
   * the guest's page-fault count, so a fresh pair's first megabyte or two of ring traffic was
   * slow (2 ranks, 4 KiB all_to_all over the rings as the first collective: 15.5 us for the
   * first 200 calls and about 1.3 us once the ring had wrapped twice; now 1.3-1.4 us from the
   * first). An atomic or of 0 changes nothing; the pair does not use the ring yet. */
  for (uintptr_t p = a; p < b; p += page) __atomic_fetch_or((uint32_t *)p, 0u, __ATOMIC_RELAXED);
  return 0;
}

void tdist__shm_ring_copied(tdist__shm_ring_t *r) {
  atomic_fetch_add_explicit(&r->copied, 1, memory_order_release);
}

uint64_t tdist__shm_ring_copied_count(tdist__shm_ring_t *r) {
  return atomic_load_explicit(&r->copied, memory_order_acquire);
}

void tdist__shm_ring_revoke(tdist__shm_ring_t *r, uint64_t seq) {
  uint64_t old = atomic_load_explicit(&r->revoked, memory_order_relaxed);
  while (old < seq && !atomic_compare_exchange_weak_explicit(
                          &r->revoked, &old, seq, memory_order_seq_cst, memory_order_relaxed)) {
  }
}

int tdist__shm_ring_is_revoked(tdist__shm_ring_t *r, uint64_t seq) {
  return atomic_load_explicit(&r->revoked, memory_order_seq_cst) >= seq;
}
