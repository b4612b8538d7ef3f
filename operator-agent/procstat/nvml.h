/* Per-process GPU use through NVML, loaded with dlopen("libnvidia-ml.so.1") (as NCCL is
 * loaded: one build runs on CPU-only nodes). The prototypes are declared in nvml.c from NVIDIA's
 * documented ABI; no NVIDIA header is needed to build. Not thread-safe: the loop thread owns it.
 */
#ifndef TDIST_AGENT_NVML_H
#define TDIST_AGENT_NVML_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

typedef struct agent_nvml_s agent_nvml_t;

/* Loads lib (NULL = "libnvidia-ml.so.1") and initialises NVML. NULL with why set when it is
 * not available (no library, no driver, no device), naming the library and NVML's or dlerror's
 * text. */
agent_nvml_t *agent_nvml_open(const char *lib, char *why, size_t cap);

typedef struct {
  pid_t pid;
  int gpu;            /* device index */
  uint64_t mem_bytes; /* used GPU memory */
  int have_mem, have_util;
  double util; /* SM utilisation 0..1 over the last sampling period */
} agent_gpu_use_t;

/* Every compute process on every device (up to max): the number written, or -1 with why set. */
int agent_nvml_sample(agent_nvml_t *n, agent_gpu_use_t *out, int max, char *why, size_t cap);

/* NULL is a no-op. */
void agent_nvml_close(agent_nvml_t *n);

#endif
