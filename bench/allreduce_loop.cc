#include "bench/allreduce_loop.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "bench/measure.h"

namespace ferry::bench {
namespace {

// Rank r's element i, and the sum over n ranks: small integers, exact in float32 in any order.
float value(int rank, size_t i) { return static_cast<float>(rank + 1 + static_cast<int>(i & 7)); }
float expected(int n, size_t i) {
  return static_cast<float>(n * (n + 1) / 2 + n * static_cast<int>(i & 7));
}

// What a rank puts in and what every rank must get back, for one size: computed once, so that
// each call's fill is a copy and its check a comparison (memcpy, memcmp: vectorised). Computed
// per call, they took a third of the machine's CPU at 1 MiB (the check's loop, which stops at
// the first mismatch, does not vectorise): untimed work that held up the ranks sharing a core.
struct Pattern {
  std::vector<float> in, out;
  Pattern(size_t count, int rank, int n) : in(count), out(count) {
    for (size_t i = 0; i < count; ++i) {
      in[i] = value(rank, i);
      out[i] = expected(n, i);
    }
  }
  void fill(std::span<float> data) const { std::memcpy(data.data(), in.data(), data.size_bytes()); }
  // The first wrong element, or -1. Bit for bit: every sum is a small integer, exact in float32.
  long long first_wrong(std::span<const float> data) const {
    const auto got = std::as_bytes(data);
    if (std::memcmp(got.data(), out.data(), got.size()) == 0) return -1;
    const auto want = std::as_bytes(std::span(out));
    const auto at = std::mismatch(got.begin(), got.end(), want.begin()).first - got.begin();
    return static_cast<long long>(at / sizeof(float));
  }
};

std::string json_array(const std::vector<double>& v) {
  std::string out = "[";
  char buf[32];
  for (size_t i = 0; i < v.size(); ++i) {
    std::snprintf(buf, sizeof buf, "%s%.9g", i ? "," : "", v[i]);
    out += buf;
  }
  return out + "]";
}

}  // namespace

int run_allreduce_loop(const AllreduceLoopArgs& args, const AllreduceOps& ops) {
  if (args.sizes.empty() || args.reps < 1 || args.ranks < 1) {
    std::fprintf(stderr, "%s allreduce: bad sizes, reps or ranks\n", args.tool.c_str());
    return 2;
  }
  uint64_t largest = 0;
  for (uint64_t s : args.sizes) {
    if (s % sizeof(float)) {
      std::fprintf(stderr, "%s allreduce: size %llu is not whole float32 elements\n",
                   args.tool.c_str(), static_cast<unsigned long long>(s));
      return 2;
    }
    largest = std::max(largest, s);
  }
  std::vector<float> buffer(largest / sizeof(float));
  const int n = args.ranks;
  const double bus_factor = n > 1 ? 2.0 * (n - 1) / n : 0.0;

  for (uint64_t size : args.sizes) {
    std::span<float> data(buffer.data(), size / sizeof(float));
    const Pattern pattern(data.size(), args.rank, n);
    // One call: fill, (barrier,) allreduce, check. Returns the seconds of the allreduce, or -1.
    auto one = [&]() -> double {
      pattern.fill(data);
      if (auto e = ops.barrier(); !e.empty()) {
        std::fprintf(stderr, "%s rank %d: barrier: %s\n", args.tool.c_str(), args.rank, e.c_str());
        return -1;
      }
      const auto t0 = Clock::now();
      auto e = ops.allreduce(data);
      const double secs = seconds_between(t0, Clock::now());
      if (!e.empty()) {
        std::fprintf(stderr, "%s rank %d: allreduce of %llu B: %s\n", args.tool.c_str(), args.rank,
                     static_cast<unsigned long long>(size), e.c_str());
        return -1;
      }
      if (auto i = pattern.first_wrong(data); i >= 0) {
        std::fprintf(stderr, "%s rank %d: allreduce of %llu B: element %lld is %g, not %g\n",
                     args.tool.c_str(), args.rank, static_cast<unsigned long long>(size), i,
                     static_cast<double>(data[i]), static_cast<double>(pattern.out[i]));
        return -1;
      }
      return secs;
    };
    for (int w = 0; w < args.warmup; ++w) {
      if (one() < 0) return 1;
    }
    std::vector<double> samples;
    for (int r = 0; r < args.reps; ++r) {
      const double s = one();
      if (s < 0) return 1;
      samples.push_back(s);
    }
    if (args.rank != 0) continue;
    std::vector<double> sorted = samples;
    const double median = quantile(sorted, 0.5);
    const double algbw = static_cast<double>(size) / median / 1e9;
    JsonLine out;
    out.add("tool", args.tool)
        .add("bench", "allreduce")
        .add("ranks", n)
        .add("size", size)
        .add("dtype", "float32")
        .add("op", "sum")
        .add("reps", args.reps)
        .add("warmup", args.warmup)
        .add("median_s", median)
        .add("min_s", sorted.front())
        .add("max_s", sorted.back())
        .add("algbw_gbps", algbw)
        .add("busbw_gbps", algbw * bus_factor)
        .add("verified", "every call")
        .add_raw("samples_s", json_array(samples));
    std::printf("%s\n", out.str().c_str());
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace ferry::bench
