/* See procstat.h. The parsers walk the text with explicit bounds (it need not end in a NUL) and
 * accept only what proc(5) describes: decimal fields, the stat line's comm in parentheses
 * (which may itself hold spaces and parentheses: the last ')' ends it). */
#define _GNU_SOURCE
#include "operator-agent/procstat/procstat.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* A decimal number at *p (before end): 0 and *p past it, or -1 (none, or it overflows). */
static int parse_u64(const char **p, const char *end, uint64_t *v) {
  const char *s = *p;
  uint64_t x = 0;
  if (s >= end || *s < '0' || *s > '9') return -1;
  for (; s < end && *s >= '0' && *s <= '9'; s++) {
    unsigned d = (unsigned)(*s - '0');
    if (x > (UINT64_MAX - d) / 10) return -1;
    x = x * 10 + d;
  }
  *p = s;
  *v = x;
  return 0;
}

/* stat fields may be negative (priority, nice); we read only unsigned ones, and skip others. */
static int skip_field(const char **p, const char *end) {
  const char *s = *p;
  if (s < end && *s == '-') s++;
  if (s >= end || *s < '0' || *s > '9') return -1;
  while (s < end && *s >= '0' && *s <= '9') s++;
  *p = s;
  return 0;
}

int agent_procstat_parse_stat(const char *text, size_t len, agent_proc_sample_t *s) {
  const char *end = text + len, *close = NULL;
  for (const char *q = text; q < end; q++)
    if (*q == ')') close = q;
  if (!close || !memchr(text, '(', (size_t)(close - text))) return -1;
  const char *p = close + 1;
  /* " S " : state, one letter */
  if (end - p < 3 || p[0] != ' ' || p[2] != ' ' || p[1] < 'A' || p[1] > 'z') return -1;
  char state = p[1];
  p += 2;
  uint64_t ut = 0, st = 0;
  for (int field = 4; field <= 20; field++) {
    if (p >= end || *p != ' ') return -1;
    p++;
    if (field == 14 || field == 15) {
      uint64_t v;
      if (parse_u64(&p, end, &v)) return -1;
      if (field == 14)
        ut = v;
      else
        st = v;
    } else if (skip_field(&p, end)) {
      return -1;
    }
  }
  if (p < end && *p != ' ' && *p != '\n') return -1;
  s->state = state;
  s->utime_ticks = ut;
  s->stime_ticks = st;
  return 0;
}

/* In "Key:\tvalue[ kB]\n" lines, the value of key: 0 and *v, or -1 when absent or malformed. */
static int status_field(const char *text, size_t len, const char *key, int kb, uint64_t *v) {
  size_t kl = strlen(key);
  const char *end = text + len;
  for (const char *line = text; line < end;) {
    const char *nl = memchr(line, '\n', (size_t)(end - line));
    const char *le = nl ? nl : end;
    if ((size_t)(le - line) > kl && !memcmp(line, key, kl) && line[kl] == ':') {
      const char *p = line + kl + 1;
      while (p < le && (*p == ' ' || *p == '\t')) p++;
      if (parse_u64(&p, le, v)) return -1;
      if (kb) {
        if (le - p != 3 || memcmp(p, " kB", 3) || *v > UINT64_MAX / 1024) return -1;
        *v *= 1024;
      } else if (p != le) {
        return -1;
      }
      return 0;
    }
    line = nl ? nl + 1 : end;
  }
  return -1;
}

int agent_procstat_parse_status(const char *text, size_t len, agent_proc_sample_t *s) {
  uint64_t rss = 0, th, v, iv;
  if (status_field(text, len, "Threads", 0, &th) ||
      status_field(text, len, "voluntary_ctxt_switches", 0, &v) ||
      status_field(text, len, "nonvoluntary_ctxt_switches", 0, &iv))
    return -1;
  /* A zombie or a process exiting has no VmRSS line any more: no memory, not a parse error. A
   * VmRSS line that is there must parse. */
  if (status_field(text, len, "VmRSS", 1, &rss)) {
    const char *k = memmem(text, len, "\nVmRSS:", 7);
    if (k) return -1;
    rss = 0;
  }
  s->threads = th;
  s->vcsw = v;
  s->ivcsw = iv;
  s->rss_bytes = rss;
  return 0;
}

int agent_procstat_parse_io(const char *text, size_t len, agent_proc_sample_t *s) {
  uint64_t r, w;
  if (status_field(text, len, "rchar", 0, &r) || status_field(text, len, "wchar", 0, &w)) return -1;
  s->rchar = r;
  s->wchar = w;
  s->have_io = 1;
  return 0;
}

/* Reads the whole of root/pid/name (or root/pid/task/tid/name) into buf: the length, or -errno
 * (-ESRCH for a process or thread that is gone). */
static ssize_t read_proc_file(const char *path, char *buf, size_t cap) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno == ENOENT ? -ESRCH : -errno;
  size_t n = 0;
  while (n < cap) {
    ssize_t r = read(fd, buf + n, cap - n);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      int e = errno;
      close(fd);
      return e == ENOENT ? -ESRCH : -e;
    }
    if (r == 0) break;
    n += (size_t)r;
  }
  close(fd);
  if (n == cap) return -EOVERFLOW;
  return (ssize_t)n;
}

