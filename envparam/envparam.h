/* A table-driven reader of environment variables, shared by libtdist's parameter table
 * (runtime/common/param.h) and tdist-agent's (operator-agent/common/param.h): one parser, one
 * read-once cache and one set of messages for both, while each program keeps its own table and
 * includes no header of the other (the agent includes no runtime/ header).
 *
 * A table is an array of definitions (envparam_def_t) and, per table, the cache
 * (envparam_table_t: slots, flags and a mutex the owner allocates statically). Each variable is
 * read at its first use and cached for the life of the process (thread-safe; a fork keeps what
 * the parent had read). An empty value counts as unset. A bad value reads as the default (so that
 * logging keeps working) with a message naming the variable, the value and what is allowed.
 * Every first read is reported through the table's debug callback, after the lock is released
 * (the callback may itself read a parameter, such as the log level). Never allocates. */
#ifndef TDIST_ENVPARAM_ENVPARAM_H
#define TDIST_ENVPARAM_ENVPARAM_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>

typedef enum {
  ENVPARAM_INT,    /* decimal integer in min..max */
  ENVPARAM_DOUBLE, /* decimal number in min..max */
  ENVPARAM_ENUM,   /* one of choices ("a|b|c"), case-insensitive; the value is the index */
  ENVPARAM_STR     /* any text of min..max bytes */
} envparam_type_t;

#define ENVPARAM_STR_MAX 4095 /* the longest STR value any table may allow */
#define ENVPARAM_ERR_MAX 320

typedef struct {
  const char *name; /* "TDIST_LOG_LEVEL" */
  envparam_type_t type;
  const char *dflt;     /* the default as the variable would spell it; NULL: none (unset) */
  const char *dflt_doc; /* the default in words when it is not a plain value, else NULL */
  double min, max;      /* INT and DOUBLE: the range; STR: the length range */
  const char *choices;  /* ENUM */
  unsigned scope;       /* the owner's: who reads the variable (0 where a table has one reader) */
  const char *help;
} envparam_def_t;

typedef struct {
  long long i;   /* INT, and ENUM (the index into choices) */
  double d;      /* DOUBLE */
  const char *s; /* STR: points into the parsed text */
} envparam_value_t;

typedef struct {
  int set; /* set to a valid value */
  int bad; /* set to a bad value: err holds the message */
  envparam_value_t v;
  char err[ENVPARAM_ERR_MAX];
  char text[ENVPARAM_STR_MAX + 1]; /* STR: a copy, so that a later setenv cannot move it */
} envparam_slot_t;

typedef struct {
  const envparam_def_t *defs;
  int count;
  envparam_slot_t *slots; /* count of them, zeroed */
  _Atomic int *loaded;    /* count of them, zeroed */
  pthread_mutex_t *mu;
  void (*debug)(const char *line); /* "TDIST_X=value", "TDIST_X unset: default D", or the error */
} envparam_table_t;

/* Parses text as d would be: 0 and *out set, or -1 and a message naming the variable, the value
 * and what is allowed in err. Pure. */
int envparam_parse(const envparam_def_t *d, const char *text, envparam_value_t *out, char *err,
                   size_t cap);

/* Row id of t, read from the environment at the first call and cached. */
const envparam_slot_t *envparam_get(const envparam_table_t *t, int id);

#endif
