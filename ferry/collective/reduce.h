/// @file
/// Element-wise reductions for collectives: acc[i] = op(acc[i], in[i]) over a dtype's elements.
///
/// The loops are plain element loops the compiler vectorises (-O2 and up; on x86-64 a second copy
/// built for AVX2, twice the baseline's vector width, runs where the CPU has it); float16 and
/// bfloat16 are widened to float, reduced, and rounded back to nearest-even per element, which is
/// what every peer library does on CPU, in vector loops too (on x86-64 with AVX2 hand-written ones,
/// float16 through F16C; elsewhere conversions without branches that the compiler vectorises:
/// the same bits for every non-NaN value). Integer sum and prod wrap (two's complement),
/// as in C++ on unsigned types; min and max are exact. Float results depend on the order of
/// reduction: the collectives fix that order per algorithm, so every rank gets bit-identical
/// results.
#pragma once

#include <cstddef>
#include <span>
#include <string_view>
#include <system_error>

#include "ferry/net/fetch.h"
#include "ferry/store/tensor.h"

namespace ferry::collective {

/// The reduction a collective applies element-wise (reduce_into()).
enum class ReduceOp {
  kSum,   ///< acc + in (integers wrap)
  kProd,  ///< acc * in (integers wrap)
  kMin,   ///< the smaller (exact)
  kMax    ///< the larger (exact)
};

/// "sum", "prod", "min", "max"; "unknown" for a value outside the enum.
std::string_view reduce_op_name(ReduceOp op);

/// acc = op(acc, in), element-wise. Both spans hold whole elements of `dtype` and have the same
/// size; `in` is `acc` itself or memory apart from it. errc::invalid_argument for a dtype the
/// reductions do not cover (uint8, int8 and int16 are covered too; bool is not), mismatched sizes
/// or a partial overlap. Any thread; no allocation.
std::error_code reduce_into(DType dtype, ReduceOp op, std::span<std::byte> acc,
                            std::span<const std::byte> in);

/// out = op(a, b), element-wise, with the same bits as reduce_into() on a copy of `a`: the
/// operands' order is kept (it decides which NaN or signed zero min, max and the 16-bit formats
/// give). `out` may be `a` (reduce_into()), `b` (in place into the second operand: what lets a
/// rank reduce into the buffer a peer's bytes landed in whatever its place in the order) or
/// memory overlapping neither; one pass over the three in every case. Sizes and dtype as for
/// reduce_into(), errc::invalid_argument otherwise or for a partial overlap. Any thread; no
/// allocation.
std::error_code reduce_to(DType dtype, ReduceOp op, std::span<std::byte> out,
                          std::span<const std::byte> a, std::span<const std::byte> b);

/// A FetchOptions::combine that reduces what arrives into the target: target = op(target,
/// arrived), element-wise, whatever the pieces' lengths (an element split between two pieces is
/// reduced when its rest arrives). The pieces must come in order and follow each other in the
/// target, as FetchOptions::combine promises within a tensor. It keeps that state: one per fetch
/// of one tensor. `dtype` must be one reduce_into() covers (the caller checks: the pieces' errors
/// have nowhere to go).
CombineFn reducing_combine(DType dtype, ReduceOp op);

/// float16 / bfloat16 conversions (round to nearest even; NaN stays NaN), exposed for tests.
///@{
float half_to_float(uint16_t h);
uint16_t float_to_half(float f);
float bf16_to_float(uint16_t b);
uint16_t float_to_bf16(float f);
///@}

}  // namespace ferry::collective
