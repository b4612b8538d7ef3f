/* The TCPStore client: one blocking-style connection driven with poll() deadlines.
 *
 * Like PyTorch's client it puts "/" in front of every key, sends each request in one write and
 * reads the replies in order. It speaks the 2.x dialect (VALIDATE + PING handshake, CANCEL_WAIT on
 * a wait timeout) and falls back to 1.13 when the server resets the connection on VALIDATE, which
 * is what a 1.13 server does. It must never leave the connection out of step with the server: any
 * failure in the middle of a request/reply, and a 1.13 wait timeout (1.13 has no cancel, so the
 * server would later send a stray reply), drop the connection; the next call reconnects.
 *
 * Queues (QUEUE_PUSH/POP/LEN) came after PyTorch 2.6, and nothing in the 2.x handshake says
 * whether a server has them: PyTorch 2.6's server closes the connection on their opcodes, and a
 * push has no reply, so it would "succeed" and break the next call. The first queue call on a
 * connection therefore probes with a QUEUE_LEN of its key; if the server hangs up on it and still
 * takes connections, every queue call is refused with NOT_AVAILABLE. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "runtime/common/clock.h"
#include "runtime/common/log.h"
#include "runtime/common/options.h"
#include "runtime/common/sock.h"
#include "runtime/store/proto.h"
#include "runtime/store/store_internal.h"

#define MAX_REPLY_BYTES ((uint64_t)1 << 40) /* a longer length field is garbage, not data */
#define CANCEL_GRACE_MS 5000                /* a live server answers CANCEL_WAIT at once */
#define REPLY_GRACE_MS 1000                 /* for the GET right after a successful WAIT */

typedef struct {
  tdist_store_t base;
  char *host;
  int port;
  int64_t connect_timeout_ms;
  tdist_store_dialect_t want; /* what the caller asked for */
  tdist__dialect_t dialect;   /* what the current/last connection speaks */
  int queues;                 /* the server has QUEUE_*: 1 yes, -1 no, 0 not known yet */
  int fd;                     /* -1 while disconnected */
  uint8_t *buf;               /* request being built */
  size_t len, cap;
  int oom;
  unsigned rng;
  char where[300];
  pthread_mutex_t mu; /* one request at a time (locked_* below) */
} tcp_store_t;

static tcp_store_t *T(tdist_store_t *s) { return (tcp_store_t *)s; }

static void drop(tcp_store_t *t) {
  if (t->fd >= 0) close(t->fd);
  t->fd = -1;
}

static tdist_status_t io_fail(tcp_store_t *t, const char *op, int err) {
  drop(t);
  tdist_status_t st = err == -ETIMEDOUT ? TDIST_ERR_TIMEOUT
                      : (err == -TDIST__ECLOSED || err == -ECONNRESET || err == -EPIPE)
                          ? TDIST_ERR_REMOTE
                          : TDIST_ERR_SYSTEM;
  return tdist__store_fail(&t->base, st, "store %s on %s: %s%s", op, t->where,
                           tdist__sock_strerror(err),
                           err == -ETIMEDOUT ? " (no reply before the deadline)" : "");
}

/* ---------------------------------------------------------------------------------------- */
/* Request building                                                                          */

static void req_put(tcp_store_t *t, const void *p, size_t n) {
  if (t->oom) return;
  if (t->len + n > t->cap) {
    size_t cap = t->cap ? t->cap : 256;
    while (cap < t->len + n) cap *= 2;
    uint8_t *b = realloc(t->buf, cap);
    if (!b) {
      t->oom = 1;
      return;
    }
    t->buf = b;
    t->cap = cap;
  }
  if (n) memcpy(t->buf + t->len, p, n);
  t->len += n;
}

static void req_u64(tcp_store_t *t, uint64_t v) {
  uint8_t b[8];
  tdist__put_u64(b, v);
  req_put(t, b, 8);
}

static void req_bytes(tcp_store_t *t, const void *p, size_t n) {
  req_u64(t, n);
  req_put(t, p, n);
}

/* A user key on the wire: "/" + key, like PyTorch's TCPStore. */
static void req_key(tcp_store_t *t, const char *key) {
  size_t n = strlen(key);
  req_u64(t, n + 1);
  req_put(t, "/", 1);
  req_put(t, key, n);
}

static void req_op(tcp_store_t *t, tdist__op_t op) {
  uint8_t b = (uint8_t)tdist__proto_opcode(t->dialect, op);
  req_put(t, &b, 1);
}

