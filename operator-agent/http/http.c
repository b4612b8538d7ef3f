/* The agent's HTTP server (see http.h): libmicrohttpd with one internal polling thread (epoll
 * where the library has it, else poll; never select, so descriptors past FD_SETSIZE work) that
 * answers every request itself. The handlers only render from agent_state_t, so a request never
 * blocks on the network, peers or the store.
 *
 * We create the listening socket ourselves rather than letting MHD bind, so that a failure names
 * the exact syscall, errno text and address, and so "all addresses" can fall back to IPv4 where
 * the kernel has no IPv6. The socket is CLOEXEC: workers forked by the agent never inherit it.
 *
 * Slow or idle clients (slowloris) cannot starve the probes. A connection that has sent nothing
 * useful costs one fd, an epoll entry and an MHD pool; it cannot hold a slot for long or keep a
 * new one out:
 *  - the table holds up to CONN_LIMIT_MAX (8192) connections, fewer when RLIMIT_NOFILE is low
 *    (half the soft limit; start-up raises the soft limit to the hard one first);
 *  - header deadline: a connection that has not completed its request headers within
 *    HEADER_DEADLINE_S (10 s) of connecting (or of its previous request completing, with
 *    keep-alive) is closed, however it trickles bytes; MHD's own timeout (CONN_TIMEOUT_S) only
 *    counts inactivity and resets on every byte, so a reaper thread enforces this one, closing
 *    at most REAP_BATCH (128) per pass, every 25 ms while more are overdue (about 5,000 a
 *    second), so that thousands passing the deadline together go out in small batches;
 *  - per-client limit: one IP address holds at most PER_CLIENT_MAX (1024) connections;
 *  - eviction instead of refusal: a new connection from a client at its limit, or while the table
 *    is full, closes the oldest connection still waiting for its headers (the client's own first)
 *    and is accepted. A probe sends its headers at once, so it is answered however many slow
 *    connections are open; it is refused only when every slot holds a request being answered.
 * Withstands (tests/agent:http_slowloris_test, bench/agent/slowloris.sh): 2,000 slow connections
 * from 8 addresses, or 1,500 from the probes' own address, each trickling a byte every 2 s;
 * /healthz and /readyz answer every probe. 2,000 slow connections on a shared 2-core machine:
 * p50 0.3-0.6 ms, p99 0.8-1.6 ms, the slowest of 750 probes 48-67 ms (the first, queued behind
 * the burst of 2,000 connects, or the moment all 2,000 pass their deadline together; 70-110 ms
 * when the reaper closed them all in one pass).
 * Before, the table held 512 connections and refused the 513th, probes included. */
#define _GNU_SOURCE
#include "operator-agent/http/http.h"

#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include <microhttpd.h>

#include "operator-agent/common/log.h"

#define CONN_TIMEOUT_S 10u /* inactivity; a Prometheus scrape times out at 10 s too */
#define CONN_LIMIT_MAX 8192u
#define CONN_LIMIT_SPARE 64u     /* MHD's table: evicted connections linger one loop turn */
#define HEADER_DEADLINE_S 10     /* connect (or previous request done) to headers complete */
#define PER_CLIENT_MAX 1024u     /* connections from one IP address */
#define REAP_PERIOD_NS 250000000 /* how often the reaper checks header deadlines */
/* At most this many connections are closed per reaper pass; with more overdue, the next pass
 * comes after REAP_BACKLOG_NS. Slow clients that all connected together (and pass the deadline
 * together) are then closed, and reconnect, in small batches instead of one burst that holds the
 * server's loop for a probe's worth of time. */
#define REAP_BATCH 128
#define REAP_BACKLOG_NS 25000000
#define HEALTH_MIN_S 10.0
#define HEALTH_INTERVALS 20.0

#define CT_TEXT "text/plain; charset=utf-8"
#define CT_METRICS "text/plain; version=0.0.4; charset=utf-8"
#define CT_JSON "application/json"
#define CT_HTML "text/html; charset=utf-8"

