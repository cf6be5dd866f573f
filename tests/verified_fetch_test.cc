// Verified fetches: an object put with PutOptions::checksum carries each tensor's CRC-32C in its
// ref, and a fetch checks what landed against it (FetchOptions::verify): into targets, into the
// receive pool, through a combine that streams and one that lands whole. The corruption here is
// real bytes that differ from the checksum: the owner's memory changed after the put (served
// zero copy, so the fetch moves the changed bytes). Over the suite's transport: TCP here, CMA and
// RDMA in their tiers.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "ferry/store/checksum.h"
#include "tests/test_util.h"

namespace ferry::test {
namespace {

struct Verified : testing::Test {
  void SetUp() override {
    FERRY_REQUIRE_TEST_HOST();
    peer = connect_or_fail(client, server.address());
    ASSERT_TRUE(peer.valid());
  }
  // Puts `tensors` (kept alive through `keep`) with checksums.
  ObjectRef put_checked(std::vector<std::shared_ptr<std::vector<std::byte>>> tensors) {
    std::vector<Tensor> views;
    for (const auto& t : tensors) views.push_back(Tensor::bytes(*t));
    PutOptions o;
    o.checksum = true;
    auto keep = std::make_shared<decltype(tensors)>(tensors);
    auto ref = server.ctx.put(std::move(views), keep, o);
    EXPECT_TRUE(ref.ok()) << ref.error().message();
    return ref.ok() ? *ref : ObjectRef{};
  }
  std::error_code fetch(const ObjectRef& ref, std::vector<MutableBuffer> into = {},
                        FetchOptions options = {}) {
    auto req = peer.fetch(ref, std::move(into), std::move(options));
    return req.wait(scaled(60s));
  }
  Server server;
  Context client{client_options("client")};
  Peer peer;
};

TEST_F(Verified, AChecksummedObjectCarriesItsChecksumsAndArrivesWhole) {
  auto a = make_pattern((2u << 20) + 5, 1);
  auto b = make_pattern(0, 2);
  auto c = make_pattern(4099, 3);
  const ObjectRef ref = put_checked({a, b, c});
  ASSERT_EQ(ref.metadata.tensors.size(), 3u);
  EXPECT_EQ(ref.metadata.tensors[0].checksum, crc32c(*a));
  EXPECT_EQ(ref.metadata.tensors[1].checksum, 0u);  // the CRC of no bytes
  EXPECT_EQ(ref.metadata.tensors[2].checksum, crc32c(*c));
  // The checksums travel with the ref's text form, as a ref handed to another process does.
  auto text = ObjectRef::from_string(ref.to_string());
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(*text, ref);

  std::vector<std::byte> ta(a->size()), tc(c->size());
  ASSERT_FALSE(fetch(*text, {ta, {}, tc}));
  EXPECT_TRUE(same_bytes(ta, *a));
  EXPECT_TRUE(same_bytes(tc, *c));

  auto req = peer.fetch(ref);
  ASSERT_FALSE(req.wait(scaled(60s)));
  EXPECT_TRUE(same_bytes(req.result().tensors.at(0), *a));
  EXPECT_TRUE(same_bytes(req.result().tensors.at(2), *c));

  // A put without the option carries none.
  auto plain = server.put(a);
  EXPECT_FALSE(plain.metadata.tensors[0].checksum.has_value());
}

TEST_F(Verified, BytesChangedAfterThePutFailTheFetchWithDataCorrupted) {
  auto a = make_pattern((1u << 20) + 77, 4);
  auto b = make_pattern(300000, 5);
  const ObjectRef ref = put_checked({a, b});
  (*b)[123456] ^= std::byte{1};  // one bit of the second tensor, in the owner's memory

  std::vector<std::byte> ta(a->size()), tb(b->size());
  auto ec = fetch(ref, {ta, tb});
  EXPECT_EQ(ec, errc::data_corrupted) << ec.message();
  EXPECT_EQ(scope_of(ec), Scope::operation);
  EXPECT_TRUE(same_bytes(tb, *b));              // the bytes as they landed
  EXPECT_EQ(fetch(ref), errc::data_corrupted);  // into the receive pool

  // Not checked when asked not to, nor under a ref that carries no checksums.
  FetchOptions unchecked;
  unchecked.verify = false;
  EXPECT_FALSE(fetch(ref, {ta, tb}, unchecked));
  ObjectRef stripped = ref;
  for (auto& t : stripped.metadata.tensors) t.checksum.reset();
  EXPECT_FALSE(fetch(stripped, {ta, tb}));

  // The session is fine: once the memory holds what was put again, the fetch passes.
  (*b)[123456] ^= std::byte{1};
  EXPECT_FALSE(fetch(ref, {ta, tb}));
  EXPECT_TRUE(same_bytes(tb, *b));
}

// A combine is checked on the bytes that arrived, not on what the targets hold afterwards: over
// TCP the pieces are summed as they stream through the function, elsewhere the slots they landed
// in are checked before combining (and nothing is combined when they differ).
TEST_F(Verified, ACombiningFetchIsCheckedOnTheBytesThatArrived) {
  auto a = make_pattern((3u << 20) + 11, 6);
  auto c = make_pattern(5000, 7);
  const ObjectRef ref = put_checked({a, c});
  auto add = [](std::span<std::byte> target, std::span<const std::byte> arrived) {
    for (size_t i = 0; i < target.size(); ++i) {
      target[i] = std::byte(uint8_t(uint8_t(target[i]) + uint8_t(arrived[i])));
    }
  };
  FetchOptions o;
  o.combine = add;
  std::vector<std::byte> ta(a->size(), std::byte{1}), tc(c->size(), std::byte{2});
  ASSERT_FALSE(fetch(ref, {ta, tc}, o));
  size_t wrong = 0;
  for (size_t i = 0; i < ta.size(); ++i) wrong += ta[i] != std::byte(uint8_t((*a)[i]) + 1);
  for (size_t i = 0; i < tc.size(); ++i) wrong += tc[i] != std::byte(uint8_t((*c)[i]) + 2);
  EXPECT_EQ(wrong, 0u);

  (*a)[(2u << 20) + 3] ^= std::byte{0x80};
  EXPECT_EQ(fetch(ref, {ta, tc}, o), errc::data_corrupted);
}

}  // namespace
}  // namespace ferry::test
