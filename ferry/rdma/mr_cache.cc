#include "ferry/rdma/mr_cache.h"

#include <unistd.h>

#include <algorithm>
#include <string_view>

#include "ferry/net/errors.h"
#include "ferry/net/log.h"

namespace ferry::rdma {

struct Region::Shared {
  ibv_pd* pd;
  int access;
  uintptr_t chunk;
  std::mutex mu;
  std::map<uintptr_t, std::weak_ptr<Region>> regions;  // by begin address
  MrCache::Counters counters;
};

Region::Region(std::shared_ptr<Shared> shared, std::vector<MrHandle> mrs, uintptr_t begin,
               uintptr_t end, uintptr_t chunk)
    : shared_(std::move(shared)), mrs_(std::move(mrs)), begin_(begin), end_(end), chunk_(chunk) {}

Region::~Region() {
  std::lock_guard lock(shared_->mu);
  auto it = shared_->regions.find(begin_);
  if (it != shared_->regions.end() && it->second.expired()) shared_->regions.erase(it);
  shared_->counters.deregistrations += mrs_.size();
  shared_->counters.live -= mrs_.size();
  mrs_.clear();  // ibv_dereg_mr, under the lock so a concurrent acquire never sees it half-gone
}

MrCache::MrCache(ibv_pd* pd, int access, size_t max_registration)
    : shared_(std::make_shared<Region::Shared>()) {
  shared_->pd = pd;
  shared_->access = access;
  shared_->chunk = max_registration;
}

MrCache::~MrCache() = default;

Result<std::shared_ptr<Region>> MrCache::acquire(const void* addr, size_t len,
                                                 std::span<const std::byte> hint) {
  const auto a = reinterpret_cast<uintptr_t>(addr);
  // Declared before the lock: if this ends up the last reference, the region's destructor
  // (which takes the lock) runs after the lock is released.
  std::shared_ptr<Region> nearest;
  std::lock_guard lock(shared_->mu);
  // The candidate is the live region starting at or before `a` closest to it.
  auto it = shared_->regions.upper_bound(a);
  while (it != shared_->regions.begin()) {
    --it;
    nearest = it->second.lock();
    if (!nearest) continue;
    if (nearest->covers(a, len)) {
      ++shared_->counters.hits;
      return nearest;
    }
    break;  // the nearest live region does not cover the range: register anew
  }
  uintptr_t begin;
  uintptr_t end;
  const auto h = reinterpret_cast<uintptr_t>(hint.data());
  if (!hint.empty() && a >= h && a + len <= h + hint.size()) {
    begin = h;
    end = h + hint.size();
  } else {
    static const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
    begin = a & ~(page - 1);
    end = (a + len + page - 1) & ~(page - 1);
  }
  if (end == begin) end = begin + 1;
  // One registration per chunk; a failure releases those made before it.
  std::vector<MrHandle> mrs;
  uint64_t ns = 0;
  for (uintptr_t at = begin, len = 0; at < end; at += len) {
    len = std::min<uintptr_t>(shared_->chunk, end - at);
    uint64_t took = 0;
    MrHandle mr(
        reg_mr_timed(shared_->pd, reinterpret_cast<const void*>(at), len, shared_->access, took));
    if (!mr) {
      auto err = last_errno();
      // ENOMEM is what a user can act on: the locked-memory limit (registered pages are locked).
      const std::string_view what =
          err == std::errc::not_enough_memory
              ? " (check the locked-memory limit, ulimit -l: registered pages are locked)"
              : "";
      FERRY_LOG_WARN("ibv_reg_mr of {} bytes (of a region of {}) failed: {}{}", len, end - begin,
                     err.message(), what);
      return make_error_code(errc::device_error);
    }
    ns += took;
    mrs.push_back(std::move(mr));
  }
  warn_if_slow_registration(end - begin, ns);
  const size_t made = mrs.size();
  auto region =
      std::shared_ptr<Region>(new Region(shared_, std::move(mrs), begin, end, shared_->chunk));
  shared_->regions[begin] = region;
  shared_->counters.registrations += made;
  shared_->counters.registration_ns += ns;
  shared_->counters.live += made;
  return region;
}

MrCache::Counters MrCache::counters() const {
  std::lock_guard lock(shared_->mu);
  return shared_->counters;
}

}  // namespace ferry::rdma
