/* The raw-socket client of the TCPStore server tests (server_ops_test.c, server_stream_test.c,
 * server_limits_test.c): connections in either dialect, an encoder and reader per op written from
 * the PyTorch reference (shared/reference/torch-contracts.md §1.2), replies checked byte for
 * byte, and the server under test with its stats. Every read has a deadline (IO_TIMEOUT_MS); a
 * failure prints what was expected and exits 1. */
#ifndef TDIST_TESTS_STORE_SERVER_WIRE_H
#define TDIST_TESTS_STORE_SERVER_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "tdist/tdist.h"
#include "wire_enc.h"

#define IO_TIMEOUT_MS \
  30000 /* a hang, not a slow server: TSan on a loaded 2-core machine took over 5 s */

typedef struct {
  int fd;
  int v2; /* 1 = 2.x dialect, 0 = 1.13 */
  char name[32];
} conn_t;
int raw_connect(int family, int port);
void send_raw(conn_t *c, const void *p, size_t n);

/* Opens a connection; a 2.x one sends VALIDATE first, as every 2.x client does. */
conn_t conn_open(int port, int v2, const char *name);
void conn_close(conn_t *c);

/* 0: got n bytes; 1: closed/reset first; 2: timed out. */
int read_full(int fd, void *buf, size_t n, int timeout_ms);
void rd(conn_t *c, void *buf, size_t n, const char *what);
uint64_t rd_u64(conn_t *c, const char *what);
uint8_t rd_u8(conn_t *c, const char *what);

/* u64 length + bytes; returns malloc'd (NUL-terminated for convenience). */
uint8_t *rd_bytes(conn_t *c, size_t *len, const char *what);

/* Nothing may arrive for ms. */
void expect_silent(conn_t *c, int ms, const char *why);

/* The server must close the connection (EOF or reset) without sending anything. */
void expect_closed(conn_t *c, const char *why);

/* ---- request encoder: tests/testlib/wire_enc.h ---- */
void m_op(enc_t *m, const conn_t *c, int op);
void m_send(conn_t *c, enc_t *m);

/* ---- one call per op ---- */
void r_set(conn_t *c, const char *key, const void *v, size_t n);
void r_sets(conn_t *c, const char *key, const char *v);
uint8_t *r_get(conn_t *c, const char *key, size_t *len);
void expect_get(conn_t *c, const char *key, const void *v, size_t n);
void expect_gets(conn_t *c, const char *key, const char *v);
int64_t r_add(conn_t *c, const char *key, int64_t delta);
void expect_cas(conn_t *c, const char *key, const char *exp, const char *des, const char *want);
void m_keys(enc_t *m, const char *const *keys, size_t n);
uint8_t r_check(conn_t *c, const char *const *keys, size_t n);
void send_wait(conn_t *c, const char *const *keys, size_t n);
void expect_byte(conn_t *c, uint8_t want, const char *what);
int64_t r_numkeys(conn_t *c);
int64_t r_delete(conn_t *c, const char *key);
void r_append(conn_t *c, const char *key, const char *v);
void r_mset(conn_t *c, const char *const *keys, const char *const *vals, size_t n);
void expect_mget(conn_t *c, const char *const *keys, const char *const *vals, size_t n);
void expect_ping(conn_t *c, uint32_t nonce);

/* A round trip that proves every earlier request of c was executed. */
void sync_conn(conn_t *c);
void r_qpush(conn_t *c, const char *key, const char *v);
int64_t r_qlen(conn_t *c, const char *key);

/* Pops; want == NULL means the queue must be empty. */
void expect_qpop(conn_t *c, const char *key, int64_t want_len, const char *want);

/* ---- server ---- */
typedef struct {
  size_t max_key, max_value, max_multi, max_conn;
} limits_t;
tdist_store_server_t *start_server(const limits_t *lim);
tdist_store_server_stats_t stats(tdist_store_server_t *s);

/* Polls a stats field until it equals want (the loop thread updates it asynchronously). */
#define STAT_OFF(field) offsetof(tdist_store_server_stats_t, field)

void wait_stat(tdist_store_server_t *s, size_t off, const char *name, uint64_t want);

#define WAIT_STAT(s, field, want) wait_stat((s), STAT_OFF(field), #field, (uint64_t)(want))

void exchange(conn_t *c, const char *req_hex, const char *reply_hex);
conn_t conn_open_family(int family, int port, int v2, const char *name, int *err);

/* Rotating key buffers: K("x") gives "/<prefix>/x" for the running suite. */
extern const char *key_prefix;

const char *K(const char *name);

/* Sends one raw opcode byte (+ padding) on a fresh connection; the server must close it. */
void expect_op_closes(int port, int v2, uint8_t opcode, const char *why);

/* A connection that said nothing so far is still open, was sent nothing, and is answered when it
 * finally speaks (the server holds keys by then). */
void expect_idle_usable(conn_t *idle);

#endif
