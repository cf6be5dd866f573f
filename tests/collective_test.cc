// Collectives (collective/): reduction kernels against references, and every collective on N
// ranks (each its own Context, real sockets; RDMA in the guest), byte-exact for integers and
// within a documented tolerance for floats, sizes from one element to 64 MiB and counts that do
// not divide by N; a rank that dies fails the others in bounded time.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <stdexcept>
#include <thread>

#include "ferry/collective/call.h"
#include "ferry/collective/group.h"
#include "ferry/collective/service.h"
#include "ferry/rdma/rdma.h"
#include "tests/test_util.h"

namespace ferry::test {
namespace {

using collective::Group;
using collective::ReduceOp;
using collective::Status;

// ---------------------------------------------------------------- kernels

TEST(Reduce, HalfAndBfloat16RoundTripEveryValue) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = collective::half_to_float(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(collective::half_to_float(collective::float_to_half(f))));
      continue;
    }
    ASSERT_EQ(collective::float_to_half(f), h) << "half 0x" << std::hex << h;
    const float b = collective::bf16_to_float(static_cast<uint16_t>(h));
    if (!std::isnan(b)) {
      ASSERT_EQ(collective::float_to_bf16(b), h) << "bf16 0x" << std::hex << h;
    }
  }
  // Rounding: to nearest, ties to even.
  EXPECT_EQ(collective::float_to_half(1.0f + 1.0f / 2048), collective::float_to_half(1.0f));
  EXPECT_EQ(collective::float_to_half(65520.0f), 0x7c00);  // overflows to infinity
  EXPECT_EQ(collective::half_to_float(0x0001), std::ldexp(1.0f, -24));
}

// A 16-bit float format's value for magnitude bits m (sign clear), from its definition: for the
// top, infinite, pattern, the power of two after the largest finite value (rounding's bound).
double value16(bool half, uint32_t m) {
  const int mant_bits = half ? 10 : 7, bias = half ? 15 : 127;
  const uint32_t exp = m >> mant_bits, mant = m & ((1u << mant_bits) - 1);
  if (exp == 0) return std::ldexp(static_cast<double>(mant), 1 - bias - mant_bits);
  return std::ldexp(static_cast<double>(mant + (1u << mant_bits)), int(exp) - bias - mant_bits);
}
// The reference rounding of a float that is not NaN: the nearest magnitude by search, ties to the
// even one; at or past the bound above the largest finite value, infinity.
uint16_t nearest16(bool half, float f) {
  const uint32_t inf = half ? 0x7c00 : 0x7f80, sign = std::signbit(f) ? 0x8000 : 0;
  const double a = std::fabs(static_cast<double>(f));
  uint32_t lo = 0, hi = inf;  // value16(lo) <= a < value16(hi), or a is beyond
  if (a >= value16(half, inf)) return static_cast<uint16_t>(sign | inf);
  while (hi - lo > 1) {
    const uint32_t mid = (lo + hi) / 2;
    (value16(half, mid) <= a ? lo : hi) = mid;
  }
  const double below = a - value16(half, lo), above = value16(half, hi) - a;
  const uint32_t m = below < above ? lo : above < below ? hi : (lo & 1) ? hi : lo;
  return static_cast<uint16_t>(sign | m);
}
float widen16(bool half, uint16_t x) {
  const uint32_t inf = half ? 0x7c00 : 0x7f80, m = x & 0x7fff;
  if (m > inf) return std::numeric_limits<float>::quiet_NaN();
  const double v = m == inf ? INFINITY : value16(half, m);
  return static_cast<float>((x & 0x8000) ? -v : v);
}

// The conversions round every value between two neighbours of the format as the reference does:
// each magnitude, the midpoint to the next (a tie: to the even one) and a float either side.
TEST(Reduce, SixteenBitFloatsRoundToNearestEvenAtEveryMidpoint) {
  for (bool half : {true, false}) {
    const uint32_t inf = half ? 0x7c00 : 0x7f80;
    for (uint32_t m = 0; m < inf; ++m) {
      const float mid = static_cast<float>((value16(half, m) + value16(half, m + 1)) / 2);
      for (float f : {static_cast<float>(value16(half, m)), mid, std::nextafter(mid, 0.0f),
                      std::nextafter(mid, INFINITY)}) {
        for (float x : {f, -f}) {
          ASSERT_EQ(half ? collective::float_to_half(x) : collective::float_to_bf16(x),
                    nearest16(half, x))
              << (half ? "float16 " : "bfloat16 ") << x;
        }
      }
    }
  }
}

// float16 and bfloat16 reduce as each element widened to float, combined, and rounded back once
// to nearest even; checked against a reference built from the formats' definitions, on random
// bit patterns (subnormals, infinities and NaNs among them) and lengths around the vector width.
TEST(Reduce, SixteenBitFloatsReduceAsEachElementWidenedAndRoundedOnce) {
  std::mt19937 rng(5);
  for (bool half : {true, false}) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kProd, ReduceOp::kMin, ReduceOp::kMax}) {
      SCOPED_TRACE(std::string(half ? "float16 " : "bfloat16 ") +
                   std::string(collective::reduce_op_name(op)));
      for (size_t n : {1, 7, 8, 9, 15, 16, 17, 1003, 4096}) {
        std::vector<uint16_t> acc(n), in(n);
        for (size_t i = 0; i < n; ++i) {
          acc[i] = static_cast<uint16_t>(rng());
          in[i] = static_cast<uint16_t>(rng());
        }
        auto got = acc;
        ASSERT_FALSE(collective::reduce_into(half ? DType::kFloat16 : DType::kBFloat16, op,
                                             std::as_writable_bytes(std::span(got)),
                                             std::as_bytes(std::span(in))));
        for (size_t i = 0; i < n; ++i) {
          const float a = widen16(half, acc[i]), b = widen16(half, in[i]);
          const float r = op == ReduceOp::kSum    ? a + b
                          : op == ReduceOp::kProd ? a * b
                          : op == ReduceOp::kMin  ? (b < a ? b : a)
                                                  : (a < b ? b : a);
          const uint32_t inf = half ? 0x7c00 : 0x7f80;
          if (std::isnan(r)) {
            // Any NaN: which one two NaNs give is the hardware's (and compiler's) choice.
            ASSERT_GT(got[i] & 0x7fffu, inf) << "element " << i << " of " << n << ": not NaN";
          } else {
            ASSERT_EQ(got[i], nearest16(half, r))
                << "element " << i << " of " << n << ": " << a << " and " << b;
          }
        }
      }
    }
  }
}

TEST(Reduce, RejectsBadInput) {
  std::vector<std::byte> a(8), b(4);
  EXPECT_TRUE(collective::reduce_into(DType::kFloat32, ReduceOp::kSum, a, b));  // sizes differ
  std::vector<std::byte> c(6), d(6);
  EXPECT_TRUE(collective::reduce_into(DType::kFloat32, ReduceOp::kSum, c, d));  // not elements
  EXPECT_TRUE(collective::reduce_into(DType::kBool, ReduceOp::kSum, a, a));
  // The operand partly overlapping the accumulator would be read after it was written.
  std::vector<std::byte> e(64);
  const auto part = [&](size_t at) { return std::span(e).subspan(at, 32); };
  EXPECT_TRUE(collective::reduce_into(DType::kFloat32, ReduceOp::kSum, part(0), part(4)));
  EXPECT_TRUE(collective::reduce_into(DType::kFloat32, ReduceOp::kSum, part(16), part(0)));
  EXPECT_FALSE(collective::reduce_into(DType::kFloat32, ReduceOp::kSum, part(0), part(0)));
  EXPECT_FALSE(collective::reduce_into(DType::kFloat32, ReduceOp::kSum, part(0), part(32)));
}

