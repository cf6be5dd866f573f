// CRC-32C (ferry/store/checksum.h): the published check values, the fast path held to the
// table-driven one at every length and alignment around its block sizes, continuation across
// any split, and a flipped bit always seen.
#include "ferry/store/checksum.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string_view>
#include <vector>

#include "tests/test_util.h"

namespace ferry::test {
namespace {

std::span<const std::byte> as_bytes(std::string_view s) {
  return std::as_bytes(std::span<const char>(s.data(), s.size()));
}

std::vector<std::byte> filled(size_t n, int (*value)(size_t)) {
  std::vector<std::byte> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<std::byte>(value(i));
  return v;
}

// RFC 3720 (iSCSI), appendix B.4, and the customary check value of "123456789".
TEST(Crc32c, MatchesThePublishedCheckValues) {
  const auto zeros = filled(32, [](size_t) { return 0; });
  const auto ones = filled(32, [](size_t) { return 0xff; });
  const auto up = filled(32, [](size_t i) { return static_cast<int>(i); });
  const auto down = filled(32, [](size_t i) { return static_cast<int>(31 - i); });
  for (bool portable : {false, true}) {
    SCOPED_TRACE(portable ? "portable" : "fast");
    auto crc = [portable](std::span<const std::byte> d) {
      return portable ? detail::crc32c_portable(d, 0) : crc32c(d);
    };
    EXPECT_EQ(crc(as_bytes("123456789")), 0xE3069283u);
    EXPECT_EQ(crc(zeros), 0x8A9136AAu);
    EXPECT_EQ(crc(ones), 0x62A8AB43u);
    EXPECT_EQ(crc(up), 0x46DD794Eu);
    EXPECT_EQ(crc(down), 0x113FDB5Cu);
    EXPECT_EQ(crc({}), 0u);
  }
}

// The fast path splits data into an unaligned head, blocks of three 4 KiB streams and a tail:
// every length near those boundaries, at every alignment, gives the table-driven value.
TEST(Crc32c, TheFastPathAgreesWithTheTableAtEveryLengthAndAlignment) {
  const auto data = make_pattern(5 * 12288 + 64, 7);
  std::vector<size_t> lengths;
  for (size_t n = 0; n <= 64; ++n) lengths.push_back(n);
  for (size_t block : {4096, 12288, 24576, 36864, 61440}) {
    for (size_t d = 0; d <= 16; ++d) {
      lengths.push_back(block - d);
      lengths.push_back(block + d);
    }
  }
  for (size_t offset = 0; offset < 8; ++offset) {
    for (size_t n : lengths) {
      const std::span<const std::byte> part(data->data() + offset, n);
      ASSERT_EQ(crc32c(part), detail::crc32c_portable(part, 0))
          << "offset " << offset << ", length " << n;
    }
  }
}

TEST(Crc32c, ContinuingFromAPrefixEqualsTheWhole) {
  const auto data = make_pattern(3 << 20, 11);
  const std::span<const std::byte> all(*data);
  const uint32_t whole = crc32c(all);
  EXPECT_EQ(whole, detail::crc32c_portable(all, 0));
  for (size_t cut : {size_t{0}, size_t{1}, size_t{7}, size_t{4095}, size_t{12289}, size_t{1} << 20,
                     all.size() - 3, all.size()}) {
    EXPECT_EQ(crc32c(all.subspan(cut), crc32c(all.first(cut))), whole) << "cut at " << cut;
    EXPECT_EQ(detail::crc32c_portable(all.subspan(cut), detail::crc32c_portable(all.first(cut), 0)),
              whole)
        << "cut at " << cut;
  }
}

// A CRC sees every single-bit error; this checks that the fast path's joining of its streams
// keeps that, for a bit in each stream of a block and in the head and tail.
TEST(Crc32c, AnyFlippedBitChangesIt) {
  auto data = make_pattern(64 * 1024 + 13, 3);
  const uint32_t clean = crc32c(*data);
  for (size_t at : {size_t{0}, size_t{5}, size_t{4096}, size_t{8191}, size_t{8192}, size_t{12287},
                    size_t{40000}, data->size() - 1}) {
    for (int bit : {0, 3, 7}) {
      (*data)[at] ^= static_cast<std::byte>(1 << bit);
      EXPECT_NE(crc32c(*data), clean) << "byte " << at << " bit " << bit;
      (*data)[at] ^= static_cast<std::byte>(1 << bit);
    }
  }
  EXPECT_EQ(crc32c(*data), clean);
}

}  // namespace
}  // namespace ferry::test
