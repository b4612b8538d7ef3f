/* Shared-memory links between same-host ranks of a gloo group (shm.h): set-up over the store
 * (and the flag bytes the caller exchanges over TCP), and tear-down. The rings themselves are
 * ring.c's, the data path over them link.c's. */
#define _GNU_SOURCE
#include "runtime/gloo/shm/shm.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "runtime/common/clock.h"
#include "runtime/common/log.h"
#include "runtime/common/param.h"
#include "runtime/store/store_internal.h"

/* What a peer reads through process_vm_readv to learn whether it may (single copies). */
static const volatile uint64_t k_probe = 0x7d15c0de5e1f0c0bull;

/* 1 if this process can read pid's memory at addr (the peer's k_probe). */
static int can_read(int pid, uint64_t addr) {
  uint64_t v = 0;
  struct iovec l = {&v, sizeof v}, r = {(void *)(uintptr_t)addr, sizeof v};
  return pid > 0 && addr && process_vm_readv(pid, &l, 1, &r, 1, 0) == (ssize_t)sizeof v &&
         v == k_probe;
}

int tdist__shm_links_alloc(tdist__shm_links_t *l, int size) {
  l->link = calloc((size_t)size, sizeof *l->link);
  l->linked = calloc((size_t)size, 1);
  l->pid = calloc((size_t)size, sizeof *l->pid);
  l->peer_seg = calloc((size_t)size, sizeof *l->peer_seg);
  return l->link && l->linked && l->peer_seg && l->pid ? 0 : -ENOMEM;
}

void tdist__shm_links_close(tdist__shm_links_t *l, int size) {
  if (l->peer_seg)
    for (int i = 0; i < size; i++) tdist__shm_seg_close(&l->peer_seg[i]);
  tdist__shm_seg_close(&l->own);
  free(l->peer_seg);
  free(l->link);
  free(l->linked);
  free(l->pid);
  l->pid = NULL;
  l->peer_seg = NULL;
  l->link = NULL;
  l->linked = NULL;
}

void tdist__shm_links_wake(tdist__shm_links_t *l) {
  if (l->own.base) tdist__shm_ring_doorbell(&l->own); /* a sleep on the rings */
}

/* Each side sends the other one flag byte over TCP saying whether it mapped the peer's segment,
 * which also proves the peer has opened ours, after which we close our descriptor of it (peers
 * open the segment through it). */
static int publish(tdist__shm_links_t *l, const tdist__transport_cfg_t *cfg, tdist_status_t *st) {
  const int size = cfg->size, rank = cfg->rank;
  int r = tdist__shm_seg_create(&l->own, size);
  if (r)
    tdist__log(TDIST__LOG_WARN, "gloo",
               "rank %d: cannot create shared memory (%s): same-host "
               "peers use TCP. Is /dev/shm mounted and large enough (%zu bytes needed)?",
               rank, strerror(-r), TDIST__SHM_RING_BYTES * (size_t)size);
  char key[64], entry[160];
  snprintf(key, sizeof key, "shm/%d", rank);
  int elen = 0;
  if (!r) {
    elen = tdist__shm_seg_describe(&l->own, entry, sizeof entry - 24);
    elen += snprintf(entry + elen, sizeof entry - (size_t)elen, " %llx",
                     (unsigned long long)(uintptr_t)&k_probe);
  }
  *st = tdist_store_set(cfg->store, key, entry, (size_t)elen);
  if (*st)
    *st = tdist__transport_fail(cfg, *st, "publishing shared-memory segment: %s",
                                tdist_store_last_error(cfg->store));
  return r;
}

/* Maps peer i's segment from its published text (when this rank has one of its own, !r) and
 * says what this rank can do with it: 1 mapped (both rings in memory), 2 also readable. */
