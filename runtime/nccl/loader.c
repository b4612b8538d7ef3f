/* dlopen/dlsym of the CUDA runtime and NCCL (see loader.h). Never links against them: libtdist
 * and its users carry no DT_NEEDED entry for libcudart, libnccl or libcuda. */
#define _GNU_SOURCE
#include "runtime/nccl/loader.h"

#include <dlfcn.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/common/param.h"
#include "runtime/common/dl_reason.h"

#define MAX_CANDIDATES 8

typedef struct {
  const char *names[MAX_CANDIDATES];
  char bufs[2][512]; /* $CUDA_HOME paths */
  int n;
} candidates_t;

static void add(candidates_t *c, const char *name) {
  if (c->n < MAX_CANDIDATES) c->names[c->n++] = name;
}

/* The override alone when set; else sonames first (ld.so.cache, LD_LIBRARY_PATH), then the
 * toolkit directories, where images often put them without registering them. */
static void candidates(candidates_t *c, tdist__param_id_t env, const char *const *sonames,
                       const char *file) {
  memset(c, 0, sizeof *c);
  const char *over = tdist__param_str(env);
  if (over) {
    add(c, over);
    return;
  }
  for (; *sonames; sonames++) add(c, *sonames);
  const char *home = getenv("CUDA_HOME");
  if (home && *home) {
    snprintf(c->bufs[0], sizeof c->bufs[0], "%s/lib64/%s", home, file);
    add(c, c->bufs[0]);
  }
  snprintf(c->bufs[1], sizeof c->bufs[1], "/usr/local/cuda/lib64/%s", file);
  add(c, c->bufs[1]);
}

static void append(char *buf, size_t cap, const char *fmt, const char *a, const char *b) {
  size_t l = strlen(buf);
  if (l < cap) snprintf(buf + l, cap - l, fmt, a, b);
}

/* Opens the first candidate that loads; else fills err with every name tried and returns NULL. */
static void *open_first(const candidates_t *c, const char *what, const char *env, char *path,
                        size_t pcap, char *err, size_t cap) {
  char tried[1024] = "";
  for (int i = 0; i < c->n; i++) {
    void *h = dlopen(c->names[i], RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
    if (h) {
      struct link_map *lm = NULL;
      const char *p = dlinfo(h, RTLD_DI_LINKMAP, &lm) == 0 && lm && lm->l_name && *lm->l_name
                          ? lm->l_name
                          : c->names[i];
      snprintf(path, pcap, "%s", p);
      return h;
    }
    append(tried, sizeof tried, "%s%s", *tried ? "; " : "", c->names[i]);
    append(tried, sizeof tried, "%s%s)", " (", tdist__dl_reason(dlerror(), c->names[i]));
  }
  snprintf(err, cap, "cannot load the %s: tried %s; install it in the image or set %s to its path",
           what, tried, env);
  return NULL;
}

/* dlsym through a name that macros may have versioned (the header's name is the ABI's). */
#define TDIST__XSTR_(x) #x
#define TDIST__STR_(x) TDIST__XSTR_(x)

void tdist__nccl_version_str(int code, char *buf, size_t cap) {
  /* NCCL_VERSION(X,Y,Z): X*1000+Y*100+Z up to 2.8, X*10000+Y*100+Z after. */
  int major = code >= 10000 ? code / 10000 : code / 1000;
  int minor = code >= 10000 ? code / 100 % 100 : code / 100 % 10;
  snprintf(buf, cap, "%d.%d.%d", major, minor, code % 100);
}

void tdist__nccl_lib_close(tdist__nccl_lib_t *lib) {
  if (lib->nccl_handle) dlclose(lib->nccl_handle);
  if (lib->cudart_handle) dlclose(lib->cudart_handle);
  lib->nccl_handle = lib->cudart_handle = NULL;
}

tdist_status_t tdist__nccl_lib_open(tdist__nccl_lib_t *lib, char *err, size_t cap) {
  static const char *const cudart_sonames[] = {"libcudart.so.13", "libcudart.so.12",
                                               "libcudart.so.11.0", "libcudart.so", NULL};
  static const char *const nccl_sonames[] = {"libnccl.so.2", "libnccl.so", NULL};
  memset(lib, 0, sizeof *lib);
  candidates_t c;
  candidates(&c, TDIST__P_CUDART_LIBRARY, cudart_sonames, "libcudart.so");
  lib->cudart_handle = open_first(&c, "CUDA runtime (libcudart)", "TDIST_CUDART_LIBRARY",
                                  lib->cudart_path, sizeof lib->cudart_path, err, cap);
  if (!lib->cudart_handle) return TDIST_ERR_NOT_AVAILABLE;
  candidates(&c, TDIST__P_NCCL_LIBRARY, nccl_sonames, "libnccl.so.2");
  lib->nccl_handle = open_first(&c, "NCCL library (libnccl)", "TDIST_NCCL_LIBRARY", lib->nccl_path,
                                sizeof lib->nccl_path, err, cap);
  if (!lib->nccl_handle) {
    tdist__nccl_lib_close(lib);
    return TDIST_ERR_NOT_AVAILABLE;
  }
  const char *missing = NULL, *in = NULL;
#define TDIST__LOAD_(h, path, name)                                                         \
  if (!missing && !(lib->name = (__typeof__(lib->name))dlsym(lib->h, TDIST__STR_(name)))) { \
    missing = TDIST__STR_(name);                                                            \
    in = lib->path;                                                                         \
  }
#define TDIST__LOAD_CUDART_(name) TDIST__LOAD_(cudart_handle, cudart_path, name)
#define TDIST__LOAD_NCCL_(name) TDIST__LOAD_(nccl_handle, nccl_path, name)
#define TDIST__LOAD_OPT_(name) \
  lib->name = (__typeof__(lib->name))dlsym(lib->nccl_handle, TDIST__STR_(name));
  TDIST__CUDART_FUNCS(TDIST__LOAD_CUDART_)
  TDIST__NCCL_FUNCS(TDIST__LOAD_NCCL_)
  TDIST__NCCL_OPTIONAL_FUNCS(TDIST__LOAD_OPT_)
#undef TDIST__LOAD_
#undef TDIST__LOAD_CUDART_
#undef TDIST__LOAD_NCCL_
#undef TDIST__LOAD_OPT_
  if (missing) {
    snprintf(err, cap, "%s has no symbol %s: not a usable %s (tdist needs NCCL >= 2.14)", in,
             missing, strncmp(missing, "nccl", 4) == 0 ? "NCCL library" : "CUDA runtime");
    tdist__nccl_lib_close(lib);
    return TDIST_ERR_NOT_AVAILABLE;
  }
  int v = 0;
  ncclResult_t r = lib->ncclGetVersion(&v);
  if (r != ncclSuccess || v < TDIST__NCCL_MIN_VERSION) {
    char have[32], need[32];
    tdist__nccl_version_str(v, have, sizeof have);
    tdist__nccl_version_str(TDIST__NCCL_MIN_VERSION, need, sizeof need);
    snprintf(err, cap,
             "%s is NCCL %s; tdist needs NCCL >= %s (non-blocking communicators): "
             "install a newer libnccl2 or set TDIST_NCCL_LIBRARY",
             lib->nccl_path, r == ncclSuccess ? have : "of unknown version (ncclGetVersion failed)",
             need);
    tdist__nccl_lib_close(lib);
    return TDIST_ERR_NOT_AVAILABLE;
  }
  lib->nccl_version = v;
  return TDIST_OK;
}
