/* The store server's listening socket and log helpers. */
#ifndef TDIST_STORE_SERVER_LISTEN_H
#define TDIST_STORE_SERVER_LISTEN_H

#include <stddef.h>
#include <stdint.h>

/* Printable, bounded rendering of a key for log lines. */
void tdist__store_key_str(const uint8_t *k, size_t n, char *buf, size_t cap);

/* /proc/sys/net/core/somaxconn, or 4096. */
int tdist__store_somaxconn(void);

/* Binds and listens. Returns the fd or -errno; *where gets the address tried. */
int tdist__store_listen(const char *host, int port, int backlog, char *where, size_t wcap);

#endif
