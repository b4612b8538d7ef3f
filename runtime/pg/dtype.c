/* Public dtype and reduce-op tables: element sizes and printable names. Names follow PyTorch
 * (torch.float16 -> "float16", ReduceOp.PRODUCT -> "PRODUCT") so messages read the same in both
 * worlds. Pure lookups: never allocate, never fail; an unknown value gives size 0 / "unknown". */
#include <stddef.h>

#include "tdist/pg.h"

static const size_t k_dtype_sizes[TDIST_DTYPE_COUNT_] = {
    [TDIST_FLOAT16] = 2, [TDIST_BFLOAT16] = 2, [TDIST_FLOAT32] = 4, [TDIST_FLOAT64] = 8,
    [TDIST_INT8] = 1,    [TDIST_UINT8] = 1,    [TDIST_INT32] = 4,   [TDIST_INT64] = 8,
};

static const char *const k_dtype_names[TDIST_DTYPE_COUNT_] = {
    [TDIST_FLOAT16] = "float16", [TDIST_BFLOAT16] = "bfloat16", [TDIST_FLOAT32] = "float32",
    [TDIST_FLOAT64] = "float64", [TDIST_INT8] = "int8",         [TDIST_UINT8] = "uint8",
    [TDIST_INT32] = "int32",     [TDIST_INT64] = "int64",
};

static const char *const k_op_names[TDIST_REDUCE_OP_COUNT_] = {
    [TDIST_SUM] = "SUM", [TDIST_PROD] = "PRODUCT", [TDIST_MIN] = "MIN", [TDIST_MAX] = "MAX",
    [TDIST_AVG] = "AVG", [TDIST_BAND] = "BAND",    [TDIST_BOR] = "BOR", [TDIST_BXOR] = "BXOR",
};

/* Enums may hold any int (a caller's cast): compare as unsigned so negatives are rejected too. */
TDIST_EXTERN size_t tdist_dtype_size(tdist_dtype_t dtype) {
  return (unsigned)dtype < TDIST_DTYPE_COUNT_ ? k_dtype_sizes[dtype] : 0;
}

TDIST_EXTERN const char *tdist_dtype_name(tdist_dtype_t dtype) {
  return (unsigned)dtype < TDIST_DTYPE_COUNT_ ? k_dtype_names[dtype] : "unknown";
}

TDIST_EXTERN const char *tdist_reduce_op_name(tdist_reduce_op_t op) {
  return (unsigned)op < TDIST_REDUCE_OP_COUNT_ ? k_op_names[op] : "unknown";
}
