/* The TCPStore server: one thread running an epoll loop over non-blocking sockets (Redis-style).
 *
 * The loop thread owns every connection and the key/value map; no locks. Other threads talk to it
 * only through the stop eventfd and read the stats atomics. Each connection buffers input until
 * the codec (proto.c) sees a whole request, so requests split at any byte and several requests in
 * one segment both work. Replies are appended to the connection's output buffer and flushed once
 * per loop iteration; WAIT replies may go to other connections, which are flushed the same way.
 * A protocol error or limit closes only the offending connection, with a log line naming the peer.
 * A connection is never freed while the loop may still touch it: closes are deferred to the end of
 * the iteration (Redis freeClientAsync). */
#define _GNU_SOURCE
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "runtime/common/clock.h"
#include "runtime/common/log.h"
#include "runtime/common/options.h"
#include "runtime/common/sock.h"
#include "runtime/common/status_internal.h"
#include "runtime/store/kv.h"
#include "runtime/store/proto.h"
#include "runtime/store/server_listen.h"
#include "tdist/store.h"

#define SERVER_MAGIC 0x7d57a5e1u
#define IN_CHUNK (64 * 1024)
#define IN_KEEP_MAX (256 * 1024) /* an idle connection keeps at most this much input buffer */
/* Stop reading a connection whose replies pile up past this. */
#define OUT_HIGH (16 * 1024 * 1024)
#define MAX_EVENTS 256
/* Fairness: per loop turn a connection gets one recv of at most IN_CHUNK bytes and at most
 * TURN_REQUESTS requests executed; what is left waits for the next turn (the ready list). */
#define TURN_REQUESTS 64
/* Keys of one WAIT registered per loop turn, and links of closed or canceled WAITs torn down per
 * turn: a WAIT of 131072 keys is registered over 32 turns, with other connections served between
 * them, and its teardown is spread out the same way (issue 14: one such WAIT used to hold the loop
 * for tens of milliseconds going in and again going out). */
#define TURN_WAIT_KEYS 1024
#define TURN_REAP_LINKS 4096
/* What a pending WAIT costs per missing key beyond its link: the waiter queue and, for a key not
 * in the map yet, the entry the WAIT creates (bookkeeping overhead plus the key bytes); measured at
 * about 221 bytes per short key in all (issue 14). */
#define WAIT_KEY_OVERHEAD 200

typedef struct conn conn_t;
typedef struct wait wait_t;

/* One link of a pending WAIT in a key's waiter list (entry->waiters). */
typedef struct waitlink {
  wait_t *w;
  tdist__kv_entry_t *e;
  struct waitlink *prev, *next;
} waitlink_t;

struct wait {
  conn_t *c;           /* NULL once buried (its connection closed or canceled it) */
  uint64_t remaining;  /* registered keys still missing */
  waitlink_t *links;   /* array, room for every key of the request */
  size_t nlinks;       /* links in use: one per key missing at registration */
  size_t bytes;        /* charged to the connection's budget, then to the graveyard's */
  uint64_t reg_pos;    /* registering: the item position of the next key to register */
  int registering;     /* keys of the request are still being registered (over loop turns) */
  size_t reap_pos;     /* buried: links before this one are unlinked */
  wait_t *prev, *next; /* in the connection's list, or the server's graveyard */
};

struct conn {
  int fd;
  tdist__dialect_t dialect;
  int validated;
  int closing;     /* queued for close at the end of the iteration */
  int in_flush;    /* on the flush list */
  int read_paused; /* backpressure: EPOLLIN off */
  int want_out;    /* EPOLLOUT on */
  uint8_t *in;
  size_t in_len, in_cap, in_need;
  tdist__parse_progress_t in_prog; /* how far the partial request at in[0] was checked */
  uint8_t *out;
  size_t out_off, out_len, out_cap;
  int out_failed; /* allocation of reply space failed: close */
  wait_t *waits;
  wait_t *reg;       /* the WAIT at in[0] being registered (also on waits), or NULL */
  size_t wait_bytes; /* sum of the pending WAITs' bytes */
  size_t charged;    /* in_cap + out_cap + wait_bytes as last charged to the server total */
  int in_ready;      /* on the ready list: whole requests left buffered by the turn quota */
  conn_t *ready_next;
  conn_t *prev, *next; /* all connections */
  conn_t *flush_next;  /* flush list */
  conn_t *close_next;  /* close list */
  char close_why[320]; /* empty: a normal close, no log line */
  char peer[64];
};

struct tdist_store_server_s {
  uint32_t magic;
  int listen_fd;
  int epfd;
  int stop_fd;
  int port;
  pthread_t thread;
  int quiet;
  tdist__proto_limits_t limits;
  size_t max_connections;
  tdist__kv_t *kv;
  conn_t *conns;
  conn_t *flush_list;
  conn_t *close_list;
  conn_t *ready_list;
  wait_t *graves;     /* WAITs of closed connections (or canceled) whose links are torn down a
                         share per loop turn */
  size_t grave_bytes; /* their bytes, still counted in mem_total until freed */
  size_t conn_budget, server_budget;
  size_t out_high;             /* OUT_HIGH, or a quarter of the connection budget if less */
  size_t mem_total;            /* sum of every connection's charged bytes */
  int64_t accept_paused_until; /* EMFILE back-off, ms; 0 = listening */
  int64_t last_limit_log_ms;
  char bind_str[80];
  _Atomic uint64_t st_requests, st_accepted, st_open, st_dropped, st_keys, st_waits;
};

