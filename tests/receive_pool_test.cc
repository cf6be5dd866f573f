// The receive pool (ferry/mem/pool.h) behind fetches without targets, Context::allocate and the
// counters: memory recycled after warm-up, never reused under a holder, bounded by the cap with a
// counted fallback beyond it, safe past the context's end, and (over RDMA, in the guest) no
// registration per fetch. Over the suite's transport: TCP here, RDMA in the soft-RoCE guest.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "ferry/rdma/rdma.h"
#include "tests/test_util.h"

namespace ferry::test {
namespace {

// A server with one object of `size` bytes, and a client connected to it.
struct PoolFixture {
  explicit PoolFixture(size_t size, ContextOptions client_opts = client_options("client"))
      : bytes(make_pattern(size, size + 5)), client(std::move(client_opts)) {
    ref = server.put(bytes);
    peer = connect_or_fail(client, server.address());
  }
  // Fetches the object into ferry's memory and checks every byte; the result, or null.
  std::unique_ptr<FetchResult> fetch_checked() {
    auto req = peer.fetch(ref);
    if (auto ec = req.wait(scaled(30s))) {
      ADD_FAILURE() << "fetch: " << ec.message();
      return nullptr;
    }
    EXPECT_TRUE(same_bytes(req.result().tensors.at(0), *bytes));
    return std::make_unique<FetchResult>(req.result());
  }
  Server server;
  std::shared_ptr<std::vector<std::byte>> bytes;
  ObjectRef ref;
  Context client;
  Peer peer;
};

// Many fetches of one size with their results dropped: after the first, the pool serves every
// one from memory it holds (no new region, no miss, no fallback), and holds a bounded amount.
TEST(ReceivePool, FetchesWithResultsDroppedReuseTheSameMemory) {
  FERRY_REQUIRE_TEST_HOST();
  const bool rdma = test_transport() == "RDMA";
  for (size_t size : {size_t{64} << 10, size_t{1} << 20, size_t{8} << 20}) {
    PoolFixture f(size);
    // Emulated RDMA (rxe under QEMU) moves tens of MB/s: fewer there, still more than a region
    // holds blocks of any of these sizes.
    const int fetches = rdma ? 100 : (size >= (8u << 20) ? 1000 : 10000);
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(f.fetch_checked());  // warm-up
    const auto warm = f.client.pool_stats();
    EXPECT_GT(warm.regions_created, 0u);
    for (int i = 0; i < fetches; ++i) {
      auto req = f.peer.fetch(f.ref);
      ASSERT_FALSE(req.wait(scaled(30s))) << "fetch " << i;
      if (i % 97 == 0) {
        ASSERT_TRUE(same_bytes(req.result().tensors.at(0), *f.bytes));
      }
    }
    const auto after = f.client.pool_stats();
    EXPECT_EQ(after.regions_created, warm.regions_created) << size << " bytes";
    EXPECT_EQ(after.misses, warm.misses) << size << " bytes";
    EXPECT_EQ(after.fallbacks, 0u) << size << " bytes";
    EXPECT_GE(after.hits - warm.hits, static_cast<uint64_t>(fetches)) << size << " bytes";
    EXPECT_LE(after.held_bytes, warm.held_bytes) << size << " bytes";
    std::printf("%zu B x %d fetches: pool holds %llu B in %llu regions, %llu hits\n", size, fetches,
                static_cast<unsigned long long>(after.held_bytes),
                static_cast<unsigned long long>(after.regions_created),
                static_cast<unsigned long long>(after.hits));
  }
}

// Results the application keeps are never handed out again: their bytes stay right while many
// other fetches of the same and other sizes come and go.
TEST(ReceivePool, KeptResultsAreNeverReusedUnderTheirHolder) {
  FERRY_REQUIRE_TEST_HOST();
  PoolFixture f(300000);
  auto other = make_pattern(4096, 9);
  auto other_ref = f.server.put(other);
  std::vector<std::unique_ptr<FetchResult>> kept;
  for (int i = 0; i < 20; ++i) kept.push_back(f.fetch_checked());
  // Emulated RDMA (rxe under QEMU) moves tens of MB/s, and its READs now and then stall until
  // ferry's stall bound restarts them on a new queue pair: fewer rounds there.
  const int rounds = test_transport() == "RDMA" ? 20 : 500;
  for (int i = 0; i < rounds; ++i) {
    auto a = f.peer.fetch(f.ref);
    auto b = f.peer.fetch(other_ref);
    ASSERT_FALSE(a.wait(scaled(30s)));
    ASSERT_FALSE(b.wait(scaled(30s)));
    // Scribble over what came back, as an application may: a kept block must not be among them.
    std::memset(a.result().tensors.at(0).data(), 0xAB, a.result().tensors.at(0).size());
    std::memset(b.result().tensors.at(0).data(), 0xCD, b.result().tensors.at(0).size());
  }
  for (const auto& r : kept) {
    ASSERT_TRUE(r);
    EXPECT_TRUE(same_bytes(r->tensors.at(0), *f.bytes));
  }
}

// Fetches issued while others run take their memory on the issuing thread: each still gets a
// block of its own (no two live results overlap) with its object's bytes, and once they are
// dropped the next round reuses what the first made.
TEST(ReceivePool, FetchesIssuedWhileOthersRunGetBlocksOfTheirOwn) {
  FERRY_REQUIRE_TEST_HOST();
  Server server;
  std::vector<std::shared_ptr<std::vector<std::byte>>> objects;
  std::vector<ObjectRef> refs;
  for (size_t size : {size_t{3} << 20, size_t{9} << 20, size_t{64} << 10, size_t{20} << 20}) {
    objects.push_back(make_pattern(size, size + 11));
    refs.push_back(server.put(objects.back()));
  }
  Context client(client_options("client"));
  auto peer = connect_or_fail(client, server.address());
  const int rounds = test_transport() == "RDMA" ? 1 : 3;
  PoolStats first{};
  for (int round = 0; round < rounds; ++round) {
    std::vector<std::pair<size_t, FetchRequest>> running;
    // Whether a fetch was issued while another ran: looked at after each issue, since a busy
    // machine may preempt this thread long enough for all that run to end.
    bool overlapped = false;
    for (int i = 0; i < 16; ++i) {
      running.emplace_back(i % 4, peer.fetch(refs[i % 4]));
      overlapped = overlapped || client.stats().fetches_in_flight > 1;
    }
    EXPECT_TRUE(overlapped) << "every fetch ended before the next was issued";
    std::vector<std::span<const std::byte>> live;
    for (auto& [which, req] : running) {
      ASSERT_FALSE(req.wait(scaled(60s)));
      const auto got = req.result().tensors.at(0);
      EXPECT_TRUE(same_bytes(got, *objects[which])) << "object " << which;
      for (const auto& other : live) {
        EXPECT_TRUE(got.data() + got.size() <= other.data() ||
                    other.data() + other.size() <= got.data())
            << "two live results share memory";
      }
      live.push_back(got);
    }
    EXPECT_EQ(client.stats().fetches_in_flight, 0u);
    running.clear();
    // The io thread lets go of a fetch's state (and so of its memory) just after it has woken
    // the waiter, which may already be here: the last block comes back a moment later.
    EXPECT_TRUE(eventually([&] { return client.pool_stats().in_use_bytes == 0; }))
        << "a dropped result's memory did not come back to the pool";
    const auto s = client.pool_stats();
    EXPECT_EQ(s.fallbacks, 0u);
    if (round == 0) {
      first = s;
    } else {
      EXPECT_EQ(s.misses, first.misses) << "round " << round << " made memory anew";
      EXPECT_EQ(s.held_bytes, first.held_bytes) << "round " << round;
    }
  }
}

// Results outlive the context that fetched them: the memory stays valid and returns to the
// (then gone) pool when the last reference goes. ASan (make test-asan) checks the accesses.
TEST(ReceivePool, ResultsOutliveTheirContext) {
  FERRY_REQUIRE_TEST_HOST();
  std::vector<std::unique_ptr<FetchResult>> kept;
  std::shared_ptr<std::vector<std::byte>> bytes;
  {
    PoolFixture f(2u << 20);
    bytes = f.bytes;
    for (int i = 0; i < 4; ++i) kept.push_back(f.fetch_checked());
    auto own = f.client.allocate(12345);
    ASSERT_TRUE(own.ok());
    std::memset(own->get(), 0x5A, 12345);
  }
  for (const auto& r : kept) {
    ASSERT_TRUE(r);
    EXPECT_TRUE(same_bytes(r->tensors.at(0), *bytes));
    std::memset(r->tensors.at(0).data(), 0, r->tensors.at(0).size());
  }
  kept.clear();
}

// Beyond the cap, fetches still succeed, in plain memory, and the counters say so; with the pool
// off (0) every allocation is a fallback.
TEST(ReceivePool, BeyondTheCapFetchesSucceedThroughACountedFallback) {
  FERRY_REQUIRE_TEST_HOST();
  for (size_t cap : {size_t{4} << 20, size_t{0}}) {
    auto o = client_options("capped");
    o.pool_bytes = cap;
    PoolFixture f(3u << 20, o);
    std::vector<std::unique_ptr<FetchResult>> kept;
    for (int i = 0; i < 4; ++i) kept.push_back(f.fetch_checked());  // 4 x 3 MiB held: 12 MiB
    for (const auto& r : kept) EXPECT_TRUE(r && same_bytes(r->tensors.at(0), *f.bytes));
    const auto s = f.client.pool_stats();
    EXPECT_LE(s.held_bytes, cap);
    EXPECT_GE(s.fallbacks, cap ? 2u : 4u) << "cap " << cap;
    EXPECT_GE(s.fallback_bytes, (cap ? 2u : 4u) * (3u << 20)) << "cap " << cap;
  }
}

// The RDMA transport's gauge of receive pool regions registered now, or -1 without RDMA.
double pool_regions_registered(Context& ctx) {
  return transport_metric(ctx, rdma::kRdmaTransportName, "pool_regions_registered");
}

// Context::allocate gives pool memory the application can fetch into and put; over RDMA it is
// registered (off the io threads when its region is new and large: awaited here), so a fetch
// into it registers nothing.
TEST(ReceivePool, AllocatedMemoryCanBeFetchedIntoAndPut) {
  FERRY_REQUIRE_TEST_HOST();
  PoolFixture f(1u << 20);
  const size_t n = f.bytes->size();
  auto into = f.client.allocate(n);
  ASSERT_TRUE(into.ok());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(into->get()) % 64, 0u);
  EXPECT_GT(f.client.pool_stats().in_use_bytes, 0u);
  if (pool_regions_registered(f.client) >= 0) {
    ASSERT_TRUE(eventually([&] { return pool_regions_registered(f.client) >= 1; }, 30s));
  }
  const auto before = rdma::registration_counters(f.client);
  auto req = f.peer.fetch(f.ref, {MutableBuffer(into->get(), n)});
  ASSERT_FALSE(req.wait(scaled(30s)));
  EXPECT_TRUE(same_bytes({into->get(), n}, *f.bytes));
  if (before) {
    EXPECT_EQ(rdma::registration_counters(f.client)->registrations, before->registrations)
        << "a fetch into allocated memory registered it";
  }
  // The same memory, put by the client and fetched back by the server.
  ASSERT_TRUE(f.client.listen(test_host() + ":0").ok());
  auto put = f.client.put({Tensor::bytes({into->get(), n})}, *into);
  ASSERT_TRUE(put.ok());
  auto back = connect_or_fail(f.server.ctx, f.client.address());
  auto got = back.fetch(*put);
  ASSERT_FALSE(got.wait(scaled(30s)));
  EXPECT_TRUE(same_bytes(got.result().tensors.at(0), *f.bytes));
  EXPECT_EQ(f.client.allocate(~size_t{0} / 2).error(), errc::resource_exhausted);
}

// Over RDMA: after warm-up a fetch into ferry's memory costs the fetcher no ibv_reg_mr (the pool's
// regions were registered when they were made). Skipped over TCP, which registers nothing.
TEST(ReceivePool, AfterWarmUpAFetchRegistersNothing) {
  FERRY_REQUIRE_TEST_HOST();
  PoolFixture f(4u << 20);
  if (!rdma::registration_counters(f.client)) {
    GTEST_SKIP() << "SKIPPED: no RDMA device here (runs in the soft-RoCE guest)";
  }
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(f.fetch_checked());
  const auto before = *rdma::registration_counters(f.client);
  constexpr int kFetches = 200;
  for (int i = 0; i < kFetches; ++i) ASSERT_TRUE(f.fetch_checked());
  const auto after = *rdma::registration_counters(f.client);
  std::printf("%d fetches after warm-up: %llu fetcher registrations, %llu cache hits\n", kFetches,
              static_cast<unsigned long long>(after.registrations - before.registrations),
              static_cast<unsigned long long>(after.hits - before.hits));
  EXPECT_EQ(after.registrations, before.registrations);
  EXPECT_GE(after.hits - before.hits, static_cast<uint64_t>(kFetches));
}

}  // namespace
}  // namespace ferry::test
