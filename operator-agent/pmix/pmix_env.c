/* The agent's PMIx server: the variables mpirun gives each rank beside PMIx's own, so that a
 * rank started by the agent sees what it sees under mpirun (Open MPI 4.1 reads them; scripts
 * read OMPI_COMM_WORLD_*): its place in the job, the command (MPI_INFO_ENV's command, argv and
 * wdir), and whether the node's ranks outnumber its CPUs (then Open MPI yields when idle
 * instead of busy-polling). A variable the user set in the agent's environment is left alone.
 * Also each job's shared-memory directory: Open MPI's vader transport names its segments
 * vader_segment.<gethostname>.<uid>.<job>.<local rank> in /dev/shm, which the ranks of two agents
 * on one host (one job, local ranks from 0 on each) would share and corrupt; each agent's ranks
 * get a directory of its own, removed with the job (so no segment of a killed rank is left).
 * The agent holds a flock on that directory while its job lives, so that a directory whose
 * agent died (SIGKILL: nothing of it ran) has no lock left and the next agent on the host
 * removes it; and on a directory the user named for the ranks when other nodes of the job share
 * this host, so that two agents given the same one refuse instead of crashing their ranks. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "operator-agent/common/log.h"
#include "operator-agent/pmix/pmix_int.h"

/* The first number of a one-line file, or -1. */
static long read_long(const char *path, long *second) {
  FILE *f = fopen(path, "r");
  if (!f) return -1;
  char buf[128] = "";
  long a = -1, b = -1;
  if (fgets(buf, sizeof buf, f)) {
    if (!strncmp(buf, "max", 3))
      a = -1, sscanf(buf + 3, "%ld", &b);
    else if (sscanf(buf, "%ld %ld", &a, &b) < 1)
      a = -1;
  }
  fclose(f);
  if (second) *second = b;
  return a;
}

int agent_pmix__usable_cpus(void) {
  int n = 0;
  cpu_set_t set;
  if (!sched_getaffinity(0, sizeof set, &set)) n = CPU_COUNT(&set);
  if (n <= 0) n = (int)sysconf(_SC_NPROCESSORS_ONLN);
  if (n <= 0) n = 1;
  /* A container's CPU limit (cgroup v2 cpu.max, v1 cfs quota) bounds it too: a pod limited to
   * 2 CPUs on a 64-CPU node runs 4 ranks oversubscribed. */
  long period = -1, quota = read_long("/sys/fs/cgroup/cpu.max", &period);
  if (quota <= 0) {
    quota = read_long("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", NULL);
    period = read_long("/sys/fs/cgroup/cpu/cpu.cfs_period_us", NULL);
  }
  if (quota > 0 && period > 0) {
    long lim = (quota + period - 1) / period;
    if (lim > 0 && lim < n) n = (int)lim;
  }
  return n;
}

#define SHM_ROOT "/dev/shm"
#define SHM_PREFIX "tdist-mpi."
#define SHM_MARKER ".tdist-agent-lock" /* in a directory whose agent holds a flock on it */

/* Removes what the directory fd holds (fd stays open); the number of entries left. */
static int empty_dir(int fd) {
  int dup_fd = dup(fd);
  DIR *d = dup_fd >= 0 ? fdopendir(dup_fd) : NULL;
  if (!d) {
    if (dup_fd >= 0) close(dup_fd);
    return 1;
  }
  int left = 0;
  struct dirent *de;
  while ((de = readdir(d)))
    if (strcmp(de->d_name, ".") && strcmp(de->d_name, ".."))
      left += unlinkat(fd, de->d_name, 0) != 0;
  closedir(d);
  return left;
}

/* A new directory of this agent's own in /dev/shm, locked (its fd in *lock_fd): NULL with errno
 * set on failure. The marker goes in once the lock is held: a sweep (agent_pmix__shm_sweep)
 * takes only directories that have it, so never one being made, nor one of an agent that locks
 * none (an older agent's). */
