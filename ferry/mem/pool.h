/// @file
/// Pool: recycled receive memory, so that a steady-state fetch touches no new pages and
/// registers nothing.
///
/// Memory comes in regions: anonymous mappings, 2 MiB aligned and advised for transparent huge
/// pages, pre-faulted when they are made (so bytes arriving from a socket or a NIC never wait for
/// a page fault). A block larger than kSmallBlockMax has a region of its own; smaller blocks are
/// carved from 2 MiB slabs, one size class per slab. A block given back goes to the free list of
/// its class and serves the next allocation of that class; a large request whose class has no
/// free region takes a free one of a larger class, up to twice its size, else grows the largest
/// free one of a smaller class (mremap: its pages move, only the added ones are new), before a new
/// one is made.
/// Regions wholly free for PoolOptions::idle_trim are unmapped by trim(), which the owner calls;
/// the pool has no thread or timer of its own.
///
/// Region listeners let the RDMA side register each region once, when it appears, and deregister
/// it before it is unmapped; region_of() gives the registration hint for a block.
///
/// Thread model: every method may be called from any thread. Blocks may be dropped from any
/// thread at any time, including after the Pool itself was destroyed: blocks keep the pool's
/// internal state alive, and each region is unmapped when its last block goes.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string_view>

/// Receive memory: the recycled, pre-faulted Pool behind ContextOptions::pool_bytes.
namespace ferry::mem {

namespace detail {
class PoolState;
}  // namespace detail

/// Bytes in a slab, and the alignment of every region: the x86-64 transparent huge page.
inline constexpr size_t kRegionAlign = size_t{2} << 20;
/// The largest block carved from a slab: half a slab, so that a slab holds at least two blocks;
/// above it a block would take a slab to itself anyway, so it gets its own region.
inline constexpr size_t kSmallBlockMax = kRegionAlign / 2;
/// Alignment of every block, pool or fallback: a cache line.
inline constexpr size_t kBlockAlign = 64;

/// How a Pool is sized and trimmed (ContextOptions::pool_bytes and pool_idle_trim for a Context's).
struct PoolOptions {
  /// The most bytes of regions the pool holds. An allocation that would need more gets plain
  /// memory (a fallback). 0 disables the pool: every allocation is a fallback.
  size_t cap_bytes = size_t{2} << 30;
  /// How long a region must have been wholly free before trim() unmaps it.
  std::chrono::milliseconds idle_trim{10000};
  /// Threads that fault a new region in together, the allocating one included: at most one per
  /// kPopulateSlice of it and one per core the process may run on (its affinity mask). Zeroing
  /// fresh pages is most of what a new region costs, and it runs in parallel; 1 faults on the
  /// allocating thread alone.
  unsigned populate_threads = 4;
};

/// The least a thread faults in when a new region is faulted in by several
/// (PoolOptions::populate_threads): below it starting the thread costs more than it saves.
inline constexpr size_t kPopulateSlice = size_t{4} << 20;

/// A Pool's gauges and counters (Pool::counters()): a snapshot, consistent as a whole.
struct PoolCounters {
  uint64_t held_bytes = 0;    ///< bytes of regions mapped now (and reserved for ones being made)
  uint64_t in_use_bytes = 0;  ///< bytes of live pool blocks, at their size-class size; no fallbacks
  uint64_t hits = 0;          ///< allocations served from memory already held
  uint64_t misses = 0;        ///< allocations that made a new region or slab, or grew a free region
  uint64_t fallbacks = 0;     ///< allocations served with plain memory (cap reached or disabled)
  uint64_t fallback_bytes = 0;   ///< bytes requested by those fallbacks, in total
  uint64_t regions_created = 0;  ///< regions and slabs mapped
  /// regions and slabs unmapped (idle, or to make room under the cap)
  uint64_t regions_trimmed = 0;
};

/// The registration of one pair of region callbacks (Pool::add_region_listener). Destroying it,
/// or reset(), unregisters them: once that returns, neither callback runs again. Movable, not
/// copyable. It keeps the pool's internal state alive, so it may outlive the Pool.
class RegionListener {
 public:
  RegionListener() = default;
  /// Takes over `other`'s registration; `other` is left empty.
  RegionListener(RegionListener&& other) noexcept;
  /// Unregisters this one's callbacks (as reset()), then takes over `other`'s registration.
  RegionListener& operator=(RegionListener&& other) noexcept;
  ~RegionListener();

