/* Key-value stores for bootstrap: a TCPStore server and client that speak PyTorch's c10d wire
 * protocol (both the 1.13 and the 2.x dialect), a prefix wrapper and an in-memory store.
 *
 * Keys are NUL-terminated strings; values are byte arrays with explicit lengths. Values returned
 * to the caller are heap memory owned by the caller: release them with tdist_free().
 *
 * Thread safety: a tdist_store_t handle is used by one thread at a time (the TCP client holds one
 * connection and answers arrive in order). Use one handle per thread. The in-memory store is the
 * exception: it is fully thread safe. The server runs its own thread; its functions may be called
 * from any thread. */
#ifndef TDIST_STORE_H
#define TDIST_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "tdist/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------------------------ */
/* Server                                                                                      */
/* ------------------------------------------------------------------------------------------ */

typedef struct tdist_store_server_s tdist_store_server_t;

typedef struct {
  size_t size;            /* sizeof(tdist_store_server_options_t) */
  int version;            /* 2 (1 = without the memory budgets) */
  const char *host;       /* address to bind; NULL or "" = "::" dual stack (IPv4 too) */
  int port;               /* 0 = ephemeral; read it back with tdist_store_server_port() */
  int backlog;            /* 0 = /proc/sys/net/core/somaxconn */
  size_t max_key_bytes;   /* default 8 KiB; a longer key closes that connection */
  size_t max_value_bytes; /* default 64 MiB; a larger value closes that connection. One whole
                           * request (a MULTI_SET of many values) may carry at most
                           * 2 * max_value_bytes + 64 MiB. */
  size_t max_multi_keys;  /* default 131072 keys per CHECK/WAIT/MULTI_GET/MULTI_SET */
  size_t max_connections; /* default 1048576; connections past it are accepted and closed at
                           * once. A client a store proxy carries counts as one (a job of
                           * 100,000 ranks behind proxies holds 100,000 plus one per node) */
  int quiet;              /* 1 = no log lines on stderr (tests that provoke errors on purpose) */
  /* Version 2. Memory budgets; 0 = the default. A connection's bytes are its input buffer, its
   * queued replies and its pending WAITs; a connection whose bytes would pass
   * max_connection_bytes is closed with a log line (the server and the other connections go
   * on). When a connection's growth would take the sum over all connections past
   * max_server_bytes, the connection holding the most is closed (the asker, if it is that one).
   * A reply (MULTI_GET) is sized before it is built: one larger than the budget closes the
   * connection. The key/value map itself is not counted. */
  size_t max_connection_bytes; /* default 2 * max_value_bytes + 128 MiB: any legal request plus
                                * 64 MiB of replies and WAITs */
  size_t max_server_bytes;     /* default 1 GiB, at least max_connection_bytes */
} tdist_store_server_options_t;

#define TDIST_STORE_SERVER_OPTIONS_INIT                                                           \
  {                                                                                               \
    sizeof(tdist_store_server_options_t), 2, NULL, 0, 0, 8192, (size_t)64 << 20, 131072, 1048576, \
        0, 0, 0                                                                                   \
  }

/* Counters a server exposes (for /metrics). Read with tdist_store_server_stats(). */
typedef struct {
  uint64_t requests_total;      /* requests executed */
  uint64_t connections_total;   /* connections accepted */
  uint64_t connections_open;    /* open now */
  uint64_t connections_dropped; /* closed by the server for a protocol error or a limit */
  uint64_t keys;                /* keys in the map now (GETNUMKEYS) */
  uint64_t waits_pending;       /* WAIT requests not yet answered */
} tdist_store_server_stats_t;

/* Binds, listens and starts the server thread. On success *out is the running server.
 * On failure returns the status and tdist_last_error() names the address and errno text.
 * Blocking: returns once the socket listens. */
TDIST_EXTERN tdist_status_t tdist_store_server_create(const tdist_store_server_options_t *opts,
                                                      tdist_store_server_t **out);

/* The port the server listens on (the real one when 0 was asked for). */
TDIST_EXTERN int tdist_store_server_port(const tdist_store_server_t *server);

/* A snapshot of the counters. Any thread. */
TDIST_EXTERN void tdist_store_server_stats(tdist_store_server_t *server,
                                           tdist_store_server_stats_t *out);

/* Stops the thread, closes every connection and frees everything. NULL is a no-op. */
TDIST_EXTERN void tdist_store_server_destroy(tdist_store_server_t *server);

/* ------------------------------------------------------------------------------------------ */
/* Proxy                                                                                       */
/* ------------------------------------------------------------------------------------------ */