/* ---------------------------------------------------------------------------------------- */
/* Logging helpers                                                                           */

/* ---------------------------------------------------------------------------------------- */
/* Output                                                                                    */

static void mark_flush(tdist_store_server_t *s, conn_t *c) {
  if (!c->in_flush && !c->closing) {
    c->in_flush = 1;
    c->flush_next = s->flush_list;
    s->flush_list = c;
  }
}

static void close_later(tdist_store_server_t *s, conn_t *c, const char *why);
static void reap_graves(tdist_store_server_t *s, size_t budget);

static size_t conn_bytes(const conn_t *c) { return c->in_cap + c->out_cap + c->wait_bytes; }

/* Would the connection, grown by `more` bytes, stay within both budgets? If not, queues it for
 * close with a log line naming the budget and what exceeded it, and returns 0. */
static int budget_ok(tdist_store_server_t *s, conn_t *c, size_t more, const char *what) {
  size_t mine = conn_bytes(c);
  char why[320];
  if (more > s->conn_budget || mine > s->conn_budget - more) {
    snprintf(why, sizeof why,
             "%s of %zu bytes would take the connection to %zu bytes, past its budget of %zu "
             "(max_connection_bytes)",
             what, more, mine + (more > SIZE_MAX - mine ? 0 : more), s->conn_budget);
  } else if (s->mem_total + more > s->server_budget) {
    /* First what closed connections left: torn-down WAITs give their bytes back link by link,
     * so this costs in proportion to `more` (bounded, the rest goes on a share per turn). */
    for (size_t i = 0; i < 16 && s->graves && s->mem_total + more > s->server_budget; i++)
      reap_graves(s, TURN_REAP_LINKS / 16);
    if (s->mem_total + more <= s->server_budget) return 1;
    /* Then the connection holding the most goes, not whichever asked last: a small honest
     * client is not closed because a hostile one filled the server. The victim's memory is
     * freed at the end of this loop turn, so this growth may overshoot the budget until then by
     * at most `more`, which is less than what the victim gives back. Connections already
     * closing count the same way. */
    conn_t *big = NULL;
    size_t doomed = 0;
    for (conn_t *o = s->conns; o; o = o->next) {
      if (o->closing)
        doomed += o->in_cap + o->out_cap;
      else if (o != c && (!big || o->charged > big->charged))
        big = o;
    }
    if (s->mem_total - doomed + more <= s->server_budget) return 1;
    if (big && big->charged > mine + more) {
      snprintf(why, sizeof why,
               "it holds %zu bytes, the most of any connection, and the server budget of %zu "
               "(max_server_bytes) was reached (%zu bytes in all) when %s asked for %zu",
               big->charged, s->server_budget, s->mem_total, c->peer, more);
      close_later(s, big, why);
      return 1;
    }
    snprintf(why, sizeof why,
             "%s of %zu bytes would take all connections to %zu bytes, past the server budget of "
             "%zu (max_server_bytes); this connection holds %zu, the most of any",
             what, more, s->mem_total + more, s->server_budget, mine);
  } else {
    return 1;
  }
  close_later(s, c, why);
  return 0;
}

/* Charges the connection's current size to the server total. */
static void charge(tdist_store_server_t *s, conn_t *c) {
  size_t now = conn_bytes(c);
  s->mem_total = s->mem_total - c->charged + now;
  c->charged = now;
}

static uint8_t *out_reserve(tdist_store_server_t *s, conn_t *c, size_t n) {
  if (c->out_failed || c->closing) return NULL;
  if (c->out_off && c->out_off == c->out_len) c->out_off = c->out_len = 0;
  if (c->out_len + n > c->out_cap) {
    if (c->out_off) {
      memmove(c->out, c->out + c->out_off, c->out_len - c->out_off);
      c->out_len -= c->out_off;
      c->out_off = 0;
    }
    if (c->out_len + n > c->out_cap) {
      size_t cap = c->out_cap ? c->out_cap : 256;
      while (cap < c->out_len + n) cap *= 2;
      if (cap - c->out_cap > s->conn_budget - c->out_cap) cap = c->out_len + n; /* no doubling */
      if (!budget_ok(s, c, cap - c->out_cap, "reply buffer growth")) return NULL;
      uint8_t *p = realloc(c->out, cap);
      if (!p) {
        c->out_failed = 1;
        mark_flush(s, c); /* flush_conn closes it; unmarked, the client would wait forever */
        return NULL;
      }
      c->out = p;
      c->out_cap = cap;
      charge(s, c);
    }
  }
  uint8_t *p = c->out + c->out_len;
  c->out_len += n;
  mark_flush(s, c);
  return p;
}

static void put_u8(tdist_store_server_t *s, conn_t *c, uint8_t v) {
  uint8_t *p = out_reserve(s, c, 1);
  if (p) *p = v;
}
static void put_i64(tdist_store_server_t *s, conn_t *c, int64_t v) {
  uint8_t *p = out_reserve(s, c, 8);
  if (p) tdist__put_u64(p, (uint64_t)v);
}
static void put_bytes(tdist_store_server_t *s, conn_t *c, const void *d, size_t n) {
  uint8_t *p = out_reserve(s, c, 8 + n);
  if (!p) return;
  tdist__put_u64(p, n);
  if (n) memcpy(p + 8, d, n);
}