// reduce_to() gives the bits reduce_into() gives on a copy of its first operand, with the result
// in its first operand, its second (no copy), or elsewhere: the operands' order kept for every
// dtype and op, NaNs and signed zeros included (min and max of -0 and +0 depend on it).
// Whether two results of a reduction agree: the same bits, or both NaN (which NaN two NaNs give
// is the hardware's and the compiler's choice).
bool same_result(DType t, const std::vector<std::byte>& got, const std::vector<std::byte>& want) {
  if (got.size() != want.size()) return false;
  const size_t esize = dtype_size(t);
  const auto nan = [t, esize](const std::byte* e) {
    uint64_t bits = 0;
    std::memcpy(&bits, e, esize);  // little-endian
    switch (t) {
      case DType::kFloat16:
        return (bits & 0x7fff) > 0x7c00;
      case DType::kBFloat16:
        return (bits & 0x7fff) > 0x7f80;
      case DType::kFloat32:
        return (bits & 0x7fffffff) > 0x7f800000;
      case DType::kFloat64:
        return (bits & 0x7fffffffffffffff) > 0x7ff0000000000000;
      default:
        return false;
    }
  };
  for (size_t i = 0; i < got.size(); i += esize) {
    if (nan(&want[i]) && nan(&got[i])) continue;
    if (std::memcmp(&got[i], &want[i], esize) != 0) return false;
  }
  return true;
}

TEST(Reduce, ReduceToKeepsTheOperandsOrderWhereverTheResultGoes) {
  std::mt19937 rng(17);
  for (DType t : {DType::kFloat32, DType::kFloat64, DType::kInt32, DType::kInt64, DType::kFloat16,
                  DType::kBFloat16, DType::kUInt8, DType::kInt8, DType::kInt16}) {
    const size_t esize = dtype_size(t);
    for (size_t n : {0, 1, 15, 16, 17, 1003}) {
      std::vector<std::byte> a(n * esize), b(n * esize);
      for (auto& x : a) x = std::byte(rng());
      for (auto& x : b) x = std::byte(rng());
      // A few elements of -0 against +0 (every dtype's zeros, a float's sign bit set in a).
      for (size_t i = 0; i < n; i += 5) {
        std::fill_n(&a[i * esize], esize, std::byte{0});
        std::fill_n(&b[i * esize], esize, std::byte{0});
        if (t != DType::kInt32 && t != DType::kInt64) a[i * esize + esize - 1] = std::byte{0x80};
      }
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kProd, ReduceOp::kMin, ReduceOp::kMax}) {
        SCOPED_TRACE(std::to_string(static_cast<int>(t)) + " " +
                     std::string(collective::reduce_op_name(op)) + " n=" + std::to_string(n));
        auto want = a;
        ASSERT_FALSE(collective::reduce_into(t, op, want, b));
        auto first = a;
        ASSERT_FALSE(collective::reduce_to(t, op, first, first, b));
        EXPECT_TRUE(same_result(t, first, want));
        auto second = b;
        ASSERT_FALSE(collective::reduce_to(t, op, second, a, second));
        EXPECT_TRUE(same_result(t, second, want));
        std::vector<std::byte> elsewhere(a.size(), std::byte{0x5a});
        ASSERT_FALSE(collective::reduce_to(t, op, elsewhere, a, b));
        EXPECT_TRUE(same_result(t, elsewhere, want));
      }
    }
  }
  std::vector<std::byte> buf(64), c(32);
  const auto f32 = DType::kFloat32;
  auto out = std::span(buf).subspan(0, 32);
  EXPECT_TRUE(collective::reduce_to(f32, ReduceOp::kSum, out, std::span(buf).subspan(16, 32), c));
  EXPECT_TRUE(collective::reduce_to(f32, ReduceOp::kSum, out, c, std::span(buf).subspan(4, 32)));
  EXPECT_TRUE(collective::reduce_to(f32, ReduceOp::kSum, out, c, std::span(c).subspan(0, 16)));
  EXPECT_TRUE(collective::reduce_to(DType::kBool, ReduceOp::kSum, out, c, c));
}

// reducing_combine() over pieces of every length, split mid-element too, gives what one
// reduce_into() over the whole does, bit for bit.
TEST(Reduce, AReducingCombineReducesPiecesOfAnyLength) {
  std::mt19937 rng(11);
  for (DType t : {DType::kFloat32, DType::kFloat64, DType::kInt32, DType::kInt64, DType::kFloat16,
                  DType::kBFloat16, DType::kUInt8, DType::kInt16}) {
    SCOPED_TRACE(static_cast<int>(t));
    const size_t esize = dtype_size(t);
    const size_t n = 1001 * esize;
    std::vector<std::byte> acc(n), in(n);
    for (size_t i = 0; i < n; ++i) {
      // Small values: a sum or product of two stays finite and exact in every dtype.
      acc[i] = std::byte((i % esize == esize - 1) ? 0x3f : uint8_t(rng() % 4));
      in[i] = std::byte((i % esize == esize - 1) ? 0x3f : uint8_t(rng() % 4));
    }
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
      auto want = acc;
      ASSERT_FALSE(collective::reduce_into(t, op, want, in));
      auto got = acc;
      auto combine = collective::reducing_combine(t, op);
      for (size_t at = 0; at < n;) {
        const size_t len = std::min<size_t>(n - at, rng() % (3 * esize + 2));  // 0 too
        combine(std::span(got).subspan(at, len), std::span(in).subspan(at, len));
        at += len;
      }
      EXPECT_TRUE(got == want);
    }
  }
}

// ---------------------------------------------------------------- data for the ranks

const std::vector<DType> kDtypes = {DType::kFloat32, DType::kFloat64, DType::kInt32,
                                    DType::kInt64,   DType::kFloat16, DType::kBFloat16};
const std::vector<ReduceOp> kOps = {ReduceOp::kSum, ReduceOp::kProd, ReduceOp::kMin,
                                    ReduceOp::kMax};

// Rank r's value for element i: integers in [-5, 5], floats in [0.5, 1.5) (products stay finite).
double value(int r, size_t i) { return static_cast<double>((i * 7 + r * 13 + (i >> 3)) % 11); }

void store(DType t, std::byte* p, double v, bool integer_scale) {
  switch (t) {
    case DType::kInt32: {
      int32_t x = static_cast<int32_t>(v) - 5;
      std::memcpy(p, &x, 4);
      return;
    }
    case DType::kInt64: {
      int64_t x = static_cast<int64_t>(v) - 5;
      std::memcpy(p, &x, 8);
      return;
    }
    default:
      break;
  }
  const double f = integer_scale ? v : 0.5 + v / 11.0;
  switch (t) {
    case DType::kFloat32: {
      float x = static_cast<float>(f);
      std::memcpy(p, &x, 4);
      return;
    }
    case DType::kFloat64:
      std::memcpy(p, &f, 8);
      return;
    case DType::kFloat16: {
      uint16_t x = collective::float_to_half(static_cast<float>(f));
      std::memcpy(p, &x, 2);
      return;
    }
    case DType::kBFloat16: {
      uint16_t x = collective::float_to_bf16(static_cast<float>(f));
      std::memcpy(p, &x, 2);
      return;
    }
    default:
      return;
  }
}

double load(DType t, const std::byte* p) {
  switch (t) {
    case DType::kInt32: {
      int32_t x;
      std::memcpy(&x, p, 4);
      return x;
    }
    case DType::kInt64: {
      int64_t x;
      std::memcpy(&x, p, 8);
      return static_cast<double>(x);
    }
    case DType::kFloat32: {
      float x;
      std::memcpy(&x, p, 4);
      return x;
    }
    case DType::kFloat64: {
      double x;
      std::memcpy(&x, p, 8);
      return x;
    }
    case DType::kFloat16: {
      uint16_t x;
      std::memcpy(&x, p, 2);
      return collective::half_to_float(x);
    }
    case DType::kBFloat16: {
      uint16_t x;
      std::memcpy(&x, p, 2);
      return collective::bf16_to_float(x);
    }
    default:
      return 0;
  }
}

