/* Shared-memory rings between ranks on one host (setup.c links same-host peers with them;
 * link.c moves the bytes).
 *
 * Each rank creates one segment holding one single-producer/single-consumer byte ring per
 * possible sender (slot i = bytes from rank i to the owner). Peers map the owner's segment and
 * write into their slot; the owner reads. Head and tail are monotonically increasing byte counts
 * on separate cache lines; release/acquire ordering publishes the data.
 *
 * A segment never has a name: it is an unnamed file in /dev/shm's tmpfs (O_TMPFILE, so
 * /dev/shm's size limit still applies; memfd_create where the kernel lacks it), and peers open
 * it through the owner's descriptor (/proc/<pid>/fd/<fd>) while the owner holds it. So nothing
 * is ever left in /dev/shm, whichever process is killed at whatever moment: the memory goes
 * when the last process that maps it exits. It must never be given a name. */
#ifndef TDIST_GLOO_SHM_RING_H
#define TDIST_GLOO_SHM_RING_H

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#define TDIST__SHM_RING_BYTES ((size_t)1 << 20)

typedef struct tdist__shm_ring tdist__shm_ring_t;

typedef struct {
  void *base;
  size_t len;
  int fd;           /* the creator's descriptor while has_fd (peers open the file through it) */
  int has_fd;       /* 0 in a zeroed struct: fd 0 is not ours */
  uint64_t cookie;  /* random, in the segment's header: a peer checks that it mapped this one */
  uint64_t dev_ino; /* the file's st_dev and st_ino folded, published with it */
} tdist__shm_seg_t;

/* Creates and maps an unnamed segment of `nslots` rings and keeps its descriptor open for peers.
 * 0 or -errno. */
int tdist__shm_seg_create(tdist__shm_seg_t *seg, int nslots);
/* What a peer needs to open a created segment: "pid fd dev_ino cookie" into buf (cap bytes).
 * Returns the length. */
int tdist__shm_seg_describe(const tdist__shm_seg_t *seg, char *buf, size_t cap);
/* Maps a peer's segment from its description, through /proc/<pid>/fd/<fd> (same pid namespace,
 * and the kernel must let this process open the owner's descriptors: same user, or
 * CAP_SYS_PTRACE). 0, -EINVAL (a malformed description), -ESTALE (the path led to another file:
 * another pid namespace, or the owner is gone) or -errno of open/mmap. */
int tdist__shm_seg_open(tdist__shm_seg_t *seg, const char *desc, int nslots);
/* The creator closes its descriptor once every peer has opened the segment (its mapping stays). */
void tdist__shm_seg_release(tdist__shm_seg_t *seg);
void tdist__shm_seg_close(tdist__shm_seg_t *seg);
tdist__shm_ring_t *tdist__shm_slot(tdist__shm_seg_t *seg, int i);

/* Copies as many bytes from iov as fit; returns the count (0 = ring full). Producer side only. */
size_t tdist__shm_ring_write(tdist__shm_ring_t *r, const struct iovec *iov, int n);
/* Copies bytes into iov (as many as the ring has, or one small write's); returns the count
 * (0 = empty). *freed: ring space was freed (a producer waiting for space needs the doorbell).
 * Consumer only. */
size_t tdist__shm_ring_read(tdist__shm_ring_t *r, const struct iovec *iov, int n, int *freed);

/* Allocates and maps every page of the ring now (MADV_POPULATE_WRITE), so that no message pays
 * for first-touch page faults, and so that a /dev/shm too small to hold it shows here as an
 * error (-ENOMEM, -EFAULT, ...) instead of SIGBUS on a later write. 0 also where the kernel
 * lacks it (before 5.14). */
int tdist__shm_ring_prefault(tdist__shm_ring_t *r);
/* Bytes of shared memory one ring takes (its counters, slots and data). */
size_t tdist__shm_ring_size(void);

/* Free bytes in the ring (producer side). */
size_t tdist__shm_ring_space(tdist__shm_ring_t *r);
/* Single-copy messages (the consumer copies the payload straight from the producer's memory,
 * link.c): the consumer counts each one it has copied; the producer's buffer is free again once
 * the count reaches that message's number. */
void tdist__shm_ring_copied(tdist__shm_ring_t *r);
uint64_t tdist__shm_ring_copied_count(tdist__shm_ring_t *r);
/* A producer that gives up on single-copy message seq (its call failed, and its buffer may be
 * reused from now on) revokes it before returning; a consumer that copied message seq checks
 * afterwards that it was not revoked, else what it copied may be anything. */
void tdist__shm_ring_revoke(tdist__shm_ring_t *r, uint64_t seq);
int tdist__shm_ring_is_revoked(tdist__shm_ring_t *r, uint64_t seq);

/* Sleeping on rings without polling: the owner of `own` calls sleep_prepare, re-checks its rings,
 * then either sleep_cancel (work appeared) or sleep (up to timeout_us, or until a doorbell;
 * returns 1 when the timeout ended it). Writers and readers ring the peer's doorbell (the peer's
 * segment) after moving bytes. Where the kernel has membarrier, writers skip the store-load fence
 * that the protocol needs and the sleeper pays for both sides (ring.c). */
uint32_t tdist__shm_sleep_prepare(tdist__shm_seg_t *own);
int tdist__shm_sleep(tdist__shm_seg_t *own, uint32_t seen, int timeout_us);
void tdist__shm_sleep_cancel(tdist__shm_seg_t *own);
void tdist__shm_ring_doorbell(tdist__shm_seg_t *seg);

#endif
