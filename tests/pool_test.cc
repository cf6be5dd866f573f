// Pool: reuse, no block handed out twice, the cap, trimming, blocks outliving the pool, region
// listeners, alignment and concurrent use, all on real memory.
#include "ferry/mem/pool.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace ferry::mem {
namespace {

using namespace std::chrono_literals;

constexpr size_t kKiB = size_t{1} << 10;
constexpr size_t kMiB = size_t{1} << 20;

std::byte pattern(size_t i, uint32_t seed) { return std::byte((i * 131 + seed * 7 + 1) & 0xff); }

void fill(std::byte* p, size_t n, uint32_t seed) {
  for (size_t i = 0; i < n; ++i) p[i] = pattern(i, seed);
}

// Index of the first byte that differs from the pattern, or n.
size_t first_mismatch(const std::byte* p, size_t n, uint32_t seed) {
  for (size_t i = 0; i < n; ++i) {
    if (p[i] != pattern(i, seed)) return i;
  }
  return n;
}

// Writes `tag` over the first and last 8 bytes of a block (fewer when it is smaller).
void stamp(std::byte* p, size_t n, uint64_t tag) {
  const size_t k = std::min<size_t>(n, 8);
  std::memcpy(p, &tag, k);
  std::memcpy(p + n - k, &tag, k);
}

bool stamped(const std::byte* p, size_t n, uint64_t tag) {
  const size_t k = std::min<size_t>(n, 8);
  return std::memcmp(p, &tag, k) == 0 && std::memcmp(p + n - k, &tag, k) == 0;
}

// Whether the region reported for `p` is one the listener was told of, with the same size.
bool announced(const std::map<std::byte*, size_t>& regions, std::span<std::byte> region) {
  auto it = regions.find(region.data());
  return it != regions.end() && it->second == region.size();
}

class PoolReuseTest : public ::testing::TestWithParam<size_t> {};

TEST_P(PoolReuseTest, SteadyStateMakesNoRegions) {
  const size_t n = GetParam();
  Pool pool;
  {
    auto b = pool.allocate(n);
    ASSERT_TRUE(b);
    b[0] = b[n - 1] = std::byte{1};
  }
  const PoolCounters warm = pool.counters();
  EXPECT_EQ(warm.misses, 1u);
  EXPECT_EQ(warm.regions_created, 1u);
  EXPECT_LE(warm.held_bytes, std::max(2 * kMiB, n + n / 8));
  for (int i = 0; i < 10000; ++i) {
    auto b = pool.allocate(n);
    ASSERT_TRUE(b);
    b[0] = b[n - 1] = std::byte(i);
    ASSERT_EQ(pool.counters().held_bytes, warm.held_bytes) << "cycle " << i;
  }
  const PoolCounters c = pool.counters();
  EXPECT_EQ(c.regions_created, warm.regions_created);
  EXPECT_EQ(c.misses, warm.misses);
  EXPECT_EQ(c.hits, warm.hits + 10000);
  EXPECT_EQ(c.fallbacks, 0u);
  EXPECT_EQ(c.in_use_bytes, 0u);
}

INSTANTIATE_TEST_SUITE_P(Sizes, PoolReuseTest,
                         ::testing::Values(64 * kKiB, 1 * kMiB, 8 * kMiB, 64 * kMiB));

TEST(PoolTest, LiveBlocksAreNeverHandedOutTwice) {
  Pool pool;
  const std::vector<size_t> sizes = {1,          64,       100,      4000,    64 * kKiB,
                                     300 * kKiB, 1 * kMiB, 3 * kMiB, 9 * kMiB};
  struct Kept {
    std::shared_ptr<std::byte[]> block;
    size_t n;
    uint32_t seed;
  };
  std::vector<Kept> kept;
  for (uint32_t i = 0; i < 90; ++i) {
    const size_t n = sizes[i % sizes.size()];
    auto b = pool.allocate(n);
    ASSERT_TRUE(b);
    fill(b.get(), n, i);
    kept.push_back({std::move(b), n, i});
  }
  // Drop every fourth (every size among them): their memory is reused below, beside the kept
  // blocks of the same slabs.
  for (size_t i = 0; i < kept.size(); i += 4) kept[i].block.reset();
  std::erase_if(kept, [](const Kept& k) { return !k.block; });

  auto by_address = kept;
  std::sort(by_address.begin(), by_address.end(),
            [](const Kept& a, const Kept& b) { return a.block.get() < b.block.get(); });
  for (size_t i = 1; i < by_address.size(); ++i) {
    EXPECT_LE(by_address[i - 1].block.get() + by_address[i - 1].n, by_address[i].block.get());
  }

  // Churn, some of it living a while: each block is stamped, and checked when it goes.
  std::mt19937 rng(7);
  std::vector<Kept> churn(5);
  for (uint32_t i = 0; i < 3000; ++i) {
    const size_t n = sizes[rng() % sizes.size()] + rng() % 3;
    auto b = pool.allocate(n);
    ASSERT_TRUE(b);
    std::memset(b.get(), 0xEE, n);  // all of it: a block overlapping a kept one spoils it
    stamp(b.get(), n, i);
    Kept& slot = churn[rng() % churn.size()];
    if (slot.block) {
      EXPECT_TRUE(stamped(slot.block.get(), slot.n, slot.seed)) << i;
    }
    slot = {std::move(b), n, i};
  }
  for (const Kept& k : kept) {
    EXPECT_EQ(first_mismatch(k.block.get(), k.n, k.seed), k.n) << "block of " << k.n << " bytes";
  }
  EXPECT_GT(pool.counters().hits, 2000u);
}

TEST(PoolTest, ALargeRequestTakesAFreeRegionUpToTwiceItsSize) {
  Pool pool;
  auto big = pool.allocate(20 * kMiB);
  ASSERT_TRUE(big);
  fill(big.get(), 20 * kMiB, 1);
  std::byte* const region = big.get();
  big.reset();
  const PoolCounters warm = pool.counters();
  {
    auto b = pool.allocate(11 * kMiB);  // 12 MiB class, none free: the 20 MiB one serves it
    ASSERT_TRUE(b);
    EXPECT_EQ(b.get(), region);
    fill(b.get(), 11 * kMiB, 2);
    EXPECT_EQ(pool.counters().in_use_bytes, 20 * kMiB);  // the block is its region's class
    auto c = pool.allocate(11 * kMiB);                   // while it is taken, a region of its own
    ASSERT_TRUE(c);
    EXPECT_NE(c.get(), region);
    EXPECT_EQ(first_mismatch(b.get(), 11 * kMiB, 2), 11 * kMiB);
  }
  PoolCounters k = pool.counters();
  EXPECT_EQ(k.hits, warm.hits + 1);
  EXPECT_EQ(k.misses, warm.misses + 1);
  EXPECT_EQ(k.in_use_bytes, 0u);
  // Twice the class is the limit: an 8 MiB request (8 MiB class) does not take 20 MiB...
  auto mine = pool.allocate(12 * kMiB);  // (the 12 MiB region, taken out of the way)
  ASSERT_TRUE(mine);
  auto d = pool.allocate(8 * kMiB);
  ASSERT_TRUE(d);
  EXPECT_NE(d.get(), region);
  EXPECT_EQ(pool.counters().misses, k.misses + 1);
  // ...and small requests never take a large region.
  auto e = pool.allocate(64 * kKiB);
  ASSERT_TRUE(e);
  EXPECT_EQ(pool.counters().misses, k.misses + 2);
}

// A large request with no free region of its size or up to twice it grows the largest free
// smaller one: the pool holds the larger size only (not both), the listeners hear the old region
// go and the grown one come at its new address, and the whole block is usable memory.
TEST(PoolTest, ALargeRequestGrowsTheLargestFreeSmallerRegion) {
  Pool pool(PoolOptions{.cap_bytes = 64 * kMiB});
  std::map<std::byte*, size_t> regions;  // announced and not removed
  std::vector<std::string> heard;
  auto listener = pool.add_region_listener(
      [&](std::span<std::byte> r) {
        EXPECT_TRUE(regions.emplace(r.data(), r.size()).second);
        heard.push_back("added " + std::to_string(r.size() / kMiB));
      },
      [&](std::span<std::byte> r) {
        EXPECT_TRUE(announced(regions, r));
        regions.erase(r.data());
        heard.push_back("removed " + std::to_string(r.size() / kMiB));
      });
  {
    auto four = pool.allocate(4 * kMiB);  // free regions of 4 and 8 MiB
    auto eight = pool.allocate(8 * kMiB);
  }
  heard.clear();
  const PoolCounters before = pool.counters();
  ASSERT_EQ(before.held_bytes, 12 * kMiB);
  auto big = pool.allocate(20 * kMiB);  // none of 20-40 MiB free: the 8 MiB one grows
  ASSERT_TRUE(big);
  fill(big.get(), 20 * kMiB, 5);
  EXPECT_EQ(first_mismatch(big.get(), 20 * kMiB, 5), 20 * kMiB);
  PoolCounters k = pool.counters();
  EXPECT_EQ(k.held_bytes, 24 * kMiB);  // 4 + 20: the 8 MiB became 20
  EXPECT_EQ(k.in_use_bytes, 20 * kMiB);
  EXPECT_EQ(k.misses, before.misses + 1);
  EXPECT_EQ(k.regions_created, before.regions_created);
  EXPECT_EQ(heard, (std::vector<std::string>{"removed 8", "added 20"}));
  const auto region = pool.region_of(big.get(), 20 * kMiB);
  EXPECT_EQ(region.data(), big.get());
  EXPECT_EQ(region.size(), 20 * kMiB);
  EXPECT_TRUE(announced(regions, region));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(big.get()) % kRegionAlign, 0u);
  // Given back, it serves its own size again; the 4 MiB one is still there for its own.
  std::byte* const grown = big.get();
  big.reset();
  auto again = pool.allocate(20 * kMiB);
  auto four = pool.allocate(4 * kMiB);
  EXPECT_EQ(again.get(), grown);
  EXPECT_EQ(pool.counters().hits, k.hits + 2);
  EXPECT_EQ(pool.counters().held_bytes, 24 * kMiB);
  // The cap: 24 held (20 live), 40 more fits under 64: the free 4 MiB region grows to 40 (60
  // held); then nothing is free and 8 more does not fit: plain memory.
  four.reset();
  auto forty = pool.allocate(40 * kMiB);
  ASSERT_TRUE(forty);
  EXPECT_EQ(pool.region_of(forty.get(), 40 * kMiB).size(), 40 * kMiB);
  EXPECT_EQ(pool.counters().held_bytes, 60 * kMiB);
  auto over = pool.allocate(8 * kMiB);
  ASSERT_TRUE(over);
  EXPECT_TRUE(pool.region_of(over.get(), 1).empty());
  EXPECT_EQ(pool.counters().fallbacks, 1u);
  again.reset();
  forty.reset();
  over.reset();
  pool.trim_all_idle();
  EXPECT_TRUE(regions.empty());
  EXPECT_EQ(pool.counters().held_bytes, 0u);
}

