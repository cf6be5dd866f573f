#include "ferry/collective/reduce.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cstdint>
#include <cstring>
#include <memory>
#include <type_traits>

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

#include "ferry/net/errors.h"

namespace ferry::collective {
namespace {

template <typename T>
struct Sum {
  T operator()(T a, T b) const { return a + b; }
};
template <typename T>
struct Prod {
  T operator()(T a, T b) const { return a * b; }
};
template <typename T>
struct Min {
  T operator()(T a, T b) const { return b < a ? b : a; }
};
template <typename T>
struct Max {
  T operator()(T a, T b) const { return a < b ? b : a; }
};

// Integers reduce as their unsigned counterpart for sum and prod (wrapping, no UB).
template <typename T>
using Wrap = std::make_unsigned_t<T>;

// out[i] = f(a[i], b[i]) for n elements of T. `out` may be `a` or `b` (each element is read before
// it is written) or memory overlapping neither: no __restrict, so the vectorised loop checks the
// pointers at run time (it runs for all three: `ferry-bench reduce`). Each element is loaded and
// stored with memcpy: the buffers need not be aligned for T, and the compiler turns it into
// unaligned vector loads.
template <typename T, typename F>
inline void elementwise(std::byte* out, const std::byte* a, const std::byte* b, size_t n, F f) {
  for (size_t i = 0; i < n; ++i) {
    T x, y;
    std::memcpy(&x, a + i * sizeof(T), sizeof(T));
    std::memcpy(&y, b + i * sizeof(T), sizeof(T));
    x = f(x, y);
    std::memcpy(out + i * sizeof(T), &x, sizeof(T));
  }
}

#if defined(__x86_64__)
// The same loop compiled for AVX2 (twice the vector width of the x86-64 baseline's SSE2), used
// when the CPU has it: the build itself targets the baseline.
template <typename T, typename F>
__attribute__((target("avx2"))) void loop_avx2(std::byte* out, const std::byte* a,
                                               const std::byte* b, size_t n, F f) {
  elementwise<T>(out, a, b, n, f);
}
#endif

template <typename T, typename F>
void loop(std::byte* out, const std::byte* a, const std::byte* b, size_t n, F f) {
#if defined(__x86_64__)
  static const bool avx2 = __builtin_cpu_supports("avx2");
  if (avx2) return loop_avx2<T>(out, a, b, n, f);
#endif
  elementwise<T>(out, a, b, n, f);
}

template <typename T>
void reduce_int(ReduceOp op, std::byte* out, const std::byte* a, const std::byte* b, size_t n) {
  switch (op) {
    case ReduceOp::kSum:
      return loop<Wrap<T>>(out, a, b, n, Sum<Wrap<T>>{});
    case ReduceOp::kProd:
      return loop<Wrap<T>>(out, a, b, n, Prod<Wrap<T>>{});
    case ReduceOp::kMin:
      return loop<T>(out, a, b, n, Min<T>{});
    case ReduceOp::kMax:
      return loop<T>(out, a, b, n, Max<T>{});
  }
}

template <typename T>
void reduce_float(ReduceOp op, std::byte* out, const std::byte* a, const std::byte* b, size_t n) {
  switch (op) {
    case ReduceOp::kSum:
      return loop<T>(out, a, b, n, Sum<T>{});
    case ReduceOp::kProd:
      return loop<T>(out, a, b, n, Prod<T>{});
    case ReduceOp::kMin:
      return loop<T>(out, a, b, n, Min<T>{});
    case ReduceOp::kMax:
      return loop<T>(out, a, b, n, Max<T>{});
  }
}

// The 16-bit float formats, converted without branches (masks, not selects: GCC leaves a nested
// select as control flow, which stops vectorisation), so that the loops below vectorise: round to
// nearest even, NaN stays NaN. half_to_float() & co. are these.
//
// `when` ? a : b, for a condition that is 0 or 1.
inline uint32_t pick(uint32_t when, uint32_t a, uint32_t b) {
  const uint32_t mask = 0u - when;
  return (a & mask) | (b & ~mask);
}

struct Half {
  static float widen(uint16_t h) {
    const uint32_t sign = uint32_t{h & 0x8000u} << 16;
    const uint32_t em = h & 0x7fffu;  // exponent and mantissa
    const uint32_t exp = em >> 10;
    // A subnormal (or zero) is its mantissa times 2^-24, exactly, as a float.
    const float sub = static_cast<float>(static_cast<int32_t>(em & 0x3ffu)) * 0x1p-24f;
    const uint32_t normal = (em << 13) + 0x38000000u;  // exponent bias 15 -> 127
    // Inf, or NaN made quiet with its payload kept (as the F16C instruction does).
    const uint32_t special = (em << 13) | pick((em & 0x3ffu) != 0, 0x7fc00000u, 0x7f800000u);
    uint32_t bits = pick(exp == 0x1fu, special, normal);
    bits = pick(exp == 0u, std::bit_cast<uint32_t>(sub), bits);
    return std::bit_cast<float>(sign | bits);
  }
  static uint16_t narrow(float f) {
    const uint32_t x = std::bit_cast<uint32_t>(f);
    const uint32_t sign = (x >> 16) & 0x8000u;
    const uint32_t abs = x & 0x7fffffffu;
    // Normal: rebias the exponent, round the mantissa to 10 bits (nearest even: add just under
    // half, plus the kept bit; a carry into the exponent is the right result).
    const uint32_t v = abs - 0x38000000u;
    const uint32_t normal = (v + 0xfffu + ((v >> 13) & 1u)) >> 13;
    // Subnormal half (or zero): the mantissa with its implicit bit, shifted to 10 bits, rounded
    // the same way; shifts past 31 (values below half the smallest subnormal) give 0 anyway.
    const uint32_t m = (abs & 0x7fffffu) | 0x800000u;
    const uint32_t e = abs >> 23;
    // (126 - e & 31 only keeps the shift defined where the result is not used: e > 112.)
    const uint32_t shift = pick(e < 95u, 31u, (126u - e) & 31u);
    const uint32_t sub = (m + ((1u << shift) >> 1) - 1u + ((m >> shift) & 1u)) >> shift;
    uint32_t bits = pick(abs < 0x38800000u, sub, normal);
    bits = pick(abs >= 0x477ff000u, 0x7c00u, bits);  // overflows to inf (incl. inf)
    // NaN: quiet, the payload's top bits kept (as the F16C instruction does).
    bits = pick(abs > 0x7f800000u, 0x7e00u | ((abs >> 13) & 0x3ffu), bits);
    return static_cast<uint16_t>(sign | bits);
  }
};
struct BFloat {
  static float widen(uint16_t b) { return std::bit_cast<float>(uint32_t{b} << 16); }
  static uint16_t narrow(float f) {
    const uint32_t x = std::bit_cast<uint32_t>(f);
    const uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
    const uint32_t quiet = (x >> 16) | 0x40u;  // NaN: truncated, made quiet
    return static_cast<uint16_t>(pick((x & 0x7fffffffu) > 0x7f800000u, quiet, rounded));
  }
};

// A float op on 16-bit floats: widen both, apply, round back (one rounding per element).
template <typename Format, typename F>
struct Widened {
  uint16_t operator()(uint16_t a, uint16_t b) const {
    return Format::narrow(F{}(Format::widen(a), Format::widen(b)));
  }
};

// The float op of a ReduceOp, as the functor the element loops take.
template <ReduceOp Op>
using FloatOp = std::conditional_t<
    Op == ReduceOp::kSum, Sum<float>,
    std::conditional_t<Op == ReduceOp::kProd, Prod<float>,
                       std::conditional_t<Op == ReduceOp::kMin, Min<float>, Max<float>>>>;

#if defined(__x86_64__)
// Hand-written AVX2 loops for the 16-bit floats (8 or 16 elements at a time; the rest by the
// element loop), bit for bit what Widened<Format, FloatOp<Op>> gives for every non-NaN result (a
// NaN stays a NaN; which one two NaNs give is the hardware's and the compiler's choice). The op
// on 8 floats: min and max as Min / Max, (b < a ? b : a) is vminps(b, a), (a < b ? b : a)
// vmaxps(b, a).
template <ReduceOp Op>
__attribute__((target("avx2"))) inline __m256 apply(__m256 a, __m256 b) {
  if constexpr (Op == ReduceOp::kSum) return _mm256_add_ps(a, b);
  if constexpr (Op == ReduceOp::kProd) return _mm256_mul_ps(a, b);
  if constexpr (Op == ReduceOp::kMin) return _mm256_min_ps(b, a);
  if constexpr (Op == ReduceOp::kMax) return _mm256_max_ps(b, a);
}

// CPUID's F16C bit (clang's __builtin_cpu_supports does not know "f16c").
bool cpu_has_f16c() {
  unsigned a, b, c, d;
  return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
}

// float16 with the CPU's conversions (F16C: every AVX2 CPU has it, the baseline does not).
// Each step loads both operands before it stores: `out` may be either of them (elementwise()).
template <ReduceOp Op>
__attribute__((target("avx2,f16c"))) void loop_half(std::byte* out, const std::byte* a,
                                                    const std::byte* b, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a + 2 * i)));
    const __m256 y = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 2 * i)));
    // Named first: without optimisation _mm256_cvtps_ph is a macro, and a template's comma
    // would split its arguments.
    const __m256 r = apply<Op>(x, y);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 2 * i),
                     _mm256_cvtps_ph(r, _MM_FROUND_TO_NEAREST_INT));
  }
  elementwise<uint16_t>(out + 2 * i, a + 2 * i, b + 2 * i, n - i, Widened<Half, FloatOp<Op>>{});
}

