#include "collective/reduce.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cstdint>
#include <cstring>
#include <memory>

#include "net/errors.h"

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

// acc[i] = f(acc[i], in[i]) for n elements of T. Each element is loaded and stored with memcpy:
// the buffers need not be aligned for T, and the compiler turns it into unaligned vector loads.
template <typename T, typename F>
inline void elementwise(std::byte* __restrict acc, const std::byte* __restrict in, size_t n, F f) {
  for (size_t i = 0; i < n; ++i) {
    T a, b;
    std::memcpy(&a, acc + i * sizeof(T), sizeof(T));
    std::memcpy(&b, in + i * sizeof(T), sizeof(T));
    a = f(a, b);
    std::memcpy(acc + i * sizeof(T), &a, sizeof(T));
  }
}

#if defined(__x86_64__)
// The same loop compiled for AVX2 (twice the vector width of the x86-64 baseline's SSE2), used
// when the CPU has it: the build itself targets the baseline.
template <typename T, typename F>
__attribute__((target("avx2"))) void loop_avx2(std::byte* acc, const std::byte* in, size_t n, F f) {
  elementwise<T>(acc, in, n, f);
}
#endif

template <typename T, typename F>
void loop(std::byte* acc, const std::byte* in, size_t n, F f) {
#if defined(__x86_64__)
  static const bool avx2 = __builtin_cpu_supports("avx2");
  if (avx2) return loop_avx2<T>(acc, in, n, f);
#endif
  elementwise<T>(acc, in, n, f);
}

template <typename T>
void reduce_int(ReduceOp op, std::byte* acc, const std::byte* in, size_t n) {
  switch (op) {
    case ReduceOp::kSum:
      return loop<Wrap<T>>(acc, in, n, Sum<Wrap<T>>{});
    case ReduceOp::kProd:
      return loop<Wrap<T>>(acc, in, n, Prod<Wrap<T>>{});
    case ReduceOp::kMin:
      return loop<T>(acc, in, n, Min<T>{});
    case ReduceOp::kMax:
      return loop<T>(acc, in, n, Max<T>{});
  }
}

template <typename T>
void reduce_float(ReduceOp op, std::byte* acc, const std::byte* in, size_t n) {
  switch (op) {
    case ReduceOp::kSum:
      return loop<T>(acc, in, n, Sum<T>{});
    case ReduceOp::kProd:
      return loop<T>(acc, in, n, Prod<T>{});
    case ReduceOp::kMin:
      return loop<T>(acc, in, n, Min<T>{});
    case ReduceOp::kMax:
      return loop<T>(acc, in, n, Max<T>{});
  }
}

// 16-bit floats: widen a block to float, reduce, narrow back.
template <float (*Widen)(uint16_t), uint16_t (*Narrow)(float)>
void reduce_16(ReduceOp op, std::byte* acc, const std::byte* in, size_t n) {
  float a[256], b[256];
  uint16_t h[256];
  for (size_t i = 0; i < n; i += 256) {
    const size_t m = std::min<size_t>(256, n - i);
    std::memcpy(h, acc + i * 2, m * 2);
    for (size_t k = 0; k < m; ++k) a[k] = Widen(h[k]);
    std::memcpy(h, in + i * 2, m * 2);
    for (size_t k = 0; k < m; ++k) b[k] = Widen(h[k]);
    switch (op) {
      case ReduceOp::kSum:
        for (size_t k = 0; k < m; ++k) a[k] += b[k];
        break;
      case ReduceOp::kProd:
        for (size_t k = 0; k < m; ++k) a[k] *= b[k];
        break;
      case ReduceOp::kMin:
        for (size_t k = 0; k < m; ++k) a[k] = b[k] < a[k] ? b[k] : a[k];
        break;
      case ReduceOp::kMax:
        for (size_t k = 0; k < m; ++k) a[k] = a[k] < b[k] ? b[k] : a[k];
        break;
    }
    for (size_t k = 0; k < m; ++k) h[k] = Narrow(a[k]);
    std::memcpy(acc + i * 2, h, m * 2);
  }
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

float half_to_float(uint16_t h) {
  const uint32_t sign = uint32_t{h & 0x8000u} << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);  // inf / NaN
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;  // zero
  } else {
    // Subnormal: normalise.
    exp = 113;
    while (!(mant & 0x400)) {
      mant <<= 1;
      --exp;
    }
    bits = sign | (exp << 23) | ((mant & 0x3ff) << 13);
  }
  return std::bit_cast<float>(bits);
}

uint16_t float_to_half(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t abs = x & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7e00u;   // NaN
  if (abs >= 0x477ff000u) return sign | 0x7c00u;  // overflows to inf (incl. inf)
  if (abs < 0x38800000u) {
    // Subnormal half (or zero): shift the mantissa with the implicit bit, round to even.
    if (abs < 0x33000000u) return sign;  // below half the smallest subnormal
    const uint32_t e = abs >> 23;
    const uint32_t m = (abs & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - e;  // 14 + (113 - e - 1) ... brings it to 10 bits
    uint32_t v = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (v & 1))) ++v;
    return sign | static_cast<uint16_t>(v);
  }
  // Normal: rebias the exponent, round the mantissa to 10 bits (nearest even).
  uint32_t v = abs - 0x38000000u;  // exponent bias 127 -> 15
  const uint32_t rem = v & 0x1fffu;
  v >>= 13;
  if (rem > 0x1000u || (rem == 0x1000u && (v & 1))) ++v;
  return sign | static_cast<uint16_t>(v);
}

float bf16_to_float(uint16_t b) { return std::bit_cast<float>(uint32_t{b} << 16); }

uint16_t float_to_bf16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // NaN
  const uint32_t rounding = 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>((x + rounding) >> 16);
}

std::error_code reduce_into(DType dtype, ReduceOp op, std::span<std::byte> acc,
                            std::span<const std::byte> in) {
  const size_t size = dtype_size(dtype);
  if (size == 0 || dtype == DType::kBool || acc.size() != in.size() || acc.size() % size) {
    return errc::invalid_argument;
  }
  const size_t n = acc.size() / size;
  std::byte* a = acc.data();
  const std::byte* b = in.data();
  switch (dtype) {
    case DType::kUInt8:
      reduce_int<uint8_t>(op, a, b, n);
      break;
    case DType::kInt8:
      reduce_int<int8_t>(op, a, b, n);
      break;
    case DType::kInt16:
      reduce_int<int16_t>(op, a, b, n);
      break;
    case DType::kInt32:
      reduce_int<int32_t>(op, a, b, n);
      break;
    case DType::kInt64:
      reduce_int<int64_t>(op, a, b, n);
      break;
    case DType::kFloat16:
      reduce_16<half_to_float, float_to_half>(op, a, b, n);
      break;
    case DType::kBFloat16:
      reduce_16<bf16_to_float, float_to_bf16>(op, a, b, n);
      break;
    case DType::kFloat32:
      reduce_float<float>(op, a, b, n);
      break;
    case DType::kFloat64:
      reduce_float<double>(op, a, b, n);
      break;
    case DType::kBool:
      return errc::invalid_argument;
  }
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
