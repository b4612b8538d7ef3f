/* The store server's WAITs (server.c runs the loop): a WAIT's links on the keys it waits for, its
 * registration over loop turns within the budgets, the wake-ups when keys get values, and the
 * graveyard where the WAITs of closed connections are torn down a share per turn. Runs on the
 * loop thread only. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>

#include "runtime/store/kv.h"
#include "runtime/store/proto.h"
#include "runtime/store/server_internal.h"

static int link_add(tdist__kv_entry_t *e, waitlink_t *l) {
  waitq_t *q = e->waiters;
  if (!q) {
    q = calloc(1, sizeof *q);
    if (!q) return -ENOMEM;
    e->waiters = q;
  }
  l->e = e;
  l->next = NULL;
  l->prev = q->tail;
  if (q->tail)
    q->tail->next = l;
  else
    q->head = l;
  q->tail = l;
  return 0;
}

static void link_del(tdist_store_server_t *s, waitlink_t *l) {
  tdist__kv_entry_t *e = l->e;
  if (!e) return;
  waitq_t *q = e->waiters;
  if (l->prev)
    l->prev->next = l->next;
  else
    q->head = l->next;
  if (l->next)
    l->next->prev = l->prev;
  else
    q->tail = l->prev;
  l->e = NULL;
  if (!q->head) {
    free(q);
    e->waiters = NULL;
    tdist__kv_release(s->kv, e);
  }
}

/* Unregisters and frees a wait; `linked` = it is on its connection's list. */
static void wait_destroy(tdist_store_server_t *s, wait_t *w, int linked) {
  for (size_t i = 0; i < w->nlinks; i++) link_del(s, &w->links[i]);
  if (linked) {
    if (w->prev)
      w->prev->next = w->next;
    else
      w->c->waits = w->next;
    if (w->next) w->next->prev = w->prev;
    atomic_fetch_sub_explicit(&s->st_waits, 1, memory_order_relaxed);
  }
  w->c->wait_bytes -= w->bytes;
  tdist__srv_charge(s, w->c);
  free(w->links);
  free(w);
}

static void wait_free(tdist_store_server_t *s, wait_t *w) { wait_destroy(s, w, 1); }

/* Detaches a pending WAIT from its connection (closed, or it canceled its waits) into the
 * graveyard, where tdist__srv_reap_graves() unlinks it a share per turn; no reply is ever sent for
 * it. Its bytes stay counted in the server total until then. */
void tdist__srv_wait_bury(tdist_store_server_t *s, wait_t *w) {
  conn_t *c = w->c;
  if (w->prev)
    w->prev->next = w->next;
  else
    c->waits = w->next;
  if (w->next) w->next->prev = w->prev;
  if (c->reg == w) c->reg = NULL;
  atomic_fetch_sub_explicit(&s->st_waits, 1, memory_order_relaxed);
  c->wait_bytes -= w->bytes;
  tdist__srv_charge(s, c);
  s->grave_bytes += w->bytes;
  s->mem_total += w->bytes;
  w->c = NULL;
  w->prev = NULL;
  w->next = s->graves;
  if (s->graves) s->graves->prev = w;
  s->graves = w;
}

/* Unlinks one link of a buried WAIT and gives back what that key was charged. */
static void grave_unlink(tdist_store_server_t *s, wait_t *w, waitlink_t *l) {
  if (!l->e) return;
  size_t cost = WAIT_KEY_OVERHEAD + l->e->klen;
  w->bytes -= cost;
  s->grave_bytes -= cost;
  s->mem_total -= cost;
  link_del(s, l);
}

/* Unlinks at most `budget` links of buried WAITs and frees the WAITs done with (all of them when
 * budget is SIZE_MAX). */
void tdist__srv_reap_graves(tdist_store_server_t *s, size_t budget) {
  while (s->graves && budget > 0) {
    wait_t *w = s->graves;
    while (w->reap_pos < w->nlinks && budget > 0) {
      grave_unlink(s, w, &w->links[w->reap_pos++]);
      budget--;
    }
    if (w->reap_pos < w->nlinks) return;
    s->graves = w->next;
    if (s->graves) s->graves->prev = NULL;
    s->grave_bytes -= w->bytes;
    s->mem_total -= w->bytes;
    free(w->links);
    free(w);
  }
}

