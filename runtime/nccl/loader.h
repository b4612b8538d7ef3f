/* Loads the CUDA runtime and NCCL with dlopen, so one libtdist build runs on nodes without them.
 *
 * The table holds exactly the functions the nccl backend calls, typed from the real headers
 * (cuda_runtime_api.h, nccl.h). Nothing here is global: every process group opens its own table
 * (dlopen reference counts; RTLD_NODELETE keeps the libraries mapped after the last close, because
 * NCCL and the CUDA runtime must never be unloaded from a live process).
 *
 * Where a library comes from: TDIST_CUDART_LIBRARY / TDIST_NCCL_LIBRARY (a path or a soname; when
 * set, only that is tried), else the usual sonames through the dynamic loader's search path, else
 * $CUDA_HOME/lib64 and /usr/local/cuda/lib64. Failures say every name tried and why it failed. */
#ifndef TDIST_NCCL_LOADER_H
#define TDIST_NCCL_LOADER_H

#include <cuda_runtime_api.h>
#include <nccl.h>
#include <stddef.h>

#include "tdist/status.h"

/* Oldest NCCL the backend accepts: non-blocking communicators and ncclGetLastError (2.14). */
#define TDIST__NCCL_MIN_VERSION 21400

/* X(function): required CUDA runtime entry points. */
#define TDIST__CUDART_FUNCS(X) \
  X(cudaGetDeviceCount)        \
  X(cudaGetDevice)             \
  X(cudaSetDevice)             \
  X(cudaGetErrorName)          \
  X(cudaGetErrorString)        \
  X(cudaDriverGetVersion)      \
  X(cudaRuntimeGetVersion)     \
  X(cudaStreamCreateWithFlags) \
  X(cudaStreamDestroy)         \
  X(cudaEventCreateWithFlags)  \
  X(cudaEventRecord)           \
  X(cudaEventQuery)            \
  X(cudaEventDestroy)          \
  X(cudaMalloc)                \
  X(cudaFree)                  \
  X(cudaPointerGetAttributes)

/* Required NCCL entry points. */
#define TDIST__NCCL_FUNCS(X) \
  X(ncclGetVersion)          \
  X(ncclGetUniqueId)         \
  X(ncclCommInitRankConfig)  \
  X(ncclCommGetAsyncError)   \
  X(ncclGetErrorString)      \
  X(ncclGetLastError)        \
  X(ncclCommAbort)           \
  X(ncclCommFinalize)        \
  X(ncclCommDestroy)         \
  X(ncclAllReduce)           \
  X(ncclBroadcast)           \
  X(ncclReduce)              \
  X(ncclAllGather)           \
  X(ncclReduceScatter)       \
  X(ncclSend)                \
  X(ncclRecv)                \
  X(ncclGroupStart)          \
  X(ncclGroupEnd)

/* Optional NCCL entry points: NULL when the library predates them. */
#define TDIST__NCCL_OPTIONAL_FUNCS(X) X(ncclCommSplit) /* 2.18 */

#define TDIST__NCCL_FN_FIELD_(name) __typeof__(name) *name;

typedef struct tdist__nccl_lib {
  void *cudart_handle, *nccl_handle;
  char cudart_path[256], nccl_path[256]; /* the files actually loaded */
  int nccl_version;                      /* ncclGetVersion, e.g. 22809 */
  TDIST__CUDART_FUNCS(TDIST__NCCL_FN_FIELD_)
  TDIST__NCCL_FUNCS(TDIST__NCCL_FN_FIELD_)
  TDIST__NCCL_OPTIONAL_FUNCS(TDIST__NCCL_FN_FIELD_)
} tdist__nccl_lib_t;

/* Opens both libraries and resolves the table. On failure returns TDIST_ERR_NOT_AVAILABLE with
 * err naming what is missing (every library name tried with the loader's reason, or the missing
 * symbol, or an NCCL older than TDIST__NCCL_MIN_VERSION); nothing stays open. Does not touch a
 * GPU. Thread-safe. */
tdist_status_t tdist__nccl_lib_open(tdist__nccl_lib_t *lib, char *err, size_t cap);

/* Drops the references taken by open (the libraries stay mapped). NULL handles are skipped. */
void tdist__nccl_lib_close(tdist__nccl_lib_t *lib);

/* "2.28.9" from an NCCL version code. */
void tdist__nccl_version_str(int code, char *buf, size_t cap);

#endif