/* One open connection, from MHD's NOTIFY_STARTED to NOTIFY_CLOSED (its socket context). The list
 * is ordered by `since`, oldest first. MHD closes the fd only after NOTIFY_CLOSED returns, so
 * shutdown(fd) under the lock never hits a reused descriptor. */
typedef struct conn_s {
  struct conn_s *prev, *next;
  int fd;
  int headers_done; /* the current request's headers are in (the handler ran) */
  int doomed;       /* shut down by us; MHD closes it on its next turn */
  int64_t since;    /* connect, or the previous request's completion */
  struct sockaddr_storage peer;
} conn_t;

struct agent_http_s {
  struct MHD_Daemon *daemon;
  agent_state_t *st;
  int port;
  int64_t stale_ns; /* /healthz fails once the last loop tick is older than this */
  unsigned limit;   /* connections we keep; MHD's own cap is limit + CONN_LIMIT_SPARE */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  pthread_t reaper;
  int reaper_started, stopping;
  conn_t *head, *tail;
  unsigned n_open, n_live; /* all listed; those not doomed */
};

/* ---- connection table (slowloris defence, see the opening comment) -------------------------- */

static int64_t mono_ns(void);

static void conn_unlink(agent_http_t *h, conn_t *k) {
  if (k->prev)
    k->prev->next = k->next;
  else
    h->head = k->next;
  if (k->next)
    k->next->prev = k->prev;
  else
    h->tail = k->prev;
  k->prev = k->next = NULL;
}

static void conn_append(agent_http_t *h, conn_t *k) {
  k->prev = h->tail;
  k->next = NULL;
  if (h->tail)
    h->tail->next = k;
  else
    h->head = k;
  h->tail = k;
}

static int same_ip(const struct sockaddr_storage *a, const struct sockaddr *b) {
  if (a->ss_family != b->sa_family) return 0;
  if (b->sa_family == AF_INET)
    return ((const struct sockaddr_in *)a)->sin_addr.s_addr ==
           ((const struct sockaddr_in *)b)->sin_addr.s_addr;
  if (b->sa_family == AF_INET6)
    return !memcmp(&((const struct sockaddr_in6 *)a)->sin6_addr,
                   &((const struct sockaddr_in6 *)b)->sin6_addr, sizeof(struct in6_addr));
  return 0;
}

/* Closes k's socket for reading and writing; MHD sees the hang-up and closes it. Lock held. */
static void conn_doom(agent_http_t *h, conn_t *k) {
  if (k->doomed) return;
  k->doomed = 1;
  h->n_live--;
  shutdown(k->fd, SHUT_RDWR);
}

/* The oldest live connection waiting for its headers (from `ip` when given), or NULL. */
static conn_t *oldest_waiting(agent_http_t *h, const struct sockaddr *ip) {
  for (conn_t *k = h->head; k; k = k->next)
    if (!k->doomed && !k->headers_done && (!ip || same_ip(&k->peer, ip))) return k;
  return NULL;
}

/* MHD's accept policy: makes room for the new connection by evicting a waiting one. */
static enum MHD_Result accept_policy(void *cls, const struct sockaddr *addr, socklen_t addrlen) {
  agent_http_t *h = cls;
  (void)addrlen;
  enum MHD_Result ok = MHD_YES;
  pthread_mutex_lock(&h->mu);
  unsigned from_ip = 0;
  for (conn_t *k = h->head; k; k = k->next)
    if (!k->doomed && same_ip(&k->peer, addr)) from_ip++;
  conn_t *victim = NULL;
  if (from_ip >= PER_CLIENT_MAX) victim = oldest_waiting(h, addr);
  if (!victim && h->n_live >= h->limit) victim = oldest_waiting(h, NULL);
  if (victim)
    conn_doom(h, victim);
  else if (from_ip >= PER_CLIENT_MAX || h->n_live >= h->limit)
    ok = MHD_NO; /* every slot is answering a request: refuse this one */
  if (h->n_open >= h->limit + CONN_LIMIT_SPARE - 1) ok = MHD_NO;
  pthread_mutex_unlock(&h->mu);
  return ok;
}

