/* Store soak: a tdist-store server (the binary, a child process) under mixed hostile and honest
 * clients for a while, printing the honest clients' latency and the server's peak memory.
 *
 * Honest clients are libtdist TCPStore clients (what workers and agents use), each doing
 * set / get (checked) / add in a loop with a short pause. Hostile clients, each a thread that
 * reconnects whenever the server closes it, repeat what issue 14 reproduced:
 *   trickle   a CHECK of 131072 keys buffered but for its last 150 items, which then come one
 *             every 20 ms (partial multi-key requests parsed again and again);
 *   mget      a 1.3 MB MULTI_GET naming a 1 MiB value 131072 times (a 128 GiB reply);
 *   nonread   pipelined GETs of that 1 MiB value whose replies are never read;
 *   waits     pipelined WAITs of 131072 missing keys each;
 *   bigset    a 16 MiB SET, its DELETE and a stray byte, then idle;
 *   pipeline  ADDs pipelined as fast as the socket takes them, replies read (a busy client that
 *             must not delay the others);
 *   garbage   random bytes and unknown opcodes;
 *   churn     connections opened and closed at once, and a few hundred left open and idle.
 * Every second of the run VmRSS of the server is read from /proc; its VmHWM (peak) is printed
 * at the end with the budget it was given. A server without the budget flags (an older build) is
 * run without them, under a 4 GiB address-space cap so the machine survives it; if the server
 * dies the run stops there and says so.
 *
 * Prints figures, asserts nothing: bench/store/run.sh --soak. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tdist/tdist.h"

#define MIB ((size_t)1 << 20)
#define MULTI 131072

/* The 2.x wire bytes (shared/reference/torch-contracts.md §1.2). */
enum {
  W_VALIDATE = 0x00,
  W_SET = 0x01,
  W_GET = 0x03,
  W_ADD = 0x04,
  W_CHECK = 0x05,
  W_WAIT = 0x06,
  W_DELETE = 0x09,
  W_MGET = 0x0A
};

static int g_port;
static pid_t g_server;
static int64_t g_end_ns;
static atomic_int g_stop;

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static int running(void) { return !atomic_load(&g_stop) && now_ns() < g_end_ns; }

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* ---- a small encoder ---- */
typedef struct {
  uint8_t *p;
  size_t len, cap;
} buf_t;

static void put(buf_t *b, const void *d, size_t n) {
  if (b->len + n > b->cap) {
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + n) cap *= 2;
    uint8_t *p = realloc(b->p, cap);
    if (!p) {
      fprintf(stderr, "soak: out of memory building a request\n");
      exit(1);
    }
    b->p = p;
    b->cap = cap;
  }
  memcpy(b->p + b->len, d, n);
  b->len += n;
}
static void put_u8(buf_t *b, uint8_t v) { put(b, &v, 1); }
static void put_u64(buf_t *b, uint64_t v) {
  uint8_t x[8];
  for (int i = 0; i < 8; i++) x[i] = (uint8_t)(v >> (8 * i));
  put(b, x, 8);
}
static void put_str(buf_t *b, const void *s, size_t n) {
  put_u64(b, n);
  put(b, s, n);
}

/* ---- raw connections ---- */
static int raw_open(void) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)g_port)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
    close(fd);
    return -1;
  }
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  static const uint8_t validate[5] = {W_VALIDATE, 0xce, 0xf7, 0x85, 0x3c};
  if (send(fd, validate, 5, MSG_NOSIGNAL) != 5) {
    close(fd);
    return -1;
  }
  return fd;
}

/* Sends all of p unless the peer closes or timeout_ms passes with the socket full; returns the
 * bytes sent. */