std::vector<std::byte> rank_data(DType t, int r, size_t count) {
  const size_t es = dtype_size(t);
  std::vector<std::byte> v(count * es);
  for (size_t i = 0; i < count; ++i) store(t, v.data() + i * es, value(r, i), false);
  return v;
}

// The reference: the ranks' values (as stored, i.e. already rounded to the dtype) combined in
// double precision; integers exactly (small values: no wrap).
double reference(DType t, ReduceOp op, int n, size_t i) {
  std::byte tmp[8];
  double acc = 0;
  for (int r = 0; r < n; ++r) {
    store(t, tmp, value(r, i), false);
    const double x = load(t, tmp);
    if (r == 0) {
      acc = x;
      continue;
    }
    switch (op) {
      case ReduceOp::kSum:
        acc += x;
        break;
      case ReduceOp::kProd:
        acc *= x;
        break;
      case ReduceOp::kMin:
        acc = std::min(acc, x);
        break;
      case ReduceOp::kMax:
        acc = std::max(acc, x);
        break;
    }
  }
  return acc;
}

// Relative tolerance of a float result after n-1 roundings in the dtype (docs/collectives.md).
double tolerance(DType t, int n) {
  switch (t) {
    case DType::kFloat32:
      return 1e-6 * n;
    case DType::kFloat64:
      return 1e-14 * n;
    case DType::kFloat16:
      return 1e-3 * n;
    case DType::kBFloat16:
      return 8e-3 * n;
    default:
      return 0;  // integers: exact
  }
}

// ---------------------------------------------------------------- ranks

// N ranks in this process, each with its own Context listening on the suite's host.
class Ranks {
 public:
  // io_threads: each Context's (0: client_options' default).
  explicit Ranks(int n, collective::GroupOptions options = {}, int io_threads = 0) {
    for (int r = 0; r < n; ++r) {
      auto context_options = client_options("rank" + std::to_string(r));
      if (io_threads > 0) context_options.threads = io_threads;
      contexts_.push_back(std::make_unique<Context>(std::move(context_options)));
      auto port = contexts_.back()->listen(test_host() + ":0");
      EXPECT_TRUE(port.ok());
      addresses_.push_back(test_host() + ":" + std::to_string(port.ok() ? *port : 0));
    }
    groups_.resize(n);
    run([&](int r) {
      Status why;
      auto g = Group::join(*contexts_[r], addresses_, r, options, &why);
      ASSERT_TRUE(g.ok()) << why.message;
      groups_[r] = std::move(*g);
    });
    // A failed join is recorded above (on its thread); the test must not go on to use the
    // missing group: gtest reports the exception as this test's failure.
    for (int r = 0; r < n; ++r) {
      if (!groups_[r]) throw std::runtime_error("rank " + std::to_string(r) + " did not join");
    }
  }
  // Runs f(rank) on one thread per rank and joins them.
  void run(const std::function<void(int)>& f) {
    std::vector<std::thread> threads;
    for (int r = 0; r < size(); ++r) threads.emplace_back([&f, r] { f(r); });
    for (auto& t : threads) t.join();
  }
  int size() const { return static_cast<int>(contexts_.size()); }
  Group& group(int r) { return *groups_[r]; }
  Context& context(int r) { return *contexts_[r]; }
  void kill(int r) {
    groups_[r].reset();
    contexts_[r].reset();
  }
  // Destroys rank r's Group; its Context lives on (and serves what its store still holds).
  void drop_group(int r) { groups_[r].reset(); }
  const std::string& address(int r) const { return addresses_[r]; }

 private:
  std::vector<std::unique_ptr<Context>> contexts_;
  std::vector<std::string> addresses_;
  std::vector<std::unique_ptr<Group>> groups_;
};

// Elements [first, last) of op over the ranks' rank_data, stored from `data` on: exact for
// integers, within tolerance() for floats. False (with the failure reported) at the first that
// is not.
bool matches_reference(DType t, ReduceOp op, int n, const std::byte* data, size_t first,
                       size_t last, const std::string& where) {
  const size_t es = dtype_size(t);
  const double tol = tolerance(t, n);
  for (size_t i = first; i < last; ++i) {
    const double want = reference(t, op, n, i);
    const double got = load(t, data + (i - first) * es);
    // (Written so that a NaN fails, as ASSERT_NEAR would.)
    if (tol == 0 ? got != want : !(std::abs(got - want) <= tol * std::max(1.0, std::abs(want)))) {
      ADD_FAILURE() << dtype_name(t) << " " << reduce_op_name(op) << " n=" << n << where
                    << " element " << i << ": " << got << ", want " << want
                    << (tol == 0 ? "" : " within " + std::to_string(tol) + " relative");
      return false;
    }
  }
  return true;
}

void check_allreduce(Ranks& ranks, DType t, ReduceOp op, size_t count) {
  const int n = ranks.size();
  std::vector<std::vector<std::byte>> data(n);
  for (int r = 0; r < n; ++r) data[r] = rank_data(t, r, count);
  ranks.run([&](int r) {
    auto s = ranks.group(r).allreduce(data[r], t, op);
    ASSERT_TRUE(s.ok()) << s.message;
  });
  for (int r = 0; r < n; ++r) {
    // Every rank holds bit-identical results (reductions in rank order).
    ASSERT_EQ(data[r], data[0]) << dtype_name(t) << " " << reduce_op_name(op) << " n=" << n
                                << " count=" << count << ": rank " << r << " differs from rank 0";
  }
  matches_reference(t, op, n, data[0].data(), 0, count, "");
}

// Reduce-scatter of rank_data over every rank of `ranks`: each rank's chunk must equal the
// reference, element by element (exact for integers, within tolerance() for floats).
void check_reduce_scatter(Ranks& ranks, DType t, ReduceOp op, size_t count) {
  const int n = ranks.size();
  const size_t es = dtype_size(t);
  std::vector<std::vector<std::byte>> in(n), chunk(n);
  for (int r = 0; r < n; ++r) {
    in[r] = rank_data(t, r, count);
    auto [first, last] = Group::chunk_range(count, r, n);
    chunk[r].resize((last - first) * es);
  }
  ranks.run([&](int r) {
    auto s = ranks.group(r).reduce_scatter(in[r], chunk[r], t, op);
    ASSERT_TRUE(s.ok()) << s.message;
  });
  for (int r = 0; r < n; ++r) {
    auto [first, last] = Group::chunk_range(count, r, n);
    const std::string where = " count=" + std::to_string(count) + " rank " + std::to_string(r);
    if (!matches_reference(t, op, n, chunk[r].data(), first, last, where)) return;
  }
}

// Broadcast of `count` elements of `t` from every root in turn (or from `only_root`): every rank
// ends with the root's bytes.
void check_broadcast(Ranks& ranks, DType t, size_t count, int only_root = -1) {
  const int n = ranks.size();
  for (int root = 0; root < n; ++root) {
    if (only_root >= 0 && root != only_root) continue;
    std::vector<std::vector<std::byte>> data(n);
    for (int r = 0; r < n; ++r) data[r] = rank_data(t, r, count);
    const auto want = rank_data(t, root, count);
    ranks.run([&](int r) {
      auto s = ranks.group(r).broadcast(data[r], root);
      ASSERT_TRUE(s.ok()) << s.message;
    });
    for (int r = 0; r < n; ++r) {
      ASSERT_EQ(data[r], want) << dtype_name(t) << " n=" << n << " count=" << count << " root "
                               << root << ": rank " << r << " differs";
    }
  }
}