static void notify_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                              enum MHD_ConnectionNotificationCode code) {
  agent_http_t *h = cls;
  if (code == MHD_CONNECTION_NOTIFY_STARTED) {
    conn_t *k = calloc(1, sizeof *k);
    if (!k) return; /* untracked: MHD's inactivity timeout still applies */
    const union MHD_ConnectionInfo *fi =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    const union MHD_ConnectionInfo *ai =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    if (!fi) {
      free(k);
      return;
    }
    k->fd = fi->connect_fd;
    if (ai && ai->client_addr) {
      size_t n = ai->client_addr->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6)
                                                        : sizeof(struct sockaddr_in);
      memcpy(&k->peer, ai->client_addr, n);
    }
    k->since = mono_ns();
    pthread_mutex_lock(&h->mu);
    conn_append(h, k);
    h->n_open++;
    h->n_live++;
    pthread_mutex_unlock(&h->mu);
    *socket_context = k;
  } else if (code == MHD_CONNECTION_NOTIFY_CLOSED) {
    conn_t *k = *socket_context;
    if (!k) return;
    pthread_mutex_lock(&h->mu);
    conn_unlink(h, k);
    h->n_open--;
    if (!k->doomed) h->n_live--;
    pthread_mutex_unlock(&h->mu);
    free(k);
    *socket_context = NULL;
  }
}

static conn_t *conn_of(struct MHD_Connection *c) {
  const union MHD_ConnectionInfo *i =
      MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
  return i ? i->socket_context : NULL;
}

/* The handler's first call: the request's headers are complete. */
static void conn_headers_done(agent_http_t *h, struct MHD_Connection *c) {
  conn_t *k = conn_of(c);
  if (!k) return;
  pthread_mutex_lock(&h->mu);
  k->headers_done = 1;
  pthread_mutex_unlock(&h->mu);
}

/* A request finished (answered or not): a keep-alive connection waits for the next headers, with
 * a fresh deadline. */
static void request_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                              enum MHD_RequestTerminationCode toe) {
  agent_http_t *h = cls;
  (void)con_cls;
  (void)toe;
  conn_t *k = conn_of(c);
  if (!k) return;
  pthread_mutex_lock(&h->mu);
  k->headers_done = 0;
  k->since = mono_ns();
  conn_unlink(h, k);
  conn_append(h, k);
  pthread_mutex_unlock(&h->mu);
}

/* Closes connections past the header deadline. The list is oldest first: stop at the first one
 * still within it. */
static void *reaper_main(void *arg) {
  agent_http_t *h = arg;
  pthread_mutex_lock(&h->mu);
  while (!h->stopping) {
    int64_t cutoff = mono_ns() - (int64_t)HEADER_DEADLINE_S * 1000000000;
    int closed = 0;
    conn_t *k = h->head;
    for (; k && k->since <= cutoff && closed < REAP_BATCH; k = k->next)
      if (!k->headers_done && !k->doomed) {
        conn_doom(h, k);
        closed++;
      }
    int backlog = closed == REAP_BATCH && k && k->since <= cutoff;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_nsec += backlog ? REAP_BACKLOG_NS : REAP_PERIOD_NS;
    if (ts.tv_nsec >= 1000000000) {
      ts.tv_sec++;
      ts.tv_nsec -= 1000000000;
    }
    pthread_cond_timedwait(&h->cv, &h->mu, &ts);
  }
  pthread_mutex_unlock(&h->mu);
  return NULL;
}

/* ---- requests ------------------------------------------------------------------------------ */

