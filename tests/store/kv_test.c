/* The store's key map (runtime/store/kv.h) against an independent model of PyTorch's semantics
 * (shared/reference/torch-contracts.md §1.5):
 *   - fixed cases: COMPARE_SET's three rules with the replies captured from PyTorch 1.13, ADD on a
 *     missing key, on text that is not a number and wrapping at the int64 ends, integer parsing
 *     against strtoll (the C form of the std::stoll PyTorch calls), APPEND creating a key, DELETE's
 *     reply, queues in FIFO order, a key that exists through its queue alone;
 *   - a random sequence (TDIST_TEST_SEED, default 1) of every operation over a small pool of keys,
 *     binary keys and values with NUL bytes included, each reply compared with the model's, and
 *     the whole map (every key's existence, value and queue length, the key count, all_exist over
 *     random key sets) compared after every step. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "rng.h"
#include "runtime/store/kv.h"

#define NKEYS 12
#define MAXV 512
#define MAXQ 64

typedef struct {
  int has_value;
  uint8_t val[MAXV];
  size_t vlen;
  uint8_t q[MAXQ][8];
  size_t qlen_of[MAXQ];
  int qn;
} model_t;

static const char *k_keys[NKEYS] = {
    "a",        "b",     "/worker/attempt_0/x",   "init/", "k\0z", "", "cnt",
    "\xff\x01", "queue", "long/key/with/slashes", "c",     "d"};
static const size_t k_klen[NKEYS] = {1, 1, 19, 5, 3, 0, 3, 2, 5, 21, 1, 1};
static model_t g_m[NKEYS];

/* The reference parse: strtoll on a NUL-terminated copy (stoll = strtoll + "no digits" and range
 * errors). A value with a NUL byte ends there, as the C++ string's c_str() would. */
static int ref_parse(const uint8_t *p, size_t n, int64_t *out) {
  char buf[MAXV + 1];
  memcpy(buf, p, n);
  buf[n] = 0;
  char *end;
  errno = 0;
  long long v = strtoll(buf, &end, 10);
  if (end == buf || errno == ERANGE) return -EINVAL;
  /* strtoll accepts "0x"? no (base 10); "  -" alone has no digits: end == buf. */
  *out = v;
  return 0;
}

static void check_map(tdist__kv_t *kv, int step) {
  uint64_t nv = 0;
  for (int i = 0; i < NKEYS; i++) {
    const model_t *m = &g_m[i];
    nv += (uint64_t)m->has_value;
    tdist__kv_entry_t *e = tdist__kv_find(kv, k_keys[i], k_klen[i]);
    int exists = m->has_value || m->qn > 0;
    if (tdist__kv_exists(e) != exists || (e && e->has_value != m->has_value)) {
      fprintf(stderr, "step %d key %d: exists %d has_value %d, model %d %d\n", step, i,
              tdist__kv_exists(e), e ? e->has_value : -1, exists, m->has_value);
      exit(1);
    }
    if (m->has_value) CHECK_MEM_EQ(e->val, e->vlen, m->val, m->vlen);
    CHECK_EQ_INT(tdist__kv_queue_len(kv, k_keys[i], k_klen[i]), m->qn);
  }
  CHECK_EQ_INT(tdist__kv_num_keys(kv), nv);
  /* all_exist over a random set of the keys without NUL bytes */
  const char *set[NKEYS];
  size_t n = 0;
  int want = 1;
  for (int i = 0; i < NKEYS; i++) {
    if (strlen(k_keys[i]) != k_klen[i] || !(rnd() % 3 == 0)) continue;
    set[n++] = k_keys[i];
    want &= g_m[i].has_value || g_m[i].qn > 0;
  }
  CHECK_EQ_INT(tdist__kv_all_exist(kv, set, n), want);
}

static void rand_bytes(uint8_t *p, size_t n) {
  for (size_t i = 0; i < n; i++) p[i] = (uint8_t)(rnd() % 4 == 0 ? 0 : rnd());
}

/* Either a decimal number (sometimes with junk around it) or random bytes. */
static size_t rand_value(uint8_t *p, size_t cap) {
  if (rnd() % 2) {
    int n = snprintf((char *)p, cap, "%s%" PRId64 "%s", rnd() % 4 ? "" : " \t",
                     (int64_t)(rnd() % 2001) - 1000, rnd() % 4 ? "" : "x9");
    return (size_t)n;
  }
  size_t n = rnd() % 24;
  rand_bytes(p, n);
  return n;
}

