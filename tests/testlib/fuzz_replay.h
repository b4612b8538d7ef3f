/* The one main() of the fuzz replay tests (tests/fuzz: proto_replay.c, config_replay.c,
 * errorfile_replay.c), so that plain `bazel test` exercises each libFuzzer target without
 * libFuzzer: it replays every file of the target's seed corpus (sorted by name), then COUNT inputs
 * that the target's generator makes from a seeded generator (rng.h: the seed is printed;
 * TDIST_TEST_SEED=N and COUNT replay a run). Each input runs from an exact-size heap copy, so that
 * ASan catches a read past its end. An invariant failure aborts inside the target; the driver stops
 * early (and says so) after 40 s, a safety net for slow sanitizer builds.
 *
 * A replay file includes this header, defines its generator and
 *   int main(int argc, char **argv) { return fuzz_replay_main(argc, argv, &desc); }
 * usage of the test: NAME [CORPUS_DIR [COUNT]]. Header-only, test code only. */
#ifndef TDIST_TESTLIB_FUZZ_REPLAY_H
#define TDIST_TESTLIB_FUZZ_REPLAY_H

#include <dirent.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/testlib/clock.h"
#include "tests/testlib/rng.h"
#include "tests/testlib/wire_enc.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

typedef struct {
  char *name;
  uint8_t *data;
  size_t len;
} corpus_file_t;

typedef struct {
  const char *name;        /* printed with the seed */
  const char *default_dir; /* the corpus when none is given */
  long default_count;      /* generated inputs when no COUNT is given */
  uint64_t default_seed;   /* when TDIST_TEST_SEED is not set */
  size_t max_file;         /* seeds are cut to this many bytes (0: whole) */
  /* Makes generated input number i in b (empty on entry; wire_enc.h) from rnd() (rng.h). */
  void (*generate)(long i, const corpus_file_t *files, size_t nfiles, enc_t *b);
} fuzz_replay_t;

/* ---- pieces the generators share (all draw from rnd(), rng.h) ---- */

/* A random file of the corpus (nfiles > 0). */
static inline const corpus_file_t *fuzz_pick(const corpus_file_t *files, size_t nfiles) {
  return &files[rnd_below(nfiles)];
}

/* Appends the head of one random corpus file and the tail of another. */
static inline void fuzz_splice(enc_t *b, const corpus_file_t *files, size_t nfiles) {
  const corpus_file_t *f = fuzz_pick(files, nfiles), *g = fuzz_pick(files, nfiles);
  enc_bytes(b, f->data, (size_t)rnd_below(f->len + 1));
  size_t from = (size_t)rnd_below(g->len + 1);
  enc_bytes(b, g->data + from, g->len - from);
}

/* Appends n random bytes. */
static inline void fuzz_random_bytes(enc_t *b, size_t n) {
  enc_reserve(b, n);
  for (size_t k = 0; k < n; k++) b->p[b->len + k] = (uint8_t)rnd();
  b->len += n;
}

/* Inserts text at a random place of b (a dictionary token, for a target's `special`). */
static inline void fuzz_insert_text(enc_t *b, const char *t) {
  size_t tl = strlen(t), at = (size_t)rnd_below(b->len + 1);
  enc_reserve(b, tl);
  memmove(b->p + at + tl, b->p + at, b->len - at);
  memcpy(b->p + at, t, tl);
  b->len += tl;
}

/* 1 to 4 mutations of b, each one of: a bit flipped, a byte set at random, the target's own
 * mutation (`special`: a boundary value, a dictionary token...), a random byte inserted, a byte
 * deleted, the input truncated. */
static inline void fuzz_mutate(enc_t *b, void (*special)(enc_t *b)) {
  int n = 1 + (int)rnd_below(4);
  for (int i = 0; i < n; i++) {
    switch (rnd_below(6)) {
      case 0:
        if (b->len) b->p[rnd_below(b->len)] ^= (uint8_t)(1u << rnd_below(8));
        break;
      case 1:
        if (b->len) b->p[rnd_below(b->len)] = (uint8_t)rnd();
        break;
      case 2: special(b); break;
      case 3: {
        enc_reserve(b, 1);
        size_t at = (size_t)rnd_below(b->len + 1);
        memmove(b->p + at + 1, b->p + at, b->len - at);
        b->p[at] = (uint8_t)rnd();
        b->len++;
        break;
      }
      case 4:
        if (b->len) {
          size_t at = (size_t)rnd_below(b->len);
          memmove(b->p + at, b->p + at + 1, b->len - at - 1);
          b->len--;
        }
        break;
      default:
        if (b->len) b->len = (size_t)rnd_below(b->len);
        break;
    }
  }
}

