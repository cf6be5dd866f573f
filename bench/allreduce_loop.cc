#include "bench/allreduce_loop.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <sys/resource.h>

#include "bench/measure.h"

namespace ferry::bench {
namespace {

// Rank r's element i, and the sum over n ranks: small integers, exact in float32 in any order.
float value(int rank, size_t i) { return static_cast<float>(rank + 1 + static_cast<int>(i & 7)); }
float sum_of_inputs(int n, size_t i) {
  return static_cast<float>(n * (n + 1) / 2 + n * static_cast<int>(i & 7));
}

bool power_of_two(int n) { return n > 0 && (n & (n - 1)) == 0; }

// A rank's input and the expected outputs repeat every 8 elements: one block of each, copied
// over the tensor (fill) and compared with it (check) by memcpy and memcmp, which are
// vectorised, touch no memory beyond the blocks (64 KiB each, cached) and the tensor, and keep
// the untimed work small. (Loops computing each element took a third of the machine's CPU at
// 1 MiB: a rank that had finished held the core that a rank sharing it needed to finish.)
//
// After one call every element is the sum of the inputs; after `calls` back-to-back calls on
// the same tensor, that sum times n^(calls-1). With n a power of two every partial sum of every
// call has a few significant bits, so each is exact (any order) and the check is bit for bit;
// otherwise values pass 2^24 and each sum is rounded: each call's n-1 additions add at most
// (n-1) 2^-24 to an element's relative error, and the check allows twice what `calls` calls add.
class Pattern {
 public:
  Pattern(int rank, int n, int calls)
      : in_(kBlock),
        one_(kBlock),
        sample_(kBlock),
        tolerance_(power_of_two(n) ? 0.0f : 2.0f * static_cast<float>(calls * n) * 0x1p-24f) {
    float scale = 1;
    for (int c = 1; c < calls; ++c) scale *= static_cast<float>(n);
    for (size_t i = 0; i < kBlock; ++i) {
      in_[i] = value(rank, i);
      one_[i] = sum_of_inputs(n, i);
      sample_[i] = one_[i] * scale;
    }
  }
  void fill(std::span<float> data) const {
    for (size_t at = 0; at < data.size(); at += kBlock) {
      std::memcpy(data.data() + at, in_.data(), block_bytes(data, at));
    }
  }
  // The expected element i after one call, or after a sample's back-to-back calls.
  float expected(size_t i, bool sample) const { return want(sample)[i % kBlock]; }
  // The first wrong element, or -1.
  long long first_wrong(std::span<const float> data, bool sample) const {
    const auto& block = want(sample);
    for (size_t at = 0; at < data.size(); at += kBlock) {
      const size_t bytes = block_bytes(data, at);
      if (std::memcmp(data.data() + at, block.data(), bytes) == 0) continue;
      for (size_t i = 0; i < bytes / sizeof(float); ++i) {
        const float got = data[at + i], w = block[i];
        if (!(std::fabs(got - w) <= tolerance_ * std::fabs(w))) {
          return static_cast<long long>(at + i);
        }
      }
    }
    return -1;
  }

 private:
  static constexpr size_t kBlock = 16384;  // elements: a multiple of the period, 8
  const std::vector<float>& want(bool sample) const { return sample ? sample_ : one_; }
  static size_t block_bytes(std::span<const float> data, size_t at) {
    return std::min(kBlock, data.size() - at) * sizeof(float);
  }
  std::vector<float> in_, one_, sample_;
  float tolerance_;  // relative; 0: bit for bit
};

// What the whole process (every thread) has used so far: CPU seconds, user and system, and
// context switches, voluntary (it slept) and involuntary (it was preempted).
struct Usage {
  double cpu_s = 0, voluntary = 0, involuntary = 0;
  Usage& operator+=(const Usage& o) {
    cpu_s += o.cpu_s;
    voluntary += o.voluntary;
    involuntary += o.involuntary;
    return *this;
  }
  Usage operator-(const Usage& o) const {
    return {cpu_s - o.cpu_s, voluntary - o.voluntary, involuntary - o.involuntary};
  }
};
Usage usage_now() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  const auto secs = [](const timeval& t) {
    return static_cast<double>(t.tv_sec) + t.tv_usec * 1e-6;
  };
  return {secs(ru.ru_utime) + secs(ru.ru_stime), static_cast<double>(ru.ru_nvcsw),
          static_cast<double>(ru.ru_nivcsw)};
}

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
  const char* tool = args.tool.c_str();
  if (args.sizes.empty() || args.reps < 1 || args.ranks < 1 || args.calls < 1 ||
      args.calls > kMaxCallsPerSample || args.warmup < 0) {
    std::fprintf(stderr, "%s allreduce: bad sizes, reps, calls (1-%d), warmup or ranks\n", tool,
                 kMaxCallsPerSample);
    return 2;
  }
  const int n = args.ranks;
  if (std::pow(static_cast<double>(n), args.calls) * sum_of_inputs(n, 7) > 1e37) {
    std::fprintf(stderr, "%s allreduce: %d calls on %d ranks would overflow float32\n", tool,
                 args.calls, n);
    return 2;
  }
  uint64_t largest = 0;
  for (uint64_t s : args.sizes) {
    if (s % sizeof(float)) {
      std::fprintf(stderr, "%s allreduce: size %llu is not whole float32 elements\n", tool,
                   static_cast<unsigned long long>(s));
      return 2;
    }
    largest = std::max(largest, s);
  }
  std::vector<float> buffer(largest / sizeof(float));
  const Pattern pattern(args.rank, n, args.calls);
  const double bus_factor = n > 1 ? 2.0 * (n - 1) / n : 0.0;

