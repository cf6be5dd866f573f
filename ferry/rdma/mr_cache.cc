#include "ferry/rdma/mr_cache.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
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
  // Ranges acquire() is registering now: another acquire() of memory inside one waits for it
  // (both run off the io threads) instead of registering the same pages again.
  std::vector<std::pair<uintptr_t, uintptr_t>> making;
  std::condition_variable made;
  std::atomic<int64_t> delay_ms{0};  // slow_down
  // Whether a range in `making` holds [a, a+len). mu held.
  bool underway(uintptr_t a, size_t len) const;
  MrCache::Counters counters;
};

Region::Region(std::shared_ptr<Shared> shared, std::vector<MrHandle> mrs, uintptr_t begin,
               uintptr_t end, uintptr_t chunk)
    : shared_(std::move(shared)), mrs_(std::move(mrs)), begin_(begin), end_(end), chunk_(chunk) {}

Region::~Region() {
  {
    std::lock_guard lock(shared_->mu);
    auto it = shared_->regions.find(begin_);
    if (it != shared_->regions.end() && it->second.expired()) shared_->regions.erase(it);
  }
  // ibv_dereg_mr after the lock: unpinning a large region takes long, and find() on the io
  // threads must not wait for it. The region is already invisible (its weak entry expired), and
  // an acquire() of the same memory meanwhile registers the pages again, which the device
  // allows.
  uint64_t ns = 0;
  const size_t released = mrs_.size();
  for (auto& mr : mrs_) ns += dereg_mr_timed(std::move(mr));
  mrs_.clear();
  std::lock_guard lock(shared_->mu);
  shared_->counters.deregistrations += released;
  shared_->counters.deregistration_ns += ns;
  shared_->counters.live -= released;
}

MrCache::MrCache(ibv_pd* pd, int access, size_t max_registration)
    : shared_(std::make_shared<Region::Shared>()) {
  shared_->pd = pd;
  shared_->access = access;
  shared_->chunk = max_registration;
}

MrCache::~MrCache() = default;

namespace {

// The live region of `regions` covering [a, a+len), or null. The cache's lock held. `nearest`
// is declared by the caller before the lock: if the region looked at is not the one returned
// and this was its last reference, its destructor (which takes the lock) runs after the lock
// is released.
std::shared_ptr<Region> covering(const std::map<uintptr_t, std::weak_ptr<Region>>& regions,
                                 uintptr_t a, size_t len, std::shared_ptr<Region>& nearest) {
  // The candidate is the live region starting at or before `a` closest to it.
  auto it = regions.upper_bound(a);
  while (it != regions.begin()) {
    --it;
    nearest = it->second.lock();
    if (!nearest) continue;
    if (nearest->covers(a, len)) return nearest;
    return nullptr;  // the nearest live region does not cover the range
  }
  return nullptr;
}

}  // namespace

bool Region::Shared::underway(uintptr_t a, size_t len) const {
  return std::any_of(making.begin(), making.end(),
                     [&](const auto& r) { return r.first <= a && a + len <= r.second; });
}

std::shared_ptr<Region> MrCache::wait_for_underway(uintptr_t a, size_t len,
                                                   std::unique_lock<std::mutex>& lock,
                                                   std::shared_ptr<Region>& nearest) {
  if (!shared_->underway(a, len)) return nullptr;
  // Bounded all the same: past it, the caller registers the range itself.
  shared_->made.wait_for(lock, std::chrono::minutes(1), [&] { return !shared_->underway(a, len); });
  return covering(shared_->regions, a, len, nearest);
}

Result<std::shared_ptr<Region>> MrCache::acquire(const void* addr, size_t len,
                                                 std::span<const std::byte> hint, bool reserved) {
  const auto a = reinterpret_cast<uintptr_t>(addr);
  const auto [begin, end] = range_of(a, len, hint);
  auto& making = shared_->making;
  if (!reserved) {
    // Declared before the lock, as in find().
    std::shared_ptr<Region> nearest;
    std::shared_ptr<Region> nearest_after;
    std::unique_lock lock(shared_->mu);
    auto hit = covering(shared_->regions, a, len, nearest);
    if (!hit) hit = wait_for_underway(a, len, lock, nearest_after);
    if (hit) {
      ++shared_->counters.hits;
      return hit;
    }
    making.emplace_back(begin, end);
  }
  auto made = register_range(begin, end);
  std::shared_ptr<Region> nearest;
  std::shared_ptr<Region> published;
  {
    std::lock_guard lock(shared_->mu);
    making.erase(std::find(making.begin(), making.end(), std::pair(begin, end)));
    if (made) published = publish_locked(*made, nearest);
  }
  shared_->made.notify_all();
  if (!made) return made;
  return published;
}

void MrCache::reserve(const void* addr, size_t len, std::span<const std::byte> hint) {
  const auto range = range_of(reinterpret_cast<uintptr_t>(addr), len, hint);
  std::lock_guard lock(shared_->mu);
  shared_->making.push_back(range);
}

bool MrCache::being_registered(const void* addr, size_t len) const {
  std::lock_guard lock(shared_->mu);
  return shared_->underway(reinterpret_cast<uintptr_t>(addr), len);
}

std::shared_ptr<Region> MrCache::find(const void* addr, size_t len) {
  std::shared_ptr<Region> nearest;
  std::lock_guard lock(shared_->mu);
  auto hit = covering(shared_->regions, reinterpret_cast<uintptr_t>(addr), len, nearest);
  if (hit) ++shared_->counters.hits;
  return hit;
}

Result<std::shared_ptr<Region>> MrCache::make(const void* addr, size_t len,
                                              std::span<const std::byte> hint) {
  const auto a = reinterpret_cast<uintptr_t>(addr);
  {
    std::shared_ptr<Region> nearest;
    std::unique_lock lock(shared_->mu);
    if (auto theirs = wait_for_underway(a, len, lock, nearest)) return theirs;
  }
  const auto [begin, end] = range_of(a, len, hint);
  return register_range(begin, end);
}

std::pair<uintptr_t, uintptr_t> MrCache::range_of(uintptr_t a, size_t len,
                                                  std::span<const std::byte> hint) {
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
  return {begin, end};
}

void MrCache::slow_down(std::chrono::milliseconds delay) {
  shared_->delay_ms.store(delay.count(), std::memory_order_relaxed);
}

Result<std::shared_ptr<Region>> MrCache::register_range(uintptr_t begin, uintptr_t end) {
  sleep_for_test_delay(shared_->delay_ms);
  // One registration per chunk; a failure releases those made before it. Without the lock: a
  // registration can take seconds.
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
  std::lock_guard lock(shared_->mu);
  shared_->counters.registrations += made;
  shared_->counters.registration_ns += ns;
  shared_->counters.live += made;
  return region;
}

std::shared_ptr<Region> MrCache::publish(const std::shared_ptr<Region>& region) {
  std::shared_ptr<Region> nearest;
  std::lock_guard lock(shared_->mu);
  return publish_locked(region, nearest);
}

std::shared_ptr<Region> MrCache::publish_locked(const std::shared_ptr<Region>& region,
                                                std::shared_ptr<Region>& nearest) {
  const size_t len = region->end() - region->begin();
  if (auto theirs = covering(shared_->regions, region->begin(), len, nearest)) {
    ++shared_->counters.hits;
    return theirs;
  }
  shared_->regions[region->begin()] = region;
  return region;
}

MrCache::Counters MrCache::counters() const {
  std::lock_guard lock(shared_->mu);
  return shared_->counters;
}

}  // namespace ferry::rdma
