/* Reading a worker's TORCHELASTIC_ERROR_FILE (see errorfile.h). A bounded recursive-descent JSON
 * reader (RFC 8259: objects, arrays, strings with every escape, numbers, true/false/null) that
 * keeps only the handful of fields the agent reports and validates the rest. The file is written
 * by user code and may be truncated, hostile or binary: nesting is capped at 64 levels, nothing
 * is read past len, and every string copied out is valid UTF-8, NUL-terminated and cut on a
 * character boundary. Never prints or logs. */
#define _GNU_SOURCE
#include "operator-agent/supervisor/errorfile.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "operator-agent/common/utf8.h"

#define MAX_DEPTH 64
#define MAX_FILE (1u << 20)

/* What the value at the cursor means to us. */
typedef enum {
  R_SKIP = 0,
  R_ROOT,        /* the document */
  R_TOP_MESSAGE, /* .message: a string (short form) or an object (@record form) */
  R_TOP_TS,      /* .timestamp (short form) */
  R_MSG_MESSAGE, /* .message.message */
  R_MSG_EXTRA,   /* .message.extraInfo */
  R_MSG_CODE,    /* .message.errorCode */
  R_STACK,       /* .message.extraInfo.py_callstack */
  R_EXTRA_TS     /* .message.extraInfo.timestamp */
} role_t;

typedef struct {
  const unsigned char *start, *p, *end;
  char *scratch; /* decoded strings; 3 bytes per input byte is the worst case (U+FFFD) */
  size_t slen;   /* length of the last decoded string */
  char *err;
  size_t cap;
  int failed;
  agent_error_info_t *info;
  int root_object, msg_kind; /* msg_kind: 0 none, 1 string, 2 object */
  int64_t top_ts, extra_ts;
} jp_t;

