/* The store proxy (tdist/store.h, wire in mux.h): one thread, one epoll loop, any number of
 * instances, each a listening socket for clients and one connection to the store server.
 *
 * Client bytes are read straight into the upstream output behind a DATA header, so the bytes of
 * every client that spoke during a loop turn leave in one send at the end of the turn. Upstream
 * frames are written to their client at once; what a client does not take waits in its buffer
 * (a client that leaves PROXY_CLIENT_HIGH unread is closed, as the server closes one that leaves
 * its budget). Upstream output past PROXY_UP_HIGH stops reading the instance's clients until it
 * drains to half. */
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
#include "runtime/store/mux.h"
#include "runtime/store/server_listen.h"
#include "tdist/store.h"

#define PROXY_MAGIC 0x9e0c51a7u
#define READ_CHUNK (64 * 1024)
#define SCRATCH (256 * 1024) /* one upstream read */
#define PROXY_UP_HIGH ((size_t)64 << 20)
#define PROXY_CLIENT_HIGH ((size_t)64 << 20)
#define MAX_INSTANCES 65536

enum { K_STOP, K_LISTEN, K_UP, K_CLIENT };

typedef struct inst inst_t;

typedef struct {
  int kind; /* K_CLIENT: first, as in every epoll tag */
  int fd;
  uint32_t id;
  int want_out;
  inst_t *in;
  uint8_t *out;
  size_t out_off, out_len, out_cap;
  void *grave_next;
} client_t;

typedef struct {
  int kind;
  inst_t *in;
} tag_t;

typedef struct {
  uint8_t *p;
  size_t off, len, cap;
} buf_t;

struct inst {
  tdist_store_proxy_t *px;
  tag_t ltag, utag;
  int listen_fd, up_fd, port;
  int up_want_out, clients_paused, dirty;
  buf_t uin, uout;
  client_t **cl; /* by id */
  uint32_t cl_cap, next_id;
  uint32_t *free_ids;
  size_t nfree, nclients;
  inst_t *dirty_next;
  char where[80], upstream[80];
};

struct tdist_store_proxy_s {
  uint32_t magic;
  int epfd, stop_fd, quiet, ninst;
  int stop_kind;
  pthread_t thread;
  inst_t *inst;
  inst_t *dirty;
  client_t *graves; /* closed this turn */
  uint8_t *scratch; /* SCRATCH bytes: where reads land before they go anywhere */
  int64_t accept_paused_until, last_limit_log_ms;
  _Atomic uint64_t st_total, st_open, st_lost, st_up, st_down;
};

/* Room for n more bytes at the end of b (compacting or growing it); NULL when out of memory. */
static uint8_t *buf_room(buf_t *b, size_t n) {
  if (b->off && b->off == b->len) b->off = b->len = 0;
  if (b->len + n > b->cap && b->off) {
    memmove(b->p, b->p + b->off, b->len - b->off);
    b->len -= b->off;
    b->off = 0;
  }
  if (b->len + n > b->cap) {
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + n) cap *= 2;
    uint8_t *p = realloc(b->p, cap);
    if (!p) return NULL;
    b->p = p;
    b->cap = cap;
  }
  return b->p + b->len;
}

static void mark_dirty(tdist_store_proxy_t *px, inst_t *in) {
  if (in->dirty) return;
  in->dirty = 1;
  in->dirty_next = px->dirty;
  px->dirty = in;
}

/* Appends a frame header (and payload) to the upstream output. -1 when out of memory. */
static int up_frame(inst_t *in, uint8_t type, uint32_t id, const void *d, uint32_t n) {
  uint8_t *p = buf_room(&in->uout, TDIST__MUX_HDR + n);
  if (!p) return -1;
  tdist__mux_put_hdr(p, type, id, n);
  if (n) memcpy(p + TDIST__MUX_HDR, d, n);
  in->uout.len += TDIST__MUX_HDR + n;
  mark_dirty(in->px, in);
  return 0;
}

static void client_events(inst_t *in, client_t *c) {
  struct epoll_event ev = {.data.ptr = c};
  ev.events = (in->clients_paused ? 0 : EPOLLIN) | (c->want_out ? EPOLLOUT : 0);
  epoll_ctl(in->px->epfd, EPOLL_CTL_MOD, c->fd, &ev);
}

