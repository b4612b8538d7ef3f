/* The store server's multiplexed connections (mux.h): a store proxy's one connection carries its
 * clients' connections. Each client is a conn_t of its own (fd -1, `parent` the proxy's), so the
 * request path, WAITs, budgets and closes are the plain server's: DATA frames feed a client's
 * input buffer, and its replies leave as DATA frames on the proxy's output at flush time. Runs on
 * the loop thread only. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/common/clock.h"
#include "runtime/common/log.h"
#include "runtime/store/mux.h"
#include "runtime/store/server_internal.h"

/* Clients one proxy connection may hold open at once (a node of 65,536 ranks); with
 * max_connections it bounds what one peer that says the hello can make the server allocate. */
#define MUX_MAX_OPEN 65536

int tdist__srv_mux_hello(tdist_store_server_t *s, conn_t *c) {
  size_t n = c->in_len < TDIST__MUX_HELLO_LEN ? c->in_len : TDIST__MUX_HELLO_LEN;
  if (memcmp(c->in, TDIST__MUX_HELLO, n) != 0) return -1;
  if (n < TDIST__MUX_HELLO_LEN) {
    c->in_need = TDIST__MUX_HELLO_LEN;
    return 0;
  }
  memmove(c->in, c->in + n, c->in_len - n);
  c->in_len -= n;
  c->in_need = 0;
  c->mux = 1;
  uint8_t *p = tdist__srv_out_reserve(s, c, TDIST__MUX_HELLO_LEN);
  if (p) memcpy(p, TDIST__MUX_HELLO, TDIST__MUX_HELLO_LEN);
  return 1;
}

/* Sends a CLOSE frame for `id` to the proxy, saying why (may be empty). */
static void send_close(tdist_store_server_t *s, conn_t *p, uint32_t id, const char *why) {
  size_t n = strlen(why);
  uint8_t *d = tdist__srv_out_reserve(s, p, TDIST__MUX_HDR + n);
  if (!d) return;
  tdist__mux_put_hdr(d, TDIST__MUX_CLOSE, id, (uint32_t)n);
  memcpy(d + TDIST__MUX_HDR, why, n);
}

/* A proxy's client connected: a new virtual connection. 0, or -1 with the proxy's connection
 * queued for close (an id already open, or no memory for the table). */
static int open_sub(tdist_store_server_t *s, conn_t *p, uint32_t id) {
  if (id >= p->subs_cap) {
    uint32_t cap = p->subs_cap ? p->subs_cap : 64;
    while (cap <= id) cap *= 2;
    if (cap > TDIST__MUX_MAX_ID) cap = TDIST__MUX_MAX_ID;
    /* The table counts in the connection's bytes (its budget and the server's). */
    if (!tdist__srv_budget_ok(s, p, (cap - p->subs_cap) * sizeof *p->subs, "client table growth"))
      return -1;
    conn_t **t = realloc(p->subs, cap * sizeof *t);
    if (!t) {
      tdist__srv_close_later(s, p, "out of memory for a proxy's client table");
      return -1;
    }
    memset(t + p->subs_cap, 0, (cap - p->subs_cap) * sizeof *t);
    p->subs = t;
    p->subs_cap = cap;
    tdist__srv_charge(s, p);
  }
  if (p->subs[id]) {
    char why[120];
    snprintf(why, sizeof why, "proxy opened client id %u, which is open already", id);
    tdist__srv_close_later(s, p, why);
    return -1;
  }
  uint64_t open = atomic_load_explicit(&s->st_open, memory_order_relaxed);
  int room = open < s->max_connections && p->nsubs < MUX_MAX_OPEN;
  conn_t *c = room ? calloc(1, sizeof *c) : NULL;
  if (!c) {
    atomic_fetch_add_explicit(&s->st_dropped, 1, memory_order_relaxed);
    send_close(s, p, id,
               room                         ? "out of memory for the connection"
               : open >= s->max_connections ? "too many connections open (max_connections)"
                                            : "too many clients on one proxy connection (65536)");
    return 0;
  }
  p->nsubs++;
  c->fd = -1;
  c->parent = p;
  c->mux_id = id;
  snprintf(c->peer, sizeof c->peer, "%.40s proxy client %u", p->peer, id);
  p->subs[id] = c;
  c->next = s->conns;
  if (s->conns) s->conns->prev = c;
  s->conns = c;
  atomic_fetch_add_explicit(&s->st_accepted, 1, memory_order_relaxed);
  atomic_fetch_add_explicit(&s->st_open, 1, memory_order_relaxed);
  return 0;
}

