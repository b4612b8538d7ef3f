/* Where the nccl backend cannot run, tdist_init_process_group(backend = "nccl") fails with
 * TDIST_ERR_NOT_AVAILABLE (or INVALID_ARGUMENT for a bad setting) and a message naming what is
 * missing; and the dtype/op tables map every tdist value to the right NCCL enum or refuse it.
 *   (a) TDIST_NCCL_LIBRARY / TDIST_CUDART_LIBRARY pointing at missing files: the path is named;
 *       a library without NCCL's symbols; an NCCL older than 2.14 (fake);
 *   (b) the real libraries of this machine (libcudart.so.13 + libnccl.so.2 from the CUDA image,
 *       no GPU, no driver): the message carries cudaGetDeviceCount's answer. Where the real
 *       libraries are absent, the message names the library instead; where a GPU exists, the
 *       init succeeds and this case says so and is skipped;
 *   (c) devices: 0 devices, a failing cudaGetDeviceCount, LOCAL_RANK beyond the devices, a bad
 *       TDIST_NCCL_DEVICE (fake CUDA runtime, see fake/fake.h).
 * argv[1]: the fake library (//tests/nccl:libfake_cuda_nccl.so). World size 1, memory store. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "runtime/nccl/nccl_internal.h"
#include "tdist/tdist.h"

static char g_fake[PATH_MAX];

static void env(const char *name, const char *value) {
  if (value)
    setenv(name, value, 1);
  else
    unsetenv(name);
}

/* Inits a world-size-1 nccl group; returns its status and copies the error text. On success
 * the group is destroyed again. */
static tdist_status_t try_init_here(char *msg, size_t cap) {
  tdist_store_t *store = NULL;
  CHECK_OK(tdist_memory_store_create(&store));
  tdist_pg_options_t o = TDIST_PG_OPTIONS_INIT;
  o.backend = "nccl";
  o.store = store;
  o.rank = 0;
  o.world_size = 1;
  o.timeout_ms = 5000;
  tdist_pg_t *pg = NULL;
  tdist_status_t st = tdist_init_process_group(&o, &pg);
  snprintf(msg, cap, "%s", st ? tdist_last_error() : "");
  if (!st) {
    CHECK(pg != NULL);
    CHECK(strcmp(tdist_pg_backend(pg), "nccl") == 0);
    tdist_pg_destroy(pg);
  } else {
    CHECK(pg == NULL);
  }
  tdist_store_destroy(store);
  return st;
}

/* try_init_here in a child process: libtdist reads each TDIST_* variable once per process
 * (runtime/common/param.h), and every case here sets them anew. */
static tdist_status_t try_init(char *msg, size_t cap) {
  int fds[2];
  CHECK(pipe(fds) == 0);
  fflush(NULL);
  pid_t pid = fork();
  CHECK(pid >= 0);
  if (pid == 0) {
    close(fds[0]);
    char m[1024];
    int st = (int)try_init_here(m, sizeof m);
    size_t len = strlen(m);
    CHECK(write(fds[1], &st, sizeof st) == (ssize_t)sizeof st);
    CHECK(write(fds[1], m, len) == (ssize_t)len);
    _exit(0);
  }
  close(fds[1]);
  int st = -1;
  size_t n = 0;
  CHECK(read(fds[0], &st, sizeof st) == (ssize_t)sizeof st);
  for (ssize_t r; n + 1 < cap && (r = read(fds[0], msg + n, cap - 1 - n)) > 0;) n += (size_t)r;
  msg[n] = '\0';
  close(fds[0]);
  int status;
  CHECK(waitpid(pid, &status, 0) == pid);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  return (tdist_status_t)st;
}

#define EXPECT(status, ...)                                                                 \
  do {                                                                                      \
    char m_[1024];                                                                          \
    tdist_status_t st_ = try_init(m_, sizeof m_);                                           \
    const char *want_[] = {__VA_ARGS__, NULL};                                              \
    int ok_ = st_ == (status);                                                              \
    for (int i_ = 0; ok_ && want_[i_]; i_++) ok_ = strstr(m_, want_[i_]) != NULL;           \
    if (!ok_) {                                                                             \
      fprintf(stderr, "%s:%d: init returned %s: '%s'; wanted %s with:", __FILE__, __LINE__, \
              tdist_status_name(st_), m_, tdist_status_name(status));                       \
      for (int i_ = 0; want_[i_]; i_++) fprintf(stderr, " '%s'", want_[i_]);                \
      fprintf(stderr, "\n");                                                                \
      exit(1);                                                                              \
    }                                                                                       \
    TEST_LOG("  ok: %s", m_);                                                               \
  } while (0)

