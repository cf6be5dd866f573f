// This machine's physical memory: the bound on what one request may ask a process to allocate.
#pragma once

#include <unistd.h>

#include <cstdint>

namespace ferry {

// Bytes of physical memory (sysconf); 1 TiB when the system does not say.
inline uint64_t physical_memory_bytes() {
  static const uint64_t bytes = [] {
    const long pages = ::sysconf(_SC_PHYS_PAGES);
    const long page = ::sysconf(_SC_PAGESIZE);
    return pages > 0 && page > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page)
                                 : uint64_t{1} << 40;
  }();
  return bytes;
}

}  // namespace ferry