static uint8_t open_peer(tdist__shm_links_t *l, const tdist__transport_cfg_t *cfg, int i,
                         const char *text, int r) {
  const int size = cfg->size, rank = cfg->rank;
  int pid = 0, pfd = -1;
  unsigned long long probe = 0, dev_ino, cookie;
  /* "pid fd dev_ino cookie probe" (tdist__shm_seg_describe), or empty: the peer has none */
  int have = sscanf(text, "%d %d %llx %llx %llx", &pid, &pfd, &dev_ino, &cookie, &probe) == 5;
  uint8_t flag = 0;
  l->pid[i] = have ? pid : 0;
  if (!r && have) {
    int o = tdist__shm_seg_open(&l->peer_seg[i], text, size);
    flag = o == 0;
    if (o)
      tdist__log(TDIST__LOG_WARN, "gloo",
                 "rank %d: cannot open rank %d's shared memory through /proc/%d/fd/%d (%s): "
                 "that pair uses TCP. Ranks on one host share memory only where each can open "
                 "the other's descriptors: one pid namespace (one container, or a pod with "
                 "shareProcessNamespace) and one user",
                 rank, i, pid, pfd,
                 o == -ESTALE ? "another file there: another pid namespace?" : strerror(-o));
  }
  if (flag) {
    /* Both rings of the pair in memory now: the one we write (the peer's segment) and the
     * one we read (ours). Without room for them in /dev/shm the pair uses TCP. */
    int pf = tdist__shm_ring_prefault(tdist__shm_slot(&l->peer_seg[i], rank));
    if (!pf) pf = tdist__shm_ring_prefault(tdist__shm_slot(&l->own, i));
    if (pf) {
      tdist__log(TDIST__LOG_WARN, "gloo",
                 "rank %d: no room in shared memory for the rings with rank %d (%s): that "
                 "pair uses TCP. Is /dev/shm large enough (%zu bytes per rank of the group "
                 "for each rank on this host)?",
                 rank, i, strerror(-pf), tdist__shm_ring_size());
      flag = 0;
    }
  }
  if (flag && tdist__param_int(TDIST__P_SHM_SINGLE_COPY) && can_read(pid, probe)) flag |= 2;
  return flag;
}

tdist_status_t tdist__shm_links_prepare(tdist__shm_links_t *l, const tdist__transport_cfg_t *cfg,
                                        const int *same, int64_t deadline, uint8_t *flag_out) {
  tdist_status_t st;
  int r = publish(l, cfg, &st);
  if (st) return st;
  for (int i = 0; i < cfg->size; i++) {
    if (!same[i]) continue;
    char key[64];
    snprintf(key, sizeof key, "shm/%d", i);
    void *v = NULL;
    size_t len = 0;
    int64_t left = deadline - tdist__now_ms();
    st = tdist__store_get_ms(cfg->store, key, &v, &len, left > 0 ? left : 1);
    if (st)
      return tdist__transport_fail(cfg, st, "reading rank %d's shared-memory segment: %s", i,
                                   tdist_store_last_error(cfg->store));
    char text[160];
    snprintf(text, sizeof text, "%.*s", (int)(len < 159 ? len : 159), (char *)v);
    tdist_free(v);
    flag_out[i] = open_peer(l, cfg, i, text, r);
  }
  return TDIST_OK;
}

void tdist__shm_links_finish(tdist__shm_links_t *l, const tdist__transport_cfg_t *cfg,
                             const int *same, const uint8_t *flag_out, const uint8_t *flag_in,
                             tdist_status_t st) {
  const int size = cfg->size, rank = cfg->rank;
  int copies = 0;
  tdist__shm_seg_release(&l->own); /* everyone who will map it has */
  for (int i = 0; !st && i < size; i++) {
    if (same[i] && (flag_out[i] & 1) && (flag_in[i] & 1)) {
      tdist__shm_link_init(&l->link[i], i, tdist__shm_slot(&l->peer_seg[i], rank),
                           tdist__shm_slot(&l->own, i), &l->peer_seg[i], l->pid[i],
                           (flag_in[i] & 2) != 0);
      l->linked[i] = 1;
      l->peers++;
      copies += (flag_in[i] & 2) != 0;
    } else {
      tdist__shm_seg_close(&l->peer_seg[i]);
    }
  }
  if (!st && l->peers)
    tdist__log(TDIST__LOG_DEBUG, "gloo",
               "rank %d: %d peers over shared memory, %d of which read large messages straight "
               "from this rank's memory",
               rank, l->peers, copies);
}
