/* FAULT SEAM, NOT A GPU: the CUDA runtime half of the fake (see fake.h). Devices are numbers,
 * streams are threads, events are counters, device memory is registered host memory. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "fake.h"

static __thread int t_dev; /* the calling thread's current device */

int fake_device_count(cudaError_t *err) {
  const char *v = getenv("TDIST_FAKE_CUDA_DEVICES");
  long n = v && *v ? strtol(v, NULL, 10) : 1;
  if (n < 0) {
    *err = (cudaError_t)-n;
    return 0;
  }
  *err = cudaSuccess;
  return (int)n;
}

int fake_current_device(void) { return t_dev; }

FAKE_API cudaError_t cudaGetDeviceCount(int *count) {
  cudaError_t e;
  int n = fake_device_count(&e);
  *count = e == cudaSuccess ? n : 0;
  return e;
}

FAKE_API cudaError_t cudaSetDevice(int dev) {
  cudaError_t e;
  int n = fake_device_count(&e);
  if (e != cudaSuccess) return e;
  if (dev < 0 || dev >= n) return cudaErrorInvalidDevice;
  t_dev = dev;
  fake_count("set_device");
  return cudaSuccess;
}

FAKE_API cudaError_t cudaGetDevice(int *dev) {
  *dev = t_dev;
  return cudaSuccess;
}