// Whether every page of [p, p + n) is resident (mincore): a pre-faulted region's are.
bool resident(const std::byte* p, size_t n) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> in((n + page - 1) / page);
  if (mincore(const_cast<std::byte*>(p), n, in.data()) != 0) return false;
  return std::all_of(in.begin(), in.end(), [](unsigned char c) { return (c & 1) != 0; });
}

// Whether this kernel pre-faults on request (MADV_POPULATE_WRITE, Linux 5.14); without it the
// pool's pages fault on first touch and nothing is resident in advance.
bool kernel_populates() {
  void* m = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  const bool ok = m != MAP_FAILED && madvise(m, 4096, 23 /* MADV_POPULATE_WRITE */) == 0;
  if (m != MAP_FAILED) munmap(m, 4096);
  return ok;
}

// A new or grown region is resident whole when it is handed out, however many threads faulted it
// in (its slices cover it, odd sizes included), and its memory works.
TEST(PoolTest, RegionsArePreFaultedWholeByEveryThreadCount) {
  if (!kernel_populates()) {
    GTEST_SKIP() << "SKIPPED: this kernel lacks MADV_POPULATE_WRITE (Linux < 5.14)";
  }
  for (unsigned threads : {0u, 1u, 2u, 3u, 4u, 16u}) {
    Pool pool(PoolOptions{.cap_bytes = 256 * kMiB, .populate_threads = threads});
    // Growing a free region faults in only the added part, in slices as well.
    pool.allocate(4 * kMiB).reset();
    auto grown = pool.allocate(30 * kMiB);
    ASSERT_TRUE(grown);
    ASSERT_EQ(pool.counters().regions_created, 1u) << "the free 4 MiB region did not grow";
    EXPECT_TRUE(resident(grown.get(), 30 * kMiB)) << "grown, " << threads << " threads";
    fill(grown.get(), 30 * kMiB, 3);
    EXPECT_EQ(first_mismatch(grown.get(), 30 * kMiB, 3), 30 * kMiB);
    for (size_t size : {kMiB, 8 * kMiB, 10 * kMiB, 38 * kMiB, 64 * kMiB}) {
      auto block = pool.allocate(size);
      ASSERT_TRUE(block);
      const auto region = pool.region_of(block.get(), size);
      ASSERT_FALSE(region.empty());
      EXPECT_TRUE(resident(region.data(), region.size()))
          << size / kMiB << " MiB with " << threads << " threads";
      fill(block.get(), size, static_cast<uint32_t>(size));
      EXPECT_EQ(first_mismatch(block.get(), size, static_cast<uint32_t>(size)), size);
    }
  }
}

