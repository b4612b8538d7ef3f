/* A store in a shared file (PyTorch's FileStore idea): an append-only log of records that every
 * process replays. Each operation takes an exclusive flock on the file, replays records it has not
 * seen yet into a local map (kv.c), applies the operation and appends what changed. WAIT polls the
 * file every few milliseconds. Meant for init (file:// on a shared filesystem or one host), not for
 * hot paths. Queues are not supported. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "runtime/common/clock.h"
#include "runtime/store/kv.h"
#include "runtime/store/proto.h"
#include "runtime/store/store_internal.h"

#define REC_SET 1
#define REC_DEL 2
#define POLL_MS 5
#define MAX_RECORD ((uint64_t)1 << 34) /* a longer length is a corrupt file */

typedef struct {
  tdist_store_t base;
  int fd;
  char *path;
  off_t seen; /* bytes of the log applied to kv */
  tdist__kv_t *kv;
} file_store_t;

static file_store_t *F(tdist_store_t *s) { return (file_store_t *)s; }

static tdist_status_t sys_fail(file_store_t *f, const char *op) {
  return tdist__store_fail(&f->base, TDIST_ERR_SYSTEM, "file store %s on %s: %s", op, f->path,
                           strerror(errno));
}

/* Replays records appended since the last call. Lock held. */
static tdist_status_t catch_up(file_store_t *f) {
  struct stat st;
  if (fstat(f->fd, &st) != 0) return sys_fail(f, "fstat");
  while (f->seen < st.st_size) {
    uint8_t hdr[17];
    if (pread(f->fd, hdr, sizeof hdr, f->seen) != (ssize_t)sizeof hdr) break;
    uint64_t kl = tdist__get_u64(hdr + 1), vl = tdist__get_u64(hdr + 9);
    if (kl > MAX_RECORD || vl > MAX_RECORD || (hdr[0] != REC_SET && hdr[0] != REC_DEL))
      return tdist__store_fail(&f->base, TDIST_ERR_PROTOCOL,
                               "file store %s: corrupt record at offset %lld", f->path,
                               (long long)f->seen);
    uint8_t *buf = malloc(kl + vl + 1);
    if (!buf) return tdist__store_fail(&f->base, TDIST_ERR_NO_MEMORY, "file store: out of memory");
    if (pread(f->fd, buf, kl + vl, f->seen + 17) != (ssize_t)(kl + vl)) {
      free(buf);
      break; /* a writer crashed mid-record: ignore the torn tail */
    }
    int r = hdr[0] == REC_SET ? tdist__kv_set(f->kv, buf, kl, buf + kl, vl, NULL)
                              : (tdist__kv_delete(f->kv, buf, kl), 0);
    free(buf);
    if (r) return tdist__store_fail(&f->base, TDIST_ERR_NO_MEMORY, "file store: out of memory");
    f->seen += (off_t)(17 + kl + vl);
  }
  return TDIST_OK;
}

static tdist_status_t append_rec(file_store_t *f, int type, const char *key, const void *v,
                                 size_t vl) {
  size_t kl = strlen(key);
  uint8_t hdr[17];
  hdr[0] = (uint8_t)type;
  tdist__put_u64(hdr + 1, kl);
  tdist__put_u64(hdr + 9, vl);
  struct stat st;
  if (fstat(f->fd, &st) != 0) return sys_fail(f, "fstat");
  if (pwrite(f->fd, hdr, 17, st.st_size) != 17 ||
      (kl && pwrite(f->fd, key, kl, st.st_size + 17) != (ssize_t)kl) ||
      (vl && pwrite(f->fd, v, vl, st.st_size + 17 + (off_t)kl) != (ssize_t)vl))
    return sys_fail(f, "write");
  return catch_up(f);
}

static tdist_status_t lock(file_store_t *f) {
  while (flock(f->fd, LOCK_EX) != 0)
    if (errno != EINTR) return sys_fail(f, "flock");
  return catch_up(f);
}
static void unlock(file_store_t *f) { flock(f->fd, LOCK_UN); }

static tdist_status_t fs_wait(tdist_store_t *s, const char *const *keys, size_t n, int64_t to) {
  file_store_t *f = F(s);
  int64_t deadline = tdist__now_ms() + to;
  for (;;) {
    tdist_status_t st = lock(f);
    int ok = st == TDIST_OK && tdist__kv_all_exist(f->kv, keys, n);
    unlock(f);
    if (st || ok) return st;
    if (tdist__now_ms() >= deadline) {
      char ks[256];
      tdist__store_keys_str(keys, n, ks, sizeof ks);
      return tdist__store_fail(s, TDIST_ERR_TIMEOUT,
                               "file store %s: wait timed out after %lld ms for keys %s", f->path,
                               (long long)to, ks);
    }
    struct timespec ts = {0, POLL_MS * 1000000};
    nanosleep(&ts, NULL);
  }
}