  for (uint64_t size : args.sizes) {
    const auto bytes = static_cast<unsigned long long>(size);
    std::span<float> data(buffer.data(), size / sizeof(float));
    // What the timed calls of this size used, on this rank (Usage, summed over its samples).
    Usage used;
    // Fill, barrier, `calls` calls back to back, check. Returns this rank's seconds, or -1.
    auto run = [&](int calls) -> double {
      pattern.fill(data);
      if (auto e = ops.barrier(); !e.empty()) {
        std::fprintf(stderr, "%s rank %d: barrier: %s\n", tool, args.rank, e.c_str());
        return -1;
      }
      const Usage u0 = usage_now();
      const auto t0 = Clock::now();
      for (int c = 0; c < calls; ++c) {
        if (auto e = ops.allreduce(data); !e.empty()) {
          std::fprintf(stderr, "%s rank %d: allreduce of %llu B: %s\n", tool, args.rank, bytes,
                       e.c_str());
          return -1;
        }
      }
      const double secs = seconds_between(t0, Clock::now());
      const bool sample = calls > 1;
      if (sample) used += usage_now() - u0;
      if (auto i = pattern.first_wrong(data, sample); i >= 0) {
        std::fprintf(
            stderr, "%s rank %d: allreduce of %llu B, %d call(s): element %lld is %.9g, not %.9g\n",
            tool, args.rank, bytes, calls, i, static_cast<double>(data[i]),
            static_cast<double>(pattern.expected(i, sample)));
        return -1;
      }
      return secs;
    };
    for (int w = 0; w < args.warmup; ++w) {
      if (run(1) < 0) return 1;
    }
    std::vector<double> samples;
    for (int r = 0; r < args.reps; ++r) {
      const double secs = run(args.calls);
      if (secs < 0) return 1;
      // The mean over ranks (nccl-tests' default), by an allreduce of one float.
      std::vector<float> mean{static_cast<float>(secs)};
      if (auto e = ops.allreduce(mean); !e.empty()) {
        std::fprintf(stderr, "%s rank %d: allreduce of the times: %s\n", tool, args.rank,
                     e.c_str());
        return 1;
      }
      samples.push_back(static_cast<double>(mean[0]) / n / args.calls);
    }
    // Per call, the mean over ranks (one more allreduce, untimed): what each tool costs the
    // machine beside its time, and how often it sleeps.
    const double timed_calls = static_cast<double>(args.reps) * args.calls;
    std::vector<float> per_call{static_cast<float>(used.cpu_s / timed_calls),
                                static_cast<float>(used.voluntary / timed_calls),
                                static_cast<float>(used.involuntary / timed_calls)};
    if (auto e = ops.allreduce(per_call); !e.empty()) {
      std::fprintf(stderr, "%s rank %d: allreduce of the usage: %s\n", tool, args.rank, e.c_str());
      return 1;
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
        .add("calls", args.calls)
        .add("warmup", args.warmup)
        .add("timing", "back to back, mean over ranks")
        .add("median_s", median)
        .add("min_s", sorted.front())
        .add("max_s", sorted.back())
        .add("algbw_gbps", algbw)
        .add("busbw_gbps", algbw * bus_factor)
        .add("cpu_us_per_call", static_cast<double>(per_call[0]) / n * 1e6)
        .add("voluntary_switches_per_call", static_cast<double>(per_call[1]) / n)
        .add("involuntary_switches_per_call", static_cast<double>(per_call[2]) / n)
        .add("verified", "every warm-up call and every sample")
        .add_raw("samples_s", json_array(samples));
    std::printf("%s\n", out.str().c_str());
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace ferry::bench