/* A store proxy: the clients of one node (its workers, PyTorch's or ours) connect to it as to
 * the job's store, and it carries all of them to the store server over one connection, so the
 * server holds one connection per node instead of one per rank. Every request still runs on the
 * server, as on a connection of its own: the semantics, the 1.13 and 2.x dialects, WAITs and
 * errors are the server's (its log names a client as "<proxy> proxy client <id>"). The upstream
 * must be a tdist store server; PyTorch's does not speak the proxy's protocol and create() says
 * so. When the upstream connection is lost, the proxy closes its clients and its listening
 * socket (a client then sees the store go away, as without the proxy). One thread. */
typedef struct tdist_store_proxy_s tdist_store_proxy_t;

typedef struct {
  size_t size;               /* sizeof(tdist_store_proxy_options_t) */
  int version;               /* 1 */
  const char *upstream_host; /* the job's tdist store server (required) */
  int upstream_port;         /* 1..65535 (required) */
  const char *host;          /* address clients connect to; NULL or "" = 127.0.0.1 */
  int port;                  /* 0 = ephemeral; read it back with tdist_store_proxy_port() */
  int instances;             /* default 1. N independent proxies on the one thread, each with its
                              * own listening port and upstream connection: N nodes' proxies in
                              * one process, for benchmarks that emulate many nodes */
  int connect_timeout_ms;    /* connect + hello with the upstream; default 30000 */
  int quiet;                 /* 1 = no log lines on stderr */
} tdist_store_proxy_options_t;

#define TDIST_STORE_PROXY_OPTIONS_INIT \
  { sizeof(tdist_store_proxy_options_t), 1, NULL, 0, NULL, 0, 1, 30000, 0 }

typedef struct {
  uint64_t clients_total;        /* clients accepted */
  uint64_t clients_open;         /* clients connected now */
  uint64_t upstreams_lost;       /* instances whose upstream connection was lost */
  uint64_t bytes_up, bytes_down; /* client bytes carried to and from the server */
} tdist_store_proxy_stats_t;

/* Connects every instance to the upstream (retrying until connect_timeout_ms while it refuses),
 * checks that it is a tdist store server, listens, and starts the proxy's thread. */
TDIST_EXTERN tdist_status_t tdist_store_proxy_create(const tdist_store_proxy_options_t *opts,
                                                     tdist_store_proxy_t **out);
/* The port instance i (0..instances-1) listens on; -1 for a bad proxy or index. */
TDIST_EXTERN int tdist_store_proxy_port(const tdist_store_proxy_t *proxy, int instance);
TDIST_EXTERN void tdist_store_proxy_stats(tdist_store_proxy_t *proxy,
                                          tdist_store_proxy_stats_t *out);
/* Stops the thread and closes every connection. NULL is a no-op. */
TDIST_EXTERN void tdist_store_proxy_destroy(tdist_store_proxy_t *proxy);

/* ------------------------------------------------------------------------------------------ */
/* Clients                                                                                     */
/* ------------------------------------------------------------------------------------------ */

typedef struct tdist_store_s tdist_store_t;

typedef enum {
  TDIST_STORE_DIALECT_AUTO =
      0,                      /* try 2.x (VALIDATE+PING); fall back to 1.13 if the server resets */
  TDIST_STORE_DIALECT_V2 = 1, /* PyTorch 2.x: VALIDATE, PING, CANCEL_WAIT, APPEND, MULTI_*, ... */
  TDIST_STORE_DIALECT_V1_13 = 2 /* PyTorch 1.13: no cancel, no append/multi ops */
} tdist_store_dialect_t;

typedef struct {
  size_t size;                   /* sizeof(tdist_tcp_store_options_t) */
  int version;                   /* 1 */
  const char *host;              /* server name or address (required) */
  int port;                      /* server port (required, 1..65535) */
  int64_t connect_timeout_ms;    /* retry connecting (backoff + jitter) this long; default 60000 */
  int64_t timeout_ms;            /* default deadline of every call; default 300000 (PyTorch's) */
  tdist_store_dialect_t dialect; /* default AUTO */
} tdist_tcp_store_options_t;

#define TDIST_TCP_STORE_OPTIONS_INIT \
  { sizeof(tdist_tcp_store_options_t), 1, NULL, 0, 60000, 300000, TDIST_STORE_DIALECT_AUTO }

/* Connects to a TCPStore server (ours or PyTorch's). Like PyTorch's client, every key is sent with
 * a leading "/", so keys written here and by a Python `TCPStore` with the same name match.
 * Retries refused/reset/unreachable connects with exponential backoff and jitter until
 * connect_timeout_ms. On failure tdist_last_error() names host:port and the last errno. */
