/* Shared by the replay mains of the fuzz targets (replay_main.c, config_replay_main.c,
 * errorfile_replay_main.c): loading a seed corpus directory in a deterministic order, and
 * running one input from an exact-size heap copy so that ASan catches any read past its end.
 * The including file declares LLVMFuzzerTestOneInput (its fuzz target). Test code only. */
#ifndef TDIST_TESTS_FUZZ_CORPUS_H
#define TDIST_TESTS_FUZZ_CORPUS_H

#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

typedef struct {
  char *name;
  uint8_t *data;
  size_t len;
} corpus_file_t;

static void corpus_run(const void *p, size_t n) {
  uint8_t *copy = malloc(n ? n : 1);
  if (copy == NULL) exit(1);
  if (n) memcpy(copy, p, n);
  LLVMFuzzerTestOneInput(copy, n);
  free(copy);
}

static int corpus_cmp_names(const void *a, const void *b) {
  return strcmp(((const corpus_file_t *)a)->name, ((const corpus_file_t *)b)->name);
}

/* Every regular entry of dir not starting with '.', whole, sorted by name (readdir order is
 * not deterministic). Exits with a message if dir cannot be opened. */
static size_t corpus_load(const char *dir, corpus_file_t **out) {
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
    uint8_t *data = NULL;
    size_t len = 0, cap = 0, r;
    do {
      if (len == cap) {
        cap = cap ? 2 * cap : 4096;
        data = realloc(data, cap);
        if (data == NULL) exit(1);
      }
      r = fread(data + len, 1, cap - len, f);
      len += r;
    } while (r > 0);
    fclose(f);
    corpus_file_t *nf = realloc(files, (n + 1) * sizeof *files);
    if (nf == NULL) exit(1);
    files = nf;
    files[n].name = strdup(e->d_name);
    files[n].data = data;
    files[n].len = len;
    n++;
  }
  closedir(d);
  if (n) qsort(files, n, sizeof *files, corpus_cmp_names);
  *out = files;
  return n;
}

static void corpus_free(corpus_file_t *files, size_t n) {
  for (size_t i = 0; i < n; i++) {
    free(files[i].name);
    free(files[i].data);
  }
  free(files);
}

#endif
