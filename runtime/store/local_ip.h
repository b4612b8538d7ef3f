/* The one thing a backend asks a store about its connection, kept apart from store_internal.h so
 * that the gloo transport needs no store internals. */
#ifndef TDIST_STORE_LOCAL_IP_H
#define TDIST_STORE_LOCAL_IP_H

#include <stddef.h>

#include "tdist/store.h"

/* The local IPv4 address of a TCP store client's connection (unwrapping prefix stores), for
 * choosing the interface peers can reach us on. 0 on success, -1 for other stores. */
int tdist__store_local_ip(tdist_store_t *s, char *ip, size_t cap);

#endif