/* Closes a client; tell_upstream: the client went away (the server did not close it). */
static void client_close(inst_t *in, client_t *c, int tell_upstream) {
  /* An id whose CLOSE could not be queued stays open on the server: never hand it out again. */
  int reuse = !(tell_upstream && in->up_fd >= 0 && up_frame(in, TDIST__MUX_CLOSE, c->id, NULL, 0));
  epoll_ctl(in->px->epfd, EPOLL_CTL_DEL, c->fd, NULL);
  close(c->fd);
  in->cl[c->id] = NULL;
  if (reuse) in->free_ids[in->nfree++] = c->id;
  in->nclients--;
  atomic_fetch_sub_explicit(&in->px->st_open, 1, memory_order_relaxed);
  free(c->out);
  c->out = NULL;
  c->fd = -1; /* freed at the end of the loop turn: later events of the batch may name it */
  c->grave_next = in->px->graves;
  in->px->graves = c;
}

/* The upstream connection is gone: every client of the instance goes, and so does its listening
 * socket (a client connecting later is refused instead of waiting for a store that is gone). */
static void inst_lost(inst_t *in, const char *why) {
  tdist_store_proxy_t *px = in->px;
  if (in->up_fd < 0) return;
  if (!px->quiet)
    tdist__log(TDIST__LOG_ERROR, "store-proxy",
               "connection to the store server %s lost (%s); closing the %zu clients of %s",
               in->upstream, why, in->nclients, in->where);
  epoll_ctl(px->epfd, EPOLL_CTL_DEL, in->up_fd, NULL);
  close(in->up_fd);
  in->up_fd = -1;
  for (uint32_t i = 0; i < in->cl_cap; i++)
    if (in->cl[i]) client_close(in, in->cl[i], 0);
  if (in->listen_fd >= 0) {
    epoll_ctl(px->epfd, EPOLL_CTL_DEL, in->listen_fd, NULL);
    close(in->listen_fd);
    in->listen_fd = -1;
  }
  in->uout.off = in->uout.len = 0;
  atomic_fetch_add_explicit(&px->st_lost, 1, memory_order_relaxed);
}

static void set_clients_paused(inst_t *in, int paused) {
  if (in->clients_paused == paused) return;
  in->clients_paused = paused;
  for (uint32_t i = 0; i < in->cl_cap; i++)
    if (in->cl[i]) client_events(in, in->cl[i]);
}

/* Sends p[*off..len) until done or the socket would block; 0, or -1 with errno set (the peer
 * went away: EPIPE for a send that took nothing). */