// Allgather of `count` elements of `t` per rank: every rank ends with all ranks' inputs, in rank
// order.
void check_allgather(Ranks& ranks, DType t, size_t count) {
  const int n = ranks.size();
  std::vector<std::vector<std::byte>> in(n), out(n);
  for (int r = 0; r < n; ++r) {
    in[r] = rank_data(t, r, count);
    out[r].resize(in[r].size() * n);
  }
  ranks.run([&](int r) {
    auto s = ranks.group(r).allgather(in[r], out[r]);
    ASSERT_TRUE(s.ok()) << s.message;
  });
  for (int r = 0; r < n; ++r) {
    for (int q = 0; q < n; ++q) {
      ASSERT_EQ(0, std::memcmp(out[r].data() + q * in[q].size(), in[q].data(), in[q].size()))
          << dtype_name(t) << " n=" << n << " count=" << count << ": rank " << r
          << " holds a wrong block from rank " << q;
    }
  }
}

class Collective : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override { FERRY_REQUIRE_TEST_HOST(); }
};

TEST_P(Collective, AllreduceEveryOpAndDtypeAndSize) {
  Ranks ranks(GetParam());
  // One element, fewer elements than ranks, odd counts, and sizes on both sides of the
  // doubling threshold (128 KiB: recursive doubling below, halving or the exchange above; 40009
  // elements are 40 KB to 320 KB by dtype).
  for (size_t count : {size_t{1}, size_t{3}, size_t{1001}, size_t{40009}}) {
    for (DType t : kDtypes) {
      for (ReduceOp op : kOps) check_allreduce(ranks, t, op, count);
    }
  }
}

// Large enough that recursive halving (a power-of-two group) reduces its first step as the
// bytes arrive over TCP (from a 1 MiB half: FetchOptions::combine), with odd counts, so that
// elements of 2, 4 and 8 bytes straddle the pieces the data channel reads.
TEST_P(Collective, AllreduceOfMiBsEveryDtypeReducedAsItArrives) {
  Ranks ranks(GetParam());
  for (DType t : kDtypes) {
    const size_t count = (3u << 20) / dtype_size(t) + 7;
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) check_allreduce(ranks, t, op, count);
  }
}

// Calls from GroupOptions::busy_wait_below do not poll: the io threads (two per Context here)
// move the bytes and reduce the first halving step as it lands while the calling thread sleeps
// and reduces the rest. The default polls throughout on a machine with fewer than 2 cores per
// rank (this one), so the threshold is set: every collective, the ring included, over that path,
// and a small call after each large one (it polls again, and finds the io threads running).
TEST_P(Collective, CallsOfMiBsMovedByTheIoThreadsMatchTheReference) {
  collective::GroupOptions options;
  options.busy_wait_below = 1u << 20;
  options.ring_threshold = 8u << 20;
  Ranks ranks(GetParam(), options, /*io_threads=*/2);
  for (DType t : {DType::kFloat32, DType::kBFloat16, DType::kInt64}) {
    const size_t count = (3u << 20) / dtype_size(t) + 7;
    check_allreduce(ranks, t, ReduceOp::kSum, count);
    check_allreduce(ranks, t, ReduceOp::kMax, 5);
  }
  check_allreduce(ranks, DType::kFloat32, ReduceOp::kSum, (9u << 20) / 4 + 1);  // the ring
  check_reduce_scatter(ranks, DType::kFloat64, ReduceOp::kSum, (2u << 20) / 8 * GetParam() + 3);
  check_broadcast(ranks, DType::kInt32, (2u << 20) / 4 + 1, /*only_root=*/GetParam() - 1);
  check_allgather(ranks, DType::kFloat32, (1u << 20) / 4 + 1);
}

// Rank r gets its chunk of the allreduce: every op and dtype, on both sides of the direct
// threshold (and the ring, below).
TEST_P(Collective, ReduceScatterEveryOpAndDtypeAndSize) {
  Ranks ranks(GetParam());
  for (size_t count : {size_t{1}, size_t{3}, size_t{1001}, size_t{40009}}) {
    for (DType t : kDtypes) {
      for (ReduceOp op : kOps) check_reduce_scatter(ranks, t, op, count);
    }
  }
}

// Broadcast (from every root) and allgather move bytes, not values; every dtype still, for
// element sizes of 2, 4 and 8 bytes at counts that do not divide by N.
TEST_P(Collective, BroadcastAndAllgatherEveryDtypeAndSize) {
  Ranks ranks(GetParam());
  for (size_t count : {size_t{1}, size_t{5}, size_t{1001}, size_t{100003}}) {
    for (DType t : kDtypes) {
      check_broadcast(ranks, t, count);
      check_allgather(ranks, t, count);
    }
  }
}

// The ring pipelined in many small segments (4 KiB, odd sizes that split unevenly), so segments
// of one step are in flight while others are reduced and passed on: allreduce and
// reduce-scatter still match the reference, on every rank.
TEST_P(Collective, RingInManySegmentsMatchesTheReference) {
  collective::GroupOptions o;
  o.doubling_threshold = 1024;
  o.ring_threshold = 2048;
  o.segment_bytes = 4096;
  Ranks ranks(GetParam(), o);
  for (size_t count : {size_t{300}, size_t{40009}}) {
    for (DType t : kDtypes) {
      for (ReduceOp op : kOps) {
        check_allreduce(ranks, t, op, count);
        check_reduce_scatter(ranks, t, op, count);
      }
    }
  }
}

// A call returns only once the store has collected everything it offered: the caller may free
// or reuse the memory at once. (A peer's lease can outlive the closing barrier by a moment;
// memory freed then and reallocated at the same address could be served through the old,
// stale registration.)
TEST_P(Collective, OffersAreCollectedWhenACallReturns) {
  collective::GroupOptions o;
  o.doubling_threshold = 1024;
  o.ring_threshold = 100000;
  Ranks ranks(GetParam(), o);
  const int n = ranks.size();
  for (size_t count :
       {size_t{100}, size_t{5000}, size_t{50000}}) {  // doubling, halving/exchange, ring
    std::vector<std::vector<std::byte>> data(n);
    for (int r = 0; r < n; ++r) data[r] = rank_data(DType::kFloat64, r, count);
    ranks.run([&](int r) {
      auto s = ranks.group(r).allreduce(data[r], DType::kFloat64, ReduceOp::kSum);
      ASSERT_TRUE(s.ok()) << s.message;
      // What is left in this rank's store: the join marker only.
      EXPECT_LE(ranks.context(r).refs().size(), 1u) << "rank " << r;
    });
  }
}

