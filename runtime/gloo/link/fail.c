/* The transport's error sink (link.h): every failure goes to the creator's fail. */
#include <stdarg.h>

#include "runtime/gloo/link/link.h"

tdist_status_t tdist__transport_fail(const tdist__transport_cfg_t *cfg, tdist_status_t st,
                                     const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  st = cfg->fail(cfg->fail_ctx, st, fmt, ap);
  va_end(ap);
  return st;
}
