/* Helpers for the agent's HTTP tests: the external tools they check output with (promtool,
 * python3), a plain-socket HTTP/1.1 client, and a reader of the Prometheus text format. Every
 * helper fails the test (exit 1, with a message) rather than returning an error. */
#define _GNU_SOURCE
#include "http_testlib.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"

/* ---- tools (promtool, python3) --------------------------------------------------------------- */

const char *test_tmpdir(void) {
  const char *d = getenv("TEST_TMPDIR");
  return d && d[0] ? d : "/tmp";
}

/* ---- tools (promtool, python3) --------------------------------------------------------------- */

int test_find_tool(const char *name, char *out, size_t cap) {
  const char *path = getenv("PATH");
  char dirs[4096];
  snprintf(dirs, sizeof dirs, "%s:/usr/bin:/usr/local/bin:/bin", path ? path : "");
  char *save = NULL;
  for (char *d = strtok_r(dirs, ":", &save); d; d = strtok_r(NULL, ":", &save)) {
    if (!d[0]) continue;
    snprintf(out, cap, "%s/%s", d, name);
    if (access(out, X_OK) == 0) return 1;
  }
  return 0;
}

void test_write_file(const char *path, const char *data, size_t len) {
  FILE *f = fopen(path, "wb");
  CHECK(f != NULL);
  CHECK(fwrite(data, 1, len, f) == len);
  CHECK(fclose(f) == 0);
}

