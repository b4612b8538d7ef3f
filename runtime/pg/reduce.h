/* Dtype tables and reduction kernels for CPU collectives.
 *
 * Kernels are plain loops over restrict pointers that the compiler vectorises at -O2/-O3 (checked
 * in the generated code). f16 and bf16 are reduced in float32 and rounded back to nearest-even,
 * exactly as PyTorch converts them (c10::Half / c10::BFloat16). Nothing here allocates. */
#ifndef TDIST_PG_REDUCE_H
#define TDIST_PG_REDUCE_H

#include <stddef.h>
#include <stdint.h>

#include "tdist/pg.h"

/* 1 if `op` is defined for `dtype` (bitwise ops need an integer dtype). */
int tdist__op_valid(tdist_dtype_t dtype, tdist_reduce_op_t op);

/* dst[i] = dst[i] OP src[i] for i < count. AVG accumulates like SUM (finish with
 * tdist__reduce_finish_avg). dst and src must not overlap. */
void tdist__reduce(void *dst, const void *src, size_t count, tdist_dtype_t dtype,
                   tdist_reduce_op_t op);

/* dst[i] = a[i] OP b[i] (dst may equal a, not b unless also a). */
void tdist__reduce3(void *dst, const void *a, const void *b, size_t count, tdist_dtype_t dtype,
                    tdist_reduce_op_t op);

/* For AVG: buf[i] /= n (floats: true division, rounding f16/bf16 as PyTorch does; integers:
 * truncation toward zero). */
void tdist__reduce_finish_avg(void *buf, size_t count, tdist_dtype_t dtype, int n);

/* IEEE half and bfloat16 <-> float, round to nearest even, NaN preserved (PyTorch's rules). */
float tdist__f16_to_f32(uint16_t h);
uint16_t tdist__f32_to_f16(float f);
float tdist__bf16_to_f32(uint16_t b);
uint16_t tdist__f32_to_bf16(float f);

/* Which kernel set runs: "avx2" (x86-64 with AVX2 and F16C) or "generic". Chosen once, at first
 * use; TDIST_REDUCE_KERNELS=generic in the environment forces "generic". Results are the same
 * either way (NaN payloads aside); tests use this to cover both sets. */
const char *tdist__reduce_kernels(void);

#endif