TDIST_EXTERN tdist_status_t tdist_tcp_store_connect(const tdist_tcp_store_options_t *opts,
                                                    tdist_store_t **out);

/* The dialect a TCP store client ended up speaking (V2 or V1_13); AUTO for other stores. */
TDIST_EXTERN tdist_store_dialect_t tdist_tcp_store_dialect(const tdist_store_t *store);

/* A thread-safe store in this process's memory, with the same semantics as the server. */
TDIST_EXTERN tdist_status_t tdist_memory_store_create(tdist_store_t **out);

/* A store in a file that every process opens (file:// init): an append-only log under flock,
 * polled by waits. For bootstrap on one host or a shared filesystem; no queues (NOT_AVAILABLE).
 * The file is not removed on destroy. timeout_ms <= 0: 300000. */
TDIST_EXTERN tdist_status_t tdist_file_store_create(const char *path, int64_t timeout_ms,
                                                    tdist_store_t **out);

/* PyTorch's PrefixStore: every key becomes prefix + "/" + key before reaching `inner`.
 * `inner` is borrowed and must outlive the prefix store. */
TDIST_EXTERN tdist_status_t tdist_prefix_store_create(tdist_store_t *inner, const char *prefix,
                                                      tdist_store_t **out);

/* A store whose operations are the caller's functions: how a language binding hands libtdist a
 * store it already holds (the PyTorch backend passes torch's own Store). Each function returns
 * TDIST_OK or a tdist status, hands values back with tdist_store_reply_value and may give its
 * error text with tdist_store_reply_error (the handle's last error then reads
 * "callback store: OP: TEXT"). get and wait block until every key exists or timeout_ms passes
 * (then TDIST_ERR_TIMEOUT), as in PyTorch. A function is called on the thread using the handle.
 * set, get and wait are required; a NULL other function makes that operation NOT_AVAILABLE, and
 * so are append and queues. multi_get is wait + get, multi_set one set per key. destroy (may be
 * NULL) is called once by tdist_store_destroy. */
typedef struct tdist_store_reply_s tdist_store_reply_t;
typedef struct {
  size_t size; /* sizeof(tdist_store_callbacks_t) */
  int version; /* 1 */
  void *ctx;   /* passed to every function */
  tdist_status_t (*set)(void *ctx, const char *key, const void *value, size_t len,
                        tdist_store_reply_t *reply);
  tdist_status_t (*get)(void *ctx, const char *key, int64_t timeout_ms, tdist_store_reply_t *reply);
  tdist_status_t (*add)(void *ctx, const char *key, int64_t delta, int64_t *result,
                        tdist_store_reply_t *reply);
  tdist_status_t (*wait)(void *ctx, const char *const *keys, size_t n, int64_t timeout_ms,
                         tdist_store_reply_t *reply);
  tdist_status_t (*check)(void *ctx, const char *const *keys, size_t n, int *ready,
                          tdist_store_reply_t *reply);
  tdist_status_t (*delete_key)(void *ctx, const char *key, int *deleted,
                               tdist_store_reply_t *reply);
  tdist_status_t (*num_keys)(void *ctx, int64_t *n, tdist_store_reply_t *reply);
  /* Hands back the value the key holds after the call (PyTorch's compare_set). */
  tdist_status_t (*compare_set)(void *ctx, const char *key, const void *expected, size_t elen,
                                const void *desired, size_t dlen, tdist_store_reply_t *reply);
  void (*destroy)(void *ctx);
} tdist_store_callbacks_t;

#define TDIST_STORE_CALLBACKS_INIT \
  { sizeof(tdist_store_callbacks_t), 1, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL }

/* timeout_ms <= 0: 300000 (the handle's default deadline, as for the other stores). */
TDIST_EXTERN tdist_status_t tdist_callback_store_create(const tdist_store_callbacks_t *callbacks,
                                                        int64_t timeout_ms, tdist_store_t **out);
/* From inside a callback: the value of a get or compare_set (copied). */
TDIST_EXTERN tdist_status_t tdist_store_reply_value(tdist_store_reply_t *reply, const void *data,
                                                    size_t len);
/* From inside a callback: the text of the failure it returns (copied, truncated to 511 bytes). */
TDIST_EXTERN void tdist_store_reply_error(tdist_store_reply_t *reply, const char *message);

/* Closes connections and frees the handle. NULL is a no-op. */
TDIST_EXTERN void tdist_store_destroy(tdist_store_t *store);

/* Detail of the handle's last failure ("wait timed out after 1000 ms for keys /a, /b on
 * 127.0.0.1:29500"). Empty if the last call succeeded. Valid until the next call on the handle. */
TDIST_EXTERN const char *tdist_store_last_error(const tdist_store_t *store);

