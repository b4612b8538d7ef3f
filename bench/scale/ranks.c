/* scale_ranks: N emulated PyTorch 2.x ranks starting up against one job's store, spread over
 * several processes (one process can hold about 19,900 sockets here), each process an epoll loop
 * of non-blocking rank state machines on the raw 2.x wire protocol
 * (shared/reference/torch-contracts.md §1.3-1.10). Each rank does what a real rank's
 * init_process_group(backend="gloo") does at the store:
 *
 *   connect; VALIDATE; PING (echo checked)            the TCPStore client's connect (2.6)
 *   ADD "init/" 1                                     TCPStore(world_size=W) (§1.8)
 *   SET  /default_pg/0//cpu//0/<r> = <blob>           gloo's TCP address (§1.10, 2.6 keys)
 *   WAIT + MULTI_GET of the blobs of ranks r-1, r+1   the address exchange, lazily (see below)
 *   ADD  /default_pg/store_based_barrier_key:0 1      the store-based barrier of 2.6 with
 *   the last rank SETs ...:last_worker; all WAIT it     TORCH_DIST_INIT_BARRIER=1 (§1.10)
 *
 * The address exchange reads the two ring neighbours' blobs, as gloo's lazy init
 * (TORCH_GLOO_LAZY_INIT) does for a ring collective; gloo's full mesh reads all W-1 blobs on
 * every rank (W^2 reads: 10^10 at 100,000 ranks, which no store serves; say so when comparing).
 * Every blob read is checked against the rank it must come from.
 *
 * Rank r talks to target (r / ranks_per_target), so consecutive ranks share a target as the
 * ranks of a node share their agent's store proxy. Sources are bound round robin over --src
 * addresses with IP_BIND_ADDRESS_NO_PORT, so more than the ~28,000 ephemeral ports of one source
 * address can reach one target. At most --inflight connects are pending per process (a SYN
 * flood past the listen backlog costs 1 s retransmits, which would measure the backlog).
 *
 * Prints one line per process and a summary: ranks ready, errors, the time (from the common start,
 * CLOCK_MONOTONIC) when all were connected, had exchanged addresses, and had passed the barrier.
 * Exit 0 when every rank passed, 1 otherwise. Asserts nothing about speed. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_TARGETS 65536
#define MAX_SRC 16
#define BLOB 64 /* a gloo 2.6 blob is about this size for IPv4 */

enum {
  OP_VALIDATE = 0x00,
  OP_SET = 0x01,
  OP_ADD = 0x04,
  OP_WAIT = 0x06,
  OP_MGET = 0x0A,
  OP_PING = 0x0D
};
enum { S_CONNECT, S_PING, S_INIT, S_XWAIT, S_XGET, S_BADD, S_BWAIT, S_DONE, S_FAILED };

typedef struct {
  int fd, state;
  long node; /* --mux: its node's index (its requests go as frames on the node's socket) */
  int64_t t_conn, t_xchg, t_done;
  size_t rlen;
  uint8_t rbuf[2 * (BLOB + 16)];
} rank_t;

typedef struct {
  struct sockaddr_in targets[MAX_TARGETS];
  int ntargets;
  struct in_addr src[MAX_SRC];
  int nsrc;
  long world, first, count, per_target;
  int procs, inflight, timeout_s;
  int mux; /* --mux K: K ranks a node, each node one socket speaking the store proxy's frames */
  int64_t t0;
} opts_t;

static opts_t O;
static int failures_told;

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static size_t put_u64(uint8_t *p, uint64_t v) {
  memcpy(p, &v, 8);
  return 8;
}

static size_t put_str(uint8_t *p, const char *s, size_t n) {
  put_u64(p, n);
  memcpy(p + 8, s, n);
  return 8 + n;
}

static size_t blob_key(char *out, size_t cap, long r) {
  return (size_t)snprintf(out, cap, "/default_pg/0//cpu//0/%ld", r);
}

static void blob_of(uint8_t *b, long r) {
  for (int i = 0; i < BLOB; i++) b[i] = (uint8_t)(r * 131 + i * 7);
  memcpy(b, &r, sizeof r);
}