// bfloat16 -> float: the bits shifted up. Interleaving zeros below each element widens elements
// 0-3 and 8-11 (lo) and 4-7 and 12-15 (hi); packing lo with hi puts them back in order.
template <ReduceOp Op>
__attribute__((target("avx2"))) void loop_bfloat(std::byte* out, const std::byte* a,
                                                 const std::byte* b, size_t n) {
  const __m256i zero = _mm256_setzero_si256(), one = _mm256_set1_epi32(1);
  const __m256i below_half = _mm256_set1_epi32(0x7fff), quiet = _mm256_set1_epi32(0x40);
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
  // BFloat::narrow on 8 floats, into the low 16 bits of each 32.
  const auto narrow = [&](__m256 f) __attribute__((target("avx2"))) {
    const __m256i x = _mm256_castps_si256(f);
    const __m256i top = _mm256_srli_epi32(x, 16);
    const __m256i rounded = _mm256_srli_epi32(
        _mm256_add_epi32(x, _mm256_add_epi32(below_half, _mm256_and_si256(top, one))), 16);
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(x, abs_mask), inf);
    return _mm256_blendv_epi8(rounded, _mm256_or_si256(top, quiet), nan);
  };
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + 2 * i));
    const __m256i y = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 2 * i));
    const __m256 lo = apply<Op>(_mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, x)),
                                _mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, y)));
    const __m256 hi = apply<Op>(_mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, x)),
                                _mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, y)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 2 * i),
                        _mm256_packus_epi32(narrow(lo), narrow(hi)));
  }
  elementwise<uint16_t>(out + 2 * i, a + 2 * i, b + 2 * i, n - i, Widened<BFloat, FloatOp<Op>>{});
}
#endif