static tdist_status_t req_send(tcp_store_t *t, const char *op, int64_t deadline) {
  if (t->oom) {
    t->oom = 0;
    t->len = 0;
    return tdist__store_fail(&t->base, TDIST_ERR_NO_MEMORY, "store %s: out of memory", op);
  }
  int r = tdist__sock_send_all(t->fd, t->buf, t->len, deadline);
  t->len = 0;
  if (t->cap > (1u << 20)) { /* don't keep a huge value's buffer around */
    free(t->buf);
    t->buf = NULL;
    t->cap = 0;
  }
  return r ? io_fail(t, op, r) : TDIST_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* Replies                                                                                   */

static tdist_status_t recv_n(tcp_store_t *t, const char *op, void *p, size_t n, int64_t deadline) {
  int r = tdist__sock_recv_all(t->fd, p, n, deadline);
  return r ? io_fail(t, op, r) : TDIST_OK;
}

/* The first bytes of a reply: poll, then read (see tdist__sock_recv_reply). */
static tdist_status_t recv_first(tcp_store_t *t, const char *op, void *p, size_t n,
                                 int64_t deadline) {
  int r = tdist__sock_recv_reply(t->fd, p, n, deadline);
  return r ? io_fail(t, op, r) : TDIST_OK;
}

static tdist_status_t recv_i64(tcp_store_t *t, const char *op, int64_t *v, int64_t deadline) {
  uint8_t b[8];
  tdist_status_t st = recv_first(t, op, b, 8, deadline);
  if (st == TDIST_OK) *v = (int64_t)tdist__get_u64(b);
  return st;
}

static tdist_status_t recv_bytes(tcp_store_t *t, const char *op, void **out, size_t *n,
                                 int64_t deadline) {
  uint8_t b[8];
  tdist_status_t st = recv_first(t, op, b, 8, deadline);
  if (st) return st;
  uint64_t len = tdist__get_u64(b);
  if (len > MAX_REPLY_BYTES) {
    drop(t);
    return tdist__store_fail(&t->base, TDIST_ERR_PROTOCOL,
                             "store %s on %s: reply announces %llu bytes; not a TCPStore server?",
                             op, t->where, (unsigned long long)len);
  }
  void *p = malloc(len ? (size_t)len : 1);
  if (!p) {
    drop(t);
    return tdist__store_fail(&t->base, TDIST_ERR_NO_MEMORY, "store %s: cannot allocate %llu bytes",
                             op, (unsigned long long)len);
  }
  st = recv_n(t, op, p, (size_t)len, deadline);
  if (st) {
    free(p);
    return st;
  }
  *out = p;
  *n = (size_t)len;
  return TDIST_OK;
}

static tdist_status_t recv_u8(tcp_store_t *t, const char *op, uint8_t *v, int64_t deadline) {
  return recv_first(t, op, v, 1, deadline);
}

/* ---------------------------------------------------------------------------------------- */
/* Connecting                                                                                */

/* 2.x handshake: VALIDATE then PING, expecting the nonce echoed. Returns 0, or -errno (a 1.13
 * server closes the connection: -TDIST__ECLOSED or -ECONNRESET), or -EPROTO for a wrong echo. */
static int handshake_v2(int fd, int64_t deadline) {
  uint8_t b[10];
  /* A 1.13 server reads these 10 bytes as a SET whose u64 key length is bytes 1..8: ce f7 85 3c
   * 0d and the nonce's low three bytes. Byte 2 of the nonce = 0xff makes that length > 2^56, an
   * allocation that fails on any machine, so the 1.13 server drops us at once instead of trying
   * to read ~56 GB (which a pid-valued nonce could ask for on a big host). */
  uint32_t nonce = 0x00ff0000u | ((uint32_t)getpid() & 0xff00ffffu);
  b[0] = 0x00;
  tdist__put_u32(b + 1, TDIST__VALIDATE_MAGIC);
  b[5] = 0x0d;
  tdist__put_u32(b + 6, nonce);
  int r = tdist__sock_send_all(fd, b, sizeof b, deadline);
  if (r) return r;
  uint8_t echo[4];
  r = tdist__sock_recv_all(fd, echo, 4, deadline);
  if (r) return r;
  return tdist__get_u32(echo) == nonce ? 0 : -EPROTO;
}

/* 1.13 probe: GETNUMKEYS must answer 8 bytes. */
static int probe_v113(int fd, int64_t deadline) {
  uint8_t op = 0x06, reply[8];
  int r = tdist__sock_send_all(fd, &op, 1, deadline);
  return r ? r : tdist__sock_recv_all(fd, reply, 8, deadline);
}

static void sleep_ms(int64_t ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

/* Connects (retrying with exponential backoff and jitter) and agrees on the dialect. */
static tdist_status_t do_connect(tcp_store_t *t, int64_t deadline, const char *why) {
  int64_t delay = 50;
  int attempts = 0, last = 0, gai = 0, try_v113 = t->want == TDIST_STORE_DIALECT_V1_13;
  int accepted = 0; /* the last attempt connected, then the handshake failed */
  int64_t start = tdist__now_ms();
  for (;;) {
    attempts++;
    int fd = tdist__sock_connect(t->host, t->port, deadline, &gai);
    if (fd >= 0) {
      int r = try_v113 ? (t->want == TDIST_STORE_DIALECT_AUTO ? probe_v113(fd, deadline) : 0)
                       : handshake_v2(fd, deadline);
      if (r == 0) {
        t->fd = fd;
        t->dialect = try_v113 ? TDIST__DIALECT_V1_13 : TDIST__DIALECT_V2;
        t->queues = 0; /* perhaps another server now: probe again (need_queues) */
        return TDIST_OK;
      }
      close(fd);
      last = r;
      gai = 0;
      accepted = 1;
      if (!try_v113 && t->want == TDIST_STORE_DIALECT_AUTO &&
          (r == -TDIST__ECLOSED || r == -ECONNRESET)) {
        /* The server hung up on VALIDATE: a PyTorch 1.13 server. Try its dialect at once. */
        try_v113 = 1;
        continue;
      }
      if (try_v113 && t->want == TDIST_STORE_DIALECT_AUTO) try_v113 = 0;
    } else {
      last = fd;
      accepted = 0;
    }
    int64_t now = tdist__now_ms();
    if (now >= deadline) break;
    /* ±50% jitter so many clients restarting together do not retry in lock step. */
    t->rng = t->rng * 1103515245u + 12345u;
    int64_t sleep = delay / 2 + (int64_t)((t->rng >> 8) % (unsigned)(delay + 1));
    if (now + sleep > deadline) sleep = deadline - now;
    sleep_ms(sleep);
    delay = delay * 3 / 2 > 1000 ? 1000 : delay * 3 / 2;
  }
  char detail[160];
  if (gai)
    snprintf(detail, sizeof detail, "cannot resolve '%s': %s", t->host, gai_strerror(gai));
  else
    snprintf(detail, sizeof detail, "%s", tdist__sock_strerror(last));
  if (accepted && last == -ETIMEDOUT)
    return tdist__store_fail(&t->base, TDIST_ERR_TIMEOUT,
                             "store %s: %s accepted the connection but never replied to the "
                             "handshake within %lld ms (%d attempts): is it a tdist/PyTorch store?",
                             why, t->where, (long long)(tdist__now_ms() - start), attempts);
  return tdist__store_fail(&t->base, TDIST_ERR_TIMEOUT,
                           "store %s: could not connect to %s within %lld ms (%d attempts): %s%s",
                           why, t->where, (long long)(tdist__now_ms() - start), attempts, detail,
                           last == -EPROTO ? " (the server answered PING wrongly)" : "");
}

/* Starts a call: reconnects if needed and returns the call's deadline. */
static tdist_status_t begin(tcp_store_t *t, const char *op, int64_t to, int64_t *deadline) {
  *deadline = tdist__now_ms() + to;
  t->len = 0;
  t->oom = 0;
  if (t->fd >= 0) return TDIST_OK;
  return do_connect(t, *deadline, op);
}

/* The deadline for the reply that follows a successful WAIT: the call's, but at least
 * REPLY_GRACE_MS from now, so a wait that ended near the deadline still gets its value. */
static int64_t reply_deadline(int64_t dl) {
  int64_t soonest = tdist__now_ms() + REPLY_GRACE_MS;
  return soonest > dl ? soonest : dl;
}

static tdist_status_t need_v2(tcp_store_t *t, const char *op) {
  if (t->dialect == TDIST__DIALECT_V2) return TDIST_OK;
  return tdist__store_fail(&t->base, TDIST_ERR_NOT_AVAILABLE,
                           "store %s: the server at %s speaks PyTorch 1.13's protocol, which has "
                           "no %s",
                           op, t->where, op);
}

static tdist_status_t no_queues(tcp_store_t *t, const char *op) {
  return tdist__store_fail(&t->base, TDIST_ERR_NOT_AVAILABLE,
                           "store %s: the server at %s has no queue operations (it closed the "
                           "connection on QUEUE_LEN; PyTorch 2.6's and older TCPStore servers "
                           "have no queues)",
                           op, t->where);
}

/* Before a queue op: the 2.x dialect, and a server that knows QUEUE_* (see the top comment).
 * The probe is a QUEUE_LEN of `key`, which changes nothing. */
static tdist_status_t need_queues(tcp_store_t *t, const char *op, const char *key, int64_t dl) {
  tdist_status_t st = need_v2(t, op);
  if (st || t->queues > 0) return st;
  if (t->queues < 0) return no_queues(t, op);
  req_op(t, TDIST__OP_QUEUE_LEN);
  req_key(t, key);
  if ((st = req_send(t, op, dl))) return st;
  uint8_t b[8];
  int r = tdist__sock_recv_reply(t->fd, b, 8, dl);
  if (r == 0) {
    t->queues = 1;
    return TDIST_OK;
  }
  if (r != -TDIST__ECLOSED && r != -ECONNRESET) return io_fail(t, op, r);
  /* Hung up on QUEUE_LEN: if it still takes connections, it does not know the opcode. */
  drop(t);
  if (do_connect(t, dl, op) != TDIST_OK) return io_fail(t, op, r);
  if (t->dialect != TDIST__DIALECT_V2) return need_v2(t, op);
  t->queues = -1;
  return no_queues(t, op);
}

/* ---------------------------------------------------------------------------------------- */
/* WAIT with a deadline that never desynchronises the connection                              */

static tdist_status_t wait_keys(tcp_store_t *t, const char *op, const char *const *keys, size_t n,
                                int64_t wait_ms) {
  int64_t deadline = tdist__now_ms() + wait_ms;
  req_op(t, TDIST__OP_WAIT);
  req_u64(t, n);
  for (size_t i = 0; i < n; i++) req_key(t, keys[i]);
  tdist_status_t st = req_send(t, op, deadline);
  if (st) return st;
  uint8_t b;
  int r = tdist__sock_recv_reply(t->fd, &b, 1, deadline);
  if (r == 0) {
    if (b == TDIST__WAIT_STOP_WAITING) return TDIST_OK;
    drop(t);
    return tdist__store_fail(&t->base, TDIST_ERR_PROTOCOL,
                             "store %s on %s: WAIT answered 0x%02x instead of 0x00", op, t->where,
                             b);
  }
  if (r != -ETIMEDOUT) return io_fail(t, op, r);
  if (t->dialect == TDIST__DIALECT_V2) {
    /* CANCEL_WAIT: the reply is 01, or 00 then 01 if the keys arrived just before the cancel. */
    int64_t grace = tdist__now_ms() + CANCEL_GRACE_MS;
    req_op(t, TDIST__OP_CANCEL_WAIT);
    if ((st = req_send(t, op, grace))) return st;
    if ((st = recv_u8(t, op, &b, grace))) return st;
    if (b == TDIST__WAIT_STOP_WAITING) {
      if ((st = recv_u8(t, op, &b, grace))) return st;
      if (b != TDIST__WAIT_CANCELED) {
        drop(t);
        return tdist__store_fail(&t->base, TDIST_ERR_PROTOCOL,
                                 "store %s on %s: CANCEL_WAIT answered 0x%02x", op, t->where, b);
      }
      return TDIST_OK; /* the keys are there after all */
    }
    if (b != TDIST__WAIT_CANCELED) {
      drop(t);
      return tdist__store_fail(&t->base, TDIST_ERR_PROTOCOL,
                               "store %s on %s: CANCEL_WAIT answered 0x%02x", op, t->where, b);
    }
  } else {
    drop(t); /* 1.13 cannot cancel: the server's late reply would desynchronise us */
  }
  char ks[256];
  tdist__store_keys_str(keys, n, ks, sizeof ks);
  return tdist__store_fail(&t->base, TDIST_ERR_TIMEOUT,
                           "store %s timed out after %lld ms waiting for keys [%s] on %s "
                           "(they were never set)",
                           op, (long long)wait_ms, ks, t->where);
}

/* ---------------------------------------------------------------------------------------- */
/* Operations                                                                                */

static tdist_status_t tcp_set(tdist_store_t *s, const char *key, const void *v, size_t n,
                              int64_t to) {
  tcp_store_t *t = T(s);
  int64_t dl;
  tdist_status_t st = begin(t, "set", to, &dl);
  if (st) return st;
  req_op(t, TDIST__OP_SET);
  req_key(t, key);
  req_bytes(t, v, n);
  return req_send(t, "set", dl);
}

static tdist_status_t tcp_get(tdist_store_t *s, const char *key, void **v, size_t *n, int64_t to) {
  tcp_store_t *t = T(s);
  int64_t dl;
  tdist_status_t st = begin(t, "get", to, &dl);
  if (st || (st = wait_keys(t, "get", &key, 1, to))) return st;
  dl = reply_deadline(dl);
  req_op(t, TDIST__OP_GET);
  req_key(t, key);
  if ((st = req_send(t, "get", dl))) return st;
  return recv_bytes(t, "get", v, n, dl);
}

static tdist_status_t tcp_add(tdist_store_t *s, const char *key, int64_t delta, int64_t *res,
                              int64_t to) {
  tcp_store_t *t = T(s);
  int64_t dl;
  tdist_status_t st = begin(t, "add", to, &dl);
  if (st) return st;
  req_op(t, TDIST__OP_ADD);
  req_key(t, key);
  req_u64(t, (uint64_t)delta);
  if ((st = req_send(t, "add", dl))) return st;
  uint8_t b[8];
  int r = tdist__sock_recv_reply(t->fd, b, 8, dl);
  if (r == 0) {
    *res = (int64_t)tdist__get_u64(b);
    return TDIST_OK;
  }
  if (r != -TDIST__ECLOSED && r != -ECONNRESET) return io_fail(t, "add", r);
  /* PyTorch's servers (and ours) hang up on ADD to a value that is not an integer. If the
   * server still takes connections, that is what happened. */
  drop(t);
  if (do_connect(t, dl, "add") == TDIST_OK)
    return tdist__store_fail(&t->base, TDIST_ERR_INVALID_USAGE,
                             "store add on %s: the server refused to add to key '%s': its value "
                             "is not an integer",
                             t->where, key);
  return io_fail(t, "add", r);
}

static tdist_status_t tcp_compare_set(tdist_store_t *s, const char *key, const void *e, size_t en,
                                      const void *d, size_t dn, void **out, size_t *outn,
                                      int64_t to) {
  tcp_store_t *t = T(s);
  int64_t dl;
  tdist_status_t st = begin(t, "compare_set", to, &dl);
  if (st) return st;
  req_op(t, TDIST__OP_COMPARE_SET);
  req_key(t, key);
  req_bytes(t, e, en);
  req_bytes(t, d, dn);
  if ((st = req_send(t, "compare_set", dl))) return st;
  return recv_bytes(t, "compare_set", out, outn, dl);
}

static tdist_status_t tcp_check(tdist_store_t *s, const char *const *keys, size_t n, int *ready,
                                int64_t to) {
  tcp_store_t *t = T(s);
  int64_t dl;
  tdist_status_t st = begin(t, "check", to, &dl);
  if (st) return st;
  req_op(t, TDIST__OP_CHECK);
  req_u64(t, n);
  for (size_t i = 0; i < n; i++) req_key(t, keys[i]);
  if ((st = req_send(t, "check", dl))) return st;
  uint8_t b;
  if ((st = recv_u8(t, "check", &b, dl))) return st;
  *ready = b == TDIST__CHECK_READY;
  return TDIST_OK;
}

static tdist_status_t tcp_wait(tdist_store_t *s, const char *const *keys, size_t n, int64_t to) {
  tcp_store_t *t = T(s);
  int64_t dl;
  tdist_status_t st = begin(t, "wait", to, &dl);
  return st ? st : wait_keys(t, "wait", keys, n, to);
}

static tdist_status_t tcp_delete(tdist_store_t *s, const char *key, int *deleted, int64_t to) {
  tcp_store_t *t = T(s);
  int64_t dl, v;
  tdist_status_t st = begin(t, "delete_key", to, &dl);
  if (st) return st;
  req_op(t, TDIST__OP_DELETE_KEY);
  req_key(t, key);
  if ((st = req_send(t, "delete_key", dl)) || (st = recv_i64(t, "delete_key", &v, dl))) return st;
  *deleted = v == 1;
  return TDIST_OK;
}

static tdist_status_t tcp_num_keys(tdist_store_t *s, int64_t *n, int64_t to) {
  tcp_store_t *t = T(s);
  int64_t dl;
  tdist_status_t st = begin(t, "num_keys", to, &dl);
  if (st) return st;
  req_op(t, TDIST__OP_GETNUMKEYS);
  if ((st = req_send(t, "num_keys", dl))) return st;
  return recv_i64(t, "num_keys", n, dl);
}

static tdist_status_t tcp_append(tdist_store_t *s, const char *key, const void *v, size_t n,
                                 int64_t to) {
  tcp_store_t *t = T(s);
  int64_t dl;
  tdist_status_t st = begin(t, "append", to, &dl);
  if (st || (st = need_v2(t, "append"))) return st;
  req_op(t, TDIST__OP_APPEND);
  req_key(t, key);
  req_bytes(t, v, n);
  return req_send(t, "append", dl);
}

static tdist_status_t tcp_multi_get(tdist_store_t *s, const char *const *keys, size_t n,
                                    void **vals, size_t *lens, int64_t to) {
  tcp_store_t *t = T(s);
  int64_t dl;
  tdist_status_t st = begin(t, "multi_get", to, &dl);
  if (st || (st = wait_keys(t, "multi_get", keys, n, to))) return st;
  dl = reply_deadline(dl);
  if (t->dialect == TDIST__DIALECT_V2) {
    req_op(t, TDIST__OP_MULTI_GET);
    req_u64(t, n);
    for (size_t i = 0; i < n; i++) req_key(t, keys[i]);
  } else {
    for (size_t i = 0; i < n; i++) { /* 1.13: pipelined GETs */
      req_op(t, TDIST__OP_GET);
      req_key(t, keys[i]);
    }
  }
  if ((st = req_send(t, "multi_get", dl))) return st;
  for (size_t i = 0; i < n; i++) {
    if ((st = recv_bytes(t, "multi_get", &vals[i], &lens[i], dl))) {
      for (size_t j = 0; j < i; j++) {
        free(vals[j]);
        vals[j] = NULL;
        lens[j] = 0;
      }
      return st;
    }
  }
  return TDIST_OK;
}

static tdist_status_t tcp_multi_set(tdist_store_t *s, const char *const *keys,
                                    const void *const *vals, const size_t *lens, size_t n,
                                    int64_t to) {
  tcp_store_t *t = T(s);
  int64_t dl;
  tdist_status_t st = begin(t, "multi_set", to, &dl);
  if (st) return st;
  if (t->dialect == TDIST__DIALECT_V2) {
    req_op(t, TDIST__OP_MULTI_SET);
    req_u64(t, n);
    for (size_t i = 0; i < n; i++) {
      req_key(t, keys[i]);
      req_bytes(t, vals[i], lens[i]);
    }
  } else {
    for (size_t i = 0; i < n; i++) { /* 1.13: pipelined SETs (no replies) */
      req_op(t, TDIST__OP_SET);
      req_key(t, keys[i]);
      req_bytes(t, vals[i], lens[i]);
    }
  }
  return req_send(t, "multi_set", dl);
}

static tdist_status_t tcp_queue_push(tdist_store_t *s, const char *key, const void *v, size_t n,
                                     int64_t to) {
  tcp_store_t *t = T(s);
  int64_t dl;
  tdist_status_t st = begin(t, "queue_push", to, &dl);
  if (st || (st = need_queues(t, "queue_push", key, dl))) return st;
  req_op(t, TDIST__OP_QUEUE_PUSH);
  req_key(t, key);
  req_bytes(t, v, n);
  return req_send(t, "queue_push", dl);
}

static tdist_status_t tcp_queue_pop(tdist_store_t *s, const char *key, int64_t wait_ms, void **v,
                                    size_t *n, int64_t to) {
  tcp_store_t *t = T(s);
  int64_t dl;
  tdist_status_t st = begin(t, "queue_pop", to, &dl);
  if (st || (st = need_queues(t, "queue_pop", key, dl))) return st;
  int64_t wait_deadline = tdist__now_ms() + wait_ms;
  for (;;) {
    if (wait_ms > 0) {
      int64_t left = wait_deadline - tdist__now_ms();
      if ((st = wait_keys(t, "queue_pop", &key, 1, left > 0 ? left : 1))) return st;
    }
    int64_t rdl = reply_deadline(dl);
    int64_t len;
    req_op(t, TDIST__OP_QUEUE_POP);
    req_key(t, key);
    if ((st = req_send(t, "queue_pop", rdl)) || (st = recv_i64(t, "queue_pop", &len, rdl)))
      return st;
    if (len > 0) return recv_bytes(t, "queue_pop", v, n, rdl);
    /* Another consumer took the item between our WAIT and POP: wait again if time is left. */
    if (wait_ms == 0 || tdist__now_ms() >= wait_deadline)
      return tdist__store_fail(&t->base, TDIST_ERR_NOT_FOUND,
                               "store queue_pop on %s: queue '%s' "
                               "is empty",
                               t->where, key);
  }
}

static tdist_status_t tcp_queue_len(tdist_store_t *s, const char *key, int64_t *n, int64_t to) {
  tcp_store_t *t = T(s);
  int64_t dl;
  tdist_status_t st = begin(t, "queue_len", to, &dl);
  if (st || (st = need_queues(t, "queue_len", key, dl))) return st;
  req_op(t, TDIST__OP_QUEUE_LEN);
  req_key(t, key);
  if ((st = req_send(t, "queue_len", dl))) return st;
  return recv_i64(t, "queue_len", n, dl);
}

static void tcp_destroy(tdist_store_t *s) {
  tcp_store_t *t = T(s);
  drop(t);
  pthread_mutex_destroy(&t->mu);
  free(t->buf);
  free(t->host);
  free(t);
}

/* One request at a time per handle, as PyTorch's TCPStore client does (its activeOpLock_): a
 * handle may be shared by the user's threads and a process group's worker (which records a
 * failure in the group's store), and a request and its reply must not interleave with another's.
 * Waiting for the handle counts against the request's own timeout. The handle's error text is
 * written under the lock. */
static tdist_status_t lock_handle(tcp_store_t *t, int64_t to) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  ts.tv_sec += (time_t)(to / 1000);
  ts.tv_nsec += (long)(to % 1000) * 1000000L;
  if (ts.tv_nsec >= 1000000000L) {
    ts.tv_sec++;
    ts.tv_nsec -= 1000000000L;
  }
  int rc = pthread_mutex_timedlock(&t->mu, &ts);
  if (rc == 0) return TDIST_OK;
  return tdist__fail(rc == ETIMEDOUT ? TDIST_ERR_TIMEOUT : TDIST_ERR_SYSTEM,
                     "store %s: the handle was busy with another thread's request for the whole "
                     "%lld ms timeout (one request at a time per handle; give each thread its own)",
                     t->where, (long long)to);
}

#define LOCKED(op, params, args)             \
  static tdist_status_t locked_##op params { \
    tcp_store_t *t = T(s);                   \
    tdist_status_t st = lock_handle(t, to);  \
    if (st) return st;                       \
    st = tcp_##op args;                      \
    pthread_mutex_unlock(&t->mu);            \
    return st;                               \
  }
