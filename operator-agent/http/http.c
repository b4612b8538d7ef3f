/* The agent's HTTP server (see http.h): libmicrohttpd with one internal polling thread (epoll
 * where the library has it, else poll) that answers every request itself. The handlers only
 * render from agent_state_t, so a request never blocks on the network, peers or the store.
 *
 * We create the listening socket ourselves rather than letting MHD bind, so that a failure names
 * the exact syscall, errno text and address, and so "all addresses" can fall back to IPv4 where
 * the kernel has no IPv6. The socket is CLOEXEC: workers forked by the agent never inherit it.
 *
 * Slow or idle clients (slowloris) cannot starve the probes: an idle connection costs one fd and
 * an epoll entry, not a thread; MHD closes a connection after CONN_TIMEOUT_S of inactivity and
 * caps each at its memory pool (headers past it are rejected); the connection cap leaves room in
 * RLIMIT_NOFILE. There is deliberately no per-IP limit: the kubelet's probes and Prometheus
 * may share an address with other clients (and do in tests, 127.0.0.1). */
#define _GNU_SOURCE
#include "operator-agent/http/http.h"

#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
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
#define CONN_LIMIT_MAX 512u
#define HEALTH_MIN_S 10.0
#define HEALTH_INTERVALS 20.0

#define CT_TEXT "text/plain; charset=utf-8"
#define CT_METRICS "text/plain; version=0.0.4; charset=utf-8"
#define CT_JSON "application/json"
#define CT_HTML "text/html; charset=utf-8"

struct agent_http_s {
  struct MHD_Daemon *daemon;
  agent_state_t *st;
  int port;
  int64_t stale_ns; /* /healthz fails once the last loop tick is older than this */
};

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

static const char kNotAllowed[] = "method not allowed; use GET or HEAD\n";

static const char kIndex[] =
    "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>tdist-agent</title></head>\n"
    "<body><h1>tdist-agent</h1><ul>\n"
    "<li><a href=\"/metrics\">/metrics</a> Prometheus metrics</li>\n"
    "<li><a href=\"/status\">/status</a> state, members and workers (JSON)</li>\n"
    "<li><a href=\"/healthz\">/healthz</a> liveness</li>\n"
    "<li><a href=\"/readyz\">/readyz</a> readiness</li>\n"
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
  enum { P_NONE, P_HEALTHZ, P_READYZ, P_METRICS, P_STATUS, P_INDEX } path = P_NONE;
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

  if (path == P_NONE)
    return reply_static(c, MHD_HTTP_NOT_FOUND, CT_TEXT,
                        "not found; the agent serves /healthz /readyz /metrics /status /\n");
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
    default: break;
  }
  return MHD_NO;
}

static void mhd_log(void *cls, const char *fmt, va_list ap) __attribute__((format(printf, 2, 0)));
static void mhd_log(void *cls, const char *fmt, va_list ap) {
  char msg[512];
  vsnprintf(msg, sizeof msg, fmt, ap);
  size_t n = strlen(msg);
  while (n && (msg[n - 1] == '\n' || msg[n - 1] == '\r')) msg[--n] = '\0';
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

  /* Keep half of the descriptor limit for the agent itself (store, worker pipes). */
  unsigned limit = CONN_LIMIT_MAX;
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur / 2 < limit)
    limit = rl.rlim_cur / 2 > 16 ? (unsigned)(rl.rlim_cur / 2) : 16;

  unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG;
  flags |= MHD_is_feature_supported(MHD_FEATURE_EPOLL) == MHD_YES ? MHD_USE_EPOLL : MHD_USE_POLL;
  if (ss.ss_family == AF_INET6) flags |= MHD_USE_IPv6;
  h->daemon = MHD_start_daemon(flags, 0, NULL, NULL, handle, h, MHD_OPTION_EXTERNAL_LOGGER, mhd_log,
                               (void *)NULL, MHD_OPTION_LISTEN_SOCKET, (MHD_socket)fd,
                               MHD_OPTION_CONNECTION_LIMIT, limit, MHD_OPTION_CONNECTION_TIMEOUT,
                               CONN_TIMEOUT_S, MHD_OPTION_END);
  if (!h->daemon) {
    char where[INET6_ADDRSTRLEN + 16];
    fmt_addr((struct sockaddr *)&ss, h->port, where, sizeof where);
    snprintf(err, cap,
             "HTTP server: libmicrohttpd failed to start on %s (%s; see its log line above)", where,
             errno ? strerror(errno) : "no error code");
    /* Whether MHD already closed a socket it was handed differs between versions; leaking one
     * descriptor on a path where the agent exits is safer than closing one twice. */
    free(h);
    return NULL;
  }
  AGENT_DEBUG("http server listening on port %d", h->port);
  return h;
}

int agent_http_port(const agent_http_t *h) { return h ? h->port : -1; }

void agent_http_stop(agent_http_t *h) {
  if (!h) return;
  /* Joins the server thread and closes the listening socket and every connection. */
  MHD_stop_daemon(h->daemon);
  free(h);
}
