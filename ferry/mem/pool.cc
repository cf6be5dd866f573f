#include "ferry/mem/pool.h"

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>
#include <mutex>
#include <new>
#include <string_view>
#include <thread>
#include <vector>

#include "ferry/net/system/cpus.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14; older C libraries lack the name
#endif

namespace ferry::mem {
namespace {

using Clock = std::chrono::steady_clock;

// Large classes are whole huge pages up to here (a block wastes under one huge page), then eight
// per power of two (a block wastes under 12.5 % of itself).
constexpr size_t kLinearLargeMax = size_t{32} << 20;
// Above this no request is pooled: rounding it up to a class could overflow.
constexpr size_t kMaxPooled = size_t{1} << 62;

// Small classes: multiples of kBlockAlign up to 256 B (alignment forces that step; a block
// wastes under 64 B), then four per power of two (a block wastes under 25 % of itself). Every
// class is a multiple of kBlockAlign, so every block carved at class-size offsets is aligned.
size_t small_class(size_t n) {
  if (n <= 4 * kBlockAlign) return (n + kBlockAlign - 1) & ~(kBlockAlign - 1);
  const int p = std::bit_width(n - 1) - 1;  // 2^p < n <= 2^(p+1)
  const size_t step = size_t{1} << (p - 2);
  return (n + step - 1) & ~(step - 1);
}

size_t large_class(size_t n) {
  if (n <= kLinearLargeMax) return (n + kRegionAlign - 1) & ~(kRegionAlign - 1);
  const int p = std::bit_width(n - 1) - 1;
  const size_t step = size_t{1} << (p - 3);  // a multiple of kRegionAlign, as p >= 25
  return (n + step - 1) & ~(step - 1);
}

struct Class;

// One mapping: a slab of small blocks, or the single block of a large class. Guarded by
// PoolState::mu_, except base, size, block and cls, which never change.
struct Region {
  std::byte* base = nullptr;
  size_t size = 0;
  size_t block = 0;              // the class size
  Class* cls = nullptr;          // never invalidated: classes are never erased
  size_t capacity = 0;           // blocks it holds
  size_t carved = 0;             // blocks handed out at least once: a slab is carved lazily
  size_t used = 0;               // live blocks; 0 = wholly free, the only state trimming touches
  void* free = nullptr;          // given-back blocks, linked through their first 8 bytes
  Clock::time_point idle_since;  // when used last became 0
  bool listed = false;           // in cls's list, which holds exactly the regions with room
  Region* prev = nullptr;
  Region* next = nullptr;  // also links regions being unmapped
};

// The regions of one size class that have room, most recently given a block back first: a
// recently used region is taken again, so old ones stay wholly free and get trimmed.
struct Class {
  Region* head = nullptr;
};

bool has_room(const Region& r) { return r.free != nullptr || r.carved < r.capacity; }

void unlink(Region& r) {
  if (r.prev) r.prev->next = r.next;
  if (r.next) r.next->prev = r.prev;
  if (r.cls->head == &r) r.cls->head = r.next;
  r.prev = r.next = nullptr;
  r.listed = false;
}

void push_front(Region& r) {
  if (r.listed) unlink(r);
  r.next = r.cls->head;
  if (r.next) r.next->prev = &r;
  r.cls->head = &r;
  r.listed = true;
}

// Requires has_room(r).
std::byte* take(Region& r) {
  std::byte* p;
  if (r.free) {
    p = static_cast<std::byte*>(r.free);
    std::memcpy(&r.free, p, sizeof(void*));
  } else {
    p = r.base + r.carved++ * r.block;
  }
  ++r.used;
  if (r.listed && !has_room(r)) unlink(r);
  return p;
}

void give(Region& r, std::byte* p, Clock::time_point now) {
  std::memcpy(p, &r.free, sizeof(void*));
  r.free = p;
  if (--r.used == 0) r.idle_since = now;
  push_front(r);
}

// Pre-faults [p, p + n) writable. False when the memory is not there (ENOMEM and the like:
// better to fail now than fault later); true also where the kernel lacks MADV_POPULATE_WRITE
// (< 5.14): pages then fault on first touch, as plain memory does, and are reused without
// faulting after that.
bool populate(std::byte* p, size_t n) {
  static std::atomic<bool> supported{true};
  if (n == 0 || !supported.load(std::memory_order_relaxed) ||
      madvise(p, n, MADV_POPULATE_WRITE) == 0) {
    return true;
  }
  if (errno != EINVAL) return false;
  supported.store(false, std::memory_order_relaxed);
  return true;
}

// Pre-faults [p, p + n) as populate() does, with up to `threads` threads (this one included),
// each a slice of whole huge pages, at least kPopulateSlice. Every thread is joined before it
// returns. A thread that cannot be started leaves its share to this one.
bool populate_parallel(std::byte* p, size_t n, unsigned threads) {
  const size_t slices = std::min<size_t>(threads, n / kPopulateSlice);
  if (slices <= 1) return populate(p, n);
  const size_t slice = (n / slices + kRegionAlign - 1) & ~(kRegionAlign - 1);
  std::atomic<bool> ok{true};
  std::vector<std::thread> helpers;
  size_t at = slice;  // [0, slice) is this thread's; [at, n) too once no thread could start
  try {
    helpers.reserve(slices - 1);
    for (; at < n; at += slice) {
      helpers.emplace_back([&ok, q = p + at, len = std::min(slice, n - at)] {
        if (!populate(q, len)) ok.store(false, std::memory_order_relaxed);
      });
    }
  } catch (const std::exception&) {  // std::system_error, std::bad_alloc: no thread for the rest
  }
  const bool mine = populate(p, std::min(slice, n)) && (at >= n || populate(p + at, n - at));
  for (auto& t : helpers) t.join();
  return mine && ok.load(std::memory_order_relaxed);
}

// `size` bytes of address space aligned to kRegionAlign with protection `prot`, or null.
std::byte* map_aligned(size_t size, int prot) {
  // Over-map by one alignment unit and cut the ends, so the mapping starts on a huge page.
  const size_t span = size + kRegionAlign;
  const int reserve_only = prot == PROT_NONE ? MAP_NORESERVE : 0;
  void* m = mmap(nullptr, span, prot, MAP_PRIVATE | MAP_ANONYMOUS | reserve_only, -1, 0);
  if (m == MAP_FAILED) return nullptr;
  const auto a = reinterpret_cast<uintptr_t>(m);
  const uintptr_t b = (a + kRegionAlign - 1) & ~(kRegionAlign - 1);
  if (b > a) munmap(m, b - a);
  if (a + span > b + size) munmap(reinterpret_cast<void*>(b + size), a + span - (b + size));
  return reinterpret_cast<std::byte*>(b);
}

// A fresh region of `size` bytes (a multiple of kRegionAlign), aligned to kRegionAlign, advised
// for huge pages and pre-faulted writable by up to `threads` threads. Null when the memory cannot
// be had.
std::byte* map_region(size_t size, unsigned threads) {
  std::byte* base = map_aligned(size, PROT_READ | PROT_WRITE);
  if (!base) return nullptr;
  madvise(base, size, MADV_HUGEPAGE);  // best effort: THP may be off or unsupported
  if (!populate_parallel(base, size, threads)) {
    munmap(base, size);
    return nullptr;
  }
  return base;
}

// The region [base, base + size) grown to `new_size` at a new address, aligned as map_region's:
// its pages move (no copy) and only the new tail is faulted in, by up to `threads` threads. Null
// when that cannot be done; the old mapping is gone either way.
std::byte* grow_mapping(std::byte* base, size_t size, size_t new_size, unsigned threads) {
  std::byte* to = map_aligned(new_size, PROT_NONE);  // where it goes: replaced by the move
  std::byte* grown = nullptr;
  if (to) {
    void* m = mremap(base, size, new_size, MREMAP_MAYMOVE | MREMAP_FIXED, to);
    if (m != MAP_FAILED) {
      grown = static_cast<std::byte*>(m);
    } else {
      munmap(to, new_size);
    }
  }
  if (!grown) {
    munmap(base, size);
    return nullptr;
  }
  madvise(grown, new_size, MADV_HUGEPAGE);
  if (!populate_parallel(grown + size, new_size - size, threads)) {
    munmap(grown, new_size);
    return nullptr;
  }
  return grown;
}

struct FallbackDeleter {
  void operator()(std::byte* p) const noexcept {
    ::operator delete[](p, std::align_val_t{kBlockAlign});
  }
};

}  // namespace

namespace detail {

// What a Pool, its blocks and its listener handles share. Lock order: listeners_mu_, then mu_.
// Callbacks run with listeners_mu_ alone, so adding or removing a region and announcing it are
// one step as seen by add_region_listener (no listener hears of a region twice, or of a removal
// without the addition); syscalls run with neither lock.
class PoolState : public std::enable_shared_from_this<PoolState> {
 public:
  explicit PoolState(PoolOptions options)
      : options_(options),
        populate_threads_(std::min(usable_cores(), std::max(options.populate_threads, 1u))) {}