LOCKED(set, (tdist_store_t * s, const char *key, const void *v, size_t n, int64_t to),
       (s, key, v, n, to))
LOCKED(get, (tdist_store_t * s, const char *key, void **v, size_t *n, int64_t to),
       (s, key, v, n, to))
LOCKED(add, (tdist_store_t * s, const char *key, int64_t delta, int64_t *res, int64_t to),
       (s, key, delta, res, to))
LOCKED(compare_set,
       (tdist_store_t * s, const char *key, const void *e, size_t en, const void *d, size_t dn,
        void **out, size_t *outn, int64_t to),
       (s, key, e, en, d, dn, out, outn, to))
LOCKED(check, (tdist_store_t * s, const char *const *keys, size_t n, int *ready, int64_t to),
       (s, keys, n, ready, to))
LOCKED(wait, (tdist_store_t * s, const char *const *keys, size_t n, int64_t to), (s, keys, n, to))
LOCKED(delete, (tdist_store_t * s, const char *key, int *deleted, int64_t to),
       (s, key, deleted, to))
LOCKED(num_keys, (tdist_store_t * s, int64_t *n, int64_t to), (s, n, to))
LOCKED(append, (tdist_store_t * s, const char *key, const void *v, size_t n, int64_t to),
       (s, key, v, n, to))