static int64_t mono_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* pread of the whole file at offset 0: the length, or -errno (-ESRCH: the process is gone). */
static ssize_t pread_all(int fd, char *buf, size_t cap) {
  size_t n = 0;
  while (n < cap) {
    ssize_t r = pread(fd, buf + n, cap - n, (off_t)n);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return errno == ENOENT ? -ESRCH : -errno;
    if (r == 0) break;
    n += (size_t)r;
  }
  return n == cap ? -EOVERFLOW : (ssize_t)n;
}

void agent_procstat_close(agent_proc_files_t *f) {
  for (int i = 0; i < 3; i++) {
    if (f->fd[i] >= 0) close(f->fd[i]);
    f->fd[i] = -1;
  }
  f->pid = 0;
}

int agent_procstat_open(agent_proc_files_t *f, const char *proc_root, pid_t pid) {
  static const char *const names[3] = {"stat", "status", "io"};
  char path[300];
  agent_procstat_close(f);
  if (pid <= 0) return -EINVAL;
  for (int i = 0; i < 3; i++) {
    snprintf(path, sizeof path, "%s/%d/%s", proc_root ? proc_root : "/proc", (int)pid, names[i]);
    f->fd[i] = open(path, O_RDONLY | O_CLOEXEC);
    /* io needs ptrace read access (a worker that changed its credentials) and a kernel with
     * task I/O accounting: go on without it. */
    if (f->fd[i] < 0 && i < 2) {
      int e = errno == ENOENT ? ESRCH : errno;
      agent_procstat_close(f);
      return -e;
    }
  }
  f->pid = pid;
  return 0;
}

int agent_procstat_sample(agent_proc_files_t *f, agent_proc_sample_t *s, char *buf, size_t cap) {
  agent_proc_sample_t x;
  memset(&x, 0, sizeof x);
  if (cap < 4096 || f->pid <= 0) return -EINVAL;
  x.t_ns = mono_ns();
  ssize_t n = pread_all(f->fd[0], buf, cap);
  if (n < 0) return (int)n;
  /* An empty file: the process was reaped between open and read. */
  if (n == 0) return -ESRCH;
  if (agent_procstat_parse_stat(buf, (size_t)n, &x)) return -EPROTO;
  n = pread_all(f->fd[1], buf, cap);
  if (n < 0) return (int)n;
  if (n == 0) return -ESRCH;
  if (agent_procstat_parse_status(buf, (size_t)n, &x)) return -EPROTO;
  if (f->fd[2] >= 0) {
    n = pread_all(f->fd[2], buf, cap);
    if (n > 0 && agent_procstat_parse_io(buf, (size_t)n, &x)) return -EPROTO;
  }
  *s = x;
  return 0;
}

int agent_procstat_read(const char *proc_root, pid_t pid, agent_proc_sample_t *s, char *buf,
                        size_t cap) {
  if (cap < 4096 || pid <= 0) return -EINVAL;
  agent_proc_files_t f = AGENT_PROC_FILES_INIT;
  int rc = agent_procstat_open(&f, proc_root, pid);
  if (!rc) rc = agent_procstat_sample(&f, s, buf, cap);
  agent_procstat_close(&f);
  return rc;
}

static int tid_cmp(const void *a, const void *b) {
  pid_t x = ((const agent_thread_info_t *)a)->tid, y = ((const agent_thread_info_t *)b)->tid;
  return (x > y) - (x < y);
}

/* One small file of a thread into out (cap), trailing newline removed; "" when unreadable. */
static void thread_text(const char *root, pid_t pid, pid_t tid, const char *name, char *out,
                        size_t cap) {
  char path[256], buf[512];
  snprintf(path, sizeof path, "%s/%d/task/%d/%s", root, (int)pid, (int)tid, name);
  ssize_t n = read_proc_file(path, buf, sizeof buf);
  if (n < 0) n = 0;
  while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\0')) n--;
  if ((size_t)n >= cap) n = (ssize_t)cap - 1;
  memcpy(out, buf, (size_t)n);
  out[n] = 0;
}

int agent_procstat_threads(const char *proc_root, pid_t pid, agent_thread_info_t *out, int max,
                           int *total) {
  char path[256];
  const char *root = proc_root ? proc_root : "/proc";
  snprintf(path, sizeof path, "%s/%d/task", root, (int)pid);
  *total = 0;
  DIR *d = opendir(path);
  if (!d) return errno == ENOENT ? -ESRCH : -errno;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    char *endp;
    long tid = strtol(e->d_name, &endp, 10);
    if (*endp || tid <= 0) continue;
    (*total)++;
    if (n < max) out[n++].tid = (pid_t)tid;
  }
  closedir(d);
  qsort(out, (size_t)n, sizeof *out, tid_cmp);
  for (int i = 0; i < n; i++) {
    char stat[512];
    thread_text(root, pid, out[i].tid, "comm", out[i].comm, sizeof out[i].comm);
    thread_text(root, pid, out[i].tid, "wchan", out[i].wchan, sizeof out[i].wchan);
    thread_text(root, pid, out[i].tid, "stat", stat, sizeof stat);
    agent_proc_sample_t t;
    out[i].state = agent_procstat_parse_stat(stat, strlen(stat), &t) ? '?' : t.state;
  }
  return n;
}