// Queue pairs broken while READs are in flight (every queue pair of rank 1, 100 ms into each
// call): the fetches that fail while their peer's connection lives are fetched again over a
// new queue pair, and the results are still exact; an owner whose serve ended with its queue pair
// still counts it as sent when the fetcher's release says the READs succeeded (PeerLink::settle;
// without it the owner waits out its deadline). Recursive halving, then the ring; a call whose
// break met no fetch in flight (it can end first) is made again, up to 5 times, the break
// sooner each time.
TEST(CollectiveFaults, FetchesOverABrokenQueuePairAreFetchedAgain) {
  FERRY_REQUIRE_TEST_HOST();
  if (test_transport() != "RDMA") {
    GTEST_SKIP() << "SKIPPED: breaks queue pairs: RDMA only (runs in the soft-RoCE guest)";
  }
  collective::GroupOptions o;
  o.ring_threshold = 2u << 20;
  Ranks ranks(4, o);
  auto refetches = [&] {
    uint64_t n = 0;
    for (int r = 0; r < ranks.size(); ++r) n += ranks.group(r).refetches();
    return n;
  };
  for (size_t count : {size_t{1} << 17, size_t{1} << 18}) {  // int64: 1 MiB halving, 2 MiB ring
    const uint64_t before = refetches();
    for (int attempt = 0; attempt < 5 && refetches() == before; ++attempt) {
      std::atomic<bool> running{true};
      std::thread breaker([&, delay = std::chrono::milliseconds(100 >> attempt)] {
        std::this_thread::sleep_for(delay);
        if (running) rdma::inject_queue_pair_errors(ranks.context(1));
      });
      check_allreduce(ranks, DType::kInt64, ReduceOp::kSum, count);
      running = false;
      breaker.join();
      if (HasFailure()) return;
    }
    std::printf("%zu elements: fetches started again: %llu\n", count,
                static_cast<unsigned long long>(refetches() - before));
    EXPECT_GT(refetches(), before)
        << "in 5 calls no fetch met a broken queue pair: the test did not test";
  }
}

// Empty tensors (a rank's empty gradient bucket, say): every collective completes at once on
// every rank, with nothing to move, for a power-of-two group and one that folds.
TEST(CollectiveEmpty, EveryCollectiveOfNothingCompletesAtOnce) {
  FERRY_REQUIRE_TEST_HOST();
  for (int n : {3, 4}) {
    collective::GroupOptions o;
    o.timeout = std::chrono::seconds(60);  // completion must come long before this
    Ranks ranks(n, o);
    std::vector<std::chrono::steady_clock::duration> took(n);
    ranks.run([&](int r) {
      Group& g = ranks.group(r);
      std::vector<std::byte> none;
      const auto t0 = std::chrono::steady_clock::now();
      auto s = g.allreduce(none, DType::kFloat32, ReduceOp::kSum);
      ASSERT_TRUE(s.ok()) << "allreduce, n=" << n << ": " << s.message;
      s = g.broadcast(none, 0);
      ASSERT_TRUE(s.ok()) << "broadcast, n=" << n << ": " << s.message;
      s = g.allgather(none, none);
      ASSERT_TRUE(s.ok()) << "allgather, n=" << n << ": " << s.message;
      s = g.reduce_scatter(none, none, DType::kFloat32, ReduceOp::kSum);
      ASSERT_TRUE(s.ok()) << "reduce_scatter, n=" << n << ": " << s.message;
      took[r] = std::chrono::steady_clock::now() - t0;
    });
    for (int r = 0; r < n; ++r) {
      EXPECT_LT(took[r], scaled(std::chrono::seconds(5))) << "n=" << n << " rank " << r;
    }
  }
}

// Recursive doubling for group sizes that are not a power of two: 5, 6 and 7 ranks fold 1, 2 and
// 3 of them into a partner before the doubling and get the result back after it (3 ranks, in
// the suite above, fold one). Every op and dtype, bit-identical on every rank.
TEST(CollectiveDoubling, RanksBeyondAPowerOfTwoFoldIntoAPartner) {
  FERRY_REQUIRE_TEST_HOST();
  for (int n : {5, 6, 7}) {
    Ranks ranks(n);
    for (size_t count : {size_t{1}, size_t{3}, size_t{1001}}) {
      for (DType t : kDtypes) {
        for (ReduceOp op : kOps) check_allreduce(ranks, t, op, count);
      }
    }
  }
}

// Call::sent: false while the rank an offer is for has not fetched it, true once it has been sent
// (and for a tag with no offer). Recursive doubling writes its last step into the offered tensor
// before finish() on this alone. One thread plays both ranks, so the calls do not poll: both
// contexts' io threads run them.
TEST(CollectiveCall, AnOfferIsSentOnlyOnceItsRankHasFetchedIt) {
  FERRY_REQUIRE_TEST_HOST();
  collective::GroupOptions o;
  o.busy_wait = false;
  Ranks ranks(2, o);
  std::vector<std::byte> mine(4096, std::byte{7}), theirs(4096);
  collective::Call owner(ranks.group(0), "test", mine.size());
  collective::Call fetcher(ranks.group(1), "test", mine.size());
  ASSERT_TRUE(owner.offer("x", mine, {1}).ok());
  EXPECT_TRUE(owner.sent("y"));
  EXPECT_FALSE(owner.sent("x"));
  fetcher.take(0, "x", theirs);
  ASSERT_TRUE(fetcher.wait(0).ok());
  EXPECT_EQ(theirs, mine);
  // Sent once the owner's write (or the fetcher's release) has completed: a moment after.
  EXPECT_TRUE(eventually([&] { return owner.sent("x"); }, std::chrono::seconds(10)));
  EXPECT_TRUE(fetcher.finish().ok());
  EXPECT_TRUE(owner.finish().ok());
}

INSTANTIATE_TEST_SUITE_P(Ranks, Collective, ::testing::Values(2, 3, 4, 8),
                         [](const auto& info) { return "N" + std::to_string(info.param); });

