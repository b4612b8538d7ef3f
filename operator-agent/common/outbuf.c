/* See outbuf.h. */
#include "operator-agent/common/outbuf.h"

#include <stdarg.h>
#include <stdio.h>

void agent_outbuf_put(agent_outbuf_t *o, const char *fmt, ...) {
  if (o->full) return;
  va_list ap;
  va_start(ap, fmt);
  int k = vsnprintf(o->p + o->n, o->cap - o->n, fmt, ap);
  va_end(ap);
  if (k < 0 || (size_t)k >= o->cap - o->n) {
    o->full = 1;
    o->p[o->n] = 0; /* the piece that did not fit is dropped whole */
    return;
  }
  o->n += (size_t)k;
}

void agent_outbuf_json_str(agent_outbuf_t *o, const char *s) {
  agent_outbuf_put(o, "\"");
  for (; *s && !o->full; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\')
      agent_outbuf_put(o, "\\%c", c);
    else if (c == '\n')
      agent_outbuf_put(o, "\\n");
    else if (c < 0x20 || c >= 0x7f)
      agent_outbuf_put(o, "\\u%04x", c);
    else
      agent_outbuf_put(o, "%c", c);
  }
  agent_outbuf_put(o, "\"");
}
