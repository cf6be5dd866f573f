// Device: an opened RDMA device with its protection domain, limits, RoCE v2 addresses and
// registration caches. Internal to rdma/.
#pragma once

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "net/result.h"
#include "rdma/mr_cache.h"
#include "rdma/verbs.h"

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
  // are skipped (logged). With `memory_windows`, a device that supports type-2 memory windows
  // registers owner memory without remote access: peers can READ only through windows bound
  // to their own queue pair (per-peer grants); other devices fall back to region rkeys (logged).
  // Unset `memory_windows`: on, except on soft-RoCE (rxe).
  static std::vector<std::shared_ptr<Device>> open_all(std::optional<bool> memory_windows);

  const std::string& name() const { return name_; }
  ibv_context* context() const { return ctx_.get(); }
  ibv_pd* pd() const { return pd_.get(); }
  const ibv_device_attr& attr() const { return attr_; }
  const std::vector<Address>& addresses() const { return addresses_; }
  const Address* find(const std::string& ip) const;

  // True when grants are memory windows (see open_all). Then remote_cache() registrations carry
  // no remote access of their own.
  bool memory_windows() const { return memory_windows_; }
  // A type-2 window on this PD, counted in windows_live(); null with errno set on failure.
  MwHandle alloc_window();
  uint64_t windows_live() const { return windows_live_->load(std::memory_order_relaxed); }
  // Queue pairs created on this device and not yet destroyed (see create_qp).
  uint64_t queue_pairs_live() const { return queue_pairs_live_->load(std::memory_order_relaxed); }
  // A queue pair on this PD, counted in queue_pairs_live() until the reaper destroys it; null
  // with errno set on failure.
  QpHandle create_qp(ibv_qp_init_attr& init);
  ~Device();

  // Registrations that peers READ from (owner side) and that READs land in (fetcher side).
  MrCache& remote_cache() { return remote_cache_; }
  MrCache& local_cache() { return local_cache_; }

 private:
  Device(std::string name, ContextHandle ctx, PdHandle pd, const ibv_device_attr& attr,
         bool memory_windows);
  std::string name_;
  ContextHandle ctx_;
  PdHandle pd_;
  ibv_device_attr attr_{};
  bool memory_windows_ = false;
  Gauge windows_live_ = std::make_shared<std::atomic<uint64_t>>(0);
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