static void random_ops(uint64_t seed, int steps) {
  test_rng_seed(&test_rng, seed * 0x9E3779B97F4A7C15ull + 1);
  memset(g_m, 0, sizeof g_m);
  tdist__kv_t *kv = tdist__kv_create();
  CHECK(kv != NULL);
  for (int step = 0; step < steps; step++) {
    int i = (int)(rnd() % NKEYS);
    model_t *m = &g_m[i];
    const char *k = k_keys[i];
    size_t kl = k_klen[i];
    uint8_t v[64], x[64];
    size_t vl, xl;
    tdist__kv_entry_t *out = NULL;
    switch (rnd() % 8) {
      case 0: /* SET */
        vl = rand_value(v, sizeof v);
        CHECK_EQ_INT(tdist__kv_set(kv, k, kl, v, vl, &out), 0);
        CHECK(out != NULL);
        memcpy(m->val, v, vl);
        m->vlen = vl;
        m->has_value = 1;
        break;
      case 1: /* APPEND: creates the key, or appends */
        vl = rnd() % 8;
        rand_bytes(v, vl);
        if (m->vlen + vl > MAXV) break;
        CHECK_EQ_INT(tdist__kv_append(kv, k, kl, v, vl, &out), 0);
        if (!m->has_value) m->vlen = 0;
        memcpy(m->val + m->vlen, v, vl);
        m->vlen += vl;
        m->has_value = 1;
        break;
      case 2: { /* ADD */
        int64_t d = (int64_t)(rnd() % 201) - 100, got = 0, cur = 0, want;
        int r = tdist__kv_add(kv, k, kl, d, &got, &out);
        if (m->has_value && ref_parse(m->val, m->vlen, &cur) != 0) {
          CHECK_EQ_INT(r, -EINVAL);
          break;
        }
        CHECK_EQ_INT(r, 0);
        want = cur + d;
        CHECK_EQ_INT(got, want);
        m->vlen = (size_t)snprintf((char *)m->val, MAXV, "%" PRId64, want);
        m->has_value = 1;
        break;
      }
      case 3: { /* COMPARE_SET */
        xl = rnd() % 3 == 0 ? 0 : rand_value(x, sizeof x);
        if (m->has_value && rnd() % 2) { /* often the right expected value */
          xl = m->vlen < sizeof x ? m->vlen : 0;
          memcpy(x, m->val, xl);
        }
        vl = rand_value(v, sizeof v);
        const uint8_t *cur = NULL;
        size_t cl = 0;
        int stored = -1;
        CHECK_EQ_INT(tdist__kv_compare_set(kv, k, kl, x, xl, v, vl, &cur, &cl, &stored, &out), 0);
        int want_store = m->has_value ? (m->vlen == xl && !memcmp(m->val, x, xl)) : xl == 0;
        CHECK_EQ_INT(stored, want_store);
        if (want_store) {
          memcpy(m->val, v, vl);
          m->vlen = vl;
          m->has_value = 1;
        }
        if (m->has_value)
          CHECK_MEM_EQ(cur, cl, m->val, m->vlen);
        else
          CHECK_MEM_EQ(cur, cl, x, xl); /* absent key, expected non-empty: "lying" */
        break;
      }
      case 4: /* DELETE */
        CHECK_EQ_INT(tdist__kv_delete(kv, k, kl), m->has_value);
        m->has_value = 0;
        m->vlen = 0;
        break;
      case 5: /* QUEUE_PUSH */
        if (m->qn == MAXQ) break;
        vl = rnd() % 9;
        rand_bytes(v, vl);
        CHECK_EQ_INT(tdist__kv_queue_push(kv, k, kl, v, vl, &out), 0);
        memcpy(m->q[m->qn], v, vl);
        m->qlen_of[m->qn++] = vl;
        break;
      case 6: { /* QUEUE_POP: oldest first */
        tdist__kv_qitem_t *q = tdist__kv_queue_pop(kv, k, kl);
        if (!m->qn) {
          CHECK(q == NULL);
          break;
        }
        CHECK(q != NULL);
        CHECK_MEM_EQ(q->data, q->len, m->q[0], m->qlen_of[0]);
        free(q);
        memmove(m->q, m->q + 1, sizeof m->q[0] * (size_t)(m->qn - 1));
        memmove(m->qlen_of, m->qlen_of + 1, sizeof m->qlen_of[0] * (size_t)(m->qn - 1));
        m->qn--;
        break;
      }
      default: /* lookup of a key that may not exist creates nothing that counts */
        CHECK(tdist__kv_lookup(kv, k, kl) != NULL);
        tdist__kv_release(kv, tdist__kv_find(kv, k, kl));
        break;
    }
    check_map(kv, step);
  }
  tdist__kv_destroy(kv);
}

