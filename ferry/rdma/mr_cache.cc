#include "ferry/rdma/mr_cache.h"

#include <unistd.h>

#include <string_view>

#include "ferry/net/errors.h"
#include "ferry/net/log.h"

namespace ferry::rdma {

struct Region::Shared {
  ibv_pd* pd;
  int access;
  std::mutex mu;
  std::map<uintptr_t, std::weak_ptr<Region>> regions;  // by begin address
  MrCache::Counters counters;
};

Region::Region(std::shared_ptr<Shared> shared, MrHandle mr, uintptr_t begin, uintptr_t end)
    : shared_(std::move(shared)), mr_(std::move(mr)), begin_(begin), end_(end) {}

Region::~Region() {
  std::lock_guard lock(shared_->mu);
  auto it = shared_->regions.find(begin_);
  if (it != shared_->regions.end() && it->second.expired()) shared_->regions.erase(it);
  ++shared_->counters.deregistrations;
  --shared_->counters.live;
  mr_.reset();  // ibv_dereg_mr, under the lock so a concurrent acquire never sees it half-gone
}

MrCache::MrCache(ibv_pd* pd, int access) : shared_(std::make_shared<Region::Shared>()) {
  shared_->pd = pd;
  shared_->access = access;
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
  uint64_t ns = 0;
  MrHandle mr(reg_mr_timed(shared_->pd, reinterpret_cast<const void*>(begin), end - begin,
                           shared_->access, ns));
  if (!mr) {
    auto err = last_errno();
    // ENOMEM is what a user can act on: the locked-memory limit (pinned pages count against
    // it), or on soft-RoCE a single registration over 1 GiB (seen on Linux 6.12's rxe: 1000 MiB
    // registers, 1100 MiB does not).
    std::string_view hint;
    if (err == std::errc::not_enough_memory && end - begin > (uintptr_t{1} << 30)) {
      hint =
          " (soft-RoCE (rxe) refuses a registration over 1 GiB; elsewhere, check the "
          "locked-memory limit, ulimit -l)";
    } else if (err == std::errc::not_enough_memory) {
      hint = " (check the locked-memory limit, ulimit -l: registered pages are locked)";
    }
    FERRY_LOG_WARN("ibv_reg_mr of {} bytes failed: {}{}", end - begin, err.message(), hint);
    return make_error_code(errc::device_error);
  }
  auto region = std::shared_ptr<Region>(new Region(shared_, std::move(mr), begin, end));
  shared_->regions[begin] = region;
  ++shared_->counters.registrations;
  shared_->counters.registration_ns += ns;
  ++shared_->counters.live;
  return region;
}

MrCache::Counters MrCache::counters() const {
  std::lock_guard lock(shared_->mu);
  return shared_->counters;
}

}  // namespace ferry::rdma