static int64_t mono_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Queues a response. `owned` bodies are malloc'd and freed by MHD; others are static storage. */
static enum MHD_Result reply(struct MHD_Connection *c, unsigned code, const char *ctype,
                             const char *body, size_t len, int owned, const char *allow) {
  /* MHD takes a non-const pointer but never writes through it for these modes. */
  struct MHD_Response *r = MHD_create_response_from_buffer(
      len, (void *)body, owned ? MHD_RESPMEM_MUST_FREE : MHD_RESPMEM_PERSISTENT);
  if (!r) {
    if (owned) free((void *)body);
    return MHD_NO; /* MHD closes the connection */
  }
  MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
  /* Probes and scrapes must see the live value, never a cached one. */
  MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
  if (allow) MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, allow);
  enum MHD_Result ret = MHD_queue_response(c, code, r);
  MHD_destroy_response(r);
  return ret;
}

static enum MHD_Result reply_static(struct MHD_Connection *c, unsigned code, const char *ctype,
                                    const char *body) {
  return reply(c, code, ctype, body, strlen(body), 0, NULL);
}

static enum MHD_Result reply_rendered(struct MHD_Connection *c, const char *ctype, char *body,
                                      size_t len) {
  if (!body)
    return reply_static(c, MHD_HTTP_INTERNAL_SERVER_ERROR, CT_TEXT,
                        "rendering failed: out of memory or output over the size limit\n");
  return reply(c, MHD_HTTP_OK, ctype, body, len, 1, NULL);
}

