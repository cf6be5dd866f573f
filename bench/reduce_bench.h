// `ferry-bench reduce`: single-core speed of the collectives' reduction kernels per dtype, beside
// memcpy of the same buffer (a reduction reads two buffers and writes one; memcpy reads one).
#pragma once

#include <cstdint>

namespace ferry::bench {

// Runs collective::reduce_into (sum) on two `size`-byte buffers for `seconds` per dtype, and
// memcpy on the same buffers; prints one JSON line each (gbps: bytes of `acc` per second).
int run_reduce(uint64_t size, double seconds);

}  // namespace ferry::bench
