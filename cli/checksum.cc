#include "cli/checksum.h"

#include <xxhash.h>

#include <charconv>

namespace ferry::cli {

uint64_t checksum(std::span<const std::byte> data) { return XXH3_64bits(data.data(), data.size()); }

std::string checksum_hex(uint64_t sum) {
  char buf[17];
  for (int i = 15; i >= 0; --i, sum >>= 4) buf[i] = "0123456789abcdef"[sum & 0xf];
  return std::string(buf, 16);
}

std::optional<uint64_t> parse_checksum_hex(std::string_view text) {
  uint64_t value = 0;
  if (text.empty() || text.size() > 16) return std::nullopt;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value, 16);
  if (ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return value;
}

}  // namespace ferry::cli
