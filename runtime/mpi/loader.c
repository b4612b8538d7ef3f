/* Backend "mpi" as libtdist registers it: finds and opens the MPI plugin (runtime/mpi/plugin.h) and
 * checks that MPI's view of the world agrees with what the caller and the environment say. Nothing
 * here includes mpi.h; libtdist has no MPI dependency.
 *
 * Where the plugin comes from: TDIST_MPI_PLUGIN (a path or a file name; when set, only that is
 * tried), else libtdist-mpi.so in the directory of the object libtdist's code is in, and in its
 * mpi/ subdirectory (the Bazel tree: bazel-bin/runtime/libtdist.so and
 * bazel-bin/runtime/mpi/libtdist-mpi.so), else, for a program inside a Bazel output tree
 * (.../bazel-out/<config>/bin/..., libtdist linked in statically or not), that tree's
 * runtime/mpi/libtdist-mpi.so, else libtdist-mpi.so from the loader's search path.
 * Once opened it stays: MPI cannot be unloaded from a live process. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/common/dl_reason.h"
#include "runtime/common/log.h"
#include "runtime/common/param.h"
#include "runtime/common/status_internal.h"
#include "runtime/mpi/plugin.h"
#include "runtime/pg/reduce.h"

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static const tdist__mpi_plugin_t *g_plugin;

static void host_log(int level, const char *component, const char *fmt, ...) {
  char buf[TDIST__ERRMSG_MAX];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  tdist__log((tdist__log_level_t)level, component, "%s", buf);
}

static tdist__mpi_host_t g_host = {
    .abi = TDIST__MPI_ABI,
    .sizes = TDIST__MPI_SIZES_INIT,
    .log = host_log,
    .reduce = tdist__reduce,
    .reduce_finish_avg = tdist__reduce_finish_avg,
    .coll_what = tdist__coll_what,
};

static void *try_open(const char *path, char *tried, size_t cap) {
  void *h = dlopen(path, RTLD_NOW | RTLD_GLOBAL | RTLD_NODELETE);
  if (h) return h;
  size_t l = strlen(tried);
  if (l < cap)
    snprintf(tried + l, cap - l, "%s%s (%s)", l ? "; " : "", path,
             tdist__dl_reason(dlerror(), path));
  return NULL;
}

/* The plugin in the Bazel output tree that file (a resolved path) is in: the nearest ancestor
 * ".../bazel-out/<config>/bin" + "/runtime/mpi/" + the plugin's name. 0 when file is in none. A
 * program run as bazel-bin/x/y resolves (bazel-bin is a link) into execroot/.../bazel-out. */
static int bazel_tree_plugin(const char *file, char *out, size_t cap) {
  static const char mark[] = "/bazel-out/";
  const char *b = NULL;
  for (const char *q = strstr(file, mark); q; q = strstr(q + 1, mark)) b = q;
  if (!b) return 0;
  const char *cfg = b + sizeof mark - 1, *slash = strchr(cfg, '/');
  if (!slash || slash == cfg || strncmp(slash, "/bin/", 5)) return 0;
  int n = snprintf(out, cap, "%.*s/runtime/mpi/%s", (int)(slash + 4 - file), file,
                   TDIST__MPI_PLUGIN_FILE);
  return n > 0 && (size_t)n < cap;
}

static tdist_status_t load_locked(char *err, size_t cap) {
  char tried[2048] = "";
  void *h = NULL;
  const char *over = tdist__param_str(TDIST__P_MPI_PLUGIN);
  if (over) {
    h = try_open(over, tried, sizeof tried);
  } else {
    Dl_info info;
    char dir[PATH_MAX] = "";
    if (dladdr((void *)&tdist_init_process_group, &info) && info.dli_fname && *info.dli_fname) {
      snprintf(dir, sizeof dir, "%s", info.dli_fname);
      char *slash = strrchr(dir, '/');
      if (slash)
        *slash = '\0';
      else
        dir[0] = '\0';
    }
    char path[PATH_MAX + 64];
    if (dir[0]) {
      snprintf(path, sizeof path, "%s/%s", dir, TDIST__MPI_PLUGIN_FILE);
      h = try_open(path, tried, sizeof tried);
      if (!h) {
        snprintf(path, sizeof path, "%s/mpi/%s", dir, TDIST__MPI_PLUGIN_FILE);
        h = try_open(path, tried, sizeof tried);
      }
    }
    /* libtdist linked into the program: dladdr names the program as argv[0] gave it, so ask
     * the kernel where it is; a libtdist.so elsewhere: where that is. */
    char real[PATH_MAX], prev[PATH_MAX + 64] = "";
    const char *from[2] = {"/proc/self/exe", dir[0] ? info.dli_fname : NULL};
    for (int i = 0; i < 2 && !h; i++) {
      if (from[i] && realpath(from[i], real) && bazel_tree_plugin(real, path, sizeof path) &&
          strcmp(path, prev)) {
        snprintf(prev, sizeof prev, "%s", path);
        h = try_open(path, tried, sizeof tried);
      }
    }
    if (!h) h = try_open(TDIST__MPI_PLUGIN_FILE, tried, sizeof tried);
  }
  if (!h) {
    snprintf(err, cap,
             "cannot load the MPI plugin: tried %s. Backend 'mpi' needs libtdist-mpi.so (built "
             "against the machine's MPI: bazel build //runtime/mpi:libtdist-mpi.so) and that "
             "MPI's libmpi; set TDIST_MPI_PLUGIN to the plugin's path",
             tried);
    return TDIST_ERR_NOT_AVAILABLE;
  }
  Dl_info info;
  const char *where = TDIST__MPI_PLUGIN_FILE;
  tdist__mpi_entry_fn entry = (tdist__mpi_entry_fn)dlsym(h, TDIST__MPI_ENTRY);
  if (entry && dladdr((void *)entry, &info) && info.dli_fname) where = info.dli_fname;
  if (!entry) {
    snprintf(err, cap, "%s has no symbol %s: not a tdist MPI plugin", where, TDIST__MPI_ENTRY);
    return TDIST_ERR_NOT_AVAILABLE;
  }
  g_host.spin_us = tdist__param_int(TDIST__P_MPI_SPIN_US);
  const tdist__mpi_plugin_t *p = entry(&g_host);
  if (!p || p->abi != TDIST__MPI_ABI || !tdist__mpi_abi_match(p->abi, &p->sizes)) {
    snprintf(err, cap,
             "%s was built from another tdist tree (plugin ABI %d, this libtdist %d): use the "
             "plugin built with this libtdist",
             where, p ? p->abi : -1, TDIST__MPI_ABI);
    return TDIST_ERR_NOT_AVAILABLE;
  }
  tdist__log(TDIST__LOG_DEBUG, "mpi", "loaded %s (%s)", where, p->library());
  g_plugin = p;
  return TDIST_OK;
}