static const char BARRIER_KEY[] = "/default_pg/store_based_barrier_key:0";
static const char LAST_KEY[] = "/default_pg/store_based_barrier_key:0:last_worker";

/* Writes all of buf (requests here are small; the socket buffer takes them). */
static int send_all(int fd, const uint8_t *buf, size_t n) {
  while (n) {
    ssize_t w = send(fd, buf, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return -1;
    buf += w;
    n -= (size_t)w;
  }
  return 0;
}

/* --mux: the emulated nodes of this process (node_t below). */
typedef struct node node_t;
static node_t *NODES;
static int node_frame_at(long node, uint8_t type, uint32_t id, const uint8_t *d, size_t n);

/* A rank's request: on its own socket, or as a DATA frame of its node's. */
static int rank_send(rank_t *rk, long r, const uint8_t *buf, size_t n) {
  if (!O.mux) return send_all(rk->fd, buf, n);
  return node_frame_at(rk->node, 2, (uint32_t)(r % O.mux), buf, n);
}

static int send_wait_or_mget(rank_t *rk, int op, long r) {
  uint8_t buf[256];
  char k[64];
  size_t n = 0;
  buf[n++] = (uint8_t)op;
  n += put_u64(buf + n, 2);
  for (int d = -1; d <= 1; d += 2) {
    size_t kl = blob_key(k, sizeof k, (r + d + O.world) % O.world);
    n += put_str(buf + n, k, kl);
  }
  return rank_send(rk, r, buf, n);
}

/* The request that starts state s for rank r. */
static int send_step(rank_t *rk, long r) {
  uint8_t buf[256];
  size_t n = 0;
  switch (rk->state) {
    case S_PING: {
      uint32_t magic = 0x3C85F7CEu, nonce = (uint32_t)r;
      buf[n++] = OP_VALIDATE;
      memcpy(buf + n, &magic, 4), n += 4;
      buf[n++] = OP_PING;
      memcpy(buf + n, &nonce, 4), n += 4;
      break;
    }
    case S_INIT:
      buf[n++] = OP_ADD;
      n += put_str(buf + n, "init/", 5);
      n += put_u64(buf + n, 1);
      break;
    case S_XWAIT: {
      char k[64];
      uint8_t b[BLOB];
      buf[n++] = OP_SET;
      n += put_str(buf + n, k, blob_key(k, sizeof k, r));
      blob_of(b, r);
      n += put_str(buf + n, (const char *)b, BLOB);
      if (rank_send(rk, r, buf, n)) return -1;
      return send_wait_or_mget(rk, OP_WAIT, r);
    }
    case S_XGET: return send_wait_or_mget(rk, OP_MGET, r);
    case S_BADD:
      buf[n++] = OP_ADD;
      n += put_str(buf + n, BARRIER_KEY, sizeof BARRIER_KEY - 1);
      n += put_u64(buf + n, 1);
      break;
    case S_BWAIT:
      buf[n++] = OP_WAIT;
      n += put_u64(buf + n, 1);
      n += put_str(buf + n, LAST_KEY, sizeof LAST_KEY - 1);
      break;
    default: return 0;
  }
  return rank_send(rk, r, buf, n);
}

/* How many bytes the reply of the current state takes, or 0 if rbuf does not hold it all yet. */
static size_t reply_len(const rank_t *rk) {
  switch (rk->state) {
    case S_PING: return rk->rlen >= 4 ? 4 : 0;
    case S_INIT:
    case S_BADD: return rk->rlen >= 8 ? 8 : 0;
    case S_XWAIT:
    case S_BWAIT: return rk->rlen >= 1 ? 1 : 0;
    case S_XGET: {
      size_t off = 0;
      for (int i = 0; i < 2; i++) {
        uint64_t l;
        if (rk->rlen < off + 8) return 0;
        memcpy(&l, rk->rbuf + off, 8);
        if (l != BLOB) return (size_t)-1;
        off += 8 + l;
      }
      return rk->rlen >= off ? off : 0;
    }
    default: return (size_t)-1;
  }
}

/* Checks the reply of the current state and moves on; -1 on a wrong reply. */
static int advance(rank_t *rk, long r, int64_t t) {
  switch (rk->state) {
    case S_PING: {
      uint32_t echo;
      memcpy(&echo, rk->rbuf, 4);
      if (echo != (uint32_t)r) return -1;
      rk->state = S_INIT;
      break;
    }
    case S_INIT: rk->state = S_XWAIT; break;
    case S_XWAIT:
      if (rk->rbuf[0] != 0) return -1;
      rk->state = S_XGET;
      break;
    case S_XGET: {
      uint8_t want[BLOB];
      blob_of(want, (r - 1 + O.world) % O.world);
      if (memcmp(rk->rbuf + 8, want, BLOB)) return -1;
      blob_of(want, (r + 1) % O.world);
      if (memcmp(rk->rbuf + 16 + BLOB, want, BLOB)) return -1;
      rk->t_xchg = t;
      rk->state = S_BADD;
      break;
    }
    case S_BADD: {
      int64_t v;
      memcpy(&v, rk->rbuf, 8);
      if (v < 1 || v > O.world) return -1;
      if (v == O.world) {
        uint8_t buf[128];
        size_t n = 0;
        buf[n++] = OP_SET;
        n += put_str(buf + n, LAST_KEY, sizeof LAST_KEY - 1);
        n += put_str(buf + n, "1", 1);
        if (rank_send(rk, r, buf, n)) return -1;
      }
      rk->state = S_BWAIT;
      break;
    }
    case S_BWAIT:
      if (rk->rbuf[0] != 0) return -1;
      rk->t_done = t;
      rk->state = S_DONE;
      return 0;
    default: return -1;
  }
  return send_step(rk, r);
}

/* Runs the state machine over the whole replies in rbuf: 1 more may come, 0 done, -1 failed. */
static int run_replies(rank_t *rk, long r, int64_t t) {
  for (;;) {
    size_t need = reply_len(rk);
    if (need == (size_t)-1) return -1;
    if (need == 0) return 1;
    if (advance(rk, r, t)) return -1;
    memmove(rk->rbuf, rk->rbuf + need, rk->rlen - need);
    rk->rlen -= need;
    if (rk->state == S_DONE) return 0;
  }
}

/* Reads what the socket has and runs the state machine over whole replies. */
static int on_readable(rank_t *rk, long r) {
  for (;;) {
    ssize_t got = recv(rk->fd, rk->rbuf + rk->rlen, sizeof rk->rbuf - rk->rlen, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
    if (got == 0) errno = ECONNRESET; /* closed by the server: say so, not "wrong reply" */
    if (got <= 0) return -1;
    rk->rlen += (size_t)got;
    int rc = run_replies(rk, r, now_ns());
    if (rc <= 0) return rc;
  }
}

static int start_connect(rank_t *rk, long r, int ep, long slot) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  setsockopt(fd, IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &one, sizeof one);
  if (O.nsrc) {
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr = O.src[r % O.nsrc]};
    if (bind(fd, (struct sockaddr *)&a, sizeof a)) {
      close(fd);
      return -1;
    }
  }
  const struct sockaddr_in *t = &O.targets[(r / O.per_target) % O.ntargets];
  if (connect(fd, (const struct sockaddr *)t, sizeof *t) && errno != EINPROGRESS) {
    close(fd);
    return -1;
  }
  rk->fd = fd;
  rk->state = S_CONNECT;
  if (ep < 0) return 0; /* the caller registers it */
  struct epoll_event ev = {.events = EPOLLOUT | EPOLLIN, .data.u64 = (uint64_t)slot};
  return epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
}