static const struct {
  cudaError_t e;
  const char *name, *text;
} k_errors[] = {
    {cudaSuccess, "cudaSuccess", "no error"},
    {cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument"},
    {cudaErrorInsufficientDriver, "cudaErrorInsufficientDriver",
     "CUDA driver version is insufficient for CUDA runtime version"},
    {cudaErrorNoDevice, "cudaErrorNoDevice", "no CUDA-capable device is detected"},
    {cudaErrorInvalidDevice, "cudaErrorInvalidDevice", "invalid device ordinal"},
    {cudaErrorInvalidResourceHandle, "cudaErrorInvalidResourceHandle", "invalid resource handle"},
    {cudaErrorNotReady, "cudaErrorNotReady", "device not ready"},
};

FAKE_API const char *cudaGetErrorName(cudaError_t e) {
  for (size_t i = 0; i < sizeof k_errors / sizeof *k_errors; i++)
    if (k_errors[i].e == e) return k_errors[i].name;
  return "cudaErrorUnknown";
}

FAKE_API const char *cudaGetErrorString(cudaError_t e) {
  for (size_t i = 0; i < sizeof k_errors / sizeof *k_errors; i++)
    if (k_errors[i].e == e) return k_errors[i].text;
  return "unknown error";
}

FAKE_API cudaError_t cudaDriverGetVersion(int *v) {
  cudaError_t e;
  fake_device_count(&e);
  *v = e == cudaSuccess ? 13000 : 0; /* "no driver" when devices are made to fail */
  return cudaSuccess;
}

FAKE_API cudaError_t cudaRuntimeGetVersion(int *v) {
  *v = 13000;
  return cudaSuccess;
}

/* ---- streams: a thread per stream runs its tasks in order ---- */

struct CUstream_st {
  int dev;
  pthread_t th;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  fake_task_t *head, *tail;
  int stop;
};

static void *stream_main(void *arg) {
  struct CUstream_st *s = arg;
  pthread_mutex_lock(&s->mu);
  for (;;) {
    while (!s->head && !s->stop) pthread_cond_wait(&s->cv, &s->mu);
    fake_task_t *t = s->head;
    if (!t) break; /* stopping and drained */
    s->head = t->next;
    if (!s->head) s->tail = NULL;
    pthread_mutex_unlock(&s->mu);
    t->run(t);
    t->free(t);
    pthread_mutex_lock(&s->mu);
  }
  pthread_mutex_unlock(&s->mu);
  return NULL;
}

FAKE_API cudaError_t cudaStreamCreateWithFlags(cudaStream_t *out, unsigned flags) {
  (void)flags;
  struct CUstream_st *s = calloc(1, sizeof *s);
  if (!s) return cudaErrorMemoryAllocation;
  s->dev = t_dev;
  pthread_mutex_init(&s->mu, NULL);
  pthread_cond_init(&s->cv, NULL);
  if (pthread_create(&s->th, NULL, stream_main, s) != 0) {
    free(s);
    return cudaErrorMemoryAllocation;
  }
  fake_count("streams");
  *out = s;
  return cudaSuccess;
}

/* Like CUDA, destroying a stream lets queued work finish (here: waits for it). */
FAKE_API cudaError_t cudaStreamDestroy(cudaStream_t s) {
  if (!s) return cudaErrorInvalidResourceHandle;
  pthread_mutex_lock(&s->mu);
  s->stop = 1;
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
  pthread_join(s->th, NULL);
  pthread_mutex_destroy(&s->mu);
  pthread_cond_destroy(&s->cv);
  free(s);
  return cudaSuccess;
}

int fake_stream_device(cudaStream_t s) { return s ? s->dev : t_dev; }

void fake_enqueue(cudaStream_t s, fake_task_t *t) {
  t->next = NULL;
  pthread_mutex_lock(&s->mu);
  if (s->tail)
    s->tail->next = t;
  else
    s->head = t;
  s->tail = t;
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
}

/* Waits until everything queued so far has run: a task that signals, shared by the waiter and
 * the stream thread (the last one to let go frees it). */
typedef struct {
  fake_task_t t;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int done;
  _Atomic int refs;
} sync_t;

static void sync_unref(sync_t *y) {
  if (atomic_fetch_sub(&y->refs, 1) != 1) return;
  pthread_mutex_destroy(&y->mu);
  pthread_cond_destroy(&y->cv);
  free(y);
}

static void sync_run(fake_task_t *t) {
  sync_t *y = (sync_t *)t;
  pthread_mutex_lock(&y->mu);
  y->done = 1;
  pthread_cond_broadcast(&y->cv);
  pthread_mutex_unlock(&y->mu);
}
static void sync_free(fake_task_t *t) { sync_unref((sync_t *)t); }

FAKE_API cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  if (!s) return cudaSuccess; /* nothing runs on the legacy stream here */
  sync_t *y = calloc(1, sizeof *y);
  if (!y) return cudaErrorMemoryAllocation;
  y->t.run = sync_run;
  y->t.free = sync_free;
  pthread_mutex_init(&y->mu, NULL);
  pthread_cond_init(&y->cv, NULL);
  atomic_store(&y->refs, 2);
  fake_enqueue(s, &y->t);
  pthread_mutex_lock(&y->mu);
  while (!y->done) pthread_cond_wait(&y->cv, &y->mu);
  pthread_mutex_unlock(&y->mu);
  sync_unref(y);
  return cudaSuccess;
}

/* Device and host memory are the same here. */
FAKE_API cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, enum cudaMemcpyKind k) {
  (void)k;
  if (n) memmove(dst, src, n);
  return cudaSuccess;
}

/* ---- events ---- */

struct CUevent_st {
  int dev;
  _Atomic unsigned long recorded, completed;
  _Atomic int refs; /* the owner + queued markers */
};

static void event_unref(struct CUevent_st *e) {
  if (atomic_fetch_sub(&e->refs, 1) == 1) free(e);
}

FAKE_API cudaError_t cudaEventCreateWithFlags(cudaEvent_t *out, unsigned flags) {
  (void)flags;
  struct CUevent_st *e = calloc(1, sizeof *e);
  if (!e) return cudaErrorMemoryAllocation;
  e->dev = t_dev;
  atomic_store(&e->refs, 1);
  *out = e;
  return cudaSuccess;
}

typedef struct {
  fake_task_t t;
  struct CUevent_st *e;
  unsigned long token;
} marker_t;

static void marker_run(fake_task_t *t) {
  marker_t *m = (marker_t *)t;
  atomic_store(&m->e->completed, m->token);
}
static void marker_free(fake_task_t *t) {
  event_unref(((marker_t *)t)->e);
  free(t);
}