/* ---------------------------------------------------------------------------------------- */
/* WAIT bookkeeping                                                                          */

static void wake_link(tdist_store_server_t *s, waitlink_t *l) {
  wait_t *w = l->w;
  if (!w->c) { /* buried: the reaper frees it */
    grave_unlink(s, w, l);
    return;
  }
  link_del(s, l);
  if (--w->remaining == 0 && !w->registering) {
    tdist__srv_put_u8(s, w->c, TDIST__WAIT_STOP_WAITING);
    wait_free(s, w);
  }
}

/* A key gained a value: every WAIT registered on it counts one key fewer. */
void tdist__srv_wake_all(tdist_store_server_t *s, tdist__kv_entry_t *e) {
  while (e && e->waiters) wake_link(s, ((waitq_t *)e->waiters)->head);
}

/* A queue gained an item: only the oldest waiter is released (PyTorch's QUEUE_PUSH). */
void tdist__srv_wake_one(tdist_store_server_t *s, tdist__kv_entry_t *e) {
  if (e && e->waiters) wake_link(s, ((waitq_t *)e->waiters)->head);
}

/* Registers (the next share of) a WAIT's keys: 0 done (answered now, pending, or the connection
 * is closing for its budget), 1 more keys are left for a later turn (the request stays at the head
 * of the input), -ENOMEM. The WAIT is on the connection's list from its first share, so a close
 * buries it; a key set meanwhile counts for it, and it is answered only once every key is in. Each
 * missing key is charged to the budget before it is linked, so pipelined WAITs are bounded. */
int tdist__srv_do_wait(tdist_store_server_t *s, conn_t *c, const tdist__request_t *req) {
  wait_t *w = c->reg;
  if (!w) {
    if (req->n > SIZE_MAX / sizeof(waitlink_t)) return -ENOMEM;
    size_t bytes = sizeof(wait_t) + (size_t)req->n * sizeof(waitlink_t);
    if (!tdist__srv_budget_ok(s, c, bytes, "a pending WAIT")) return 0;
    w = calloc(1, sizeof *w);
    if (!w) return -ENOMEM;
    w->links = req->n ? calloc((size_t)req->n, sizeof *w->links) : NULL;
    if (req->n && !w->links) {
      free(w);
      return -ENOMEM;
    }
    w->c = c;
    w->registering = 1;
    w->bytes = bytes;
    c->wait_bytes += bytes;
    tdist__srv_charge(s, c);
    w->next = c->waits;
    if (c->waits) c->waits->prev = w;
    c->waits = w;
    c->reg = w;
    atomic_fetch_add_explicit(&s->st_waits, 1, memory_order_relaxed);
  }
  tdist__slice_t k;
  for (int share = 0; share < TURN_WAIT_KEYS; share++) {
    if (!tdist__proto_next_item(req, &w->reg_pos, &k, NULL)) {
      w->registering = 0;
      c->reg = NULL;
      if (w->remaining == 0) {
        tdist__srv_put_u8(s, c, TDIST__WAIT_STOP_WAITING);
        wait_free(s, w);
      }
      return 0;
    }
    tdist__kv_entry_t *e = tdist__kv_find(s->kv, k.ptr, k.len);
    if (tdist__kv_exists(e)) continue;
    size_t cost = sizeof(waitlink_t) + WAIT_KEY_OVERHEAD + (size_t)k.len;
    if (!tdist__srv_budget_ok(s, c, cost - sizeof(waitlink_t), "a pending WAIT")) return 0;
    /* budget_ok may have torn down buried WAITs, and with them a placeholder entry like e. */
    e = tdist__kv_lookup(s->kv, k.ptr, k.len);
    waitlink_t *l = &w->links[w->nlinks];
    l->w = w;
    if (!e || link_add(e, l) != 0) {
      if (e) tdist__kv_release(s->kv, e);
      return -ENOMEM;
    }
    w->nlinks++;
    w->remaining++;
    w->bytes += cost - sizeof(waitlink_t);
    c->wait_bytes += cost - sizeof(waitlink_t);
    tdist__srv_charge(s, c);
  }
  return 1;
}
