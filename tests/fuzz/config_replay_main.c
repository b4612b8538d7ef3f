/* A main() for the config fuzz target (config_fuzz.c) so that plain `bazel test` exercises it
 * without libFuzzer: it replays every file of the seed corpus, then inputs made from a
 * deterministic seed: corpus files with YAML-aware mutations (config_gen.h), splices of two
 * files, and random bytes. An invariant failure aborts with the input's number; TDIST_FUZZ_SEED
 * and COUNT reproduce a run.
 *
 * usage: config_fuzz_replay_test CORPUS_DIR [COUNT]   (default COUNT 3000) */
#define _GNU_SOURCE
#include <dirent.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tests/fuzz/corpus.h"

#include "tests/fuzz/config_gen.h"

#define MAX_FILE 16384

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
  const char *dir = argc > 1 ? argv[1] : "tests/fuzz/corpus_config";
  long count = argc > 2 ? strtol(argv[2], NULL, 10) : 3000;
  const char *seed_env = getenv("TDIST_FUZZ_SEED");
  cfg_rng_t rng = {seed_env ? strtoull(seed_env, NULL, 0) : 0xc0f19ea11ULL};
  uint64_t seed = rng.s;
  if (rng.s == 0) rng.s = 1;
  double t0 = now_s();

  corpus_file_t *files = NULL;
  size_t nfiles = corpus_load(dir, &files);
  if (nfiles == 0) {
    fprintf(stderr, "corpus directory '%s' is empty\n", dir);
    return 1;
  }
  for (size_t i = 0; i < nfiles; i++) {
    /* Seeds are read up to MAX_FILE bytes: the mutation buffer below holds two of them. */
    if (files[i].len > MAX_FILE) files[i].len = MAX_FILE;
    corpus_run(files[i].data, files[i].len);
  }
  fprintf(stderr, "replayed %zu corpus files from %s\n", nfiles, dir);

  static char buf[2 * MAX_FILE];
  long done = 0;
  for (long i = 0; i < count; i++, done++) {
    size_t len;
    const corpus_file_t *f = &files[cfg_below(&rng, nfiles)];
    switch (i % 4) {
      case 0:
      case 1:
        memcpy(buf, f->data, f->len);
        len = cfg_gen_mutate(&rng, buf, f->len, sizeof buf);
        break;
      case 2: { /* the head of one file and the tail of another */
        const corpus_file_t *g = &files[cfg_below(&rng, nfiles)];
        size_t a = (size_t)cfg_below(&rng, f->len + 1), b = (size_t)cfg_below(&rng, g->len + 1);
        memcpy(buf, f->data, a);
        memcpy(buf + a, g->data + b, g->len - b);
        len = a + g->len - b;
        break;
      }
      default: len = cfg_gen_random(&rng, buf, sizeof buf);
    }
    corpus_run(buf, len);
    if (now_s() - t0 > 40.0) { /* a safety net for slow sanitizer builds */
      fprintf(stderr, "stopping early after %ld generated inputs (40 s budget)\n", done + 1);
      done++;
      break;
    }
  }
  fprintf(stderr, "ran %ld generated inputs (seed 0x%" PRIx64 ") in %.2f s: all invariants held\n",
          done, seed, now_s() - t0);
  corpus_free(files, nfiles);
  return 0;
}
