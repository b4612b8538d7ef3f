/* The rendezvous' store traffic (rdzv_int.h): ADD, SET, compare-set and reads of the job's keys
 * through the public store API, with errors worded for the agent's log (the key, the status, the
 * value no agent writes). */
#define _GNU_SOURCE
#include "operator-agent/rendezvous/rdzv.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tdist/status.h>

#include "operator-agent/rendezvous/rdzv_int.h"

agent_rdzv_result_t rdzv_fail(agent_rdzv_t *r, const char *what, tdist_status_t st) {
  snprintf(r->err, sizeof r->err, "store %s failed (%s): %s", what, tdist_status_name(st),
           tdist_store_last_error(r->store));
  return st == TDIST_ERR_NO_MEMORY ? AGENT_RDZV_NO_MEMORY : AGENT_RDZV_STORE_ERROR;
}

agent_rdzv_result_t rdzv_bad_value(agent_rdzv_t *r, const char *key, const void *v, size_t n,
                                   const char *want) {
  char shown[80];
  size_t l = n < sizeof shown - 1 ? n : sizeof shown - 1;
  for (size_t i = 0; i < l; i++) {
    unsigned char c = ((const unsigned char *)v)[i];
    shown[i] = c >= 0x20 && c < 0x7f ? (char)c : '?';
  }
  shown[l] = 0;
  snprintf(r->err, sizeof r->err,
           "protocol error: key %s holds '%s'%s, not %s (no agent of this job writes that)", key,
           shown, n > l ? "..." : "", want);
  return AGENT_RDZV_PROTOCOL_ERROR;
}

static agent_rdzv_result_t add(agent_rdzv_t *r, const char *key, int64_t delta, int64_t *out) {
  tdist_status_t st = tdist_store_add(r->store, key, delta, out);
  if (st == TDIST_OK) return AGENT_RDZV_PENDING;
  if (st != TDIST_ERR_INVALID_USAGE) return rdzv_fail(r, key, st);
  /* The server refused: the value is not a number (the client reconnected). Show it. */
  char v[128];
  int found = 0;
  agent_rdzv_result_t res = rdzv_get_opt(r, key, v, sizeof v, &found);
  if (res < 0) return res;
  return rdzv_bad_value(r, key, v, strlen(v), "a decimal counter");
}

/* ADD, then the result checked against lo..hi. */
agent_rdzv_result_t rdzv_add_in(agent_rdzv_t *r, const char *key, int64_t delta, int64_t lo,
                                int64_t hi, int64_t *out) {
  agent_rdzv_result_t res = add(r, key, delta, out);
  if (res < 0 || (*out >= lo && *out <= hi)) return res;
  char v[32], want[80];
  snprintf(v, sizeof v, "%" PRId64, *out);
  snprintf(want, sizeof want, "a count in %" PRId64 "..%" PRId64, lo, hi);
  return rdzv_bad_value(r, key, v, strlen(v), want);
}

agent_rdzv_result_t rdzv_set_str(agent_rdzv_t *r, const char *key, const char *v) {
  tdist_status_t st = tdist_store_set(r->store, key, v, strlen(v));
  return st == TDIST_OK ? AGENT_RDZV_PENDING : rdzv_fail(r, key, st);
}

agent_rdzv_result_t rdzv_read_round(agent_rdzv_t *r, int64_t *cur) {
  return rdzv_add_in(r, "round", 0, 0, AGENT_RDZV_MAX_ROUND, cur);
}

/* Copies a store value into out (NUL-terminated, cut to cap) and frees it. */
static void take_value(char *out, size_t cap, void *v, size_t n) {
  if (n >= cap) n = cap - 1;
  memcpy(out, v, n);
  out[n] = 0;
  tdist_free(v);
}

/* compare_set with string values; the resulting value goes to out (NUL-terminated). */
agent_rdzv_result_t rdzv_cas(agent_rdzv_t *r, const char *key, const char *expected,
                             const char *desired, char *out, size_t cap) {
  void *v = NULL;
  size_t n = 0;
  tdist_status_t st = tdist_store_compare_set(r->store, key, expected, strlen(expected), desired,
                                              strlen(desired), &v, &n);
  if (st != TDIST_OK) return rdzv_fail(r, key, st);
  take_value(out, cap, v, n);
  return AGENT_RDZV_PENDING;
}

/* Value of key if it exists (*found = 1), without waiting. */
agent_rdzv_result_t rdzv_get_opt(agent_rdzv_t *r, const char *key, char *out, size_t cap,
                                 int *found) {
  const char *keys[1] = {key};
  int ready = 0;
  tdist_status_t st = tdist_store_check(r->store, keys, 1, &ready);
  if (st != TDIST_OK) return rdzv_fail(r, key, st);
  *found = ready;
  out[0] = 0;
  if (!ready) return AGENT_RDZV_PENDING;
  void *v = NULL;
  size_t n = 0;
  st = tdist_store_get(r->store, key, &v, &n);
  if (st != TDIST_OK) return rdzv_fail(r, key, st);
  take_value(out, cap, v, n);
  return AGENT_RDZV_PENDING;
}

/* The value of key, allocated (NUL-terminated; the caller frees), or *out = NULL if absent. */
agent_rdzv_result_t rdzv_get_alloc(agent_rdzv_t *r, const char *key, char **out) {
  const char *keys[1] = {key};
  int ready = 0;
  *out = NULL;
  tdist_status_t st = tdist_store_check(r->store, keys, 1, &ready);
  if (st != TDIST_OK) return rdzv_fail(r, key, st);
  if (!ready) return AGENT_RDZV_PENDING;
  void *v = NULL;
  size_t n = 0;
  st = tdist_store_get(r->store, key, &v, &n);
  if (st != TDIST_OK) return rdzv_fail(r, key, st);
  *out = malloc(n + 1);
  if (*out) {
    memcpy(*out, v, n);
    (*out)[n] = 0;
  }
  tdist_free(v);
  if (!*out) {
    snprintf(r->err, sizeof r->err, "out of memory reading %s (%zu bytes)", key, n);
    return AGENT_RDZV_NO_MEMORY;
  }
  return AGENT_RDZV_PENDING;
}

void rdzv_copy_trunc(char *dst, size_t cap, const char *src) {
  size_t n = strlen(src);
  if (n >= cap) n = cap - 1;
  memcpy(dst, src, n);
  dst[n] = 0;
}

void rdzv_free_multi(char **keys, void **vals, size_t *lens, size_t n) {
  for (size_t i = 0; i < n; i++) {
    if (keys) free(keys[i]);
    if (vals) tdist_free(vals[i]);
  }
  free(keys);
  free(vals);
  free(lens);
}