  /// Unregisters now (no-op when empty). Blocks while a callback of this pool runs on another
  /// thread; must not be called from one.
  void reset() noexcept;

 private:
  friend class Pool;
  RegionListener(std::shared_ptr<detail::PoolState> state, uint64_t id);
  std::shared_ptr<detail::PoolState> state_;
  uint64_t id_ = 0;
};

/// Recycled receive memory (see this file's comment): allocate() hands out blocks that return to
/// the pool when their last reference goes. Not copyable; every method may be called from any
/// thread.
class Pool {
 public:
  /// A region callback (add_region_listener): gets the whole region, as mapped.
  using RegionFn = std::function<void(std::span<std::byte>)>;

  /// An empty pool: maps nothing until the first allocation that needs a region.
  explicit Pool(PoolOptions options = {});
  /// Unmaps every region wholly free now; the rest go when their last block does.
  ~Pool();
  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;

  /// A block of at least `bytes` bytes (0 gives a valid block too), kBlockAlign aligned, its
  /// contents unspecified. Dropping the last reference gives it back, from any thread, at any
  /// time (also after the Pool is gone). Served from a free block of its size class when there
  /// is one; otherwise from a free region grown to the size (running the `removed` callbacks for
  /// it, then the `added` ones for it at its new address) or a new region or slab (running the
  /// `added` callbacks on this thread first) if the cap allows, after unmapping wholly free regions
  /// if that makes room; otherwise from plain memory, counted as a fallback. Never throws: null
  /// when memory cannot be had (a failed mmap or pre-fault, std::bad_alloc), for the caller to fail
  /// its operation with.
  std::shared_ptr<std::byte[]> allocate(size_t bytes) noexcept;

  /// Unmaps the regions that have been wholly free since at least `now - idle_trim`, after
  /// running the `removed` callbacks for each on this thread. Never touches a region with a live
  /// block.
  void trim(std::chrono::steady_clock::time_point now = std::chrono::steady_clock::now()) noexcept;
  /// Unmaps every region wholly free now, however recently (tests, shutdown).
  void trim_all_idle() noexcept;

  /// Registers callbacks for the pool's regions (slabs included; fallback blocks never).
  /// `added` runs now, on this thread, for every region that exists, then for each region made
  /// later, on the allocating thread, before any block of it is handed out. `removed` runs for a
  /// region before it is unmapped or moved, on the thread that trims, that allocates at the cap
  /// (making room) or by growing a free region (which `added` then announces at its new address),
  /// or that drops the last block of a destroyed pool. Either may be empty. Callbacks run
  /// one at a time, with the pool's listener lock held but not its data lock: they may call
  /// counters() and region_of() and drop blocks of a live pool; they must not throw, call any
  /// other method of this pool, destroy a RegionListener of it or drop a block once the Pool is
  /// being destroyed (those deadlock). The returned handle unregisters them when destroyed.
  /// Throws std::bad_alloc only.
  RegionListener add_region_listener(RegionFn added, RegionFn removed);

  /// The whole region holding [p, p + len) when that is pool memory, else an empty span (a
  /// fallback block, foreign memory). A large block's region is the block's own mapping; a small
  /// block's is its slab. Valid while a block in it lives.
  std::span<std::byte> region_of(const void* p, size_t len) const noexcept;

  /// The gauges and counters now. Any thread, also from a region callback.
  PoolCounters counters() const noexcept;

 private:
  std::shared_ptr<detail::PoolState> state_;
};

/// A byte count written as digits, optionally followed by K, M or G (either case; powers of
/// 1024): "1073741824", "1G". nullopt for anything else, and for a count that does not fit.
std::optional<size_t> parse_byte_count(std::string_view text);

/// $FERRY_POOL_BYTES as a byte count (parse_byte_count). `fallback` when unset, empty or not
/// parsable (the caller logs that).
size_t pool_cap_from_env(size_t fallback);

}  // namespace ferry::mem
