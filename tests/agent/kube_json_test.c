/* operator-agent/kube's JSON reading (json.c): the JobSet fields the in-place restart protocol
 * reads, watch events, Status messages; each wrong kind of field is an error naming it; then
 * 20,000 mutations (byte flips, cuts, insertions of JSON tokens) of valid documents, each run
 * from an exact-size heap copy (ASan sees a read past its end), must parse or fail with a
 * message, never crash, and a document that parses has attempts in 0..2147483647. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "operator-agent/kube/kube.h"
#include "tests/testlib/check.h"
#include "tests/testlib/rng.h"

static const char kJobSet[] =
    "{\"apiVersion\":\"jobset.x-k8s.io/v1alpha2\",\"kind\":\"JobSet\",\"metadata\":{\"name\":"
    "\"train\",\"namespace\":\"a\",\"resourceVersion\":\"12345\",\"annotations\":{\"x\":\"a\\\"b\\/"
    "c\\u00e9\"}},\"spec\":{\"failurePolicy\":{\"maxRestarts\":3,\"restartStrategy\":"
    "\"InPlaceRestart\"},\"replicatedJobs\":[{\"name\":\"w\",\"replicas\":1}]},\"status\":{"
    "\"restarts\":0,\"currentInPlaceRestartAttempt\":2,\"previousInPlaceRestartAttempt\":1}}";

static int parse(const char *s, agent_kube_jobset_t *js, char *err, size_t cap) {
  size_t n = strlen(s);
  char *copy = malloc(n ? n : 1);
  memcpy(copy, s, n);
  int rc = agent_kube_parse_jobset(copy, n, js, err, cap);
  free(copy);
  return rc;
}

static void check_jobset(void) {
  agent_kube_jobset_t js;
  char err[400];
  TEST_CASE("jobset");
  CHECK_EQ_INT(parse(kJobSet, &js, err, sizeof err), 0);
  CHECK_STR(js.restart_strategy, "InPlaceRestart");
  CHECK_STR(js.resource_version, "12345");
  CHECK_EQ_INT(js.disabled, 0);
  CHECK_EQ_INT(js.has_current, 1);
  CHECK_EQ_INT(js.current, 2);
  CHECK_EQ_INT(js.has_previous, 1);
  CHECK_EQ_INT(js.previous, 1);
  CHECK_EQ_INT(agent_kube_jobset_bypass(&js), 0);

  TEST_CASE("unset status, disabled, no strategy");
  CHECK_EQ_INT(parse("{\"metadata\":{\"annotations\":{\"jobset.sigs.k8s.io/"
                     "disable-in-place-restart\":\"\"}},\"status\":{\"currentInPlaceRestartAttempt"
                     "\":null}}",
                     &js, err, sizeof err),
               0);
  CHECK_EQ_INT(js.disabled, 1);
  CHECK_EQ_INT(js.has_current, 0);
  CHECK_EQ_INT(js.has_previous, 0);
  CHECK_EQ_INT(agent_kube_jobset_bypass(&js), 1);
  CHECK_EQ_INT(parse("{}", &js, err, sizeof err), 0);
  CHECK_EQ_INT(agent_kube_jobset_bypass(&js), 1); /* no failurePolicy: Recreate */

  static const struct {
    const char *json, *msg;
  } bad[] = {
      {"", "not a JSON object"},
      {"[1,2]", "not a JSON object"},
      {"\"x\"", "not a JSON object"},
      {"{\"a\":", "bad JSON"},
      {"{\"status\":{\"currentInPlaceRestartAttempt\":-1}}",
       "status.currentInPlaceRestartAttempt: '-1' is not an integer in 0..2147483647"},
      {"{\"status\":{\"currentInPlaceRestartAttempt\":2147483648}}", "0..2147483647"},
      {"{\"status\":{\"previousInPlaceRestartAttempt\":\"1\"}}",
       "status.previousInPlaceRestartAttempt: '1' is not an integer"},
      {"{\"status\":{\"previousInPlaceRestartAttempt\":1.5}}", "'1.5' is not an integer"},
      {"{\"status\":{\"currentInPlaceRestartAttempt\":{}}}",
       "status.currentInPlaceRestartAttempt is not a string"},
      {"{\"spec\":{\"failurePolicy\":{\"restartStrategy\":[]}}}",
       "spec.failurePolicy.restartStrategy is not a string"},
      {"{\"spec\":{\"failurePolicy\":{\"restartStrategy\":\"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"
       "\"}}}",
       "spec.failurePolicy.restartStrategy: a value of 36 bytes, over 31"},
      {"{\"metadata\":{\"resourceVersion\":\"a\\u0000b\"}}", "metadata.resourceVersion"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    TEST_CASE(bad[i].json);
    err[0] = 0;
    CHECK_EQ_INT(parse(bad[i].json, &js, err, sizeof err), -1);
    CHECK_HAS(err, bad[i].msg);
  }
  TEST_CASE("over the size limit");
  size_t big = AGENT_KUBE_MAX_JSON + 1;
  char *b = malloc(big);
  memset(b, ' ', big);
  b[0] = '{';
  b[big - 1] = '}';
  CHECK_EQ_INT(agent_kube_parse_jobset(b, big, &js, err, sizeof err), -1);
  CHECK_HAS(err, "over the 4194304-byte limit");
  free(b);
  TEST_CASE(NULL);
  TEST_LOG("jobset: fields, nulls, bypass, %zu bad documents", sizeof bad / sizeof bad[0]);
}