/* One event for rank slot i; returns +1 when it finished (done or failed), else 0. */
static int on_event(rank_t *rk, long r, long slot, int ep, uint32_t events, int *connecting) {
  if (rk->state == S_CONNECT) {
    int err = 0;
    socklen_t l = sizeof err;
    getsockopt(rk->fd, SOL_SOCKET, SO_ERROR, &err, &l);
    if (err || !(events & EPOLLOUT)) {
      if (!err) return 0;
      if (++failures_told <= 5)
        fprintf(stderr, "scale_ranks: rank %ld: connect: %s\n", r, strerror(err));
      rk->state = S_FAILED;
      (*connecting)--;
      return 1;
    }
    (*connecting)--;
    rk->t_conn = now_ns();
    struct epoll_event ev = {.events = EPOLLIN, .data.u64 = (uint64_t)slot};
    epoll_ctl(ep, EPOLL_CTL_MOD, rk->fd, &ev);
    rk->state = S_PING;
    if (send_step(rk, r)) goto fail;
    return 0;
  }
  if (on_readable(rk, r)) goto fail;
  if (rk->state == S_DONE) {
    epoll_ctl(ep, EPOLL_CTL_DEL, rk->fd, NULL);
    return 1;
  }
  return 0;
fail:
  if (++failures_told <= 5)
    fprintf(
        stderr, "scale_ranks: rank %ld failed in state %d (%s)%s\n", r, rk->state,
        errno ? strerror(errno) : "wrong reply (a store used before? each run needs a fresh one)",
        failures_told == 5 ? "; further failures of this process are only counted" : "");
  rk->state = S_FAILED;
  return 1;
}

