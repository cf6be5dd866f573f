// The direct algorithms (internal): one round in which every rank fetches what it needs
// straight from the rank that has it. Fewest hops, and every rank talks to every other at once:
// broadcast at every size, the other collectives where their table in docs/collectives.md
// ("Algorithms") says so.
#pragma once

#include <cstddef>
#include <span>

#include "ferry/collective/call.h"

namespace ferry::collective {

// Broadcast: every other rank fetches `data` of rank `root` into its own `data`, to the call's
// end (Call::finish).
Status broadcast_direct(Call& call, std::span<std::byte> data, int root);
// Allgather: every rank fetches every other rank's `in` into place in `out` (size() * in.size()
// bytes, this rank's block already there), to the call's end (Call::finish).
Status allgather_direct(Call& call, std::span<const std::byte> in, std::span<std::byte> out);
// Reduce-scatter of `in` (whole elements of `dtype`): this rank's chunk (Group::chunk_range),
// reduced over every rank in rank order, into `out`, to the call's end (Call::finish).
Status reduce_scatter_direct(Call& call, std::span<const std::byte> in, std::span<std::byte> out,
                             DType dtype, ReduceOp op);
// Allreduce of `data` (whole elements of `dtype`) in place by exchange: the direct
// reduce-scatter, then the direct allgather of the reduced chunks, two hops with the ring's
// bytes; to the call's end (Call::finish).
Status allreduce_exchange(Call& call, std::span<std::byte> data, DType dtype, ReduceOp op);

}  // namespace ferry::collective
