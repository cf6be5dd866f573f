// Parsing and printing sizes: "64M", "4K-64M", "1.00 GiB".
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace ferry::cli {

// "4096", "4K", "1.5M", "1G", "2T" (binary units; case-insensitive; optional "B" or "iB").
// nullopt for anything else or for a value that does not fit in 64 bits.
std::optional<uint64_t> parse_size(std::string_view text);

// A plain non-negative integer; nullopt for anything else.
std::optional<uint64_t> parse_count(std::string_view text);

// "MIN-MAX" or a single value (MIN = MAX), each parsed with `parse`; nullopt when either part
// fails or MIN > MAX.
std::optional<std::pair<uint64_t, uint64_t>> parse_range(
    std::string_view text, std::optional<uint64_t> (*parse)(std::string_view));

// Human-readable binary size: "812 B", "4.00 KiB", "1.00 GiB".
std::string format_bytes(uint64_t bytes);

}  // namespace ferry::cli