TEST(PoolTest, BeyondTheCapAllocationsFallBack) {
  Pool pool(PoolOptions{.cap_bytes = 4 * kMiB});
  auto a = pool.allocate(3 * kMiB);  // a 4 MiB region: the whole cap
  auto b = pool.allocate(3 * kMiB);  // no room left
  auto c = pool.allocate(64);        // a slab would pass the cap
  auto d = pool.allocate(8 * kMiB);  // larger than the cap
  for (auto [block, n] :
       {std::pair{&a, 3 * kMiB}, {&b, 3 * kMiB}, {&c, size_t{64}}, {&d, 8 * kMiB}}) {
    ASSERT_TRUE(*block);
    std::memset(block->get(), 0x11, n);
  }
  const PoolCounters k = pool.counters();
  EXPECT_EQ(k.fallbacks, 3u);
  EXPECT_EQ(k.fallback_bytes, 3 * kMiB + 64 + 8 * kMiB);
  EXPECT_EQ(k.regions_created, 1u);
  EXPECT_EQ(k.held_bytes, 4 * kMiB);
  EXPECT_EQ(k.in_use_bytes, 4 * kMiB);
  EXPECT_FALSE(pool.region_of(a.get(), 3 * kMiB).empty());
  EXPECT_TRUE(pool.region_of(b.get(), 1).empty());
  EXPECT_TRUE(pool.region_of(c.get(), 1).empty());
}