static int parse_env_int(const char *name, int *out) {
  const char *v = getenv(name);
  if (!v || !*v) return 0;
  char *end = NULL;
  long x = strtol(v, &end, 10);
  if (*end || x < INT_MIN || x > INT_MAX) return -1;
  *out = (int)x;
  return 1;
}

/* Backend "mpi" (its registration's open): loads the plugin, checks opts' rank and world size
 * and RANK/WORLD_SIZE against MPI_COMM_WORLD, and gives the backend with this process's rank and
 * size. On failure tdist_last_error() says why (TDIST_ERR_NOT_AVAILABLE: no plugin, or no MPI
 * library for it). */
static tdist_status_t mpi_open(const tdist_pg_options_t *opts, const tdist__backend_t **be,
                               int *rank, int *size) {
  char err[TDIST__ERRMSG_MAX] = "";
  pthread_mutex_lock(&g_mu);
  tdist_status_t st = g_plugin ? TDIST_OK : load_locked(err, sizeof err);
  const tdist__mpi_plugin_t *p = g_plugin;
  pthread_mutex_unlock(&g_mu);
  if (st) return tdist__fail(st, "backend 'mpi': %s", err);
  if (tdist__param_error(TDIST__P_MPI_SPIN_US))
    return tdist__fail(TDIST_ERR_INVALID_ARGUMENT, "%s", tdist__param_error(TDIST__P_MPI_SPIN_US));
  if ((st = p->world(rank, size, err, sizeof err)))
    return tdist__fail(st, "backend 'mpi': %s", err);
  /* The caller and the environment may only confirm MPI's numbering. */
  if (opts->rank >= 0 && opts->rank != *rank)
    return tdist__fail(TDIST_ERR_INVALID_ARGUMENT,
                       "backend 'mpi': rank %d in the options contradicts MPI_COMM_WORLD, where "
                       "this process is rank %d (leave rank -1: MPI numbers the ranks)",
                       opts->rank, *rank);
  if (opts->world_size > 0 && opts->world_size != *size)
    return tdist__fail(TDIST_ERR_INVALID_ARGUMENT,
                       "backend 'mpi': world_size %d in the options contradicts MPI_COMM_WORLD's "
                       "size %d (leave world_size -1: MPI gives it)",
                       opts->world_size, *size);
  int v = 0, r = parse_env_int("RANK", &v);
  if (r < 0 || (r > 0 && v != *rank))
    return tdist__fail(TDIST_ERR_INVALID_ARGUMENT,
                       "backend 'mpi': RANK=%s contradicts MPI_COMM_WORLD, where this process is "
                       "rank %d (unset RANK, or start the ranks so that they agree)",
                       getenv("RANK"), *rank);
  r = parse_env_int("WORLD_SIZE", &v);
  if (r < 0 || (r > 0 && v != *size))
    return tdist__fail(TDIST_ERR_INVALID_ARGUMENT,
                       "backend 'mpi': WORLD_SIZE=%s contradicts MPI_COMM_WORLD's size %d (unset "
                       "WORLD_SIZE, or start that many ranks)",
                       getenv("WORLD_SIZE"), *size);
  *be = p->backend;
  return TDIST_OK;
}

static const tdist__backend_reg_t k_reg = {.name = "mpi", .order = 2, .open = mpi_open};
__attribute__((constructor)) static void mpi_register(void) { tdist__backend_register(&k_reg); }