LOCKED(multi_get,
       (tdist_store_t * s, const char *const *keys, size_t n, void **vals, size_t *lens,
        int64_t to),
       (s, keys, n, vals, lens, to))
LOCKED(multi_set,
       (tdist_store_t * s, const char *const *keys, const void *const *vals, const size_t *lens,
        size_t n, int64_t to),
       (s, keys, vals, lens, n, to))
LOCKED(queue_push, (tdist_store_t * s, const char *key, const void *v, size_t n, int64_t to),
       (s, key, v, n, to))
LOCKED(queue_pop,
       (tdist_store_t * s, const char *key, int64_t wait_ms, void **v, size_t *n, int64_t to),
       (s, key, wait_ms, v, n, to))
LOCKED(queue_len, (tdist_store_t * s, const char *key, int64_t *n, int64_t to), (s, key, n, to))

static const tdist__store_vtable_t k_tcp_vt = {
    "tcp",
    tcp_destroy,
    locked_set,
    locked_get,
    locked_add,
    locked_compare_set,
    locked_check,
    locked_wait,
    locked_delete,
    locked_num_keys,
    locked_append,
    locked_multi_get,
    locked_multi_set,
    locked_queue_push,
    locked_queue_pop,
    locked_queue_len,
    0 /* thread_safe: the error text is the handle's */,
    NULL /* inner */
};