static int send_some(int fd, const uint8_t *p, size_t len, size_t *off) {
  while (*off < len) {
    ssize_t n = send(fd, p + *off, len - *off, MSG_NOSIGNAL);
    if (n > 0) {
      *off += (size_t)n;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
    if (n == 0) errno = EPIPE;
    return -1;
  }
  return 0;
}

static void flush_up(inst_t *in) {
  buf_t *b = &in->uout;
  if (in->up_fd >= 0 && send_some(in->up_fd, b->p, b->len, &b->off)) {
    inst_lost(in, strerror(errno));
    return;
  }
  if (in->up_fd < 0) return;
  size_t pending = b->len - b->off;
  if (!pending) {
    b->off = b->len = 0;
    if (b->cap > (16u << 10)) { /* a burst's buffer is not kept while idle */
      free(b->p);
      b->p = NULL;
      b->cap = 0;
    }
  }
  int want = pending > 0;
  if (want != in->up_want_out) {
    in->up_want_out = want;
    struct epoll_event ev = {.events = EPOLLIN | (want ? EPOLLOUT : 0), .data.ptr = &in->utag};
    epoll_ctl(in->px->epfd, EPOLL_CTL_MOD, in->up_fd, &ev);
  }
  if (pending > PROXY_UP_HIGH) set_clients_paused(in, 1);
  if (pending < PROXY_UP_HIGH / 2) set_clients_paused(in, 0);
}

/* Writes what the client's buffer holds; 0, or -1 when the client was closed. */
static int flush_client(inst_t *in, client_t *c) {
  if (send_some(c->fd, c->out, c->out_len, &c->out_off)) {
    client_close(in, c, 1);
    return -1;
  }
  int want = c->out_off < c->out_len;
  if (!want) {
    c->out_off = c->out_len = 0;
    if (c->out_cap > READ_CHUNK) {
      free(c->out);
      c->out = NULL;
      c->out_cap = 0;
    }
  }
  if (want != c->want_out) {
    c->want_out = want;
    client_events(in, c);
  }
  return 0;
}

/* A DATA frame for a client: written at once where the socket takes it, the rest buffered. */
static void to_client(inst_t *in, client_t *c, const uint8_t *d, size_t n) {
  atomic_fetch_add_explicit(&in->px->st_down, n, memory_order_relaxed);
  if (c->out_off == c->out_len) {
    ssize_t w = send(c->fd, d, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
      client_close(in, c, 1);
      return;
    }
    if (w > 0) {
      d += w;
      n -= (size_t)w;
    }
    if (!n) return;
  }
  if (c->out_len - c->out_off + n > PROXY_CLIENT_HIGH) {
    if (!in->px->quiet)
      tdist__log(TDIST__LOG_WARN, "store-proxy",
                 "closing client %u of %s: it left %zu bytes of replies unread", c->id, in->where,
                 c->out_len - c->out_off + n);
    client_close(in, c, 1);
    return;
  }
  buf_t b = {c->out, c->out_off, c->out_len, c->out_cap};
  uint8_t *p = buf_room(&b, n);
  if (!p) {
    client_close(in, c, 1);
    return;
  }
  memcpy(p, d, n);
  c->out = b.p;
  c->out_off = b.off;
  c->out_len = b.len + n;
  c->out_cap = b.cap;
  flush_client(in, c);
}

/* Runs the whole frames of p[0..n); returns the bytes they took (a partial frame's are left),
 * or -1 when the instance was lost. */
static ssize_t dispatch(inst_t *in, const uint8_t *p, size_t n) {
  size_t off = 0;
  while (in->up_fd >= 0 && off < n) {
    tdist__mux_frame_t f;
    const char *why = "";
    int r = tdist__mux_parse(p + off, n - off, &f, &why);
    if (r == 0) break;
    if (r < 0 || f.type == TDIST__MUX_OPEN) {
      char msg[120];
      snprintf(msg, sizeof msg, "bad frame from the server: %s (type %u)", r < 0 ? why : "OPEN",
               f.type);
      inst_lost(in, msg);
      return -1;
    }
    off += TDIST__MUX_HDR + f.len;
    client_t *c = f.id < in->cl_cap ? in->cl[f.id] : NULL;
    if (!c) continue; /* closed here; its CLOSE crossed this frame */
    if (f.type == TDIST__MUX_DATA) {
      to_client(in, c, f.payload, f.len);
    } else {
      if (f.len && !in->px->quiet)
        tdist__log(TDIST__LOG_WARN, "store-proxy", "the server closed client %u of %s: %.*s", f.id,
                   in->where, (int)f.len, (const char *)f.payload);
      client_close(in, c, 0);
    }
  }
  return in->up_fd >= 0 ? (ssize_t)off : -1;
}

/* Frames from the server. They are read into the proxy's scratch buffer and run from there;
 * only a partial frame is kept by the instance (uin), which the next read completes, so an
 * idle instance holds no buffer (a process emulating 1,500 nodes kept 256 KiB each). */
static void on_upstream(inst_t *in) {
  buf_t *b = &in->uin;
  int partial = b->off < b->len;
  uint8_t *p = partial ? buf_room(b, READ_CHUNK) : in->px->scratch;
  if (!p) {
    inst_lost(in, "out of memory");
    return;
  }
  size_t room = partial ? b->cap - b->len : SCRATCH;
  ssize_t n = recv(in->up_fd, p, room, 0);
  if (n <= 0) {
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
    inst_lost(in, n == 0 ? "the server closed it" : strerror(errno));
    return;
  }
  if (partial) {
    b->len += (size_t)n;
    p = b->p + b->off;
    n = (ssize_t)(b->len - b->off);
  }
  ssize_t used = dispatch(in, p, (size_t)n);
  if (used < 0) return;
  if (partial) {
    b->off += (size_t)used;
  } else if (used < n) { /* keep the partial frame */
    uint8_t *q = buf_room(b, (size_t)(n - used));
    if (!q) {
      inst_lost(in, "out of memory");
      return;
    }
    memcpy(q, p + used, (size_t)(n - used));
    b->len += (size_t)(n - used);
  }
  if (b->off == b->len && b->cap) {
    free(b->p);
    *b = (buf_t){0};
  }
}

/* A client's bytes: one DATA frame on the upstream output. */
static void on_client(inst_t *in, client_t *c) {
  uint8_t *scratch = in->px->scratch;
  ssize_t n = recv(c->fd, scratch, READ_CHUNK, 0);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
  if (n <= 0 || up_frame(in, TDIST__MUX_DATA, c->id, scratch, (uint32_t)n)) {
    client_close(in, c, 1);
    return;
  }
  atomic_fetch_add_explicit(&in->px->st_up, (uint64_t)n, memory_order_relaxed);
}

/* Out of descriptors: stop accepting on every instance for 100 ms instead of spinning on a
 * listening socket that stays readable. */
static void pause_accepts(tdist_store_proxy_t *px, int err) {
  int64_t now = tdist__now_ms();
  if (!px->quiet && now - px->last_limit_log_ms > 1000) {
    px->last_limit_log_ms = now;
    tdist__log(TDIST__LOG_WARN, "store-proxy", "accept failed: %s; pausing accepts for 100 ms",
               strerror(err));
  }
  px->accept_paused_until = now + 100;
  for (int i = 0; i < px->ninst; i++)
    if (px->inst[i].listen_fd >= 0) epoll_ctl(px->epfd, EPOLL_CTL_DEL, px->inst[i].listen_fd, NULL);
}

static void resume_accepts(tdist_store_proxy_t *px) {
  px->accept_paused_until = 0;
  for (int i = 0; i < px->ninst; i++) {
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &px->inst[i].ltag};
    if (px->inst[i].listen_fd >= 0) epoll_ctl(px->epfd, EPOLL_CTL_ADD, px->inst[i].listen_fd, &ev);
  }
}

