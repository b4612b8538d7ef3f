/* Writing test data of a floating-point dtype: one element stored through the library's own
 * float16/bfloat16 converters (runtime/pg/reduce.h; tests/pg/reduce_test.c checks those against
 * independent references). Header-only; link //runtime/pg:kernels. */
#ifndef TDIST_TESTLIB_DTYPE_H
#define TDIST_TESTLIB_DTYPE_H

#include <stdint.h>
#include <string.h>

#include "runtime/pg/reduce.h"
#include "tdist/tdist.h"

/* Stores v as element i of b, a buffer of float dtype t: float16/bfloat16 rounded from (float)v,
 * float32 as (float)v, float64 as v. 0, or -1 for a dtype that is not floating point. */
static inline int test_put_float(void *b, tdist_dtype_t t, size_t i, double v) {
  uint8_t *p = b;
  float f = (float)v;
  uint16_t h;
  switch (t) {
    case TDIST_FLOAT16: h = tdist__f32_to_f16(f); break;
    case TDIST_BFLOAT16: h = tdist__f32_to_bf16(f); break;
    case TDIST_FLOAT32: memcpy(p + 4 * i, &f, 4); return 0;
    case TDIST_FLOAT64: memcpy(p + 8 * i, &v, 8); return 0;
    default: return -1;
  }
  memcpy(p + 2 * i, &h, 2);
  return 0;
}

#endif
