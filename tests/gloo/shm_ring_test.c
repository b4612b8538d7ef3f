/* The shared-memory ring (runtime/gloo/shm.c) as a byte stream: a producer thread writes a known
 * pseudo-random stream in chunks of random sizes (mostly small, so most go through the slots;
 * some large, so the ring fills and wraps), split over 1-3 iovecs; the consumer reads it back
 * in pieces of random sizes and checks every byte and its order. Small writes use slots only
 * while the ring holds nothing unread, so slots and ring bytes interleave all the time; a read
 * that took a slot's bytes before earlier ring bytes, or ring bytes before an earlier slot,
 * shows as a wrong byte. Threads, not processes, so that TSan checks the ordering (the memory is
 * the same shared mapping the processes use).
 *
 * Then the doorbell: two threads play ping-pong through the rings of two segments, each going
 * to sleep on its own doorbell after every message it sends, so that the peer's reply races
 * with the sleeper's preparation every time. A wake-up lost to that race (the writer missing
 * the sleeper, the sleeper missing the bytes) shows as a sleep that ends by its timeout. */
#define _GNU_SOURCE
#include <errno.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <pthread.h>
#include <sched.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/uio.h>

#include "runtime/gloo/shm/ring.h"
#include "tests/testlib/check.h"
#include "tests/testlib/rng.h"

#define TOTAL_BYTES ((uint64_t)24 << 20)

static uint8_t stream_byte(uint64_t i) {
  uint64_t x = (i + 0x9e3779b97f4a7c15ull) * 0xbf58476d1ce4e5b9ull;
  return (uint8_t)((x ^ (x >> 29)) >> 17);
}

/* Mostly small (what goes through the slots), sometimes around the slots' 448, seldom large. */
static size_t chunk_len(test_rng_t *s, int large) {
  uint64_t r = test_rng_below(s, 100);
  if (r < 60) return 1 + test_rng_below(s, 64);
  if (r < 85) return 40 + test_rng_below(s, 480); /* both sides of 448 bytes */
  if (r < 99 || !large) return 525 + test_rng_below(s, 4096);
  return 4096 + test_rng_below(s, 300 * 1024); /* fills and wraps the 1 MiB ring */
}

typedef struct {
  tdist__shm_ring_t *ring;
  uint64_t seed;
} producer_t;

static void *produce(void *arg) {
  producer_t *p = arg;
  test_rng_t s;
  test_rng_seed(&s, p->seed);
  uint64_t pos = 0;
  uint8_t *buf = malloc(310 * 1024);
  CHECK(buf != NULL);
  while (pos < TOTAL_BYTES) {
    /* Often let the consumer empty the ring first: small writes then go through the slots,
     * and ring bytes written after them must wait their turn. */
    if (test_rng_below(&s, 4) == 0)
      while (tdist__shm_ring_space(p->ring) < TDIST__SHM_RING_BYTES) sched_yield();
    size_t len = chunk_len(&s, 1);
    if (len > TOTAL_BYTES - pos) len = (size_t)(TOTAL_BYTES - pos);
    for (size_t i = 0; i < len; i++) buf[i] = stream_byte(pos + i);
    size_t done = 0;
    while (done < len) { /* the ring may take part of it: write the rest again */
      size_t left = len - done, a = left > 1 ? test_rng_below(&s, left) : 0, b = left - a;
      struct iovec iov[3] = {
          {buf + done, a / 2}, {buf + done + a / 2, a - a / 2}, {buf + done + a, b}};
      size_t w = tdist__shm_ring_write(p->ring, iov, 3);
      if (w == 0) sched_yield();
      done += w;
    }
    pos += len;
  }
  free(buf);
  return NULL;
}

/* One thread, fixed sequences: which path each write takes, and the order reads return. */
static void write_all(tdist__shm_ring_t *r, uint64_t from, size_t len) {
  uint8_t b[2048];
  CHECK(len <= sizeof b);
  for (size_t i = 0; i < len; i++) b[i] = stream_byte(from + i);
  struct iovec iov = {b, len};
  CHECK_EQ_UINT(tdist__shm_ring_write(r, &iov, 1), len);
}