static tdist_status_t fs_set(tdist_store_t *s, const char *key, const void *v, size_t n,
                             int64_t to) {
  file_store_t *f = F(s);
  tdist_status_t st = lock(f);
  if (!st) st = append_rec(f, REC_SET, key, v, n);
  unlock(f);
  return st;
}

static tdist_status_t fs_get(tdist_store_t *s, const char *key, void **v, size_t *n, int64_t to) {
  file_store_t *f = F(s);
  tdist_status_t st = fs_wait(s, &key, 1, to);
  if (st || (st = lock(f))) return st;
  tdist__kv_entry_t *e = tdist__kv_find(f->kv, key, strlen(key));
  *n = e && e->has_value ? e->vlen : 0;
  *v = tdist__kv_dup(e && e->has_value ? e->val : NULL, *n);
  unlock(f);
  return *v ? TDIST_OK : tdist__store_fail(s, TDIST_ERR_NO_MEMORY, "file store: out of memory");
}

static tdist_status_t fs_add(tdist_store_t *s, const char *key, int64_t delta, int64_t *res,
                             int64_t to) {
  file_store_t *f = F(s);
  tdist_status_t st = lock(f);
  if (st) return st;
  tdist__kv_entry_t *e = tdist__kv_find(f->kv, key, strlen(key));
  int64_t cur = 0;
  if (e && e->has_value && tdist__kv_parse_int(e->val, e->vlen, &cur) != 0) {
    unlock(f);
    return tdist__store_fail(s, TDIST_ERR_INVALID_USAGE,
                             "file store add on key '%s': the value is not an integer", key);
  }
  int64_t v = (int64_t)((uint64_t)cur + (uint64_t)delta);
  char text[24];
  int len = snprintf(text, sizeof text, "%lld", (long long)v);
  st = append_rec(f, REC_SET, key, text, (size_t)len);
  unlock(f);
  if (!st) *res = v;
  return st;
}

static tdist_status_t fs_compare_set(tdist_store_t *s, const char *key, const void *e, size_t en,
                                     const void *d, size_t dn, void **out, size_t *outn,
                                     int64_t to) {
  file_store_t *f = F(s);
  tdist_status_t st = lock(f);
  if (st) return st;
  tdist__kv_entry_t *cur = tdist__kv_find(f->kv, key, strlen(key));
  const void *reply = e;
  size_t rlen = en;
  if ((!cur || !cur->has_value) ? en == 0
                                : (cur->vlen == en && (en == 0 || memcmp(cur->val, e, en) == 0))) {
    st = append_rec(f, REC_SET, key, d, dn);
    reply = d;
    rlen = dn;
  } else if (cur && cur->has_value) {
    reply = cur->val;
    rlen = cur->vlen;
  }
  if (!st) {
    *out = tdist__kv_dup(reply, rlen);
    *outn = rlen;
    if (!*out) st = tdist__store_fail(s, TDIST_ERR_NO_MEMORY, "file store: out of memory");
  }
  unlock(f);
  return st;
}

static tdist_status_t fs_check(tdist_store_t *s, const char *const *keys, size_t n, int *ready,
                               int64_t to) {
  file_store_t *f = F(s);
  tdist_status_t st = lock(f);
  if (!st) *ready = tdist__kv_all_exist(f->kv, keys, n);
  unlock(f);
  return st;
}

static tdist_status_t fs_delete(tdist_store_t *s, const char *key, int *deleted, int64_t to) {
  file_store_t *f = F(s);
  tdist_status_t st = lock(f);
  if (st) return st;
  tdist__kv_entry_t *e = tdist__kv_find(f->kv, key, strlen(key));
  *deleted = e && e->has_value;
  if (*deleted) st = append_rec(f, REC_DEL, key, NULL, 0);
  unlock(f);
  return st;
}

static tdist_status_t fs_num_keys(tdist_store_t *s, int64_t *n, int64_t to) {
  file_store_t *f = F(s);
  tdist_status_t st = lock(f);
  if (!st) *n = (int64_t)tdist__kv_num_keys(f->kv);
  unlock(f);
  return st;
}

