/* gloo's shared-memory part: links between same-host ranks of a group through the rings of
 * ring.h instead of TCP, set up once when the transport is created (setup.c), and the per-peer
 * link over them (link.c: two copies through the ring, or one straight from the sender's memory
 * with process_vm_readv). A pair uses them only if both sides mapped both segments; any failure
 * leaves that pair on TCP. */
#ifndef TDIST_GLOO_SHM_SHM_H
#define TDIST_GLOO_SHM_SHM_H

#include <stdint.h>

#include "runtime/gloo/link/link.h"
#include "runtime/gloo/shm/ring.h"

/* The per-peer link over a pair's rings. Its socket (borrowed) only tells when the peer dies. */
typedef struct {
  tdist__link_t base;
  int fd;
  tdist__shm_ring_t *out_ring, *in_ring; /* our slot in the peer's segment; the peer's in ours */
  tdist__shm_seg_t *peer_seg;            /* the peer's segment (its doorbell) */
  int pid;                               /* the peer's process id (single copies read it) */
  uint64_t copies_sent, copies_recv;     /* single-copy messages sent to / read from it */
} tdist__shm_link_t;

typedef struct {
  tdist__shm_seg_t own;       /* zeroed until created */
  tdist__shm_seg_t *peer_seg; /* [peer] */
  tdist__shm_link_t *link;    /* [peer]: valid where linked[peer] */
  uint8_t *linked;            /* [peer]: that pair talks through the rings */
  int *pid;                   /* [peer]: its process id, as published */
  int peers;                  /* pairs linked */
} tdist__shm_links_t;

/* Allocates the per-peer arrays of a zeroed *l for a group of size ranks: 0 or -ENOMEM (then
 * tdist__shm_links_close still releases what was allocated). */
int tdist__shm_links_alloc(tdist__shm_links_t *l, int size);

/* Linking this rank to every peer with same[peer] set, in two steps around one flag byte each
 * way per pair, which the caller exchanges over TCP (the pair check).
 * prepare publishes where this rank's segment can be opened (its process id and descriptor,
 * ring.h) and the address of a probe word under shm/<rank> in cfg->store, maps the peers'
 * segments and tries to read each peer's probe word with process_vm_readv
 * (TDIST_SHM_SINGLE_COPY=1): flag_out[peer] says mapped (1) and readable (2). finish, after the
 * exchange (st: its result), releases this rank's descriptor (everyone who will map the segment
 * has) and, if st is TDIST_OK, links the pairs whose flags both say mapped (linked[peer]; then
 * tdist__shm_link_attach gives each its socket and address). prepare fails only on store errors
 * (through cfg->fail) and blocks until the deadline at most; a segment that cannot be created or
 * opened leaves those pairs on TCP, with a warning. */
tdist_status_t tdist__shm_links_prepare(tdist__shm_links_t *l, const tdist__transport_cfg_t *cfg,
                                        const int *same, int64_t deadline, uint8_t *flag_out);
void tdist__shm_links_finish(tdist__shm_links_t *l, const tdist__transport_cfg_t *cfg,
                             const int *same, const uint8_t *flag_out, const uint8_t *flag_in,
                             tdist_status_t st);
/* The link of a linked peer, given its socket (borrowed) and "ip:port" (borrowed). */
tdist__link_t *tdist__shm_link_attach(tdist__shm_links_t *l, int peer, const char *addr, int fd);

/* link.c: a linked pair's link (setup.c); its socket and address come with attach. */
void tdist__shm_link_init(tdist__shm_link_t *sl, int peer, tdist__shm_ring_t *out_ring,
                          tdist__shm_ring_t *in_ring, tdist__shm_seg_t *peer_seg, int pid,
                          int copy_to);

/* Unmaps and frees everything (and closes our segment's descriptor if it is still open). */
void tdist__shm_links_close(tdist__shm_links_t *l, int size);

/* Makes this rank's own sleep on its rings (tdist__shm_sleep) return: a transfer was posted. */
void tdist__shm_links_wake(tdist__shm_links_t *l);

#endif