  // Runs when the Pool, every block and every RegionListener are gone, so no listener is left
  // to tell.
  ~PoolState() {
    for (auto& [base, r] : regions_) munmap(r->base, r->size);
  }

  std::shared_ptr<std::byte[]> allocate(size_t bytes) noexcept;
  void give_back(Region* r, std::byte* p) noexcept;
  // Unmaps wholly free regions idle since `idle_before` or earlier. With `reserve` > 0 (an
  // allocation over the cap), unmaps the longest idle of them only until `reserve` more bytes fit
  // under the cap, and reserves them; unmaps nothing and returns false when they cannot fit.
  bool release_free(Clock::time_point idle_before, size_t reserve) noexcept;
  // Registers the pair and replays `added` for the regions there are; returns its id.
  uint64_t add_listener(Pool::RegionFn added, Pool::RegionFn removed);
  void remove_listener(uint64_t id) noexcept;
  std::span<std::byte> region_of(const void* p, size_t len) const noexcept;
  PoolCounters counters() const noexcept;
  void close() noexcept;
  const PoolOptions& options() const { return options_; }

 private:
  struct Listener {
    Pool::RegionFn added;
    Pool::RegionFn removed;
  };
  using RegionMap = std::map<uintptr_t, std::unique_ptr<Region>>;

