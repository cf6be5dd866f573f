#include "ferry/collective/algorithms/allreduce_halving.h"

#include <string>
#include <vector>

namespace ferry::collective {

// The reduce-scatter takes log2(N) steps: at each, this rank and its partner (rank ^ d, d = N/2,
// N/4, ..., 1) share a range of elements; each keeps one half, fetches the partner's copy of it
// and reduces it in place, and offers the other half to the partner. The allgather retraces the
// steps: each offers the range it holds, final, and fetches the partner's into place.
//
// Every fetch is posted at the start; a part not yet offered waits on its owner. Memory: a
// half offered at a reduce-scatter step is read only by that step's partner, and the allgather
// fills it only after the partner has finished its reduce-scatter, hence that read; a kept half
// is offered to no one while it is reduced. Each element's final value is computed by one rank,
// in a fixed order, so every rank gets the same bits.
Status allreduce_halving(Call& call, std::span<std::byte> data, DType dtype, ReduceOp op) {
  const size_t esize = dtype_size(dtype);
  const int rank = call.rank();
  struct Step {
    int partner;
    size_t keep_lo, keep_hi, give_lo, give_hi;  // elements
    size_t at;                                  // bytes into the scratch: the partner's kept half
  };
  std::vector<Step> steps;
  size_t lo = 0, hi = data.size() / esize, need = 0;
  for (int d = call.size() / 2; d >= 1; d /= 2) {
    const size_t mid = lo + (hi - lo) / 2;
    const bool upper = (rank & d) != 0;
    Step s{rank ^ d, upper ? mid : lo, upper ? hi : mid, upper ? lo : mid, upper ? mid : hi, need};
    need += (s.keep_hi - s.keep_lo) * esize;
    steps.push_back(s);
    lo = s.keep_lo;
    hi = s.keep_hi;
  }
  auto space = call.scratch(need);
  if (!space) return call.fail(-1, space.error(), "receive space");
  const auto range = [&](size_t a, size_t b) { return data.subspan(a * esize, (b - a) * esize); };
  const size_t k = steps.size();
  const size_t first = call.taken();
  // The first step's bytes are the first thing added to the kept half: over a transport that
  // streams them (TCP) they are reduced into it as they arrive, from a small buffer, never
  // landing whole, when that half is too large to stay in cache between landing and being
  // reduced (a smaller half stays in cache, and streaming would only cost more, smaller reads).
  // Later steps land in the scratch and are reduced after the step before, which keeps each
  // element's order of operations fixed.
  constexpr size_t kStreamReduceBytes = 1u << 20;
  const bool stream = call.combines_as_it_arrives(steps[0].partner) &&
                      (steps[0].keep_hi - steps[0].keep_lo) * esize >= kStreamReduceBytes;
  for (size_t i = 0; i < k; ++i) {
    const Step& s = steps[i];
    if (i == 0 && stream) {
      call.take(s.partner, "hr0", range(s.keep_lo, s.keep_hi), reducing_combine(dtype, op));
      continue;
    }
    call.take(s.partner, "hr" + std::to_string(i),
              space->subspan(s.at, (s.keep_hi - s.keep_lo) * esize));
  }
  for (size_t i = k; i-- > 0;) {
    call.take(steps[i].partner, "hg" + std::to_string(i),
              range(steps[i].give_lo, steps[i].give_hi));
  }
  for (size_t i = 0; i < k; ++i) {
    const Step& s = steps[i];
    if (auto st = call.offer("hr" + std::to_string(i), range(s.give_lo, s.give_hi), {s.partner});
        !st) {
      return st;
    }
    if (auto st = call.wait(first + i); !st) return st;
    if (i == 0 && stream) continue;  // reduced as it arrived
    const auto kept = range(s.keep_lo, s.keep_hi);
    if (auto ec = reduce_into(dtype, op, kept, space->subspan(s.at, kept.size()))) {
      return call.fail(-1, ec, "reduce");
    }
  }
  for (size_t i = k; i-- > 0;) {
    const Step& s = steps[i];
    if (auto st = call.offer("hg" + std::to_string(i), range(s.keep_lo, s.keep_hi), {s.partner});
        !st) {
      return st;
    }
    if (auto st = call.wait(first + k + (k - 1 - i)); !st) return st;
  }
  call.forget(first);
  return call.finish();
}

}  // namespace ferry::collective
