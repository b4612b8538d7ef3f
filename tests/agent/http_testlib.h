/* Helpers for the agent's HTTP tests (see http_testlib.c). testonly. */
#ifndef TDIST_TESTS_AGENT_HTTP_TESTLIB_H
#define TDIST_TESTS_AGENT_HTTP_TESTLIB_H

#include <stddef.h>

/* $TEST_TMPDIR, or /tmp outside Bazel. */
const char *test_tmpdir(void);
/* Finds an executable in $PATH, /usr/bin, /usr/local/bin or /bin; 1 if found (path in out). */
int test_find_tool(const char *name, char *out, size_t cap);
void test_write_file(const char *path, const char *data, size_t len);
/* Runs a shell command; returns its exit status and its output in *out (malloc'd). */
int test_run_cmd(const char *cmd, char **out);
/* `promtool check metrics` on body must exit 0 and print nothing (no lint warning either). A
 * missing promtool fails the test with instructions; it never skips. `what` names the dump file
 * left in $TEST_TMPDIR. */
void test_promtool_check(const char *body, size_t len, const char *what);
/* Writes `script` to $TEST_TMPDIR/script_name and runs it with python3 and one argument; fails
 * the test on a non-zero exit. Returns the output (malloc'd). */
char *test_python(const char *script_name, const char *script, const char *arg);

/* One HTTP exchange; raw holds the whole answer, body points into it. */
typedef struct {
  int status;
  char *raw;
  size_t raw_len;
  const char *body;
  size_t body_len;
} http_resp_t;

/* A connected socket to the loopback address of `family` (AF_INET or AF_INET6), 10 s timeouts. */
int http_connect(int family, int port);
/* Sends req as is and reads until the server closes the connection. */
void http_request_raw(int family, int port, const char *req, size_t req_len, http_resp_t *r);
/* METHOD path HTTP/1.1 with Connection: close, to 127.0.0.1. */
void http_request(int port, const char *method, const char *path, http_resp_t *r);
/* The value of header `name` (case-insensitive; trimmed, malloc'd) or NULL. */
char *http_header(const http_resp_t *r, const char *name);
void http_check_header(const http_resp_t *r, const char *name, const char *want);
void http_resp_free(http_resp_t *r);
/* http_request, then: status == want, and a Content-Length equal to the body's length (HEAD:
 * present, and no body bytes). */
void http_expect(int port, const char *method, const char *path, int want, http_resp_t *r);

/* The value of the one sample whose `name{labels}` is exactly key (fails unless exactly one). */
double prom_value(const char *body, const char *key);
void prom_check(const char *body, const char *key, double want);
/* HELP then TYPE once per family before its samples, a family's samples together (histogram
 * suffixes included), counters named *_total, a final newline, no NUL and no NaN. */
void prom_check_structure(const char *body, size_t len);

#endif