TEST(PoolTest, ZeroCapMakesEveryAllocationAFallback) {
  Pool pool(PoolOptions{.cap_bytes = 0});
  for (size_t n : {size_t{0}, size_t{64}, 100 * kKiB, 4 * kMiB}) {
    auto b = pool.allocate(n);
    ASSERT_TRUE(b);
    std::memset(b.get(), 0x22, std::max<size_t>(n, 1));
    EXPECT_EQ(reinterpret_cast<uintptr_t>(b.get()) % kBlockAlign, 0u);
  }
  const PoolCounters k = pool.counters();
  EXPECT_EQ(k.fallbacks, 4u);
  EXPECT_EQ(k.regions_created, 0u);
  EXPECT_EQ(k.held_bytes, 0u);
  EXPECT_EQ(k.hits + k.misses, 0u);
}

TEST(PoolTest, AtTheCapFreeRegionsMakeRoomButLiveOnesDoNot) {
  Pool pool(PoolOptions{.cap_bytes = 4 * kMiB});
  pool.allocate(3 * kMiB).reset();  // leaves a wholly free 4 MiB region
  auto small = pool.allocate(64);   // its slab fits once that region is unmapped
  ASSERT_TRUE(small);
  PoolCounters k = pool.counters();
  EXPECT_EQ(k.fallbacks, 0u);
  EXPECT_EQ(k.regions_trimmed, 1u);
  EXPECT_EQ(k.regions_created, 2u);
  EXPECT_EQ(k.held_bytes, 2 * kMiB);
  auto big = pool.allocate(3 * kMiB);  // the live slab cannot go: plain memory
  ASSERT_TRUE(big);
  k = pool.counters();
  EXPECT_EQ(k.fallbacks, 1u);
  EXPECT_EQ(k.regions_trimmed, 1u);
  EXPECT_EQ(k.held_bytes, 2 * kMiB);
}

