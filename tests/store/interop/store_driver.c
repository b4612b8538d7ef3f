/* A scripted TCPStore client session for the interop tests, written only against the public
 * header tdist/store.h.
 *
 * It connects with dialect AUTO, performs a fixed sequence of operations (random data from
 * --seed) and prints one canonical transcript line per answer on stdout, so the caller can run it
 * against a real PyTorch master server (1.13 or 2.x) and against tdist-store and compare the two
 * outputs. Every answer is also checked here against the value the reference says it must have;
 * failures go to stderr and make the exit status 1. Things that legitimately differ between the
 * servers (the dialect, 2.x-only ops, queues, timings) are checked but kept out of the transcript.
 *
 *   store_driver --port P --seed S --expect-dialect v1_13|v2 --expect-queues yes|no [--host H]
 *                [--check-manifest FILE]   keys a Python client wrote first: "keyhex valhex" lines
 *                                          and "#num_keys N"
 *                [--manifest-out FILE]     the keys this run leaves behind, same format, for a
 *                                          Python client to read back
 *
 * --expect-queues: whether the server has QUEUE_PUSH/POP/LEN (ours on a 2.x connection: yes;
 * PyTorch 1.13 and 2.6: no, and every queue op must then be refused at once with NOT_AVAILABLE).
 *
 * It never waits without a deadline: every call is bounded by the handle's timeout (10 s). */
#define _POSIX_C_SOURCE 200809L

#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tdist/store.h"
#include "tests/testlib/clock.h"
#include "tests/testlib/rng.h"

#define CALL_TIMEOUT_MS 10000

static int g_failures;
static uint64_t g_seed;
static int64_t g_keys; /* model: how many keys the server must hold */

/* ---------------------------------------------------------------------------------------- */

static void fail(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "FAIL: ");
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, " (seed %" PRIu64 ")\n", g_seed);
  va_end(ap);
  g_failures++;
}

static void rec(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vprintf(fmt, ap);
  putchar('\n');
  va_end(ap);
  fflush(stdout);
}

/* Canonical rendering of a value: hex when short, else length + FNV-1a 64. */
static const char *render(const void *p, size_t n) {
  static char buf[256];
  const uint8_t *b = p;
  if (n <= 48) {
    int off = snprintf(buf, sizeof buf, "bytes[%zu]=", n);
    for (size_t i = 0; i < n; i++)
      off += snprintf(buf + off, sizeof buf - (size_t)off, "%02x", b[i]);
  } else {
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    snprintf(buf, sizeof buf, "bytes[%zu] fnv1a=%016" PRIx64, n, h);
  }
  return buf;
}

static const char *sname(tdist_status_t st) { return tdist_status_name(st); }

/* ---------------------------------------------------------------------------------------- */

static void expect_status(tdist_store_t *s, const char *what, tdist_status_t got,
                          tdist_status_t want) {
  rec("%s -> %s", what, sname(got));
  if (got != want)
    fail("%s: got %s, want %s (%s)", what, sname(got), sname(want), tdist_store_last_error(s));
}

static void do_set(tdist_store_t *s, const char *key, const void *v, size_t n, int new_key) {
  char what[160];
  snprintf(what, sizeof what, "set %s", key);
  expect_status(s, what, tdist_store_set(s, key, v, n), TDIST_OK);
  g_keys += new_key;
}

static void do_get(tdist_store_t *s, const char *label, const char *key, const void *want,
                   size_t want_len) {
  void *v = NULL;
  size_t n = 0;
  tdist_status_t st = tdist_store_get(s, key, &v, &n);
  if (st != TDIST_OK) {
    rec("get %s%s -> %s", key, label, sname(st));
    fail("get %s%s: %s (%s)", key, label, sname(st), tdist_store_last_error(s));
  } else {
    rec("get %s%s -> OK %s", key, label, render(v, n));
    if (n != want_len || (n && memcmp(v, want, n) != 0)) {
      char got_r[256];
      snprintf(got_r, sizeof got_r, "%s", render(v, n));
      fail("get %s%s: got %s, want %s", key, label, got_r, render(want, want_len));
    }
  }
  tdist_free(v);
}