/* Runs cmd; returns its exit status and its stdout+stderr in *out (malloc'd). */
int test_run_cmd(const char *cmd, char **out) {
  FILE *p = popen(cmd, "r");
  CHECK(p != NULL);
  size_t cap = 4096, n = 0;
  char *buf = malloc(cap);
  CHECK(buf != NULL);
  size_t r;
  while ((r = fread(buf + n, 1, cap - n - 1, p)) > 0) {
    n += r;
    if (cap - n < 2) {
      cap *= 2;
      buf = realloc(buf, cap);
      CHECK(buf != NULL);
    }
  }
  buf[n] = '\0';
  int st = pclose(p);
  *out = buf;
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

void test_promtool_check(const char *body, size_t len, const char *what) {
  char tool[512];
  if (!test_find_tool("promtool", tool, sizeof tool)) {
    fprintf(stderr,
            "FAIL: promtool not found in PATH or /usr/bin: this test checks /metrics with "
            "`promtool check metrics`. Install it (Debian package `prometheus`, listed in "
            ".ci/packages.txt).\n");
    exit(1);
  }
  char file[512], cmd[1200];
  snprintf(file, sizeof file, "%s/metrics_%s.txt", test_tmpdir(), what);
  test_write_file(file, body, len);
  snprintf(cmd, sizeof cmd, "'%s' check metrics < '%s' 2>&1", tool, file);
  char *out = NULL;
  int rc = test_run_cmd(cmd, &out);
  if (rc != 0 || out[0]) {
    fprintf(stderr, "FAIL: promtool check metrics on %s (exit %d) said:\n%s\n(body in %s)\n", what,
            rc, out, file);
    exit(1);
  }
  free(out);
}

/* Runs a Python script (text) with args; returns its output; fails the test on non-zero exit. */
char *test_python(const char *script_name, const char *script, const char *arg) {
  char py[512];
  if (!test_find_tool("python3", py, sizeof py)) {
    fprintf(stderr, "FAIL: python3 not found; this test parses /status with Python's json.\n");
    exit(1);
  }
  char file[512], cmd[1600];
  snprintf(file, sizeof file, "%s/%s", test_tmpdir(), script_name);
  test_write_file(file, script, strlen(script));
  snprintf(cmd, sizeof cmd, "'%s' '%s' '%s' 2>&1", py, file, arg);
  char *out = NULL;
  int rc = test_run_cmd(cmd, &out);
  if (rc != 0) {
    fprintf(stderr, "FAIL: %s %s exited %d:\n%s\n", script_name, arg, rc, out);
    exit(1);
  }
  return out;
}

/* ---- HTTP client ----------------------------------------------------------------------------- */

int http_connect(int family, int port) {
  int fd = socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  CHECK(fd >= 0);
  struct timeval tv = {10, 0}; /* a request must be answered well within this */
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  int rc;
  if (family == AF_INET6) {
    struct sockaddr_in6 a;
    memset(&a, 0, sizeof a);
    a.sin6_family = AF_INET6;
    a.sin6_addr = in6addr_loopback;
    a.sin6_port = htons((uint16_t)port);
    rc = connect(fd, (struct sockaddr *)&a, sizeof a);
  } else {
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons((uint16_t)port);
    rc = connect(fd, (struct sockaddr *)&a, sizeof a);
  }
  if (rc != 0) {
    fprintf(stderr, "connect to port %d (family %d) failed: %s\n", port, family, strerror(errno));
    exit(1);
  }
  return fd;
}

/* Sends req as is and reads the answer until the server closes the connection. */
void http_request_raw(int family, int port, const char *req, size_t req_len, http_resp_t *r) {
  memset(r, 0, sizeof *r);
  int fd = http_connect(family, port);
  CHECK(send(fd, req, req_len, MSG_NOSIGNAL) == (ssize_t)req_len);
  size_t cap = 1 << 16;
  r->raw = malloc(cap);
  CHECK(r->raw != NULL);
  for (;;) {
    if (cap - r->raw_len < 4096) {
      cap *= 2;
      r->raw = realloc(r->raw, cap);
      CHECK(r->raw != NULL);
    }
    ssize_t n = recv(fd, r->raw + r->raw_len, cap - r->raw_len - 1, 0);
    if (n == 0) break;
    if (n < 0) {
      fprintf(stderr, "recv from port %d after \"%.40s\" failed: %s (no answer in 10 s?)\n", port,
              req, strerror(errno));
      exit(1);
    }
    r->raw_len += (size_t)n;
  }
  close(fd);
  r->raw[r->raw_len] = '\0';
  char *end = strstr(r->raw, "\r\n\r\n");
  if (!end || sscanf(r->raw, "HTTP/1.%*d %d", &r->status) != 1) {
    fprintf(stderr, "malformed answer to \"%.40s\": %.200s\n", req, r->raw);
    exit(1);
  }
  r->body = end + 4;
  r->body_len = r->raw_len - (size_t)(r->body - r->raw);
}

void http_request(int port, const char *method, const char *path, http_resp_t *r) {
  char req[512];
  int n = snprintf(req, sizeof req, "%s %s HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n",
                   method, path);
  http_request_raw(AF_INET, port, req, (size_t)n, r);
}

/* The value of header `name` (trimmed, malloc'd) or NULL. */
char *http_header(const http_resp_t *r, const char *name) {
  size_t nl = strlen(name);
  const char *end = strstr(r->raw, "\r\n\r\n");
  for (const char *p = strstr(r->raw, "\r\n"); p && p < end; p = strstr(p + 2, "\r\n")) {
    const char *h = p + 2;
    if (!strncasecmp(h, name, nl) && h[nl] == ':') {
      const char *v = h + nl + 1;
      while (*v == ' ') v++;
      const char *e = strstr(v, "\r\n");
      return strndup(v, (size_t)(e - v));
    }
  }
  return NULL;
}

void http_check_header(const http_resp_t *r, const char *name, const char *want) {
  char *v = http_header(r, name);
  if (!v || strcmp(v, want) != 0) {
    fprintf(stderr, "header %s: got \"%s\", want \"%s\"\nanswer:\n%.400s\n", name, v ? v : "(none)",
            want, r->raw);
    exit(1);
  }
  free(v);
}

void http_resp_free(http_resp_t *r) { free(r->raw); }

void http_expect(int port, const char *method, const char *path, int want, http_resp_t *r) {
  http_request(port, method, path, r);
  if (r->status != want) {
    fprintf(stderr, "%s %s: status %d, want %d\n%.400s\n", method, path, r->status, want, r->raw);
    exit(1);
  }
  /* Every answer says how long its body is (HEAD: the GET body's length, no bytes follow). */
  char *cl = http_header(r, "Content-Length");
  CHECK(cl != NULL);
  if (strcmp(method, "HEAD") == 0)
    CHECK_EQ_INT(r->body_len, 0);
  else
    CHECK_EQ_INT(strtoull(cl, NULL, 10), r->body_len);
  free(cl);
}

/* ---- Prometheus text ------------------------------------------------------------------------ */

/* The value of the one sample whose name{labels} is exactly key. */
double prom_value(const char *body, const char *key) {
  size_t kl = strlen(key);
  int found = 0;
  double v = 0;
  for (const char *l = body; *l; l = strchr(l, '\n') + 1) {
    if (!strncmp(l, key, kl) && l[kl] == ' ') {
      found++;
      char *end;
      v = strtod(l + kl + 1, &end);
      CHECK(*end == '\n');
    }
    if (!strchr(l, '\n')) break;
  }
  if (found != 1) {
    fprintf(stderr, "metric %s: %d samples, want 1\n%s\n", key, found, body);
    exit(1);
  }
  return v;
}

void prom_check(const char *body, const char *key, double want) {
  double v = prom_value(body, key);
  if (v != want) {
    fprintf(stderr, "metric %s = %.17g, want %.17g\n", key, v, want);
    exit(1);
  }
}

/* HELP and TYPE once per family, before its samples, all of a family's samples together; a
 * final newline; no NaN. */
void prom_check_structure(const char *body, size_t len) {
  CHECK(len > 0 && body[len - 1] == '\n');
  CHECK(strlen(body) == len);
  CHECK(strstr(body, "NaN") == NULL);
  char seen[128][96];
  int nseen = 0;
  char cur[96] = "", cur_type[16] = "";
  int help_for_cur = 0;
  for (const char *l = body; *l; l = strchr(l, '\n') + 1) {
    char name[96] = "", type[16] = "";
    if (!strncmp(l, "# HELP ", 7)) {
      CHECK(sscanf(l + 7, "%95s", name) == 1);
      for (int i = 0; i < nseen; i++) CHECK(strcmp(seen[i], name) != 0);
      snprintf(cur, sizeof cur, "%s", name);
      help_for_cur = 1;
      cur_type[0] = '\0';
    } else if (!strncmp(l, "# TYPE ", 7)) {
      CHECK(sscanf(l + 7, "%95s %15s", name, type) == 2);
      CHECK(help_for_cur && !strcmp(name, cur) && !cur_type[0]);
      CHECK(nseen < 128);
      snprintf(seen[nseen++], sizeof seen[0], "%s", name);
      snprintf(cur_type, sizeof cur_type, "%s", type);
      if (strcmp(type, "counter") == 0) {
        size_t n = strlen(name);
        CHECK(n > 6 && !strcmp(name + n - 6, "_total"));
      }
    } else {
      CHECK(l[0] != '#');
      size_t n = strcspn(l, "{ ");
      CHECK(n < sizeof name);
      memcpy(name, l, n);
      name[n] = '\0';
      CHECK(cur_type[0]);
      int ok = !strcmp(name, cur);
      if (!strcmp(cur_type, "histogram")) {
        char want[128];
        const char *const suf[] = {"_bucket", "_sum", "_count"};
        for (int i = 0; i < 3; i++) {
          snprintf(want, sizeof want, "%s%s", cur, suf[i]);
          ok |= !strcmp(name, want);
        }
      }
      if (!ok) {
        fprintf(stderr, "sample %s outside its family (current family %s)\n", name, cur);
        exit(1);
      }
    }
    if (!strchr(l, '\n')) break;
  }
}