static char *own_dir(int *lock_fd) {
  char tmpl[] = SHM_ROOT "/" SHM_PREFIX "XXXXXX";
  if (!mkdtemp(tmpl)) return NULL;
  int fd = open(tmpl, O_RDONLY | O_DIRECTORY | O_CLOEXEC), mfd = -1, e = ENOMEM;
  char *dir = NULL;
  if (fd < 0 || flock(fd, LOCK_EX) ||
      (mfd = openat(fd, SHM_MARKER, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600)) < 0 ||
      !(dir = strdup(tmpl))) {
    e = errno ? errno : ENOMEM;
    if (mfd >= 0) unlinkat(fd, SHM_MARKER, 0);
    rmdir(tmpl);
    if (fd >= 0) close(fd);
    if (mfd >= 0) close(mfd);
    errno = e;
    return NULL;
  }
  close(mfd);
  *lock_fd = fd;
  return dir;
}

int agent_pmix__shm_sweep(void) {
  DIR *d = opendir(SHM_ROOT);
  if (!d) return 0;
  int n = 0;
  struct dirent *de;
  while ((de = readdir(d))) {
    if (strncmp(de->d_name, SHM_PREFIX, strlen(SHM_PREFIX))) continue;
    int fd = openat(dirfd(d), de->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) continue;
    struct stat st;
    /* Ours to remove: made by an agent of this user that locks its directory (the marker) and
     * whose lock is gone, i.e. whose agent no longer runs. A live agent holds its lock. */
    if (!fstat(fd, &st) && st.st_uid == geteuid() && !faccessat(fd, SHM_MARKER, F_OK, 0) &&
        !flock(fd, LOCK_EX | LOCK_NB)) {
      int left = empty_dir(fd);
      if (!unlinkat(dirfd(d), de->d_name, AT_REMOVEDIR)) {
        n++;
        AGENT_INFO(
            "PMIx: removed %s/%s, the MPI ranks' shared-memory directory of an agent that is "
            "gone (killed before it could remove it)",
            SHM_ROOT, de->d_name);
      } else {
        AGENT_WARN("PMIx: cannot remove %s/%s, left by an agent that is gone (%s; %d entr%s left)",
                   SHM_ROOT, de->d_name, strerror(errno), left, left == 1 ? "y" : "ies");
      }
    }
    close(fd);
  }
  closedir(d);
  return n;
}

/* The user named the ranks' shared-memory directory and other nodes of this job run on this
 * host: their agents, if given the same directory, would put segments of the same names there
 * (vader names them by host name, job and local rank). The first agent locks it; another that
 * finds it locked refuses (0, or -2 with err set). */
static int user_dir_lock(agent_pmix_t *p, const char *dir, char *err, size_t cap) {
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return 0; /* Open MPI reports a directory it cannot use */
  if (!flock(fd, LOCK_EX | LOCK_NB)) {
    p->shm_lock_fd = fd;
    return 0;
  }
  int e = errno;
  close(fd);
  if (e != EWOULDBLOCK) return 0;
  snprintf(err, cap,
           "OMPI_MCA_btl_vader_backing_directory=%s: another tdist-agent on this host gives "
           "this directory to its MPI ranks now, and the ranks of both would map each other's "
           "shared memory and crash. Unset the variable (each agent then gives its ranks a "
           "directory of its own) or give each agent its own directory",
           dir);
  return -2;
}

int agent_pmix__job_cmd(agent_pmix_t *p, const agent_pmix_job_t *j, int host_shared, char *err,
                        size_t cap) {
  free(p->cmd_name);
  free(p->cmd_args);
  free(p->wdir);
  p->cmd_name = p->cmd_args = p->wdir = NULL;
  if (j->ncmd > 0 && j->cmd && j->cmd[0]) {
    const char *slash = strrchr(j->cmd[0], '/');
    if (!(p->cmd_name = strdup(slash ? slash + 1 : j->cmd[0]))) goto nomem;
    size_t len = 1;
    for (size_t i = 1; i < j->ncmd; i++) len += strlen(j->cmd[i]) + 1;
    if (j->ncmd > 1) {
      if (!(p->cmd_args = malloc(len))) goto nomem;
      char *q = p->cmd_args;
      for (size_t i = 1; i < j->ncmd; i++) q += sprintf(q, "%s%s", i > 1 ? " " : "", j->cmd[i]);
    }
  }
  p->wdir = getcwd(NULL, 0); /* the workers start where the agent runs */
  const char *user = getenv("OMPI_MCA_btl_vader_backing_directory");
  if (user) return host_shared ? user_dir_lock(p, user, err, cap) : 0;
  if (access(SHM_ROOT, W_OK)) return 0;
  if (!(p->shm_dir = own_dir(&p->shm_lock_fd)))
    AGENT_WARN("PMIx: cannot create a shared-memory directory in " SHM_ROOT
               " (%s): the MPI ranks use Open MPI's default (two agents' ranks on one host then "
               "collide)",
               strerror(errno));
  return 0;
nomem:
  snprintf(err, cap, "out of memory registering the PMIx job");
  return -1;
}