static void do_add(tdist_store_t *s, const char *key, int64_t delta, int64_t want) {
  int64_t r = 0;
  tdist_status_t st = tdist_store_add(s, key, delta, &r);
  if (st != TDIST_OK) {
    rec("add %s %" PRId64 " -> %s", key, delta, sname(st));
    fail("add %s %" PRId64 ": %s (%s)", key, delta, sname(st), tdist_store_last_error(s));
  } else {
    rec("add %s %" PRId64 " -> OK %" PRId64, key, delta, r);
    if (r != want) fail("add %s %" PRId64 ": got %" PRId64 ", want %" PRId64, key, delta, r, want);
  }
}

static void do_cas(tdist_store_t *s, const char *label, const char *key, const char *expected,
                   const char *desired, const char *want) {
  void *v = NULL;
  size_t n = 0;
  tdist_status_t st =
      tdist_store_compare_set(s, key, expected, strlen(expected), desired, strlen(desired), &v, &n);
  if (st != TDIST_OK) {
    rec("compare_set %s (%s) -> %s", key, label, sname(st));
    fail("compare_set %s (%s): %s (%s)", key, label, sname(st), tdist_store_last_error(s));
  } else {
    rec("compare_set %s (%s) -> OK %s", key, label, render(v, n));
    if (n != strlen(want) || memcmp(v, want, n) != 0)
      fail("compare_set %s (%s): got '%.*s', want '%s'", key, label, (int)n, (char *)v, want);
  }
  tdist_free(v);
}

static void do_num_keys(tdist_store_t *s, const char *label) {
  int64_t n = -1;
  tdist_status_t st = tdist_store_num_keys(s, &n);
  if (st != TDIST_OK) {
    rec("num_keys%s -> %s", label, sname(st));
    fail("num_keys%s: %s (%s)", label, sname(st), tdist_store_last_error(s));
    return;
  }
  rec("num_keys%s -> OK %" PRId64, label, n);
  if (n != g_keys) fail("num_keys%s: got %" PRId64 ", model says %" PRId64, label, n, g_keys);
}

static void do_check(tdist_store_t *s, const char *label, const char *const *keys, size_t n,
                     int want) {
  int ready = -1;
  tdist_status_t st = tdist_store_check(s, keys, n, &ready);
  rec("check %s -> %s ready=%d", label, sname(st), ready);
  if (st != TDIST_OK || ready != want)
    fail("check %s: %s ready=%d, want OK ready=%d (%s)", label, sname(st), ready, want,
         tdist_store_last_error(s));
}

static void do_delete(tdist_store_t *s, const char *key, int want) {
  int deleted = -1;
  tdist_status_t st = tdist_store_delete_key(s, key, &deleted);
  rec("delete_key %s -> %s deleted=%d", key, sname(st), deleted);
  if (st != TDIST_OK || deleted != want)
    fail("delete_key %s: %s deleted=%d, want OK deleted=%d (%s)", key, sname(st), deleted, want,
         tdist_store_last_error(s));
  if (st == TDIST_OK && deleted == 1) g_keys--;
}

/* ---------------------------------------------------------------------------------------- */
/* Manifests: "keyhex valhex" per line, plus "#num_keys N".                                   */