static enum MHD_Result reply_printf(struct MHD_Connection *c, unsigned code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static enum MHD_Result reply_printf(struct MHD_Connection *c, unsigned code, const char *fmt, ...) {
  char *body = NULL;
  va_list ap;
  va_start(ap, fmt);
  int n = vasprintf(&body, fmt, ap);
  va_end(ap);
  if (n < 0) return MHD_NO;
  return reply(c, code, CT_TEXT, body, (size_t)n, 1, NULL);
}

static enum MHD_Result serve_healthz(agent_http_t *h, struct MHD_Connection *c) {
  agent_state_lock(h->st);
  int64_t tick = h->st->loop_tick_ns;
  agent_state_unlock(h->st);
  double limit_s = (double)h->stale_ns / 1e9;
  if (tick <= 0)
    return reply_printf(c, MHD_HTTP_SERVICE_UNAVAILABLE,
                        "unhealthy: the main loop has not ticked yet (limit %.1f s)\n", limit_s);
  int64_t age = mono_ns() - tick;
  if (age > h->stale_ns)
    return reply_printf(c, MHD_HTTP_SERVICE_UNAVAILABLE,
                        "unhealthy: the main loop last ticked %.1f s ago (limit %.1f s)\n",
                        (double)age / 1e9, limit_s);
  return reply_static(c, MHD_HTTP_OK, CT_TEXT, "ok\n");
}

static enum MHD_Result serve_readyz(agent_http_t *h, struct MHD_Connection *c) {
  agent_state_lock(h->st);
  int ready = h->st->ready;
  int store_missing = h->st->is_store_host && !h->st->store_server;
  agent_state_unlock(h->st);
  if (ready && !store_missing) return reply_static(c, MHD_HTTP_OK, CT_TEXT, "ok\n");
  return reply_static(c, MHD_HTTP_SERVICE_UNAVAILABLE, CT_TEXT,
                      store_missing && ready ? "not ready: the store is not listening yet\n"
                                             : "not ready: the agent is starting\n");
}

/* JobSet's in-place restart barrier, the startup probe's path (JobSet's reference agent:
 * DefaultStartupProbePath): 200 once the barrier is lifted, or when there is none. */
static enum MHD_Result serve_barrier(agent_http_t *h, struct MHD_Connection *c) {
  agent_state_lock(h->st);
  int on = h->st->jip_enabled, down = h->st->jip_barrier_down, bypass = h->st->jip_bypass;
  int64_t attempt = h->st->jip_attempt, cur = h->st->jip_current;
  agent_state_unlock(h->st);
  if (!on)
    return reply_static(c, MHD_HTTP_OK, CT_TEXT,
                        "ok: no barrier (--jobset-in-place-restart is off)\n");
  if (down)
    return reply_static(c, MHD_HTTP_OK, CT_TEXT,
                        bypass ? "ok: no barrier (the JobSet does not use InPlaceRestart)\n"
                               : "ok: the barrier is down\n");
  if (attempt < 0)
    return reply_static(c, MHD_HTTP_SERVICE_UNAVAILABLE, CT_TEXT,
                        "barrier up: reading the JobSet and annotating this pod\n");
  char cs[32] = "unset";
  if (cur >= 0) snprintf(cs, sizeof cs, "%lld", (long long)cur);
  return reply_printf(c, MHD_HTTP_SERVICE_UNAVAILABLE,
                      "barrier up: waiting for the JobSet's currentInPlaceRestartAttempt to reach "
                      "this pod's attempt %lld (now %s)\n",
                      (long long)attempt, cs);
}

static const char kNotAllowed[] = "method not allowed; use GET or HEAD\n";

static const char kIndex[] =
    "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>tdist-agent</title></head>\n"
    "<body><h1>tdist-agent</h1><ul>\n"
    "<li><a href=\"/metrics\">/metrics</a> Prometheus metrics</li>\n"
    "<li><a href=\"/status\">/status</a> state, members and workers (JSON)</li>\n"
    "<li><a href=\"/healthz\">/healthz</a> liveness</li>\n"
    "<li><a href=\"/readyz\">/readyz</a> readiness</li>\n"
    "<li><a href=\"/barrier-is-down\">/barrier-is-down</a> JobSet's in-place restart "
    "barrier</li>\n"
    "</ul></body></html>\n";

/* MHD calls this once when the headers are in (*con_cls NULL), then once per chunk of body, then
 * once more with no data. Errors (404, 405) are answered on the first call: MHD then closes the
 * connection without reading a body. GET and HEAD are answered on the last call, as MHD needs
 * for keep-alive; a body sent with them is read and dropped. */
static enum MHD_Result handle(void *cls, struct MHD_Connection *c, const char *url,
                              const char *method, const char *version, const char *upload_data,
                              size_t *upload_data_size, void **con_cls) {
  static int marker;
  agent_http_t *h = cls;
  if (*con_cls == NULL) conn_headers_done(h, c);
  enum { P_NONE, P_HEALTHZ, P_READYZ, P_METRICS, P_STATUS, P_INDEX, P_BARRIER } path = P_NONE;
  if (!strcmp(url, "/healthz"))
    path = P_HEALTHZ;
  else if (!strcmp(url, "/readyz"))
    path = P_READYZ;
  else if (!strcmp(url, "/metrics"))
    path = P_METRICS;
  else if (!strcmp(url, "/status"))
    path = P_STATUS;
  else if (!strcmp(url, "/"))
    path = P_INDEX;
  else if (!strcmp(url, "/barrier-is-down"))
    path = P_BARRIER;

  if (path == P_NONE)
    return reply_static(c, MHD_HTTP_NOT_FOUND, CT_TEXT,
                        "not found; the agent serves /healthz /readyz /metrics /status "
                        "/barrier-is-down /\n");
  if (strcmp(method, MHD_HTTP_METHOD_GET) && strcmp(method, MHD_HTTP_METHOD_HEAD))
    return reply(c, MHD_HTTP_METHOD_NOT_ALLOWED, CT_TEXT, kNotAllowed, sizeof kNotAllowed - 1, 0,
                 "GET, HEAD");
  if (*con_cls == NULL) {
    *con_cls = &marker;
    return MHD_YES;
  }
  if (*upload_data_size) {
    *upload_data_size = 0;
    return MHD_YES;
  }

  /* HEAD: MHD sends the headers (Content-Length included) and drops the body. */
  size_t len = 0;
  char *body;
  switch (path) {
    case P_HEALTHZ: return serve_healthz(h, c);
    case P_READYZ: return serve_readyz(h, c);
    case P_METRICS:
      body = agent_metrics_render(h->st, &len);
      return reply_rendered(c, CT_METRICS, body, len);
    case P_STATUS:
      body = agent_status_render(h->st, &len);
      return reply_rendered(c, CT_JSON, body, len);
    case P_INDEX: return reply_static(c, MHD_HTTP_OK, CT_HTML, kIndex);
    case P_BARRIER: return serve_barrier(h, c);
    default: break;
  }
  return MHD_NO;
}

static void mhd_log(void *cls, const char *fmt, va_list ap) __attribute__((format(printf, 2, 0)));
/* At most LOG_BURST lines per LOG_WINDOW_NS: under a slow-client attack MHD reports every
 * connection we close; the next line allowed through says how many were dropped. */
#define LOG_BURST 10
#define LOG_WINDOW_NS 10000000000
static void mhd_log(void *cls, const char *fmt, va_list ap) {
  static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
  static int64_t window_start;
  static unsigned in_window, dropped;
  (void)cls;
  int64_t now = mono_ns();
  pthread_mutex_lock(&mu);
  if (now - window_start > LOG_WINDOW_NS) {
    window_start = now;
    in_window = 0;
  }
  int emit = in_window < LOG_BURST;
  unsigned was_dropped = emit ? dropped : 0;
  if (emit) {
    in_window++;
    dropped = 0;
  } else {
    dropped++;
  }
  pthread_mutex_unlock(&mu);
  if (!emit) return;
  char msg[512];
  vsnprintf(msg, sizeof msg, fmt, ap);
  size_t n = strlen(msg);
  while (n && (msg[n - 1] == '\n' || msg[n - 1] == '\r')) msg[--n] = '\0';
  if (was_dropped)
    AGENT_WARN("http server: %s (%u similar lines dropped before this one)", msg, was_dropped);
  else
    AGENT_WARN("http server: %s", msg);
}

/* ---- listening socket ------------------------------------------------------------------------ */

static void fmt_addr(const struct sockaddr *sa, int port, char *out, size_t cap) {
  char ip[INET6_ADDRSTRLEN] = "?";
  if (sa->sa_family == AF_INET6)
    inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)sa)->sin6_addr, ip, sizeof ip);
  else
    inet_ntop(AF_INET, &((const struct sockaddr_in *)sa)->sin_addr, ip, sizeof ip);
  snprintf(out, cap, sa->sa_family == AF_INET6 ? "[%s]:%d" : "%s:%d", ip, port);
}

