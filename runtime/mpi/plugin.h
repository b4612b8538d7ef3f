/* The interface between libtdist and its MPI plugin, libtdist-mpi.so.
 *
 * libtdist never links against MPI: backend "mpi" opens the plugin with dlopen at
 * tdist_init_process_group (runtime/mpi/loader.c), as NCCL opens its network plugins. The plugin
 * is built against one MPI's mpi.h and linked against its libmpi (Open MPI and MPICH differ in
 * ABI: one plugin per implementation), so a node without MPI has no plugin to open, or a plugin
 * whose libmpi does not load: both are TDIST_ERR_NOT_AVAILABLE with the loader's reason.
 *
 * The plugin is opened RTLD_GLOBAL: Open MPI's own components (mca_*.so) resolve libmpi's
 * symbols from the global scope. It calls nothing of libtdist by symbol (a program may have
 * libtdist linked in statically): what it needs of the host comes in tdist__mpi_host_t, and it
 * exports one symbol, TDIST__MPI_ENTRY. The plugin sees a group only through its context
 * (runtime/pg/backend.h: tdist__bctx_t, whose vfail records errors), never the group itself.
 * Both sides are built from one tree: the ABI number and the sizes of the structures that cross
 * the boundary (the context, the collective descriptor, the backend vtable and this file's
 * two) must match, or the plugin is refused. */
#ifndef TDIST_MPI_PLUGIN_H
#define TDIST_MPI_PLUGIN_H

#include <stddef.h>

#include "runtime/pg/backend.h"
#include "tdist/pg.h"

/* 2: backends take a context (tdist__bctx_t), not the group; errors go through its vfail. */
#define TDIST__MPI_ABI 2
#define TDIST__MPI_ENTRY "tdist_mpi_plugin_v1"
#define TDIST__MPI_PLUGIN_FILE "libtdist-mpi.so"

/* The sizes both sides compare, with the ABI number. */
typedef struct {
  size_t bctx, coll, backend, host, plugin;
} tdist__mpi_sizes_t;

typedef struct tdist__mpi_host tdist__mpi_host_t;
typedef struct tdist__mpi_plugin tdist__mpi_plugin_t;

/* An initializer of tdist__mpi_sizes_t with this side's sizes. */
#define TDIST__MPI_SIZES_INIT                                               \
  {                                                                         \
    sizeof(tdist__bctx_t), sizeof(tdist__coll_t), sizeof(tdist__backend_t), \
        sizeof(tdist__mpi_host_t), sizeof(tdist__mpi_plugin_t)              \
  }

struct tdist__mpi_host {
  int abi; /* TDIST__MPI_ABI */
  tdist__mpi_sizes_t sizes;
  /* libtdist's log. */
  void (*log)(int level, const char *component, const char *fmt, ...)
      __attribute__((format(printf, 3, 4)));
  /* The gloo backend's reduction kernels (runtime/pg/reduce.h): f16 and bf16 reductions and AVG
   * round exactly as gloo's do. */
  void (*reduce)(void *dst, const void *src, size_t count, tdist_dtype_t dtype,
                 tdist_reduce_op_t op);
  void (*reduce_finish_avg)(void *buf, size_t count, tdist_dtype_t dtype, int n);
  /* "all_reduce #12" (tdist__coll_what). */
  const char *(*coll_what)(char out[TDIST__WHAT_MAX], tdist__coll_kind_t kind, uint64_t seq);
  /* TDIST_MPI_SPIN_US: how long a wait polls before it sleeps. */
  long long spin_us;
};

struct tdist__mpi_plugin {
  int abi;
  tdist__mpi_sizes_t sizes;
  const tdist__backend_t *backend;
  /* Initialises MPI once per process if the program has not (MPI_Init_thread, asking for
   * MPI_THREAD_MULTIPLE) and gives this process's rank and size in MPI_COMM_WORLD. On failure
   * writes why to err and returns an error status. */
  tdist_status_t (*world)(int *rank, int *size, char *err, size_t cap);
  /* MPI_Get_library_version's first line, e.g. "Open MPI v4.1.4, package: ...". */
  const char *(*library)(void);
};

/* 1 when the other side's ABI number and sizes are this side's. */
static inline int tdist__mpi_abi_match(int abi, const tdist__mpi_sizes_t *s) {
  tdist__mpi_sizes_t mine = TDIST__MPI_SIZES_INIT;
  return abi == TDIST__MPI_ABI && s->bctx == mine.bctx && s->coll == mine.coll &&
         s->backend == mine.backend && s->host == mine.host && s->plugin == mine.plugin;
}

typedef const tdist__mpi_plugin_t *(*tdist__mpi_entry_fn)(const tdist__mpi_host_t *host);

#endif
