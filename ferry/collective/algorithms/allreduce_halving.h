// Recursive halving, then doubling (internal): Rabenseifner's allreduce, what Open MPI picks
// for mid-sized tensors, for a power-of-two group size. The ring's bytes (2(N-1)/N of the
// tensor per rank) in 2 log2(N) steps, each with one partner only (docs/collectives.md,
// "Recursive halving and doubling").
#pragma once

#include <cstddef>
#include <span>

#include "ferry/collective/call.h"

namespace ferry::collective {

// Allreduce of `data` (whole elements of `dtype`) in place, to the call's end (Call::finish).
// The call's group size is a power of two.
Status allreduce_halving(Call& call, std::span<std::byte> data, DType dtype, ReduceOp op);

}  // namespace ferry::collective