TEST(PoolTest, TrimUnmapsOnlyRegionsIdleLongEnough) {
  Pool pool(PoolOptions{.idle_trim = 10s});
  auto large = pool.allocate(8 * kMiB);
  auto kept_large = pool.allocate(8 * kMiB);
  auto small = pool.allocate(64 * kKiB);
  auto small_kept = pool.allocate(64 * kKiB);  // same slab as `small`
  auto lone = pool.allocate(100);              // a slab of its own class
  ASSERT_TRUE(large && kept_large && small && small_kept && lone);
  EXPECT_EQ(pool.counters().regions_created, 4u);
  large.reset();
  small.reset();
  lone.reset();

  const auto now = std::chrono::steady_clock::now();
  pool.trim(now);  // just freed: not idle for 10 s yet
  EXPECT_EQ(pool.counters().regions_trimmed, 0u);
  pool.trim(now + 1h);
  PoolCounters k = pool.counters();
  EXPECT_EQ(k.regions_trimmed, 2u);  // `large`'s region and `lone`'s slab
  EXPECT_EQ(k.held_bytes, 8 * kMiB + 2 * kMiB);
  // The regions with live blocks are still mapped: writing faults otherwise.
  std::memset(kept_large.get(), 0x33, 8 * kMiB);
  std::memset(small_kept.get(), 0x33, 64 * kKiB);
  EXPECT_FALSE(pool.region_of(small_kept.get(), 64 * kKiB).empty());

  small_kept.reset();
  kept_large.reset();
  pool.trim_all_idle();
  k = pool.counters();
  EXPECT_EQ(k.regions_trimmed, 4u);
  EXPECT_EQ(k.held_bytes, 0u);
}

TEST(PoolTest, TrimWithARealClock) {
  Pool pool(PoolOptions{.idle_trim = 1ms});
  pool.allocate(4 * kMiB).reset();
  std::this_thread::sleep_for(20ms);
  pool.trim();
  EXPECT_EQ(pool.counters().regions_trimmed, 1u);
  EXPECT_EQ(pool.counters().held_bytes, 0u);
}

TEST(PoolTest, BlocksOutliveThePool) {
  auto pool = std::make_unique<Pool>();
  int added = 0;
  int removed = 0;
  auto listener = pool->add_region_listener([&](std::span<std::byte>) { ++added; },
                                            [&](std::span<std::byte>) { ++removed; });
  std::vector<std::pair<std::shared_ptr<std::byte[]>, size_t>> blocks;
  for (size_t n : {size_t{64}, size_t{5000}, 64 * kKiB, 2 * kMiB, 8 * kMiB}) {
    blocks.emplace_back(pool->allocate(n), n);
    ASSERT_TRUE(blocks.back().first);
  }
  pool->allocate(16 * kMiB).reset();  // wholly free when the pool goes
  EXPECT_EQ(added, 6);
  pool.reset();
  EXPECT_EQ(removed, 1);
  for (auto& [block, n] : blocks) {
    fill(block.get(), n, 5);
    EXPECT_EQ(first_mismatch(block.get(), n, 5), n);
    block.reset();  // its region goes with it
  }
  EXPECT_EQ(removed, 6);
}

TEST(PoolTest, BlocksOutliveThePoolWithoutListeners) {
  auto pool = std::make_unique<Pool>();
  auto small = pool->allocate(100);
  auto large = pool->allocate(6 * kMiB);
  pool.reset();
  std::memset(small.get(), 0x44, 100);
  std::memset(large.get(), 0x44, 6 * kMiB);
  small.reset();
  large.reset();  // the last block: the state goes and unmaps what is left
}