static void test_tables(void) {
  /* Written from nccl.h's names, independently of coll.c's tables. */
  static const struct {
    tdist_dtype_t t;
    ncclDataType_t n;
  } dt[] = {
      {TDIST_FLOAT16, ncclHalf},   {TDIST_BFLOAT16, ncclBfloat16}, {TDIST_FLOAT32, ncclFloat},
      {TDIST_FLOAT64, ncclDouble}, {TDIST_INT8, ncclChar},         {TDIST_UINT8, ncclUint8},
      {TDIST_INT32, ncclInt},      {TDIST_INT64, ncclInt64},
  };
  CHECK_EQ_INT(sizeof dt / sizeof *dt, TDIST_DTYPE_COUNT_);
  for (size_t i = 0; i < sizeof dt / sizeof *dt; i++) {
    ncclDataType_t got = ncclNumTypes;
    CHECK_EQ_INT(tdist__nccl_dtype(dt[i].t, &got), 0);
    CHECK_EQ_INT(got, dt[i].n);
  }
  ncclDataType_t d;
  CHECK_EQ_INT(tdist__nccl_dtype(TDIST_DTYPE_COUNT_, &d), -1);
  CHECK_EQ_INT(tdist__nccl_dtype((tdist_dtype_t)-1, &d), -1);
  static const struct {
    tdist_reduce_op_t t;
    int n; /* -1: NCCL has none */
  } ops[] = {
      {TDIST_SUM, ncclSum}, {TDIST_PROD, ncclProd}, {TDIST_MIN, ncclMin}, {TDIST_MAX, ncclMax},
      {TDIST_AVG, ncclAvg}, {TDIST_BAND, -1},       {TDIST_BOR, -1},      {TDIST_BXOR, -1},
  };
  CHECK_EQ_INT(sizeof ops / sizeof *ops, TDIST_REDUCE_OP_COUNT_);
  for (size_t i = 0; i < sizeof ops / sizeof *ops; i++) {
    ncclRedOp_t got = ncclNumOps;
    int rc = tdist__nccl_op(ops[i].t, &got);
    if (ops[i].n < 0) {
      CHECK_EQ_INT(rc, -1);
    } else {
      CHECK_EQ_INT(rc, 0);
      CHECK_EQ_INT(got, ops[i].n);
    }
  }
  ncclRedOp_t o;
  CHECK_EQ_INT(tdist__nccl_op(TDIST_REDUCE_OP_COUNT_, &o), -1);
  TEST_LOG("dtype/op tables: ok");
}

static void test_missing_libraries(void) {
  TEST_LOG("(a) missing or unusable libraries");
  env("TDIST_CUDART_LIBRARY", g_fake);
  env("TDIST_NCCL_LIBRARY", "/nonexistent/tdist-test/libnccl.so.2");
  EXPECT(TDIST_ERR_NOT_AVAILABLE, "not available", "NCCL library",
         "/nonexistent/tdist-test/libnccl.so.2", "No such file", "TDIST_NCCL_LIBRARY");
  env("TDIST_CUDART_LIBRARY", "/nonexistent/tdist-test/libcudart.so.13");
  env("TDIST_NCCL_LIBRARY", g_fake);
  EXPECT(TDIST_ERR_NOT_AVAILABLE, "CUDA runtime", "/nonexistent/tdist-test/libcudart.so.13",
         "TDIST_CUDART_LIBRARY");
  env("TDIST_CUDART_LIBRARY", g_fake);
  env("TDIST_NCCL_LIBRARY", "libm.so.6"); /* loads, but is no NCCL */
  EXPECT(TDIST_ERR_NOT_AVAILABLE, "has no symbol ncclGetVersion", "libm.so.6");
  env("TDIST_NCCL_LIBRARY", g_fake);
  env("TDIST_FAKE_NCCL_VERSION", "21205");
  EXPECT(TDIST_ERR_NOT_AVAILABLE, "NCCL 2.12.5", ">= 2.14.0");
  env("TDIST_FAKE_NCCL_VERSION", NULL);
}

