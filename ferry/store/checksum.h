/// @file
/// CRC-32C (Castagnoli, the iSCSI / ext4 / RocksDB polynomial): the checksum a put may attach to
/// each tensor (PutOptions::checksum) and a fetch verifies (FetchOptions::verify).
///
/// On x86-64 with SSE4.2 it runs on the CPU's crc32 instruction, three streams at once, about as
/// fast as memcpy over the same bytes; elsewhere a table-driven loop (slice-by-8) computes the
/// same value, about 8 times slower. Thread-safe; no allocation.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace ferry {

/// The CRC-32C of `data` continued from `crc`, the CRC-32C of the bytes before it (0 for none):
/// crc32c(b, crc32c(a)) == crc32c(a followed by b). Any thread; never fails.
uint32_t crc32c(std::span<const std::byte> data, uint32_t crc = 0) noexcept;

namespace detail {
// The table-driven computation, whatever the CPU has: for tests that hold the fast one to it.
uint32_t crc32c_portable(std::span<const std::byte> data, uint32_t crc) noexcept;
}  // namespace detail

}  // namespace ferry