/* Returns a listening socket, or -1 with err filled. *fail_errno is the errno of the failure. */
static int open_listener(const struct sockaddr *sa, socklen_t salen, int dual_stack, int port,
                         int *fail_errno, char *err, size_t cap) {
  char where[INET6_ADDRSTRLEN + 16];
  fmt_addr(sa, port, where, sizeof where);
  const char *call = "socket";
  int fd = socket(sa->sa_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd >= 0) {
    int one = 1, zero = 0;
    call = "setsockopt(SO_REUSEADDR)";
    if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) == 0) {
      call = "setsockopt(IPV6_V6ONLY)";
      if (!dual_stack || setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero) == 0) {
        call = "bind";
        if (bind(fd, sa, salen) == 0) {
          call = "listen";
          if (listen(fd, SOMAXCONN) == 0) return fd;
        }
      }
    }
  }
  int e = errno;
  if (fd >= 0) close(fd);
  *fail_errno = e;
  snprintf(err, cap, "HTTP server: %s for %s failed: %s%s", call, where, strerror(e),
           e == EADDRINUSE ? " (another process uses the port; choose another with --http-port)"
           : e == EADDRNOTAVAIL ? " (no interface has this address; check --http-host)"
           : e == EACCES ? " (ports below 1024 need privilege; choose another with --http-port)"
                         : "");
  return -1;
}