typedef struct {
  long ready, failed;
  int64_t conn_max, xchg_max, done_max;
} result_t;

static result_t collect(const rank_t *rk, long n) {
  result_t res = {0};
  for (long i = 0; i < n; i++) {
    if (rk[i].state == S_DONE) {
      res.ready++;
      if (rk[i].t_conn - O.t0 > res.conn_max) res.conn_max = rk[i].t_conn - O.t0;
      if (rk[i].t_xchg - O.t0 > res.xchg_max) res.xchg_max = rk[i].t_xchg - O.t0;
      if (rk[i].t_done - O.t0 > res.done_max) res.done_max = rk[i].t_done - O.t0;
    } else {
      res.failed++;
    }
  }
  return res;
}

/* Runs ranks [lo, hi) to the end or the deadline. */
static result_t run_ranks(long lo, long hi) {
  long n = hi - lo;
  rank_t *rk = calloc((size_t)n, sizeof *rk);
  result_t res = {0};
  int ep = epoll_create1(EPOLL_CLOEXEC);
  if (!rk || ep < 0) {
    res.failed = n;
    return res;
  }
  long next = 0, finished = 0;
  int connecting = 0;
  int64_t deadline = O.t0 + (int64_t)O.timeout_s * 1000000000;
  struct epoll_event evs[512];
  while (finished < n && now_ns() < deadline) {
    while (next < n && connecting < O.inflight) {
      if (start_connect(&rk[next], lo + next, ep, next)) {
        fprintf(stderr, "scale_ranks: rank %ld: socket/connect: %s\n", lo + next, strerror(errno));
        rk[next].state = S_FAILED;
        finished++;
      } else {
        connecting++;
      }
      next++;
    }
    int k = epoll_wait(ep, evs, 512, 100);
    for (int i = 0; i < k; i++) {
      long s = (long)evs[i].data.u64;
      errno = 0;
      finished += on_event(&rk[s], lo + s, s, ep, evs[i].events, &connecting);
    }
  }
  res = collect(rk, n);
  for (long i = 0; i < n; i++)
    if (rk[i].fd > 0) close(rk[i].fd);
  close(ep);
  free(rk);
  return res;
}

/* ---- --mux: emulated nodes, each one socket speaking the store proxy's frames -------------- */

/* What a node's proxy would do for its ranks, without a socket per rank: the hello, an OPEN per
 * rank, the ranks' requests as DATA frames (runtime/store/mux.h, written here from its
 * description), their replies taken apart by id. The server sees exactly what it sees from the
 * agents' proxies of a job of W ranks in W/K nodes. */