/* ---------------------------------------------------------------------------------------- */
/* Connection lifecycle                                                                      */

static void close_later(tdist_store_server_t *s, conn_t *c, const char *why) {
  if (c->closing) return;
  c->closing = 1;
  snprintf(c->close_why, sizeof c->close_why, "%s", why ? why : "");
  c->close_next = s->close_list;
  s->close_list = c;
}

/* A key's waiters, oldest first (entry->waiters points to one of these while non-empty). */
typedef struct {
  waitlink_t *head, *tail;
} waitq_t;

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
  charge(s, w->c);
  free(w->links);
  free(w);
}

static void wait_free(tdist_store_server_t *s, wait_t *w) { wait_destroy(s, w, 1); }

/* Detaches a pending WAIT from its connection (closed, or it canceled its waits) into the
 * graveyard, where reap_graves() unlinks it a share per turn; no reply is ever sent for it. Its
 * bytes stay counted in the server total until then. */
static void wait_bury(tdist_store_server_t *s, wait_t *w) {
  conn_t *c = w->c;
  if (w->prev)
    w->prev->next = w->next;
  else
    c->waits = w->next;
  if (w->next) w->next->prev = w->prev;
  if (c->reg == w) c->reg = NULL;
  atomic_fetch_sub_explicit(&s->st_waits, 1, memory_order_relaxed);
  c->wait_bytes -= w->bytes;
  charge(s, c);
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
static void reap_graves(tdist_store_server_t *s, size_t budget) {
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

static void conn_free(tdist_store_server_t *s, conn_t *c) {
  while (c->waits) wait_bury(s, c->waits);
  epoll_ctl(s->epfd, EPOLL_CTL_DEL, c->fd, NULL);
  close(c->fd);
  if (c->prev)
    c->prev->next = c->next;
  else
    s->conns = c->next;
  if (c->next) c->next->prev = c->prev;
  free(c->in);
  free(c->out);
  c->in_cap = c->out_cap = 0;
  charge(s, c);
  free(c);
  atomic_fetch_sub_explicit(&s->st_open, 1, memory_order_relaxed);
}

static void update_events(tdist_store_server_t *s, conn_t *c) {
  struct epoll_event ev = {.data.ptr = c};
  ev.events = (c->read_paused ? 0 : EPOLLIN) | (c->want_out ? EPOLLOUT : 0);
  epoll_ctl(s->epfd, EPOLL_CTL_MOD, c->fd, &ev);
}

static void process_input(tdist_store_server_t *s, conn_t *c);

/* Writes as much buffered output as the socket takes; manages EPOLLOUT and read backpressure. */
static void flush_conn(tdist_store_server_t *s, conn_t *c) {
  if (c->closing) return;
  if (c->out_failed) {
    close_later(s, c, "out of memory for replies");
    return;
  }
  while (c->out_off < c->out_len) {
    ssize_t n = send(c->fd, c->out + c->out_off, c->out_len - c->out_off, MSG_NOSIGNAL);
    if (n > 0) {
      c->out_off += (size_t)n;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    close_later(s, c, NULL); /* peer went away; not an error worth a log line */
    return;
  }
  size_t pending = c->out_len - c->out_off;
  if (pending == 0) {
    c->out_off = c->out_len = 0;
    if (c->out_cap > IN_KEEP_MAX) {
      free(c->out);
      c->out = NULL;
      c->out_cap = 0;
      charge(s, c);
    }
  }
  int want_out = pending > 0;
  int pause = pending > s->out_high;
  if (want_out != c->want_out || pause != c->read_paused) {
    int resumed = c->read_paused && !pause;
    c->want_out = want_out;
    c->read_paused = pause;
    update_events(s, c);
    if (resumed) process_input(s, c); /* requests may be waiting in the input buffer */
  }
}

static void flush_all(tdist_store_server_t *s) {
  while (s->flush_list) {
    conn_t *c = s->flush_list;
    s->flush_list = c->flush_next;
    c->in_flush = 0;
    flush_conn(s, c);
  }
}

static void close_all_pending(tdist_store_server_t *s) {
  while (s->close_list) {
    conn_t *c = s->close_list;
    s->close_list = c->close_next;
    if (c->close_why[0]) {
      atomic_fetch_add_explicit(&s->st_dropped, 1, memory_order_relaxed);
      if (!s->quiet)
        tdist__log(TDIST__LOG_WARN, "store", "closing connection from %s: %s", c->peer,
                   c->close_why);
    }
    if (c->in_flush) {
      /* Unlink from the flush list before freeing. */
      conn_t **pp = &s->flush_list;
      while (*pp && *pp != c) pp = &(*pp)->flush_next;
      if (*pp) *pp = c->flush_next;
    }
    if (c->in_ready) {
      conn_t **pp = &s->ready_list;
      while (*pp && *pp != c) pp = &(*pp)->ready_next;
      if (*pp) *pp = c->ready_next;
    }
    conn_free(s, c);
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
    put_u8(s, w->c, TDIST__WAIT_STOP_WAITING);
    wait_free(s, w);
  }
}

/* A key gained a value: every WAIT registered on it counts one key fewer. */
static void wake_all(tdist_store_server_t *s, tdist__kv_entry_t *e) {
  while (e && e->waiters) wake_link(s, ((waitq_t *)e->waiters)->head);
}

/* A queue gained an item: only the oldest waiter is released (PyTorch's QUEUE_PUSH). */
static void wake_one(tdist_store_server_t *s, tdist__kv_entry_t *e) {
  if (e && e->waiters) wake_link(s, ((waitq_t *)e->waiters)->head);
}

/* Registers (the next share of) a WAIT's keys: 0 done (answered now, pending, or the connection
 * is closing for its budget), 1 more keys are left for a later turn (the request stays at the head
 * of the input), -ENOMEM. The WAIT is on the connection's list from its first share, so a close
 * buries it; a key set meanwhile counts for it, and it is answered only once every key is in. Each
 * missing key is charged to the budget before it is linked, so pipelined WAITs are bounded. */
static int do_wait(tdist_store_server_t *s, conn_t *c, const tdist__request_t *req) {
  wait_t *w = c->reg;
  if (!w) {
    if (req->n > SIZE_MAX / sizeof(waitlink_t)) return -ENOMEM;
    size_t bytes = sizeof(wait_t) + (size_t)req->n * sizeof(waitlink_t);
    if (!budget_ok(s, c, bytes, "a pending WAIT")) return 0;
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
    charge(s, c);
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
        put_u8(s, c, TDIST__WAIT_STOP_WAITING);
        wait_free(s, w);
      }
      return 0;
    }
    tdist__kv_entry_t *e = tdist__kv_find(s->kv, k.ptr, k.len);
    if (tdist__kv_exists(e)) continue;
    size_t cost = sizeof(waitlink_t) + WAIT_KEY_OVERHEAD + (size_t)k.len;
    if (!budget_ok(s, c, cost - sizeof(waitlink_t), "a pending WAIT")) return 0;
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
    charge(s, c);
  }
  return 1;
}

/* ---------------------------------------------------------------------------------------- */
/* Request execution                                                                         */

/* execute()'s answer for a request only partly executed this turn (a WAIT still registering): it
 * stays at the head of the input and runs on next turn. */
static const char MORE[] = "";

/* Executes one parsed request. Returns NULL, MORE, or the reason to close the connection. */
static const char *execute(tdist_store_server_t *s, conn_t *c, const tdist__request_t *r) {
  tdist__kv_entry_t *e = NULL;
  int rc;
  if (!c->reg) atomic_fetch_add_explicit(&s->st_requests, 1, memory_order_relaxed);
  switch (r->op) {
    case TDIST__OP_VALIDATE:
      if (c->validated) return "VALIDATE after the connection was validated";
      if (r->u32 != TDIST__VALIDATE_MAGIC) return "VALIDATE with a wrong magic number";
      c->validated = 1;
      return NULL;
    case TDIST__OP_PING: {
      uint8_t *p = out_reserve(s, c, 4);
      if (p) tdist__put_u32(p, r->u32);
      return NULL;
    }
    case TDIST__OP_SET:
      if (tdist__kv_set(s->kv, r->key.ptr, r->key.len, r->a.ptr, r->a.len, &e)) goto nomem;
      wake_all(s, e);
      return NULL;
    case TDIST__OP_APPEND:
      if (tdist__kv_append(s->kv, r->key.ptr, r->key.len, r->a.ptr, r->a.len, &e)) goto nomem;
      wake_all(s, e);
      return NULL;
    case TDIST__OP_MULTI_SET: {
      uint64_t pos = 0;
      tdist__slice_t k, v;
      while (tdist__proto_next_item(r, &pos, &k, &v)) {
        if (tdist__kv_set(s->kv, k.ptr, k.len, v.ptr, v.len, &e)) goto nomem;
        wake_all(s, e);
      }
      return NULL;
    }
    case TDIST__OP_COMPARE_SET: {
      const uint8_t *cur;
      size_t cur_len;
      int stored;
      if (tdist__kv_compare_set(s->kv, r->key.ptr, r->key.len, r->a.ptr, r->a.len, r->b.ptr,
                                r->b.len, &cur, &cur_len, &stored, &e))
        goto nomem;
      put_bytes(s, c, cur, cur_len);
      if (stored) wake_all(s, e);
      return NULL;
    }
    case TDIST__OP_GET: {
      e = tdist__kv_find(s->kv, r->key.ptr, r->key.len);
      if (!e || !e->has_value) {
        /* 1.13 and 2.x legacy servers throw and drop the connection; the 2.x libuv server
         * (the 2.x default) replies an empty value. Serve each dialect like its own server. */
        if (c->dialect == TDIST__DIALECT_V1_13) return "GET of a key that does not exist";
        put_bytes(s, c, NULL, 0);
        return NULL;
      }
      put_bytes(s, c, e->val, e->vlen);
      return NULL;
    }
    case TDIST__OP_ADD: {
      int64_t v;
      rc = tdist__kv_add(s->kv, r->key.ptr, r->key.len, r->delta, &v, &e);
      if (rc == -EINVAL) return "ADD on a value that is not an integer";
      if (rc) goto nomem;
      put_i64(s, c, v);
      wake_all(s, e);
      return NULL;
    }
    case TDIST__OP_CHECK: {
      uint64_t pos = 0;
      tdist__slice_t k;
      int ready = 1;
      while (ready && tdist__proto_next_item(r, &pos, &k, NULL))
        ready = tdist__kv_exists(tdist__kv_find(s->kv, k.ptr, k.len));
      put_u8(s, c, ready ? TDIST__CHECK_READY : TDIST__CHECK_NOT_READY);
      return NULL;
    }
    case TDIST__OP_WAIT:
      rc = do_wait(s, c, r);
      if (rc < 0) goto nomem;
      if (rc > 0) return MORE;
      return NULL;
    case TDIST__OP_CANCEL_WAIT:
      while (c->waits) wait_bury(s, c->waits);
      put_u8(s, c, TDIST__WAIT_CANCELED);
      return NULL;
    case TDIST__OP_GETNUMKEYS: put_i64(s, c, (int64_t)tdist__kv_num_keys(s->kv)); return NULL;
    case TDIST__OP_DELETE_KEY:
      put_i64(s, c, tdist__kv_delete(s->kv, r->key.ptr, r->key.len));
      return NULL;
    case TDIST__OP_WATCH_KEY:
      /* 1.13 only, on the callback connection; its Python API never calls it. Registering is
       * enough: no notifications are pushed (reference §1.11). */
      put_u8(s, c, TDIST__WATCH_CALLBACK_REGISTERED);
      return NULL;
    case TDIST__OP_MULTI_GET: {
      uint64_t pos = 0;
      tdist__slice_t k;
      /* Size the reply before building it: a request naming one large key many times must not
       * make us allocate its product. Over the budget, the connection is closed. */
      uint64_t total = 0;
      while (tdist__proto_next_item(r, &pos, &k, NULL)) {
        e = tdist__kv_find(s->kv, k.ptr, k.len);
        total += 8 + (e && e->has_value ? e->vlen : 0);
        if (total > s->conn_budget) break;
      }
      size_t pending = c->out_len - c->out_off;
      if (total > s->conn_budget || pending + total > c->out_cap) {
        size_t more = (size_t)(pending + total > c->out_cap ? pending + total - c->out_cap : 0);
        if (total > s->conn_budget) more = (size_t)total;
        if (!budget_ok(s, c, more, "a MULTI_GET reply")) return NULL;
      }
      pos = 0;
      while (tdist__proto_next_item(r, &pos, &k, NULL)) {
        e = tdist__kv_find(s->kv, k.ptr, k.len);
        if (e && e->has_value)
          put_bytes(s, c, e->val, e->vlen);
        else
          put_bytes(s, c, NULL, 0);
      }
      return NULL;
    }
    case TDIST__OP_QUEUE_PUSH:
      if (tdist__kv_queue_push(s->kv, r->key.ptr, r->key.len, r->a.ptr, r->a.len, &e)) goto nomem;
      wake_one(s, e);
      return NULL;
    case TDIST__OP_QUEUE_POP: {
      size_t len = tdist__kv_queue_len(s->kv, r->key.ptr, r->key.len);
      put_i64(s, c, (int64_t)len);
      if (len > 0) {
        tdist__kv_qitem_t *q = tdist__kv_queue_pop(s->kv, r->key.ptr, r->key.len);
        put_bytes(s, c, q->data, q->len);
        free(q);
      }
      return NULL;
    }
    case TDIST__OP_QUEUE_LEN:
      put_i64(s, c, (int64_t)tdist__kv_queue_len(s->kv, r->key.ptr, r->key.len));
      return NULL;
    default: return "unknown opcode";
  }
nomem:
  return "out of memory executing the request";
}

/* Parses and executes every whole request buffered on the connection. */
static void mark_ready(tdist_store_server_t *s, conn_t *c) {
  if (!c->in_ready && !c->closing) {
    c->in_ready = 1;
    c->ready_next = s->ready_list;
    s->ready_list = c;
  }
}

/* Gives an input buffer that grew for a large request back once it holds little. */
static void shrink_input(tdist_store_server_t *s, conn_t *c) {
  if (c->in_cap <= IN_KEEP_MAX) return;
  if (c->in_len == 0) {
    free(c->in);
    c->in = NULL;
    c->in_cap = 0;
  } else if (c->in_len <= IN_CHUNK / 2 && c->in_need <= IN_CHUNK) {
    uint8_t *p = malloc(IN_CHUNK); /* not realloc: glibc may keep a shrunk block's pages */
    if (!p) return;                /* keep the big one */
    memcpy(p, c->in, c->in_len);
    free(c->in);
    c->in = p;
    c->in_cap = IN_CHUNK;
  } else {
    return;
  }
  charge(s, c);
}

/* Parses and executes the whole requests buffered on the connection, at most TURN_REQUESTS of
 * them: if more are left, the connection goes on the ready list for the next loop turn. */
static void process_input(tdist_store_server_t *s, conn_t *c) {
  size_t off = 0;
  int done = 0;
  if (c->in_need > c->in_len) return; /* the parser said it needs more than we have */
  while (!c->closing && !c->read_paused && off < c->in_len) {
    if (done == TURN_REQUESTS) {
      mark_ready(s, c);
      break;
    }
    done++;
    const uint8_t *p = c->in + off;
    size_t avail = c->in_len - off;
    if (c->dialect == TDIST__DIALECT_UNKNOWN) {
      c->dialect = tdist__proto_classify(p, avail);
      if (c->dialect == TDIST__DIALECT_UNKNOWN) {
        c->in_need = off + 5;
        break;
      }
    }
    tdist__request_t req;
    size_t used;
    const char *why;
    /* The partial request stays at the head of the input (moved, not changed) until it is
     * whole, so the parse resumes where the last one stopped. */
    tdist__parse_result_t pr =
        tdist__proto_parse_resume(c->dialect, p, avail, &s->limits, &req, &used, &why, &c->in_prog);
    if (pr == TDIST__PARSE_NEED_MORE) {
      c->in_need = off + used;
      break;
    }
    if (pr == TDIST__PARSE_ERROR) {
      char msg[200];
      snprintf(msg, sizeof msg, "%s (opcode 0x%02x, %s dialect)", why, p[0],
               c->dialect == TDIST__DIALECT_V2 ? "2.x" : "1.13");
      close_later(s, c, msg);
      break;
    }
    const char *fail = execute(s, c, &req);
    if (fail == MORE) {
      mark_ready(s, c);
      break;
    }
    if (fail) {
      char msg[200];
      char k[100];
      tdist__store_key_str(req.key.ptr, req.key.len, k, sizeof k);
      snprintf(msg, sizeof msg, "%s (%s '%s')", fail, tdist__proto_op_name(req.op), k);
      close_later(s, c, msg);
      break;
    }
    off += used;
    c->in_need = 0;
    memset(&c->in_prog, 0, sizeof c->in_prog);
    if (c->out_len - c->out_off > s->out_high) {
      /* Stop parsing until the client reads its replies; flush_conn resumes us. */
      c->read_paused = 1;
      c->want_out = 1;
      update_events(s, c);
    }
  }
  if (off) {
    memmove(c->in, c->in + off, c->in_len - off);
    c->in_len -= off;
    if (c->in_need) c->in_need -= off;
  }
  shrink_input(s, c);
}

static void on_readable(tdist_store_server_t *s, conn_t *c) {
  /* Whole requests are still buffered from an earlier turn: run those (the ready list does)
   * before reading more, so the buffer cannot outgrow what the quota lets us execute. */
  if (c->in_ready) return;
  /* One recv of at most IN_CHUNK bytes per turn, so one busy client cannot starve the rest. */
  for (;;) {
    size_t want = IN_CHUNK;
    if (c->in_cap - c->in_len < want) {
      /* A large request grows the buffer toward what the parser said it needs, at most
       * doubling; the budget bounds it. */
      size_t need = c->in_need > c->in_len + want ? c->in_need : c->in_len + want;
      size_t cap = c->in_cap ? c->in_cap : IN_CHUNK;
      while (cap < need) cap *= 2;
      if (cap - c->in_cap > s->conn_budget) cap = need;
      if (!budget_ok(s, c, cap - c->in_cap, "request buffer growth")) return;
      uint8_t *p = realloc(c->in, cap);
      if (!p) {
        close_later(s, c, "out of memory for the request buffer");
        return;
      }
      c->in = p;
      c->in_cap = cap;
      charge(s, c);
    }
    ssize_t n = recv(c->fd, c->in + c->in_len, want, 0);
    if (n == 0) {
      close_later(s, c, NULL); /* clean close by the client */
      return;
    }
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) close_later(s, c, NULL);
      break;
    }
    c->in_len += (size_t)n;
    break;
  }
  process_input(s, c);
}

