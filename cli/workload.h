// Deterministic random objects for `ferry serve`: how many tensors, how large, which bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace ferry::cli {

// Bounds of `ferry serve`'s random objects (the command line checks them).
inline constexpr uint64_t kMaxObjects = 1000000;
inline constexpr uint64_t kMaxTensorsPerObject = 4096;
inline constexpr uint64_t kMaxPlannedTensors = 10000000;  // objects x tensors per object

struct WorkloadSpec {
  uint64_t objects = 0;
  uint64_t min_tensors = 1;
  uint64_t max_tensors = 3;
  uint64_t min_bytes = 4 << 10;
  uint64_t max_bytes = 64 << 20;
  uint64_t total_bytes = 0;  // 0 = no minimum total
  uint64_t seed = 1;
};

// Tensor sizes per object: tensor counts uniform in [min_tensors, max_tensors], sizes
// log-uniform in [min_bytes, max_bytes]. When the sizes add up to less than total_bytes they are
// scaled up (within max_bytes while possible, beyond it only when every tensor is at max_bytes)
// until the total is at least total_bytes. The same spec always gives the same plan.
std::vector<std::vector<uint64_t>> plan_workload(const WorkloadSpec& spec);

// Fills `out` with pseudo-random bytes determined by `seed` (wyrand; memory speed).
void fill_random(std::span<std::byte> out, uint64_t seed);

// A well-mixed 64-bit value derived from `a` and `b` (for per-tensor seeds).
uint64_t derive_seed(uint64_t a, uint64_t b);

}  // namespace ferry::cli