/* A free client id (the lowest freed, else the next never used), the tables grown to hold it;
 * -1 when none is left or memory is short (nothing taken). */
static int take_id(inst_t *in, uint32_t *id) {
  if (in->nfree) {
    *id = in->free_ids[--in->nfree];
    return 0;
  }
  if (in->next_id >= TDIST__MUX_MAX_ID) return -1;
  if (in->next_id >= in->cl_cap) {
    uint32_t cap = in->cl_cap ? in->cl_cap * 2 : 64;
    if (cap > TDIST__MUX_MAX_ID) cap = TDIST__MUX_MAX_ID;
    client_t **t = realloc(in->cl, cap * sizeof *t);
    if (!t) return -1;
    in->cl = t;
    memset(t + in->cl_cap, 0, (cap - in->cl_cap) * sizeof *t);
    uint32_t *f = realloc(in->free_ids, cap * sizeof *f);
    if (!f) return -1; /* cl grown and cleared; cl_cap not yet: harmless */
    in->free_ids = f;
    in->cl_cap = cap;
  }
  *id = in->next_id++;
  return 0;
}

static void on_accept(inst_t *in) {
  tdist_store_proxy_t *px = in->px;
  for (int i = 0; i < 64 && in->listen_fd >= 0; i++) {
    int fd = accept4(in->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM)
        pause_accepts(px, errno);
      return;
    }
    uint32_t id;
    if (take_id(in, &id)) {
      close(fd); /* out of memory, or a million clients on one node */
      continue;
    }
    client_t *c = calloc(1, sizeof *c);
    struct epoll_event ev = {.events = in->clients_paused ? 0 : EPOLLIN, .data.ptr = c};
    int opened = c && up_frame(in, TDIST__MUX_OPEN, id, NULL, 0) == 0;
    if (!opened || epoll_ctl(px->epfd, EPOLL_CTL_ADD, fd, &ev)) {
      /* The server forgets an id it was told of only by its CLOSE (which it reads after the
       * OPEN): the id is free again here once that is queued. */
      if (opened && up_frame(in, TDIST__MUX_CLOSE, id, NULL, 0)) {
        inst_lost(in, "out of memory for a frame"); /* the server would keep the id open */
        free(c);
        close(fd);
        return;
      }
      free(c);
      close(fd);
      in->free_ids[in->nfree++] = id;
      continue;
    }
    c->kind = K_CLIENT; /* TCP_NODELAY comes from the listening socket */
    c->fd = fd;
    c->id = id;
    c->in = in;
    in->cl[id] = c;
    in->nclients++;
    atomic_fetch_add_explicit(&px->st_total, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&px->st_open, 1, memory_order_relaxed);
  }
}

