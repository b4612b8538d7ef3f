/* The generator of rdzv_record_fuzz_replay_test (the driver is tests/testlib/fuzz_replay.h):
 * after the seed corpus of the rendezvous codec's fuzz target (rdzv_record_fuzz.c), inputs made
 * from it: values written the way agents write them with random fields (records, counters, round
 * ends, closed lists with their headers, at and past their bounds), near misses of those (a sign, a
 * leading zero, a space too many, a field too long), corpus files with bit flips, tokens,
 * insertions, deletions and truncations, splices of two files, and random bytes. An invariant
 * failure aborts (the test fails with the message; TDIST_TEST_SEED and COUNT reproduce a run).
 *
 * usage: rdzv_record_fuzz_replay_test CORPUS_DIR [COUNT]   (default COUNT 20000) */
#define _GNU_SOURCE
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/testlib/fuzz_replay.h"

static const char *const tokens[] = {
    " ",
    "-",
    "-0",
    "0",
    "00",
    "1",
    "+1",
    ",",
    ",,",
    "\t",
    "\n",
    "65535",
    "65536",
    "1000000000",
    "1000000001",
    "9223372036854775807",
    "9223372036854775808",
    "worker_failed ",
    "peer_lost ",
    "store_lost ",
    "membership ",
    "protocol_error ",
    "10.0.0.1",
    "::1",
    "fe80::1%eth0",
};
#define NTOKENS (sizeof tokens / sizeof tokens[0])

static void put_token(enc_t *b) { fuzz_insert_text(b, tokens[rnd_below(NTOKENS)]); }

/* A number near one of the bounds the codec checks. */
static int64_t near_bound(void) {
  static const int64_t k[] = {0, 1, 255, 256, 65535, 65536, 1 << 20, 1000000000, INT64_MAX};
  int64_t v = k[rnd_below(sizeof k / sizeof k[0])];
  int64_t d = (int64_t)rnd_below(3) - 1;
  if ((v == INT64_MAX && d > 0) || (v == 0 && d < 0)) d = 0;
  return v + d;
}

static void gen_word(enc_t *b, size_t maxlen) {
  size_t n = 1 + (size_t)rnd_below(maxlen);
  for (size_t i = 0; i < n; i++) {
    uint8_t c = (uint8_t)(0x21 + rnd_below(0x5E)); /* printable, no space */
    enc_bytes(b, &c, 1);
  }
}

/* One value as an agent writes it, selector and nnodes_max byte first. */
static void gen_value(enc_t *b) {
  uint8_t head[2] = {(uint8_t)rnd_below(4), (uint8_t)rnd()};
  enc_bytes(b, head, 2);
  char num[32];
  switch (head[0]) {
    case 0: /* "node_rank nproc attempt failures addr host worker_port" */
      snprintf(num, sizeof num, "%d %d %" PRId64 " %" PRId64 " ", (int)rnd_below(head[1] + 2u),
               1 + (int)rnd_below(8), near_bound(), near_bound());
      enc_text(b, num);
      gen_word(b, rnd_below(8) ? 16 : 70);
      enc_text(b, " ");
      gen_word(b, rnd_below(8) ? 16 : 70);
      snprintf(num, sizeof num, " %" PRId64,
               rnd_below(2) ? near_bound() : (int64_t)rnd_below(65536));
      enc_text(b, num);
      break;
    case 1:
      snprintf(num, sizeof num, "%" PRId64, near_bound() * (rnd_below(4) ? 1 : -1));
      enc_text(b, num);
      break;
    case 2:
      enc_text(b, tokens[17 + rnd_below(5)]);
      if (rnd_below(4)) gen_word(b, 40);
      break;
    default: {
      int64_t n = 1 + (int64_t)rnd_below(head[1] + 2u);
      snprintf(num, sizeof num, "%" PRId64, n);
      enc_text(b, num);
      if (rnd_below(3) == 0) break;
      for (int64_t i = 0; i < n; i++) {
        snprintf(num, sizeof num, "%s%" PRId64, i ? "," : " ",
                 rnd_below(8) ? 1 + (int64_t)rnd_below(2 * (uint64_t)n) : near_bound());
        enc_text(b, num);
      }
      if (rnd_below(4) == 0) break;
      /* The header ("W A F P C U", U 0: the nprocs follow), its world size mostly the sum. */
      int64_t u = rnd_below(3) ? 1 + (int64_t)rnd_below(8) : 0, ws = 0, np[300];
      for (int64_t i = 0; i < n && i < 300; i++) ws += np[i] = u ? u : 1 + (int64_t)rnd_below(8);
      char line[160];
      snprintf(line, sizeof line,
               "\n%" PRId64 " %" PRId64 " %" PRId64 " %" PRId64 " %" PRId64 " %" PRId64,
               rnd_below(8) ? ws : near_bound(), rnd_below(8) ? 0 : near_bound(),
               (int64_t)rnd_below(3), (int64_t)rnd_below(65536),
               rnd_below(8) ? 1 + (int64_t)rnd_below(10) : near_bound(), u);
      enc_text(b, line);
      for (int64_t i = 0; !u && i < n && i < 300; i++) {
        snprintf(num, sizeof num, "%s%" PRId64, i ? "," : "\n", np[i]);
        enc_text(b, num);
      }
    }
  }
}

static void generate(long i, const corpus_file_t *files, size_t nfiles, enc_t *b) {
  fuzz_generate_mix(i, files, nfiles, b, gen_value, put_token, 100);
}

static const fuzz_replay_t desc = {
    .name = "rdzv_record_fuzz_replay_test",
    .default_dir = "tests/fuzz/corpus_rdzv",
    .default_count = 20000,
    .default_seed = 0x4d2e5f0c0de5ULL,
    .generate = generate,
};

int main(int argc, char **argv) { return fuzz_replay_main(argc, argv, &desc); }