static void check_events(void) {
  agent_kube_jobset_t js;
  char err[400], type[16], msg[100];
  int code;
  char ev[sizeof kJobSet + 64];
  snprintf(ev, sizeof ev, "{\"type\":\"MODIFIED\",\"object\":%s}", kJobSet);
  CHECK_EQ_INT(
      agent_kube_parse_event(ev, strlen(ev), type, sizeof type, &js, &code, err, sizeof err), 0);
  CHECK_STR(type, "MODIFIED");
  CHECK_EQ_INT(js.current, 2);
  const char *gone = "{\"type\":\"ERROR\",\"object\":{\"kind\":\"Status\",\"code\":410}}";
  CHECK_EQ_INT(
      agent_kube_parse_event(gone, strlen(gone), type, sizeof type, &js, &code, err, sizeof err),
      0);
  CHECK_STR(type, "ERROR");
  CHECK_EQ_INT(code, 410);
  const char *bm = "{\"type\":\"BOOKMARK\",\"object\":{\"metadata\":{\"resourceVersion\":\"77\"}}}";
  CHECK_EQ_INT(
      agent_kube_parse_event(bm, strlen(bm), type, sizeof type, &js, &code, err, sizeof err), 0);
  CHECK_STR(js.resource_version, "77");
  const char *odd = "{\"type\":\"SURPRISE\",\"object\":{}}";
  CHECK_EQ_INT(
      agent_kube_parse_event(odd, strlen(odd), type, sizeof type, &js, &code, err, sizeof err), -1);
  CHECK_HAS(err, "unknown type 'SURPRISE'");
  const char *none = "{\"object\":{}}";
  CHECK_EQ_INT(
      agent_kube_parse_event(none, strlen(none), type, sizeof type, &js, &code, err, sizeof err),
      -1);
  CHECK_HAS(err, "without a type");
  const char *st = "{\"kind\":\"Status\",\"message\":\"jobsets \\\"x\\\" is forbidden\"}";
  CHECK_EQ_INT(agent_kube_parse_status_message(st, strlen(st), msg, sizeof msg), 0);
  CHECK_STR(msg, "jobsets \"x\" is forbidden");
  CHECK_EQ_INT(agent_kube_parse_status_message("<html>", 6, msg, sizeof msg), -1);
  CHECK_STR(msg, "");
  TEST_LOG("events: MODIFIED, ERROR 410, BOOKMARK, unknown, no type; Status messages");
}

static const char *const kTokens[] = {"{",
                                      "}",
                                      "[",
                                      "]",
                                      ",",
                                      ":",
                                      "\"",
                                      "\\",
                                      "null",
                                      "-1",
                                      "1e9",
                                      "&a",
                                      "*a",
                                      "!!str",
                                      "\t",
                                      "\n",
                                      "#",
                                      "%YAML 1.1\n",
                                      "---",
                                      "...",
                                      "'",
                                      "\\u0000",
                                      "99999999999999999999"};

static void check_mutations(void) {
  test_rng_init("kube_json_test", 35);
  char ev[sizeof kJobSet + 64];
  snprintf(ev, sizeof ev, "{\"type\":\"MODIFIED\",\"object\":%s}", kJobSet);
  const char *seeds[] = {kJobSet, ev};
  long parsed = 0, failed = 0;
  for (long i = 0; i < 20000; i++) {
    const char *s = seeds[rnd_below(2)];
    size_t n = strlen(s), cap = n + 64;
    char *buf = malloc(cap);
    memcpy(buf, s, n);
    for (int m = 0, nm = 1 + (int)rnd_below(4); m < nm && n; m++) {
      size_t at = (size_t)rnd_below(n);
      switch (rnd_below(4)) {
        case 0: buf[at] = (char)rnd(); break;
        case 1: n = at; break;
        default: {
          const char *t = kTokens[rnd_below(sizeof kTokens / sizeof kTokens[0])];
          size_t tl = strlen(t);
          if (n + tl > cap) break;
          memmove(buf + at + tl, buf + at, n - at);
          memcpy(buf + at, t, tl);
          n += tl;
        }
      }
    }
    char *exact = malloc(n ? n : 1);
    memcpy(exact, buf, n);
    agent_kube_jobset_t js;
    char err[400] = "", type[16];
    int code, rc;
    if (s == kJobSet)
      rc = agent_kube_parse_jobset(exact, n, &js, err, sizeof err);
    else
      rc = agent_kube_parse_event(exact, n, type, sizeof type, &js, &code, err, sizeof err);
    if (rc == 0) {
      parsed++;
      CHECK(!js.has_current || (js.current >= 0 && js.current <= 2147483647));
      CHECK(!js.has_previous || (js.previous >= 0 && js.previous <= 2147483647));
      CHECK(memchr(js.restart_strategy, 0, sizeof js.restart_strategy) != NULL);
    } else {
      failed++;
      CHECK(err[0] != 0);
    }
    free(exact);
    free(buf);
  }
  TEST_LOG("mutations: 20000 inputs, %ld parsed, %ld refused with a message", parsed, failed);
}

int main(void) {
  check_jobset();
  check_events();
  check_mutations();
  TEST_LOG("ok");
  return 0;
}