// The declarative form (a driver, refs in the ranks' stores, results as refs) runs the same
// engine: its results are byte-identical to the imperative calls on the same data.
TEST(CollectiveDeclarative, ResultsAreIdenticalToTheImperativeCalls) {
  FERRY_REQUIRE_TEST_HOST();
  const int n = 3;
  Ranks ranks(n);
  const size_t count = 20011;  // odd, above the direct threshold as float32
  std::vector<std::vector<std::byte>> input(n);
  for (int r = 0; r < n; ++r) input[r] = rank_data(DType::kFloat32, r, count);
  // Imperative, on copies.
  std::vector<std::vector<std::byte>> reduced = input, gathered(n), scattered(n), bcast(n);
  ranks.run([&](int r) {
    ASSERT_TRUE(ranks.group(r).allreduce(reduced[r], DType::kFloat32, ReduceOp::kMax).ok());
    gathered[r].resize(input[r].size() * n);
    ASSERT_TRUE(ranks.group(r).allgather(input[r], gathered[r]).ok());
    auto [first, last] = Group::chunk_range(count, r, n);
    scattered[r].resize((last - first) * 4);
    ASSERT_TRUE(ranks.group(r)
                    .reduce_scatter(input[r], scattered[r], DType::kFloat32, ReduceOp::kSum)
                    .ok());
    bcast[r] = input[r];
    ASSERT_TRUE(ranks.group(r).broadcast(bcast[r], 1).ok());
  });
  // Declarative: the inputs are objects in the ranks' stores; a driver submits.
  Context driver_ctx(client_options("driver"));
  auto port = driver_ctx.listen(test_host() + ":0");
  ASSERT_TRUE(port.ok());
  const std::string driver_address = test_host() + ":" + std::to_string(*port);
  std::vector<ObjectRef> refs;
  std::vector<std::string> addresses;
  for (int r = 0; r < n; ++r) {
    auto bytes = std::make_shared<std::vector<std::byte>>(input[r]);
    auto ref = ranks.context(r).put({Tensor::bytes(*bytes)}, bytes);
    ASSERT_TRUE(ref.ok());
    refs.push_back(*ref);
    addresses.push_back(ranks.context(r).address());
  }
  std::vector<std::unique_ptr<collective::Service>> services;
  for (int r = 0; r < n; ++r) {
    services.push_back(
        std::make_unique<collective::Service>(ranks.context(r), ranks.group(r), driver_address));
  }
  auto driver = collective::Driver::create(driver_ctx, addresses);
  ASSERT_TRUE(driver.ok());
  auto d = std::move(*driver);
  auto fetch_all = [&](const collective::Submitted& s) {
    EXPECT_EQ(s.done.wait_for(std::chrono::seconds(120)), std::future_status::ready);
    auto status = s.done.get();
    EXPECT_TRUE(status.ok()) << status.message;
    std::vector<std::vector<std::byte>> out(n);
    for (int r = 0; r < n; ++r) {
      auto peer = connect_or_fail(driver_ctx, addresses[r]);
      auto req = peer.fetch(s.results[r]);
      const auto ec = req.wait(std::chrono::seconds(60));
      EXPECT_FALSE(ec) << "rank " << r << ": " << ec.message();
      if (req.done() && !req.wait(std::chrono::milliseconds(0))) {
        auto t = req.result().tensors.at(0);
        out[r].assign(t.begin(), t.end());
      }
    }
    return out;
  };
  auto ar = d->allreduce(refs, DType::kFloat32, ReduceOp::kMax);
  auto ag = d->allgather(refs);
  auto rs = d->reduce_scatter(refs, DType::kFloat32, ReduceOp::kSum);
  auto bc = d->broadcast(refs, 1);
  EXPECT_EQ(fetch_all(ar), reduced);
  EXPECT_EQ(fetch_all(ag), gathered);
  EXPECT_EQ(fetch_all(rs), scattered);
  EXPECT_EQ(fetch_all(bc), bcast);
  // Every rank has reported the last command done, so it and every command before it were
  // fetched: the driver keeps none of them (a long-running driver does not grow).
  EXPECT_TRUE(driver_ctx.refs().empty()) << driver_ctx.refs().size() << " commands still offered";
  // The inputs are untouched; released results are gone from the ranks' stores.
  for (int r = 0; r < n; ++r) {
    auto req = connect_or_fail(driver_ctx, addresses[r]).fetch(refs[r]);
    ASSERT_FALSE(req.wait(std::chrono::seconds(30)));
    EXPECT_TRUE(same_bytes(req.result().tensors[0], input[r]));
  }
  const size_t before = ranks.context(0).refs().size();
  d->release(ar);
  for (int i = 0; i < 400 && ranks.context(0).refs().size() >= before; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_LT(ranks.context(0).refs().size(), before) << "the released result is still stored";
  services.clear();
}

// A driver given fewer refs than ranks, a root that is not a rank, a dtype the reductions do not
// cover or an object that is not whole elements of it, fails the submission at once with
// invalid_argument and sends nothing (it indexed past the refs before; the ranks refused the
// rest one by one).
TEST(CollectiveDeclarative, RefsThatDoNotMatchTheRanksAreRefusedAtOnce) {
  FERRY_REQUIRE_TEST_HOST();
  Ranks ranks(2);
  Context driver_ctx(client_options("driver"));
  ASSERT_TRUE(driver_ctx.listen(test_host() + ":0").ok());
  std::vector<std::string> addresses{ranks.context(0).address(), ranks.context(1).address()};
  auto driver = collective::Driver::create(driver_ctx, addresses);
  ASSERT_TRUE(driver.ok());
  auto bytes = std::make_shared<std::vector<std::byte>>(64);
  auto ref = ranks.context(0).put({Tensor::bytes(*bytes)}, bytes);
  ASSERT_TRUE(ref.ok());
  auto six = std::make_shared<std::vector<std::byte>>(6);  // not whole float32s
  auto odd = ranks.context(1).put({Tensor::bytes(*six)}, six);
  ASSERT_TRUE(odd.ok());
  const auto offered = driver_ctx.refs().size();
  for (auto s :
       {(*driver)->allreduce({*ref}, DType::kFloat32, collective::ReduceOp::kSum),
        (*driver)->allreduce({*ref, *ref}, DType::kBool, collective::ReduceOp::kSum),
        (*driver)->allreduce({*ref, *odd}, DType::kFloat32, collective::ReduceOp::kSum),
        (*driver)->reduce_scatter({*odd, *odd}, DType::kFloat32, collective::ReduceOp::kSum),
        (*driver)->allgather({}), (*driver)->broadcast({*ref, *ref}, 2),
        (*driver)->broadcast({*ref, *ref}, -1),
        (*driver)->reduce_scatter({*ref, *ref, *ref}, DType::kInt32, collective::ReduceOp::kMax)}) {
    ASSERT_EQ(s.done.wait_for(std::chrono::seconds(0)), std::future_status::ready);
    const auto status = s.done.get();
    EXPECT_EQ(status.ec, errc::invalid_argument) << status.message;
    EXPECT_TRUE(s.results.empty());
  }
  EXPECT_EQ(driver_ctx.refs().size(), offered) << "a refused submission offered a command";
}

// A command one rank cannot run (its input is gone from its store) fails the Group for every
// rank at once, naming that rank: the others' call must not wait for the deadline, nor pair with
// that rank's next command (which ran as their call before, and returned a mix of both commands'
// inputs as its result). The next command fails too: the Group has failed for good.
TEST(CollectiveDeclarative, ACommandOneRankCannotRunFailsTheGroupAtOnce) {
  FERRY_REQUIRE_TEST_HOST();
  const int n = 3;
  collective::GroupOptions o;
  o.timeout = std::chrono::seconds(60);  // the failure must come long before this
  Ranks ranks(n, o);
  Context driver_ctx(client_options("driver"));
  auto port = driver_ctx.listen(test_host() + ":0");
  ASSERT_TRUE(port.ok());
  std::vector<ObjectRef> good, bad;
  std::vector<std::string> addresses;
  for (int r = 0; r < n; ++r) {
    auto bytes = std::make_shared<std::vector<std::byte>>(rank_data(DType::kFloat32, r, 1000));
    auto ref = ranks.context(r).put({Tensor::bytes(*bytes)}, bytes);
    ASSERT_TRUE(ref.ok());
    good.push_back(*ref);
    addresses.push_back(ranks.context(r).address());
  }
  bad = good;
  auto gone = std::make_shared<std::vector<std::byte>>(4000);
  auto ref = ranks.context(2).put({Tensor::bytes(*gone)}, gone);
  ASSERT_TRUE(ref.ok());
  bad[2] = *ref;
  ranks.context(2).release(*ref);
  std::vector<std::unique_ptr<collective::Service>> services;
  for (int r = 0; r < n; ++r) {
    services.push_back(std::make_unique<collective::Service>(
        ranks.context(r), ranks.group(r), test_host() + ":" + std::to_string(*port)));
  }
  auto driver = collective::Driver::create(driver_ctx, addresses);
  ASSERT_TRUE(driver.ok());
  const auto t0 = std::chrono::steady_clock::now();
  auto first = (*driver)->allreduce(bad, DType::kFloat32, ReduceOp::kSum);
  auto second = (*driver)->allreduce(good, DType::kFloat32, ReduceOp::kSum);
  for (auto* s : {&first, &second}) {
    ASSERT_EQ(s->done.wait_for(scaled(std::chrono::seconds(30))), std::future_status::ready);
    const auto status = s->done.get();
    EXPECT_FALSE(status.ok()) << "a command ran on a Group one rank had left";
    // Rank 0 failed it too (the driver reports the first rank's failure): it did not complete
    // its call with rank 2's next command. Whom it names depends on which failure reached it
    // first (rank 2's marker, or rank 1's closed connection as rank 1 failed).
    EXPECT_EQ(status.message.rfind("rank 0 reports", 0), 0u) << status.message;
    EXPECT_GE(status.rank, 1) << status.message;
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, scaled(std::chrono::seconds(20)));
  services.clear();
}

// A Service waiting for its driver's next command (a long poll the driver holds for up to a
// second) stops at once when destroyed: its poll is aborted, not waited out.
TEST(CollectiveDeclarative, AnIdleServiceStopsAtOnce) {
  FERRY_REQUIRE_TEST_HOST();
  Ranks ranks(2);
  Context driver_ctx(client_options("driver"));
  auto port = driver_ctx.listen(test_host() + ":0");
  ASSERT_TRUE(port.ok());
  const std::string driver_address = test_host() + ":" + std::to_string(*port);
  auto service =
      std::make_unique<collective::Service>(ranks.context(0), ranks.group(0), driver_address);
  // Into its first long poll: no command is ever submitted.
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const auto start = std::chrono::steady_clock::now();
  service.reset();
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_LT(took, scaled(std::chrono::milliseconds(400)))
      << std::chrono::duration_cast<std::chrono::milliseconds>(took).count() << " ms";
}

// 64 MiB tensors (the ring in its default 512 KiB segments; the count does not divide by 4).
TEST(CollectiveLarge, EveryCollectiveOf64MiBOnFourRanks) {
  FERRY_REQUIRE_TEST_HOST();
  Ranks ranks(4);
  const size_t count = (64u << 20) / 4 - 3;
  check_allreduce(ranks, DType::kFloat32, ReduceOp::kSum, count);
  check_reduce_scatter(ranks, DType::kInt32, ReduceOp::kMax, count);
  check_broadcast(ranks, DType::kInt64, (64u << 20) / 8 - 1, /*only_root=*/2);
  check_allgather(ranks, DType::kFloat32, count / 4);  // 64 MiB gathered on every rank
}

// The algorithms' receive space comes from each rank's receive pool (registered memory over
// RDMA) and is kept across calls: a second call of the same size takes nothing new from it.
TEST(CollectivePool, ReceiveSpaceComesFromTheContextsPoolAndIsKept) {
  FERRY_REQUIRE_TEST_HOST();
  Ranks ranks(4);
  const size_t count = (4u << 20) / 4;
  check_allreduce(ranks, DType::kFloat32, ReduceOp::kSum, count);
  std::vector<PoolStats> after_first;
  for (int r = 0; r < ranks.size(); ++r) {
    after_first.push_back(ranks.context(r).pool_stats());
    // Halving's later steps land in scratch: at least a quarter of the tensor per rank.
    EXPECT_GE(after_first.back().in_use_bytes, count * 4 / 4) << "rank " << r;
  }
  check_allreduce(ranks, DType::kFloat32, ReduceOp::kSum, count);
  for (int r = 0; r < ranks.size(); ++r) {
    const auto now = ranks.context(r).pool_stats();
    EXPECT_EQ(now.hits + now.misses + now.fallbacks,
              after_first[r].hits + after_first[r].misses + after_first[r].fallbacks)
        << "rank " << r << " allocated receive space again";
  }
}

TEST(CollectiveJoin, AMissingRankIsNamedWithinTheDeadline) {
  FERRY_REQUIRE_TEST_HOST();
  Context a(client_options("a"));
  auto port = a.listen(test_host() + ":0");
  ASSERT_TRUE(port.ok());
  // Rank 1's address: a port nobody listens on.
  Context probe(client_options("probe"));
  auto dead = probe.listen(test_host() + ":0");
  ASSERT_TRUE(dead.ok());
  const std::string dead_address = test_host() + ":" + std::to_string(*dead);
  probe.close();
  collective::GroupOptions o;
  o.join_timeout = std::chrono::milliseconds(1500);
  Status why;
  const auto t0 = std::chrono::steady_clock::now();
  auto g = Group::join(a, {test_host() + ":" + std::to_string(*port), dead_address}, 0, o, &why);
  EXPECT_FALSE(g.ok());
  EXPECT_LT(std::chrono::steady_clock::now() - t0, scaled(std::chrono::seconds(10)));
  EXPECT_EQ(why.rank, 1);
  EXPECT_NE(why.message.find(dead_address), std::string::npos) << why.message;
}

// Rank 3 never joins an allreduce of `count` float32 (4 MiB: recursive halving) and dies; every
// other rank must fail well before the call's 60 s timeout, and one must name rank 3.
void check_a_dead_rank_fails_every_other(collective::GroupOptions o, size_t count = 1u << 20) {
  o.timeout = std::chrono::seconds(60);  // the failure must come long before this
  Ranks ranks(4, o);
  std::vector<std::vector<std::byte>> data(4);
  for (int r = 0; r < 4; ++r) data[r] = rank_data(DType::kFloat32, r, count);
  std::vector<Status> result(4);
  std::vector<std::chrono::steady_clock::duration> took(4);
  std::thread killer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    ranks.kill(3);  // rank 3 never joins the call, then dies
  });
  ranks.run([&](int r) {
    if (r == 3) return;
    const auto t0 = std::chrono::steady_clock::now();
    result[r] = ranks.group(r).allreduce(data[r], DType::kFloat32, ReduceOp::kSum);
    took[r] = std::chrono::steady_clock::now() - t0;
  });
  killer.join();
  bool named = false;
  for (int r = 0; r < 3; ++r) {
    EXPECT_FALSE(result[r].ok()) << "rank " << r << " finished an allreduce missing rank 3";
    EXPECT_LT(took[r], scaled(std::chrono::seconds(15)))
        << "rank " << r << ": " << result[r].message;
    named |= result[r].rank == 3;
    std::printf("rank %d: %s\n", r, result[r].message.c_str());
  }
  EXPECT_TRUE(named) << "no rank named the dead rank 3";
}