/* Binds host:port; host "" = all addresses: "::" dual stack, or 0.0.0.0 without IPv6. */
static int bind_host(const char *host, int port, char *err, size_t cap) {
  int fail_errno = 0;
  if (!host || !host[0]) {
    struct sockaddr_in6 a6;
    memset(&a6, 0, sizeof a6);
    a6.sin6_family = AF_INET6;
    a6.sin6_addr = in6addr_any;
    a6.sin6_port = htons((uint16_t)port);
    int fd = open_listener((struct sockaddr *)&a6, sizeof a6, 1, port, &fail_errno, err, cap);
    if (fd >= 0) return fd;
    if (fail_errno != EAFNOSUPPORT && fail_errno != EADDRNOTAVAIL && fail_errno != EINVAL &&
        fail_errno != EPROTONOSUPPORT)
      return -1;
    /* The kernel has IPv6 off: all IPv4 addresses, which is what probes use then anyway. */
    struct sockaddr_in a4;
    memset(&a4, 0, sizeof a4);
    a4.sin_family = AF_INET;
    a4.sin_addr.s_addr = htonl(INADDR_ANY);
    a4.sin_port = htons((uint16_t)port);
    return open_listener((struct sockaddr *)&a4, sizeof a4, 0, port, &fail_errno, err, cap);
  }

  /* A numeric address only, "[v6]" accepted: a name lookup here could block start-up on DNS. */
  char h[256];
  size_t n = strlen(host);
  if (n >= sizeof h) {
    snprintf(err, cap, "HTTP server: host \"%.40s...\" is too long; give an IP address", host);
    return -1;
  }
  memcpy(h, host, n + 1);
  if (n >= 2 && h[0] == '[' && h[n - 1] == ']') {
    memmove(h, h + 1, n - 2);
    h[n - 2] = '\0';
  }
  char portstr[16];
  snprintf(portstr, sizeof portstr, "%d", port);
  struct addrinfo hints, *ai = NULL;
  memset(&hints, 0, sizeof hints);
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV | AI_PASSIVE;
  int rc = getaddrinfo(h, portstr, &hints, &ai);
  if (rc != 0 || !ai) {
    snprintf(err, cap,
             "HTTP server: host \"%s\" is not an IP address (%s); give one such as 0.0.0.0, :: "
             "or the pod IP, or \"\" for all addresses",
             host, gai_strerror(rc));
    if (ai) freeaddrinfo(ai);
    return -1;
  }
  int fd = open_listener(ai->ai_addr, ai->ai_addrlen, 0, port, &fail_errno, err, cap);
  freeaddrinfo(ai);
  return fd;
}

/* ---- lifecycle ------------------------------------------------------------------------------- */

