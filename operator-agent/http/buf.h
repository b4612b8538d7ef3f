/* A growable text buffer for the HTTP renderers, with the escapers of the two output formats
 * (Prometheus text 0.0.4 and JSON). Internal to the http package (and its tests).
 *
 * Allocation is bounded: the buffer never grows past AGENT_BUF_MAX bytes. On overflow or a failed
 * allocation it is marked failed, later appends are ignored and agent_buf_finish returns NULL, so
 * callers append without checking and test once at the end. Strings copied into the output are
 * made valid UTF-8 on the way (each malformed sequence becomes one U+FFFD, the replacement rule
 * of Python's and browsers' decoders): both formats require UTF-8 and the sources (worker error
 * files, hostnames) are not trusted to be. */
#ifndef TDIST_AGENT_HTTP_BUF_H
#define TDIST_AGENT_HTTP_BUF_H

#include <stddef.h>

#define AGENT_BUF_MAX ((size_t)16 << 20)

typedef struct {
  char *p;
  size_t len, cap;
  int failed;
} agent_buf_t;

void agent_buf_init(agent_buf_t *b);
void agent_buf_put(agent_buf_t *b, const char *s, size_t n);
void agent_buf_puts(agent_buf_t *b, const char *s);
void agent_buf_printf(agent_buf_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* A float in Go ParseFloat syntax, shortest form that reads back to the same double ("0.25",
 * "1e+21"); infinities as "+Inf"/"-Inf", NaN as "NaN" (the renderers never emit NaN). */
void agent_buf_double(agent_buf_t *b, double v);

/* The first strnlen(s, max) bytes of s as a JSON string literal, quotes included: '"' and '\\'
 * escaped, control characters as \n, \t, ... or \u00XX. */
void agent_buf_json_str(agent_buf_t *b, const char *s, size_t max);

/* s as the inside of a Prometheus label value (no quotes): '\\', '"' and newline escaped as the
 * 0.0.4 format requires; other control characters (and DEL) become a space. */
void agent_buf_prom_label(agent_buf_t *b, const char *s);

/* Returns the NUL-terminated text (malloc'd, caller frees) and its length, or NULL if any append
 * failed. Either way the buffer is reset. */
char *agent_buf_finish(agent_buf_t *b, size_t *len);

#endif