template <typename Format, ReduceOp Op>
void loop_16(std::byte* out, const std::byte* a, const std::byte* b, size_t n) {
#if defined(__x86_64__)
  static const bool fast =
      __builtin_cpu_supports("avx2") && (!std::is_same_v<Format, Half> || cpu_has_f16c());
  if (fast) {
    if constexpr (std::is_same_v<Format, Half>) return loop_half<Op>(out, a, b, n);
    if constexpr (std::is_same_v<Format, BFloat>) return loop_bfloat<Op>(out, a, b, n);
  }
#endif
  loop<uint16_t>(out, a, b, n, Widened<Format, FloatOp<Op>>{});
}

template <typename Format>
void reduce_16(ReduceOp op, std::byte* out, const std::byte* a, const std::byte* b, size_t n) {
  switch (op) {
    case ReduceOp::kSum:
      return loop_16<Format, ReduceOp::kSum>(out, a, b, n);
    case ReduceOp::kProd:
      return loop_16<Format, ReduceOp::kProd>(out, a, b, n);
    case ReduceOp::kMin:
      return loop_16<Format, ReduceOp::kMin>(out, a, b, n);
    case ReduceOp::kMax:
      return loop_16<Format, ReduceOp::kMax>(out, a, b, n);
  }
}

// out = op(a, b) over n elements of `dtype` (checked by the caller: one the reductions cover);
// `out` is `a`, `b` or memory overlapping neither (elementwise()).
void reduce_elements(DType dtype, ReduceOp op, std::byte* out, const std::byte* a,
                     const std::byte* b, size_t n) {
  switch (dtype) {
    case DType::kUInt8:
      return reduce_int<uint8_t>(op, out, a, b, n);
    case DType::kInt8:
      return reduce_int<int8_t>(op, out, a, b, n);
    case DType::kInt16:
      return reduce_int<int16_t>(op, out, a, b, n);
    case DType::kInt32:
      return reduce_int<int32_t>(op, out, a, b, n);
    case DType::kInt64:
      return reduce_int<int64_t>(op, out, a, b, n);
    case DType::kFloat16:
      return reduce_16<Half>(op, out, a, b, n);
    case DType::kBFloat16:
      return reduce_16<BFloat>(op, out, a, b, n);
    case DType::kFloat32:
      return reduce_float<float>(op, out, a, b, n);
    case DType::kFloat64:
      return reduce_float<double>(op, out, a, b, n);
    case DType::kBool:
      return;
  }
}