/* One read of at most cap bytes: it returns len bytes, the stream's next, with *freed as given. */
static void read_cap_expect(tdist__shm_ring_t *r, uint64_t from, size_t cap, size_t len,
                            int want_freed) {
  uint8_t b[2048];
  CHECK(cap <= sizeof b);
  struct iovec iov = {b, cap};
  int freed = -1;
  size_t got = tdist__shm_ring_read(r, &iov, 1, &freed);
  if (got != len || freed != want_freed)
    TEST_FAIL("read %zu bytes (freed %d) at stream byte %llu, expected %zu (freed %d)", got, freed,
              (unsigned long long)from, len, want_freed);
  for (size_t i = 0; i < len; i++) CHECK_EQ_UINT(b[i], stream_byte(from + i));
}

static void read_expect(tdist__shm_ring_t *r, uint64_t from, size_t len, int want_freed) {
  read_cap_expect(r, from, 2048, len, want_freed);
}

static void fixed_sequences(void) {
  tdist__shm_seg_t seg;
  CHECK_EQ_INT(tdist__shm_seg_create(&seg, 1), 0);
  tdist__shm_seg_release(&seg);
  tdist__shm_ring_t *r = tdist__shm_slot(&seg, 0);
  size_t ring_bytes = TDIST__SHM_RING_BYTES;
  /* Empty ring: a small write takes slots (no ring space used); one too big for the slots goes
   * to the ring; a small write behind unread ring bytes goes to the ring too. */
  write_all(r, 0, 24);
  CHECK_EQ_UINT(tdist__shm_ring_space(r), ring_bytes);
  write_all(r, 24, 600);
  CHECK_EQ_UINT(tdist__shm_ring_space(r), ring_bytes - 600);
  write_all(r, 624, 10);
  CHECK_EQ_UINT(tdist__shm_ring_space(r), ring_bytes - 610);
  read_expect(r, 0, 24, 0);   /* the slots first, alone */
  read_expect(r, 24, 610, 1); /* then the ring's bytes */
  read_expect(r, 634, 0, 0);  /* then nothing */
  /* Sixteen slots: the seventeenth one-slot write goes to the ring and comes after them; one
   * read takes every written slot. */
  uint64_t pos = 634;
  for (int i = 0; i < 17; i++) write_all(r, pos + (uint64_t)i * 50, 50);
  CHECK_EQ_UINT(tdist__shm_ring_space(r), ring_bytes - 50);
  read_expect(r, pos, 16 * 50, 0);
  read_expect(r, pos + 16 * 50, 50, 1);
  pos += 17 * 50;
  /* Slots that ran out mean a consumer that lags: the next 15 small writes go to the ring
   * without looking whether it emptied (here it did), the 16th looks and takes a slot again. */
  for (int i = 0; i < 15; i++) write_all(r, pos + (uint64_t)i * 10, 10);
  CHECK_EQ_UINT(tdist__shm_ring_space(r), ring_bytes - 150);
  read_expect(r, pos, 150, 1);
  write_all(r, pos + 150, 10);
  CHECK_EQ_UINT(tdist__shm_ring_space(r), ring_bytes);
  read_expect(r, pos + 150, 10, 0);
  pos += 160;
  /* The largest write the slots take (8 of them), and one byte more. */
  write_all(r, pos, 448);
  CHECK_EQ_UINT(tdist__shm_ring_space(r), ring_bytes);
  read_expect(r, pos, 448, 0);
  write_all(r, pos + 448, 449);
  CHECK_EQ_UINT(tdist__shm_ring_space(r), ring_bytes - 449);
  read_expect(r, pos + 448, 449, 1);
  pos += 448 + 449;
  /* Reads smaller than what the slots hold, ending inside a slot and at a slot's end. */
  write_all(r, pos, 300); /* 6 slots: 5 x 56 + 20 */
  read_cap_expect(r, pos, 100, 100, 0);
  read_cap_expect(r, pos + 100, 12, 12, 0);
  read_cap_expect(r, pos + 112, 300, 188, 0);
  read_expect(r, pos + 300, 0, 0);
  pos += 300;
  /* A write that needs more slots than are free goes to the ring, whole: 10 slots taken, then
   * 400 bytes (8 slots). */
  for (int i = 0; i < 10; i++) write_all(r, pos + (uint64_t)i * 50, 50);
  write_all(r, pos + 500, 400);
  CHECK_EQ_UINT(tdist__shm_ring_space(r), ring_bytes - 400);
  read_expect(r, pos, 500, 0);
  read_expect(r, pos + 500, 400, 1);
  write_all(r, pos + 900, 10); /* the slots ran out: small writes go to the ring a while */
  CHECK_EQ_UINT(tdist__shm_ring_space(r), ring_bytes - 10);
  read_expect(r, pos + 900, 10, 1);
  tdist__shm_seg_close(&seg);
}

