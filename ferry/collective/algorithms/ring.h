// The ring (internal): reduce-scatter, and for allreduce the allgather after it, around the
// ring of ranks, pipelined in segments of GroupOptions::segment_bytes. Bandwidth-optimal:
// 2(N-1)/N of the tensor in and out of each rank, one neighbour each way. For tensors from
// GroupOptions::ring_threshold (docs/collectives.md, "Ring").
#pragma once

#include <cstddef>
#include <span>

#include "ferry/collective/call.h"

namespace ferry::collective {

// Allreduce of `data` (whole elements of `dtype`) in place, to the call's end (Call::finish).
Status allreduce_ring(Call& call, std::span<std::byte> data, DType dtype, ReduceOp op);
// Reduce-scatter of `in` (whole elements of `dtype`): this rank's chunk (Group::chunk_range),
// reduced over every rank, into `out`, to the call's end (Call::finish).
Status reduce_scatter_ring(Call& call, std::span<const std::byte> in, std::span<std::byte> out,
                           DType dtype, ReduceOp op);

}  // namespace ferry::collective
