// ObjectStore: references, pins and collection, exactly once.
#include "ferry/store/object_store.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

namespace ferry {
namespace {

struct StoreTest : ::testing::Test {
  StoreTest() {
    store.set_gc_hook([this](const StoredObject& o) {
      ++collected;
      last = o.id;
    });
  }
  ObjectId put_bytes(size_t n) {
    auto mem = std::make_shared<std::vector<std::byte>>(n);
    return store.put({Tensor::bytes(*mem)}, mem, "TCP");
  }
  ObjectStore store;
  std::atomic<int> collected{0};
  ObjectId last = 0;
};

TEST_F(StoreTest, ReleaseOfLastLocalReferenceCollectsOnce) {
  auto id = put_bytes(16);
  EXPECT_EQ(store.size(), 1u);
  EXPECT_EQ(store.bytes(), 16u);
  EXPECT_TRUE(store.release(id));
  EXPECT_EQ(collected, 1);
  EXPECT_EQ(last, id);
  EXPECT_FALSE(store.release(id));  // a second release finds nothing and collects nothing
  EXPECT_EQ(collected, 1);
  EXPECT_EQ(store.size(), 0u);
  EXPECT_EQ(store.bytes(), 0u);
}

TEST_F(StoreTest, RemoteReferencesKeepTheObject) {
  auto id = put_bytes(8);
  ASSERT_TRUE(store.add_remote_ref(id, 7));
  ASSERT_TRUE(store.add_remote_ref(id, 7));
  ASSERT_TRUE(store.add_remote_ref(id, 9));
  store.release(id);
  EXPECT_EQ(collected, 0);
  EXPECT_EQ(store.counts(id)->remote, 3u);
  EXPECT_TRUE(store.release_remote_ref(id, 7));
  EXPECT_FALSE(store.release_remote_ref(id, 8));  // never held one
  EXPECT_EQ(store.release_holder(7), 1u);
  EXPECT_EQ(collected, 0);
  EXPECT_EQ(store.release_holder(9), 1u);
  EXPECT_EQ(collected, 1);
}

TEST_F(StoreTest, PinDefersCollectionUntilTransferEnds) {
  auto id = put_bytes(8);
  auto pin = store.pin(id);
  ASSERT_TRUE(pin);
  store.release(id);
  EXPECT_EQ(collected, 0);
  EXPECT_EQ(pin.object().id, id);
  auto moved = std::move(pin);
  EXPECT_FALSE(pin);
  moved.reset();
  EXPECT_EQ(collected, 1);
  EXPECT_FALSE(store.pin(id));
}

// Released while a transfer pins it: that transfer goes on, a new one is refused (a released
// object is withdrawn, though it lives until the pin ends).
TEST_F(StoreTest, AReleasedObjectIsNotPinnedAgainWhileATransferStillPinsIt) {
  auto id = put_bytes(8);
  auto pin = store.pin(id);
  ASSERT_TRUE(pin);
  ASSERT_TRUE(store.add_remote_ref(id, 7));
  store.release(id);
  EXPECT_TRUE(store.pin(id)) << "a remote reference still holds it";
  EXPECT_EQ(store.release_holder(7), 1u);
  EXPECT_FALSE(store.pin(id)) << "released, yet pinned for a new transfer";
  EXPECT_TRUE(store.find(id));  // the first transfer's object lives on
  EXPECT_EQ(collected, 0);
  pin.reset();
  EXPECT_EQ(collected, 1);
}

TEST_F(StoreTest, CopyOwnsItsBytes) {
  std::vector<std::byte> src(100, std::byte{5});
  auto id = store.put_copy({Tensor::bytes(src)}, "TCP");
  src.assign(100, std::byte{0});
  auto o = store.find(id);
  ASSERT_TRUE(o);
  EXPECT_EQ(o->tensors[0].data[99], std::byte{5});
}

TEST_F(StoreTest, ConcurrentReleaseCollectsExactlyOnce) {
  for (int round = 0; round < 200; ++round) {
    auto id = put_bytes(1);
    constexpr int kThreads = 4;
    for (int i = 0; i < kThreads; ++i) store.add_remote_ref(id, 100 + i);
    std::vector<std::thread> threads;
    for (int i = 0; i < kThreads; ++i) {
      threads.emplace_back([&, i] {
        auto pin = store.pin(id);
        store.release_remote_ref(id, 100 + i);
      });
    }
    store.release(id);
    for (auto& t : threads) t.join();
    ASSERT_EQ(collected, round + 1);
  }
}

TEST(Tensor, DTypes) {
  EXPECT_EQ(dtype_size(DType::kBFloat16), 2u);
  EXPECT_EQ(dtype_name(DType::kFloat32), "float32");
  EXPECT_EQ(dtype_from_name("int64"), DType::kInt64);
  EXPECT_FALSE(dtype_from_name("complex"));
  auto m = TensorMeta::dense({2, 3}, DType::kFloat64);
  EXPECT_EQ(m.nbytes, 48u);
}

}  // namespace
}  // namespace ferry
