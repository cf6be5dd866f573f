#include "cli/workload.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

namespace ferry::cli {
namespace {

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Uniform in [0, 1).
double uniform01(uint64_t& state) { return static_cast<double>(splitmix64(state) >> 11) * 0x1p-53; }

uint64_t total_of(const std::vector<std::vector<uint64_t>>& plan) {
  uint64_t total = 0;
  for (const auto& sizes : plan) total = std::accumulate(sizes.begin(), sizes.end(), total);
  return total;
}

// Scales the sizes up until they add up to at least `target`, keeping them within `cap` while
// any tensor is below it.
void scale_to(std::vector<std::vector<uint64_t>>& plan, uint64_t target, uint64_t cap) {
  for (int pass = 0; pass < 64 && total_of(plan) < target; ++pass) {
    uint64_t capped = 0, uncapped = 0;
    for (const auto& sizes : plan) {
      for (uint64_t s : sizes) (s >= cap ? capped : uncapped) += s;
    }
    const bool respect_cap = uncapped > 0;
    const double factor = respect_cap
                              ? static_cast<double>(target - capped) / static_cast<double>(uncapped)
                              : static_cast<double>(target) / static_cast<double>(capped);
    for (auto& sizes : plan) {
      for (auto& s : sizes) {
        if (respect_cap && s >= cap) continue;
        auto scaled = static_cast<uint64_t>(std::ceil(static_cast<double>(s) * factor));
        s = respect_cap ? std::min(scaled, cap) : scaled;
        if (s == 0) s = 1;
      }
    }
  }
}

}  // namespace

uint64_t derive_seed(uint64_t a, uint64_t b) {
  uint64_t state = a ^ (b * 0xd6e8feb86659fd93ull);
  return splitmix64(state);
}

std::vector<std::vector<uint64_t>> plan_workload(const WorkloadSpec& spec) {
  uint64_t state = spec.seed;
  const double log_min = std::log(static_cast<double>(std::max<uint64_t>(spec.min_bytes, 1)));
  const double log_max = std::log(static_cast<double>(std::max<uint64_t>(spec.max_bytes, 1)));
  std::vector<std::vector<uint64_t>> plan(spec.objects);
  for (auto& sizes : plan) {
    const uint64_t span = spec.max_tensors - spec.min_tensors + 1;
    sizes.resize(spec.min_tensors + splitmix64(state) % span);
    for (auto& s : sizes) {
      const double bytes = std::exp(log_min + uniform01(state) * (log_max - log_min));
      s = std::clamp(static_cast<uint64_t>(std::llround(bytes)), spec.min_bytes, spec.max_bytes);
    }
  }
  if (spec.total_bytes > 0 && total_of(plan) > 0) scale_to(plan, spec.total_bytes, spec.max_bytes);
  return plan;
}

void fill_random(std::span<std::byte> out, uint64_t seed) {
  std::byte* p = out.data();
  const size_t n = out.size();
  uint64_t state = seed;
  auto next = [&state] {
    state += 0xa0761d6478bd642full;
    const unsigned __int128 m =
        static_cast<unsigned __int128>(state) * (state ^ 0xe7037ed1a0b428dbull);
    return static_cast<uint64_t>(m >> 64) ^ static_cast<uint64_t>(m);
  };
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const uint64_t w = next();
    std::memcpy(p + i, &w, 8);
  }
  if (i < n) {
    const uint64_t w = next();
    std::memcpy(p + i, &w, n - i);
  }
}

}  // namespace ferry::cli