static void on_accept(tdist_store_server_t *s) {
  for (int i = 0; i < 256; i++) {
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    int fd = accept4(s->listen_fd, (struct sockaddr *)&ss, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        /* Out of descriptors: stop accepting for a moment instead of spinning. */
        int64_t now = tdist__now_ms();
        if (!s->quiet && now - s->last_limit_log_ms > 1000) {
          s->last_limit_log_ms = now;
          tdist__log(TDIST__LOG_WARN, "store", "accept failed: %s; pausing accepts for 100 ms",
                     strerror(errno));
        }
        s->accept_paused_until = now + 100;
        epoll_ctl(s->epfd, EPOLL_CTL_DEL, s->listen_fd, NULL);
      }
      return;
    }
    uint64_t open = atomic_load_explicit(&s->st_open, memory_order_relaxed);
    if (open >= s->max_connections) {
      char peer[64];
      tdist__sockaddr_str((struct sockaddr *)&ss, sl, peer, sizeof peer);
      close(fd);
      atomic_fetch_add_explicit(&s->st_dropped, 1, memory_order_relaxed);
      int64_t now = tdist__now_ms();
      if (!s->quiet && now - s->last_limit_log_ms > 1000) {
        s->last_limit_log_ms = now;
        tdist__log(TDIST__LOG_WARN, "store",
                   "refusing connection from %s: %zu connections open (max_connections)", peer,
                   s->max_connections);
      }
      continue;
    }
    conn_t *c = calloc(1, sizeof *c);
    if (!c) {
      close(fd);
      continue;
    }
    c->fd = fd;
    tdist__sock_nodelay(fd);
    tdist__sockaddr_str((struct sockaddr *)&ss, sl, c->peer, sizeof c->peer);
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = c};
    if (epoll_ctl(s->epfd, EPOLL_CTL_ADD, fd, &ev) != 0) {
      close(fd);
      free(c);
      continue;
    }
    c->next = s->conns;
    if (s->conns) s->conns->prev = c;
    s->conns = c;
    atomic_fetch_add_explicit(&s->st_accepted, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&s->st_open, 1, memory_order_relaxed);
  }
}