FAKE_API cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  if (!e) return cudaErrorInvalidResourceHandle;
  if (s && s->dev != e->dev) return cudaErrorInvalidResourceHandle; /* as CUDA: same device */
  unsigned long token = atomic_fetch_add(&e->recorded, 1) + 1;
  if (!s) {
    atomic_store(&e->completed, token);
    return cudaSuccess;
  }
  marker_t *m = calloc(1, sizeof *m);
  if (!m) return cudaErrorMemoryAllocation;
  m->t.run = marker_run;
  m->t.free = marker_free;
  m->e = e;
  m->token = token;
  atomic_fetch_add(&e->refs, 1);
  fake_enqueue(s, &m->t);
  return cudaSuccess;
}

FAKE_API cudaError_t cudaEventQuery(cudaEvent_t e) {
  if (!e) return cudaErrorInvalidResourceHandle;
  return atomic_load(&e->completed) >= atomic_load(&e->recorded) ? cudaSuccess : cudaErrorNotReady;
}

FAKE_API cudaError_t cudaEventDestroy(cudaEvent_t e) {
  if (!e) return cudaErrorInvalidResourceHandle;
  event_unref(e);
  return cudaSuccess;
}

/* ---- "device" memory: registered host memory ---- */

typedef struct blk {
  char *p;
  size_t n;
  int dev;
  struct blk *next;
} blk_t;

static pthread_mutex_t g_reg_mu = PTHREAD_MUTEX_INITIALIZER;
static blk_t *g_reg;

FAKE_API cudaError_t cudaMalloc(void **out, size_t n) {
  blk_t *b = calloc(1, sizeof *b);
  char *p = calloc(1, n ? n : 1);
  if (!b || !p) {
    free(b);
    free(p);
    return cudaErrorMemoryAllocation;
  }
  b->p = p;
  b->n = n ? n : 1;
  b->dev = t_dev;
  pthread_mutex_lock(&g_reg_mu);
  b->next = g_reg;
  g_reg = b;
  pthread_mutex_unlock(&g_reg_mu);
  *out = p;
  return cudaSuccess;
}

FAKE_API cudaError_t cudaFree(void *p) {
  if (!p) return cudaSuccess;
  pthread_mutex_lock(&g_reg_mu);
  for (blk_t **pp = &g_reg; *pp; pp = &(*pp)->next) {
    if ((*pp)->p == p) {
      blk_t *b = *pp;
      *pp = b->next;
      pthread_mutex_unlock(&g_reg_mu);
      free(b->p);
      free(b);
      return cudaSuccess;
    }
  }
  pthread_mutex_unlock(&g_reg_mu);
  return cudaErrorInvalidValue;
}

/* The block holding p, or NULL (caller holds g_reg_mu). */
static blk_t *lookup(const void *p) {
  for (blk_t *b = g_reg; b; b = b->next)
    if ((const char *)p >= b->p && (const char *)p < b->p + b->n) return b;
  return NULL;
}

int fake_is_device_ptr(const void *p) {
  pthread_mutex_lock(&g_reg_mu);
  int yes = lookup(p) != NULL;
  pthread_mutex_unlock(&g_reg_mu);
  return yes;
}

/* CUDA 11+: host memory CUDA never saw is "unregistered", with success. */
FAKE_API cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *a, const void *p) {
  memset(a, 0, sizeof *a);
  fake_count("pointer_queries");
  pthread_mutex_lock(&g_reg_mu);
  blk_t *b = lookup(p);
  if (b) {
    a->type = cudaMemoryTypeDevice;
    a->device = b->dev;
    a->devicePointer = (void *)p;
  } else {
    a->type = cudaMemoryTypeUnregistered;
    a->device = -2;
    a->hostPointer = (void *)p;
  }
  pthread_mutex_unlock(&g_reg_mu);
  return cudaSuccess;
}