// Whether `dtype` is one the reductions cover and `bytes` whole elements of it.
bool reducible(DType dtype, size_t bytes) {
  const size_t size = dtype_size(dtype);
  return size != 0 && dtype != DType::kBool && bytes % size == 0;
}

}  // namespace

std::string_view reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kProd:
      return "prod";
    case ReduceOp::kMin:
      return "min";
    case ReduceOp::kMax:
      return "max";
  }
  return "unknown";
}

float half_to_float(uint16_t h) { return Half::widen(h); }
uint16_t float_to_half(float f) { return Half::narrow(f); }
float bf16_to_float(uint16_t b) { return BFloat::widen(b); }
uint16_t float_to_bf16(float f) { return BFloat::narrow(f); }

std::error_code reduce_into(DType dtype, ReduceOp op, std::span<std::byte> acc,
                            std::span<const std::byte> in) {
  return reduce_to(dtype, op, acc, acc, in);
}

std::error_code reduce_to(DType dtype, ReduceOp op, std::span<std::byte> out,
                          std::span<const std::byte> a, std::span<const std::byte> b) {
  if (!reducible(dtype, out.size()) || a.size() != out.size() || b.size() != out.size()) {
    return errc::invalid_argument;
  }
  // Either operand itself, or memory apart from both: a partial overlap would read elements
  // already written.
  const auto overlaps = [&](std::span<const std::byte> x) {
    return x.data() != out.data() && !x.empty() && x.data() < out.data() + out.size() &&
           out.data() < x.data() + x.size();
  };
  if (overlaps(a) || overlaps(b)) return errc::invalid_argument;
  reduce_elements(dtype, op, out.data(), a.data(), b.data(), out.size() / dtype_size(dtype));
  return {};
}

namespace {
// reducing_combine()'s state: the bytes of an element whose rest has not arrived yet.
struct ReducingCombine {
  DType dtype;
  ReduceOp op;
  size_t esize;
  std::array<std::byte, 16> carry{};
  size_t carried = 0;

  void operator()(std::span<std::byte> into, std::span<const std::byte> arrived) {
    size_t i = 0;
    if (carried > 0) {
      i = std::min(esize - carried, arrived.size());
      std::memcpy(carry.data() + carried, arrived.data(), i);
      carried += i;
      if (carried < esize) return;
      // The element began esize - i bytes before this piece: at the end of the one before.
      (void)reduce_into(dtype, op, {into.data() + i - esize, esize}, {carry.data(), esize});
      carried = 0;
    }
    const size_t whole = (arrived.size() - i) / esize * esize;
    (void)reduce_into(dtype, op, into.subspan(i, whole), arrived.subspan(i, whole));
    i += whole;
    carried = arrived.size() - i;
    std::memcpy(carry.data(), arrived.data() + i, carried);
  }
};
}  // namespace

CombineFn reducing_combine(DType dtype, ReduceOp op) {
  auto state = std::make_shared<ReducingCombine>(ReducingCombine{dtype, op, dtype_size(dtype)});
  return [state](std::span<std::byte> into, std::span<const std::byte> arrived) {
    (*state)(into, arrived);
  };
}

}  // namespace ferry::collective
