/* See nvml.h. The few NVML entry points used here, declared from NVIDIA's documented ABI
 * (nvml.h of the CUDA toolkit / the NVML API reference): every call returns nvmlReturn_t (an int,
 * 0 = NVML_SUCCESS); devices are opaque pointers; nvmlProcessInfo_t (v2/v3 entry points) is
 * {unsigned pid; unsigned long long usedGpuMemory; unsigned gpuInstanceId, computeInstanceId};
 * nvmlProcessUtilizationSample_t is {unsigned pid; unsigned long long timeStamp; unsigned smUtil,
 * memUtil, encUtil, decUtil}. The versioned symbol names are looked up, newest first, as the
 * header's #defines would pick them. */
#define _GNU_SOURCE
#include "operator-agent/procstat/nvml.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int nvml_ret_t;
typedef struct nvml_device_s *nvml_device_t;
#define NVML_SUCCESS 0
#define NVML_ERROR_INSUFFICIENT_SIZE 7
#define NVML_ERROR_NOT_FOUND 6
#define NVML_VALUE_NOT_AVAILABLE_ULL (~0ULL)

typedef struct {
  unsigned int pid;
  unsigned long long used_gpu_memory;
  unsigned int gpu_instance_id, compute_instance_id;
} nvml_process_info_t;

typedef struct {
  unsigned int pid;
  unsigned long long time_stamp; /* microseconds, CPU clock */
  unsigned int sm_util, mem_util, enc_util, dec_util;
} nvml_util_sample_t;

#define MAX_DEVICES 64
#define MAX_PROCS 256

struct agent_nvml_s {
  void *dl;
  nvml_ret_t (*init)(void);
  nvml_ret_t (*shutdown)(void);
  const char *(*error_string)(nvml_ret_t);
  nvml_ret_t (*count)(unsigned int *);
  nvml_ret_t (*handle)(unsigned int, nvml_device_t *);
  nvml_ret_t (*procs)(nvml_device_t, unsigned int *, nvml_process_info_t *);
  nvml_ret_t (*util)(nvml_device_t, nvml_util_sample_t *, unsigned int *, unsigned long long);
  unsigned long long last_seen[MAX_DEVICES]; /* per device: the newest utilisation sample read */
  nvml_process_info_t pbuf[MAX_PROCS];       /* scratch, so a sample allocates nothing */
  nvml_util_sample_t ubuf[MAX_PROCS];
};

static void *sym(void *dl, const char *const *names) {
  for (; *names; names++) {
    void *p = dlsym(dl, *names);
    if (p) return p;
  }
  return NULL;
}

static const char *errtext(agent_nvml_t *n, nvml_ret_t r) {
  const char *s = n->error_string ? n->error_string(r) : NULL;
  return s ? s : "unknown NVML error";
}

