#include "bench/reduce_bench.h"

#include <cstdio>
#include <cstring>
#include <functional>
#include <vector>

#include "bench/measure.h"
#include "collective/reduce.h"
#include "store/tensor.h"

namespace ferry::bench {
namespace {

// Runs `step` for `seconds`; bytes per second of `size`-byte steps.
double rate(uint64_t size, double seconds, const std::function<void()>& step) {
  const auto t0 = Clock::now();
  uint64_t steps = 0;
  double secs = 0;
  do {
    step();
    ++steps;
    secs = seconds_between(t0, Clock::now());
  } while (secs < seconds);
  return static_cast<double>(steps * size) / secs;
}

}  // namespace

int run_reduce(uint64_t size, double seconds) {
  std::vector<std::byte> acc(size), in(size);
  for (DType t : {DType::kFloat32, DType::kFloat64, DType::kInt32, DType::kInt64, DType::kFloat16,
                  DType::kBFloat16}) {
    const size_t esize = dtype_size(t);
    const size_t bytes = size / esize * esize;
    // Zeros: every sum stays zero, so no value turns into an infinity or a subnormal on the way.
    std::memset(acc.data(), 0, size);
    std::memset(in.data(), 0, size);
    const std::span<std::byte> a(acc.data(), bytes);
    const std::span<const std::byte> b(in.data(), bytes);
    const double bps = rate(bytes, seconds, [&] {
      (void)collective::reduce_into(t, collective::ReduceOp::kSum, a, b);
    });
    JsonLine out;
    out.add("tool", "ferry-reduce")
        .add("dtype", std::string(dtype_name(t)))
        .add("op", "sum")
        .add("size", static_cast<uint64_t>(bytes))
        .add("gbps", bps / 1e9);
    std::printf("%s\n", out.str().c_str());
  }
  const double bps = rate(size, seconds, [&] { std::memcpy(acc.data(), in.data(), size); });
  JsonLine out;
  out.add("tool", "memcpy").add("size", size).add("gbps", bps / 1e9);
  std::printf("%s\n", out.str().c_str());
  return 0;
}

}  // namespace ferry::bench