// A failed Group offers its fail marker (to the other ranks' watches), and the application may
// destroy the Group at once while a peer still holds or fetches a marker: the markers' byte must
// outlive the Group (it is owned with the store). Found by AddressSanitizer in CI, where a
// peer's fetch of a marker read a byte inside a freed Group. Here a third party holds every
// object rank 0's store lists (its join and fail markers), rank 0 destroys its failed Group, and
// the third party fetches them after: under ASan a read of freed memory aborts; in any build
// each byte must be the markers'.
TEST(CollectiveFailure, AFailedGroupsMarkersOutliveTheGroup) {
  FERRY_REQUIRE_TEST_HOST();
  Ranks ranks(2);
  ranks.run([&](int r) {  // sizes differ: both fail, and offer their fail markers
    auto data = rank_data(DType::kFloat32, r, 10 + static_cast<size_t>(r));
    EXPECT_FALSE(ranks.group(r).allreduce(data, DType::kFloat32, ReduceOp::kSum).ok());
  });
  Context third(client_options("third"));
  auto peer = connect_or_fail(third, ranks.address(0));
  auto refs = peer.list(10s);
  ASSERT_TRUE(refs.ok());
  ASSERT_GE(refs->size(), 2u) << "rank 0 offers no join and fail markers";
  for (const auto& ref : *refs) ASSERT_FALSE(peer.hold(ref, 10s));
  ranks.drop_group(0);
  for (const auto& ref : *refs) {
    std::byte got{0};
    auto req = peer.fetch(ref, {{&got, 1}});
    ASSERT_FALSE(req.wait(scaled(10s)));
    EXPECT_EQ(got, std::byte{1});
    EXPECT_FALSE(peer.release(ref, 10s));
  }
}

// A program may end right after its last collective. The ranks still in that call watch every
// rank (recursive halving, the ring), and the leaver's connections going away must not fail
// them: they need nothing more from it.
TEST(CollectiveLeave, RanksThatEndRightAfterTheirLastCallFailNoOne) {
  FERRY_REQUIRE_TEST_HOST();
  for (int round = 0; round < 6; ++round) {  // a race: more rounds, more chances to lose it
    collective::GroupOptions o;
    o.doubling_threshold = 64;  // recursive halving even for this small tensor
    Ranks ranks(8, o);
    const size_t count = 1000;
    std::vector<std::vector<std::byte>> data(ranks.size());
    for (int r = 0; r < ranks.size(); ++r) data[r] = rank_data(DType::kFloat32, r, count);
    std::vector<Status> got(ranks.size());
    ranks.run([&](int r) {
      got[r] = ranks.group(r).allreduce(data[r], DType::kFloat32, ReduceOp::kSum);
      if (r % 2) ranks.kill(r);  // odd ranks end their program at once
    });
    for (int r = 0; r < ranks.size(); ++r) {
      ASSERT_TRUE(got[r].ok()) << "round " << round << ": " << got[r].message;
      EXPECT_EQ(data[r], data[0]) << "round " << round << ": rank " << r;
    }
    matches_reference(DType::kFloat32, ReduceOp::kSum, ranks.size(), data[0].data(), 0, count,
                      " round " + std::to_string(round));
  }
}

