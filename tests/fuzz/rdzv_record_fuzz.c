/* libFuzzer target for the rendezvous values' codec (operator-agent/rendezvous/rdzv_record.c):
 * the records, counters, round ends and closed lists agents write to the store and read back.
 *
 * Input: byte 0 picks the parser (& 3: 0 agent_rdzv_parse_record, 1 agent_rdzv_parse_int, 2
 * agent_rdzv_parse_end, 3 agent_rdzv_parse_closed, and on what follows a newline
 * agent_rdzv_parse_header (the <r>/closed value), or with bit 2 set agent_rdzv_parse_table (the
 * <r>/table/<C> value, the list giving the arrivals)); byte 1 is nnodes_max - 1 (1..256; for
 * parse_int, hi = byte 1 << (byte 1 & 63), lo = 0 or -hi); the rest, up to a NUL, is the value
 * as read from the store (an exact-size heap copy, so that ASan catches a read past its end).
 * Invariants for any input:
 *   - the result is 0 or -1, and the same on a second parse (deterministic);
 *   - on 0, every field is in the range rdzv.h documents, and writing the fields back as an
 *     agent writes them (rdzv.c's formats) gives the input byte for byte: the codec accepts only
 *     the canonical text, so two agents never read one value two ways;
 *   - parse_closed's list is distinct and in range, NULL exactly for a bare "N";
 *   - parse_header's rank bases are the prefix sums of nprocs that add up to its world size.
 * Built by Bazel into rdzv_record_fuzz_replay_test (rdzv_record_replay.c) and by
 * run_libfuzzer.sh with -fsanitize=fuzzer. Keeps no state. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "operator-agent/rendezvous/rdzv.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FUZZ_CHECK(cond, ...)                                                                  \
  do {                                                                                         \
    if (!(cond)) {                                                                             \
      fprintf(stderr, "rdzv_record_fuzz: %s:%d: invariant failed: %s\n  ", __FILE__, __LINE__, \
              #cond);                                                                          \
      fprintf(stderr, __VA_ARGS__);                                                            \
      fputc('\n', stderr);                                                                     \
      abort();                                                                                 \
    }                                                                                          \
  } while (0)

static void check_record(const char *s, int nnodes_max) {
  agent_rdzv_member_t m, m2;
  memset(&m, 0x5a, sizeof m);
  int rc = agent_rdzv_parse_record(s, nnodes_max, &m);
  FUZZ_CHECK(rc == 0 || rc == -1, "rc %d", rc);
  memset(&m2, 0x5a, sizeof m2);
  FUZZ_CHECK(agent_rdzv_parse_record(s, nnodes_max, &m2) == rc, "not deterministic");
  if (rc) return;
  FUZZ_CHECK(memcmp(&m, &m2, sizeof m) == 0, "fields differ between two parses");
  FUZZ_CHECK(m.node_rank >= 0 && m.node_rank < nnodes_max, "node_rank %d", m.node_rank);
  FUZZ_CHECK(m.nproc >= 1 && m.nproc <= (1 << 20), "nproc %d", m.nproc);
  FUZZ_CHECK(m.attempt >= 0 && m.failures >= 0, "attempt %d failures %d", m.attempt, m.failures);
  FUZZ_CHECK(m.worker_port >= 0 && m.worker_port <= 65535, "port %d", m.worker_port);
  FUZZ_CHECK(memchr(m.addr, 0, sizeof m.addr) && memchr(m.host, 0, sizeof m.host),
             "addr or host not terminated");
  char back[256];
  snprintf(back, sizeof back, "%d %d %d %d %s %s %d", m.node_rank, m.nproc, m.attempt, m.failures,
           m.addr, m.host, m.worker_port);
  FUZZ_CHECK(!strcmp(back, s), "'%s' parsed, written back as '%s'", s, back);
}

static void check_int(const char *s, uint8_t b) {
  /* b 255: the whole int64_t range (the overflow checks); else b << 0..54, with or without the
   * negative side. */
  int64_t hi = b == 255 ? INT64_MAX : (int64_t)b << ((b & 63) % 55);
  int64_t lo = (b & 64) ? -hi : 0, v = 7, v2 = 9;
  int rc = agent_rdzv_parse_int(s, lo, hi, &v);
  FUZZ_CHECK(rc == 0 || rc == -1, "rc %d", rc);
  FUZZ_CHECK(agent_rdzv_parse_int(s, lo, hi, &v2) == rc, "not deterministic");
  if (rc) {
    FUZZ_CHECK(v == 7, "output written on failure");
    return;
  }
  FUZZ_CHECK(v == v2 && v >= lo && v <= hi, "%" PRId64 " outside %" PRId64 "..%" PRId64, v, lo, hi);
  char back[32];
  snprintf(back, sizeof back, "%" PRId64, v);
  FUZZ_CHECK(!strcmp(back, s), "'%s' parsed as %s", s, back);
}

