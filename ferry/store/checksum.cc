#include "ferry/store/checksum.h"

#include <array>
#include <bit>
#include <cstring>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace ferry {
namespace {

// Everything below works on the CRC's register ("raw" state): crc32c() inverts it on the way in
// and out. The register update is linear over GF(2) in (state, bytes) together, so
// raw(s, X) == shift(s, |X|) ^ raw(0, X), where shift(s, n) is the register after n zero bytes:
// that is what lets three streams run independently and be joined.
constexpr uint32_t kPolynomial = 0x82F63B78;  // reflected Castagnoli polynomial

using Table = std::array<uint32_t, 256>;

constexpr std::array<Table, 8> make_slices() {
  std::array<Table, 8> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (kPolynomial & (0u - (c & 1)));
    t[0][i] = c;
  }
  for (size_t s = 1; s < 8; ++s) {
    for (uint32_t i = 0; i < 256; ++i) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xff];
  }
  return t;
}

// kSlices[k][b]: the register after byte b followed by k zero bytes, from 0.
constexpr std::array<Table, 8> kSlices = make_slices();

uint32_t portable_raw(uint32_t s, const unsigned char* p, size_t n) noexcept {
  const auto& t = kSlices;
  if constexpr (std::endian::native == std::endian::little) {
    for (; n >= 8; p += 8, n -= 8) {
      uint64_t w;
      std::memcpy(&w, p, 8);
      w ^= s;
      s = t[7][w & 0xff] ^ t[6][(w >> 8) & 0xff] ^ t[5][(w >> 16) & 0xff] ^ t[4][(w >> 24) & 0xff] ^
          t[3][(w >> 32) & 0xff] ^ t[2][(w >> 40) & 0xff] ^ t[1][(w >> 48) & 0xff] ^ t[0][w >> 56];
    }
  }
  for (; n > 0; ++p, --n) s = (s >> 8) ^ t[0][(s ^ *p) & 0xff];
  return s;
}

#if defined(__x86_64__)

// Each stream's share of a block: large enough that joining three streams (eight table lookups)
// costs little beside the block, small enough that a fetch of a few tens of KiB uses them.
constexpr size_t kLane = 4096;

// shift(s, n) for one fixed n, as four tables of 256 (the shift is linear: the XOR of what each
// byte of s shifts to).
struct Shift {
  std::array<Table, 4> t;
  explicit Shift(size_t n) noexcept {
    static const std::array<unsigned char, 3 * kLane> zeros{};
    std::array<uint32_t, 32> column;  // shift(1 << j, n)
    for (size_t j = 0; j < 32; ++j) {
      uint32_t s = 1u << j;
      for (size_t left = n; left > 0;) {
        const size_t step = left < zeros.size() ? left : zeros.size();
        s = portable_raw(s, zeros.data(), step);
        left -= step;
      }
      column[j] = s;
    }
    for (size_t k = 0; k < 4; ++k) {
      for (uint32_t b = 0; b < 256; ++b) {
        uint32_t v = 0;
        for (size_t i = 0; i < 8; ++i) {
          if (b & (1u << i)) v ^= column[8 * k + i];
        }
        t[k][b] = v;
      }
    }
  }
  uint32_t operator()(uint32_t s) const noexcept {
    return t[0][s & 0xff] ^ t[1][(s >> 8) & 0xff] ^ t[2][(s >> 16) & 0xff] ^ t[3][s >> 24];
  }
};

uint64_t load64(const unsigned char* p) noexcept {
  uint64_t w;
  std::memcpy(&w, p, 8);
  return w;
}

__attribute__((target("sse4.2"))) uint32_t sse42_raw(uint32_t s, const unsigned char* p,
                                                     size_t n) noexcept {
  uint64_t c = s;
  for (; n > 0 && (reinterpret_cast<uintptr_t>(p) & 7) != 0; ++p, --n) {
    c = _mm_crc32_u8(static_cast<uint32_t>(c), *p);
  }
  if (n >= 3 * kLane) {
    static const Shift by_one(kLane), by_two(2 * kLane);
    for (; n >= 3 * kLane; p += 3 * kLane, n -= 3 * kLane) {
      uint64_t a = c, b = 0, d = 0;
      for (size_t i = 0; i < kLane; i += 8) {
        a = _mm_crc32_u64(a, load64(p + i));
        b = _mm_crc32_u64(b, load64(p + kLane + i));
        d = _mm_crc32_u64(d, load64(p + 2 * kLane + i));
      }
      c = by_two(static_cast<uint32_t>(a)) ^ by_one(static_cast<uint32_t>(b)) ^
          static_cast<uint32_t>(d);
    }
  }
  for (; n >= 8; p += 8, n -= 8) c = _mm_crc32_u64(c, load64(p));
  for (; n > 0; ++p, --n) c = _mm_crc32_u8(static_cast<uint32_t>(c), *p);
  return static_cast<uint32_t>(c);
}

bool has_sse42() noexcept {
  static const bool yes = __builtin_cpu_supports("sse4.2");
  return yes;
}

#endif

}  // namespace

namespace detail {
uint32_t crc32c_portable(std::span<const std::byte> data, uint32_t crc) noexcept {
  return ~portable_raw(~crc, reinterpret_cast<const unsigned char*>(data.data()), data.size());
}
}  // namespace detail

uint32_t crc32c(std::span<const std::byte> data, uint32_t crc) noexcept {
#if defined(__x86_64__)
  if (has_sse42()) {
    return ~sse42_raw(~crc, reinterpret_cast<const unsigned char*>(data.data()), data.size());
  }
#endif
  return detail::crc32c_portable(data, crc);
}

}  // namespace ferry
