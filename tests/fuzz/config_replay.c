/* The generator of config_fuzz_replay_test (the driver is tests/testlib/fuzz_replay.h): after the
 * seed corpus of the config fuzz target (config_fuzz.c), inputs made from the seed: corpus files
 * with YAML-aware mutations (config_gen.h), splices of two files, and random bytes. An invariant
 * failure aborts; TDIST_TEST_SEED and COUNT reproduce a run.
 *
 * usage: config_fuzz_replay_test CORPUS_DIR [COUNT]   (default COUNT 3000) */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tests/agent/config_gen.h"
#include "tests/testlib/fuzz_replay.h"

#define MAX_FILE 16384

static void generate(long i, const corpus_file_t *files, size_t nfiles, enc_t *b) {
  if (i % 4 == 2) { /* the head of one file and the tail of another */
    fuzz_splice(b, files, nfiles);
    return;
  }
  /* Seeds are cut to MAX_FILE bytes (desc.max_file): the buffer holds two of them. */
  enc_reserve(b, 2 * MAX_FILE);
  char *buf = (char *)b->p;
  if (i % 4 == 3) {
    b->len = cfg_gen_random(&test_rng, buf, 2 * MAX_FILE);
    return;
  }
  const corpus_file_t *f = fuzz_pick(files, nfiles);
  memcpy(buf, f->data, f->len);
  b->len = cfg_gen_mutate(&test_rng, buf, f->len, 2 * MAX_FILE);
}

static const fuzz_replay_t desc = {
    .name = "config_fuzz_replay_test",
    .default_dir = "tests/fuzz/corpus_config",
    .default_count = 3000,
    .default_seed = 0xc0f19ea11ULL,
    .max_file = MAX_FILE,
    .generate = generate,
};

int main(int argc, char **argv) { return fuzz_replay_main(argc, argv, &desc); }