static void check_end(const char *s) {
  agent_restart_reason_t reason = AGENT_RESTART_NREASONS;
  const char *text = NULL;
  int rc = agent_rdzv_parse_end(s, &reason, &text);
  FUZZ_CHECK(rc == 0 || rc == -1, "rc %d", rc);
  if (rc) return;
  FUZZ_CHECK(reason >= 0 && reason < AGENT_RESTART_NREASONS, "reason %d", (int)reason);
  FUZZ_CHECK(text && text > s && text <= s + strlen(s) && *text, "text outside the value");
  size_t l = strlen(agent_restart_reason_name(reason));
  FUZZ_CHECK(text == s + l + 1 && !strncmp(s, agent_restart_reason_name(reason), l) && s[l] == ' ',
             "'%s' is not '<reason> <text>'", s);
}

/* The members' records of <r>/table/<C> (agent_rdzv_parse_table): 0 or -1, deterministic, each
 * record given the list's arrival, and on 0 the records written back a line each give the table. */
static void check_table(const char *table, int64_t n, const int64_t *list, int nnodes_max) {
  agent_rdzv_member_t *m = calloc((size_t)n, sizeof *m), *m2 = calloc((size_t)n, sizeof *m2);
  FUZZ_CHECK(m && m2, "out of memory");
  int rc = agent_rdzv_parse_table(table, n, list, nnodes_max, m);
  FUZZ_CHECK(rc == 0 || rc == -1, "rc %d", rc);
  FUZZ_CHECK(agent_rdzv_parse_table(table, n, list, nnodes_max, m2) == rc, "not deterministic");
  if (!rc) {
    size_t cap = (size_t)n * 256 + 1, len = 0;
    char *back = malloc(cap);
    FUZZ_CHECK(back != NULL, "out of memory");
    back[0] = 0;
    for (int64_t i = 0; i < n; i++) {
      FUZZ_CHECK(m[i].idx == (int)list[i] && !memcmp(&m[i], &m2[i], sizeof m[i]),
                 "record %" PRId64 " differs or lacks its arrival", i);
      len += (size_t)snprintf(back + len, cap - len, "%s%d %d %d %d %s %s %d", i ? "\n" : "",
                              m[i].node_rank, m[i].nproc, m[i].attempt, m[i].failures, m[i].addr,
                              m[i].host, m[i].worker_port);
    }
    FUZZ_CHECK(!strcmp(back, table), "table '%s' written back as '%s'", table, back);
    free(back);
  }
  free(m);
  free(m2);
}

/* What follows the list in <r>/closed (agent_rdzv_parse_header): 0 or -1, deterministic; on 0 the
 * fields in range, the bases from 0 rising by 1..2^20 up to below the world size, and the nprocs
 * they give written back by agent_rdzv_format_header give the text byte for byte. */
