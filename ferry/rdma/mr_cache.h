// MrCache: memory registrations of one protection domain, shared by every buffer inside them.
//
// acquire(addr, len) returns a registered Region covering [addr, addr+len): an existing one when
// some live registration covers the range (a cache hit: many tensor views of one allocation cost
// one ibv_reg_mr), otherwise a new registration of `hint` (the whole allocation, when the
// caller knows it) or of the page-aligned range. Regions are reference-counted: the last
// shared_ptr deregisters. Thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <span>

#include "ferry/net/result.h"
#include "ferry/rdma/verbs.h"

namespace ferry::rdma {

class MrCache;

// A registered range. Deregistered when the last reference goes.
class Region {
 public:
  ~Region();
  uint32_t lkey() const { return mr_->lkey; }
  uint32_t rkey() const { return mr_->rkey; }
  ibv_mr* mr() const { return mr_.get(); }  // for binding memory windows to it
  uintptr_t begin() const { return begin_; }
  uintptr_t end() const { return end_; }
  bool covers(uintptr_t addr, size_t len) const { return addr >= begin_ && addr + len <= end_; }

 private:
  friend class MrCache;
  struct Shared;
  Region(std::shared_ptr<Shared> shared, MrHandle mr, uintptr_t begin, uintptr_t end);
  std::shared_ptr<Shared> shared_;
  MrHandle mr_;
  uintptr_t begin_;
  uintptr_t end_;
};

class MrCache {
 public:
  struct Counters {
    uint64_t registrations = 0;    // ibv_reg_mr calls that succeeded
    uint64_t registration_ns = 0;  // time spent in them
    uint64_t deregistrations = 0;
    uint64_t hits = 0;  // acquires served by an existing registration
    uint64_t live = 0;  // regions registered now
  };

  MrCache(ibv_pd* pd, int access);
  ~MrCache();

  // A region covering [addr, addr+len). `hint` (optional) is the allocation around it: when a
  // new registration is needed, the whole hint is registered. device_error when registration
  // fails (errno in the log).
  Result<std::shared_ptr<Region>> acquire(const void* addr, size_t len,
                                          std::span<const std::byte> hint = {});
  Counters counters() const;

 private:
  std::shared_ptr<Region::Shared> shared_;
};

}  // namespace ferry::rdma