static void fixed_cases(void) {
  tdist__kv_t *kv = tdist__kv_create();
  CHECK(kv != NULL);
  const uint8_t *cur;
  size_t cl;
  int stored;
  /* COMPARE_SET, the replies captured from PyTorch 1.13 */
  CHECK_EQ_INT(tdist__kv_compare_set(kv, "cas", 3, "", 0, "new", 3, &cur, &cl, &stored, NULL), 0);
  CHECK_MEM_EQ(cur, cl, "new", 3);
  CHECK_EQ_INT(stored, 1);
  CHECK_EQ_INT(tdist__kv_compare_set(kv, "cas", 3, "wrong", 5, "x", 1, &cur, &cl, &stored, NULL),
               0);
  CHECK_MEM_EQ(cur, cl, "new", 3);
  CHECK_EQ_INT(stored, 0);
  CHECK_EQ_INT(tdist__kv_compare_set(kv, "cas", 3, "new", 3, "newer", 5, &cur, &cl, &stored, NULL),
               0);
  CHECK_MEM_EQ(cur, cl, "newer", 5);
  CHECK_EQ_INT(stored, 1);
  CHECK_EQ_INT(tdist__kv_compare_set(kv, "none", 4, "abc", 3, "x", 1, &cur, &cl, &stored, NULL), 0);
  CHECK_MEM_EQ(cur, cl, "abc", 3);
  CHECK_EQ_INT(stored, 0);
  CHECK(!tdist__kv_exists(tdist__kv_find(kv, "none", 4)));
  /* ADD: a missing key counts as 0; text that is not a number is an error and stays; wraps */
  int64_t r = 0;
  CHECK_EQ_INT(tdist__kv_add(kv, "n", 1, -7, &r, NULL), 0);
  CHECK_EQ_INT(r, -7);
  CHECK_EQ_INT(tdist__kv_add(kv, "cas", 3, 1, &r, NULL), -EINVAL);
  tdist__kv_entry_t *e = tdist__kv_find(kv, "cas", 3);
  CHECK_MEM_EQ(e->val, e->vlen, "newer", 5);
  CHECK_EQ_INT(tdist__kv_set(kv, "big", 3, "9223372036854775807", 19, NULL), 0);
  CHECK_EQ_INT(tdist__kv_add(kv, "big", 3, 1, &r, NULL), 0);
  CHECK(r == INT64_MIN);
  e = tdist__kv_find(kv, "big", 3);
  CHECK_MEM_EQ(e->val, e->vlen, "-9223372036854775808", 20);
  /* integer parsing: strtoll's rules */
  static const char *k_texts[] = {"0",
                                  "  42",
                                  "\t\n-17xyz",
                                  "+5",
                                  "-",
                                  "",
                                  "abc",
                                  " +-3",
                                  "12 3",
                                  "9223372036854775807",
                                  "9223372036854775808",
                                  "-9223372036854775808",
                                  "-9223372036854775809",
                                  "007",
                                  "\v\f\r 1"};
  for (size_t i = 0; i < sizeof k_texts / sizeof k_texts[0]; i++) {
    int64_t got = 123, want = 456;
    int rg = tdist__kv_parse_int((const uint8_t *)k_texts[i], strlen(k_texts[i]), &got);
    int rw = ref_parse((const uint8_t *)k_texts[i], strlen(k_texts[i]), &want);
    if (rg != rw || (rg == 0 && got != want)) {
      fprintf(stderr, "parse '%s': got %d %" PRId64 ", strtoll %d %" PRId64 "\n", k_texts[i], rg,
              got, rw, want);
      exit(1);
    }
  }
  /* APPEND creates; DELETE replies whether a value was there */
  CHECK_EQ_INT(tdist__kv_append(kv, "ap", 2, "x", 1, NULL), 0);
  CHECK_EQ_INT(tdist__kv_append(kv, "ap", 2, "yz", 2, NULL), 0);
  e = tdist__kv_find(kv, "ap", 2);
  CHECK_MEM_EQ(e->val, e->vlen, "xyz", 3);
  CHECK_EQ_INT(tdist__kv_num_keys(kv), 4); /* cas, n, big, ap */
  CHECK_EQ_INT(tdist__kv_delete(kv, "ap", 2), 1);
  CHECK_EQ_INT(tdist__kv_delete(kv, "ap", 2), 0);
  CHECK_EQ_INT(tdist__kv_num_keys(kv), 3);
  /* a queue alone makes a key exist for WAIT/CHECK, and is not a key for GETNUMKEYS */
  CHECK_EQ_INT(tdist__kv_queue_push(kv, "q", 1, "1", 1, NULL), 0);
  CHECK_EQ_INT(tdist__kv_queue_push(kv, "q", 1, "22", 2, NULL), 0);
  const char *both[] = {"q", "n"}, *missing[] = {"q", "ap"};
  CHECK_EQ_INT(tdist__kv_all_exist(kv, both, 2), 1);
  CHECK_EQ_INT(tdist__kv_all_exist(kv, missing, 2), 0);
  CHECK_EQ_INT(tdist__kv_all_exist(kv, missing, 0), 1);
  CHECK_EQ_INT(tdist__kv_num_keys(kv), 3);
  tdist__kv_qitem_t *q = tdist__kv_queue_pop(kv, "q", 1);
  CHECK(q != NULL);
  CHECK_MEM_EQ(q->data, q->len, "1", 1);
  free(q);
  q = tdist__kv_queue_pop(kv, "q", 1);
  CHECK(q != NULL);
  CHECK_MEM_EQ(q->data, q->len, "22", 2);
  free(q);
  CHECK(tdist__kv_queue_pop(kv, "q", 1) == NULL);
  CHECK_EQ_INT(tdist__kv_all_exist(kv, both, 2), 0);
  tdist__kv_destroy(kv);
}

int main(void) {
  uint64_t seed = test_seed("kv_test", 1);
  fixed_cases();
  for (uint64_t k = 0; k < 20; k++) random_ops(seed + k, 2000);
  TEST_LOG("kv_test: fixed cases and 20 x 2000 random operations (seed %" PRIu64 ") ok", seed);
  return 0;
}
