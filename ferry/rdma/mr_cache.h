// MrCache: memory registrations of one protection domain, shared by every buffer inside them.
//
// acquire(addr, len) returns a registered Region covering [addr, addr+len): an existing one when
// some live region covers the range (a cache hit: many tensor views of one allocation cost one
// registration), otherwise a new region of `hint` (the whole allocation, when the caller knows
// it) or of the page-aligned range. A region larger than the cache's largest registration is
// registered in chunks of that size (soft-RoCE on Linux 6.12 refuses one registration over
// 1 GiB): a work request must then stay within one chunk (Region::chunk_end). Regions are
// reference-counted: the last shared_ptr deregisters. Thread-safe; the cache's lock is never held
// while registering, so a lookup (find) on an io thread does not wait for another thread's
// registration.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <utility>
#include <vector>

#include "ferry/net/result.h"
#include "ferry/rdma/verbs.h"

namespace ferry::rdma {

class MrCache;

// Where the chunk holding `addr` ends, for memory [begin, end) in chunks of `chunk` bytes from
// `begin` (begin <= addr < end): the next chunk's start, or `end`. Computed from offsets, so any
// `chunk` works, SIZE_MAX included (a device that advertises no limit).
constexpr uintptr_t chunk_end(uintptr_t begin, uintptr_t end, uintptr_t chunk, uintptr_t addr) {
  const uintptr_t left_in_chunk = chunk - (addr - begin) % chunk;
  return left_in_chunk < end - addr ? addr + left_in_chunk : end;
}

// A registered range [begin, end), in one registration per chunk: chunk k covers
// [begin + k * chunk, begin + (k + 1) * chunk), the last one up to end. Deregistered when the
// last reference goes.
class Region {
 public:
  ~Region();
  // The registration holding `addr`, which must lie in [begin, end): its lkey and rkey, and the
  // registration itself for binding memory windows to it.
  ibv_mr* mr_at(uintptr_t addr) const { return mrs_[(addr - begin_) / chunk_].get(); }
  uint32_t lkey_at(uintptr_t addr) const { return mr_at(addr)->lkey; }
  uint32_t rkey_at(uintptr_t addr) const { return mr_at(addr)->rkey; }
  // Where the registration holding `addr` ends: a work request on [addr, x) needs x <= this.
  uintptr_t chunk_end(uintptr_t addr) const { return rdma::chunk_end(begin_, end_, chunk_, addr); }
  size_t registrations() const { return mrs_.size(); }
  uintptr_t begin() const { return begin_; }
  uintptr_t end() const { return end_; }
  bool covers(uintptr_t addr, size_t len) const { return addr >= begin_ && addr + len <= end_; }

 private:
  friend class MrCache;

  struct Shared;
  Region(std::shared_ptr<Shared> shared, std::vector<MrHandle> mrs, uintptr_t begin, uintptr_t end,
         uintptr_t chunk);
  std::shared_ptr<Shared> shared_;
  std::vector<MrHandle> mrs_;
  uintptr_t begin_;
  uintptr_t end_;
  uintptr_t chunk_;
};

class MrCache {
 public:
  struct Counters {
    uint64_t registrations = 0;      // ibv_reg_mr calls that succeeded
    uint64_t registration_ns = 0;    // time spent in them
    uint64_t deregistrations = 0;    // ibv_dereg_mr calls
    uint64_t deregistration_ns = 0;  // time spent in them
    uint64_t hits = 0;               // acquires served by an existing region
    uint64_t live = 0;               // registrations live now (a region holds one per chunk)
  };

  // Registrations in `pd` with `access`, each of at most `max_registration` bytes (a multiple
  // of the page size, at least one page).
  MrCache(ibv_pd* pd, int access, size_t max_registration);
  ~MrCache();

  // A region covering [addr, addr+len). `hint` (optional) is the allocation around it: when a
  // new registration is needed, the whole hint is registered. device_error when registration
  // fails (errno in the log; the chunks registered before it are released). Memory inside a
  // range another acquire() is registering waits for that registration (at most a minute)
  // instead of registering the same pages again: call it off the io threads when it may miss.
  // `reserved`: reserve() marked the range for this call, which registers it without looking
  // first and ends the reservation.
  Result<std::shared_ptr<Region>> acquire(const void* addr, size_t len,
                                          std::span<const std::byte> hint = {},
                                          bool reserved = false);
  // Marks the range acquire(addr, len, hint) registers as being registered now, so that another
  // thread's make() or acquire() of memory inside it waits for it instead of registering the same
  // pages; the registration itself follows, on another thread, as acquire(addr, len, hint, true).
  // Cheap enough for an io thread.
  void reserve(const void* addr, size_t len, std::span<const std::byte> hint);
  // Whether memory holding [addr, addr+len) is being registered now (acquire() would wait).
  bool being_registered(const void* addr, size_t len) const;
  // The live region covering [addr, addr+len), counted as a hit, or null. Registers nothing:
  // cheap enough for an io thread.
  std::shared_ptr<Region> find(const void* addr, size_t len);
  // acquire() in two steps, for a caller that must decide between them whether the region may
  // still be used (TargetRegistration): make() registers a region as acquire() would, without
  // making it visible to find() (a range being registered by acquire() holding the memory is
  // waited for, and its region returned, already visible); publish() makes it visible and
  // returns it, or returns the live
  // region covering the same range that another thread published meanwhile (a hit; `region` is
  // then the caller's to drop, which deregisters it).
  Result<std::shared_ptr<Region>> make(const void* addr, size_t len,
                                       std::span<const std::byte> hint = {});
  std::shared_ptr<Region> publish(const std::shared_ptr<Region>& region);
  Counters counters() const;
  // Test hook (slow_registrations in ferry/rdma/rdma.h): every region registered from now on
  // takes `delay` longer, its range counting as being registered meanwhile. Any thread.
  void slow_down(std::chrono::milliseconds delay);

 private:
  // The range a new region for [a, a+len) covers: `hint` when it holds the range, else the
  // pages the range touches.
  static std::pair<uintptr_t, uintptr_t> range_of(uintptr_t a, size_t len,
                                                  std::span<const std::byte> hint);
  // When a range being registered holds [a, a+len): waits for it (`lock` held on entry and
  // exit; at most a minute) and returns the region then covering the memory, if any. Null at
  // once otherwise. `nearest` as covering()'s.
  std::shared_ptr<Region> wait_for_underway(uintptr_t a, size_t len,
                                            std::unique_lock<std::mutex>& lock,
                                            std::shared_ptr<Region>& nearest);
  // publish() with the cache's lock held; `nearest` as covering()'s (declared before the lock).
  std::shared_ptr<Region> publish_locked(const std::shared_ptr<Region>& region,
                                         std::shared_ptr<Region>& nearest);
  // Registers [begin, end) in chunks, without the lock; not yet visible to find().
  Result<std::shared_ptr<Region>> register_range(uintptr_t begin, uintptr_t end);

  std::shared_ptr<Region::Shared> shared_;
};

}  // namespace ferry::rdma