static void test_devices(void) {
  TEST_LOG("(c) devices");
  env("TDIST_CUDART_LIBRARY", g_fake);
  env("TDIST_NCCL_LIBRARY", g_fake);
  env("TDIST_FAKE_CUDA_DEVICES", "0");
  EXPECT(TDIST_ERR_NOT_AVAILABLE, "no usable CUDA device", "cudaGetDeviceCount returned 0", g_fake);
  env("TDIST_FAKE_CUDA_DEVICES", "-35");
  EXPECT(TDIST_ERR_NOT_AVAILABLE, "cudaErrorInsufficientDriver", "no NVIDIA driver");
  env("TDIST_FAKE_CUDA_DEVICES", "2");
  env("LOCAL_RANK", "3");
  EXPECT(TDIST_ERR_NOT_AVAILABLE, "LOCAL_RANK selects CUDA device 3", "has 2");
  env("LOCAL_RANK", "1");
  env("TDIST_NCCL_DEVICE", "x1");
  EXPECT(TDIST_ERR_INVALID_ARGUMENT, "TDIST_NCCL_DEVICE='x1'");
  env("TDIST_NCCL_DEVICE", "5");
  EXPECT(TDIST_ERR_NOT_AVAILABLE, "TDIST_NCCL_DEVICE selects CUDA device 5");
  env("TDIST_NCCL_DEVICE", "1");
  char m[256];
  CHECK_OK_MSG(try_init(m, sizeof m), m); /* the fake is enough for world size 1 */
  env("TDIST_NCCL_DEVICE", NULL);
  env("LOCAL_RANK", NULL);
  env("TDIST_FAKE_CUDA_DEVICES", NULL);
}

static void test_real_libraries(void) {
  TEST_LOG("(b) the real CUDA runtime and NCCL of this machine");
  env("TDIST_CUDART_LIBRARY", NULL);
  env("TDIST_NCCL_LIBRARY", NULL);
  void *n = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
  if (!n) n = dlopen("/usr/local/cuda/lib64/libnccl.so.2", RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
  void *c = NULL;
  const char *cudarts[] = {"libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0",
                           "libcudart.so", "/usr/local/cuda/lib64/libcudart.so"};
  for (size_t i = 0; !c && i < sizeof cudarts / sizeof *cudarts; i++)
    c = dlopen(cudarts[i], RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
  if (!c) {
    EXPECT(TDIST_ERR_NOT_AVAILABLE, "CUDA runtime", "libcudart.so.13", "TDIST_CUDART_LIBRARY");
  } else if (!n) {
    EXPECT(TDIST_ERR_NOT_AVAILABLE, "NCCL library", "libnccl.so.2", "TDIST_NCCL_LIBRARY");
  } else {
    int ndev = -1;
    cudaError_t (*count)(int *) = (cudaError_t(*)(int *))dlsym(c, "cudaGetDeviceCount");
    CHECK(count != NULL);
    cudaError_t e = count(&ndev);
    if (e == cudaSuccess && ndev > 0) {
      char m[512];
      tdist_status_t st = try_init(m, sizeof m);
      TEST_LOG("  %d GPU(s) here: init returned %s %s (case skipped)", ndev, tdist_status_name(st),
               m);
    } else if (e == cudaSuccess) {
      EXPECT(TDIST_ERR_NOT_AVAILABLE, "no usable CUDA device", "cudaGetDeviceCount returned 0");
    } else {
      const char *(*name)(cudaError_t) = (const char *(*)(cudaError_t))dlsym(c, "cudaGetErrorName");
      CHECK(name != NULL);
      EXPECT(TDIST_ERR_NOT_AVAILABLE, "no usable CUDA device", "cudaGetDeviceCount returned",
             name(e), "libcudart");
    }
  }
  if (n) dlclose(n);
  if (c) dlclose(c);
}

int main(int argc, char **argv) {
  CHECK(argc == 2);
  CHECK(realpath(argv[1], g_fake) != NULL);
  env("LOCAL_RANK", NULL);
  env("TDIST_NCCL_DEVICE", NULL);
  test_tables();
  test_missing_libraries();
  test_devices();
  test_real_libraries();
  TEST_LOG("PASS");
  return 0;
}
