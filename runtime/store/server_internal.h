/* What the store server's files share (server.c: the loop, requests and the public API;
 * server_conn.c: connections, budgets and replies; server_wait.c: WAITs). Everything here is
 * touched by the loop thread only, but the stats atomics. Internal: not installed. */
#ifndef TDIST_RUNTIME_STORE_SERVER_INTERNAL_H
#define TDIST_RUNTIME_STORE_SERVER_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "runtime/store/kv.h"
#include "runtime/store/proto.h"
#include "tdist/store.h"

#define SERVER_MAGIC 0x7d57a5e1u
#define IN_CHUNK (64 * 1024)
#define IN_KEEP_MAX (256 * 1024) /* a connection with a partial request keeps at most this */
#define OUT_KEEP_MAX (16 * 1024) /* a drained reply buffer larger than this is freed */
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
  /* Multiplexing (server_mux.c): a proxy's connection carries its clients' connections, each a
   * conn_t of its own with fd -1 whose input comes from and whose replies go to the proxy's. */
  int mux;                  /* a proxy's connection: its input after the hello is frames */
  conn_t **subs;            /* its clients by id (subs_cap slots) */
  uint32_t subs_cap, nsubs; /* slots, clients open */
  conn_t *parent;           /* a client's connection: the proxy's connection carrying it */
  uint32_t mux_id;
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

/* A key's waiters, oldest first (entry->waiters points to one of these while non-empty). */
typedef struct {
  waitlink_t *head, *tail;
} waitq_t;

/* server_conn.c */
void tdist__srv_mark_flush(tdist_store_server_t *s, conn_t *c);
/* Would the connection, grown by `more` bytes, stay within both budgets? If not, queues it (or the
 * connection holding the most) for close with a log line naming the budget, and returns 0. */
int tdist__srv_budget_ok(tdist_store_server_t *s, conn_t *c, size_t more, const char *what);
/* Charges the connection's current size to the server total. */
void tdist__srv_charge(tdist_store_server_t *s, conn_t *c);
uint8_t *tdist__srv_out_reserve(tdist_store_server_t *s, conn_t *c, size_t n);
void tdist__srv_put_u8(tdist_store_server_t *s, conn_t *c, uint8_t v);
void tdist__srv_put_i64(tdist_store_server_t *s, conn_t *c, int64_t v);
void tdist__srv_put_bytes(tdist_store_server_t *s, conn_t *c, const void *d, size_t n);
/* Queues the connection for close at the end of the loop turn; `why` non-empty: log it. */
void tdist__srv_close_later(tdist_store_server_t *s, conn_t *c, const char *why);
void tdist__srv_conn_free(tdist_store_server_t *s, conn_t *c);
void tdist__srv_update_events(tdist_store_server_t *s, conn_t *c);
void tdist__srv_flush_all(tdist_store_server_t *s);
void tdist__srv_close_all_pending(tdist_store_server_t *s);

/* server_wait.c */
/* Registers (the next share of) a WAIT's keys: 0 done, 1 more keys left for a later turn, -ENOMEM.
 */
int tdist__srv_do_wait(tdist_store_server_t *s, conn_t *c, const tdist__request_t *req);
/* Detaches a pending WAIT from its connection into the graveyard (no reply is sent for it). */
void tdist__srv_wait_bury(tdist_store_server_t *s, wait_t *w);
/* Unlinks at most `budget` links of buried WAITs (SIZE_MAX: all) and frees the WAITs done with. */
void tdist__srv_reap_graves(tdist_store_server_t *s, size_t budget);
/* A key gained a value: every WAIT on it counts one key fewer. */
void tdist__srv_wake_all(tdist_store_server_t *s, tdist__kv_entry_t *e);
/* A queue gained an item: only the oldest waiter is released (PyTorch's QUEUE_PUSH). */
void tdist__srv_wake_one(tdist_store_server_t *s, tdist__kv_entry_t *e);

/* server_mux.c */
/* The hello at the head of a new connection's input (c->in[0] is its first byte): consumes it
 * and answers it; 1 done (c->mux set), 0 more bytes needed, -1 not a hello (parse as PyTorch). */
int tdist__srv_mux_hello(tdist_store_server_t *s, conn_t *c);
/* Runs the frames buffered on a proxy's connection. */
void tdist__srv_mux_input(tdist_store_server_t *s, conn_t *c);
/* Moves a client connection's replies into its proxy's output as DATA frames. */
void tdist__srv_mux_flush(tdist_store_server_t *s, conn_t *sub);
/* A proxy's connection closes: so do its clients. */
void tdist__srv_mux_close_subs(tdist_store_server_t *s, conn_t *c);
/* Before freeing c: a client leaves its proxy's table (and the proxy is told, with c's reason,
 * unless it closes too); a proxy's clients forget it. */
void tdist__srv_mux_unlink(tdist_store_server_t *s, conn_t *c);

/* server.c */
/* Parses and executes the whole requests buffered on the connection (a share per turn). */
void tdist__srv_process_input(tdist_store_server_t *s, conn_t *c);

#endif
