#include "ferry/collective/algorithms/allgather_doubling.h"

#include <string>

namespace ferry::collective {

// After step k (d = 2^k) this rank holds the blocks of ranks [rank & ~(2d-1), +2d), contiguous
// in `out`; at step k it offers the d blocks it holds to rank ^ d and fetches that rank's d into
// place. An offered range is never written again in the call, and every fetch lands in a range
// not yet offered.
Status allgather_doubling(Call& call, std::span<const std::byte> in, std::span<std::byte> out) {
  const int rank = call.rank();
  const size_t first = call.taken();
  // The d = 2^k blocks rank q holds before step k, in place in `out`.
  const auto held = [&](int q, int d) {
    return out.subspan(static_cast<size_t>(q & ~(d - 1)) * in.size(), d * in.size());
  };
  for (int k = 0; (1 << k) < call.size(); ++k) {
    call.take(rank ^ (1 << k), "gd" + std::to_string(k), held(rank ^ (1 << k), 1 << k));
  }
  for (int k = 0; (1 << k) < call.size(); ++k) {
    if (auto s = call.offer("gd" + std::to_string(k), held(rank, 1 << k), {rank ^ (1 << k)}); !s) {
      return s;
    }
    if (auto s = call.wait(first + k); !s) return s;
  }
  call.forget(first);
  return call.finish();
}

}  // namespace ferry::collective