static void *server_main(void *arg) {
  tdist_store_server_t *s = arg;
  struct epoll_event evs[MAX_EVENTS];
  for (;;) {
    int timeout = s->ready_list || s->graves ? 0 : -1;
    if (s->accept_paused_until) {
      int64_t left = s->accept_paused_until - tdist__now_ms();
      if (left <= 0) {
        struct epoll_event ev = {.events = EPOLLIN, .data.ptr = s};
        if (epoll_ctl(s->epfd, EPOLL_CTL_ADD, s->listen_fd, &ev) == 0) {
          s->accept_paused_until = 0;
        } else { /* not listening again yet: try later, or we never accept again */
          s->accept_paused_until = tdist__now_ms() + 100;
          timeout = 100;
        }
      } else if (timeout != 0) {
        timeout = (int)left;
      }
    }
    int n = epoll_wait(s->epfd, evs, MAX_EVENTS, timeout);
    if (n < 0) {
      if (errno == EINTR) continue;
      tdist__log(TDIST__LOG_ERROR, "store", "epoll_wait: %s; server thread exits", strerror(errno));
      break;
    }
    int stop = 0;
    for (int i = 0; i < n; i++) {
      void *p = evs[i].data.ptr;
      if (p == &s->stop_fd) {
        stop = 1;
      } else if (p == s) {
        on_accept(s);
      } else {
        conn_t *c = p;
        if (c->closing) continue;
        if (evs[i].events & EPOLLOUT) mark_flush(s, c);
        if (evs[i].events & (EPOLLIN | EPOLLERR | EPOLLHUP)) {
          if (!c->read_paused)
            on_readable(s, c);
          else if (evs[i].events & (EPOLLERR | EPOLLHUP))
            close_later(s, c, NULL);
        }
      }
      flush_all(s);
    }
    /* Connections the turn quota left with whole requests buffered get their next share. */
    conn_t *ready = s->ready_list;
    s->ready_list = NULL;
    while (ready) {
      conn_t *c = ready;
      ready = c->ready_next;
      c->in_ready = 0;
      if (!c->closing) process_input(s, c);
    }
    flush_all(s);
    /* Only now: later events of this batch may still name a connection closed earlier in it. */
    close_all_pending(s);
    reap_graves(s, TURN_REAP_LINKS);
    atomic_store_explicit(&s->st_keys, tdist__kv_num_keys(s->kv), memory_order_relaxed);
    if (stop) break;
  }
  return NULL;
}

