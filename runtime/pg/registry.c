/* The backends by name: each backend registers itself from a constructor in its own object
 * (gloo.c, nccl.c, runtime/mpi/loader.c), so the group library names none of them and depends
 * on none: libtdist is pg plus whichever backends are linked in (alwayslink keeps their
 * objects, in libtdist.so and in a static link alike). Chosen over a link-time table (a section
 * and its __start_/__stop_ symbols) because a constructor behaves the same under every linker
 * and link mode and needs no section the linker could drop.
 *
 * The table is a fixed array, filled before main (or while libtdist.so is being loaded, under
 * the dynamic loader's lock) and only read afterwards: no lock, no allocation. Must never keep a
 * registration it cannot hold silently: a full table is a build error of tdist's, reported on
 * stderr at load. */
#include <stdio.h>
#include <string.h>

#include "runtime/pg/backend.h"

#define REG_MAX 8

static const tdist__backend_reg_t *g_regs[REG_MAX];
static int g_nregs;

void tdist__backend_register(const tdist__backend_reg_t *reg) {
  if (g_nregs == REG_MAX) {
    fprintf(stderr, "tdist: backend '%s' not registered: more than %d backends\n", reg->name,
            REG_MAX);
    return;
  }
  g_regs[g_nregs++] = reg;
}

const tdist__backend_reg_t *tdist__backend_find(const char *name) {
  for (int i = 0; i < g_nregs; i++)
    if (strcmp(g_regs[i]->name, name) == 0) return g_regs[i];
  return NULL;
}

const char *tdist__backend_names(char *out, size_t cap) {
  /* By `order`, whatever order the constructors ran in. */
  const tdist__backend_reg_t *s[REG_MAX];
  int n = g_nregs;
  memcpy(s, g_regs, sizeof(s[0]) * (size_t)n);
  for (int i = 1; i < n; i++)
    for (int j = i; j > 0 && s[j]->order < s[j - 1]->order; j--) {
      const tdist__backend_reg_t *t = s[j];
      s[j] = s[j - 1];
      s[j - 1] = t;
    }
  size_t len = 0;
  out[0] = '\0';
  for (int i = 0; i < n && len < cap; i++) {
    const char *sep = i == 0 ? "" : i == n - 1 ? " or " : ", ";
    int w = snprintf(out + len, cap - len, "%s'%s'", sep, s[i]->name);
    if (w < 0) break;
    len += (size_t)w;
  }
  return out;
}