/* Default deadline of every later call on this handle, > 0. Like PyTorch's PrefixStore, a prefix
 * store has no timeout of its own: it reads and sets the timeout of the store it wraps. */
TDIST_EXTERN tdist_status_t tdist_store_set_timeout(tdist_store_t *store, int64_t timeout_ms);
TDIST_EXTERN int64_t tdist_store_timeout(const tdist_store_t *store);

/* Every call below blocks at most the handle's timeout; a timeout never leaves the connection out
 * of step with the server (2.x: CANCEL_WAIT; 1.13 or mid-reply: the connection is dropped and
 * re-established on the next call). */

TDIST_EXTERN tdist_status_t tdist_store_set(tdist_store_t *s, const char *key, const void *value,
                                            size_t len);

/* Waits until `key` exists (up to the timeout), then returns a copy of its value. */
TDIST_EXTERN tdist_status_t tdist_store_get(tdist_store_t *s, const char *key, void **value,
                                            size_t *len);

/* Adds delta to the integer stored as decimal text under key (missing = 0); *result (may be NULL)
 * gets the new value. A value that is not an integer: TDIST_ERR_INVALID_USAGE (the server drops
 * that connection, as PyTorch's does; the client reconnects on the next call). */
TDIST_EXTERN tdist_status_t tdist_store_add(tdist_store_t *s, const char *key, int64_t delta,
                                            int64_t *result);

/* PyTorch's compare_set: if the key is missing and expected is empty, or the current value equals
 * expected, the value becomes desired. *out gets the resulting current value (for a missing key
 * with a non-empty expected: expected, and nothing is stored). */
TDIST_EXTERN tdist_status_t tdist_store_compare_set(tdist_store_t *s, const char *key,
                                                    const void *expected, size_t expected_len,
                                                    const void *desired, size_t desired_len,
                                                    void **out, size_t *out_len);

/* *ready = 1 if every key exists now, else 0. Does not wait. */
TDIST_EXTERN tdist_status_t tdist_store_check(tdist_store_t *s, const char *const *keys, size_t n,
                                              int *ready);

/* Waits until every key exists. timeout_ms < 0: the handle's timeout. */
TDIST_EXTERN tdist_status_t tdist_store_wait(tdist_store_t *s, const char *const *keys, size_t n,
                                             int64_t timeout_ms);

/* *deleted (may be NULL) = 1 if the key existed. */
TDIST_EXTERN tdist_status_t tdist_store_delete_key(tdist_store_t *s, const char *key, int *deleted);

/* Number of keys in the whole store (all prefixes, PyTorch's `init/` too). */
TDIST_EXTERN tdist_status_t tdist_store_num_keys(tdist_store_t *s, int64_t *n);

/* Appends to the value (creating it). Needs the 2.x dialect: NOT_AVAILABLE on a 1.13 server. */
TDIST_EXTERN tdist_status_t tdist_store_append(tdist_store_t *s, const char *key, const void *data,
                                               size_t len);

/* Waits until every key exists, then returns copies of all values (values[i], lens[i]; free each
 * with tdist_free). On a 1.13 server it is emulated with WAIT + n GETs. */
TDIST_EXTERN tdist_status_t tdist_store_multi_get(tdist_store_t *s, const char *const *keys,
                                                  size_t n, void **values, size_t *lens);

/* Sets every pair in one request (emulated with n SETs on a 1.13 server). */
TDIST_EXTERN tdist_status_t tdist_store_multi_set(tdist_store_t *s, const char *const *keys,
                                                  const void *const *values, const size_t *lens,
                                                  size_t n);

/* Queues (PyTorch post-2.6): push wakes one waiting pop. pop with timeout_ms == 0 does not
 * wait and returns TDIST_ERR_NOT_FOUND on an empty queue; < 0 waits the handle's timeout.
 * A server without queues (PyTorch 1.13 and 2.6) gets TDIST_ERR_NOT_AVAILABLE at once, push and
 * blocking pop included; on a 2.x connection the first queue call finds out with one QUEUE_LEN
 * round trip (PyTorch 2.6's server hangs up on it; the client reconnects). */
TDIST_EXTERN tdist_status_t tdist_store_queue_push(tdist_store_t *s, const char *key,
                                                   const void *value, size_t len);
TDIST_EXTERN tdist_status_t tdist_store_queue_pop(tdist_store_t *s, const char *key,
                                                  int64_t timeout_ms, void **value, size_t *len);
TDIST_EXTERN tdist_status_t tdist_store_queue_len(tdist_store_t *s, const char *key, int64_t *len);

#ifdef __cplusplus
}
#endif
#endif
