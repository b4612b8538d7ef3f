/* The TCPStore server: one thread running an epoll loop over non-blocking sockets (Redis-style).
 *
 * The loop thread owns every connection and the key/value map; no locks. Other threads talk to it
 * only through the stop eventfd and read the stats atomics. Each connection buffers input until
 * the codec (proto.c) sees a whole request, so requests split at any byte and several requests in
 * one segment both work. Replies are appended to the connection's output buffer and flushed once
 * per loop iteration; WAIT replies may go to other connections, which are flushed the same way.
 * A protocol error or limit closes only the offending connection, with a log line naming the peer.
 * A connection is never freed while the loop may still touch it: closes are deferred to the end of
 * the iteration (Redis freeClientAsync).
 *
 * This file: the loop, parsing and executing requests, accepting, and the public API; connections,
 * budgets and replies are in server_conn.c, WAITs in server_wait.c (server_internal.h). */
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
#include "runtime/store/mux.h"
#include "runtime/store/proto.h"
#include "runtime/store/server_listen.h"
#include "runtime/store/server_internal.h"
#include "tdist/store.h"

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
      uint8_t *p = tdist__srv_out_reserve(s, c, 4);
      if (p) tdist__put_u32(p, r->u32);
      return NULL;
    }
    case TDIST__OP_SET:
      if (tdist__kv_set(s->kv, r->key.ptr, r->key.len, r->a.ptr, r->a.len, &e)) goto nomem;
      tdist__srv_wake_all(s, e);
      return NULL;
    case TDIST__OP_APPEND:
      if (tdist__kv_append(s->kv, r->key.ptr, r->key.len, r->a.ptr, r->a.len, &e)) goto nomem;
      tdist__srv_wake_all(s, e);
      return NULL;
    case TDIST__OP_MULTI_SET: {
      uint64_t pos = 0;
      tdist__slice_t k, v;
      while (tdist__proto_next_item(r, &pos, &k, &v)) {
        if (tdist__kv_set(s->kv, k.ptr, k.len, v.ptr, v.len, &e)) goto nomem;
        tdist__srv_wake_all(s, e);
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
      tdist__srv_put_bytes(s, c, cur, cur_len);
      if (stored) tdist__srv_wake_all(s, e);
      return NULL;
    }
    case TDIST__OP_GET: {
      e = tdist__kv_find(s->kv, r->key.ptr, r->key.len);
      if (!e || !e->has_value) {
        /* 1.13 and 2.x legacy servers throw and drop the connection; the 2.x libuv server
         * (the 2.x default) replies an empty value. Serve each dialect like its own server. */
        if (c->dialect == TDIST__DIALECT_V1_13) return "GET of a key that does not exist";
        tdist__srv_put_bytes(s, c, NULL, 0);
        return NULL;
      }
      tdist__srv_put_bytes(s, c, e->val, e->vlen);
      return NULL;
    }
    case TDIST__OP_ADD: {
      int64_t v;
      rc = tdist__kv_add(s->kv, r->key.ptr, r->key.len, r->delta, &v, &e);
      if (rc == -EINVAL) return "ADD on a value that is not an integer";
      if (rc) goto nomem;
      tdist__srv_put_i64(s, c, v);
      tdist__srv_wake_all(s, e);
      return NULL;
    }
    case TDIST__OP_CHECK: {
      uint64_t pos = 0;
      tdist__slice_t k;
      int ready = 1;
      while (ready && tdist__proto_next_item(r, &pos, &k, NULL))
        ready = tdist__kv_exists(tdist__kv_find(s->kv, k.ptr, k.len));
      tdist__srv_put_u8(s, c, ready ? TDIST__CHECK_READY : TDIST__CHECK_NOT_READY);
      return NULL;
    }
    case TDIST__OP_WAIT:
      rc = tdist__srv_do_wait(s, c, r);
      if (rc < 0) goto nomem;
      if (rc > 0) return MORE;
      return NULL;
    case TDIST__OP_CANCEL_WAIT:
      while (c->waits) tdist__srv_wait_bury(s, c->waits);
      tdist__srv_put_u8(s, c, TDIST__WAIT_CANCELED);
      return NULL;
    case TDIST__OP_GETNUMKEYS:
      tdist__srv_put_i64(s, c, (int64_t)tdist__kv_num_keys(s->kv));
      return NULL;
    case TDIST__OP_DELETE_KEY:
      tdist__srv_put_i64(s, c, tdist__kv_delete(s->kv, r->key.ptr, r->key.len));
      return NULL;
    case TDIST__OP_WATCH_KEY:
      /* 1.13 only, on the callback connection; its Python API never calls it. Registering is
       * enough: no notifications are pushed (reference §1.11). */
      tdist__srv_put_u8(s, c, TDIST__WATCH_CALLBACK_REGISTERED);
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
        if (!tdist__srv_budget_ok(s, c, more, "a MULTI_GET reply")) return NULL;
      }
      pos = 0;
      while (tdist__proto_next_item(r, &pos, &k, NULL)) {
        e = tdist__kv_find(s->kv, k.ptr, k.len);
        if (e && e->has_value)
          tdist__srv_put_bytes(s, c, e->val, e->vlen);
        else
          tdist__srv_put_bytes(s, c, NULL, 0);
      }
      return NULL;
    }
    case TDIST__OP_QUEUE_PUSH:
      if (tdist__kv_queue_push(s->kv, r->key.ptr, r->key.len, r->a.ptr, r->a.len, &e)) goto nomem;
      tdist__srv_wake_one(s, e);
      return NULL;
    case TDIST__OP_QUEUE_POP: {
      size_t len = tdist__kv_queue_len(s->kv, r->key.ptr, r->key.len);
      tdist__srv_put_i64(s, c, (int64_t)len);
      if (len > 0) {
        tdist__kv_qitem_t *q = tdist__kv_queue_pop(s->kv, r->key.ptr, r->key.len);
        tdist__srv_put_bytes(s, c, q->data, q->len);
        free(q);
      }
      return NULL;
    }
    case TDIST__OP_QUEUE_LEN:
      tdist__srv_put_i64(s, c, (int64_t)tdist__kv_queue_len(s->kv, r->key.ptr, r->key.len));
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

