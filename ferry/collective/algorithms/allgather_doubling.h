// Allgather by recursive doubling (internal), for a power-of-two group size: log2(N) messages
// per rank where the direct round takes N-1, the same bytes (docs/collectives.md, "Allgather by
// recursive doubling").
#pragma once

#include <cstddef>
#include <span>

#include "ferry/collective/call.h"

namespace ferry::collective {

// Every rank's `in` into place in `out` (size() * in.size() bytes, this rank's block already
// there), to the call's end (Call::finish). The call's group size is a power of two.
Status allgather_doubling(Call& call, std::span<const std::byte> in, std::span<std::byte> out);

}  // namespace ferry::collective
