/* Error attribution for the gloo transport (transport_internal.h): which status and text a
 * failed transfer or drain becomes in the group's error (through the config's fail), naming the
 * peer's rank and address, and the call or transfer it was for. The progress loop's own errors
 * (abort, poll, timeouts, a same-host peer's death) are progress.c's. */
#define _GNU_SOURCE
#include <errno.h>
#include <string.h>

#include "runtime/common/sock.h"
#include "runtime/gloo/transport_internal.h"

/* The status of the failures whose detail is in why (-EPROTO, -ENOBUFS, -ECANCELED), else 0. */
static tdist_status_t why_status(int r) {
  return r == -EPROTO      ? TDIST_ERR_PROTOCOL
         : r == -ENOBUFS   ? TDIST_ERR_NO_MEMORY
         : r == -ECANCELED ? TDIST_ERR_REMOTE
                           : TDIST_OK;
}

/* The group's error for a drain of peer's stream that failed with r (<0). */
tdist_status_t tdist__mesh_drain_fail(mesh_t *t, int peer, int r, tdist__what_t *w,
                                      const char *why) {
  const char *what = tdist__what(w);
  if (why_status(r)) return tdist__transport_fail(&t->cfg, why_status(r), "%s: %s", what, why);
  return tdist__transport_fail(&t->cfg, TDIST_ERR_SYSTEM, "%s: reading ahead from rank %d (%s): %s",
                               what, peer, t->addr[peer], strerror(-r));
}

/* The group's error for a transfer that failed with r (<0) on peer. */
tdist_status_t tdist__mesh_xfer_fail(mesh_t *t, const tdist__xfer_t *x, int r, tdist__what_t *w,
                                     const char *why) {
  const tdist__transport_cfg_t *cfg = &t->cfg;
  const char *what = tdist__what(w);
  if (why_status(r)) return tdist__transport_fail(cfg, why_status(r), "%s: %s", what, why);
  if ((r == -TDIST__ECLOSED || r == -ECONNRESET || r == -EPIPE) && !t->link[x->peer]->polls)
    return tdist__transport_fail(
        cfg, TDIST_ERR_REMOTE, /* a single copy found the process gone */
        "%s: rank %d (%s, same host) closed its connection (did that process "
        "exit or crash?)",
        what, x->peer, t->addr[x->peer]);
  if (r == -TDIST__ECLOSED || r == -ECONNRESET || r == -EPIPE)
    return tdist__transport_fail(cfg, TDIST_ERR_REMOTE,
                                 "%s: rank %d (%s) closed the connection (did that process exit "
                                 "or crash?)",
                                 what, x->peer, t->addr[x->peer]);
  return tdist__transport_fail(cfg, TDIST_ERR_SYSTEM, "%s: %s with rank %d (%s): %s", what,
                               x->is_send ? "send" : "receive", x->peer, t->addr[x->peer],
                               strerror(-r));
}

tdist__what_t *tdist__mesh_name_of(const tdist__xfer_t *x, tdist__what_t *call,
                                   tdist__what_t *tmp) {
  if (!x->what_seq) return call;
  *tmp = (tdist__what_t){.kind = (tdist__coll_kind_t)x->what_kind, .seq = x->what_seq};
  return tmp;
}