/* Gives the input buffer back once it holds nothing (an idle connection, the usual state of a
 * rank waiting in a barrier, holds no buffer: 4,096 agents or 16,000 ranks kept IN_CHUNK each,
 * a quarter or all of the default server budget), and one that grew for a large request back
 * once it holds little. */
static void shrink_input(tdist_store_server_t *s, conn_t *c) {
  if (c->in_len == 0 && c->in_cap) {
    free(c->in);
    c->in = NULL;
    c->in_cap = 0;
    tdist__srv_charge(s, c);
    return;
  }
  if (c->in_cap <= IN_KEEP_MAX) return;
  if (c->in_len <= IN_CHUNK / 2 && c->in_need <= IN_CHUNK) {
    uint8_t *p = malloc(IN_CHUNK); /* not realloc: glibc may keep a shrunk block's pages */
    if (!p) return;                /* keep the big one */
    memcpy(p, c->in, c->in_len);
    free(c->in);
    c->in = p;
    c->in_cap = IN_CHUNK;
  } else {
    return;
  }
  tdist__srv_charge(s, c);
}

/* Parses and executes the whole requests buffered on the connection, at most TURN_REQUESTS of
 * them: if more are left, the connection goes on the ready list for the next loop turn. */
void tdist__srv_process_input(tdist_store_server_t *s, conn_t *c) {
  size_t off = 0;
  int done = 0;
  if (c->in_need > c->in_len) return; /* the parser said it needs more than we have */
  if (!c->mux && c->dialect == TDIST__DIALECT_UNKNOWN && !c->parent && c->in_len &&
      c->in[0] == (uint8_t)TDIST__MUX_HELLO[0]) {
    int h = tdist__srv_mux_hello(s, c); /* a store proxy's connection */
    if (h == 0) return;
  }
  if (c->mux) {
    tdist__srv_mux_input(s, c);
    shrink_input(s, c);
    return;
  }
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
      tdist__srv_close_later(s, c, msg);
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
      tdist__srv_close_later(s, c, msg);
      break;
    }
    off += used;
    c->in_need = 0;
    memset(&c->in_prog, 0, sizeof c->in_prog);
    if (c->out_len - c->out_off > s->out_high) {
      /* Stop parsing until the client reads its replies; flush_conn resumes us. */
      c->read_paused = 1;
      c->want_out = 1;
      tdist__srv_update_events(s, c);
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
    ssize_t n = recv(c->fd, c->in + c->in_len, want, 0);
    if (n == 0) {
      tdist__srv_close_later(s, c, NULL); /* clean close by the client */
      return;
    }
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) tdist__srv_close_later(s, c, NULL);
      break;
    }
    c->in_len += (size_t)n;
    break;
  }
  tdist__srv_process_input(s, c);
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
    c->fd = fd; /* TCP_NODELAY comes from the listening socket */
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
        if (evs[i].events & EPOLLOUT) tdist__srv_mark_flush(s, c);
        if (evs[i].events & (EPOLLIN | EPOLLERR | EPOLLHUP)) {
          if (!c->read_paused)
            on_readable(s, c);
          else if (evs[i].events & (EPOLLERR | EPOLLHUP))
            tdist__srv_close_later(s, c, NULL);
        }
      }
      tdist__srv_flush_all(s);
    }
    /* Connections the turn quota left with whole requests buffered get their next share. */
    conn_t *ready = s->ready_list;
    s->ready_list = NULL;
    while (ready) {
      conn_t *c = ready;
      ready = c->ready_next;
      c->in_ready = 0;
      if (!c->closing) tdist__srv_process_input(s, c);
    }
    tdist__srv_flush_all(s);
    /* Only now: later events of this batch may still name a connection closed earlier in it. */
    tdist__srv_close_all_pending(s);
    /* A proxy's client closed by us left a CLOSE frame on the proxy's connection. */
    if (s->flush_list) {
      tdist__srv_flush_all(s);
      tdist__srv_close_all_pending(s);
    }
    tdist__srv_reap_graves(s, TURN_REAP_LINKS);
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
  while (s->conns) tdist__srv_conn_free(s, s->conns);
  tdist__srv_reap_graves(s, SIZE_MAX);
  close(s->listen_fd);
  close(s->epfd);
  close(s->stop_fd);
  tdist__kv_destroy(s->kv);
  if (!s->quiet) tdist__log(TDIST__LOG_INFO, "store", "server on %s stopped", s->bind_str);
  free(s);
}