static tdist_status_t fs_append(tdist_store_t *s, const char *key, const void *v, size_t n,
                                int64_t to) {
  file_store_t *f = F(s);
  tdist_status_t st = lock(f);
  if (st) return st;
  tdist__kv_entry_t *e = tdist__kv_find(f->kv, key, strlen(key));
  size_t old = e && e->has_value ? e->vlen : 0;
  uint8_t *buf = malloc(old + n + 1);
  if (!buf) {
    unlock(f);
    return tdist__store_fail(s, TDIST_ERR_NO_MEMORY, "file store: out of memory");
  }
  if (old) memcpy(buf, e->val, old);
  if (n) memcpy(buf + old, v, n);
  st = append_rec(f, REC_SET, key, buf, old + n);
  free(buf);
  unlock(f);
  return st;
}

static tdist_status_t fs_multi_get(tdist_store_t *s, const char *const *keys, size_t n, void **vals,
                                   size_t *lens, int64_t to) {
  tdist_status_t st = fs_wait(s, keys, n, to);
  for (size_t i = 0; !st && i < n; i++) st = fs_get(s, keys[i], &vals[i], &lens[i], to);
  if (st)
    for (size_t i = 0; i < n; i++) {
      free(vals[i]);
      vals[i] = NULL;
      lens[i] = 0;
    }
  return st;
}

static tdist_status_t fs_multi_set(tdist_store_t *s, const char *const *keys,
                                   const void *const *vals, const size_t *lens, size_t n,
                                   int64_t to) {
  file_store_t *f = F(s);
  tdist_status_t st = lock(f);
  for (size_t i = 0; !st && i < n; i++) st = append_rec(f, REC_SET, keys[i], vals[i], lens[i]);
  unlock(f);
  return st;
}

static tdist_status_t no_queue(tdist_store_t *s) {
  return tdist__store_fail(s, TDIST_ERR_NOT_AVAILABLE, "file store: queues are not supported");
}
static tdist_status_t fs_queue_push(tdist_store_t *s, const char *k, const void *v, size_t n,
                                    int64_t to) {
  return no_queue(s);
}
static tdist_status_t fs_queue_pop(tdist_store_t *s, const char *k, int64_t w, void **v, size_t *n,
                                   int64_t to) {
  return no_queue(s);
}
static tdist_status_t fs_queue_len(tdist_store_t *s, const char *k, int64_t *n, int64_t to) {
  return no_queue(s);
}

static void fs_destroy(tdist_store_t *s) {
  file_store_t *f = F(s);
  close(f->fd);
  tdist__kv_destroy(f->kv);
  free(f->path);
  free(f);
}

static const tdist__store_vtable_t k_file_vt = {
    "file",
    fs_destroy,
    fs_set,
    fs_get,
    fs_add,
    fs_compare_set,
    fs_check,
    fs_wait,
    fs_delete,
    fs_num_keys,
    fs_append,
    fs_multi_get,
    fs_multi_set,
    fs_queue_push,
    fs_queue_pop,
    fs_queue_len,
    0 /* thread_safe */,
    NULL /* inner */
};

TDIST_EXTERN tdist_status_t tdist_file_store_create(const char *path, int64_t timeout_ms,
                                                    tdist_store_t **out) {
  if (!out) return tdist__fail(TDIST_ERR_INVALID_ARGUMENT, "tdist_file_store_create: out is NULL");
  *out = NULL;
  if (!path || !*path)
    return tdist__fail(TDIST_ERR_INVALID_ARGUMENT, "tdist_file_store_create: path is empty");
  file_store_t *f = calloc(1, sizeof *f);
  if (!f) return tdist__fail(TDIST_ERR_NO_MEMORY, "tdist_file_store_create: out of memory");
  f->fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (f->fd < 0) {
    int e = errno;
    free(f);
    return tdist__fail(TDIST_ERR_SYSTEM, "file store: cannot open '%s': %s", path, strerror(e));
  }
  f->path = strdup(path);
  f->kv = tdist__kv_create();
  if (!f->path || !f->kv) {
    close(f->fd);
    free(f->path);
    tdist__kv_destroy(f->kv);
    free(f);
    return tdist__fail(TDIST_ERR_NO_MEMORY, "tdist_file_store_create: out of memory");
  }
  tdist__store_init(&f->base, &k_file_vt, timeout_ms);
  *out = &f->base;
  return TDIST_OK;
}
