/* The store server's connections (server.c runs the loop): the memory budgets of a connection and
 * of the server, the reply buffer, flushing with read backpressure, and closing at the end of the
 * loop turn. Runs on the loop thread only. */
#define _GNU_SOURCE
#include <errno.h>
#include <netinet/in.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
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
#include "runtime/store/server_internal.h"

void tdist__srv_mark_flush(tdist_store_server_t *s, conn_t *c) {
  if (!c->in_flush && !c->closing) {
    c->in_flush = 1;
    c->flush_next = s->flush_list;
    s->flush_list = c;
  }
}

static size_t conn_bytes(const conn_t *c) {
  return c->in_cap + c->out_cap + c->wait_bytes + (size_t)c->subs_cap * sizeof *c->subs;
}

/* Would the connection, grown by `more` bytes, stay within both budgets? If not, queues it for
 * close with a log line naming the budget and what exceeded it, and returns 0. */
int tdist__srv_budget_ok(tdist_store_server_t *s, conn_t *c, size_t more, const char *what) {
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
      tdist__srv_reap_graves(s, TURN_REAP_LINKS / 16);
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
      tdist__srv_close_later(s, big, why);
      return 1;
    }
    snprintf(why, sizeof why,
             "%s of %zu bytes would take all connections to %zu bytes, past the server budget of "
             "%zu (max_server_bytes); this connection holds %zu, the most of any",
             what, more, s->mem_total + more, s->server_budget, mine);
  } else {
    return 1;
  }
  tdist__srv_close_later(s, c, why);
  return 0;
}

/* Charges the connection's current size to the server total. */
void tdist__srv_charge(tdist_store_server_t *s, conn_t *c) {
  size_t now = conn_bytes(c);
  s->mem_total = s->mem_total - c->charged + now;
  c->charged = now;
}

uint8_t *tdist__srv_out_reserve(tdist_store_server_t *s, conn_t *c, size_t n) {
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
      if (!tdist__srv_budget_ok(s, c, cap - c->out_cap, "reply buffer growth")) return NULL;
      uint8_t *p = realloc(c->out, cap);
      if (!p) {
        c->out_failed = 1;
        tdist__srv_mark_flush(
            s, c); /* flush_conn closes it; unmarked, the client would wait forever */
        return NULL;
      }
      c->out = p;
      c->out_cap = cap;
      tdist__srv_charge(s, c);
    }
  }
  uint8_t *p = c->out + c->out_len;
  c->out_len += n;
  tdist__srv_mark_flush(s, c);
  return p;
}

void tdist__srv_put_u8(tdist_store_server_t *s, conn_t *c, uint8_t v) {
  uint8_t *p = tdist__srv_out_reserve(s, c, 1);
  if (p) *p = v;
}
void tdist__srv_put_i64(tdist_store_server_t *s, conn_t *c, int64_t v) {
  uint8_t *p = tdist__srv_out_reserve(s, c, 8);
  if (p) tdist__put_u64(p, (uint64_t)v);
}
void tdist__srv_put_bytes(tdist_store_server_t *s, conn_t *c, const void *d, size_t n) {
  uint8_t *p = tdist__srv_out_reserve(s, c, 8 + n);
  if (!p) return;
  tdist__put_u64(p, n);
  if (n) memcpy(p + 8, d, n);
}

/* ---------------------------------------------------------------------------------------- */
/* Connection lifecycle                                                                      */

void tdist__srv_close_later(tdist_store_server_t *s, conn_t *c, const char *why) {
  if (c->closing) return;
  c->closing = 1;
  snprintf(c->close_why, sizeof c->close_why, "%s", why ? why : "");
  c->close_next = s->close_list;
  s->close_list = c;
  if (c->mux) tdist__srv_mux_close_subs(s, c);
}

void tdist__srv_conn_free(tdist_store_server_t *s, conn_t *c) {
  while (c->waits) tdist__srv_wait_bury(s, c->waits);
  tdist__srv_mux_unlink(s, c);
  if (c->fd >= 0) {
    epoll_ctl(s->epfd, EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
  }
  if (c->prev)
    c->prev->next = c->next;
  else
    s->conns = c->next;
  if (c->next) c->next->prev = c->prev;
  free(c->in);
  free(c->out);
  c->in_cap = c->out_cap = 0;
  tdist__srv_charge(s, c);
  free(c);
  atomic_fetch_sub_explicit(&s->st_open, 1, memory_order_relaxed);
}

void tdist__srv_update_events(tdist_store_server_t *s, conn_t *c) {
  if (c->fd < 0) return; /* a proxy's client: flush_conn moves its replies */
  struct epoll_event ev = {.data.ptr = c};
  ev.events = (c->read_paused ? 0 : EPOLLIN) | (c->want_out ? EPOLLOUT : 0);
  epoll_ctl(s->epfd, EPOLL_CTL_MOD, c->fd, &ev);
}

/* Writes as much buffered output as the socket takes; manages EPOLLOUT and read backpressure. */
static void flush_conn(tdist_store_server_t *s, conn_t *c) {
  if (c->closing) return;
  if (c->out_failed) {
    tdist__srv_close_later(s, c, "out of memory for replies");
    return;
  }
  if (c->fd < 0) { /* a proxy's client: its replies join the proxy's output */
    tdist__srv_mux_flush(s, c);
    if (c->read_paused) {
      c->read_paused = c->want_out = 0;
      tdist__srv_process_input(s, c);
    }
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
    tdist__srv_close_later(s, c, NULL); /* peer went away; not an error worth a log line */
    return;
  }
  size_t pending = c->out_len - c->out_off;
  if (pending == 0) {
    c->out_off = c->out_len = 0;
    if (c->out_cap > OUT_KEEP_MAX) { /* a large reply's buffer: not kept while idle */
      free(c->out);
      c->out = NULL;
      c->out_cap = 0;
      tdist__srv_charge(s, c);
    }
  }
  int want_out = pending > 0;
  int pause = pending > s->out_high;
  if (want_out != c->want_out || pause != c->read_paused) {
    int resumed = c->read_paused && !pause;
    c->want_out = want_out;
    c->read_paused = pause;
    tdist__srv_update_events(s, c);
    if (resumed) tdist__srv_process_input(s, c); /* requests may be waiting in the input buffer */
  }
}

/* Sends what every marked connection has queued. The clients a proxy carries go first, each
 * moving its replies into its proxy's output; only then is anything sent, so the replies of all
 * of a proxy's clients of this turn leave in one send (sent as each client was moved, a node's 8
 * ranks cost the server 8 sends per step). */
void tdist__srv_flush_all(tdist_store_server_t *s) {
  while (s->flush_list) {
    conn_t *sockets = NULL; /* still marked in_flush, so a mark_flush does not queue them again */
    while (s->flush_list) {
      conn_t *c = s->flush_list;
      s->flush_list = c->flush_next;
      if (c->fd < 0) {
        c->in_flush = 0;
        flush_conn(s, c);
      } else {
        c->flush_next = sockets;
        sockets = c;
      }
    }
    while (sockets) {
      conn_t *c = sockets;
      sockets = c->flush_next;
      c->in_flush = 0;
      flush_conn(s, c); /* may resume a paused reader: new replies mark the list again */
    }
  }
}

void tdist__srv_close_all_pending(tdist_store_server_t *s) {
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
    tdist__srv_conn_free(s, c);
  }
}
