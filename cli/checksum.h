// A fast, non-cryptographic 64-bit checksum of byte buffers, for verifying transfers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace ferry::cli {

// Checksum of `data`: four independent multiply/rotate lanes over 8-byte little-endian words,
// folded and finalized with the length. Any change to a single word changes the result; runs at
// memory speed (several GB/s). The same bytes always give the same value, on any machine.
uint64_t checksum(std::span<const std::byte> data);

// 16 lowercase hex digits.
std::string checksum_hex(uint64_t sum);
// Inverse of checksum_hex (1 to 16 hex digits, either case); nullopt otherwise.
std::optional<uint64_t> parse_checksum_hex(std::string_view text);

}  // namespace ferry::cli
