/* Environment parameters: the table of every TDIST_* variable that libtdist reads (NCCL's
 * NCCL_PARAM), with its type, default, range or allowed values and one line of help.
 *
 * Each variable is read at its first use and cached for the life of the process (thread-safe; a
 * fork keeps what the parent had read). An empty value counts as unset. A bad value is never
 * replaced by the default in silence: the getters return the default so that logging keeps
 * working, but tdist__param_error() holds a message naming the variable, the value and what is
 * allowed, and the code that uses the variable fails with it (group creation with
 * TDIST_ERR_INVALID_ARGUMENT, tdist-store at start-up). Every read is logged at
 * debug level. Nothing outside this file may call getenv() for a TDIST_* name: the test
 * //tests/common:param_tree_test checks the tree for that, and docs/environment.md's list against
 * this one.
 *
 * tdist-agent has its own table (operator-agent/common/param.h: the variables it reads itself,
 * TDIST_PYTHON, TDIST_STALL_REPORT_SECONDS and its own TDIST_LOG_LEVEL) and its flags have
 * environment names too (TDIST_<FLAG>, operator-agent/config/config_opts.c); neither is repeated
 * here. */
#ifndef TDIST_COMMON_PARAM_H
#define TDIST_COMMON_PARAM_H

#include <stddef.h>

#include "envparam/envparam.h"

/* The types, definitions and values of the engine both programs' tables use
 * (envparam/envparam.h: the parser, the read-once cache, the messages). */
typedef envparam_type_t tdist__param_type_t;
#define TDIST__PARAM_INT ENVPARAM_INT       /* decimal integer in min..max */
#define TDIST__PARAM_DOUBLE ENVPARAM_DOUBLE /* decimal number in min..max */
#define TDIST__PARAM_ENUM ENVPARAM_ENUM     /* one of choices, case-insensitive: the index */
#define TDIST__PARAM_STR ENVPARAM_STR       /* any text of at most max bytes */

/* Who reads the variable. */
#define TDIST__PARAM_LIB 1u /* libtdist (every process that uses it) */

#define TDIST__SPIN_MAX_US 10000000 /* 10 s */
#define TDIST__PATH_MAX_LEN ENVPARAM_STR_MAX

/* X(ID, type, default, default as documented (NULL: the default itself), min, max, choices,
 *   scope, help). The variable is TDIST_<ID>. Keep the rows in the order docs/environment.md lists
 * them. */