static void *proxy_main(void *arg) {
  tdist_store_proxy_t *px = arg;
  struct epoll_event evs[256];
  for (;;) {
    int timeout = -1;
    if (px->accept_paused_until) {
      int64_t left = px->accept_paused_until - tdist__now_ms();
      if (left <= 0) resume_accepts(px);
      timeout = left <= 0 ? -1 : (int)left;
    }
    int n = epoll_wait(px->epfd, evs, 256, timeout);
    if (n < 0) {
      if (errno == EINTR) continue;
      tdist__log(TDIST__LOG_ERROR, "store-proxy", "epoll_wait: %s; proxy thread exits",
                 strerror(errno));
      return NULL;
    }
    for (int i = 0; i < n; i++) {
      int kind = *(int *)evs[i].data.ptr;
      uint32_t e = evs[i].events;
      if (kind == K_STOP) return NULL;
      if (kind == K_LISTEN) {
        on_accept(((tag_t *)evs[i].data.ptr)->in);
      } else if (kind == K_UP) {
        inst_t *in = ((tag_t *)evs[i].data.ptr)->in;
        if (e & EPOLLOUT) mark_dirty(px, in);
        if (e & (EPOLLIN | EPOLLERR | EPOLLHUP)) on_upstream(in);
      } else {
        client_t *c = evs[i].data.ptr;
        if (c->fd < 0) continue; /* closed earlier in this batch */
        if ((e & EPOLLOUT) && flush_client(c->in, c)) continue;
        if (e & (EPOLLIN | EPOLLERR | EPOLLHUP)) on_client(c->in, c);
      }
    }
    while (px->dirty) {
      inst_t *in = px->dirty;
      px->dirty = in->dirty_next;
      in->dirty = 0;
      flush_up(in);
    }
    while (px->graves) {
      client_t *c = px->graves;
      px->graves = c->grave_next;
      free(c);
    }
  }
}

/* ---------------------------------------------------------------------------------------- */
/* Public API                                                                                */

/* Connects instance `in` to the upstream and exchanges the hello, retrying a refused connect
 * until the deadline (the store host may start after this node's agent). */
static tdist_status_t connect_upstream(inst_t *in, const char *host, int port, int64_t deadline) {
  int fd;
  for (;;) {
    int gai = 0;
    fd = tdist__sock_connect(host, port, deadline, &gai);
    if (fd >= 0) break;
    if (fd == -EHOSTUNREACH && gai)
      return tdist__fail(TDIST_ERR_INVALID_USAGE,
                         "store proxy: the store host '%s' does not resolve: %s", host,
                         gai_strerror(gai));
    if (tdist__remaining_ms(deadline) <= 0 || (fd != -ECONNREFUSED && fd != -ETIMEDOUT))
      return tdist__fail(TDIST_ERR_REMOTE, "store proxy: cannot connect to the store server %s: %s",
                         in->upstream, tdist__sock_strerror(fd));
    usleep(100 * 1000);
  }
  uint8_t hello[TDIST__MUX_HELLO_LEN];
  int rc = tdist__sock_send_all(fd, TDIST__MUX_HELLO, TDIST__MUX_HELLO_LEN, deadline);
  if (rc == 0) rc = tdist__sock_recv_reply(fd, hello, sizeof hello, deadline);
  if (rc == 0 && memcmp(hello, TDIST__MUX_HELLO, sizeof hello) != 0) rc = -EPROTO;
  if (rc != 0) {
    close(fd);
    return tdist__fail(TDIST_ERR_PROTOCOL,
                       "store proxy: the store server %s did not answer the proxy's hello (%s): "
                       "the proxy needs tdist's store server (tdist-store or the agent's), not "
                       "PyTorch's; connect the clients to the server directly instead",
                       in->upstream,
                       rc == -EPROTO ? "it answered other bytes" : tdist__sock_strerror(rc));
  }
  in->up_fd = fd;
  return TDIST_OK;
}

