#include "ferry/collective/algorithms/ring.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

namespace ferry::collective {
namespace {

std::string ring_tag(const char* phase, int step, size_t offset) {
  return std::string(phase) + std::to_string(step) + "@" + std::to_string(offset);
}

// Chunk q's segments as (byte offset in the tensor, bytes), at most segment_bytes each.
std::vector<std::pair<size_t, size_t>> segments(const Call& call, size_t count, size_t esize,
                                                int q) {
  auto [first, last] = Group::chunk_range(count, q, call.size());
  const size_t step = std::max<size_t>(1, call.options().segment_bytes / esize);
  std::vector<std::pair<size_t, size_t>> out;
  for (size_t e = first; e < last; e += step) {
    out.emplace_back(e * esize, (std::min(last, e + step) - e) * esize);
  }
  return out;
}

// Reduce-scatter in N-1 steps: at step s this rank fetches its left neighbour's partial sum of
// chunk (rank - s - 2) mod N (at step 0 the neighbour's input), adds its own input in place and
// offers the sum for its right neighbour's step s + 1; the last step's sum is this rank's chunk,
// complete, in `out` (which may be `in`'s own chunk: summed in place). With `gather`
// (allreduce: the tensor, where `out` is this rank's chunk of it), the allgather follows: at
// step s this rank fetches chunk (rank - s - 1) mod N from its left neighbour into place and
// offers it on.
//
// Every fetch of the call is posted at its start: a segment not yet offered waits on the
// neighbour, and each is reduced and passed on as soon as it lands, so segments travel while
// others are reduced, and the allgather of early segments overlaps the reduce-scatter of later
// ones. No barrier is needed between the phases: chunk c's final sum exists only after every
// rank has added its own part of c (and rank c+1 has read rank c's input chunk c at step 0),
// so an allgather segment lands only where this rank has finished with the memory.
Status ring(Call& call, std::span<const std::byte> in, DType dtype, ReduceOp op,
            std::span<std::byte> out, std::span<std::byte> gather) {
  const size_t esize = dtype_size(dtype);
  const size_t count = in.size() / esize;
  const int n = call.size();
  const int rank = call.rank();
  const auto mod = [n](int x) { return ((x % n) + n) % n; };
  const int left = mod(rank - 1), right = mod(rank + 1);
  // Receive space, one chunk per reduce-scatter step.
  std::vector<size_t> step_at(static_cast<size_t>(n - 1));
  size_t need = 0;
  for (int s = 0; s < n - 1; ++s) {
    const auto [first, last] = Group::chunk_range(count, mod(rank - s - 2), n);
    step_at[s] = need;
    need += (last - first) * esize;
  }
  auto space = call.scratch(need);
  if (!space) return call.fail(-1, space.error(), "receive space");
  for (auto [off, len] : segments(call, count, esize, mod(rank - 1))) {
    if (auto s = call.offer(ring_tag("rs", 0, off), in.subspan(off, len), {right}); !s) return s;
  }
  struct Piece {
    bool gathering;
    int step;
    size_t off, len;  // bytes in the tensor
    std::span<std::byte> into;
  };
  std::vector<Piece> pieces;
  const size_t first_pending = call.taken();
  for (int s = 0; s < n - 1; ++s) {
    const size_t base = Group::chunk_range(count, mod(rank - s - 2), n).first * esize;
    for (auto [off, len] : segments(call, count, esize, mod(rank - s - 2))) {
      auto into = space->subspan(step_at[s] + off - base, len);
      call.take(left, ring_tag("rs", s, off), into);
      pieces.push_back({false, s, off, len, into});
    }
  }
  for (int s = 0; !gather.empty() && s < n - 1; ++s) {
    for (auto [off, len] : segments(call, count, esize, mod(rank - s - 1))) {
      call.take(left, ring_tag("ag", s, off), gather.subspan(off, len));
      pieces.push_back({true, s, off, len, gather.subspan(off, len)});
    }
  }
  const size_t out_base = Group::chunk_range(count, rank, n).first * esize;
  for (size_t i = 0; i < pieces.size(); ++i) {
    const Piece& p = pieces[i];
    if (auto s = call.wait(first_pending + i); !s) return s;
    if (p.gathering) {
      if (p.step < n - 2) {
        if (auto s = call.offer(ring_tag("ag", p.step + 1, p.off), p.into, {right}); !s) return s;
      }
      continue;
    }
    const auto own = in.subspan(p.off, p.len);
    std::error_code ec;
    std::span<std::byte> sum = p.into;
    if (p.step < n - 2) {
      ec = reduce_into(dtype, op, sum, own);
    } else {
      // In place when `out` is `in` (this chunk is read by no one else), else straight into it.
      sum = out.subspan(p.off - out_base, p.len);
      ec = reduce_to(dtype, op, sum, p.into, own);
    }
    if (ec) return call.fail(-1, ec, "reduce");
    const bool last = p.step == n - 2;
    if (!last || !gather.empty()) {
      auto tag = last ? ring_tag("ag", 0, p.off) : ring_tag("rs", p.step + 1, p.off);
      if (auto s = call.offer(tag, sum, {right}); !s) return s;
    }
  }
  call.forget(first_pending);
  return call.finish();
}

}  // namespace

Status allreduce_ring(Call& call, std::span<std::byte> data, DType dtype, ReduceOp op) {
  const size_t esize = dtype_size(dtype);
  const auto mine = chunk_of(data, data.size() / esize, esize, call.rank(), call.size());
  return ring(call, data, dtype, op, mine, data);
}

Status reduce_scatter_ring(Call& call, std::span<const std::byte> in, std::span<std::byte> out,
                           DType dtype, ReduceOp op) {
  return ring(call, in, dtype, op, out, {});
}

}  // namespace ferry::collective