/* ---------------------------------------------------------------------------------------- */
/* Public API                                                                                */

TDIST_EXTERN tdist_status_t tdist_store_server_create(const tdist_store_server_options_t *opts,
                                                      tdist_store_server_t **out) {
  tdist_store_server_options_t o = TDIST_STORE_SERVER_OPTIONS_INIT;
  if (!out)
    return tdist__fail(TDIST_ERR_INVALID_ARGUMENT, "tdist_store_server_create: out is NULL");
  *out = NULL;
  /* Where a caller's struct may end: version 1's last field (append only). */
  static const size_t ends[] = {TDIST__OPTS_END(tdist_store_server_options_t, quiet),
                                TDIST__OPTS_END(tdist_store_server_options_t, max_server_bytes)};
  if (opts) {
    tdist_status_t st =
        tdist__opts_load("tdist_store_server_create", "TDIST_STORE_SERVER_OPTIONS_INIT", opts, &o,
                         sizeof o, ends, sizeof ends / sizeof ends[0]);
    if (st) return st;
  }
  if (o.port < 0 || o.port > 65535)
    return tdist__fail(TDIST_ERR_INVALID_ARGUMENT,
                       "tdist_store_server_create: port %d is outside 0..65535", o.port);
  if (o.max_key_bytes == 0 || o.max_value_bytes == 0 || o.max_multi_keys == 0 ||
      o.max_connections == 0)
    return tdist__fail(TDIST_ERR_INVALID_ARGUMENT,
                       "tdist_store_server_create: limits must be > 0 (max_key_bytes %zu, "
                       "max_value_bytes %zu, max_multi_keys %zu, max_connections %zu)",
                       o.max_key_bytes, o.max_value_bytes, o.max_multi_keys, o.max_connections);
  if (o.backlog < 0)
    return tdist__fail(TDIST_ERR_INVALID_ARGUMENT, "tdist_store_server_create: backlog %d < 0",
                       o.backlog);

  tdist_store_server_t *s = calloc(1, sizeof *s);
  if (!s) return tdist__fail(TDIST_ERR_NO_MEMORY, "tdist_store_server_create: out of memory");
  s->listen_fd = s->epfd = s->stop_fd = -1;
  s->quiet = o.quiet;
  s->limits.max_key = o.max_key_bytes;
  s->limits.max_value = o.max_value_bytes;
  s->limits.max_keys = o.max_multi_keys;
  /* A MULTI_SET may carry many values; bound the whole request so a header cannot make us
   * buffer without limit. */
  s->limits.max_request =
      o.max_value_bytes > (UINT64_MAX / 4) ? 0 : o.max_value_bytes * 2 + (64u << 20);
  s->max_connections = o.max_connections;
  /* Budgets. Per connection: by default any request the limits accept (max_request) plus 64 MiB
   * of queued replies and pending WAITs, so honest use never meets it. Whole server: 1 GiB by
   * default, so a few hostile connections cannot take the host's memory; at least one
   * connection's budget, or the first large request would close its connection. */
  tdist_status_t st;
  s->conn_budget = o.max_connection_bytes;
  if (s->conn_budget == 0)
    s->conn_budget = s->limits.max_request && s->limits.max_request < SIZE_MAX - (64u << 20)
                         ? (size_t)s->limits.max_request + (64u << 20)
                         : SIZE_MAX / 4;
  s->server_budget = o.max_server_bytes ? o.max_server_bytes : (size_t)1 << 30;
  s->out_high = s->conn_budget / 4 < OUT_HIGH ? s->conn_budget / 4 : OUT_HIGH;
  if (s->server_budget < s->conn_budget) {
    if (o.max_server_bytes) {
      st = tdist__fail(TDIST_ERR_INVALID_ARGUMENT,
                       "tdist_store_server_create: max_server_bytes %zu is below the "
                       "per-connection budget %zu (max_connection_bytes)",
                       o.max_server_bytes, s->conn_budget);
      goto fail;
    }
    s->server_budget = s->conn_budget;
  }
  s->kv = tdist__kv_create();
  if (!s->kv) {
    st = tdist__fail(TDIST_ERR_NO_MEMORY, "tdist_store_server_create: out of memory");
    goto fail;
  }
  int backlog = o.backlog ? o.backlog : tdist__store_somaxconn();
  s->listen_fd = tdist__store_listen(o.host, o.port, backlog, s->bind_str, sizeof s->bind_str);
  if (s->listen_fd < 0) {
    int e = -s->listen_fd;
    st = tdist__fail(e == EADDRINUSE || e == EACCES ? TDIST_ERR_INVALID_USAGE : TDIST_ERR_SYSTEM,
                     "store server: cannot listen on %s: %s%s", s->bind_str, strerror(e),
                     e == EADDRINUSE ? " (another process uses the port; pick another or 0)" : "");
    goto fail;
  }
  struct sockaddr_storage ss;
  socklen_t sl = sizeof ss;
  if (getsockname(s->listen_fd, (struct sockaddr *)&ss, &sl) != 0) {
    st = tdist__fail(TDIST_ERR_SYSTEM, "store server: getsockname: %s", strerror(errno));
    goto fail;
  }
  s->port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                           : ((struct sockaddr_in *)&ss)->sin_port);
  tdist__sockaddr_str((struct sockaddr *)&ss, sl, s->bind_str, sizeof s->bind_str);
  s->epfd = epoll_create1(EPOLL_CLOEXEC);
  s->stop_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (s->epfd < 0 || s->stop_fd < 0) {
    st = tdist__fail(TDIST_ERR_SYSTEM, "store server: epoll/eventfd: %s", strerror(errno));
    goto fail;
  }
  struct epoll_event ev = {.events = EPOLLIN, .data.ptr = s};
  struct epoll_event sev = {.events = EPOLLIN, .data.ptr = &s->stop_fd};
  if (epoll_ctl(s->epfd, EPOLL_CTL_ADD, s->listen_fd, &ev) != 0 ||
      epoll_ctl(s->epfd, EPOLL_CTL_ADD, s->stop_fd, &sev) != 0) {
    st = tdist__fail(TDIST_ERR_SYSTEM, "store server: epoll_ctl: %s", strerror(errno));
    goto fail;
  }
  int rc = pthread_create(&s->thread, NULL, server_main, s);
  if (rc != 0) {
    st = tdist__fail(TDIST_ERR_SYSTEM, "store server: pthread_create: %s", strerror(rc));
    goto fail;
  }
  s->magic = SERVER_MAGIC;
  if (!s->quiet)
    tdist__log(TDIST__LOG_INFO, "store", "listening on %s (backlog %d)", s->bind_str, backlog);
  *out = s;
  return TDIST_OK;
