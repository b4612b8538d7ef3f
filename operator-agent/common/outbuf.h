/* A bounded text buffer for reports built in place (/status's hang object, Python stacks): pieces
 * are appended printf-style until one does not fit; that piece is dropped whole, `full` is set and
 * nothing more is written, and the text stays NUL-terminated at what fit. */
#ifndef TDIST_AGENT_COMMON_OUTBUF_H
#define TDIST_AGENT_COMMON_OUTBUF_H

#include <stddef.h>

typedef struct {
  char *p;    /* the caller's buffer */
  size_t n;   /* bytes written (without the NUL) */
  size_t cap; /* its size, at least 1 */
  int full;   /* a piece did not fit */
} agent_outbuf_t;

void agent_outbuf_put(agent_outbuf_t *o, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* s as a JSON string: quoted, '"' and '\\' escaped, a newline as \n, other bytes below 0x20 and
 * from 0x7f as \u00XX (printable ASCII out, whatever the input). */
void agent_outbuf_json_str(agent_outbuf_t *o, const char *s);

#endif
