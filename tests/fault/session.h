/* A store client session for the fault loops: connect to a TCPStore server and run every kind of
 * request once, checking each answer against what the session itself wrote. */
#ifndef TDIST_TESTS_FAULT_SESSION_H
#define TDIST_TESTS_FAULT_SESSION_H

#include "tdist/tdist.h"

/* Connects (V2 dialect, short deadlines) to 127.0.0.1:port. */
tdist_status_t session_connect(int port, tdist_store_t **out);

/* Runs set, get, add, compare_set, check, wait, multi_set, multi_get, append, num_keys,
 * delete_key, queue push/len/pop and a 300 KiB value under keys that start with `prefix`. Returns
 * the first failing status (the session stops there), TDIST_OK if every request succeeded; a wrong
 * answer to a request that succeeded fails the test at once. */
tdist_status_t session_run(tdist_store_t *s, const char *prefix);

/* connect + run + destroy; the test fails unless everything succeeds. */
void session_must_pass(int port, const char *prefix);

/* Forks a process that runs a store server on 127.0.0.1:0 until killed; returns its port. */
int session_fork_server(int *pid);

#endif