  std::shared_ptr<std::byte[]> fallback(size_t bytes) noexcept;
  // A region with room of a large class above `block`, at most twice that class, the smallest
  // first; null when none. A free region held already serves a request of a size that has none of
  // its own (sizes that seldom repeat) instead of a new region faulted in beside it. mu_ held.
  Region* larger_free(size_t block);
  // A free region of the largest large class below `block`; null when none. mu_ held.
  Region* smaller_free(size_t block);
  std::byte* make_region(size_t block, size_t size, Region*& out) noexcept;
  // A large request with no free region of its size, `block` reserved under the cap: grows the
  // largest free smaller region to `block` (only the added bytes are new memory) and takes it.
  // The reservation then counts the grown region. Null when there is none, or the growth failed
  // (the region is then unmapped); the caller goes on as without it, its reservation intact.
  // Takes listeners_mu_, then mu_.
  std::byte* grow_free_region(size_t block, Region*& out) noexcept;
  // Announces a mapped region (`node`, in no table) to the listeners, puts it in the tables and
  // takes its first block; `created`: a new mapping (counted), not a grown one.
  std::byte* admit(RegionMap::node_type node, bool created, Region*& out) noexcept;
  // Moves a wholly free region from the tables onto `gone`; returns the next entry.
  RegionMap::iterator detach(RegionMap::iterator it, Region*& gone);