agent_http_t *agent_http_start(agent_state_t *st, const char *host, int port,
                               double monitor_interval_s, char *err, size_t cap) {
  char scratch[8];
  if (!err || cap == 0) {
    err = scratch;
    cap = sizeof scratch;
  }
  err[0] = '\0';
  if (!st) {
    snprintf(err, cap, "HTTP server: no agent state given (internal error)");
    return NULL;
  }
  if (port < 0 || port > 65535) {
    snprintf(err, cap, "HTTP server: port %d is out of range; give 0..65535", port);
    return NULL;
  }
  if (!(monitor_interval_s >= 0) || !isfinite(monitor_interval_s)) {
    snprintf(err, cap, "HTTP server: monitor interval %g s is invalid; give a finite value >= 0",
             monitor_interval_s);
    return NULL;
  }

  agent_http_t *h = calloc(1, sizeof *h);
  if (!h) {
    snprintf(err, cap, "HTTP server: out of memory");
    return NULL;
  }
  h->st = st;
  double stale_s = fmax(HEALTH_MIN_S, HEALTH_INTERVALS * monitor_interval_s);
  h->stale_ns = stale_s >= 9e9 ? INT64_MAX : (int64_t)(stale_s * 1e9);

  int fd = bind_host(host, port, err, cap);
  if (fd < 0) {
    free(h);
    return NULL;
  }
  struct sockaddr_storage ss;
  socklen_t sl = sizeof ss;
  if (getsockname(fd, (struct sockaddr *)&ss, &sl) != 0) {
    snprintf(err, cap, "HTTP server: getsockname on the listening socket failed: %s",
             strerror(errno));
    close(fd);
    free(h);
    return NULL;
  }
  h->port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                           : ((struct sockaddr_in *)&ss)->sin_port);

  /* The soft descriptor limit up to the hard one (slow clients each hold a socket), then half of
   * it for connections, the other half kept for the agent itself (store, worker pipes). */
  unsigned limit = CONN_LIMIT_MAX;
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
    if (rl.rlim_cur != rl.rlim_max) {
      struct rlimit raised = {rl.rlim_max, rl.rlim_max};
      if (setrlimit(RLIMIT_NOFILE, &raised) == 0) rl = raised;
    }
    if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur / 2 < limit)
      limit = rl.rlim_cur / 2 > 16 ? (unsigned)(rl.rlim_cur / 2) : 16;
  }
  h->limit = limit;
  pthread_mutex_init(&h->mu, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&h->cv, &ca);
  pthread_condattr_destroy(&ca);

  unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG;
  flags |= MHD_is_feature_supported(MHD_FEATURE_EPOLL) == MHD_YES ? MHD_USE_EPOLL : MHD_USE_POLL;
  if (ss.ss_family == AF_INET6) flags |= MHD_USE_IPv6;
  h->daemon = MHD_start_daemon(flags, 0, accept_policy, h, handle, h, MHD_OPTION_EXTERNAL_LOGGER,
                               mhd_log, (void *)NULL, MHD_OPTION_LISTEN_SOCKET, (MHD_socket)fd,
                               MHD_OPTION_CONNECTION_LIMIT, limit + CONN_LIMIT_SPARE,
                               MHD_OPTION_CONNECTION_TIMEOUT, CONN_TIMEOUT_S,
                               MHD_OPTION_NOTIFY_CONNECTION, notify_connection, h,
                               MHD_OPTION_NOTIFY_COMPLETED, request_completed, h, MHD_OPTION_END);
  int rc = h->daemon ? pthread_create(&h->reaper, NULL, reaper_main, h) : 0;
  if (h->daemon && rc != 0) {
    snprintf(err, cap, "HTTP server: starting the header-deadline thread failed: %s", strerror(rc));
    MHD_stop_daemon(h->daemon);
    pthread_cond_destroy(&h->cv);
    pthread_mutex_destroy(&h->mu);
    free(h);
    return NULL;
  }
  h->reaper_started = h->daemon != NULL;
  if (!h->daemon) {
    char where[INET6_ADDRSTRLEN + 16];
    fmt_addr((struct sockaddr *)&ss, h->port, where, sizeof where);
    snprintf(err, cap,
             "HTTP server: libmicrohttpd failed to start on %s (%s; see its log line above)", where,
             errno ? strerror(errno) : "no error code");
    /* Whether MHD already closed a socket it was handed differs between versions; leaking one
     * descriptor on a path where the agent exits is safer than closing one twice. */
    pthread_cond_destroy(&h->cv);
    pthread_mutex_destroy(&h->mu);
    free(h);
    return NULL;
  }
  AGENT_DEBUG("http server listening on port %d", h->port);
  return h;
}

int agent_http_port(const agent_http_t *h) { return h ? h->port : -1; }

void agent_http_stop(agent_http_t *h) {
  if (!h) return;
  if (h->reaper_started) {
    pthread_mutex_lock(&h->mu);
    h->stopping = 1;
    pthread_cond_signal(&h->cv);
    pthread_mutex_unlock(&h->mu);
    pthread_join(h->reaper, NULL);
  }
  /* Joins the server thread and closes the listening socket and every connection. */
  MHD_stop_daemon(h->daemon);
  pthread_cond_destroy(&h->cv);
  pthread_mutex_destroy(&h->mu);
  free(h);
}