TEST(CollectiveFailure, ARankThatDiesFailsEveryOtherRankInBoundedTime) {
  FERRY_REQUIRE_TEST_HOST();
  check_a_dead_rank_fails_every_other({});
}

// Recursive doubling (a small tensor), where rank 0 fetches only from ranks 1 and 2: it hears of
// rank 3's death from rank 2, through its fail marker.
TEST(CollectiveFailure, InRecursiveDoublingEveryRankFailsInBoundedTime) {
  FERRY_REQUIRE_TEST_HOST();
  check_a_dead_rank_fails_every_other({}, 1000);
}

// The ring, where ranks 1 and 2 fetch only from their left neighbours: the failure reaches them
// through the fail markers (rank 0 sees rank 3 die and offers its marker).
TEST(CollectiveFailure, InTheRingTheFailureCrossesTheGroupInOneHop) {
  FERRY_REQUIRE_TEST_HOST();
  collective::GroupOptions o;
  o.ring_threshold = 1u << 20;
  check_a_dead_rank_fails_every_other(o);
}

// Misuse: one rank calls with a tensor of another size, and late, so that the others have
// failed and withdrawn their offers before it fetches. Every rank's call fails at once, long
// before its deadline (the owner rejects a fetch whose sizes differ from its offer's; the
// watches carry a rank's failure to every other), one of them with size_mismatch naming the rank
// it fetched from (in a broadcast, the ranks that fetch only the root's matching bytes may
// finish); the Group then stays failed (its documented contract). For each path:
// allreduce by recursive doubling (3 ranks: one folded), by recursive halving, by the exchange (3
// ranks) and by the ring; broadcast, allgather, reduce-scatter.
TEST(CollectiveMisuse, RanksThatDisagreeOnTheSizeFailEveryRankAtOnce) {
  FERRY_REQUIRE_TEST_HOST();
  struct Case {
    const char* what;
    int n;
    size_t count;
    size_t ring_threshold;
  };
  for (const Case& c :
       {Case{"allreduce doubling", 4, 100, 128u << 20},
        Case{"allreduce doubling, folded", 3, 100, 128u << 20},
        Case{"allreduce halving", 4, 100000, 128u << 20},
        Case{"allreduce exchange", 3, 100000, 128u << 20}, Case{"allreduce ring", 4, 100000, 1024},
        Case{"broadcast", 4, 1000, 128u << 20}, Case{"allgather", 4, 1000, 128u << 20},
        Case{"reduce_scatter", 3, 100000, 128u << 20}}) {
    collective::GroupOptions o;
    o.timeout = std::chrono::seconds(60);  // the failure must come long before this
    o.ring_threshold = c.ring_threshold;
    Ranks ranks(c.n, o);
    const std::string what = c.what;
    std::vector<Status> got(c.n);
    std::vector<std::chrono::steady_clock::duration> took(c.n);
    ranks.run([&](int r) {
      const bool odd = r == c.n - 1;
      if (odd) std::this_thread::sleep_for(std::chrono::milliseconds(300));
      auto data = rank_data(DType::kFloat32, r, c.count + (odd ? 3 : 0));
      const auto t0 = std::chrono::steady_clock::now();
      Group& g = ranks.group(r);
      if (what == "broadcast") {
        got[r] = g.broadcast(data, 0);
      } else if (what == "allgather") {
        std::vector<std::byte> out(data.size() * c.n);
        got[r] = g.allgather(data, out);
      } else if (what == "reduce_scatter") {
        auto [first, last] = Group::chunk_range(c.count + (odd ? 3 : 0), r, c.n);
        std::vector<std::byte> out((last - first) * sizeof(float));
        got[r] = g.reduce_scatter(data, out, DType::kFloat32, ReduceOp::kSum);
      } else {
        got[r] = g.allreduce(data, DType::kFloat32, ReduceOp::kSum);
      }
      took[r] = std::chrono::steady_clock::now() - t0;
    });
    bool mismatch_named = false;
    for (int r = 0; r < c.n; ++r) {
      // In a broadcast the ranks other than the root and the odd one fetch the root's bytes,
      // which match their size: they may finish (correctly) before the odd rank has started.
      if (what == "broadcast" && r != 0 && r != c.n - 1 && got[r].ok()) continue;
      EXPECT_FALSE(got[r].ok()) << what << ": rank " << r << " finished a mismatched call";
      // (Bounded loosely for the emulated RDMA guest, where the call opens the channels.)
      EXPECT_LT(took[r], scaled(std::chrono::seconds(20)))
          << what << ": rank " << r << ": " << got[r].message;
      EXPECT_GE(got[r].rank, 0) << what << ": rank " << r << " names no rank: " << got[r].message;
      mismatch_named |= got[r].ec == errc::size_mismatch && got[r].rank >= 0 &&
                        got[r].message.find("same size") != std::string::npos;
    }
    EXPECT_TRUE(mismatch_named) << what << ": no rank reported size_mismatch";
    std::vector<std::byte> again = rank_data(DType::kFloat32, 0, 10);
    EXPECT_FALSE(ranks.group(0).allreduce(again, DType::kFloat32, ReduceOp::kSum).ok())
        << what << ": a failed Group ran another call";
  }
}

// Misuse: ranks in different collectives (rank 0 broadcasts, the others allreduce). Nothing they
// fetch is ever offered: every rank fails at its deadline (timed_out), or on hearing of a rank
// that did, and none hangs.
TEST(CollectiveMisuse, RanksInDifferentCollectivesFailByTheirDeadline) {
  FERRY_REQUIRE_TEST_HOST();
  collective::GroupOptions o;
  o.timeout = std::chrono::milliseconds(1500);
  Ranks ranks(4, o);
  std::vector<std::vector<std::byte>> data(4);
  for (int r = 0; r < 4; ++r) data[r] = rank_data(DType::kFloat32, r, 1000);
  std::vector<Status> got(4);
  std::vector<std::chrono::steady_clock::duration> took(4);
  ranks.run([&](int r) {
    const auto t0 = std::chrono::steady_clock::now();
    got[r] = r == 0 ? ranks.group(r).broadcast(data[r], 0)
                    : ranks.group(r).allreduce(data[r], DType::kFloat32, ReduceOp::kSum);
    took[r] = std::chrono::steady_clock::now() - t0;
  });
  bool timed_out = false;
  for (int r = 0; r < 4; ++r) {
    EXPECT_FALSE(got[r].ok()) << "rank " << r << " finished a mismatched call";
    timed_out |= got[r].ec == errc::timed_out;
    EXPECT_GE(took[r], std::chrono::milliseconds(1400)) << "rank " << r << ": " << got[r].message;
    EXPECT_LT(took[r], scaled(std::chrono::seconds(20))) << "rank " << r << ": " << got[r].message;
    EXPECT_GE(got[r].rank, 0) << "rank " << r << " names no rank: " << got[r].message;
  }
  EXPECT_TRUE(timed_out) << "no rank reached its deadline";
}

}  // namespace
}  // namespace ferry::test
