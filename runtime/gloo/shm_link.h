/* Shared-memory links between same-host ranks of a gloo group: which pairs talk through the rings
 * of shm.h instead of TCP, set up once when the transport is created (tcp.c). A pair uses them
 * only if both sides mapped both segments; any failure leaves that pair on TCP. */
#ifndef TDIST_GLOO_SHM_LINK_H
#define TDIST_GLOO_SHM_LINK_H

#include <stdint.h>

#include "runtime/gloo/shm.h"
#include "runtime/gloo/transport.h"

typedef struct {
  tdist__shm_ring_t **out_ring, **in_ring; /* [peer]: our slot in its segment, its in ours; NULL:
                                              that pair uses TCP */
  tdist__shm_seg_t own;                    /* zeroed until created */
  tdist__shm_seg_t *peer_seg;              /* [peer] */
  int *pid;                                /* [peer]: its process id (single copies read it) */
  uint8_t *copy_to; /* [peer]: it can read our memory (process_vm_readv): large messages to it
                       go as single copies */
  int peers;        /* pairs linked */
} tdist__shm_links_t;

/* Allocates the per-peer arrays of a zeroed *l for a group of size ranks: 0 or -ENOMEM (then
 * tdist__shm_links_close still releases what was allocated). */
int tdist__shm_links_alloc(tdist__shm_links_t *l, int size);

/* Links this rank to every peer with same[peer] set: publishes where its segment can be opened
 * (its process id and descriptor, shm.h) and the address of a probe word under shm/<rank> in
 * cfg->store, maps the peers' segments, tries
 * to read each peer's probe word with process_vm_readv (TDIST_SHM_SINGLE_COPY=1), and confirms
 * each pair with one flag byte each way over tp (the TCP transport, whose exchange must still
 * send everything over TCP): mapped, and whether this rank can read the peer's memory. Blocks
 * until the deadline. Fails only on store or TCP errors (which fail the group); a segment that
 * cannot be created or opened leaves those pairs on TCP, with a warning. */
tdist_status_t tdist__shm_links_setup(tdist__shm_links_t *l, const tdist__transport_cfg_t *cfg,
                                      tdist__transport_t *tp, const int *same, int64_t deadline);

/* Unmaps and frees everything (and closes our segment's descriptor if it is still open). */
void tdist__shm_links_close(tdist__shm_links_t *l, int size);

#endif
