/* libFuzzer target for the worker error-file reader (operator-agent/supervisor/errorfile.h).
 *
 * Each input is the content of a TORCHELASTIC_ERROR_FILE. Invariants that must hold for any input:
 *   - the result is 0 or -1; on -1 the info is all zero and err says why;
 *   - message and traceback are NUL-terminated inside their arrays and valid UTF-8;
 *   - parsing is deterministic (a second parse gives the same bytes);
 *   - on success, the fields written back as a file of either form parse to exactly the same
 *     fields (nothing is lost or altered by escaping, and what was cut stays as it was cut);
 *   - on success, the input without its last non-blank byte is invalid (the document is an
 *     object, so a strict prefix can never be complete).
 * The input is parsed from an exact-size heap copy so that ASan catches any read past `len`.
 * Built by Bazel into errorfile_fuzz_replay_test (errorfile_replay.c) and by
 * run_libfuzzer.sh with -fsanitize=fuzzer. Never writes to the input, keeps no state. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "operator-agent/supervisor/errorfile.h"
#include "tests/testlib/utf8.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FUZZ_CHECK(cond, ...)                                                                \
  do {                                                                                       \
    if (!(cond)) {                                                                           \
      fprintf(stderr, "errorfile_fuzz: %s:%d: invariant failed: %s\n  ", __FILE__, __LINE__, \
              #cond);                                                                        \
      fprintf(stderr, __VA_ARGS__);                                                          \
      fputc('\n', stderr);                                                                   \
      abort();                                                                               \
    }                                                                                        \
  } while (0)

static int parse_copy(const uint8_t *data, size_t size, agent_error_info_t *info, char *err,
                      size_t cap) {
  char *copy = malloc(size ? size : 1);
  if (copy == NULL) abort();
  if (size) memcpy(copy, data, size);
  int rc = agent_errorfile_parse(copy, size, info, err, cap);
  free(copy);
  return rc;
}

/* A JSON string literal of s (valid UTF-8): quotes, backslashes and controls escaped. */
static size_t quote(char *out, const char *s) {
  size_t o = 0;
  out[o++] = '"';
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    if (*p == '"' || *p == '\\') {
      out[o++] = '\\';
      out[o++] = (char)*p;
    } else if (*p < 0x20) {
      o += (size_t)sprintf(out + o, "\\u%04x", *p);
    } else {
      out[o++] = (char)*p;
    }
  }
  out[o++] = '"';
  return o;
}

static void check_round_trip(const agent_error_info_t *info) {
  /* 6 bytes per escaped byte at most, for both strings, plus the frame. */
  static char doc[6 * (sizeof info->message + sizeof info->traceback) + 512];
  agent_error_info_t again;
  char err[256];
  for (int form = 0; form < 2; form++) {
    size_t o = 0;
    if (form == 0) {
      o += (size_t)sprintf(doc + o, "{\"message\": {\"message\": ");
      o += quote(doc + o, info->message);
      o += (size_t)sprintf(doc + o, ", \"extraInfo\": {\"py_callstack\": ");
      o += quote(doc + o, info->traceback);
      o += (size_t)sprintf(doc + o, ", \"timestamp\": \"%" PRId64 "\"}", info->timestamp);
      if (info->has_error_code)
        o += (size_t)sprintf(doc + o, ", \"errorCode\": %d", info->error_code);
      o += (size_t)sprintf(doc + o, "}}");
    } else {
      if (info->traceback[0] || info->has_error_code) continue; /* not expressible */
      o += (size_t)sprintf(doc + o, "{\"timestamp\": %" PRId64 ", \"message\": ", info->timestamp);
      o += quote(doc + o, info->message);
      o += (size_t)sprintf(doc + o, "}");
    }
    int rc = parse_copy((const uint8_t *)doc, o, &again, err, sizeof err);
    FUZZ_CHECK(rc == 0, "form %d re-encoded did not parse: %s", form, err);
    FUZZ_CHECK(!strcmp(info->message, again.message) && !strcmp(info->traceback, again.traceback) &&
                   info->timestamp == again.timestamp &&
                   info->has_error_code == again.has_error_code &&
                   info->error_code == again.error_code,
               "form %d: fields changed in a round trip (message '%s' -> '%s')", form,
               info->message, again.message);
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static const agent_error_info_t zero;
  agent_error_info_t info, info2;
  char err[256], err2[256];
  memset(err, 'x', sizeof err);
  int rc = parse_copy(data, size, &info, err, sizeof err);
  FUZZ_CHECK(rc == 0 || rc == -1, "rc %d", rc);
  FUZZ_CHECK(memchr(err, 0, sizeof err) != NULL, "err not terminated");
  FUZZ_CHECK(memchr(info.message, 0, sizeof info.message) != NULL, "message not terminated");
  FUZZ_CHECK(memchr(info.traceback, 0, sizeof info.traceback) != NULL, "traceback not terminated");
  FUZZ_CHECK(valid_utf8(info.message), "message is not valid UTF-8");
  FUZZ_CHECK(valid_utf8(info.traceback), "traceback is not valid UTF-8");
  if (rc != 0) {
    FUZZ_CHECK(memcmp(&info, &zero, sizeof zero) == 0, "info not zeroed on error");
    FUZZ_CHECK(err[0] != 0, "no error text");
  } else {
    FUZZ_CHECK(err[0] == 0, "error text on success: %s", err);
  }

  int rc2 = parse_copy(data, size, &info2, err2, sizeof err2);
  FUZZ_CHECK(rc2 == rc && memcmp(&info, &info2, sizeof info) == 0 && strcmp(err, err2) == 0,
             "not deterministic");

  if (rc == 0) {
    check_round_trip(&info);
    size_t end = size;
    while (end > 0 && (data[end - 1] == ' ' || data[end - 1] == '\t' || data[end - 1] == '\n' ||
                       data[end - 1] == '\r'))
      end--;
    FUZZ_CHECK(end > 0, "empty input parsed");
    rc2 = parse_copy(data, end - 1, &info2, err2, sizeof err2);
    FUZZ_CHECK(rc2 == -1, "a strict prefix (%zu of %zu bytes) parsed", end - 1, size);
  }
  return 0;
}
