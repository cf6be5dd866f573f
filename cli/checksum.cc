#include "cli/checksum.h"

#include <bit>
#include <charconv>
#include <cstring>

namespace ferry::cli {
namespace {

static_assert(std::endian::native == std::endian::little, "words are read little-endian");

constexpr uint64_t kPrime1 = 0x9e3779b185ebca87ull;
constexpr uint64_t kPrime2 = 0xc2b2ae3d27d4eb4full;
constexpr uint64_t kPrime3 = 0x165667b19e3779f9ull;
constexpr uint64_t kPrime4 = 0x85ebca77c2b2ae63ull;

uint64_t load64(const std::byte* p) {
  uint64_t w;
  std::memcpy(&w, p, sizeof w);
  return w;
}

// One lane step: a bijection of the word for a fixed state, and of the state for a fixed word.
uint64_t mix_word(uint64_t state, uint64_t word) {
  return std::rotl(state ^ (word * kPrime2), 31) * kPrime1;
}

uint64_t finalize(uint64_t h) {
  h ^= h >> 33;
  h *= kPrime2;
  h ^= h >> 29;
  h *= kPrime3;
  return h ^ (h >> 32);
}

}  // namespace

uint64_t checksum(std::span<const std::byte> data) {
  const std::byte* p = data.data();
  size_t n = data.size();
  uint64_t v0 = kPrime1, v1 = kPrime2, v2 = kPrime3, v3 = kPrime4;
  for (; n >= 32; p += 32, n -= 32) {
    v0 = mix_word(v0, load64(p));
    v1 = mix_word(v1, load64(p + 8));
    v2 = mix_word(v2, load64(p + 16));
    v3 = mix_word(v3, load64(p + 24));
  }
  uint64_t h = std::rotl(v0, 1) + std::rotl(v1, 7) + std::rotl(v2, 12) + std::rotl(v3, 18);
  for (; n >= 8; p += 8, n -= 8) h = mix_word(h, load64(p));
  if (n > 0) {
    uint64_t tail = 0;
    std::memcpy(&tail, p, n);
    h = mix_word(h, tail);
  }
  return finalize(h ^ (data.size() * kPrime4));
}

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
