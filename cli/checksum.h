// The checksum the CLI's manifests carry: XXH3, 64 bits, seed 0 (libxxhash), so that
// `xxhsum -H3 FILE` checks a file `ferry fetch --out` wrote. Not cryptographic: it catches
// corruption, not forgery (docs/security.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace ferry::cli {

// The manifest's name for it ("checksum_algorithm").
inline constexpr const char* kChecksumAlgorithm = "xxh3-64";
// XXH3_64bits of `data`: the same value on any machine; several GB/s.
uint64_t checksum(std::span<const std::byte> data);

// 16 lowercase hex digits.
std::string checksum_hex(uint64_t sum);
// Inverse of checksum_hex (1 to 16 hex digits, either case); nullopt otherwise.
std::optional<uint64_t> parse_checksum_hex(std::string_view text);

}  // namespace ferry::cli
