/* The dynamic loader's reason for a failed dlopen, without the file name it repeats
 * ("x.so: cannot open shared object file: ..." -> "cannot open shared object file: ..."), for
 * messages that list every path tried (runtime/nccl/loader.c, runtime/mpi/loader.c). */
#ifndef TDIST_COMMON_DL_REASON_H
#define TDIST_COMMON_DL_REASON_H

#include <string.h>

static inline const char *tdist__dl_reason(const char *dlerr, const char *name) {
  if (!dlerr) return "unknown error";
  size_t nl = strlen(name);
  if (strncmp(dlerr, name, nl) == 0 && dlerr[nl] == ':' && dlerr[nl + 1] == ' ')
    return dlerr + nl + 2;
  return dlerr;
}

#endif
