// The arithmetic of registrations in chunks (ferry/rdma/mr_cache.h): where a chunk ends, for any
// chunk size. The registrations themselves run in the soft-RoCE guest (rdma_test.cc, RdmaChunks).
#include <gtest/gtest.h>

#include <cstdint>

#include "ferry/rdma/mr_cache.h"

namespace ferry::rdma {
namespace {

constexpr uintptr_t kBegin = 0x7f0000001000;
constexpr uintptr_t kMiB = 1u << 20;

TEST(RegistrationChunks, AChunkEndsAtTheNextChunkOrAtTheEnd) {
  const uintptr_t end = kBegin + 3 * kMiB + 17;
  EXPECT_EQ(chunk_end(kBegin, end, kMiB, kBegin), kBegin + kMiB);
  EXPECT_EQ(chunk_end(kBegin, end, kMiB, kBegin + 5), kBegin + kMiB);
  EXPECT_EQ(chunk_end(kBegin, end, kMiB, kBegin + kMiB - 1), kBegin + kMiB);
  EXPECT_EQ(chunk_end(kBegin, end, kMiB, kBegin + kMiB), kBegin + 2 * kMiB);
  EXPECT_EQ(chunk_end(kBegin, end, kMiB, kBegin + 3 * kMiB), end);  // the last, short chunk
  EXPECT_EQ(chunk_end(kBegin, end, kMiB, end - 1), end);
  // Memory that ends on a chunk boundary.
  EXPECT_EQ(chunk_end(kBegin, kBegin + 2 * kMiB, kMiB, kBegin + kMiB + 1), kBegin + 2 * kMiB);
}

// A device without a limit (max_mr_size all ones): one chunk, however high the addresses; the
// next chunk's start would overflow, so the end of the memory it is.
TEST(RegistrationChunks, AChunkOfEveryAddressEndsAtTheEnd) {
  constexpr uintptr_t kNoLimit = UINTPTR_MAX;
  const uintptr_t end = kBegin + 5 * kMiB;
  EXPECT_EQ(chunk_end(kBegin, end, kNoLimit, kBegin), end);
  EXPECT_EQ(chunk_end(kBegin, end, kNoLimit, end - 1), end);
  const uintptr_t high = UINTPTR_MAX - 4096;
  EXPECT_EQ(chunk_end(high - kMiB, high, kNoLimit, high - 1), high);
  EXPECT_EQ(chunk_end(high - kMiB, high, 1u << 30, high - kMiB), high);
}

}  // namespace
}  // namespace ferry::rdma