struct node {
  int fd, state; /* N_CONNECT, N_HELLO, N_READY, N_FAILED */
  long first;    /* its first rank (index into this process's ranks) */
  int nranks;
  int dirty;
  uint8_t *in, *out;
  size_t in_len, in_cap, out_len, out_cap;
};
enum { N_CONNECT, N_HELLO, N_READY, N_FAILED };
static const uint8_t MUX_HELLO[8] = {0xF7, 't', 'd', 'm', 'u', 'x', '1', '\n'};
static long *dirty_nodes, ndirty;

static int grow(uint8_t **p, size_t *cap, size_t need) {
  if (need <= *cap) return 0;
  size_t c = *cap ? *cap : 4096;
  while (c < need) c *= 2;
  uint8_t *q = realloc(*p, c);
  if (!q) return -1;
  *p = q;
  *cap = c;
  return 0;
}

static int node_frame(node_t *nd, uint8_t type, uint32_t id, const uint8_t *d, size_t n) {
  if (grow(&nd->out, &nd->out_cap, nd->out_len + 9 + n)) return -1;
  uint8_t *p = nd->out + nd->out_len;
  uint32_t len = (uint32_t)n;
  p[0] = type;
  memcpy(p + 1, &id, 4);
  memcpy(p + 5, &len, 4);
  if (n) memcpy(p + 9, d, n);
  nd->out_len += 9 + n;
  if (!nd->dirty) {
    nd->dirty = 1;
    dirty_nodes[ndirty++] = nd - NODES;
  }
  return 0;
}

static int node_frame_at(long node, uint8_t type, uint32_t id, const uint8_t *d, size_t n) {
  return node_frame(&NODES[node], type, id, d, n);
}

/* The node's ranks all fail (its socket went, or a frame was wrong): +count finished. */
static long node_fail(node_t *nd, rank_t *rk, long lo, const char *why) {
  long f = 0;
  if (++failures_told <= 5)
    fprintf(stderr, "scale_ranks: node of ranks %ld..%ld failed: %s\n", lo + nd->first,
            lo + nd->first + nd->nranks - 1, why);
  for (int i = 0; i < nd->nranks; i++)
    if (rk[nd->first + i].state != S_DONE && rk[nd->first + i].state != S_FAILED) {
      rk[nd->first + i].state = S_FAILED;
      f++;
    }
  nd->state = N_FAILED;
  if (nd->fd >= 0) close(nd->fd); /* out of epoll: a readable socket never read would spin */
  nd->fd = -1;
  return f;
}

/* The frames in nd->in: the hello, then replies. Returns the ranks that finished. */
static long node_input(node_t *nd, rank_t *rk, long lo, int64_t t) {
  size_t off = 0;
  long fin = 0;
  if (nd->state == N_HELLO) {
    if (nd->in_len < 8) return 0;
    if (memcmp(nd->in, MUX_HELLO, 8)) return node_fail(nd, rk, lo, "no hello from the server");
    off = 8;
    nd->state = N_READY;
    for (int i = 0; i < nd->nranks; i++) {
      rank_t *k = &rk[nd->first + i];
      k->t_conn = t;
      k->state = S_PING;
      if (node_frame(nd, 1, (uint32_t)((lo + nd->first + i) % O.mux), NULL, 0) ||
          send_step(k, lo + nd->first + i))
        return node_fail(nd, rk, lo, "out of memory");
    }
  }
  while (nd->in_len - off >= 9) {
    uint32_t id, len;
    memcpy(&id, nd->in + off + 1, 4);
    memcpy(&len, nd->in + off + 5, 4);
    if (nd->in_len - off < 9 + (size_t)len) break;
    uint8_t type = nd->in[off];
    const uint8_t *d = nd->in + off + 9;
    off += 9 + len;
    long i = (long)id - (lo + nd->first) % O.mux;
    if (i < 0 || i >= nd->nranks || type != 2) {
      if (type == 3 && i >= 0 && i < nd->nranks)
        fprintf(stderr, "scale_ranks: rank %ld closed by the server: %.*s\n", lo + nd->first + i,
                (int)len, (const char *)d);
      fin += node_fail(nd, rk, lo, "a frame for no rank of it, or a CLOSE");
      break;
    }
    rank_t *k = &rk[nd->first + i];
    if (k->state == S_DONE || k->state == S_FAILED || k->rlen + len > sizeof k->rbuf) {
      fin += node_fail(nd, rk, lo, "a reply past what the rank expects");
      break;
    }
    memcpy(k->rbuf + k->rlen, d, len);
    k->rlen += len;
    int rc = run_replies(k, lo + nd->first + i, t);
    if (rc < 0) k->state = S_FAILED;
    if (rc <= 0) fin++;
  }
  memmove(nd->in, nd->in + off, nd->in_len - off);
  nd->in_len -= off;
  return fin;
}