static tdist_status_t inst_open(tdist_store_proxy_t *px, inst_t *in,
                                const tdist_store_proxy_options_t *o, int64_t deadline) {
  in->px = px;
  in->listen_fd = in->up_fd = -1;
  in->ltag = (tag_t){K_LISTEN, in};
  in->utag = (tag_t){K_UP, in};
  snprintf(in->upstream, sizeof in->upstream, "%s:%d", o->upstream_host, o->upstream_port);
  tdist_status_t st = connect_upstream(in, o->upstream_host, o->upstream_port, deadline);
  if (st) return st;
  const char *host = o->host && o->host[0] ? o->host : "127.0.0.1";
  in->listen_fd =
      tdist__store_listen(host, o->port, tdist__store_somaxconn(), in->where, sizeof in->where);
  if (in->listen_fd < 0)
    return tdist__fail(TDIST_ERR_INVALID_USAGE, "store proxy: cannot listen on %s: %s", in->where,
                       strerror(-in->listen_fd));
  struct sockaddr_storage ss;
  socklen_t sl = sizeof ss;
  if (getsockname(in->listen_fd, (struct sockaddr *)&ss, &sl) != 0)
    return tdist__fail(TDIST_ERR_SYSTEM, "store proxy: getsockname: %s", strerror(errno));
  tdist__sockaddr_str((struct sockaddr *)&ss, sl, in->where, sizeof in->where);
  in->port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                            : ((struct sockaddr_in *)&ss)->sin_port);
  struct epoll_event lev = {.events = EPOLLIN, .data.ptr = &in->ltag};
  struct epoll_event uev = {.events = EPOLLIN, .data.ptr = &in->utag};
  if (epoll_ctl(px->epfd, EPOLL_CTL_ADD, in->listen_fd, &lev) ||
      epoll_ctl(px->epfd, EPOLL_CTL_ADD, in->up_fd, &uev))
    return tdist__fail(TDIST_ERR_SYSTEM, "store proxy: epoll_ctl: %s", strerror(errno));
  return TDIST_OK;
}

static void proxy_free(tdist_store_proxy_t *px) {
  for (int i = 0; px->inst && i < px->ninst; i++) {
    inst_t *in = &px->inst[i];
    for (uint32_t k = 0; k < in->cl_cap; k++) {
      client_t *c = in->cl[k];
      if (!c) continue;
      close(c->fd);
      free(c->out);
      free(c);
    }
    if (in->listen_fd >= 0) close(in->listen_fd);
    if (in->up_fd >= 0) close(in->up_fd);
    free(in->cl);
    free(in->free_ids);
    free(in->uin.p);
    free(in->uout.p);
  }
  while (px->graves) {
    client_t *c = px->graves;
    px->graves = c->grave_next;
    free(c);
  }
  if (px->epfd >= 0) close(px->epfd);
  if (px->stop_fd >= 0) close(px->stop_fd);
  free(px->inst);
  free(px->scratch);
  free(px);
}