static void check_header(const char *text, int64_t n) {
  agent_rdzv_header_t h, h2;
  int64_t *b = NULL, *b2 = NULL;
  int rc = agent_rdzv_parse_header(text, n, &h, &b);
  FUZZ_CHECK(rc == 0 || rc == -1, "rc %d", rc);
  FUZZ_CHECK(agent_rdzv_parse_header(text, n, &h2, &b2) == rc, "not deterministic");
  if (rc) {
    FUZZ_CHECK(!b && !b2, "bases on failure");
    return;
  }
  FUZZ_CHECK(!memcmp(&h, &h2, sizeof h) && !memcmp(b, b2, (size_t)n * sizeof *b), "differ");
  FUZZ_CHECK(h.world_size >= 1 && h.world_size <= INT32_MAX, "world %" PRId64, h.world_size);
  FUZZ_CHECK(h.attempt >= 0 && h.attempt <= AGENT_RDZV_MAX_COUNT && h.failures >= 0 &&
                 h.failures <= AGENT_RDZV_MAX_COUNT,
             "attempt %" PRId64 " failures %" PRId64, h.attempt, h.failures);
  FUZZ_CHECK(h.worker_port >= 0 && h.worker_port <= 65535 && h.closer >= 1 &&
                 h.closer <= AGENT_RDZV_MAX_COUNT && h.nproc >= 0 && h.nproc <= (1 << 20),
             "port %" PRId64 " closer %" PRId64 " nproc %" PRId64, h.worker_port, h.closer,
             h.nproc);
  int *np = malloc((size_t)n * sizeof *np);
  FUZZ_CHECK(np != NULL, "out of memory");
  for (int64_t i = 0; i < n; i++) {
    int64_t next = i + 1 < n ? b[i + 1] : h.world_size;
    FUZZ_CHECK(b[0] == 0 && next - b[i] >= 1 && next - b[i] <= (1 << 20),
               "base %" PRId64 " of member %" PRId64 ", next %" PRId64, b[i], i, next);
    FUZZ_CHECK(!h.nproc || next - b[i] == h.nproc, "nproc %" PRId64, h.nproc);
    np[i] = (int)(next - b[i]);
  }
  char *back = agent_rdzv_format_header(&h, n, np);
  FUZZ_CHECK(back && !strcmp(back, text), "'%s' parsed, written back as '%s'", text,
             back ? back : "(null)");
  free(back);
  free(np);
  free(b);
  free(b2);
}

static void check_closed(const char *value, int nnodes_max, int table_after) {
  /* As the agents read it: the list, then (after a newline) the header, or for table_after the
   * members' records (the list naming their arrivals, as in <r>/table/<C>). */
  char *s = strdup(value), *table = strchr(s, '\n');
  FUZZ_CHECK(s != NULL, "out of memory");
  if (table) *table++ = 0;
  int64_t n = -1, n2 = -1, *list = NULL, *list2 = NULL;
  int rc = agent_rdzv_parse_closed(s, nnodes_max, &n, &list);
  FUZZ_CHECK(rc == 0 || rc == -1, "rc %d", rc);
  int rc2 = agent_rdzv_parse_closed(s, nnodes_max, &n2, &list2);
  FUZZ_CHECK(rc2 == rc, "not deterministic");
  if (rc) {
    FUZZ_CHECK(list == NULL && list2 == NULL, "a list on failure");
    free(s);
    return;
  }
  FUZZ_CHECK(n == n2 && n >= 1 && n <= nnodes_max, "n %" PRId64, n);
  FUZZ_CHECK((list == NULL) == (strchr(s, ' ') == NULL), "list %p for '%s'", (void *)list, s);
  size_t cap = 32 + (size_t)n * 24, len;
  char *back = malloc(cap);
  FUZZ_CHECK(back != NULL, "out of memory");
  len = (size_t)snprintf(back, cap, "%" PRId64, n);
  for (int64_t i = 0; list && i < n; i++) {
    FUZZ_CHECK(list[i] == list2[i], "lists differ");
    FUZZ_CHECK(list[i] >= 1 && list[i] <= AGENT_RDZV_MAX_COUNT, "arrival %" PRId64, list[i]);
    for (int64_t j = 0; j < i; j++)
      FUZZ_CHECK(list[j] != list[i], "arrival %" PRId64 " twice", list[i]);
    len += (size_t)snprintf(back + len, cap - len, "%s%" PRId64, i ? "," : " ", list[i]);
  }
  FUZZ_CHECK(!strcmp(back, s), "'%s' parsed, written back as '%s'", s, back);
  if (table && list && table_after) check_table(table, n, list, nnodes_max);
  if (table && list && !table_after) check_header(table, n);
  free(back);
  free(list);
  free(list2);
  free(s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 2) return 0;
  size_t n = size - 2;
  const uint8_t *nul = memchr(data + 2, 0, n);
  if (nul) n = (size_t)(nul - (data + 2));
  char *s = malloc(n + 1);
  if (!s) abort();
  memcpy(s, data + 2, n);
  s[n] = 0;
  int nnodes_max = data[1] + 1;
  switch (data[0] & 3) {
    case 0: check_record(s, nnodes_max); break;
    case 1: check_int(s, data[1]); break;
    case 2: check_end(s); break;
    default: check_closed(s, nnodes_max, data[0] & 4); break;
  }
  free(s);
  return 0;
}