TDIST_EXTERN tdist_status_t tdist_tcp_store_connect(const tdist_tcp_store_options_t *opts,
                                                    tdist_store_t **out) {
  if (!out) return tdist__fail(TDIST_ERR_INVALID_ARGUMENT, "tdist_tcp_store_connect: out is NULL");
  *out = NULL;
  if (!opts)
    return tdist__fail(TDIST_ERR_INVALID_ARGUMENT, "tdist_tcp_store_connect: options are NULL");
  /* Where a caller's struct may end: version 1's last field (append only). */
  static const size_t ends[] = {TDIST__OPTS_END(tdist_tcp_store_options_t, dialect)};
  tdist_tcp_store_options_t o = TDIST_TCP_STORE_OPTIONS_INIT;
  tdist_status_t st = tdist__opts_load("tdist_tcp_store_connect", "TDIST_TCP_STORE_OPTIONS_INIT",
                                       opts, &o, sizeof o, ends, sizeof ends / sizeof ends[0]);
  if (st) return st;
  opts = &o;
  if (!opts->host || !*opts->host)
    return tdist__fail(TDIST_ERR_INVALID_ARGUMENT,
                       "tdist_tcp_store_connect: host is empty; give the store server's name or "
                       "address");
  if (opts->port < 1 || opts->port > 65535)
    return tdist__fail(TDIST_ERR_INVALID_ARGUMENT,
                       "tdist_tcp_store_connect: port %d is outside 1..65535", opts->port);
  if (opts->timeout_ms <= 0 || opts->connect_timeout_ms <= 0)
    return tdist__fail(TDIST_ERR_INVALID_ARGUMENT,
                       "tdist_tcp_store_connect: timeout_ms (%lld) and connect_timeout_ms (%lld) "
                       "must be > 0",
                       (long long)opts->timeout_ms, (long long)opts->connect_timeout_ms);
  if (opts->dialect != TDIST_STORE_DIALECT_AUTO && opts->dialect != TDIST_STORE_DIALECT_V2 &&
      opts->dialect != TDIST_STORE_DIALECT_V1_13)
    return tdist__fail(TDIST_ERR_INVALID_ARGUMENT, "tdist_tcp_store_connect: unknown dialect %d",
                       (int)opts->dialect);
  tcp_store_t *t = calloc(1, sizeof *t);
  char *host = strdup(opts->host);
  if (!t || !host) {
    free(t);
    free(host);
    return tdist__fail(TDIST_ERR_NO_MEMORY, "tdist_tcp_store_connect: out of memory");
  }
  tdist__store_init(&t->base, &k_tcp_vt, opts->timeout_ms);
  t->host = host;
  t->port = opts->port;
  t->fd = -1;
  pthread_mutex_init(&t->mu, NULL);
  t->want = opts->dialect;
  t->connect_timeout_ms = opts->connect_timeout_ms;
  t->rng = (unsigned)getpid() ^ (unsigned)tdist__now_ns();
  if (strchr(host, ':'))
    snprintf(t->where, sizeof t->where, "[%s]:%d", host, t->port);
  else
    snprintf(t->where, sizeof t->where, "%s:%d", host, t->port);
  st = do_connect(t, tdist__now_ms() + t->connect_timeout_ms, "connect");
  if (st) {
    tdist__fail(st, "%s", t->base.err);
    tcp_destroy(&t->base);
    return st;
  }
  *out = &t->base;
  return TDIST_OK;
}

TDIST_EXTERN tdist_store_dialect_t tdist_tcp_store_dialect(const tdist_store_t *s) {
  if (!s || s->magic != TDIST__STORE_MAGIC || s->vt != &k_tcp_vt) return TDIST_STORE_DIALECT_AUTO;
  return T((tdist_store_t *)s)->dialect == TDIST__DIALECT_V1_13 ? TDIST_STORE_DIALECT_V1_13
                                                                : TDIST_STORE_DIALECT_V2;
}

int tdist__store_local_ip(tdist_store_t *s, char *ip, size_t cap) {
  s = tdist__store_root(s);
  if (!s || s->magic != TDIST__STORE_MAGIC || s->vt != &k_tcp_vt || T(s)->fd < 0) return -1;
  return tdist__sock_local_ipv4(T(s)->fd, ip, cap);
}
