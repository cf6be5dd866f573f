// `ferry-bench memcpy`: single-core memcpy bandwidth, the bound on loopback TCP (two copies per
// byte: into the socket buffer and out of it).
#pragma once

#include <cstdint>

namespace ferry::bench {

// Copies a `size`-byte buffer into another for `seconds`; prints one JSON line (gbps).
int run_memcpy(uint64_t size, double seconds);

}  // namespace ferry::bench
