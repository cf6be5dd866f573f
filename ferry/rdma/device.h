// Device: an opened RDMA device with its protection domain, limits, RoCE v2 addresses and
// registration caches. Internal to rdma/.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "ferry/net/result.h"
#include "ferry/rdma/mr_cache.h"
#include "ferry/rdma/options.h"
#include "ferry/rdma/verbs.h"

namespace ferry::rdma {

// A RoCE v2 GID of an active port, and the IP address it stands for.
struct Address {
  std::string ip;
  uint8_t port = 1;
  int gid_index = 0;
  ibv_gid gid{};
  ibv_mtu mtu = IBV_MTU_1024;
  uint32_t max_msg = 1u << 31;  // the port's largest message: READs are split below it
};

class Device {
 public:
  // Opens every device with at least one active RoCE v2 address. Devices that fail to open
  // are skipped (logged). `grants` is resolved per device (see RdmaGrants and grants());
  // `max_registration` too (RdmaOptions::max_registration; 0: the device's own limit).
  static std::vector<std::shared_ptr<Device>> open_all(RdmaGrants grants, size_t max_registration);

  const std::string& name() const { return name_; }
  ibv_context* context() const { return ctx_.get(); }
  ibv_pd* pd() const { return pd_.get(); }
  const ibv_device_attr& attr() const { return attr_; }
  const std::vector<Address>& addresses() const { return addresses_; }
  const Address* find(const std::string& ip) const;

  // How this device's grants open owner memory: windows, registrations or regions (never
  // automatic). With windows, remote_cache() registrations carry no remote access of their own;
  // with registrations, owner memory is registered only per grant (register_grant).
  RdmaGrants grants() const { return grants_; }
  // The most bytes one registration here covers (a multiple of the page size): larger memory is
  // registered in chunks of this size, by the caches and per grant alike.
  size_t max_registration() const { return max_registration_; }
  // A type-2 window on this PD, counted in windows_live(); null with errno set on failure.
  MwHandle alloc_window();
  uint64_t windows_live() const { return windows_live_->load(std::memory_order_relaxed); }
  // Queue pairs created on this device and not yet destroyed (see create_qp).
  uint64_t queue_pairs_live() const { return queue_pairs_live_->load(std::memory_order_relaxed); }
  // A queue pair on `pd` (this device's PD or one from alloc_pd), counted in queue_pairs_live()
  // until the reaper destroys it; null with errno set on failure.
  QpHandle create_qp(ibv_pd* pd, ibv_qp_init_attr& init);
  // A protection domain of its own (one peer's queue pair and grant registrations); null with
  // errno set on failure. Destroyed by the reaper, after the queue pairs retired before it.
  PdHandle alloc_pd();
  // Registers exactly [addr, addr + len) in `pd` with remote read access only: one grant's
  // opening of owner memory. Thread-safe; timed and counted in grant_counters(). device_error
  // when ibv_reg_mr fails (logged).
  Result<GrantMrHandle> register_grant(ibv_pd* pd, const void* addr, size_t len);
  // Registrations made by register_grant: how many, the time spent in ibv_reg_mr, live now,
  // the time spent in ibv_dereg_mr.
  struct GrantCounters {
    uint64_t registrations = 0;
    uint64_t registration_ns = 0;
    uint64_t live = 0;
    uint64_t deregistration_ns = 0;
  };
  GrantCounters grant_counters() const;
  // Test hook (slow_registrations in ferry/rdma/rdma.h): every registration made here from now
  // on, by the caches and per grant, takes `delay` longer. Any thread.
  void slow_registrations(std::chrono::milliseconds delay);
  ~Device();

  // Registrations that peers READ from (owner side) and that READs land in (fetcher side).
  MrCache& remote_cache() { return remote_cache_; }
  MrCache& local_cache() { return local_cache_; }

 private:
  Device(std::string name, ContextHandle ctx, PdHandle pd, const ibv_device_attr& attr,
         RdmaGrants grants, size_t max_registration);
  std::string name_;
  ContextHandle ctx_;
  PdHandle pd_;
  ibv_device_attr attr_{};
  RdmaGrants grants_ = RdmaGrants::regions;
  size_t max_registration_;
  Gauge windows_live_ = std::make_shared<std::atomic<uint64_t>>(0);
  Gauge grant_mrs_live_ = std::make_shared<std::atomic<uint64_t>>(0);
  std::shared_ptr<std::atomic<uint64_t>> grant_deregistration_ns_ =
      std::make_shared<std::atomic<uint64_t>>(0);
  std::atomic<uint64_t> grant_registrations_{0};
  std::atomic<uint64_t> grant_registration_ns_{0};
  std::atomic<int64_t> grant_delay_ms_{0};  // slow_registrations
  Gauge queue_pairs_live_ = std::make_shared<std::atomic<uint64_t>>(0);
  // Logs the device's asynchronous events (a queue pair's fatal error, a CQ overrun, a port
  // going down): the only report of errors that no work completion carries.
  void watch_async_events();
  // The async-event thread sleeps in poll() on the device's async fd and this eventfd, which the
  // destructor signals: no periodic wake-ups while idle.
  int stop_fd_ = -1;
  std::thread async_events_;
  std::vector<Address> addresses_;
  MrCache remote_cache_;
  MrCache local_cache_;
};

}  // namespace ferry::rdma
