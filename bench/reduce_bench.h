// `ferry-bench reduce`: single-core speed of the collectives' reduction kernels per dtype, beside
// memcpy of the same buffer (a reduction reads two buffers and writes one; memcpy reads one).
#pragma once

#include <cstdint>

namespace ferry::bench {

// Runs collective::reduce_to (sum, max) on two `size`-byte buffers for `seconds` per dtype, op and
// place of the result ("into": a, in place into the first operand as reduce_into does; b, into
// the second; c, into a third buffer), and memcpy on the same buffers; prints one JSON line each
// (gbps: bytes of the result per second).
int run_reduce(uint64_t size, double seconds);

}  // namespace ferry::bench