/* clang-format off */
#define TDIST__PARAMS(X)                                                                          \
  X(LOG_LEVEL, ENUM, "info", NULL, 0, 0, "error|warn|warning|info|debug",                         \
    TDIST__PARAM_LIB, "Log level of libtdist and tdist-agent on stderr (warning = warn).")        \
  X(DEBUG, ENUM, "OFF", NULL, 0, 0, "OFF|INFO|DETAIL", TDIST__PARAM_LIB,                          \
    "DETAIL: gloo groups compare every collective's op, dtype, count and root across ranks "      \
    "first, like TORCH_DISTRIBUTED_DEBUG.")                                                       \
  X(SOCKET_IFNAME, STR, NULL, "the interface that reaches the store", 0, 15, NULL,                \
    TDIST__PARAM_LIB,                                                                             \
    "Network interface whose IPv4 address gloo listens on (the socket_ifname option wins).")      \
  X(SHM, INT, "1", NULL, 0, 1, NULL, TDIST__PARAM_LIB,                                            \
    "0 turns off the shared-memory links between gloo ranks on the same host (TCP only).")        \
  X(SPIN_US, INT, NULL, "50, or 200 if this host's ranks > online CPUs", 0, TDIST__SPIN_MAX_US,   \
    NULL, TDIST__PARAM_LIB,                                                                       \
    "Microseconds a gloo TCP receive spins (yielding the CPU if this host's ranks > online "      \
    "CPUs) before it sleeps in poll.")                                                            \
  X(SHM_SPIN_US, INT, "2000", NULL, 0, TDIST__SPIN_MAX_US, NULL, TDIST__PARAM_LIB,                \
    "Microseconds a shared-memory ring wait spins before it sleeps on the doorbell.")             \
  X(SHM_SINGLE_COPY, INT, "1", NULL, 0, 1, NULL, TDIST__PARAM_LIB,                                \
    "1: same-host ranks copy large messages straight from the sender's memory "                   \
    "(process_vm_readv, where allowed: one copy instead of two through the ring).")               \
  X(SHM_YIELD, INT, "1", NULL, 0, 1, NULL, TDIST__PARAM_LIB,                                      \
    "1: a rank spinning on a shared-memory ring yields the CPU between polls (after 20 us; "      \
    "at once if this host's ranks > online CPUs).")                                               \
  X(P2P_BUFFER_MB, INT, "256", NULL, 0, 1048576, NULL, TDIST__PARAM_LIB,                          \
    "MiB of send/recv messages a gloo group holds for receives not posted yet (early, or "        \
    "out of tag order).")                                                                         \
  X(ALGO_ALLREDUCE, ENUM, "auto", NULL, 0, 0, "auto|ring|rd|direct", TDIST__PARAM_LIB,            \
    "gloo all_reduce algorithm: ring, recursive doubling (rd), direct, or chosen by size and "    \
    "group (auto).")                                                                              \
  X(REDUCE_KERNELS, ENUM, "auto", NULL, 0, 0, "auto|generic", TDIST__PARAM_LIB,                   \
    "generic: use the portable reduction kernels even where AVX2/F16C ones exist.")               \
  X(STATS_FILE, STR, NULL, "no statistics", 1, TDIST__PATH_MAX_LEN, NULL, TDIST__PARAM_LIB,       \
    "File the process's collective statistics are mapped to (tdist-agent sets it per worker).")   \
  X(NCCL_DEVICE, INT, NULL, "LOCAL_RANK, else rank % devices", 0, 2147483647, NULL,               \
    TDIST__PARAM_LIB, "CUDA device index an nccl group uses.")                                    \
  X(NCCL_COMM_SPLIT, INT, "1", NULL, 0, 1, NULL, TDIST__PARAM_LIB,                                \
    "0: nccl subgroups get a communicator of their own instead of ncclCommSplit.")                \
  X(NCCL_CHECK_POINTERS, INT, "1", NULL, 0, 1, NULL, TDIST__PARAM_LIB,                            \
    "0: nccl collectives skip checking that buffers are on the group's device.")                  \
  X(NCCL_SPIN_US, INT, "10000", NULL, 0, TDIST__SPIN_MAX_US, NULL, TDIST__PARAM_LIB,              \
    "Microseconds an nccl wait spins on its CUDA event before it sleeps.")                        \
  X(NCCL_LIBRARY, STR, NULL, "libnccl.so.2 from the loader path, then the CUDA toolkit", 1,       \
    TDIST__PATH_MAX_LEN, NULL, TDIST__PARAM_LIB, "The NCCL library to open, alone.")              \
  X(CUDART_LIBRARY, STR, NULL, "libcudart.so from the loader path, then the CUDA toolkit", 1,     \
    TDIST__PATH_MAX_LEN, NULL, TDIST__PARAM_LIB, "The CUDA runtime library to open, alone.")      \
  X(MPI_PLUGIN, STR, NULL,                                                                         \
    "libtdist-mpi.so beside libtdist, then in the program's Bazel tree, then the loader path", 1, \
    TDIST__PATH_MAX_LEN, NULL, TDIST__PARAM_LIB, "The MPI plugin (backend mpi) to open, alone.")  \
  X(MPI_SPIN_US, INT, "50", NULL, 0, TDIST__SPIN_MAX_US, NULL, TDIST__PARAM_LIB,                  \
    "Microseconds an mpi wait polls its requests before it sleeps.")
/* clang-format on */

typedef enum {
#define TDIST__PARAM_ENUM_ROW(id, ...) TDIST__P_##id,
  TDIST__PARAMS(TDIST__PARAM_ENUM_ROW)
#undef TDIST__PARAM_ENUM_ROW
      TDIST__P_COUNT_
} tdist__param_id_t;

typedef envparam_def_t tdist__param_def_t; /* scope: TDIST__PARAM_LIB */

extern const tdist__param_def_t tdist__params[TDIST__P_COUNT_];

typedef envparam_value_t tdist__param_value_t;

/* Parses text as parameter id would be: 0 and *out set, or -1 and a message naming the variable,
 * the value and what is allowed in err. Pure; the getters below use it. */
int tdist__param_parse(tdist__param_id_t id, const char *text, tdist__param_value_t *out, char *err,
                       size_t cap);

/* The variable's value, read from the environment once. When it is unset, empty or bad, the
 * default (0 or NULL where there is none). */
long long tdist__param_int(tdist__param_id_t id); /* INT and ENUM */
double tdist__param_double(tdist__param_id_t id);
const char *tdist__param_str(tdist__param_id_t id);
/* 1 when the variable is set to a valid value. */
int tdist__param_is_set(tdist__param_id_t id);
/* NULL, or the message for a bad value ("TDIST_SHM='2' is not an integer in 0..1"). */
const char *tdist__param_error(tdist__param_id_t id);
/* The first error among ids[0..n), or among every variable of scope when ids is NULL; NULL when
 * all are good. */
const char *tdist__param_first_error(const tdist__param_id_t *ids, size_t n, unsigned scope);

#endif