/* A DATA frame's bytes join the client's input, within its budget; then its requests run (unless
 * the turn quota already left some for the ready list, which runs them in order). */
static void sub_data(tdist_store_server_t *s, conn_t *c, const uint8_t *d, uint32_t n) {
  if (n == 0) return;
  if (c->in_cap - c->in_len < n) {
    size_t need = c->in_len + n;
    size_t cap = c->in_cap ? c->in_cap : 512;
    while (cap < need) cap *= 2;
    if (!tdist__srv_budget_ok(s, c, cap - c->in_cap, "request buffer growth")) return;
    uint8_t *p = realloc(c->in, cap);
    if (!p) {
      tdist__srv_close_later(s, c, "out of memory for the request buffer");
      return;
    }
    c->in = p;
    c->in_cap = cap;
    tdist__srv_charge(s, c);
  }
  memcpy(c->in + c->in_len, d, n);
  c->in_len += n;
  if (!c->in_ready) tdist__srv_process_input(s, c);
}

void tdist__srv_mux_input(tdist_store_server_t *s, conn_t *c) {
  size_t off = 0;
  while (!c->closing && !c->read_paused && off < c->in_len) {
    tdist__mux_frame_t f;
    const char *why = "";
    int r = tdist__mux_parse(c->in + off, c->in_len - off, &f, &why);
    if (r == 0) {
      c->in_need = off + TDIST__MUX_HDR + (c->in_len - off >= TDIST__MUX_HDR ? f.len : 0);
      break;
    }
    if (r < 0) {
      char msg[160];
      snprintf(msg, sizeof msg, "bad frame from a store proxy: %s (type %u, id %u, length %u)", why,
               f.type, f.id, f.len);
      tdist__srv_close_later(s, c, msg);
      break;
    }
    off += TDIST__MUX_HDR + f.len;
    c->in_need = 0;
    conn_t *sub = f.id < c->subs_cap ? c->subs[f.id] : NULL;
    if (f.type == TDIST__MUX_OPEN) {
      if (open_sub(s, c, f.id) < 0) break;
    } else if (f.type == TDIST__MUX_DATA) {
      /* No client: the server closed it and its CLOSE crossed this frame. */
      if (sub && !sub->closing) sub_data(s, sub, f.payload, f.len);
    } else if (sub) { /* CLOSE: the client went away; nothing goes back */
      c->subs[f.id] = NULL;
      c->nsubs--;
      sub->parent = NULL;
      tdist__srv_close_later(s, sub, NULL);
    }
  }
  if (off) {
    memmove(c->in, c->in + off, c->in_len - off);
    c->in_len -= off;
    if (c->in_need) c->in_need -= off;
  }
}

void tdist__srv_mux_flush(tdist_store_server_t *s, conn_t *sub) {
  conn_t *p = sub->parent;
  size_t off = sub->out_off;
  while (p && !p->closing && off < sub->out_len) {
    size_t n = sub->out_len - off;
    if (n > TDIST__MUX_MAX_PAYLOAD) n = TDIST__MUX_MAX_PAYLOAD;
    uint8_t *d = tdist__srv_out_reserve(s, p, TDIST__MUX_HDR + n);
    if (!d) break; /* the proxy's connection closes (its budget); so do its clients */
    tdist__mux_put_hdr(d, TDIST__MUX_DATA, sub->mux_id, (uint32_t)n);
    memcpy(d + TDIST__MUX_HDR, sub->out + off, n);
    off += n;
  }
  sub->out_off = sub->out_len = 0;
  if (sub->out_cap > OUT_KEEP_MAX) {
    free(sub->out);
    sub->out = NULL;
    sub->out_cap = 0;
    tdist__srv_charge(s, sub);
  }
}

void tdist__srv_mux_close_subs(tdist_store_server_t *s, conn_t *c) {
  for (uint32_t i = 0; i < c->subs_cap; i++)
    if (c->subs[i]) tdist__srv_close_later(s, c->subs[i], NULL);
}

void tdist__srv_mux_unlink(tdist_store_server_t *s, conn_t *c) {
  if (c->mux) {
    for (uint32_t i = 0; i < c->subs_cap; i++)
      if (c->subs[i]) c->subs[i]->parent = NULL;
    free(c->subs);
    c->subs = NULL;
    c->subs_cap = 0;
    tdist__srv_charge(s, c);
  }
  conn_t *p = c->parent;
  if (!p) return;
  p->subs[c->mux_id] = NULL;
  p->nsubs--;
  c->parent = NULL;
  if (!p->closing) send_close(s, p, c->mux_id, c->close_why);
}
