/* Versioned option structs: the one size and version check of every public options struct.
 *
 * Each starts {size_t size; int version; ...} and only ever gains fields at its end (the
 * append-only promise of include/tdist/): a caller built against an older header passes the
 * smaller size of its struct and knows nothing of the newer fields. tdist__opts_load accepts any
 * size from the end of the first version's fields up, and copies what the caller's struct holds
 * over the current defaults, so a field beyond opts->size reads as its default. It never reads
 * the caller's struct past opts->size (but for the two header fields themselves), and never
 * keeps a field the caller's struct holds only in part. */
#ifndef TDIST_COMMON_OPTIONS_H
#define TDIST_COMMON_OPTIONS_H

#include <stddef.h>
#include <string.h>

#include "runtime/common/status_internal.h"

/* Where `field` of `type` ends: an entry of tdist__opts_load's `ends`. */
#define TDIST__OPTS_END(type, field) (offsetof(type, field) + sizeof(((type *)0)->field))

/* opts: the caller's struct (not NULL); out: a struct of the same type holding the defaults (the
 * struct's current INIT), of out_size bytes. ends: in increasing order, the offsets where a
 * caller's struct may end: ends[0] is the end of the first version's last field (the smallest
 * size accepted), then the end of each field appended since. The bytes up to the largest end
 * <= opts->size are copied; a larger size (a newer caller) copies everything this build knows.
 * fn (the public function) and init (the INIT macro's name) are for the message. Returns TDIST_OK
 * or TDIST_ERR_INVALID_ARGUMENT, whose message names the size and the version. */
static inline tdist_status_t tdist__opts_load(const char *fn, const char *init, const void *opts,
                                              void *out, size_t out_size, const size_t *ends,
                                              size_t n_ends) {
  struct {
    size_t size;
    int version;
  } head;
  memcpy(&head, opts, sizeof head);
  if (head.size < ends[0] || head.version < 1)
    return tdist__fail(TDIST_ERR_INVALID_ARGUMENT,
                       "%s: options not initialised with %s (size %zu, version %d; sizes from %zu "
                       "and versions from 1 are accepted)",
                       fn, init, head.size, head.version, ends[0]);
  size_t n = 0;
  for (size_t i = 0; i < n_ends && ends[i] <= head.size && ends[i] <= out_size; i++) n = ends[i];
  memcpy(out, opts, n);
  return TDIST_OK;
}

#endif