void agent_pmix__shm_dir_remove(agent_pmix_t *p) {
  pthread_mutex_lock(&p->mu);
  char *dir = p->shm_dir;
  int fd = p->shm_lock_fd;
  p->shm_dir = NULL;
  p->shm_lock_fd = -1;
  pthread_mutex_unlock(&p->mu);
  /* the directory is removed holding its lock, which goes last (a sweep never sees it free) */
  if (dir) {
    int left = fd >= 0 ? empty_dir(fd) : 0;
    if (rmdir(dir) && errno != ENOENT)
      AGENT_WARN(
          "PMIx: could not remove the MPI ranks' shared-memory directory %s (%s; %d "
          "entr%s left)",
          dir, strerror(errno), left, left == 1 ? "y" : "ies");
  }
  if (fd >= 0) close(fd);
  free(dir);
}

/* "NAME=VALUE" appended to e (n entries, room for more), unless the user set NAME. */
static int put(char ***e, size_t *n, const char *name, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int put(char ***e, size_t *n, const char *name, const char *fmt, ...) {
  if (getenv(name)) return 0;
  char val[4096];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(val, sizeof val, fmt, ap);
  va_end(ap);
  char **g = realloc(*e, (*n + 2) * sizeof *g);
  if (!g) return -1;
  *e = g;
  if (asprintf(&g[*n], "%s=%s", name, val) < 0) {
    g[*n] = NULL;
    return -1;
  }
  g[++*n] = NULL;
  return 0;
}

int agent_pmix__mpirun_env(agent_pmix_t *p, int rank, char ***e, size_t *n) {
  pthread_mutex_lock(&p->mu);
  int me = p->node_id, ws = p->world_size, first = p->node_first[me];
  int nlocal = p->node_first[me + 1] - first, lr = rank - first;
  char *cmd = p->cmd_name ? strdup(p->cmd_name) : NULL;
  char *args = p->cmd_args ? strdup(p->cmd_args) : NULL;
  char *wdir = p->wdir ? strdup(p->wdir) : NULL;
  char *shm = p->shm_dir ? strdup(p->shm_dir) : NULL;
  pthread_mutex_unlock(&p->mu);
  int cpus = agent_pmix__usable_cpus();
  int rc = put(e, n, "OMPI_COMM_WORLD_SIZE", "%d", ws) ||
           put(e, n, "OMPI_COMM_WORLD_RANK", "%d", rank) ||
           put(e, n, "OMPI_COMM_WORLD_LOCAL_RANK", "%d", lr) ||
           put(e, n, "OMPI_COMM_WORLD_LOCAL_SIZE", "%d", nlocal) ||
           put(e, n, "OMPI_COMM_WORLD_NODE_RANK", "%d", lr) ||
           put(e, n, "OMPI_UNIVERSE_SIZE", "%d", ws) || put(e, n, "OMPI_NUM_APP_CTX", "1") ||
           put(e, n, "OMPI_FIRST_RANKS", "0") || put(e, n, "OMPI_APP_CTX_NUM_PROCS", "%d", ws) ||
           /* mpirun sets 1 when a node's ranks outnumber its slots (cores), else 0 */
           put(e, n, "OMPI_MCA_mpi_oversubscribe", "%d", nlocal > cpus) ||
           (cmd && put(e, n, "OMPI_COMMAND", "%s", cmd)) ||
           (args && put(e, n, "OMPI_ARGV", "%s", args)) ||
           (wdir && put(e, n, "OMPI_MCA_initial_wdir", "%s", wdir)) ||
           (shm && put(e, n, "OMPI_MCA_btl_vader_backing_directory", "%s", shm));
  free(cmd);
  free(args);
  free(wdir);
  free(shm);
  return rc ? -1 : 0;
}
