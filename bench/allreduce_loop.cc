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

// A rank's input and every rank's expected output repeat every 8 elements: one block of each,
// copied over the tensor (fill) and compared with it (check) by memcpy and memcmp, which are
// vectorised, touch no memory beyond the block (64 KiB, cached) and the tensor, and keep the
// untimed work of each call small. Loops computing each element per call took a third of the
// machine's CPU at 1 MiB (the check, which stopped at the first mismatch, did not vectorise):
// a rank that had finished its call then held the core that a rank sharing it needed to finish.
class Pattern {
 public:
  Pattern(int rank, int n) : in_(kBlock), out_(kBlock) {
    for (size_t i = 0; i < kBlock; ++i) {
      in_[i] = value(rank, i);
      out_[i] = expected(n, i);
    }
  }
  void fill(std::span<float> data) const {
    for (size_t at = 0; at < data.size(); at += kBlock) {
      std::memcpy(data.data() + at, in_.data(), block_bytes(data, at));
    }
  }
  // The first wrong element, or -1. Bit for bit: every sum is a small integer, exact in float32.
  long long first_wrong(std::span<const float> data) const {
    for (size_t at = 0; at < data.size(); at += kBlock) {
      const size_t bytes = block_bytes(data, at);
      if (std::memcmp(data.data() + at, out_.data(), bytes) == 0) continue;
      const auto got = std::as_bytes(data.subspan(at));
      const auto want = std::as_bytes(std::span(out_));
      const auto byte = std::mismatch(got.begin(), got.begin() + bytes, want.begin()).first;
      return static_cast<long long>(at + (byte - got.begin()) / sizeof(float));
    }
    return -1;
  }

 private:
  static constexpr size_t kBlock = 16384;  // elements: a multiple of the period, 8
  static size_t block_bytes(std::span<const float> data, size_t at) {
    return std::min(kBlock, data.size() - at) * sizeof(float);
  }
  std::vector<float> in_, out_;
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
  const Pattern pattern(args.rank, n);
  const double bus_factor = n > 1 ? 2.0 * (n - 1) / n : 0.0;

  for (uint64_t size : args.sizes) {
    std::span<float> data(buffer.data(), size / sizeof(float));
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
                     static_cast<double>(data[i]), static_cast<double>(expected(n, i)));
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