#define PINGS 20000
#define SLEEP_CAP_US 300000 /* far above any wake-up on time: reaching it means one was lost */

typedef struct {
  tdist__shm_seg_t *own, *peer; /* sleeps on own's doorbell, reads own's ring, writes peer's */
  uint64_t seed;
  int first; /* sends first */
  uint64_t slept, cancelled, timeouts;
} pinger_t;

/* Waits for the next message (len bytes of value v) in own's ring the way the transport does
 * (runtime/gloo/shm/link.c, wait.c): look, arm, look again, sleep. */
static void ping_recv(pinger_t *p, uint8_t *buf, size_t len, uint8_t v) {
  tdist__shm_ring_t *r = tdist__shm_slot(p->own, 0);
  size_t got = 0;
  while (got < len) {
    struct iovec iov = {buf + got, len - got};
    int freed;
    size_t n = tdist__shm_ring_read(r, &iov, 1, &freed);
    if (n == 0) {
      uint32_t seen = tdist__shm_sleep_prepare(p->own);
      n = tdist__shm_ring_read(r, &iov, 1, &freed);
      if (n == 0) {
        p->slept++;
        if (tdist__shm_sleep(p->own, seen, SLEEP_CAP_US)) p->timeouts++;
        if (p->timeouts > 3) TEST_FAIL("more than 3 lost wake-ups; giving up");
        continue;
      }
      tdist__shm_sleep_cancel(p->own);
      p->cancelled++;
    }
    if (freed) tdist__shm_ring_doorbell(p->peer);
    got += n;
  }
  for (size_t i = 0; i < len; i++)
    if (buf[i] != v)
      TEST_FAIL("ping-pong: byte %zu of a %zu-byte message is %u, not %u", i, len, buf[i], v);
}

static void ping_send(pinger_t *p, uint8_t *buf, size_t len, uint8_t v) {
  tdist__shm_ring_t *r = tdist__shm_slot(p->peer, 0);
  memset(buf, v, len);
  size_t done = 0;
  while (done < len) { /* messages are smaller than the ring: the reader makes room */
    struct iovec iov = {buf + done, len - done};
    size_t n = tdist__shm_ring_write(r, &iov, 1);
    if (n == 0) {
      sched_yield();
      continue;
    }
    done += n;
    tdist__shm_ring_doorbell(p->peer);
  }
}

/* Message i (either direction) is len(i) bytes of the value (uint8_t)i: mostly slot-sized. */
static size_t ping_len(test_rng_t *s) {
  return test_rng_below(s, 8) ? 1 + test_rng_below(s, 56) : 57 + test_rng_below(s, 8192);
}

static void *pinger(void *arg) {
  pinger_t *p = arg;
  test_rng_t s;
  test_rng_seed(&s, p->seed); /* both sides draw the same lengths */
  uint8_t *buf = malloc(8192 + 64);
  CHECK(buf != NULL);
  for (int i = 0; i < 2 * PINGS; i++) {
    size_t len = ping_len(&s);
    if ((i % 2 == 0) == p->first)
      ping_send(p, buf, len, (uint8_t)i);
    else
      ping_recv(p, buf, len, (uint8_t)i);
  }
  free(buf);
  return NULL;
}

static void sleep_wake(uint64_t seed) {
  tdist__shm_seg_t a, b;
  CHECK_EQ_INT(tdist__shm_seg_create(&a, 1), 0);
  CHECK_EQ_INT(tdist__shm_seg_create(&b, 1), 0);
  tdist__shm_seg_release(&a);
  tdist__shm_seg_release(&b);
  pinger_t pa = {&a, &b, seed, 1, 0, 0, 0}, pb = {&b, &a, seed, 0, 0, 0, 0};
  pthread_t th;
  CHECK_EQ_INT(pthread_create(&th, NULL, pinger, &pb), 0);
  pinger(&pa);
  CHECK_EQ_INT(pthread_join(th, NULL), 0);
  TEST_LOG(
      "ping-pong: %d messages each way; slept %llu times, woke before sleeping %llu times, "
      "%llu sleeps ended by the %d ms cap",
      PINGS, (unsigned long long)(pa.slept + pb.slept),
      (unsigned long long)(pa.cancelled + pb.cancelled),
      (unsigned long long)(pa.timeouts + pb.timeouts), SLEEP_CAP_US / 1000);
  CHECK_EQ_UINT(pa.timeouts + pb.timeouts, 0);
  /* The race was run: most waits went to sleep, or were armed when the message came. */
  CHECK_CMP_UINT(pa.slept + pb.slept + pa.cancelled + pb.cancelled, >, PINGS);
  tdist__shm_seg_close(&a);
  tdist__shm_seg_close(&b);
}