agent_nvml_t *agent_nvml_open(const char *lib, char *why, size_t cap) {
  if (!lib) lib = "libnvidia-ml.so.1";
  void *dl = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
  if (!dl) {
    const char *e = dlerror();
    snprintf(why, cap, "cannot load %s (%s): no NVIDIA driver on this node", lib,
             e ? e : "dlopen failed");
    return NULL;
  }
  agent_nvml_t *n = calloc(1, sizeof *n);
  if (!n) {
    dlclose(dl);
    snprintf(why, cap, "out of memory");
    return NULL;
  }
  n->dl = dl;
  static const char *const init_names[] = {"nvmlInit_v2", "nvmlInit", NULL};
  static const char *const shut_names[] = {"nvmlShutdown", NULL};
  static const char *const err_names[] = {"nvmlErrorString", NULL};
  static const char *const count_names[] = {"nvmlDeviceGetCount_v2", "nvmlDeviceGetCount", NULL};
  static const char *const handle_names[] = {"nvmlDeviceGetHandleByIndex_v2",
                                             "nvmlDeviceGetHandleByIndex", NULL};
  /* _v1 has a smaller struct: not used, the v2/v3 layout is the one declared above. */
  static const char *const procs_names[] = {"nvmlDeviceGetComputeRunningProcesses_v3",
                                            "nvmlDeviceGetComputeRunningProcesses_v2", NULL};
  static const char *const util_names[] = {"nvmlDeviceGetProcessUtilization", NULL};
  *(void **)&n->init = sym(dl, init_names);
  *(void **)&n->shutdown = sym(dl, shut_names);
  *(void **)&n->error_string = sym(dl, err_names);
  *(void **)&n->count = sym(dl, count_names);
  *(void **)&n->handle = sym(dl, handle_names);
  *(void **)&n->procs = sym(dl, procs_names);
  *(void **)&n->util = sym(dl, util_names); /* optional: memory alone without it */
  if (!n->init || !n->shutdown || !n->count || !n->handle || !n->procs) {
    snprintf(why, cap, "%s lacks the NVML entry points tdist-agent needs (driver too old?)", lib);
    dlclose(dl);
    free(n);
    return NULL;
  }
  nvml_ret_t r = n->init();
  if (r != NVML_SUCCESS) {
    snprintf(why, cap, "nvmlInit_v2 failed: %s", errtext(n, r));
    dlclose(dl);
    free(n);
    return NULL;
  }
  unsigned int nd = 0;
  r = n->count(&nd);
  if (r != NVML_SUCCESS || nd == 0) {
    snprintf(why, cap, "%s", r != NVML_SUCCESS ? errtext(n, r) : "NVML sees no GPU");
    agent_nvml_close(n);
    return NULL;
  }
  return n;
}

/* The utilisation samples of device d newer than the last read, into ubuf: how many. */
static unsigned util_samples(agent_nvml_t *n, int d, nvml_device_t dev) {
  if (!n->util) return 0;
  unsigned int cnt = MAX_PROCS;
  nvml_ret_t r = n->util(dev, n->ubuf, &cnt, n->last_seen[d]);
  if (r != NVML_SUCCESS) return 0; /* NOT_FOUND: no sample since; others: unsupported */
  if (cnt > MAX_PROCS) cnt = MAX_PROCS;
  for (unsigned i = 0; i < cnt; i++)
    if (n->ubuf[i].time_stamp > n->last_seen[d]) n->last_seen[d] = n->ubuf[i].time_stamp;
  return cnt;
}

int agent_nvml_sample(agent_nvml_t *n, agent_gpu_use_t *out, int max, char *why, size_t cap) {
  unsigned int nd = 0;
  nvml_ret_t r = n->count(&nd);
  if (r != NVML_SUCCESS) {
    snprintf(why, cap, "nvmlDeviceGetCount: %s", errtext(n, r));
    return -1;
  }
  if (nd > MAX_DEVICES) nd = MAX_DEVICES;
  int k = 0;
  for (unsigned d = 0; d < nd && k < max; d++) {
    nvml_device_t dev;
    if (n->handle(d, &dev) != NVML_SUCCESS) continue;
    unsigned int np = MAX_PROCS;
    r = n->procs(dev, &np, n->pbuf);
    if (r != NVML_SUCCESS) continue; /* INSUFFICIENT_SIZE past 256 processes: skip the device */
    unsigned nu = util_samples(n, (int)d, dev);
    for (unsigned i = 0; i < np && k < max; i++) {
      agent_gpu_use_t *u = &out[k++];
      memset(u, 0, sizeof *u);
      u->pid = (pid_t)n->pbuf[i].pid;
      u->gpu = (int)d;
      if (n->pbuf[i].used_gpu_memory != NVML_VALUE_NOT_AVAILABLE_ULL) {
        u->have_mem = 1;
        u->mem_bytes = n->pbuf[i].used_gpu_memory;
      }
      for (unsigned j = 0; j < nu; j++)
        if (n->ubuf[j].pid == n->pbuf[i].pid) {
          u->have_util = 1;
          u->util = n->ubuf[j].sm_util > 100 ? 1.0 : n->ubuf[j].sm_util / 100.0;
        }
    }
  }
  return k;
}

void agent_nvml_close(agent_nvml_t *n) {
  if (!n) return;
  n->shutdown();
  dlclose(n->dl);
  free(n);
}
