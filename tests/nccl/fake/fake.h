/* FAULT SEAM, NOT A GPU. A fake CUDA runtime + NCCL (one shared library that stands in for both
 * libcudart and libnccl through TDIST_CUDART_LIBRARY / TDIST_NCCL_LIBRARY) that implements, on
 * host memory and files, exactly the subset libtdist's nccl backend calls. It exists so the
 * CPU-side logic of that backend runs for real in CPU-only CI, across real processes: unique-id
 * exchange through a real store, dtype/op mapping, communicator split, grouped send/recv,
 * non-blocking progress (calls return ncclInProgress every third time), abort, and the watchdog.
 * It says nothing about real GPUs, real NCCL performance or real NCCL bugs: tests/gpu/run.sh is
 * the check for those.
 *
 * What it models, and how:
 *   - "device memory" is host memory from cudaMalloc, registered so cudaPointerGetAttributes
 *     and the collectives can tell it from host memory (the collectives reject other pointers,
 *     as NCCL_CHECK_POINTERS=1 would); tests read and write it directly;
 *   - a stream is a thread executing queued work in order; an event completes when the stream
 *     reaches the point where it was recorded;
 *   - a communicator is a directory named by the unique id (TDIST_FAKE_NCCL_DIR, else
 *     TEST_TMPDIR, else /tmp); ranks exchange data as one file per message; every collective is
 *     built from such messages and reduces in rank order;
 *   - ncclCommInitRankConfig checks that the id bytes it was given are exactly those
 *     ncclGetUniqueId created, and writes them to <dir>/init-<rank> (plus device, world size)
 *     for the test to compare with the store's value.
 * Environment (read at each use): TDIST_FAKE_CUDA_DEVICES = device count (default 1; a negative
 * value -E makes cudaGetDeviceCount fail with cudaError_t E); TDIST_FAKE_NCCL_VERSION;
 * TDIST_FAKE_NCCL_HANG_AT = k: the k-th operation this process executes never completes (until
 * abort); TDIST_FAKE_NCCL_ERROR_AT = k: it fails asynchronously with ncclRemoteError instead.
 * Also cudaMemcpy, cudaStreamSynchronize and ncclCommInitRank, which tdist does not call but
 * tests/gpu/nccl_gpu_test.c does (//tests/gpu:nccl_gpu_test_on_fake runs it on this fake).
 * Exported for tests (dlsym): fake_nccl_counter(name) reports what was called;
 * fake_nccl_fail_idle_after(ms) makes every communicator fail with ncclSystemError ms after it
 * was created, with nothing in flight. */
#ifndef TDIST_TESTS_NCCL_FAKE_FAKE_H
#define TDIST_TESTS_NCCL_FAKE_FAKE_H

#include <cuda_runtime_api.h>
#include <nccl.h>
#include <stddef.h>

#define FAKE_API __attribute__((visibility("default")))

/* Work queued on a fake stream; run then free on the stream's thread. */
typedef struct fake_task {
  void (*run)(struct fake_task *t);
  void (*free)(struct fake_task *t);
  struct fake_task *next;
} fake_task_t;

/* fake_cuda.c */
int fake_device_count(cudaError_t *err);
int fake_current_device(void);
int fake_stream_device(cudaStream_t s);
void fake_enqueue(cudaStream_t s, fake_task_t *t);
int fake_is_device_ptr(const void *p);
void fake_count(const char *name); /* counter++ (fake_nccl.c) */

#endif