/* The usual mix of inputs, by i % 5: the target's generator (`gen`); the same, mutated; a corpus
 * file, mutated; two corpus files spliced (mutated half the time); up to random_max - 1 random
 * bytes. `special` is the target's own mutation (fuzz_mutate). nfiles > 0. */
static inline void fuzz_generate_mix(long i, const corpus_file_t *files, size_t nfiles, enc_t *b,
                                     void (*gen)(enc_t *b), void (*special)(enc_t *b),
                                     uint64_t random_max) {
  switch (i % 5) {
    case 0:
    case 1:
      gen(b);
      if (i % 5 == 1) fuzz_mutate(b, special);
      break;
    case 2: {
      const corpus_file_t *f = fuzz_pick(files, nfiles);
      enc_bytes(b, f->data, f->len);
      fuzz_mutate(b, special);
      break;
    }
    case 3:
      fuzz_splice(b, files, nfiles);
      if (rnd_below(2)) fuzz_mutate(b, special);
      break;
    default: fuzz_random_bytes(b, (size_t)rnd_below(random_max)); break;
  }
}

static inline void fuzz_replay_run(const void *p, size_t n) {
  uint8_t *copy = malloc(n ? n : 1);
  if (copy == NULL) exit(1);
  if (n) memcpy(copy, p, n);
  LLVMFuzzerTestOneInput(copy, n);
  free(copy);
}

static inline int fuzz_corpus_cmp_(const void *a, const void *b) {
  return strcmp(((const corpus_file_t *)a)->name, ((const corpus_file_t *)b)->name);
}

/* Every regular entry of dir not starting with '.', sorted by name (readdir order is not
 * deterministic). Exits with a message if dir cannot be opened or read. */
static inline size_t fuzz_corpus_load(const char *dir, corpus_file_t **out) {
  DIR *d = opendir(dir);
  if (d == NULL) {
    fprintf(stderr, "cannot open corpus directory '%s'\n", dir);
    exit(1);
  }
  corpus_file_t *files = NULL;
  size_t n = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.') continue;
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    FILE *f = fopen(path, "rb");
    if (f == NULL) continue;
    enc_t b = {0};
    size_t r;
    do {
      enc_reserve(&b, 4096);
      r = fread(b.p + b.len, 1, b.cap - b.len, f);
      b.len += r;
    } while (r > 0);
    fclose(f);
    corpus_file_t *nf = realloc(files, (n + 1) * sizeof *files);
    if (nf == NULL) exit(1);
    files = nf;
    files[n].name = strdup(e->d_name);
    files[n].data = b.p;
    files[n].len = b.len;
    n++;
  }
  closedir(d);
  if (n) qsort(files, n, sizeof *files, fuzz_corpus_cmp_);
  *out = files;
  return n;
}

static inline int fuzz_replay_main(int argc, char **argv, const fuzz_replay_t *t) {
  const char *dir = argc > 1 ? argv[1] : t->default_dir;
  long count = t->default_count;
  if (argc > 2) {
    char *end = NULL;
    count = strtol(argv[2], &end, 10);
    if (end == argv[2] || *end || count < 0) {
      fprintf(stderr, "%s: COUNT must be a whole number, got '%s'\n", t->name, argv[2]);
      return 2;
    }
  }
  uint64_t seed = test_rng_init(t->name, t->default_seed);
  double t0 = now_s();

  corpus_file_t *files = NULL;
  size_t nfiles = fuzz_corpus_load(dir, &files);
  if (nfiles == 0) {
    fprintf(stderr, "corpus directory '%s' is empty\n", dir);
    return 1;
  }
  size_t corpus_bytes = 0;
  for (size_t i = 0; i < nfiles; i++) {
    if (t->max_file && files[i].len > t->max_file) files[i].len = t->max_file;
    fuzz_replay_run(files[i].data, files[i].len);
    corpus_bytes += files[i].len;
  }
  fprintf(stderr, "replayed %zu corpus files (%zu bytes) from %s\n", nfiles, corpus_bytes, dir);

  enc_t b = {0};
  long done = 0;
  for (long i = 0; i < count; i++) {
    b.len = 0;
    t->generate(i, files, nfiles, &b);
    fuzz_replay_run(b.p, b.len);
    done++;
    if (now_s() - t0 > 40.0) {
      fprintf(stderr, "stopping early after %ld generated inputs (40 s budget)\n", done);
      break;
    }
  }
  fprintf(stderr, "ran %ld generated inputs (seed %" PRIu64 ") in %.2f s: all invariants held\n",
          done, seed, now_s() - t0);
  free(b.p);
  for (size_t i = 0; i < nfiles; i++) {
    free(files[i].name);
    free(files[i].data);
  }
  free(files);
  return 0;
}

#endif