TDIST_EXTERN tdist_status_t tdist_store_proxy_create(const tdist_store_proxy_options_t *opts,
                                                     tdist_store_proxy_t **out) {
  tdist_store_proxy_options_t o = TDIST_STORE_PROXY_OPTIONS_INIT;
  if (!out) return tdist__fail(TDIST_ERR_INVALID_ARGUMENT, "tdist_store_proxy_create: out is NULL");
  *out = NULL;
  static const size_t ends[] = {TDIST__OPTS_END(tdist_store_proxy_options_t, quiet)};
  if (!opts)
    return tdist__fail(TDIST_ERR_INVALID_ARGUMENT,
                       "tdist_store_proxy_create: opts is NULL (upstream_host and upstream_port "
                       "are required)");
  tdist_status_t st = tdist__opts_load("tdist_store_proxy_create", "TDIST_STORE_PROXY_OPTIONS_INIT",
                                       opts, &o, sizeof o, ends, 1);
  if (st) return st;
  if (!o.upstream_host || !o.upstream_host[0] || o.upstream_port < 1 || o.upstream_port > 65535)
    return tdist__fail(TDIST_ERR_INVALID_ARGUMENT,
                       "tdist_store_proxy_create: upstream '%s' port %d: a host and a port in "
                       "1..65535 are required",
                       o.upstream_host ? o.upstream_host : "(null)", o.upstream_port);
  if (o.port < 0 || o.port > 65535 || o.instances < 1 || o.instances > MAX_INSTANCES ||
      o.connect_timeout_ms <= 0 || (o.instances > 1 && o.port != 0))
    return tdist__fail(TDIST_ERR_INVALID_ARGUMENT,
                       "tdist_store_proxy_create: port %d (0..65535), instances %d (1..%d; more "
                       "than 1 needs port 0), connect_timeout_ms %d (> 0)",
                       o.port, o.instances, MAX_INSTANCES, o.connect_timeout_ms);
  tdist_store_proxy_t *px = calloc(1, sizeof *px);
  if (!px) return tdist__fail(TDIST_ERR_NO_MEMORY, "tdist_store_proxy_create: out of memory");
  px->quiet = o.quiet;
  px->stop_kind = K_STOP;
  px->epfd = epoll_create1(EPOLL_CLOEXEC);
  px->stop_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  px->inst = calloc((size_t)o.instances, sizeof *px->inst);
  px->scratch = malloc(SCRATCH);
  if (px->epfd < 0 || px->stop_fd < 0 || !px->inst || !px->scratch) {
    st = tdist__fail(TDIST_ERR_SYSTEM, "store proxy: epoll/eventfd/memory: %s", strerror(errno));
    proxy_free(px);
    return st;
  }
  struct epoll_event sev = {.events = EPOLLIN, .data.ptr = &px->stop_kind};
  epoll_ctl(px->epfd, EPOLL_CTL_ADD, px->stop_fd, &sev);
  int64_t deadline = tdist__now_ms() + o.connect_timeout_ms;
  for (int i = 0; i < o.instances; i++) {
    px->ninst = i + 1;
    if ((st = inst_open(px, &px->inst[i], &o, deadline))) {
      proxy_free(px);
      return st;
    }
  }
  int rc = pthread_create(&px->thread, NULL, proxy_main, px);
  if (rc != 0) {
    proxy_free(px);
    return tdist__fail(TDIST_ERR_SYSTEM, "store proxy: pthread_create: %s", strerror(rc));
  }
  px->magic = PROXY_MAGIC;
  if (!px->quiet)
    tdist__log(TDIST__LOG_INFO, "store-proxy", "%s%s carries its clients to the store server %s",
               px->inst[0].where, o.instances > 1 ? " (and more instances)" : "",
               px->inst[0].upstream);
  *out = px;
  return TDIST_OK;
}

TDIST_EXTERN int tdist_store_proxy_port(const tdist_store_proxy_t *px, int i) {
  if (!px || px->magic != PROXY_MAGIC || i < 0 || i >= px->ninst) return -1;
  return px->inst[i].port;
}

TDIST_EXTERN void tdist_store_proxy_stats(tdist_store_proxy_t *px, tdist_store_proxy_stats_t *out) {
  if (!out) return;
  memset(out, 0, sizeof *out);
  if (!px || px->magic != PROXY_MAGIC) return;
  out->clients_total = atomic_load(&px->st_total);
  out->clients_open = atomic_load(&px->st_open);
  out->upstreams_lost = atomic_load(&px->st_lost);
  out->bytes_up = atomic_load(&px->st_up);
  out->bytes_down = atomic_load(&px->st_down);
}

TDIST_EXTERN void tdist_store_proxy_destroy(tdist_store_proxy_t *px) {
  if (!px || px->magic != PROXY_MAGIC) return;
  uint64_t one = 1;
  ssize_t w = write(px->stop_fd, &one, sizeof one);
  (void)w;
  pthread_join(px->thread, NULL);
  px->magic = 0;
  proxy_free(px);
}