/* One event of a node's socket; returns the ranks that finished. */
static long on_node(node_t *nd, rank_t *rk, long lo, uint32_t events, int ep, long idx,
                    int *connecting) {
  if (nd->state == N_FAILED) return 0;
  if (nd->state == N_CONNECT) {
    int err = 0;
    socklen_t l = sizeof err;
    getsockopt(nd->fd, SOL_SOCKET, SO_ERROR, &err, &l);
    if (!err && !(events & EPOLLOUT)) return 0;
    (*connecting)--;
    if (err) return node_fail(nd, rk, lo, strerror(err));
    struct epoll_event ev = {.events = EPOLLIN, .data.u64 = (uint64_t)idx};
    epoll_ctl(ep, EPOLL_CTL_MOD, nd->fd, &ev);
    nd->state = N_HELLO;
    if (send_all(nd->fd, MUX_HELLO, 8)) return node_fail(nd, rk, lo, "cannot send the hello");
    return 0;
  }
  long fin = 0;
  for (;;) {
    if (grow(&nd->in, &nd->in_cap, nd->in_len + 65536)) return node_fail(nd, rk, lo, "memory");
    ssize_t got = recv(nd->fd, nd->in + nd->in_len, nd->in_cap - nd->in_len, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return fin;
    if (got <= 0)
      return fin + node_fail(nd, rk, lo, got ? strerror(errno) : "closed by the server");
    nd->in_len += (size_t)got;
    fin += node_input(nd, rk, lo, now_ns());
    if (nd->state == N_FAILED) return fin;
  }
}

static int node_connect(node_t *nd, long r) {
  rank_t tmp = {0};
  if (start_connect(&tmp, r, -1, 0)) return -1;
  nd->fd = tmp.fd;
  nd->state = N_CONNECT;
  return 0;
}

/* --mux: ranks [lo, hi) as nodes of O.mux ranks (lo is a node's first rank). */
static result_t run_nodes(long lo, long hi) {
  long n = hi - lo, nn = (n + O.mux - 1) / O.mux;
  rank_t *rk = calloc((size_t)n, sizeof *rk);
  NODES = calloc((size_t)nn, sizeof *NODES);
  dirty_nodes = calloc((size_t)nn, sizeof *dirty_nodes);
  result_t res = {0};
  int ep = epoll_create1(EPOLL_CLOEXEC);
  if (!rk || !NODES || !dirty_nodes || ep < 0) return (result_t){.failed = n};
  for (long i = 0; i < n; i++) rk[i].node = i / O.mux;
  for (long i = 0; i < nn; i++) NODES[i].fd = -1;
  long next = 0, finished = 0;
  int connecting = 0;
  int64_t deadline = O.t0 + (int64_t)O.timeout_s * 1000000000;
  struct epoll_event evs[512];
  while (finished < n && now_ns() < deadline) {
    while (next < nn && connecting < O.inflight) {
      node_t *nd = &NODES[next];
      nd->first = next * O.mux;
      nd->nranks = (int)(n - nd->first < O.mux ? n - nd->first : O.mux);
      struct epoll_event ev = {.events = EPOLLOUT | EPOLLIN, .data.u64 = (uint64_t)next};
      if (node_connect(nd, lo + nd->first) || epoll_ctl(ep, EPOLL_CTL_ADD, nd->fd, &ev))
        finished += node_fail(nd, rk, lo, strerror(errno));
      else
        connecting++;
      next++;
    }
    int k = epoll_wait(ep, evs, 512, 100);
    for (int i = 0; i < k; i++) {
      long s = (long)evs[i].data.u64;
      errno = 0;
      finished += on_node(&NODES[s], rk, lo, evs[i].events, ep, s, &connecting);
    }
    for (long i = 0; i < ndirty; i++) {
      node_t *nd = &NODES[dirty_nodes[i]];
      nd->dirty = 0;
      if (nd->state != N_FAILED && send_all(nd->fd, nd->out, nd->out_len))
        finished += node_fail(nd, rk, lo, strerror(errno));
      nd->out_len = 0;
    }
    ndirty = 0;
  }
  res = collect(rk, n);
  for (long i = 0; i < nn; i++) {
    if (NODES[i].fd >= 0) close(NODES[i].fd);
    free(NODES[i].in);
    free(NODES[i].out);
  }
  close(ep);
  free(rk);
  free(NODES);
  free(dirty_nodes);
  return res;
}

static int parse_hostport(const char *s, struct sockaddr_in *out) {
  char host[64];
  const char *c = strrchr(s, ':');
  if (!c || (size_t)(c - s) >= sizeof host) return -1;
  memcpy(host, s, (size_t)(c - s));
  host[c - s] = 0;
  char *end;
  long p = strtol(c + 1, &end, 10);
  if (*end || p < 1 || p > 65535) return -1;
  memset(out, 0, sizeof *out);
  out->sin_family = AF_INET;
  out->sin_port = htons((uint16_t)p);
  return inet_pton(AF_INET, host, &out->sin_addr) == 1 ? 0 : -1;
}

static void usage(FILE *f) {
  fputs(
      "usage: scale_ranks --targets FILE|HOST:PORT[,HOST:PORT...] --world W [--first R] [--count "
      "N]\n"
      "                   [--procs P] [--src A[,A...]] [--inflight C] [--timeout-s T] [--mux K]\n"
      "  N emulated PyTorch 2.x ranks (ranks R..R+N-1 of a world of W; N defaults to W) start up\n"
      "  against the store: connect, VALIDATE, PING, ADD init/, gloo's address SET and the ring\n"
      "  neighbours' WAIT+MULTI_GET, the store-based barrier. Rank r uses target r/(W/targets).\n"
      "  --targets FILE: one HOST:PORT per line. --procs: processes sharing the ranks (default:\n"
      "  enough for 16,000 ranks each). --src: IPv4 source addresses, round robin (default: the\n"
      "  kernel's choice). --inflight: pending connects per process (default 256).\n"
      "  --mux K: the ranks as nodes of K ranks, each node one connection speaking the store\n"
      "  proxy's frames (runtime/store/mux.h), as the agents' proxies carry a job's ranks: the\n"
      "  server sees what it sees from a job with --store-proxy, without a socket per rank here.\n",
      f);
}

static int read_targets(const char *arg) {
  FILE *f = strchr(arg, ':') ? NULL : fopen(arg, "r");
  char line[128];
  const char *p = arg;
  while (f ? fgets(line, sizeof line, f) != NULL : *p != 0) {
    if (!f) {
      size_t l = strcspn(p, ",");
      if (l >= sizeof line) return -1;
      memcpy(line, p, l);
      line[l] = 0;
      p += l + (p[l] == ',');
    }
    line[strcspn(line, "\r\n")] = 0;
    if (!line[0]) continue;
    if (O.ntargets == MAX_TARGETS || parse_hostport(line, &O.targets[O.ntargets])) {
      fprintf(stderr, "scale_ranks: bad target '%s' (HOST:PORT, IPv4, at most %d)\n", line,
              MAX_TARGETS);
      if (f) fclose(f);
      return -1;
    }
    O.ntargets++;
  }
  if (f) fclose(f);
  return O.ntargets ? 0 : -1;
}

static int parse_args(int argc, char **argv) {
  O.inflight = 256;
  O.timeout_s = 300;
  O.count = -1;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--help")) {
      usage(stdout);
      exit(0);
    }
    if (!v) break;
    i++;
    if (!strcmp(a, "--targets")) {
      if (read_targets(v)) return -1;
    } else if (!strcmp(a, "--world")) {
      O.world = atol(v);
    } else if (!strcmp(a, "--first")) {
      O.first = atol(v);
    } else if (!strcmp(a, "--count")) {
      O.count = atol(v);
    } else if (!strcmp(a, "--procs")) {
      O.procs = atoi(v);
    } else if (!strcmp(a, "--inflight")) {
      O.inflight = atoi(v);
    } else if (!strcmp(a, "--mux")) {
      O.mux = atoi(v);
    } else if (!strcmp(a, "--timeout-s")) {
      O.timeout_s = atoi(v);
    } else if (!strcmp(a, "--src")) {
      for (const char *p = v; *p && O.nsrc < MAX_SRC;) {
        char ip[32];
        size_t l = strcspn(p, ",");
        if (l >= sizeof ip) return -1;
        memcpy(ip, p, l);
        ip[l] = 0;
        if (inet_pton(AF_INET, ip, &O.src[O.nsrc++]) != 1) return -1;
        p += l + (p[l] == ',');
      }
    } else {
      fprintf(stderr, "scale_ranks: unknown flag %s\n", a);
      return -1;
    }
  }
  if (O.count < 0) O.count = O.world - O.first;
  if (!O.ntargets || O.world < 2 || O.first < 0 || O.count < 1 || O.first + O.count > O.world ||
      O.inflight < 1 || O.timeout_s < 1 || O.mux < 0 || (O.mux && O.first % O.mux))
    return -1;
  if (O.procs < 1) O.procs = (int)((O.count + 15999) / 16000);
  O.per_target = (O.world + O.ntargets - 1) / O.ntargets;
  return 0;
}