TEST(PoolTest, ListenersHearOfEachRegionOnce) {
  Pool pool(PoolOptions{.cap_bytes = 64 * kMiB});
  auto a = pool.allocate(8 * kMiB);
  auto b = pool.allocate(1000);
  std::map<std::byte*, size_t> regions;  // announced and not removed
  int added = 0;
  int removed = 0;
  uint64_t in_use_when_added = 0;
  auto listener = pool.add_region_listener(
      [&](std::span<std::byte> r) {
        EXPECT_TRUE(regions.emplace(r.data(), r.size()).second);
        ++added;
        in_use_when_added = pool.counters().in_use_bytes;  // allowed from a callback
      },
      [&](std::span<std::byte> r) {
        EXPECT_TRUE(announced(regions, r));
        pool.region_of(r.data(), r.size());  // allowed from a callback
        regions.erase(r.data());
        ++removed;
      });
  EXPECT_EQ(added, 2);  // replayed: a's region and b's slab
  EXPECT_TRUE(announced(regions, pool.region_of(a.get(), 8 * kMiB)));
  EXPECT_TRUE(announced(regions, pool.region_of(b.get(), 1000)));

  const uint64_t in_use_before = pool.counters().in_use_bytes;
  auto c = pool.allocate(4 * kMiB);
  EXPECT_EQ(added, 3);
  EXPECT_EQ(in_use_when_added, in_use_before);  // announced before its block was handed out
  EXPECT_TRUE(announced(regions, pool.region_of(c.get(), 4 * kMiB)));
  auto d = pool.allocate(1000);  // b's slab has room: nothing new
  EXPECT_EQ(added, 3);
  EXPECT_EQ(pool.region_of(d.get(), 1).data(), pool.region_of(b.get(), 1).data());

  auto f = pool.allocate(100 * kMiB);  // over the cap: plain memory, never announced
  ASSERT_TRUE(f);
  EXPECT_EQ(added, 3);
  EXPECT_TRUE(pool.region_of(f.get(), 1).empty());
  int on_stack = 0;
  EXPECT_TRUE(pool.region_of(&on_stack, sizeof(on_stack)).empty());
  const auto slab = pool.region_of(b.get() + 10, 990);
  EXPECT_EQ(slab.size(), kRegionAlign);
  EXPECT_LE(slab.data(), b.get());
  EXPECT_TRUE(pool.region_of(a.get(), 8 * kMiB + 1).empty());  // runs past a's region

  a.reset();
  b.reset();
  c.reset();
  d.reset();
  f.reset();
  pool.trim_all_idle();
  EXPECT_EQ(removed, 3);
  EXPECT_TRUE(regions.empty());

  auto e = pool.allocate(8 * kMiB);
  EXPECT_EQ(added, 4);
  RegionListener moved = std::move(listener);
  moved.reset();
  auto g = pool.allocate(2 * kMiB + 1);
  e.reset();
  g.reset();
  pool.trim_all_idle();
  EXPECT_EQ(added, 4);
  EXPECT_EQ(removed, 3);
  EXPECT_EQ(pool.counters().regions_trimmed, 5u);
}

TEST(PoolTest, BlocksAreCacheLineAlignedAndRegionsHugePageAligned) {
  Pool pool;
  std::vector<std::shared_ptr<std::byte[]>> keep;
  for (size_t n : {size_t{0}, size_t{1}, size_t{63}, size_t{64}, size_t{65}, size_t{100},
                   size_t{257}, size_t{1000}, size_t{4097}, 64 * kKiB + 1, size_t{300000}, kMiB - 1,
                   kMiB, kMiB + 1, 5 * kMiB, 33 * kMiB}) {
    auto b = pool.allocate(n);
    ASSERT_TRUE(b) << n;
    const size_t len = std::max<size_t>(n, 1);
    std::memset(b.get(), 0x55, len);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(b.get()) % kBlockAlign, 0u) << n;
    const auto region = pool.region_of(b.get(), len);
    ASSERT_FALSE(region.empty()) << n;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(region.data()) % kRegionAlign, 0u) << n;
    EXPECT_EQ(region.size() % kRegionAlign, 0u) << n;
    if (n > kSmallBlockMax) {
      EXPECT_EQ(region.data(), b.get()) << n;  // a region of its own
    }
    keep.push_back(std::move(b));
  }
}

// The class a request is rounded to, seen through in_use_bytes.
TEST(PoolTest, SizeClassesBoundWaste) {
  Pool pool;
  std::vector<size_t> sizes;
  for (size_t n = 1; n <= 5000; ++n) sizes.push_back(n);
  for (size_t p = 13; p <= 26; ++p) {
    for (size_t n :
         {(size_t{1} << p) - 1, size_t{1} << p, (size_t{1} << p) + 1, (size_t{5} << p) / 4 + 3}) {
      sizes.push_back(n);
    }
  }
  for (size_t n : sizes) {
    auto b = pool.allocate(n);
    ASSERT_TRUE(b);
    const size_t block = pool.counters().in_use_bytes;
    EXPECT_GE(block, n);
    if (n <= 4 * kBlockAlign) {
      EXPECT_LT(block - n, kBlockAlign) << n;
    } else if (n <= kSmallBlockMax) {
      EXPECT_LE(block - n, n / 4) << n;
    } else if (n <= 32 * kMiB) {
      EXPECT_LT(block - n, kRegionAlign) << n;
    } else {
      EXPECT_LE(block - n, n / 8) << n;
    }
    b.reset();
    if (pool.counters().held_bytes > 256 * kMiB) pool.trim_all_idle();
  }
}

