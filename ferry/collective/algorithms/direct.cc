#include "ferry/collective/algorithms/direct.h"

#include <cstring>
#include <string>
#include <utility>
#include <vector>

namespace ferry::collective {
namespace {

// Fetches `tag` (mine.size() bytes) from every other rank and reduces the N parts into `out`
// (this rank's own part is `mine`), each as soon as it and all before it have arrived: in rank
// order, or, when `out` is `mine` (in place: no copy), this rank's part first and then the
// others in rank order. Either order is fixed, so results repeat bit for bit; the in-place one
// is for a chunk that only this rank reduces (others get it from this rank). `out` must
// otherwise not overlap `mine`.
Status gather_reduce(Call& call, const std::string& tag, std::span<const std::byte> mine,
                     DType dtype, ReduceOp op, std::span<std::byte> out) {
  if (mine.empty()) return {};
  const int n = call.size();
  const int rank = call.rank();
  const bool in_place = out.data() == mine.data();
  // Rank q's part lands in slot q of the scratch (this rank's slot stays unused).
  const size_t size = mine.size();
  auto space = call.scratch(static_cast<size_t>(n) * size);
  if (!space) return call.fail(-1, space.error(), "receive space");
  std::vector<std::span<std::byte>> theirs(static_cast<size_t>(n));
  const size_t first = call.taken();
  for (int q = 0; q < n; ++q) {
    if (q == rank) continue;
    theirs[q] = space->subspan(q * size, size);
    call.take(q, tag, theirs[q]);
  }
  size_t next = first;     // the fetches: the ranks in order, this one skipped
  bool empty = !in_place;  // `out` holds nothing yet
  for (int q = 0; q < n; ++q) {
    if (in_place && q == rank) continue;
    std::span<const std::byte> part = mine;
    if (q != rank) {
      if (auto s = call.wait(next++); !s) return s;
      part = theirs[q];
    }
    if (std::exchange(empty, false)) {
      std::memcpy(out.data(), part.data(), part.size());
    } else if (auto ec = reduce_into(dtype, op, out, part)) {
      return call.fail(-1, ec, "reduce");
    }
  }
  call.forget(first);
  return {};
}

// The direct reduce-scatter into `out` (this rank's chunk; may be `in`'s own chunk: reduced in
// place), without ending the call. Rank q fetches chunk q of every other rank's input, offered
// as "rs".
Status reduce_scatter_round(Call& call, std::span<const std::byte> in, std::span<std::byte> out,
                            DType dtype, ReduceOp op) {
  const size_t esize = dtype_size(dtype);
  const size_t count = in.size() / esize;
  const int n = call.size();
  for (int q = 0; q < n; ++q) {
    if (auto chunk = chunk_of(in, count, esize, q, n); q != call.rank() && !chunk.empty()) {
      if (auto s = call.offer("rs", chunk, {q}); !s) return s;
    }
  }
  return gather_reduce(call, "rs", chunk_of(in, count, esize, call.rank(), n), dtype, op, out);
}

}  // namespace

Status broadcast_direct(Call& call, std::span<std::byte> data, int root) {
  if (call.rank() == root) {
    if (auto s = call.offer("bc", data, call.others()); !s) return s;
  } else {
    call.take(root, "bc", data);
  }
  return call.finish();
}

Status allgather_direct(Call& call, std::span<const std::byte> in, std::span<std::byte> out) {
  if (auto s = call.offer("ag", in, call.others()); !s) return s;
  for (int q = 0; q < call.size(); ++q) {
    if (q != call.rank()) {
      call.take(q, "ag", out.subspan(static_cast<size_t>(q) * in.size(), in.size()));
    }
  }
  return call.finish();
}

Status reduce_scatter_direct(Call& call, std::span<const std::byte> in, std::span<std::byte> out,
                             DType dtype, ReduceOp op) {
  if (auto s = reduce_scatter_round(call, in, out, dtype, op); !s) return s;
  return call.finish();
}

// This rank's chunk, which no other rank reads, is reduced in place. No barrier between the two
// rounds: an allgather fetch lands in chunk q only after rank q has read this rank's chunk q,
// since q's reduced chunk needs it.
Status allreduce_exchange(Call& call, std::span<std::byte> data, DType dtype, ReduceOp op) {
  const size_t esize = dtype_size(dtype);
  const size_t count = data.size() / esize;
  const int n = call.size();
  const auto mine = chunk_of(data, count, esize, call.rank(), n);
  if (auto s = reduce_scatter_round(call, data, mine, dtype, op); !s) return s;
  if (!mine.empty()) {
    if (auto s = call.offer("ag", mine, call.others()); !s) return s;
  }
  for (int q = 0; q < n; ++q) {
    if (auto chunk = chunk_of(data, count, esize, q, n); q != call.rank() && !chunk.empty()) {
      call.take(q, "ag", chunk);
    }
  }
  return call.finish();
}

}  // namespace ferry::collective
