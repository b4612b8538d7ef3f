/* Shared by the TCP store client tests (client_model_test.c, client_timeout_test.c,
 * client_connect_test.c): our server on an ephemeral port, connecting in a given dialect, reads
 * checked against expected values, and a check that a handle's connection is still in step after
 * a failure. A failed check prints what differs and exits 1 (tests/testlib/check.h). */
#ifndef TDIST_TESTS_STORE_CLIENT_TESTLIB_H
#define TDIST_TESTS_STORE_CLIENT_TESTLIB_H

#include <stddef.h>
#include <netinet/in.h>
#include <stdint.h>

#include "tdist/tdist.h"

/* malloc that fails the test on NULL (n may be 0). */
void *xmalloc(size_t n);
const char *dialect_name(tdist_store_dialect_t d);
/* Our server on 127.0.0.1, an ephemeral port, quiet. */
tdist_store_server_t *start_server(void);
/* A client in `dialect` (AUTO must settle on V2) with the given call timeout. */
tdist_store_t *connect_store(int port, tdist_store_dialect_t dialect, int64_t timeout_ms);
/* A TCP socket bound to 127.0.0.1 on an ephemeral port, which *a receives. */
int loopback_socket(struct sockaddr_in *a);
/* A port where nothing listens: bind an ephemeral one, read it back, close it. */
/* get(key) succeeds (clearing the handle's detail) with exactly these bytes. */
void expect_get(tdist_store_t *s, const char *key, const void *want, size_t want_len);
void expect_get_str(tdist_store_t *s, const char *key, const char *want);
/* check([key]) says want (1 present, 0 absent). */
void expect_ready(tdist_store_t *s, const char *key, int want);
/* A timeout took about `want_ms`: not early, and not absurdly late (2 loaded cores, sanitizers). */
void check_elapsed(int64_t elapsed, int64_t want_ms);
/* After a timeout on `a`, the keys it waited for appear (a server that still held the wait would
 * now send a stray STOP_WAITING on a's connection); a's next answers must still be right. */
void check_in_step(tdist_store_t *a, tdist_store_t *b, const char *tag);

#endif