static int hexval(int c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

/* Decodes hex in place; returns the byte count or -1. */
static long unhex(char *s) {
  size_t n = strlen(s);
  if (n % 2) return -1;
  for (size_t i = 0; i < n / 2; i++) {
    int hi = hexval(s[2 * i]), lo = hexval(s[2 * i + 1]);
    if (hi < 0 || lo < 0) return -1;
    s[i] = (char)(hi * 16 + lo);
  }
  s[n / 2] = '\0';
  return (long)(n / 2);
}

static void check_manifest(tdist_store_t *s, const char *path) {
  FILE *f = fopen(path, "r");
  if (!f) {
    fail("cannot open manifest %s", path);
    return;
  }
  char *line = NULL;
  size_t cap = 0;
  ssize_t got;
  int i = 0;
  int64_t want_keys = -1;
  while ((got = getline(&line, &cap, f)) > 0) {
    while (got > 0 && (line[got - 1] == '\n' || line[got - 1] == '\r')) line[--got] = '\0';
    if (got == 0) continue;
    if (line[0] == '#') {
      sscanf(line, "#num_keys %" SCNd64, &want_keys);
      continue;
    }
    char *sp = strchr(line, ' ');
    if (!sp) {
      fail("manifest %s: bad line %d", path, i);
      continue;
    }
    *sp = '\0';
    char *val = sp + 1;
    long klen = unhex(line), vlen = unhex(val);
    if (klen < 0 || vlen < 0 || (size_t)klen != strlen(line)) {
      fail("manifest %s: bad hex on line %d", path, i);
      continue;
    }
    char label[64];
    snprintf(label, sizeof label, " (python-written #%d)", i);
    do_get(s, label, line, val, (size_t)vlen);
    i++;
  }
  free(line);
  fclose(f);
  if (want_keys < 0) {
    fail("manifest %s has no #num_keys line", path);
    want_keys = 0;
  }
  g_keys = want_keys;
  do_num_keys(s, " (after the python writes)");
}

typedef struct {
  const char *key;
  const void *val;
  size_t len;
} kv_t;

static void write_manifest(const char *path, const kv_t *kvs, size_t n, int64_t num_keys) {
  FILE *f = fopen(path, "w");
  if (!f) {
    fail("cannot write manifest %s", path);
    return;
  }
  for (size_t i = 0; i < n; i++) {
    for (const char *k = kvs[i].key; *k; k++) fprintf(f, "%02x", (unsigned char)*k);
    fputc(' ', f);
    const uint8_t *v = kvs[i].val;
    for (size_t j = 0; j < kvs[i].len; j++) fprintf(f, "%02x", v[j]);
    fputc('\n', f);
  }
  fprintf(f, "#num_keys %" PRId64 "\n", num_keys);
  if (fclose(f) != 0) fail("writing manifest %s failed", path);
}

/* ---------------------------------------------------------------------------------------- */

static tdist_store_t *connect_or_die(const char *host, int port) {
  tdist_tcp_store_options_t o = TDIST_TCP_STORE_OPTIONS_INIT;
  o.host = host;
  o.port = port;
  o.connect_timeout_ms = 10000;
  o.timeout_ms = CALL_TIMEOUT_MS;
  o.dialect = TDIST_STORE_DIALECT_AUTO;
  tdist_store_t *s = NULL;
  int64_t t0 = now_ms();
  tdist_status_t st = tdist_tcp_store_connect(&o, &s);
  if (st != TDIST_OK) {
    fprintf(stderr, "FAIL: connect %s:%d: %s: %s (seed %" PRIu64 ")\n", host, port, sname(st),
            tdist_last_error(), g_seed);
    exit(1);
  }
  fprintf(stderr, "connected to %s:%d in %" PRId64 " ms, dialect %d\n", host, port, now_ms() - t0,
          (int)tdist_tcp_store_dialect(s));
  return s;
}

/* A second thread with its own handle sets a key after a delay (a handle is single-threaded). */
typedef struct {
  tdist_store_t *s;
  const char *key;
  int delay_ms;
  tdist_status_t st;
} late_setter_t;

static void *late_setter(void *arg) {
  late_setter_t *ls = arg;
  sleep_ms(ls->delay_ms);
  ls->st = tdist_store_set(ls->s, ls->key, "released", 8);
  return NULL;
}

/* `what` blocks on h until a thread sets `key` through h3 after 300 ms: it must return OK after
 * the set, not before, and not time out. */
static void blocked_until_set(tdist_store_t *h, tdist_store_t *h3, const char *what,
                              const char *key, int use_get) {
  late_setter_t ls = {h3, key, 300, TDIST_ERR_INTERNAL};
  pthread_t t;
  int64_t t0 = now_ms();
  if (pthread_create(&t, NULL, late_setter, &ls) != 0) {
    fail("pthread_create");
    return;
  }
  if (use_get) {
    do_get(h, " (blocked until another thread sets it)", key, "released", 8);
  } else {
    const char *keys[] = {"c/str", key};
    expect_status(h, what, tdist_store_wait(h, keys, 2, 5000), TDIST_OK);
  }
  int64_t dt = now_ms() - t0;
  pthread_join(t, NULL);
  g_keys++;
  if (ls.st != TDIST_OK) fail("%s: the setter thread got %s", what, sname(ls.st));
  if (dt < 250) fail("%s returned after %" PRId64 " ms, before the key was set (300 ms)", what, dt);
}

static const char *dialect_name(tdist_store_dialect_t d) {
  switch (d) {
    case TDIST_STORE_DIALECT_AUTO: return "AUTO";
    case TDIST_STORE_DIALECT_V2: return "V2";
    case TDIST_STORE_DIALECT_V1_13: return "V1_13";
  }
  return "?";
}

/* `what` must fail with `want` promptly (a refusal, not a timeout) and say why. */
static void expect_refused(tdist_store_t *h, const char *what, tdist_status_t st, int64_t t0,
                           tdist_status_t want, const char *must_mention) {
  int64_t dt = now_ms() - t0;
  const char *err = tdist_store_last_error(h);
  if (st != want)
    fail("%s: %s, want %s (%s)", what, sname(st), sname(want), err);
  else if (dt > 3000)
    fail("%s: refused only after %" PRId64 " ms", what, dt);
  else if (!strstr(err, must_mention))
    fail("%s: the error does not mention '%s': '%s'", what, must_mention, err);
  else
    fprintf(stderr, "%s: %s in %" PRId64 " ms: %s\n", what, sname(st), dt, err);
}

/* The connection still answers correctly after refused operations. */
static void still_works(tdist_store_t *h, const char *after) {
  void *v = NULL;
  size_t n = 0;
  tdist_status_t st = tdist_store_get(h, "c/str", &v, &n);
  if (st != TDIST_OK || n != 5 || memcmp(v, "hello", 5) != 0)
    fail("get after %s: %s (%s)", after, sname(st), tdist_store_last_error(h));
  tdist_free(v);
  int64_t k = -1;
  st = tdist_store_num_keys(h, &k);
  if (st != TDIST_OK || k != g_keys)
    fail("num_keys after %s: %s %" PRId64 ", model %" PRId64, after, sname(st), k, g_keys);
}

/* Queues on a 2.x server that has them (ours): push / len / pop, an empty pop. */
static void queues_work(tdist_store_t *h) {
  tdist_status_t st;
  int64_t len = -1;
  void *v = NULL;
  size_t n = 0;
  if ((st = tdist_store_queue_len(h, "c/q", &len)) != TDIST_OK || len != 0)
    fail("queue_len of a new queue: %s %" PRId64 " (%s)", sname(st), len,
         tdist_store_last_error(h));
  if ((st = tdist_store_queue_push(h, "c/q", "q1", 2)) != TDIST_OK ||
      (st = tdist_store_queue_push(h, "c/q", "", 0)) != TDIST_OK)
    fail("queue_push: %s (%s)", sname(st), tdist_store_last_error(h));
  if ((st = tdist_store_queue_len(h, "c/q", &len)) != TDIST_OK || len != 2)
    fail("queue_len after 2 pushes: %s %" PRId64, sname(st), len);
  st = tdist_store_queue_pop(h, "c/q", 0, &v, &n);
  if (st != TDIST_OK || n != 2 || memcmp(v, "q1", 2) != 0) fail("queue_pop #1: %s", sname(st));
  tdist_free(v);
  v = NULL;
  st = tdist_store_queue_pop(h, "c/q", 1000, &v, &n);
  if (st != TDIST_OK || n != 0) fail("queue_pop #2 (empty item): %s len %zu", sname(st), n);
  tdist_free(v);
  v = NULL;
  int64_t t0 = now_ms();
  st = tdist_store_queue_pop(h, "c/q", 0, &v, &n);
  expect_refused(h, "queue_pop of an empty queue, no wait", st, t0, TDIST_ERR_NOT_FOUND, "empty");
  tdist_free(v);
}

/* Ops whose outcome depends on the server: checked, kept out of the transcript. `queues`: the
 * server has QUEUE_* (ours, speaking 2.x), or not (PyTorch 1.13 and 2.6). */
static void dialect_specific(tdist_store_t *h, tdist_store_dialect_t d, int queues) {
  tdist_status_t st;
  int64_t t0, len;
  void *v = NULL;
  size_t n = 0;
  if (d == TDIST_STORE_DIALECT_V1_13) {
    t0 = now_ms();
    st = tdist_store_append(h, "c/app", "x", 1);
    expect_refused(h, "append on a 1.13 server", st, t0, TDIST_ERR_NOT_AVAILABLE, "1.13");
    t0 = now_ms();
    st = tdist_store_queue_push(h, "c/q", "x", 1);
    expect_refused(h, "queue_push on a 1.13 server", st, t0, TDIST_ERR_NOT_AVAILABLE, "1.13");
    /* Refusing locally must not have broken the connection. */
    still_works(h, "refused 2.x-only ops");
    return;
  }
  st = tdist_store_append(h, "c/app", "ab", 2);
  if (st != TDIST_OK) fail("append (create) on V2: %s (%s)", sname(st), tdist_store_last_error(h));
  st = tdist_store_append(h, "c/app", "\0c", 2);
  if (st != TDIST_OK) fail("append on V2: %s (%s)", sname(st), tdist_store_last_error(h));
  st = tdist_store_get(h, "c/app", &v, &n);
  if (st != TDIST_OK || n != 4 || memcmp(v, "ab\0c", 4) != 0)
    fail("get after append on V2: %s len=%zu", sname(st), n);
  tdist_free(v);
  v = NULL;
  int deleted = 0;
  st = tdist_store_delete_key(h, "c/app", &deleted);
  if (st != TDIST_OK || deleted != 1) fail("delete c/app on V2: %s %d", sname(st), deleted);
  if (queues) {
    queues_work(h);
    still_works(h, "queue ops");
    return;
  }
  /* A 2.x server without queues (PyTorch 2.6): each queue op is refused with NOT_AVAILABLE at
   * once, naming what is missing, never a hang or a bare "connection closed"; the blocking pop
   * too, on a fresh handle that has not learnt it yet. */
  t0 = now_ms();
  st = tdist_store_queue_push(h, "c/q", "x", 1);
  expect_refused(h, "queue_push on a 2.x server without queues", st, t0, TDIST_ERR_NOT_AVAILABLE,
                 "queue");
  still_works(h, "a refused queue_push");
  t0 = now_ms();
  st = tdist_store_queue_len(h, "c/q", &len);
  expect_refused(h, "queue_len on a 2.x server without queues", st, t0, TDIST_ERR_NOT_AVAILABLE,
                 "queue");
  t0 = now_ms();
  st = tdist_store_queue_pop(h, "c/q", 0, &v, &n);
  expect_refused(h, "queue_pop on a 2.x server without queues", st, t0, TDIST_ERR_NOT_AVAILABLE,
                 "queue");
  tdist_free(v);
  v = NULL;
  still_works(h, "refused queue ops");
}

int main(int argc, char **argv) {
  const char *host = "127.0.0.1", *check_path = NULL, *out_path = NULL, *want_dialect = NULL;
  const char *want_queues = NULL;
  int port = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--host"))
      host = argv[i + 1];
    else if (!strcmp(argv[i], "--port"))
      port = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--seed"))
      g_seed = strtoull(argv[i + 1], NULL, 10);
    else if (!strcmp(argv[i], "--expect-dialect"))
      want_dialect = argv[i + 1];
    else if (!strcmp(argv[i], "--check-manifest"))
      check_path = argv[i + 1];
    else if (!strcmp(argv[i], "--manifest-out"))
      out_path = argv[i + 1];
    else if (!strcmp(argv[i], "--expect-queues"))
      want_queues = argv[i + 1];
    else {
      fprintf(stderr, "unknown argument %s\n", argv[i]);
      return 2;
    }
  }
  if (port <= 0 || !want_dialect || !want_queues ||
      (strcmp(want_queues, "yes") && strcmp(want_queues, "no"))) {
    fprintf(stderr,
            "usage: %s --port P --seed S --expect-dialect v1_13|v2 --expect-queues yes|no "
            "[--host H] [--check-manifest F] [--manifest-out F]\n",
            argv[0]);
    return 2;
  }
  test_rng_seed(&test_rng, g_seed);
  tdist_store_dialect_t want_d =
      !strcmp(want_dialect, "v2") ? TDIST_STORE_DIALECT_V2 : TDIST_STORE_DIALECT_V1_13;

  tdist_store_t *h = connect_or_die(host, port);
  tdist_store_t *h2 = connect_or_die(host, port);
  tdist_store_dialect_t d = tdist_tcp_store_dialect(h);
  if (d != want_d || tdist_tcp_store_dialect(h2) != want_d)
    fail("dialect: got %s / %s, want %s", dialect_name(d),
         dialect_name(tdist_tcp_store_dialect(h2)), dialect_name(want_d));
  if (tdist_store_timeout(h) != CALL_TIMEOUT_MS)
    fail("tdist_store_timeout: %" PRId64 ", want %d", tdist_store_timeout(h), CALL_TIMEOUT_MS);

  if (check_path)
    check_manifest(h, check_path);
  else
    do_num_keys(h, " (fresh server)");

  /* set / get, binary, empty, large */
  do_set(h, "c/str", "hello", 5, 1);
  do_get(h2, " (other handle)", "c/str", "hello", 5);
  size_t bin_len = 1000;
  uint8_t *bin = malloc(bin_len);
  rnd_bytes(bin, bin_len);
  bin[0] = bin[bin_len / 2] = bin[bin_len - 1] = 0;
  do_set(h, "c/bin", bin, bin_len, 1);
  do_get(h2, "", "c/bin", bin, bin_len);
  do_set(h, "c/empty", "", 0, 1);
  do_get(h2, "", "c/empty", "", 0);
  size_t big_len = (2u << 20) + 3;
  uint8_t *big = malloc(big_len);
  rnd_bytes(big, big_len);
  do_set(h2, "c/big", big, big_len, 1);
  do_get(h, "", "c/big", big, big_len);
  /* "ключ/日本" in UTF-8 */
  const char *ukey = "\xd0\xba\xd0\xbb\xd1\x8e\xd1\x87/\xe6\x97\xa5\xe6\x9c\xac";
  do_set(h, ukey, "unicode", 7, 1);
  do_get(h2, " (unicode key)", ukey, "unicode", 7);

  /* add */
  do_add(h, "c/ctr", 5, 5);
  g_keys++;
  do_add(h2, "c/ctr", -12, -7);
  do_get(h, "", "c/ctr", "-7", 2);
  int64_t sum = 0;
  for (int i = 0; i < 40; i++) {
    int64_t delta = (int64_t)(rnd() % 2000000000001ull) - 1000000000000ll;
    sum += delta;
    do_add(i % 2 ? h : h2, "c/sum", delta, sum);
  }
  g_keys++;
  char sum_text[32];
  snprintf(sum_text, sizeof sum_text, "%" PRId64, sum);
  do_get(h, "", "c/sum", sum_text, strlen(sum_text));
  do_add(h, "c/min", INT64_MIN, INT64_MIN);
  g_keys++;
  do_get(h2, "", "c/min", "-9223372036854775808", 20);
  do_add(h2, "c/min", 0, INT64_MIN);
  expect_status(h, "add with NULL result", tdist_store_add(h, "c/noresult", 7, NULL), TDIST_OK);
  g_keys++;
  do_get(h, "", "c/noresult", "7", 1);

  /* compare_set: reference §1.5 */
  do_cas(h, "missing, expected empty", "c/cas1", "", "new", "new");
  g_keys++;
  do_get(h2, "", "c/cas1", "new", 3);
  do_cas(h, "missing, expected non-empty", "c/cas2", "abc", "z", "abc");
  do_num_keys(h, " (compare_set on a missing key stored nothing)");
  do_cas(h2, "present, match", "c/cas1", "new", "newer", "newer");
  do_cas(h, "present, mismatch", "c/cas1", "bad", "zzz", "newer");
  do_get(h2, "", "c/cas1", "newer", 5);

  /* check / wait / delete */
  const char *ready_keys[] = {"c/str", "c/ctr", "c/empty"};
  const char *missing_keys[] = {"c/str", "c/missing"};
  do_check(h, "[c/str c/ctr c/empty]", ready_keys, 3, 1);
  do_check(h, "[c/str c/missing]", missing_keys, 2, 0);
  do_check(h, "[]", NULL, 0, 1);
  expect_status(h, "wait [c/str c/ctr c/empty]", tdist_store_wait(h, ready_keys, 3, 2000),
                TDIST_OK);
  expect_status(h, "wait []", tdist_store_wait(h, NULL, 0, 2000), TDIST_OK);
  do_set(h, "c/del", "x", 1, 1);
  do_delete(h, "c/del", 1);
  do_delete(h2, "c/del", 0);
  do_delete(h, "c/never", 0);
  do_num_keys(h2, "");

  /* multi_set / multi_get (emulated with SETs and WAIT+GETs on 1.13) */
  const char *mkeys[] = {"c/m1", "c/m2", "c/m3"};
  uint8_t m1[33], m3[5];
  rnd_bytes(m1, sizeof m1);
  rnd_bytes(m3, sizeof m3);
  const void *mvals[] = {m1, "", m3};
  size_t mlens[] = {sizeof m1, 0, sizeof m3};
  expect_status(h, "multi_set [c/m1 c/m2 c/m3]", tdist_store_multi_set(h, mkeys, mvals, mlens, 3),
                TDIST_OK);
  g_keys += 3;
  void *gv[3] = {NULL, NULL, NULL};
  size_t gl[3] = {0, 0, 0};
  tdist_status_t st = tdist_store_multi_get(h2, mkeys, 3, gv, gl);
  expect_status(h2, "multi_get [c/m1 c/m2 c/m3]", st, TDIST_OK);
  for (int i = 0; st == TDIST_OK && i < 3; i++) {
    rec("multi_get value %d -> %s", i, render(gv[i], gl[i]));
    if (gl[i] != mlens[i] || (gl[i] && memcmp(gv[i], mvals[i], gl[i]) != 0))
      fail("multi_get value %d differs", i);
  }
  for (int i = 0; i < 3; i++) tdist_free(gv[i]);
  do_get(h, " (multi_set value)", "c/m3", m3, sizeof m3);

  /* Waits that another connection releases. */
  tdist_store_t *h3 = connect_or_die(host, port);
  blocked_until_set(h, h3, "wait [c/str c/rel1] released by another thread", "c/rel1", 0);
  blocked_until_set(h, h3, "get c/rel2", "c/rel2", 1);
  tdist_store_destroy(h3);

  /* Timeouts. On 1.13 the server later sends a stray STOP_WAITING for an abandoned wait, so the
   * client must drop the connection: the next call on the same handle must still be right
   * (reference §1.6). */
  const char *late[] = {"c/late"};
  int64_t t0 = now_ms();
  expect_status(h, "wait [c/late] 300ms", tdist_store_wait(h, late, 1, 300), TDIST_ERR_TIMEOUT);
  int64_t dt = now_ms() - t0;
  if (dt < 250 || dt > 5000) fail("wait timeout took %" PRId64 " ms, want ~300", dt);
  do_set(h2, "c/late", "late-value", 10, 1);
  sleep_ms(200); /* let the stray reply reach the old connection */
  do_get(h, " (same handle after a wait timeout)", "c/late", "late-value", 10);
  do_add(h, "c/ctr", 1, -6);
  do_num_keys(h, " (same handle after a wait timeout)");

  expect_status(h, "set_timeout 300", tdist_store_set_timeout(h, 300), TDIST_OK);
  t0 = now_ms();
  void *v = NULL;
  size_t vn = 0;
  expect_status(h, "get c/late2 with a 300ms handle timeout",
                tdist_store_get(h, "c/late2", &v, &vn), TDIST_ERR_TIMEOUT);
  tdist_free(v);
  dt = now_ms() - t0;
  if (dt < 250 || dt > 5000) fail("get timeout took %" PRId64 " ms, want ~300", dt);
  do_set(h2, "c/late2", "second", 6, 1);
  sleep_ms(200);
  expect_status(h, "set_timeout back", tdist_store_set_timeout(h, CALL_TIMEOUT_MS), TDIST_OK);
  if (tdist_store_timeout(h) != CALL_TIMEOUT_MS) fail("tdist_store_timeout not restored");
  do_get(h, " (same handle after a get timeout)", "c/late2", "second", 6);

  const char *late3[] = {"c/str", "c/late3"};
  expect_status(h, "wait [c/str c/late3] 300ms (handle timeout -1 not used)",
                tdist_store_wait(h, late3, 2, 300), TDIST_ERR_TIMEOUT);
  do_add(h2, "c/late3", 2, 2);
  g_keys++;
  sleep_ms(200);
  do_check(h, "[c/str c/late3] after the timed-out wait", late3, 2, 1);
  expect_status(h, "wait [c/str c/late3] now", tdist_store_wait(h, late3, 2, -1), TDIST_OK);
  do_get(h, "", "c/late3", "2", 1);

  /* ADD on a value that is not an integer: the server drops the connection; the handle must
   * report INVALID_USAGE (store.h) and work again on the next call. */
  int64_t r = 0;
  expect_status(h, "add c/str (not an integer)", tdist_store_add(h, "c/str", 1, &r),
                TDIST_ERR_INVALID_USAGE);
  do_get(h, " (same handle after the bad add)", "c/str", "hello", 5);
  do_get(h2, " (other handle after the bad add)", "c/str", "hello", 5);
  do_add(h, "c/ctr", 10, 4);

  do_num_keys(h, " (final)");

  dialect_specific(h, d, !strcmp(want_queues, "yes"));

  /* A blocking pop on a fresh handle (nothing learnt about the server yet). */
  if (d == TDIST_STORE_DIALECT_V2 && strcmp(want_queues, "no") == 0) {
    tdist_store_t *h4 = connect_or_die(host, port);
    void *v = NULL;
    size_t vn = 0;
    int64_t t0 = now_ms();
    tdist_status_t st = tdist_store_queue_pop(h4, "c/q", 5000, &v, &vn);
    expect_refused(h4, "blocking queue_pop (5 s) on a 2.x server without queues", st, t0,
                   TDIST_ERR_NOT_AVAILABLE, "queue");
    tdist_free(v);
    still_works(h4, "a refused blocking queue_pop");
    tdist_store_destroy(h4);
  }

  if (out_path) {
    kv_t kvs[] = {
        {"c/str", "hello", 5},
        {"c/bin", bin, bin_len},
        {"c/empty", "", 0},
        {"c/big", big, big_len},
        {ukey, "unicode", 7},
        {"c/ctr", "4", 1},
        {"c/sum", sum_text, strlen(sum_text)},
        {"c/min", "-9223372036854775808", 20},
        {"c/cas1", "newer", 5},
        {"c/m1", m1, sizeof m1},
        {"c/m2", "", 0},
        {"c/m3", m3, sizeof m3},
        {"c/late", "late-value", 10},
        {"c/late2", "second", 6},
        {"c/late3", "2", 1},
        {"c/noresult", "7", 1},
    };
    write_manifest(out_path, kvs, sizeof kvs / sizeof kvs[0], g_keys);
  }

  tdist_store_destroy(h);
  tdist_store_destroy(h2);
  tdist_store_destroy(NULL);
  free(bin);
  free(big);
  if (g_failures) {
    fprintf(stderr, "%d check(s) failed (seed %" PRIu64 ")\n", g_failures, g_seed);
    return 1;
  }
  fprintf(stderr, "store_driver: all checks passed (dialect %s)\n", dialect_name(d));
  return 0;
}