int main(int argc, char **argv) {
  if (parse_args(argc, argv)) {
    usage(stderr);
    return 2;
  }
  signal(SIGPIPE, SIG_IGN);
  O.t0 = now_ns();
  int pfd[2];
  if (pipe(pfd)) return 2;
  long per = (O.count + O.procs - 1) / O.procs;
  if (O.mux) per = (per + O.mux - 1) / O.mux * O.mux; /* a node's ranks in one process */
  for (int p = 0; p < O.procs; p++) {
    long lo = O.first + p * per, hi = lo + per > O.first + O.count ? O.first + O.count : lo + per;
    if (lo >= hi) break;
    pid_t c = fork();
    if (c == 0) {
      close(pfd[0]);
      result_t r = O.mux ? run_nodes(lo, hi) : run_ranks(lo, hi);
      if (write(pfd[1], &r, sizeof r) != (ssize_t)sizeof r) _exit(2);
      _exit(0);
    }
    if (c < 0) return 2;
  }
  close(pfd[1]);
  result_t all = {0}, r;
  while (read(pfd[0], &r, sizeof r) == (ssize_t)sizeof r) {
    all.ready += r.ready;
    all.failed += r.failed;
    if (r.conn_max > all.conn_max) all.conn_max = r.conn_max;
    if (r.xchg_max > all.xchg_max) all.xchg_max = r.xchg_max;
    if (r.done_max > all.done_max) all.done_max = r.done_max;
  }
  while (wait(NULL) > 0) {
  }
  struct rusage ru;
  getrusage(RUSAGE_CHILDREN, &ru);
  double cpu = (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + (double)ru.ru_stime.tv_sec +
               ru.ru_stime.tv_usec / 1e6;
  printf(
      "ranks=%ld ready=%ld failed=%ld connected_s=%.3f exchanged_s=%.3f ready_s=%.3f "
      "clients_cpu_s=%.2f\n",
      O.count, all.ready, all.failed, all.conn_max / 1e9, all.xchg_max / 1e9, all.done_max / 1e9,
      cpu);
  return all.ready == O.count ? 0 : 1;
}
