// Recursive doubling (internal): the allreduce of small tensors, as Open MPI and MPICH do it.
// log2(N) steps, each a whole-tensor exchange with one partner; the ranks beyond a power of two
// fold into a partner first (docs/collectives.md, "Recursive doubling").
#pragma once

#include <cstddef>
#include <span>

#include "ferry/collective/call.h"

namespace ferry::collective {

// Allreduce of `data` (whole elements of `dtype`) in place, to the call's end (Call::finish).
Status allreduce_doubling(Call& call, std::span<std::byte> data, DType dtype, ReduceOp op);

}  // namespace ferry::collective