/* SHM_RING_TEST_DENY_MEMBARRIER=1 (the _no_membarrier target): membarrier fails with ENOSYS,
 * as under a seccomp profile without it, so the rings fall back to fences on both sides. */
static void deny_membarrier(void) {
  struct sock_filter f[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_membarrier, 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | ENOSYS),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  struct sock_fprog prog = {sizeof f / sizeof f[0], f};
  CHECK_EQ_INT(prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), 0);
  CHECK_EQ_INT(prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog), 0);
  CHECK(syscall(SYS_membarrier, 0, 0, 0) == -1 && errno == ENOSYS);
  TEST_LOG("membarrier denied: the doorbell fences on both sides");
}

int main(void) {
  const char *deny = getenv("SHM_RING_TEST_DENY_MEMBARRIER");
  if (deny && strcmp(deny, "1") == 0) deny_membarrier();
  uint64_t seed = test_seed("shm_ring_test", 0x1234567);
  fixed_sequences();
  sleep_wake(seed);
  tdist__shm_seg_t seg;
  CHECK_EQ_INT(tdist__shm_seg_create(&seg, 1), 0);
  tdist__shm_seg_release(&seg);
  for (int round = 0; round < 3; round++) {
    /* A fresh segment per round: its rings start empty (counters zero). */
    if (round > 0) {
      tdist__shm_seg_close(&seg);
      CHECK_EQ_INT(tdist__shm_seg_create(&seg, 1), 0);
      tdist__shm_seg_release(&seg);
    }
    tdist__shm_ring_t *ring = tdist__shm_slot(&seg, 0);
    producer_t p = {ring, seed + (uint64_t)round * 7919};
    pthread_t th;
    CHECK_EQ_INT(pthread_create(&th, NULL, produce, &p), 0);
    uint8_t *got = malloc(80 * 1024);
    CHECK(got != NULL);
    test_rng_t s;
    test_rng_seed(&s, seed ^ (0xabcdefull + (uint64_t)round));
    uint64_t pos = 0, slot_reads = 0, ring_reads = 0;
    while (pos < TOTAL_BYTES) {
      size_t want = round == 2 ? 1 + test_rng_below(&s, 16)
                               : chunk_len(&s, 0) * (test_rng_below(&s, 4) == 0 ? 16 : 1);
      if (want > 80 * 1024) want = 80 * 1024;
      size_t a = test_rng_below(&s, want + 1);
      struct iovec iov[2] = {{got, a}, {got + a, want - a}};
      int freed = -1;
      size_t r = tdist__shm_ring_read(ring, iov, 2, &freed);
      CHECK(freed == 0 || freed == 1);
      if (r == 0) {
        CHECK_EQ_INT(freed, 0);
        sched_yield();
        continue;
      }
      CHECK_CMP_UINT(r, <=, want);
      if (freed)
        ring_reads++;
      else
        slot_reads++;
      for (size_t i = 0; i < r; i++)
        if (got[i] != stream_byte(pos + i))
          TEST_FAIL("round %d: byte %llu of the stream is %u, expected %u (read of %zu at %llu)",
                    round, (unsigned long long)(pos + i), got[i], stream_byte(pos + i), r,
                    (unsigned long long)pos);
      pos += r;
    }
    CHECK_EQ_INT(pthread_join(th, NULL), 0);
    /* Everything written was read: nothing more comes. */
    int freed = -1;
    struct iovec iov = {got, 64};
    CHECK_EQ_UINT(tdist__shm_ring_read(ring, &iov, 1, &freed), 0);
    CHECK_EQ_INT(freed, 0);
    TEST_LOG("round %d: %llu bytes in order; %llu reads from slots, %llu from the ring", round,
             (unsigned long long)pos, (unsigned long long)slot_reads,
             (unsigned long long)ring_reads);
    /* Both paths were taken, many times. */
    CHECK_CMP_UINT(slot_reads, >, 1000);
    CHECK_CMP_UINT(ring_reads, >, 1000);
    free(got);
  }
  tdist__shm_seg_close(&seg);
  return 0;
}
