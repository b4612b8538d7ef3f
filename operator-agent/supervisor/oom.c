/* See oom.h. */
#define _GNU_SOURCE
#include "operator-agent/supervisor/oom.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CG "/sys/fs/cgroup"

static int64_t mark = -2; /* -2: never marked */

/* The path of this process's cgroup for v1 controller `ctl` ("memory"), or v2's ("" ctl), into
 * out; 0 if /proc/self/cgroup names one. */
static int self_cgroup(const char *ctl, char *out, size_t cap) {
  FILE *f = fopen("/proc/self/cgroup", "re");
  if (!f) return -1;
  char line[4096];
  int found = -1;
  while (found && fgets(line, sizeof line, f)) {
    char *a = strchr(line, ':'), *b = a ? strchr(a + 1, ':') : NULL;
    if (!b) continue;
    *b = 0;
    const char *ctls = a + 1;
    int match = ctl[0] ? 0 : ctls[0] == 0;
    for (char *save = NULL, *t = strtok_r((char *)ctls, ",", &save); ctl[0] && t;
         t = strtok_r(NULL, ",", &save))
      match |= strcmp(t, ctl) == 0;
    if (!match) continue;
    b[1 + strcspn(b + 1, "\n")] = 0;
    snprintf(out, cap, "%s", b + 1);
    found = 0;
  }
  fclose(f);
  return found;
}

/* Opens `file` of this process's cgroup: v2 first, then v1's memory controller; the cgroup's own
 * path first, then the mount's root (a container's view). */
static FILE *cg_open(const char *v2file, const char *v1file) {
  char path[4200], cg[4096];
  const struct {
    const char *ctl, *dir, *file;
  } tries[] = {{"", CG, v2file}, {"memory", CG "/memory", v1file}};
  for (size_t i = 0; i < sizeof tries / sizeof tries[0]; i++) {
    if (self_cgroup(tries[i].ctl, cg, sizeof cg) == 0) {
      snprintf(path, sizeof path, "%s%s/%s", tries[i].dir, strcmp(cg, "/") ? cg : "",
               tries[i].file);
      FILE *f = fopen(path, "re");
      if (f) return f;
      snprintf(path, sizeof path, "%s/%s", tries[i].dir, tries[i].file);
      if ((f = fopen(path, "re"))) return f;
    }
  }
  return NULL;
}

int64_t agent_oom_kills(void) {
  FILE *f = cg_open("memory.events", "memory.oom_control");
  if (!f) return -1;
  char line[256];
  int64_t n = -1;
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "oom_kill %" SCNd64, &n) == 1) break;
  fclose(f);
  return n;
}

int64_t agent_oom_limit(void) {
  FILE *f = cg_open("memory.max", "memory.limit_in_bytes");
  if (!f) return -1;
  char line[64] = "";
  int64_t n = -1;
  if (fgets(line, sizeof line, f) && strncmp(line, "max", 3) != 0) {
    char *end;
    long long v = strtoll(line, &end, 10);
    /* v1's "no limit" is a page-rounded LLONG_MAX. */
    if (end != line && v > 0 && v < (1LL << 60)) n = v;
  }
  fclose(f);
  return n;
}

void agent_oom_mark(void) { mark = agent_oom_kills(); }

int64_t agent_oom_since_mark(void) {
  int64_t now = agent_oom_kills(), base = mark == -2 ? 0 : mark;
  mark = now;
  if (now < 0 || base < 0) return 0;
  return now - base;
}