  const PoolOptions options_;
  const unsigned populate_threads_;  // options_.populate_threads, at most one per core
  std::mutex listeners_mu_;
  std::map<uint64_t, Listener> listeners_;
  uint64_t next_listener_ = 1;
  mutable std::mutex mu_;
  RegionMap regions_;                // by base address
  std::map<size_t, Class> classes_;  // by class size
  PoolCounters counters_;
  bool closed_ = false;  // the Pool is gone: a region is unmapped as soon as it is wholly free
};

namespace {

// Gives a pool block back; keeps the pool's state alive while the block lives.
struct Releaser {
  std::shared_ptr<PoolState> state;
  Region* region;  // stays valid: a region with a live block is never unmapped
  void operator()(std::byte* p) const noexcept { state->give_back(region, p); }
};

}  // namespace

std::shared_ptr<std::byte[]> PoolState::allocate(size_t bytes) noexcept {
  bytes = std::max<size_t>(bytes, 1);
  const size_t cap = options_.cap_bytes;
  if (bytes > cap || bytes > kMaxPooled) return fallback(bytes);
  const bool small = bytes <= kSmallBlockMax;
  const size_t block = small ? small_class(bytes) : large_class(bytes);
  const size_t size = small ? kRegionAlign : block;
  if (size > cap) return fallback(bytes);
  try {
    std::byte* p = nullptr;
    Region* r = nullptr;
    bool reserved = false;
    {
      std::lock_guard lock(mu_);
      Class& cls = classes_[block];
      if (Region* held = cls.head ? cls.head : small ? nullptr : larger_free(block)) {
        r = held;
        p = take(*r);
        ++counters_.hits;
        counters_.in_use_bytes += r->block;
      } else if (counters_.held_bytes + size <= cap) {
        counters_.held_bytes += size;  // reserved now, so racing allocations cannot pass the cap
        reserved = true;
      }
    }
    if (!p && !small && reserved) {
      // Growing a free smaller region faults in fewer pages than a new one (sizes that vary).
      p = grow_free_region(block, r);  // the reservation is the grown region's
    }
    if (!p) {
      if (!reserved && !release_free(Clock::time_point::max(), size)) return fallback(bytes);
      p = make_region(block, size, r);
      if (!p) return nullptr;
    }
    // On std::bad_alloc the constructor runs the Releaser: the block goes back.
    return std::shared_ptr<std::byte[]>(p, Releaser{shared_from_this(), r});
  } catch (const std::bad_alloc&) {
    return nullptr;
  }
}

Region* PoolState::larger_free(size_t block) {
  for (auto it = classes_.upper_bound(block); it != classes_.end() && it->first <= 2 * block;
       ++it) {
    if (it->second.head) return it->second.head;
  }
  return nullptr;
}

Region* PoolState::smaller_free(size_t block) {
  // A large region is listed in its class exactly while its one block is free.
  for (auto it = std::make_reverse_iterator(classes_.lower_bound(block));
       it != classes_.rend() && it->first > kSmallBlockMax; ++it) {
    if (it->second.head) return it->second.head;
  }
  return nullptr;
}

std::byte* PoolState::grow_free_region(size_t block, Region*& out) noexcept {
  std::unique_ptr<Region> r;
  {
    // Both locks, as release_free: no listener hears of the removal without having heard of
    // the region, and none hears of it again before the region is back under its new address.
    std::lock_guard listeners_lock(listeners_mu_);
    {
      std::lock_guard lock(mu_);
      Region* free = smaller_free(block);
      if (!free) return nullptr;
      auto it = regions_.find(reinterpret_cast<uintptr_t>(free->base));
      r = std::move(it->second);
      regions_.erase(it);
      unlink(*r);
      // The caller's reservation of `block` counts the grown region (or, if growing fails, the
      // new one it makes instead): the old region's bytes are no longer held apart from it.
      counters_.held_bytes -= r->size;
    }
    for (auto& [id, l] : listeners_) {
      if (l.removed) l.removed({r->base, r->size});
    }
  }
  // Detached: no table holds it and no block of it lives, so base, size, block and cls may change.
  const size_t old_size = r->size;
  std::byte* base = grow_mapping(r->base, old_size, block, populate_threads_);
  if (!base) {
    std::lock_guard lock(mu_);
    ++counters_.regions_trimmed;  // the old region is gone
    return nullptr;
  }
  r->base = base;
  r->size = block;
  r->block = block;
  r->capacity = 1;
  r->carved = 0;
  r->free = nullptr;
  RegionMap::node_type node;
  try {
    RegionMap staging;
    node = staging.extract(staging.emplace(reinterpret_cast<uintptr_t>(base), std::move(r)).first);
  } catch (const std::bad_alloc&) {
    munmap(base, block);
    std::lock_guard lock(mu_);
    ++counters_.regions_trimmed;
    return nullptr;
  }
  return admit(std::move(node), false, out);
}

std::byte* PoolState::admit(RegionMap::node_type node, bool created, Region*& out) noexcept {
  Region& r = *node.mapped();
  std::lock_guard listeners_lock(listeners_mu_);
  for (auto& [id, l] : listeners_) {
    if (l.added) l.added({r.base, r.size});
  }
  std::lock_guard lock(mu_);
  r.cls = &classes_.find(r.block)->second;  // made by allocate() before the reservation
  regions_.insert(std::move(node));
  std::byte* p = take(r);  // a fresh region has room; one with more goes on the class list
  if (has_room(r)) push_front(r);
  ++counters_.misses;
  counters_.regions_created += created ? 1 : 0;
  counters_.in_use_bytes += r.block;
  out = &r;
  return p;
}

std::byte* PoolState::make_region(size_t block, size_t size, Region*& out) noexcept {
  std::byte* base = map_region(size, populate_threads_);
  // The map node is made before any listener hears of the region, so that inserting it cannot
  // fail after they did.
  RegionMap::node_type node;
  if (base) {
    try {
      RegionMap staging;
      node = staging.extract(
          staging.emplace(reinterpret_cast<uintptr_t>(base), std::make_unique<Region>()).first);
    } catch (const std::bad_alloc&) {
      munmap(base, size);
      base = nullptr;
    }
  }
  if (!base) {
    std::lock_guard lock(mu_);
    counters_.held_bytes -= size;
    return nullptr;
  }
  Region& r = *node.mapped();
  r.base = base;
  r.size = size;
  r.block = block;
  r.capacity = size / block;
  return admit(std::move(node), true, out);
}

std::shared_ptr<std::byte[]> PoolState::fallback(size_t bytes) noexcept {
  auto* p =
      static_cast<std::byte*>(::operator new[](bytes, std::align_val_t{kBlockAlign}, std::nothrow));
  if (!p) return nullptr;
  {
    std::lock_guard lock(mu_);
    ++counters_.fallbacks;
    counters_.fallback_bytes += bytes;
  }
  try {
    return std::shared_ptr<std::byte[]>(p, FallbackDeleter{});
  } catch (const std::bad_alloc&) {
    return nullptr;
  }
}

void PoolState::give_back(Region* r, std::byte* p) noexcept {
  const auto now = Clock::now();
  bool unmap = false;
  {
    std::lock_guard lock(mu_);
    give(*r, p, now);
    counters_.in_use_bytes -= r->block;
    unmap = closed_ && r->used == 0;
  }
  if (unmap) release_free(Clock::time_point::max(), 0);
}

PoolState::RegionMap::iterator PoolState::detach(RegionMap::iterator it, Region*& gone) {
  Region* r = it->second.release();
  if (r->listed) unlink(*r);
  counters_.held_bytes -= r->size;
  ++counters_.regions_trimmed;
  r->next = gone;
  gone = r;
  return regions_.erase(it);
}

bool PoolState::release_free(Clock::time_point idle_before, size_t reserve) noexcept {
  Region* gone = nullptr;
  bool reserved = false;
  {
    std::lock_guard listeners_lock(listeners_mu_);
    {
      std::lock_guard lock(mu_);
      if (reserve == 0) {
        for (auto it = regions_.begin(); it != regions_.end();) {
          const Region& r = *it->second;
          it = r.used == 0 && r.idle_since <= idle_before ? detach(it, gone) : std::next(it);
        }
      } else {
        const size_t cap = options_.cap_bytes;
        size_t free_bytes = 0;
        for (auto& [base, r] : regions_) free_bytes += r->used == 0 ? r->size : 0;
        if (counters_.held_bytes - free_bytes + reserve <= cap) {
          while (counters_.held_bytes + reserve > cap) {
            auto oldest = regions_.end();
            for (auto it = regions_.begin(); it != regions_.end(); ++it) {
              if (it->second->used == 0 &&
                  (oldest == regions_.end() || it->second->idle_since < oldest->second->idle_since))
                oldest = it;
            }
            detach(oldest, gone);
          }
          counters_.held_bytes += reserve;
          reserved = true;
        }
      }
    }
    for (Region* r = gone; r; r = r->next) {
      for (auto& [id, l] : listeners_) {
        if (l.removed) l.removed({r->base, r->size});
      }
    }
  }
  while (gone) {
    Region* r = gone;
    gone = r->next;
    munmap(r->base, r->size);
    delete r;
  }
  return reserved;
}

uint64_t PoolState::add_listener(Pool::RegionFn added, Pool::RegionFn removed) {
  std::lock_guard listeners_lock(listeners_mu_);
  std::vector<std::span<std::byte>> existing;
  if (added) {
    std::lock_guard lock(mu_);
    existing.reserve(regions_.size());
    for (auto& [base, r] : regions_) existing.emplace_back(r->base, r->size);
  }
  const uint64_t id = next_listener_++;
  Listener& l = listeners_[id];
  l.added = std::move(added);
  l.removed = std::move(removed);
  // No region can go meanwhile: removing one takes listeners_mu_.
  for (auto region : existing) l.added(region);
  return id;
}

void PoolState::remove_listener(uint64_t id) noexcept {
  std::lock_guard listeners_lock(listeners_mu_);
  listeners_.erase(id);
}

std::span<std::byte> PoolState::region_of(const void* p, size_t len) const noexcept {
  const auto a = reinterpret_cast<uintptr_t>(p);
  std::lock_guard lock(mu_);
  auto it = regions_.upper_bound(a);
  if (it == regions_.begin()) return {};
  const Region& r = *std::prev(it)->second;
  const uintptr_t offset = a - reinterpret_cast<uintptr_t>(r.base);
  if (offset >= r.size || len > r.size - offset) return {};
  return {r.base, r.size};
}

PoolCounters PoolState::counters() const noexcept {
  std::lock_guard lock(mu_);
  return counters_;
}

void PoolState::close() noexcept {
  {
    std::lock_guard lock(mu_);
    closed_ = true;
  }
  release_free(Clock::time_point::max(), 0);
}

}  // namespace detail

RegionListener::RegionListener(std::shared_ptr<detail::PoolState> state, uint64_t id)
    : state_(std::move(state)), id_(id) {}

RegionListener::RegionListener(RegionListener&& other) noexcept
    : state_(std::move(other.state_)), id_(other.id_) {}

RegionListener& RegionListener::operator=(RegionListener&& other) noexcept {
  if (this != &other) {
    reset();
    state_ = std::move(other.state_);
    id_ = other.id_;
  }
  return *this;
}

RegionListener::~RegionListener() { reset(); }

void RegionListener::reset() noexcept {
  if (!state_) return;
  state_->remove_listener(id_);
  state_.reset();  // may be the last reference: the state then unmaps what is left
}

Pool::Pool(PoolOptions options) : state_(std::make_shared<detail::PoolState>(options)) {}

Pool::~Pool() { state_->close(); }

std::shared_ptr<std::byte[]> Pool::allocate(size_t bytes) noexcept {
  return state_->allocate(bytes);
}

void Pool::trim(std::chrono::steady_clock::time_point now) noexcept {
  state_->release_free(now - state_->options().idle_trim, 0);
}

void Pool::trim_all_idle() noexcept { state_->release_free(Clock::time_point::max(), 0); }

RegionListener Pool::add_region_listener(RegionFn added, RegionFn removed) {
  const uint64_t id = state_->add_listener(std::move(added), std::move(removed));
  return RegionListener(state_, id);
}

std::span<std::byte> Pool::region_of(const void* p, size_t len) const noexcept {
  return state_->region_of(p, len);
}

PoolCounters Pool::counters() const noexcept { return state_->counters(); }

std::optional<size_t> parse_byte_count(std::string_view text) {
  size_t n = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), n);
  if (ec != std::errc() || end == text.data()) return std::nullopt;
  const std::string_view suffix(end, text.data() + text.size() - end);
  constexpr std::string_view kSuffixes = "kKmMgG";  // powers of 1024, either case
  int shift = 0;
  if (!suffix.empty()) {
    const size_t at = suffix.size() == 1 ? kSuffixes.find(suffix[0]) : std::string_view::npos;
    if (at == std::string_view::npos) return std::nullopt;
    shift = 10 * static_cast<int>(at / 2 + 1);
  }
  if (n > (SIZE_MAX >> shift)) return std::nullopt;
  return n << shift;
}

size_t pool_cap_from_env(size_t fallback) {
  const char* v = std::getenv("FERRY_POOL_BYTES");
  if (!v || !*v) return fallback;
  return parse_byte_count(v).value_or(fallback);
}

}  // namespace ferry::mem