fail:
  if (s->listen_fd >= 0) close(s->listen_fd);
  if (s->epfd >= 0) close(s->epfd);
  if (s->stop_fd >= 0) close(s->stop_fd);
  tdist__kv_destroy(s->kv);
  free(s);
  return st;
}

TDIST_EXTERN int tdist_store_server_port(const tdist_store_server_t *s) {
  return s && s->magic == SERVER_MAGIC ? s->port : -1;
}

TDIST_EXTERN void tdist_store_server_stats(tdist_store_server_t *s,
                                           tdist_store_server_stats_t *out) {
  if (!out) return;
  memset(out, 0, sizeof *out);
  if (!s || s->magic != SERVER_MAGIC) return;
  out->requests_total = atomic_load(&s->st_requests);
  out->connections_total = atomic_load(&s->st_accepted);
  out->connections_open = atomic_load(&s->st_open);
  out->connections_dropped = atomic_load(&s->st_dropped);
  out->keys = atomic_load(&s->st_keys);
  out->waits_pending = atomic_load(&s->st_waits);
}

TDIST_EXTERN void tdist_store_server_destroy(tdist_store_server_t *s) {
  if (!s || s->magic != SERVER_MAGIC) return;
  uint64_t one = 1;
  ssize_t w = write(s->stop_fd, &one, sizeof one);
  (void)w;
  pthread_join(s->thread, NULL);
  s->magic = 0;
  while (s->conns) conn_free(s, s->conns);
  reap_graves(s, SIZE_MAX);
  close(s->listen_fd);
  close(s->epfd);
  close(s->stop_fd);
  tdist__kv_destroy(s->kv);
  if (!s->quiet) tdist__log(TDIST__LOG_INFO, "store", "server on %s stopped", s->bind_str);
  free(s);
}
