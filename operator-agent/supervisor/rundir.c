/* The agent's run directory (see rundir.h). */
#define _GNU_SOURCE
#include "operator-agent/supervisor/rundir.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_DEPTH 64 /* deeper trees are left behind (and reported) */

/* mkdir -p base (0755, as --log-dir always was); returns 0 or -1 with errno. */
static int mkdirs(const char *base) {
  char p[4096];
  size_t n = strlen(base);
  if (n >= sizeof p) {
    errno = ENAMETOOLONG;
    return -1;
  }
  memcpy(p, base, n + 1);
  for (char *s = p + 1; *s; s++) {
    if (*s != '/') continue;
    *s = 0;
    if (mkdir(p, 0755) && errno != EEXIST) return -1;
    *s = '/';
  }
  if (mkdir(p, 0755) && errno != EEXIST) return -1;
  return 0;
}

int agent_run_dir_create(const char *base, const char *run_id, char *out, size_t cap, char *err,
                         size_t err_cap) {
  struct stat st;
  if (mkdirs(base)) {
    snprintf(err, err_cap, "cannot create %s: %s", base, strerror(errno));
    return -1;
  }
  if (stat(base, &st)) {
    snprintf(err, err_cap, "%s: %s", base, strerror(errno));
    return -1;
  }
  if (!S_ISDIR(st.st_mode)) {
    snprintf(err, err_cap, "%s: %s", base, strerror(ENOTDIR));
    return -1;
  }
  int n = snprintf(out, cap, "%s/tdist-%s_XXXXXX", base, run_id);
  if (n < 0 || (size_t)n >= cap) {
    snprintf(err, err_cap, "%s: %s", base, strerror(ENAMETOOLONG));
    return -1;
  }
  if (!mkdtemp(out)) {
    snprintf(err, err_cap, "cannot create a directory in %s: %s", base, strerror(errno));
    return -1;
  }
  /* mkdtemp made it 0700 and ours; check anyway (the umask cannot widen it, but a hostile
   * filesystem could lie): never use a directory someone else controls. */
  if (lstat(out, &st)) {
    snprintf(err, err_cap, "%s: %s", out, strerror(errno));
    return -1;
  }
  if (!S_ISDIR(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 07777) != 0700) {
    snprintf(err, err_cap, "%s: not a directory of uid %d with mode 0700 (uid %d, mode %04o)", out,
             (int)geteuid(), (int)st.st_uid, (unsigned)(st.st_mode & 07777));
    return -1;
  }
  return 0;
}

/* Empties the directory open as dfd (closed here), then nothing else. */
static int empty_dir(int dfd, const char *path, int depth, char *err, size_t err_cap) {
  DIR *d = fdopendir(dfd);
  if (!d) {
    snprintf(err, err_cap, "%s: %s", path, strerror(errno));
    close(dfd);
    return -1;
  }
  int rc = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    char sub[4096];
    snprintf(sub, sizeof sub, "%s/%s", path, e->d_name);
    if (!unlinkat(dirfd(d), e->d_name, 0)) continue;
    if (errno != EISDIR && errno != EPERM) {
      if (!rc) snprintf(err, err_cap, "%s: %s", sub, strerror(errno));
      rc = -1;
      continue;
    }
    if (depth >= MAX_DEPTH) {
      if (!rc) snprintf(err, err_cap, "%s: more than %d levels deep", sub, MAX_DEPTH);
      rc = -1;
      continue;
    }
    int cfd = openat(dirfd(d), e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (cfd < 0) {
      if (!rc) snprintf(err, err_cap, "%s: %s", sub, strerror(errno));
      rc = -1;
      continue;
    }
    char scratch[256]; /* only the first error is reported */
    if (empty_dir(cfd, sub, depth + 1, rc ? scratch : err, rc ? sizeof scratch : err_cap)) rc = -1;
    if (unlinkat(dirfd(d), e->d_name, AT_REMOVEDIR) && !rc) {
      snprintf(err, err_cap, "%s: %s", sub, strerror(errno));
      rc = -1;
    }
  }
  closedir(d);
  return rc;
}

int agent_run_dir_remove(const char *dir, char *err, size_t err_cap) {
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    snprintf(err, err_cap, "%s: %s", dir, strerror(errno));
    return -1;
  }
  int rc = empty_dir(fd, dir, 0, err, err_cap);
  if (rmdir(dir) && !rc) {
    snprintf(err, err_cap, "%s: %s", dir, strerror(errno));
    rc = -1;
  }
  return rc;
}