static void fail(jp_t *j, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fail(jp_t *j, const char *fmt, ...) {
  if (j->failed) return;
  j->failed = 1;
  if (j->err == NULL || j->cap == 0) return;
  size_t off = (size_t)(j->p - j->start), line = 1, col = 1;
  for (const unsigned char *q = j->start; q < j->p; q++) {
    if (*q == '\n')
      line++, col = 1;
    else
      col++;
  }
  int n =
      snprintf(j->err, j->cap, "invalid JSON at line %zu, column %zu (byte %zu): ", line, col, off);
  if (n < 0 || (size_t)n >= j->cap) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(j->err + n, j->cap - (size_t)n, fmt, ap);
  va_end(ap);
}

static void skip_ws(jp_t *j) {
  while (j->p < j->end && (*j->p == ' ' || *j->p == '\t' || *j->p == '\n' || *j->p == '\r')) j->p++;
}

static int hex4(const unsigned char *p, const unsigned char *end, uint32_t *out) {
  if (end - p < 4) return -1;
  uint32_t v = 0;
  for (int i = 0; i < 4; i++) {
    unsigned c = p[i], d;
    if (c >= '0' && c <= '9')
      d = c - '0';
    else if (c >= 'a' && c <= 'f')
      d = c - 'a' + 10;
    else if (c >= 'A' && c <= 'F')
      d = c - 'A' + 10;
    else
      return -1;
    v = v << 4 | d;
  }
  *out = v;
  return 0;
}

/* Decodes the string at the cursor (on its opening quote) into j->scratch / j->slen. Escapes
 * become UTF-8 (surrogate pairs joined); lone surrogates, \u0000 and invalid UTF-8 bytes become
 * U+FFFD, so the result is always valid UTF-8 without NUL bytes. Raw control bytes are an error,
 * as in JSON. */
static int parse_string(jp_t *j) {
  char *o = j->scratch;
  size_t n = 0;
  j->p++;
  for (;;) {
    if (j->p >= j->end) {
      fail(j, "unterminated string");
      return -1;
    }
    unsigned c = *j->p;
    if (c == '"') {
      j->p++;
      break;
    }
    if (c < 0x20) {
      fail(j, "control character 0x%02x inside a string (must be escaped)", c);
      return -1;
    }
    if (c == '\\') {
      if (j->end - j->p < 2) {
        j->p = j->end;
        fail(j, "unterminated string");
        return -1;
      }
      unsigned e = j->p[1];
      static const char from[] = "\"\\/bfnrt", to[] = "\"\\/\b\f\n\r\t";
      const char *k = e ? strchr(from, (int)e) : NULL;
      if (k != NULL) {
        o[n++] = to[k - from];
        j->p += 2;
        continue;
      }
      uint32_t cp, lo;
      if (e != 'u' || hex4(j->p + 2, j->end, &cp) != 0) {
        j->p++;
        fail(j, e == 'u' ? "\\u needs four hex digits" : "invalid escape '\\%c'",
             e >= 0x20 && e < 0x7F ? (int)e : '?');
        return -1;
      }
      j->p += 6;
      if (cp >= 0xD800 && cp <= 0xDBFF && j->end - j->p >= 6 && j->p[0] == '\\' && j->p[1] == 'u' &&
          hex4(j->p + 2, j->end, &lo) == 0 && lo >= 0xDC00 && lo <= 0xDFFF) {
        cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
        j->p += 6;
      } else if ((cp >= 0xD800 && cp <= 0xDFFF) || cp == 0) {
        cp = 0xFFFD;
      }
      n += agent_utf8_put(o + n, cp);
      continue;
    }
    int l = agent_utf8_next((const char *)j->p, (size_t)(j->end - j->p), NULL);
    size_t len = l > 0 ? (size_t)l : 0;
    if (len == 0) { /* one U+FFFD per byte of a malformed sequence */
      n += agent_utf8_put(o + n, 0xFFFD);
      j->p++;
    } else {
      memcpy(o + n, j->p, len);
      n += len;
      j->p += len;
    }
  }
  o[n] = 0;
  j->slen = n;
  return 0;
}

/* Copies s (valid UTF-8, n bytes) into dst[cap]. A string that does not fit keeps its head and
 * ends with "..." (tail = 0), or keeps its tail and starts with "...\n" (tail = 1: the end of a
 * traceback names the exception). Cuts fall on character boundaries. */
static void copy_out(char *dst, size_t cap, const char *s, size_t n, int tail) {
  if (n < cap) {
    memcpy(dst, s, n + 1);
    return;
  }
  if (!tail) {
    size_t k = cap - 4;
    while (k > 0 && ((unsigned char)s[k] & 0xC0) == 0x80) k--;
    memcpy(dst, s, k);
    memcpy(dst + k, "...", 4);
  } else {
    size_t from = n - (cap - 5);
    while (from < n && ((unsigned char)s[from] & 0xC0) == 0x80) from++;
    memcpy(dst, "...\n", 4);
    memcpy(dst + 4, s + from, n - from + 1);
  }
}

/* Python's int() of a string of digits: optional blanks and sign; 0 for anything else. */
static int64_t digits_value(const char *s) {
  while (*s == ' ' || *s == '\t') s++;
  int neg = *s == '-';
  if (*s == '-' || *s == '+') s++;
  if (*s < '0' || *s > '9') return 0;
  uint64_t v = 0;
  for (; *s >= '0' && *s <= '9'; s++) {
    if (v > (uint64_t)INT64_MAX / 10) return 0;
    v = v * 10 + (uint64_t)(*s - '0');
    if (v > (uint64_t)INT64_MAX) return 0;
  }
  while (*s == ' ' || *s == '\t') s++;
  if (*s != 0) return 0;
  return neg ? -(int64_t)v : (int64_t)v;
}

/* A JSON number at the cursor. *is_int says whether it had an integer value that fits int64 (a
 * fraction is dropped, as int() does; an exponent makes it not an integer for us). */
static int parse_number(jp_t *j, int64_t *value, int *is_int) {
  const unsigned char *p = j->p, *e = j->end;
  int neg = 0, ok = 1;
  uint64_t v = 0;
  if (p < e && *p == '-') neg = 1, p++;
  if (p >= e || *p < '0' || *p > '9') {
    j->p = p;
    fail(j, "invalid number");
    return -1;
  }
  if (*p == '0') {
    p++;
  } else {
    for (; p < e && *p >= '0' && *p <= '9'; p++) {
      if (v > (uint64_t)INT64_MAX / 10)
        ok = 0;
      else
        v = v * 10 + (uint64_t)(*p - '0');
      if (v > (uint64_t)INT64_MAX) ok = 0;
    }
  }
  if (p < e && *p == '.') {
    p++;
    if (p >= e || *p < '0' || *p > '9') {
      j->p = p;
      fail(j, "invalid number: digits must follow '.'");
      return -1;
    }
    while (p < e && *p >= '0' && *p <= '9') p++;
  }
  if (p < e && (*p == 'e' || *p == 'E')) {
    ok = 0;
    p++;
    if (p < e && (*p == '+' || *p == '-')) p++;
    if (p >= e || *p < '0' || *p > '9') {
      j->p = p;
      fail(j, "invalid number: digits must follow the exponent");
      return -1;
    }
    while (p < e && *p >= '0' && *p <= '9') p++;
  }
  j->p = p;
  *is_int = ok;
  *value = ok ? (neg ? -(int64_t)v : (int64_t)v) : 0;
  return 0;
}

static role_t member_role(role_t parent, const char *key) {
  switch (parent) {
    case R_ROOT:
      if (!strcmp(key, "message")) return R_TOP_MESSAGE;
      if (!strcmp(key, "timestamp")) return R_TOP_TS;
      break;
    case R_TOP_MESSAGE:
      if (!strcmp(key, "message")) return R_MSG_MESSAGE;
      if (!strcmp(key, "extraInfo")) return R_MSG_EXTRA;
      if (!strcmp(key, "errorCode")) return R_MSG_CODE;
      break;
    case R_MSG_EXTRA:
      if (!strcmp(key, "py_callstack")) return R_STACK;
      if (!strcmp(key, "timestamp")) return R_EXTRA_TS;
      break;
    default: break;
  }
  return R_SKIP;
}

static int parse_value(jp_t *j, int depth, role_t role);

static int parse_container(jp_t *j, int depth, role_t role) {
  int is_obj = *j->p == '{';
  unsigned char close = is_obj ? '}' : ']';
  if (depth >= MAX_DEPTH) {
    fail(j, "nested deeper than %d levels", MAX_DEPTH);
    return -1;
  }
  j->p++;
  skip_ws(j);
  if (j->p < j->end && *j->p == close) {
    j->p++;
    return 0;
  }
  for (;;) {
    role_t child = R_SKIP;
    if (is_obj) {
      skip_ws(j);
      if (j->p >= j->end || *j->p != '"') {
        fail(j, "expected a string key");
        return -1;
      }
      if (parse_string(j) != 0) return -1;
      child = member_role(role, j->scratch);
      skip_ws(j);
      if (j->p >= j->end || *j->p != ':') {
        fail(j, "expected ':' after an object key");
        return -1;
      }
      j->p++;
    }
    if (parse_value(j, depth + 1, child) != 0) return -1;
    skip_ws(j);
    if (j->p >= j->end) {
      fail(j, "unterminated %s", is_obj ? "object" : "array");
      return -1;
    }
    if (*j->p == close) {
      j->p++;
      return 0;
    }
    if (*j->p != ',') {
      fail(j, "expected ',' or '%c'", close);
      return -1;
    }
    j->p++;
  }
}

static int literal(jp_t *j, const char *word) {
  size_t n = strlen(word);
  if ((size_t)(j->end - j->p) < n || memcmp(j->p, word, n) != 0) {
    fail(j, "unexpected character '%c'", *j->p >= 0x20 && *j->p < 0x7F ? (int)*j->p : '?');
    return -1;
  }
  j->p += n;
  return 0;
}

static int parse_value(jp_t *j, int depth, role_t role) {
  agent_error_info_t *info = j->info;
  skip_ws(j);
  if (j->p >= j->end) {
    fail(j, "unexpected end of input");
    return -1;
  }
  unsigned c = *j->p;
  if (role == R_TOP_MESSAGE) {
    /* A repeated key replaces the earlier value (as in Python): forget what it gave. */
    j->msg_kind = 0;
    info->message[0] = info->traceback[0] = 0;
    info->has_error_code = info->error_code = 0;
    j->extra_ts = 0;
  }
  if (c == '{' || c == '[') {
    if (role == R_ROOT) j->root_object = c == '{';
    if (role == R_TOP_MESSAGE && c == '{') j->msg_kind = 2;
    role_t inner = c == '{' && (role == R_ROOT || role == R_TOP_MESSAGE || role == R_MSG_EXTRA)
                       ? role
                       : R_SKIP;
    return parse_container(j, depth, inner);
  }
  if (c == '"') {
    if (parse_string(j) != 0) return -1;
    switch (role) {
      case R_TOP_MESSAGE:
        j->msg_kind = 1;
        /* fall through */
      case R_MSG_MESSAGE:
        copy_out(info->message, sizeof info->message, j->scratch, j->slen, 0);
        break;
      case R_STACK:
        copy_out(info->traceback, sizeof info->traceback, j->scratch, j->slen, 1);
        break;
      case R_TOP_TS: j->top_ts = digits_value(j->scratch); break;
      case R_EXTRA_TS: j->extra_ts = digits_value(j->scratch); break;
      case R_MSG_CODE: /* only an integer is an exit code */
        info->has_error_code = info->error_code = 0;
        break;
      default: break;
    }
    return 0;
  }
  if (c == '-' || (c >= '0' && c <= '9')) {
    int64_t v;
    int is_int;
    if (parse_number(j, &v, &is_int) != 0) return -1;
    if (role == R_TOP_TS) j->top_ts = v;
    if (role == R_EXTRA_TS) j->extra_ts = v;
    if (role == R_MSG_CODE) {
      info->has_error_code = is_int && v >= INT32_MIN && v <= INT32_MAX;
      info->error_code = info->has_error_code ? (int)v : 0;
    }
    return 0;
  }
  if (role == R_MSG_CODE) info->has_error_code = info->error_code = 0;
  if (c == 't') return literal(j, "true");
  if (c == 'f') return literal(j, "false");
  return literal(j, "null");
}

int agent_errorfile_parse(const char *buf, size_t len, agent_error_info_t *info, char *err,
                          size_t cap) {
  memset(info, 0, sizeof *info);
  if (err != NULL && cap > 0) err[0] = 0;
  jp_t j;
  memset(&j, 0, sizeof j);
  j.start = j.p = (const unsigned char *)(buf ? buf : "");
  j.end = j.start + (buf ? len : 0);
  j.err = err;
  j.cap = cap;
  j.info = info;
  if (len > (size_t)-1 / 4) {
    fail(&j, "input of %zu bytes is too large", len);
    return -1;
  }
  if (j.end - j.p >= 3 && !memcmp(j.p, "\xEF\xBB\xBF", 3)) j.p += 3; /* a UTF-8 BOM */
  j.scratch = malloc(3 * len + 8);
  if (j.scratch == NULL) {
    if (err != NULL && cap > 0) snprintf(err, cap, "out of memory for %zu bytes", len);
    return -1;
  }
  skip_ws(&j);
  if (j.p >= j.end) {
    fail(&j, "empty document");
  } else if (parse_value(&j, 0, R_ROOT) == 0) {
    skip_ws(&j);
    if (j.p < j.end) fail(&j, "unexpected data after the JSON value");
  }
  free(j.scratch);
  if (!j.failed && (!j.root_object || j.msg_kind == 0)) {
    j.failed = 1;
    if (err != NULL && cap > 0)
      snprintf(err, cap,
               "valid JSON but neither error-file form: expected {\"message\": {\"message\": ..., "
               "\"extraInfo\": {...}}} or {\"message\": \"...\", \"timestamp\": N}");
  }
  if (j.failed) {
    memset(info, 0, sizeof *info);
    return -1;
  }
  info->timestamp = j.msg_kind == 1 ? j.top_ts : j.extra_ts;
  return 0;
}

int agent_errorfile_read(const char *path, agent_error_info_t *info, char *err, size_t cap) {
  memset(info, 0, sizeof *info);
  if (err != NULL && cap > 0) err[0] = 0;
  if (path == NULL || path[0] == 0) {
    if (err != NULL && cap > 0) snprintf(err, cap, "no error file path: <N/A>");
    return -2;
  }
  /* O_NONBLOCK: a FIFO planted at the path must not hang the agent. */
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) {
    int e = errno;
    if (err != NULL && cap > 0) {
      if (e == ENOENT)
        snprintf(err, cap, "error file '%s' does not exist (the worker wrote none): <N/A>", path);
      else
        snprintf(err, cap, "cannot open error file '%s': %s", path, strerror(e));
    }
    return e == ENOENT ? -2 : -1;
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    if (err != NULL && cap > 0) snprintf(err, cap, "error file '%s' is not a regular file", path);
    close(fd);
    return -1;
  }
  char *buf = malloc(MAX_FILE + 1);
  if (buf == NULL) {
    close(fd);
    if (err != NULL && cap > 0) snprintf(err, cap, "error file '%s': out of memory", path);
    return -1;
  }
  size_t len = 0;
  int rc = 0;
  while (len <= MAX_FILE) {
    ssize_t n = read(fd, buf + len, MAX_FILE + 1 - len);
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      if (err != NULL && cap > 0)
        snprintf(err, cap, "cannot read error file '%s': %s", path, strerror(errno));
      rc = -1;
      break;
    }
    len += (size_t)n;
  }
  close(fd);
  if (rc == 0 && len > MAX_FILE) {
    if (err != NULL && cap > 0)
      snprintf(err, cap, "error file '%s' is larger than %u bytes; not parsed", path, MAX_FILE);
    rc = -1;
  }
  if (rc == 0) {
    char why[512];
    rc = agent_errorfile_parse(buf, len, info, why, sizeof why);
    if (rc != 0 && err != NULL && cap > 0) snprintf(err, cap, "error file '%s': %s", path, why);
  }
  free(buf);
  if (rc != 0) memset(info, 0, sizeof *info);
  return rc;
}

int agent_errorfile_is_peer_loss(const char *message) {
  static const char *const patterns[] = {
      "connection closed by peer", /* gloo tcp pair (PyTorch's gloo backend) */
      "connection reset by peer",  /* ECONNRESET from any socket transport */
      "broken pipe",               /* EPIPE */
      "remote process exited",     /* NCCL: "... or there was a network error" */
      "communicator was aborted",  /* ProcessGroupNCCL after another rank's abort */
      "closed the connection",     /* libtdist tcp: "rank N (...) closed the connection" */
      "closed its connection",     /* libtdist shm */
  };
  if (message == NULL) return 0;
  for (size_t i = 0; i < sizeof patterns / sizeof patterns[0]; i++)
    if (strcasestr(message, patterns[i]) != NULL) return 1;
  return 0;
}