static size_t send_some(int fd, const uint8_t *p, size_t n, int timeout_ms) {
  size_t done = 0;
  while (done < n && running()) {
    struct pollfd pf = {fd, POLLOUT, 0};
    int r = poll(&pf, 1, timeout_ms);
    if (r == 0) break;
    if (r < 0) {
      if (errno == EINTR) continue;
      break;
    }
    ssize_t k = send(fd, p + done, n - done, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (k < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (k <= 0) break;
    done += (size_t)k;
  }
  return done;
}

/* Reads and drops what arrives for up to ms; returns 1 if the peer closed. */
static int drain(int fd, int ms) {
  static __thread uint8_t sink[65536];
  int64_t end = now_ns() + (int64_t)ms * 1000000;
  for (;;) {
    int left = (int)((end - now_ns()) / 1000000);
    if (left < 0) return 0;
    struct pollfd pf = {fd, POLLIN, 0};
    int r = poll(&pf, 1, left);
    if (r <= 0) return 0;
    ssize_t k = recv(fd, sink, sizeof sink, MSG_DONTWAIT);
    if (k == 0) return 1;
    if (k < 0 && errno != EAGAIN && errno != EINTR) return 1;
  }
}

/* Whether the server hangs up on fd within ms (polled without reading, so nothing queued for
 * us is consumed); 0 also when the run ends first. */
static int hup_within(int fd, int ms) {
  for (int64_t end = now_ns() + (int64_t)ms * 1000000; running() && now_ns() < end;) {
    struct pollfd pf = {fd, POLLRDHUP, 0};
    if (poll(&pf, 1, 100) > 0 && (pf.revents & (POLLRDHUP | POLLHUP | POLLERR))) return 1;
  }
  return 0;
}

/* ---- hostile clients ---- */
typedef struct {
  const char *name;
  void (*fn)(int id);
  int threads;
  atomic_long conns;  /* connections opened */
  atomic_long closed; /* of them, closed by the server */
} hostile_t;

static void h_trickle(int id);
static void h_mget(int id);
static void h_nonread(int id);
static void h_waits(int id);
static void h_bigset(int id);
static void h_pipeline(int id);
static void h_garbage(int id);
static void h_churn(int id);

static hostile_t hostiles[] = {
    {"trickle", h_trickle, 10, 0, 0}, {"mget", h_mget, 1, 0, 0},
    {"nonread", h_nonread, 2, 0, 0},  {"waits", h_waits, 2, 0, 0},
    {"bigset", h_bigset, 2, 0, 0},    {"pipeline", h_pipeline, 1, 0, 0},
    {"garbage", h_garbage, 1, 0, 0},  {"churn", h_churn, 1, 0, 0},
};
#define NHOSTILE (sizeof hostiles / sizeof hostiles[0])

static hostile_t *kind(const char *name) {
  for (size_t i = 0; i < NHOSTILE; i++)
    if (!strcmp(hostiles[i].name, name)) return &hostiles[i];
  abort();
}

static int h_open(hostile_t *h) {
  int fd = raw_open();
  if (fd >= 0) atomic_fetch_add(&h->conns, 1);
  return fd;
}

static void multi_keys(buf_t *b, uint8_t op, size_t n, const char *fmt, int id) {
  put_u8(b, op);
  put_u64(b, n);
  char k[64];
  for (size_t i = 0; i < n; i++) {
    int len = snprintf(k, sizeof k, fmt, id, (unsigned)i);
    put_str(b, k, (size_t)len);
  }
}

static void h_trickle(int id) {
  hostile_t *h = kind("trickle");
  buf_t b = {0};
  multi_keys(&b, W_CHECK, MULTI, "/soak/trickle%d/%06u", id);
  const size_t item = 8 + strlen("/soak/trickle0/000000");
  const size_t head = b.len - 150 * item;
  while (running()) {
    int fd = h_open(h);
    if (fd < 0) {
      sleep_ms(100);
      continue;
    }
    int ok = send_some(fd, b.p, head, 5000) == head;
    for (size_t off = head; ok && off < b.len && running(); off += item) {
      ok = send_some(fd, b.p + off, item, 5000) == item;
      if (drain(fd, 20)) ok = 0;
    }
    if (ok) ok = !drain(fd, 50); /* the NOT_READY byte */
    if (!ok) atomic_fetch_add(&h->closed, 1);
    close(fd);
  }
  free(b.p);
}

static void h_mget(int id) {
  hostile_t *h = kind("mget");
  buf_t b = {0};
  put_u8(&b, W_MGET);
  put_u64(&b, MULTI);
  for (size_t i = 0; i < MULTI; i++) put_str(&b, "/soak/big", 9);
  (void)id;
  while (running()) {
    int fd = h_open(h);
    if (fd < 0) {
      sleep_ms(100);
      continue;
    }
    send_some(fd, b.p, b.len, 2000);
    /* Read nothing: the server must not build the reply in memory. */
    if (hup_within(fd, 5000)) atomic_fetch_add(&h->closed, 1);
    close(fd);
  }
  free(b.p);
}

static void h_nonread(int id) {
  hostile_t *h = kind("nonread");
  buf_t b = {0};
  for (int i = 0; i < 64; i++) {
    put_u8(&b, W_GET);
    put_str(&b, "/soak/big", 9);
  }
  (void)id;
  while (running()) {
    int fd = h_open(h);
    if (fd < 0) {
      sleep_ms(100);
      continue;
    }
    /* GETs until the socket stays full for a second: the server stopped reading. */
    while (running() && send_some(fd, b.p, b.len, 1000) == b.len) {
    }
    if (hup_within(fd, 3000)) atomic_fetch_add(&h->closed, 1);
    close(fd);
  }
  free(b.p);
}

static void h_waits(int id) {
  hostile_t *h = kind("waits");
  buf_t b = {0};
  multi_keys(&b, W_WAIT, MULTI, "/soak/never%d/%06u", id);
  while (running()) {
    int fd = h_open(h);
    if (fd < 0) {
      sleep_ms(100);
      continue;
    }
    int sent = 0;
    while (running() && sent < 40 && send_some(fd, b.p, b.len, 2000) == b.len) sent++;
    if (drain(fd, 2000)) atomic_fetch_add(&h->closed, 1);
    close(fd);
  }
  free(b.p);
}

static void h_bigset(int id) {
  hostile_t *h = kind("bigset");
  const size_t n = 16 * MIB;
  char key[64];
  int klen = snprintf(key, sizeof key, "/soak/bigset%d", id);
  buf_t b = {0}, t = {0};
  put_u8(&b, W_SET);
  put_str(&b, key, (size_t)klen);
  put_u64(&b, n);
  /* Then the value is deleted (the server's memory should go back) and one stray byte, the
   * first of a SET that never comes, keeps the connection mid-request. */
  put_u8(&t, W_DELETE);
  put_str(&t, key, (size_t)klen);
  put_u8(&t, W_SET);
  size_t hdr = b.len, total = hdr + n + t.len;
  uint8_t *v = malloc(total);
  if (!v) return;
  memcpy(v, b.p, hdr);
  memset(v + hdr, 'v', n);
  memcpy(v + hdr + n, t.p, t.len);
  free(b.p);
  free(t.p);
  while (running()) {
    int fd = h_open(h);
    if (fd < 0) {
      sleep_ms(100);
      continue;
    }
    if (send_some(fd, v, total, 5000) != total) atomic_fetch_add(&h->closed, 1);
    for (int i = 0; i < 20 && running(); i++)
      if (drain(fd, 100)) {
        atomic_fetch_add(&h->closed, 1);
        break;
      }
    close(fd);
  }
  free(v);
}

static void h_pipeline(int id) {
  hostile_t *h = kind("pipeline");
  buf_t b = {0};
  for (int i = 0; i < 1024; i++) {
    put_u8(&b, W_ADD);
    put_str(&b, "/soak/pipelined", 15);
    put_u64(&b, 1);
  }
  (void)id;
  while (running()) {
    int fd = h_open(h);
    if (fd < 0) {
      sleep_ms(100);
      continue;
    }
    int alive = 1;
    while (alive && running()) {
      if (send_some(fd, b.p, b.len, 1000) != b.len) alive = 0;
      if (drain(fd, 0)) alive = 0;
    }
    if (running()) atomic_fetch_add(&h->closed, 1);
    close(fd);
  }
  free(b.p);
}

static void h_garbage(int id) {
  hostile_t *h = kind("garbage");
  uint64_t x = 0x9E3779B97F4A7C15ull * (uint64_t)(id + 1);
  while (running()) {
    int fd = h_open(h);
    if (fd < 0) {
      sleep_ms(100);
      continue;
    }
    uint8_t junk[512];
    for (size_t i = 0; i < sizeof junk; i++) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      junk[i] = (uint8_t)x;
    }
    if (x & 1) junk[0] = 0x7f; /* an opcode no dialect has */
    send_some(fd, junk, 1 + (size_t)(x % sizeof junk), 1000);
    if (drain(fd, 500)) atomic_fetch_add(&h->closed, 1);
    close(fd);
    sleep_ms(20);
  }
}

static void h_churn(int id) {
  hostile_t *h = kind("churn");
  enum { IDLE = 300 };
  int idle[IDLE];
  int nidle = 0;
  (void)id;
  while (running()) {
    int fd = h_open(h);
    if (fd < 0) {
      sleep_ms(100);
      continue;
    }
    if (nidle < IDLE)
      idle[nidle++] = fd;
    else
      close(fd);
    sleep_ms(5);
  }
  for (int i = 0; i < nidle; i++) close(idle[i]);
}

typedef struct {
  hostile_t *h;
  int id;
} hostile_arg_t;

static void *hostile_main(void *p) {
  hostile_arg_t *a = p;
  a->h->fn(a->id);
  return NULL;
}

/* ---- honest clients ---- */
typedef struct {
  int id;
  int64_t *lat; /* ns per operation */
  size_t n, cap;
  long errors, wrong, reconnects;
  char last_err[256];
} honest_t;

static void record(honest_t *c, int64_t ns) {
  if (c->n == c->cap) {
    size_t cap = c->cap ? 2 * c->cap : 65536;
    int64_t *p = realloc(c->lat, cap * sizeof *p);
    if (!p) return;
    c->lat = p;
    c->cap = cap;
  }
  c->lat[c->n++] = ns;
}

static tdist_store_t *honest_connect(honest_t *c) {
  tdist_tcp_store_options_t o = TDIST_TCP_STORE_OPTIONS_INIT;
  o.host = "127.0.0.1";
  o.port = g_port;
  o.connect_timeout_ms = 5000;
  o.timeout_ms = 5000;
  o.dialect = TDIST_STORE_DIALECT_V2;
  tdist_store_t *s = NULL;
  if (tdist_tcp_store_connect(&o, &s) != TDIST_OK) {
    c->errors++;
    snprintf(c->last_err, sizeof c->last_err, "connect: %s", tdist_last_error());
    return NULL;
  }
  return s;
}

static void *honest_main(void *p) {
  honest_t *c = p;
  tdist_store_t *s = NULL;
  char key[64], val[128];
  uint64_t x = 0x2545F4914F6CDD1Dull * (uint64_t)(c->id + 1);
  for (long i = 0; running(); i++) {
    if (!s && !(s = honest_connect(c))) {
      sleep_ms(100);
      continue;
    }
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    snprintf(key, sizeof key, "honest/%d/%ld", c->id, i % 64);
    int vlen = snprintf(val, sizeof val, "%016" PRIx64 "-%ld", x, i);
    int64_t t0 = now_ns();
    tdist_status_t st = tdist_store_set(s, key, val, (size_t)vlen);
    int64_t t1 = now_ns();
    void *got = NULL;
    size_t glen = 0;
    if (st == TDIST_OK) st = tdist_store_get(s, key, &got, &glen);
    int64_t t2 = now_ns();
    int64_t sum = 0;
    if (st == TDIST_OK) st = tdist_store_add(s, "honest/counter", 1, &sum);
    int64_t t3 = now_ns();
    if (st != TDIST_OK) {
      c->errors++;
      snprintf(c->last_err, sizeof c->last_err, "%s", tdist_store_last_error(s));
      tdist_store_destroy(s);
      s = NULL;
      c->reconnects++;
      tdist_free(got);
      continue;
    }
    if (glen != (size_t)vlen || memcmp(got, val, glen) != 0) c->wrong++;
    tdist_free(got);
    record(c, t1 - t0);
    record(c, t2 - t1);
    record(c, t3 - t2);
    sleep_ms(2);
  }
  tdist_store_destroy(s);
  return NULL;
}

/* ---- the server ---- */
static size_t proc_kib(pid_t pid, const char *field) {
  char path[64], line[256];
  snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  size_t v = 0, fl = strlen(field);
  while (fgets(line, sizeof line, f))
    if (!strncmp(line, field, fl) && line[fl] == ':') v = strtoull(line + fl + 1, NULL, 10);
  fclose(f);
  return v;
}

/* Whether `serve --help` of the binary names flag. */
static int has_flag(const char *bin, const char *flag) {
  char cmd[1200];
  snprintf(cmd, sizeof cmd, "'%s' serve --help 2>&1", bin);
  FILE *f = popen(cmd, "r");
  if (!f) return 0;
  char line[512];
  int found = 0;
  while (fgets(line, sizeof line, f))
    if (strstr(line, flag)) found = 1;
  pclose(f);
  return found;
}

static int start_server(const char *bin, size_t conn_budget, size_t server_budget, int budgets,
                        const char *dir) {
  char portfile[600], cb[32], sb[32];
  snprintf(portfile, sizeof portfile, "%s/port", dir);
  snprintf(cb, sizeof cb, "%zu", conn_budget);
  snprintf(sb, sizeof sb, "%zu", server_budget);
  pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    struct rlimit as = {(rlim_t)4 << 30, (rlim_t)4 << 30};
    setrlimit(RLIMIT_AS, &as);
    int null = open("/dev/null", O_WRONLY);
    if (null >= 0) dup2(null, 1);
    char logp[640];
    snprintf(logp, sizeof logp, "%s/server.log", dir);
    int log = open(logp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (log >= 0) dup2(log, 2);
    if (budgets)
      execl(bin, bin, "serve", "--host", "127.0.0.1", "--port", "0", "--port-file", portfile,
            "--max-connection-bytes", cb, "--max-server-bytes", sb, (char *)NULL);
    else
      execl(bin, bin, "serve", "--host", "127.0.0.1", "--port", "0", "--port-file", portfile,
            (char *)NULL);
    _exit(127);
  }
  g_server = pid;
  for (int i = 0; i < 500; i++) {
    FILE *f = fopen(portfile, "r");
    if (f) {
      int ok = fscanf(f, "%d", &g_port) == 1;
      fclose(f);
      if (ok && g_port > 0) return 0;
    }
    if (waitpid(pid, NULL, WNOHANG) == pid) break;
    sleep_ms(10);
  }
  fprintf(stderr, "soak: %s did not start (log: %s/server.log)\n", bin, dir);
  return -1;
}

static int cmp64(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return x < y ? -1 : x > y;
}

static void usage(FILE *f) {
  fprintf(f,
          "Usage: soak --tdist-store PATH [--seconds N] [--honest N] [--label TEXT]\n"
          "            [--conn-budget BYTES] [--server-budget BYTES] [--hostile KIND,...]\n"
          "Runs the tdist-store binary at PATH under hostile and honest clients for N seconds\n"
          "(default 120) and prints the honest clients' latency (p50, p99, max) and the\n"
          "server's peak resident memory. Budgets default to 64 MiB per connection and\n"
          "256 MiB for the server; a binary without the budget flags runs without them, under\n"
          "a 4 GiB address-space cap. --hostile runs only the named kinds of hostile client\n"
          "(trickle, mget, nonread, waits, bigset, pipeline, garbage, churn; none: honest\n"
          "clients alone). TDIST_SOAK_KEEP=1 keeps the server's log. Asserts nothing.\n");
}

int main(int argc, char **argv) {
  const char *bin = NULL, *label = NULL, *only = NULL;
  long seconds = 120;
  int nhonest = 4;
  size_t conn_budget = 64 * MIB, server_budget = 256 * MIB;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      usage(stdout);
      return 0;
    }
    if (!v) {
      fprintf(stderr, "soak: %s: missing value or unknown flag\n", a);
      usage(stderr);
      return 2;
    }
    char *end = NULL;
    if (!strcmp(a, "--tdist-store"))
      bin = v;
    else if (!strcmp(a, "--label"))
      label = v;
    else if (!strcmp(a, "--seconds"))
      seconds = strtol(v, &end, 10);
    else if (!strcmp(a, "--hostile"))
      only = v;
    else if (!strcmp(a, "--honest"))
      nhonest = (int)strtol(v, &end, 10);
    else if (!strcmp(a, "--conn-budget"))
      conn_budget = strtoull(v, &end, 10);
    else if (!strcmp(a, "--server-budget"))
      server_budget = strtoull(v, &end, 10);
    else {
      fprintf(stderr, "soak: unknown flag %s\n", a);
      usage(stderr);
      return 2;
    }
    if (end && (*end || end == v)) {
      fprintf(stderr, "soak: %s: '%s' is not a number\n", a, v);
      return 2;
    }
    if (seconds <= 0 || nhonest <= 0 || nhonest > 64) {
      fprintf(stderr, "soak: %s %s: out of range (seconds > 0, 1..64 honest clients)\n", a, v);
      return 2;
    }
    i++;
  }
  if (!bin) {
    fprintf(stderr, "soak: --tdist-store PATH is required\n");
    usage(stderr);
    return 2;
  }
  if (only) {
    for (size_t i = 0; i < NHOSTILE; i++) {
      const char *p = strstr(only, hostiles[i].name);
      size_t n = strlen(hostiles[i].name);
      int named = p && (p == only || p[-1] == ',') && (p[n] == ',' || p[n] == 0);
      if (!named) hostiles[i].threads = 0;
    }
    for (const char *p = only; *p;) {
      size_t n = strcspn(p, ",");
      int known = 0;
      for (size_t i = 0; i < NHOSTILE; i++)
        if (strlen(hostiles[i].name) == n && !strncmp(p, hostiles[i].name, n)) known = 1;
      if (!known && strcmp(only, "none") != 0) {
        fprintf(stderr,
                "soak: --hostile %s: unknown kind '%.*s' (kinds: trickle, mget, nonread, "
                "waits, bigset, pipeline, garbage, churn; or none)\n",
                only, (int)n, p);
        return 2;
      }
      p += n;
      if (*p == ',') p++;
    }
  }
  signal(SIGPIPE, SIG_IGN);
  char dir[] = "/tmp/tdist-soak.XXXXXX";
  if (!mkdtemp(dir)) {
    perror("soak: mkdtemp");
    return 1;
  }
  int budgets = has_flag(bin, "--max-server-bytes");
  if (!budgets)
    fprintf(stderr, "soak: %s has no budget flags: run without them, under a 4 GiB cap\n", bin);
  if (start_server(bin, conn_budget, server_budget, budgets, dir) != 0) return 1;
  size_t base_kib = proc_kib(g_server, "VmRSS");

  /* The 1 MiB value the mget and nonread clients name. */
  {
    honest_t tmp = {0};
    g_end_ns = now_ns() + 60000000000LL;
    tdist_store_t *s = honest_connect(&tmp);
    char *big = malloc(MIB);
    if (!s || !big) {
      fprintf(stderr, "soak: cannot set up: %s\n", tmp.last_err);
      return 1;
    }
    memset(big, 'b', MIB);
    if (tdist_store_set(s, "soak/big", big, MIB) != TDIST_OK) {
      fprintf(stderr, "soak: set soak/big: %s\n", tdist_store_last_error(s));
      return 1;
    }
    free(big);
    tdist_store_destroy(s);
  }

  int64_t t0 = now_ns();
  g_end_ns = t0 + seconds * 1000000000LL;
  pthread_t th[128];
  hostile_arg_t args[128];
  int nth = 0;
  for (size_t k = 0; k < NHOSTILE; k++)
    for (int j = 0; j < hostiles[k].threads && nth < 64; j++, nth++) {
      args[nth] = (hostile_arg_t){&hostiles[k], j};
      pthread_create(&th[nth], NULL, hostile_main, &args[nth]);
    }
  honest_t *hon = calloc((size_t)nhonest, sizeof *hon);
  pthread_t hth[64];
  for (int i = 0; i < nhonest; i++) {
    hon[i].id = i;
    pthread_create(&hth[i], NULL, honest_main, &hon[i]);
  }

  size_t peak_kib = base_kib;
  int died = 0, status = 0;
  double died_at = 0;
  while (now_ns() < g_end_ns) {
    sleep_ms(100);
    size_t r = proc_kib(g_server, "VmRSS");
    if (r > peak_kib) peak_kib = r;
    if (waitpid(g_server, &status, WNOHANG) == g_server) {
      died = 1;
      died_at = (double)(now_ns() - t0) / 1e9;
      atomic_store(&g_stop, 1);
      break;
    }
  }
  size_t hwm_kib = died ? peak_kib : proc_kib(g_server, "VmHWM");
  atomic_store(&g_stop, 1);
  for (int i = 0; i < nth; i++) pthread_join(th[i], NULL);
  for (int i = 0; i < nhonest; i++) pthread_join(hth[i], NULL);
  double ran = (double)(now_ns() - t0) / 1e9;

  size_t total = 0;
  long errors = 0, wrong = 0;
  const char *last_err = "";
  for (int i = 0; i < nhonest; i++) {
    total += hon[i].n;
    errors += hon[i].errors;
    wrong += hon[i].wrong;
    if (hon[i].last_err[0]) last_err = hon[i].last_err;
  }
  int64_t *all = malloc((total ? total : 1) * sizeof *all);
  size_t k = 0;
  for (int i = 0; i < nhonest; i++) {
    memcpy(all + k, hon[i].lat, hon[i].n * sizeof *all);
    k += hon[i].n;
  }
  qsort(all, total, sizeof *all, cmp64);
  double p50 = total ? all[total / 2] / 1e6 : 0, p99 = total ? all[total * 99 / 100] / 1e6 : 0,
         mx = total ? all[total - 1] / 1e6 : 0;

  printf("soak: %s%s%s, %.0f s, %d honest clients (set/get/add), hostile:", bin, label ? " " : "",
         label ? label : "", ran, nhonest);
  for (size_t i = 0; i < NHOSTILE; i++)
    if (hostiles[i].threads) printf(" %s x%d", hostiles[i].name, hostiles[i].threads);
  printf("\n");
  printf(
      "| server | honest ops | errors | p50 ms | p99 ms | max ms | peak RSS MiB | budget MiB | "
      "server |\n|---|---|---|---|---|---|---|---|---|\n");
  char budget[64];
  if (budgets)
    snprintf(budget, sizeof budget, "%zu (+%zu/conn)", server_budget / MIB, conn_budget / MIB);
  else
    snprintf(budget, sizeof budget, "none (4096 cap)");
  char fate[96];
  if (died)
    snprintf(fate, sizeof fate, "died at %.1f s (%s %d)", died_at,
             WIFSIGNALED(status) ? "signal" : "exit",
             WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
  else
    snprintf(fate, sizeof fate, "up");
  printf("| %s | %zu | %ld | %.2f | %.2f | %.1f | %.0f | %s | %s |\n", label ? label : bin, total,
         errors + wrong, p50, p99, mx, hwm_kib / 1024.0, budget, fate);
  printf("hostile connections (opened / closed by the server):");
  for (size_t i = 0; i < NHOSTILE; i++)
    printf(" %s %ld/%ld", hostiles[i].name, atomic_load(&hostiles[i].conns),
           atomic_load(&hostiles[i].closed));
  printf("\nserver RSS at start %.1f MiB; wrong values read: %ld", base_kib / 1024.0, wrong);
  if (errors) printf("; last honest error: %s", last_err);
  printf("\n");
  fflush(stdout);
  if (!died) {
    kill(g_server, SIGTERM);
    for (int i = 0; i < 500 && waitpid(g_server, NULL, WNOHANG) != g_server; i++) sleep_ms(10);
    kill(g_server, SIGKILL);
    waitpid(g_server, NULL, 0);
  }
  if (getenv("TDIST_SOAK_KEEP")) {
    printf("server log kept: %s/server.log\n", dir);
  } else {
    char cmd[200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "soak: could not remove %s\n", dir);
  }
  for (int i = 0; i < nhonest; i++) free(hon[i].lat);
  free(hon);
  free(all);
  return 0;
}
