/* Tests of the dtype tables (runtime/pg/dtype.c) and the reduction kernels (runtime/pg/reduce.c).
 *
 * Every result is checked against a reference written independently of the kernels: integers in
 * 128-bit arithmetic truncated by hand, floats in double arithmetic, and f16/bf16 decoded with
 * ldexp and rounded with rint() on a scaled significand (never with the kernels' bit tricks).
 * Known conversions come from PyTorch 1.13 (`torch.tensor([x]).to(torch.float16)`), and on CPUs
 * with F16C the hardware converter is a third opinion. Sweeps cover every valid dtype x op,
 * counts 0, 1, odd, around vector widths and scratch chunks, and 1,000,003, misaligned buffers,
 * guard elements, every aliasing form the header allows, and AVG over world sizes.
 *
 * Data is random; the seed is printed, and TDIST_TEST_SEED=N reproduces a run. The kernel set
 * (avx2 or generic) is chosen by the library; the reduce_generic_test target forces generic. */
#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "rng.h"
#include "runtime/pg/reduce.h"
#include "tdist/pg.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define HAVE_X86 1
#include <cpuid.h>
#include <immintrin.h>
#else
#define HAVE_X86 0
#endif

/* ---- independent references for the 16-bit formats ---- */

static uint32_t bits_of_float(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

static float float_of_bits(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static uint64_t bits_of_double(double d) {
  uint64_t u;
  memcpy(&u, &d, 8);
  return u;
}

/* IEEE binary16 by its definition: (-1)^s * 2^(e-15) * 1.m, subnormals 2^-14 * 0.m. */
static double ref_f16_value(uint16_t h) {
  const int sign = h >> 15, e = (h >> 10) & 31, m = h & 1023;
  double v;
  if (e == 31)
    v = m ? NAN : INFINITY;
  else if (e == 0)
    v = ldexp(m, -24);
  else
    v = ldexp(1024 + m, e - 25);
  return sign ? -v : v;
}

/* bfloat16: the top half of a binary32: 2^(e-127) * 1.m (7 bits), subnormals 2^-126 * 0.m. */
static double ref_bf16_value(uint16_t b) {
  const int sign = b >> 15, e = (b >> 7) & 255, m = b & 127;
  double v;
  if (e == 255)
    v = m ? NAN : INFINITY;
  else if (e == 0)
    v = ldexp(m, -133);
  else
    v = ldexp(128 + m, e - 134);
  return sign ? -v : v;
}

/* Rounds x to a format with `mbits` stored mantissa bits, exponent bias `bias` and all-ones
 * exponent `emax_field`, to nearest with ties to even (rint in the default rounding mode), and
 * returns the encoding without sign. Overflow gives inf. */
static uint32_t ref_round_magnitude(double a, int mbits, int bias, int emax_field) {
  const int emin = 1 - bias; /* exponent of the smallest normal */
  if (isinf(a)) return (uint32_t)emax_field << mbits;
  if (a < ldexp(1.0, emin)) {
    /* Subnormal range: multiples of 2^(emin - mbits); 2^mbits of them is the smallest normal,
     * whose encoding is the same integer. */
    return (uint32_t)rint(ldexp(a, mbits - emin));
  }
  int e = ilogb(a);
  double q = rint(ldexp(a, mbits - e)); /* in [2^mbits, 2^(mbits+1)] */
  if (q == ldexp(1.0, mbits + 1)) {
    q = ldexp(1.0, mbits);
    e++;
  }
  if (e + bias >= emax_field) return (uint32_t)emax_field << mbits;
  return ((uint32_t)(e + bias) << mbits) | (uint32_t)(q - ldexp(1.0, mbits));
}

/* c10::Half(float): NaN -> sign | 0x7E00. */
static uint16_t ref_f16_from_float(float f) {
  const uint16_t sign = signbit(f) ? 0x8000 : 0;
  if (isnan(f)) return sign | 0x7E00;
  return (uint16_t)(sign | ref_round_magnitude(fabs((double)f), 10, 15, 31));
}

/* c10::BFloat16(float): NaN -> 0x7FC0 whatever its sign. */
static uint16_t ref_bf16_from_float(float f) {
  if (isnan(f)) return 0x7FC0;
  const uint16_t sign = signbit(f) ? 0x8000 : 0;
  return (uint16_t)(sign | ref_round_magnitude(fabs((double)f), 7, 127, 255));
}

/* ---- the F16C instructions as a third opinion (x86 only, when present) ---- */

#if HAVE_X86
static int have_f16c(void) {
  unsigned a, b, c, d;
  return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
}

__attribute__((target("f16c"))) static uint16_t hw_f32_to_f16(float f) {
  return (uint16_t)_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
}

__attribute__((target("f16c"))) static float hw_f16_to_f32(uint16_t h) { return _cvtsh_ss(h); }
#endif

/* ---- dtype tables ---- */

static const tdist_dtype_t k_dtypes[] = {TDIST_FLOAT16, TDIST_BFLOAT16, TDIST_FLOAT32,
                                         TDIST_FLOAT64, TDIST_INT8,     TDIST_UINT8,
                                         TDIST_INT32,   TDIST_INT64};
static const tdist_reduce_op_t k_ops[] = {TDIST_SUM, TDIST_PROD, TDIST_MIN, TDIST_MAX,
                                          TDIST_AVG, TDIST_BAND, TDIST_BOR, TDIST_BXOR};
#define N_DTYPES (sizeof k_dtypes / sizeof k_dtypes[0])
#define N_OPS (sizeof k_ops / sizeof k_ops[0])

static int is_float(tdist_dtype_t dt) { return dt <= TDIST_FLOAT64; }

static void test_tables(void) {
  static const struct {
    tdist_dtype_t dt;
    size_t size;
    const char *name;
  } k_expect[] = {
      {TDIST_FLOAT16, 2, "float16"}, {TDIST_BFLOAT16, 2, "bfloat16"}, {TDIST_FLOAT32, 4, "float32"},
      {TDIST_FLOAT64, 8, "float64"}, {TDIST_INT8, 1, "int8"},         {TDIST_UINT8, 1, "uint8"},
      {TDIST_INT32, 4, "int32"},     {TDIST_INT64, 8, "int64"},
  };
  for (size_t i = 0; i < sizeof k_expect / sizeof k_expect[0]; i++) {
    CHECK_EQ_INT(tdist_dtype_size(k_expect[i].dt), k_expect[i].size);
    CHECK(strcmp(tdist_dtype_name(k_expect[i].dt), k_expect[i].name) == 0);
  }
  const char *op_names[] = {"SUM", "PRODUCT", "MIN", "MAX", "AVG", "BAND", "BOR", "BXOR"};
  for (size_t i = 0; i < N_OPS; i++)
    CHECK(strcmp(tdist_reduce_op_name(k_ops[i]), op_names[i]) == 0);

  const int bad[] = {-1, -100, TDIST_DTYPE_COUNT_, 8, 1000, INT32_MAX, INT32_MIN};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    CHECK_EQ_INT(tdist_dtype_size((tdist_dtype_t)bad[i]), 0);
    CHECK(strcmp(tdist_dtype_name((tdist_dtype_t)bad[i]), "unknown") == 0);
    CHECK(strcmp(tdist_reduce_op_name((tdist_reduce_op_t)bad[i]), "unknown") == 0);
    for (size_t j = 0; j < N_OPS; j++)
      CHECK_EQ_INT(tdist__op_valid((tdist_dtype_t)bad[i], k_ops[j]), 0);
    for (size_t j = 0; j < N_DTYPES; j++)
      CHECK_EQ_INT(tdist__op_valid(k_dtypes[j], (tdist_reduce_op_t)bad[i]), 0);
  }

  /* Truth table: rows = dtypes in enum order, columns = SUM PROD MIN MAX AVG BAND BOR BXOR. */
  static const char *const k_valid[N_DTYPES] = {
      "11111000", "11111000", "11111000", "11111000",
      "11111111", "11111111", "11111111", "11111111",
  };
  for (size_t d = 0; d < N_DTYPES; d++)
    for (size_t o = 0; o < N_OPS; o++)
      CHECK_EQ_INT(tdist__op_valid(k_dtypes[d], k_ops[o]), k_valid[d][o] == '1');
  TEST_LOG("tables: ok");
}

/* ---- conversions ---- */

/* (float bits, half bits, bfloat16 bits), as PyTorch 1.13 converts them (CPU). For NaN inputs
 * the bf16 column is c10::BFloat16's scalar rule (0x7FC0); torch's vectorised CPU path writes
 * 0xFFFF instead, also a NaN. */
static const struct {
  uint32_t f;
  uint16_t h, b;
} k_known[] = {
    {0x3f800000, 0x3c00, 0x3f80}, /* 1.0 */
    {0xc0000000, 0xc000, 0xc000}, /* -2.0 */
    {0x477fe000, 0x7bff, 0x4780}, /* 65504, the largest half */
    {0x477feffd, 0x7bff, 0x4780}, /* 65519.99: still rounds down */
    {0x477ff000, 0x7c00, 0x4780}, /* 65520: tie between 65504 and 2^16 -> even -> inf */
    {0x47800000, 0x7c00, 0x4780}, /* 65536 */
    {0x33800000, 0x0001, 0x3380}, /* 2^-24, the smallest subnormal half */
    {0x33000000, 0x0000, 0x3300}, /* 2^-25: tie between 0 and 2^-24 -> even (0) */
    {0x33c00000, 0x0002, 0x33c0}, /* 3 * 2^-25: tie between 1 and 2 ulps -> even (2) */
    {0x33000001, 0x0001, 0x3300}, /* just above 2^-25 -> 2^-24 */
    {0x38800000, 0x0400, 0x3880}, /* 2^-14, the smallest normal half */
    {0x387fc000, 0x03ff, 0x3880}, /* the largest subnormal half */
    {0x3f801000, 0x3c00, 0x3f80}, /* 1 + 2^-11: tie -> even (1.0) */
    {0x3f803000, 0x3c02, 0x3f80}, /* 1 + 3 * 2^-11: tie -> even (1 + 2^-9) */
    {0x3eaaaaab, 0x3555, 0x3eab}, /* 1/3 */
    {0x80000000, 0x8000, 0x8000}, /* -0 */
    {0x7f800000, 0x7c00, 0x7f80}, /* inf */
    {0xff800000, 0xfc00, 0xff80}, /* -inf */
    {0x7fc00000, 0x7e00, 0x7fc0}, /* NaN */
    {0xffc00000, 0xfe00, 0x7fc0}, /* -NaN */
    {0x7f800001, 0x7e00, 0x7fc0}, /* signalling NaN */
    {0x2edbe6ff, 0x0000, 0x2edc}, /* 1e-10 */
    {0xaedbe6ff, 0x8000, 0xaedc}, /* -1e-10 */
    {0x7f7fffff, 0x7c00, 0x7f80}, /* FLT_MAX: bf16 rounds up to inf */
    {0x3f808000, 0x3c04, 0x3f80}, /* 1 + 2^-8: bf16 tie -> even (1.0) */
    {0x3f818000, 0x3c0c, 0x3f82}, /* 1 + 3 * 2^-8: bf16 tie -> even */
    {0x3f800001, 0x3c00, 0x3f80}, /* 1 + 2^-23 */
    {0x00000001, 0x0000, 0x0000}, /* the smallest float subnormal */
    {0x00010000, 0x0000, 0x0001}, /* the smallest bf16 subnormal */
};

static void check_f16_conv(float f) {
  const uint16_t got = tdist__f32_to_f16(f), want = ref_f16_from_float(f);
  if (got != want) {
    fprintf(stderr, "f32->f16(%a = 0x%08" PRIx32 "): got 0x%04x, want 0x%04x\n", (double)f,
            bits_of_float(f), got, want);
    exit(1);
  }
}

static void check_bf16_conv(float f) {
  const uint16_t got = tdist__f32_to_bf16(f), want = ref_bf16_from_float(f);
  if (got != want) {
    fprintf(stderr, "f32->bf16(%a = 0x%08" PRIx32 "): got 0x%04x, want 0x%04x\n", (double)f,
            bits_of_float(f), got, want);
    exit(1);
  }
}

static void test_conversions(void) {
  for (size_t i = 0; i < sizeof k_known / sizeof k_known[0]; i++) {
    const float f = float_of_bits(k_known[i].f);
    CHECK_EQ_INT(tdist__f32_to_f16(f), k_known[i].h);
    CHECK_EQ_INT(tdist__f32_to_bf16(f), k_known[i].b);
    CHECK_EQ_INT(ref_f16_from_float(f), k_known[i].h); /* the reference agrees with torch too */
    CHECK_EQ_INT(ref_bf16_from_float(f), k_known[i].b);
  }
  CHECK(tdist__f16_to_f32(0x3c00) == 1.0f);
  CHECK(tdist__f16_to_f32(0x7bff) == 65504.0f);
  CHECK(tdist__f16_to_f32(0x0001) == ldexpf(1.0f, -24));
  CHECK(tdist__f16_to_f32(0x7c00) == INFINITY && tdist__f16_to_f32(0xfc00) == -INFINITY);
  CHECK(tdist__bf16_to_f32(0x3f80) == 1.0f);

  /* Every half and bfloat16: decode against the definition, and round-trip. A half NaN widens
   * to the quiet float NaN with the same sign and payload (c10::Half), and comes back as
   * sign|0x7E00; a bf16 NaN widens bit for bit and comes back as 0x7FC0. */
  for (uint32_t i = 0; i < 65536; i++) {
    const uint16_t h = (uint16_t)i;
    const float f = tdist__f16_to_f32(h);
    const double want = ref_f16_value(h);
    if (isnan(want)) {
      CHECK_EQ_INT(bits_of_float(f),
                   ((uint32_t)(h & 0x8000) << 16) | 0x7FC00000u | ((uint32_t)(h & 0x3FF) << 13));
      CHECK_EQ_INT(tdist__f32_to_f16(f), (h & 0x8000) | 0x7E00);
    } else {
      CHECK(bits_of_double((double)f) == bits_of_double(want)); /* also the sign of zero */
      CHECK_EQ_INT(tdist__f32_to_f16(f), h);
    }
    const float g = tdist__bf16_to_f32(h);
    const double wantb = ref_bf16_value(h);
    CHECK_EQ_INT(bits_of_float(g), (uint32_t)h << 16);
    if (isnan(wantb)) {
      CHECK(isnan(g));
      CHECK_EQ_INT(tdist__f32_to_bf16(g), 0x7FC0);
    } else {
      CHECK(bits_of_double((double)g) == bits_of_double(wantb));
      CHECK_EQ_INT(tdist__f32_to_bf16(g), h);
    }
  }

  /* Rounding: every midpoint between neighbouring finite values (the ties), the floats on
   * either side of it, and the values themselves. Halves: midpoints have 12 significant bits,
   * exact in float. bf16: midpoints have 9 (also exact); beyond FLT_MAX there is no float. */
  for (uint32_t i = 0; i < 65536; i++) {
    const uint16_t h = (uint16_t)i;
    if ((h & 0x7FFF) < 0x7C00) {
      const double lo = ref_f16_value(h);
      const double hi = ref_f16_value((h & 0x7FFF) == 0x7BFF ? (h & 0x8000) | 0x7C00 : h + 1);
      const float mid = isinf(hi) ? (float)copysign(65520.0, lo) : (float)((lo + hi) / 2);
      check_f16_conv(mid);
      check_f16_conv(nextafterf(mid, INFINITY));
      check_f16_conv(nextafterf(mid, -INFINITY));
      check_f16_conv((float)lo);
    }
    if ((h & 0x7FFF) < 0x7F7F) {
      const double lo = ref_bf16_value(h), hi = ref_bf16_value(h + 1);
      const float mid = (float)((lo + hi) / 2);
      CHECK((double)mid == (lo + hi) / 2);
      check_bf16_conv(mid);
      check_bf16_conv(nextafterf(mid, INFINITY));
      check_bf16_conv(nextafterf(mid, -INFINITY));
      check_bf16_conv((float)lo);
    }
  }
  /* Between the largest finite bf16 (255 * 2^120) and 2^128 lie floats up to FLT_MAX: from
   * the midpoint on they round to inf. */
  const float bf16_top_mid = ldexpf(255.5f, 120);
  check_bf16_conv(bf16_top_mid);
  check_bf16_conv(nextafterf(bf16_top_mid, 0.0f));
  check_bf16_conv(nextafterf(bf16_top_mid, INFINITY));
  CHECK_EQ_INT(tdist__f32_to_bf16(bf16_top_mid), 0x7F80);
  CHECK_EQ_INT(tdist__f32_to_bf16(nextafterf(bf16_top_mid, 0.0f)), 0x7F7F);

  /* Random floats: any bit pattern, and values spread over the half's range. */
  for (int i = 0; i < (1 << 20); i++) {
    const float any = float_of_bits((uint32_t)rnd());
    const float near =
        (rnd() & 1 ? -1.0f : 1.0f) *
        ldexpf(1.0f + (float)rnd_below(1u << 23) / (float)(1u << 23), (int)rnd_below(46) - 28);
    check_f16_conv(any);
    check_f16_conv(near);
    check_bf16_conv(any);
    check_bf16_conv(near);
  }

#if HAVE_X86
  if (have_f16c()) {
    for (uint32_t i = 0; i < 65536; i++) {
      const float hw = hw_f16_to_f32((uint16_t)i), sw = tdist__f16_to_f32((uint16_t)i);
      CHECK(isnan(hw) ? isnan(sw) : bits_of_float(hw) == bits_of_float(sw));
    }
    for (int i = 0; i < (1 << 20); i++) {
      const float f = float_of_bits((uint32_t)rnd());
      const uint16_t hw = hw_f32_to_f16(f), sw = tdist__f32_to_f16(f);
      if (isnan(f))
        CHECK((hw & 0x7C00) == 0x7C00 && (hw & 0x3FF) && (sw & 0x7FFF) == 0x7E00);
      else
        CHECK_EQ_INT(sw, hw);
    }
    TEST_LOG("conversions: F16C hardware agrees");
  }
#endif
  TEST_LOG("conversions: ok");
}

/* ---- the reference reduction, one element at a time ---- */

/* An element, loaded from raw bytes. */
typedef struct {
  double f;     /* float dtypes: the exact value */
  __int128 i;   /* integer dtypes: the exact value */
  int nan_sign; /* float NaN: 1 + sign bit, else 0 */
} ref_val_t;

static ref_val_t ref_load(tdist_dtype_t dt, const unsigned char *p) {
  ref_val_t v = {0, 0, 0};
  switch (dt) {
    case TDIST_FLOAT16: {
      uint16_t h;
      memcpy(&h, p, 2);
      v.f = ref_f16_value(h);
      if (isnan(v.f)) v.nan_sign = 1 + (h >> 15);
      break;
    }
    case TDIST_BFLOAT16: {
      uint16_t b;
      memcpy(&b, p, 2);
      v.f = ref_bf16_value(b);
      if (isnan(v.f)) v.nan_sign = 1 + (b >> 15);
      break;
    }
    case TDIST_FLOAT32: {
      float f;
      memcpy(&f, p, 4);
      v.f = f;
      if (isnan(f)) v.nan_sign = 1 + (signbit(f) != 0);
      break;
    }
    case TDIST_FLOAT64:
      memcpy(&v.f, p, 8);
      if (isnan(v.f)) v.nan_sign = 1 + (signbit(v.f) != 0);
      break;
    case TDIST_INT8: v.i = (int8_t)p[0]; break;
    case TDIST_UINT8: v.i = p[0]; break;
    case TDIST_INT32: {
      int32_t x;
      memcpy(&x, p, 4);
      v.i = x;
      break;
    }
    case TDIST_INT64: {
      int64_t x;
      memcpy(&x, p, 8);
      v.i = x;
      break;
    }
    default: abort();
  }
  return v;
}

/* Integers: the low bits of the exact result, i.e. two's complement wrap-around. */
static void ref_store_int(tdist_dtype_t dt, __int128 v, unsigned char *out) {
  const uint64_t low = (uint64_t)(unsigned __int128)v;
  for (size_t k = 0; k < tdist_dtype_size(dt); k++) out[k] = (unsigned char)(low >> (8 * k));
}

/* What the kernel must produce for a float result r computed exactly (or in double for f64).
 * f32 and 16-bit types: c10 computes in float, so round to float first, then to 16 bits. */
static void ref_store_float(tdist_dtype_t dt, double r, unsigned char *out) {
  switch (dt) {
    case TDIST_FLOAT16: {
      const uint16_t h = ref_f16_from_float((float)r);
      memcpy(out, &h, 2);
      break;
    }
    case TDIST_BFLOAT16: {
      const uint16_t b = ref_bf16_from_float((float)r);
      memcpy(out, &b, 2);
      break;
    }
    case TDIST_FLOAT32: {
      const float f = (float)r;
      memcpy(out, &f, 4);
      break;
    }
    case TDIST_FLOAT64: memcpy(out, &r, 8); break;
    default: abort();
  }
}

/* out = a OP b. AVG is SUM here (the division is ref_avg). Returns what kind of NaN the result
 * must be: 0 none, otherwise a description checked by elem_matches. */
typedef enum { NAN_NONE, NAN_ANY, NAN_FROM_A, NAN_FROM_B } nan_rule_t;

static nan_rule_t ref_op(tdist_dtype_t dt, tdist_reduce_op_t op, const unsigned char *a,
                         const unsigned char *b, unsigned char *out) {
  const ref_val_t x = ref_load(dt, a), y = ref_load(dt, b);
  if (!is_float(dt)) {
    __int128 r;
    switch (op) {
      case TDIST_SUM:
      case TDIST_AVG: r = x.i + y.i; break;
      case TDIST_PROD: r = x.i * y.i; break;
      case TDIST_MIN: r = x.i <= y.i ? x.i : y.i; break;
      case TDIST_MAX: r = x.i >= y.i ? x.i : y.i; break;
      case TDIST_BAND: r = x.i & y.i; break;
      case TDIST_BOR: r = x.i | y.i; break;
      case TDIST_BXOR: r = x.i ^ y.i; break;
      default: abort();
    }
    ref_store_int(dt, r, out);
    return NAN_NONE;
  }
  if (op == TDIST_MIN || op == TDIST_MAX) {
    /* torch.minimum/maximum: NaN wins; tdist returns the NaN operand, a's first. On equal
     * values (-0 == +0) the first operand is kept. */
    if (x.nan_sign) return NAN_FROM_A;
    if (y.nan_sign) return NAN_FROM_B;
    double r;
    if (x.f == y.f)
      r = x.f;
    else
      r = op == TDIST_MIN ? fmin(x.f, y.f) : fmax(x.f, y.f);
    ref_store_float(dt, r, out);
    return NAN_NONE;
  }
  const double r = (op == TDIST_PROD) ? x.f * y.f : x.f + y.f;
  if (isnan(r)) return NAN_ANY;
  ref_store_float(dt, r, out);
  return NAN_NONE;
}

/* buf = buf / n, after SUM. Floats: true division (double rounding through double is exact
 * enough: 53 >= 2 * 24 + 2). Integers: |v| / n with the sign put back (toward zero). */
static nan_rule_t ref_avg(tdist_dtype_t dt, const unsigned char *sum, int n, unsigned char *out) {
  const ref_val_t v = ref_load(dt, sum);
  if (!is_float(dt)) {
    const __int128 mag = v.i < 0 ? -v.i : v.i;
    const __int128 q = mag / n;
    ref_store_int(dt, v.i < 0 ? -q : q, out);
    return NAN_NONE;
  }
  if (v.nan_sign) return NAN_ANY;
  ref_store_float(dt, v.f / n, out);
  return NAN_NONE;
}

/* Exact match, except NaN results, where the rule says which NaN is acceptable. */
static int elem_matches(tdist_dtype_t dt, const unsigned char *got, const unsigned char *want,
                        nan_rule_t rule, const unsigned char *a, const unsigned char *b) {
  const size_t es = tdist_dtype_size(dt);
  if (rule == NAN_NONE) return memcmp(got, want, es) == 0;
  const ref_val_t g = ref_load(dt, got);
  if (!g.nan_sign) return 0;
  const unsigned char *src = rule == NAN_FROM_A ? a : b;
  switch (dt) {
    case TDIST_FLOAT16: {
      uint16_t h;
      memcpy(&h, got, 2);
      if ((h & 0x7FFF) != 0x7E00) return 0; /* c10::Half's canonical NaN */
      if (rule == NAN_ANY) return 1;
      return g.nan_sign == ref_load(dt, src).nan_sign; /* sign of the NaN operand */
    }
    case TDIST_BFLOAT16: {
      uint16_t x;
      memcpy(&x, got, 2);
      return x == 0x7FC0;
    }
    default: /* f32/f64: MIN/MAX return the NaN operand bit for bit */
      return rule == NAN_ANY || memcmp(got, src, es) == 0;
  }
}

/* ---- random data ---- */

/* Mostly moderate values (sums and products stay finite and keep significant bits), plus raw bit
 * patterns (NaN, inf, subnormals, huge) and the usual suspects. */
static void fill_random(tdist_dtype_t dt, unsigned char *p, size_t count) {
  const size_t es = tdist_dtype_size(dt);
  for (size_t i = 0; i < count; i++, p += es) {
    const uint64_t r = rnd(), pick = rnd_below(100);
    uint64_t v = r;
    switch (dt) {
      case TDIST_FLOAT16:
        if (pick < 70) v = (r & 0x83FF) | ((8 + rnd_below(15)) << 10);
        break;
      case TDIST_BFLOAT16:
        if (pick < 70) v = (r & 0x807F) | ((117 + rnd_below(21)) << 7);
        break;
      case TDIST_FLOAT32: {
        static const uint32_t special[] = {0,          0x80000000, 0x7f800000, 0xff800000,
                                           0x7fc00000, 0xffc00001, 0x00800000, 0x00000001,
                                           0x7f7fffff, 0x3f800000};
        if (pick < 70)
          v = (r & 0x807FFFFF) | ((100 + rnd_below(55)) << 23);
        else if (pick < 80)
          v = special[rnd_below(sizeof special / sizeof special[0])];
        break;
      }
      case TDIST_FLOAT64: {
        static const uint64_t special[] = {0,
                                           0x8000000000000000ull,
                                           0x7ff0000000000000ull,
                                           0xfff0000000000000ull,
                                           0x7ff8000000000000ull,
                                           0xfff8000000000001ull,
                                           0x0000000000000001ull,
                                           0x7fefffffffffffffull,
                                           0x3ff0000000000000ull};
        if (pick < 70)
          v = (r & 0x800FFFFFFFFFFFFFull) | ((uint64_t)(1000 + rnd_below(47)) << 52);
        else if (pick < 80)
          v = special[rnd_below(sizeof special / sizeof special[0])];
        break;
      }
      default: {
        /* Integers: random bits, with 0, 1, all ones (-1 / UINT8_MAX) and the signed extremes
         * of the dtype's width now and then. */
        const uint64_t top = 1ull << (8 * es - 1);
        const uint64_t special[] = {0, 1, ~0ull, top - 1, top};
        if (pick < 15) v = special[rnd_below(5)];
        break;
      }
    }
    for (size_t k = 0; k < es; k++) p[k] = (unsigned char)(v >> (8 * k));
  }
}

/* ---- sweeps ---- */

enum { GUARD = 64 }; /* bytes of guard pattern on each side of every buffer */

/* Scratch memory shared by all sweep cases (allocating 8 MB buffers per case costs more page
 * faults than the kernels cost time). */
enum { MAX_COUNT = 1000003, MAX_BYTES = MAX_COUNT * 8, SLACK = 2 * GUARD + 64 };
static unsigned char *g_mem[5];

typedef struct {
  unsigned char *mem; /* [guard + misalignment | data | guard] */
  unsigned char *data;
} buf_t;

static buf_t buf_get(int slot, size_t bytes, size_t misalign) {
  buf_t b;
  if (!g_mem[slot]) g_mem[slot] = malloc(MAX_BYTES + SLACK);
  CHECK(g_mem[slot] != NULL && bytes <= MAX_BYTES && misalign <= 64);
  b.mem = g_mem[slot];
  b.data = b.mem + GUARD + misalign;
  memset(b.mem, 0xA5, GUARD + misalign);
  memset(b.data + bytes, 0xA5, GUARD);
  return b;
}

static void buf_check_guards(const buf_t *b, size_t bytes) {
  for (unsigned char *p = b->mem; p < b->data; p++) CHECK(*p == 0xA5);
  for (size_t k = 0; k < GUARD; k++) CHECK(b->data[bytes + k] == 0xA5);
}

static void fail_elem(const char *what, tdist_dtype_t dt, tdist_reduce_op_t op, size_t count,
                      size_t i, const unsigned char *a, const unsigned char *b,
                      const unsigned char *got, const unsigned char *want, nan_rule_t rule) {
  const size_t es = tdist_dtype_size(dt);
  fprintf(stderr, "%s %s %s count=%zu: element %zu: a=", what, tdist_dtype_name(dt),
          tdist_reduce_op_name(op), count, i);
  for (size_t k = es; k-- > 0;) fprintf(stderr, "%02x", a[k]);
  fprintf(stderr, " b=");
  for (size_t k = es; k-- > 0;) fprintf(stderr, "%02x", b[k]);
  fprintf(stderr, " got=");
  for (size_t k = es; k-- > 0;) fprintf(stderr, "%02x", got[k]);
  static const char *const k_rule[] = {"", "any NaN", "a's NaN", "b's NaN"};
  fprintf(stderr, " want=");
  if (rule == NAN_NONE)
    for (size_t k = es; k-- > 0;) fprintf(stderr, "%02x", want[k]);
  else
    fprintf(stderr, "%s", k_rule[rule]);
  fprintf(stderr, " (kernels: %s)\n", tdist__reduce_kernels());
  exit(1);
}

/* got[i] must equal a[i] OP b[i] for every i. */
static void check_result(const char *what, tdist_dtype_t dt, tdist_reduce_op_t op,
                         const unsigned char *a, const unsigned char *b, const unsigned char *got,
                         size_t count) {
  const size_t es = tdist_dtype_size(dt);
  unsigned char want[8];
  for (size_t i = 0; i < count; i++) {
    const size_t o = i * es;
    const nan_rule_t rule = ref_op(dt, op, a + o, b + o, want);
    if (!elem_matches(dt, got + o, want, rule, a + o, b + o))
      fail_elem(what, dt, op, count, i, a + o, b + o, got + o, want, rule);
  }
}

/* One (dtype, op, count) on inputs a0, b0: tdist__reduce, tdist__reduce3 and, for AVG, the
 * final division. */
static void sweep_case(tdist_dtype_t dt, tdist_reduce_op_t op, size_t count, size_t misalign,
                       int with_aliasing, const unsigned char *a0, const unsigned char *b0) {
  const size_t es = tdist_dtype_size(dt), bytes = count * es;
  /* Misaligned by whole elements (vector loops then start mid-line); a and dst differently. */
  buf_t a = buf_get(0, bytes, misalign * es), b = buf_get(1, bytes, 0),
        d = buf_get(2, bytes, (misalign + 1) % 4 * es);
  memcpy(a.data, a0, bytes);
  memcpy(b.data, b0, bytes);

  /* dst OP= src */
  memcpy(d.data, a.data, bytes);
  tdist__reduce(d.data, b.data, count, dt, op);
  check_result("reduce", dt, op, a0, b0, d.data, count);
  buf_check_guards(&d, bytes);
  CHECK(memcmp(b.data, b0, bytes) == 0);
  unsigned char *first = buf_get(3, bytes, 0).data;
  memcpy(first, d.data, bytes);

  if (op == TDIST_AVG) {
    static const int k_n[] = {1, 2, 3, 4, 5, 7, 8, 1000};
    const int n = k_n[rnd_below(sizeof k_n / sizeof k_n[0])];
    unsigned char *sum = buf_get(4, bytes, 0).data;
    memcpy(sum, d.data, bytes);
    tdist__reduce_finish_avg(d.data, count, dt, n);
    unsigned char want[8];
    for (size_t i = 0; i < count; i++) {
      const nan_rule_t rule = ref_avg(dt, sum + i * es, n, want);
      if (!elem_matches(dt, d.data + i * es, want, rule, NULL, NULL))
        fail_elem("finish_avg", dt, op, count, i, sum + i * es, sum + i * es, d.data + i * es, want,
                  rule);
    }
    buf_check_guards(&d, bytes);
    /* n <= 0 is not a world size: nothing happens. */
    memcpy(sum, d.data, bytes);
    tdist__reduce_finish_avg(d.data, count, dt, 0);
    tdist__reduce_finish_avg(d.data, count, dt, -3);
    CHECK(memcmp(sum, d.data, bytes) == 0);
  }

  /* dst = a OP b, dst distinct. The same bytes as tdist__reduce gave are the common, cheap
   * answer (the 1,000,003-element cases dominate the run time); anything else, e.g. another
   * NaN payload, goes through the reference. */
  memset(d.data, 0x5A, bytes);
  tdist__reduce3(d.data, a.data, b.data, count, dt, op);
  if (memcmp(d.data, first, bytes) != 0) check_result("reduce3", dt, op, a0, b0, d.data, count);
  buf_check_guards(&d, bytes);
  CHECK(memcmp(a.data, a0, bytes) == 0 && memcmp(b.data, b0, bytes) == 0);

  if (with_aliasing) {
    /* dst == a */
    memcpy(d.data, a0, bytes);
    tdist__reduce3(d.data, d.data, b.data, count, dt, op);
    check_result("reduce3(dst=a)", dt, op, a0, b0, d.data, count);
    /* dst == b: the operands keep their order (it decides which NaN MIN/MAX return) */
    memcpy(d.data, b0, bytes);
    tdist__reduce3(d.data, a.data, d.data, count, dt, op);
    check_result("reduce3(dst=b)", dt, op, a0, b0, d.data, count);
    /* a == b, dst distinct */
    memset(d.data, 0x5A, bytes);
    tdist__reduce3(d.data, a.data, a.data, count, dt, op);
    check_result("reduce3(a=b)", dt, op, a0, a0, d.data, count);
    /* everything the same buffer */
    memcpy(d.data, a0, bytes);
    tdist__reduce3(d.data, d.data, d.data, count, dt, op);
    check_result("reduce3(dst=a=b)", dt, op, a0, a0, d.data, count);
    memcpy(d.data, a0, bytes);
    tdist__reduce(d.data, d.data, count, dt, op);
    check_result("reduce(dst=src)", dt, op, a0, a0, d.data, count);
    buf_check_guards(&d, bytes);
  }
}

static void test_sweep(void) {
  /* Around SSE/AVX widths (up to 32 one-byte lanes), the 16-element blocks of the 16-bit AVX2
   * kernels, and the 4 KiB scratch chunks of the aliasing path (512..4096 elements). */
  static const size_t k_counts[] = {0,   1,   2,    3,    5,    7,    8,    9,    15,
                                    16,  17,  31,   32,   33,   63,   64,   65,   100,
                                    511, 513, 1023, 1025, 2049, 4095, 4097, 5003, 1000003};
  size_t cases = 0;
  for (size_t d = 0; d < N_DTYPES; d++) {
    const tdist_dtype_t dt = k_dtypes[d];
    for (size_t c = 0; c < sizeof k_counts / sizeof k_counts[0]; c++) {
      /* One random input pair per (dtype, count), shared by the ops. */
      const size_t count = k_counts[c], bytes = count * tdist_dtype_size(dt);
      const int large = count > 100000;
      unsigned char *a0 = malloc(bytes + 1), *b0 = malloc(bytes + 1);
      CHECK(a0 && b0);
      fill_random(dt, a0, count);
      fill_random(dt, b0, count);
      for (size_t o = 0; o < N_OPS; o++) {
        if (!tdist__op_valid(dt, k_ops[o])) continue;
        sweep_case(dt, k_ops[o], count, large ? 0 : rnd_below(4), !large, a0, b0);
        cases++;
      }
      free(a0);
      free(b0);
    }
  }
  for (size_t i = 0; i < sizeof g_mem / sizeof g_mem[0]; i++) {
    free(g_mem[i]);
    g_mem[i] = NULL;
  }
  TEST_LOG("sweep: %zu (dtype, op, count) cases ok", cases);
}

/* Every pair of special values (signed zeros, infinities, NaNs of both signs, signalling NaN,
 * subnormals, extremes), laid out so that the vector loops see them too. Ties such as MIN(+0, -0)
 * and NaN-vs-NaN are where kernels most easily disagree with the reference. */
static void test_special_pairs(void) {
  static const uint64_t k_f16[] = {0x0000, 0x8000, 0x3C00, 0xBC00, 0x7C00, 0xFC00, 0x7E00, 0xFE00,
                                   0x7C01, 0x0001, 0x8001, 0x03FF, 0x0400, 0x7BFF, 0xFBFF, 0x3C01};
  static const uint64_t k_bf16[] = {0x0000, 0x8000, 0x3F80, 0xBF80, 0x7F80, 0xFF80, 0x7FC0, 0xFFC0,
                                    0x7F81, 0x0001, 0x8001, 0x007F, 0x0080, 0x7F7F, 0xFF7F, 0x3F81};
  static const uint64_t k_f32[] = {0x00000000, 0x80000000, 0x3F800000, 0xBF800000,
                                   0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00000,
                                   0x7F800001, 0x7FC12345, 0x00000001, 0x80000001,
                                   0x00800000, 0x7F7FFFFF, 0xFF7FFFFF, 0x3F800001};
  static const uint64_t k_f64[] = {0,
                                   0x8000000000000000ull,
                                   0x3FF0000000000000ull,
                                   0xBFF0000000000000ull,
                                   0x7FF0000000000000ull,
                                   0xFFF0000000000000ull,
                                   0x7FF8000000000000ull,
                                   0xFFF8000000000000ull,
                                   0x7FF0000000000001ull,
                                   0x7FF8000000012345ull,
                                   1,
                                   0x8000000000000001ull,
                                   0x0010000000000000ull,
                                   0x7FEFFFFFFFFFFFFFull,
                                   0xFFEFFFFFFFFFFFFFull,
                                   0x3FF0000000000001ull};
  for (size_t d = 0; d < N_DTYPES; d++) {
    const tdist_dtype_t dt = k_dtypes[d];
    const size_t es = tdist_dtype_size(dt);
    uint64_t ints[16];
    const uint64_t *vals = dt == TDIST_FLOAT16    ? k_f16
                           : dt == TDIST_BFLOAT16 ? k_bf16
                           : dt == TDIST_FLOAT32  ? k_f32
                           : dt == TDIST_FLOAT64  ? k_f64
                                                  : ints;
    if (!is_float(dt)) {
      const uint64_t top = 1ull << (8 * es - 1);
      const uint64_t v[16] = {0,
                              1,
                              ~0ull,
                              top,
                              top - 1,
                              top + 1,
                              2,
                              ~1ull,
                              0x5555555555555555ull,
                              0xAAAAAAAAAAAAAAAAull,
                              3,
                              0x7F,
                              0x80,
                              0xFF,
                              0x100,
                              0xFFFF};
      memcpy(ints, v, sizeof v);
    }
    const size_t n = 16 * 16, bytes = n * es;
    unsigned char *a = malloc(bytes), *b = malloc(bytes), *out = malloc(bytes);
    CHECK(a && b && out);
    for (size_t i = 0; i < n; i++)
      for (size_t k = 0; k < es; k++) {
        a[i * es + k] = (unsigned char)(vals[i / 16] >> (8 * k));
        b[i * es + k] = (unsigned char)(vals[i % 16] >> (8 * k));
      }
    for (size_t o = 0; o < N_OPS; o++) {
      const tdist_reduce_op_t op = k_ops[o];
      if (!tdist__op_valid(dt, op)) continue;
      memcpy(out, a, bytes);
      tdist__reduce(out, b, n, dt, op);
      check_result("special pairs: reduce", dt, op, a, b, out, n);
      tdist__reduce3(out, a, b, n, dt, op);
      check_result("special pairs: reduce3", dt, op, a, b, out, n);
    }
    free(a);
    free(b);
    free(out);
  }
  TEST_LOG("special value pairs: ok");
}

/* Invalid combinations and unknown enums must leave memory alone (callers validate first, but a
 * mistake must not scribble). */
static void test_invalid_is_noop(void) {
  unsigned char d[64], s[64], keep[64];
  for (size_t i = 0; i < sizeof d; i++) {
    d[i] = (unsigned char)rnd();
    s[i] = (unsigned char)rnd();
  }
  memcpy(keep, d, sizeof d);
  for (size_t dt = 0; dt < 4; dt++)
    for (tdist_reduce_op_t op = TDIST_BAND; op <= TDIST_BXOR; op++) {
      tdist__reduce(d, s, 4, k_dtypes[dt], op);
      tdist__reduce3(d, s, s, 4, k_dtypes[dt], op);
    }
  tdist__reduce(d, s, 4, (tdist_dtype_t)99, TDIST_SUM);
  tdist__reduce(d, s, 4, (tdist_dtype_t)-1, TDIST_SUM);
  tdist__reduce(d, s, 4, TDIST_INT32, (tdist_reduce_op_t)8);
  tdist__reduce(d, s, 4, TDIST_INT32, (tdist_reduce_op_t)-1);
  tdist__reduce3(d, s, s, 4, (tdist_dtype_t)8, TDIST_SUM);
  tdist__reduce_finish_avg(d, 4, (tdist_dtype_t)-2, 2);
  CHECK(memcmp(d, keep, sizeof d) == 0);
  /* count 0 never touches the pointers */
  tdist__reduce(NULL, NULL, 0, TDIST_FLOAT32, TDIST_SUM);
  tdist__reduce3(NULL, NULL, NULL, 0, TDIST_FLOAT16, TDIST_MAX);
  tdist__reduce_finish_avg(NULL, 0, TDIST_BFLOAT16, 3);
  TEST_LOG("invalid combinations: no-ops");
}

/* How a collective uses the kernels: fold world_size contributions in rank order, then divide
 * for AVG. Checked against the same fold done by the reference. */
static void test_world_fold(void) {
  static const int k_world[] = {1, 2, 3, 4, 5, 8};
  const size_t count = 1001;
  for (size_t w = 0; w < sizeof k_world / sizeof k_world[0]; w++) {
    const int world = k_world[w];
    for (size_t d = 0; d < N_DTYPES; d++) {
      const tdist_dtype_t dt = k_dtypes[d];
      const size_t es = tdist_dtype_size(dt), bytes = count * es;
      for (size_t o = 0; o < N_OPS; o++) {
        const tdist_reduce_op_t op = k_ops[o];
        if (!tdist__op_valid(dt, op)) continue;
        unsigned char *in = malloc(bytes * (size_t)world), *acc = malloc(bytes),
                      *ref = malloc(bytes);
        CHECK(in && acc && ref);
        fill_random(dt, in, count * (size_t)world);
        memcpy(acc, in, bytes);
        for (int r = 1; r < world; r++) tdist__reduce(acc, in + (size_t)r * bytes, count, dt, op);
        if (op == TDIST_AVG) tdist__reduce_finish_avg(acc, count, dt, world);

        /* Reference fold; a NaN anywhere makes the element NaN for good (checked loosely: its
         * exact form was checked by the sweep). */
        unsigned char *nan = calloc(count, 1);
        CHECK(nan);
        memcpy(ref, in, bytes);
        for (int r = 1; r < world; r++)
          for (size_t i = 0; i < count; i++) {
            unsigned char out[8];
            const unsigned char *x = in + (size_t)r * bytes + i * es;
            const nan_rule_t rule = ref_op(dt, op, ref + i * es, x, out);
            if (rule != NAN_NONE || nan[i]) {
              nan[i] = 1;
            } else {
              memcpy(ref + i * es, out, es);
            }
          }
        for (size_t i = 0; i < count; i++) {
          if (op == TDIST_AVG && !nan[i]) {
            unsigned char out[8];
            if (ref_avg(dt, ref + i * es, world, out) != NAN_NONE)
              nan[i] = 1;
            else
              memcpy(ref + i * es, out, es);
          }
          if (world == 1 && is_float(dt) && ref_load(dt, in + i * es).nan_sign) nan[i] = 1;
          const int ok = nan[i] ? ref_load(dt, acc + i * es).nan_sign != 0
                                : memcmp(acc + i * es, ref + i * es, es) == 0;
          if (!ok) {
            fprintf(stderr, "world fold: world=%d %s %s element %zu differs\n", world,
                    tdist_dtype_name(dt), tdist_reduce_op_name(op), i);
            exit(1);
          }
        }
        free(nan);
        free(in);
        free(acc);
        free(ref);
      }
    }
  }
  TEST_LOG("world fold (1,2,3,4,5,8 ranks): ok");
}

static void test_kernel_choice(void) {
  const char *k = tdist__reduce_kernels();
  const char *env = getenv("TDIST_REDUCE_KERNELS");
  TEST_LOG("kernel set: %s (TDIST_REDUCE_KERNELS=%s)", k, env ? env : "(unset)");
  CHECK(strcmp(k, "generic") == 0 || strcmp(k, "avx2") == 0);
  if (env && strcmp(env, "generic") == 0) CHECK(strcmp(k, "generic") == 0);
#if HAVE_X86
  __builtin_cpu_init();
  if (!(env && strcmp(env, "generic") == 0) && __builtin_cpu_supports("avx2") && have_f16c())
    CHECK(strcmp(k, "avx2") == 0);
#endif
}

int main(void) {
  test_rng_init("reduce_test", 0); /* a fresh seed each run, printed */
  test_kernel_choice();
  test_tables();
  test_conversions();
  test_invalid_is_noop();
  test_special_pairs();
  test_sweep();
  test_world_fold();
  TEST_LOG("all ok");
  return 0;
}