TEST(PoolTest, ManyThreadsAllocateAndDropConcurrently) {
  // A cap below what the threads could hold at once, so reclaiming and falling back run too.
  Pool pool(PoolOptions{.cap_bytes = 96 * kMiB});
  const std::vector<size_t> sizes = {64,         200,      4096,         64 * kKiB,
                                     300 * kKiB, 1 * kMiB, 2 * kMiB + 1, 6 * kMiB};
  constexpr int kThreads = 4;
  constexpr int kOps = 20000;
  std::atomic<int> running{kThreads};
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(t);
      struct Slot {
        std::shared_ptr<std::byte[]> block;
        size_t n = 0;
        uint64_t tag = 0;
      };
      std::vector<Slot> slots(8);
      for (int op = 0; op < kOps; ++op) {
        Slot& s = slots[rng() % slots.size()];
        if (s.block && !stamped(s.block.get(), s.n, s.tag)) ++failures;
        s.n = sizes[rng() % sizes.size()];
        s.tag = (uint64_t(t) << 32) | uint64_t(op);
        s.block = pool.allocate(s.n);  // the old block goes back here
        if (!s.block) {
          ++failures;
          continue;
        }
        stamp(s.block.get(), s.n, s.tag);
      }
      --running;
    });
  }
  // Meanwhile: trimming, counters, region lookups and a listener that joins mid-run.
  std::mutex mu;
  std::map<std::byte*, size_t> regions;
  int bad_removals = 0;
  RegionListener listener;
  int rounds = 0;
  while (running > 0) {
    if (++rounds == 20) {
      listener = pool.add_region_listener(
          [&](std::span<std::byte> r) {
            std::lock_guard lock(mu);
            if (!regions.emplace(r.data(), r.size()).second) ++bad_removals;
          },
          [&](std::span<std::byte> r) {
            std::lock_guard lock(mu);
            if (!announced(regions, r)) ++bad_removals;
            regions.erase(r.data());
          });
    }
    pool.trim_all_idle();
    const PoolCounters k = pool.counters();
    EXPECT_LE(k.held_bytes, 96 * kMiB);
    std::this_thread::sleep_for(2ms);
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures, 0);
  PoolCounters k = pool.counters();
  EXPECT_EQ(k.in_use_bytes, 0u);
  EXPECT_EQ(k.hits + k.misses + k.fallbacks, uint64_t{kThreads} * kOps);
  EXPECT_GT(k.hits, k.misses);
  pool.trim_all_idle();
  k = pool.counters();
  EXPECT_EQ(k.held_bytes, 0u);
  EXPECT_EQ(k.regions_created, k.regions_trimmed);
  std::lock_guard lock(mu);
  EXPECT_EQ(bad_removals, 0);
  EXPECT_TRUE(regions.empty());  // every region announced was removed, and only those
}

TEST(PoolTest, CapFromEnvironment) {
  const char* saved = std::getenv("FERRY_POOL_BYTES");
  const std::string restore = saved ? saved : "";
  const size_t kFallback = 777;
  unsetenv("FERRY_POOL_BYTES");
  EXPECT_EQ(pool_cap_from_env(kFallback), kFallback);
  const std::pair<const char*, size_t> cases[] = {
      {"12345", 12345},
      {"0", 0},
      {"64K", 64 * kKiB},
      {"64k", 64 * kKiB},
      {"3M", 3 * kMiB},
      {"2g", size_t{2} << 30},
      {"", kFallback},
      {"12X", kFallback},
      {"12KB", kFallback},
      {"abc", kFallback},
      {"-1", kFallback},
      {"1.5G", kFallback},
      {" 5", kFallback},
      {"5 ", kFallback},
      {"99999999999G", kFallback},
      {"18446744073709551616", kFallback},
  };
  for (auto [text, want] : cases) {
    setenv("FERRY_POOL_BYTES", text, 1);
    EXPECT_EQ(pool_cap_from_env(kFallback), want) << '"' << text << '"';
  }
  if (saved) {
    setenv("FERRY_POOL_BYTES", restore.c_str(), 1);
  } else {
    unsetenv("FERRY_POOL_BYTES");
  }
}

}  // namespace
}  // namespace ferry::mem
