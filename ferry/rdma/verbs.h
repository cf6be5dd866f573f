// RAII for verbs objects, the ibv_wc_status error category, small helpers. Internal to rdma/.
#pragma once

#include <infiniband/verbs.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include <system_error>
#include "ferry/rdma/reaper.h"

namespace ferry::rdma {

// Queue pairs, completion queues and channels, protection domains and device contexts are
// destroyed by the reaper (ferry/rdma/reaper.h): ibv_destroy_qp may block for seconds, and the
// others must follow the queue pairs they served. Registrations and memory windows are released at
// once, on the caller's thread: deregistering before the owner frees memory, and invalidating a
// window when its lease ends, are the access guarantees (docs/rdma.md).
struct ContextDeleter {
  void operator()(ibv_context* p) const {
    retire([p] { ibv_close_device(p); });
  }
};
struct PdDeleter {
  void operator()(ibv_pd* p) const {
    retire([p] { ibv_dealloc_pd(p); });
  }
};
struct MrDeleter {
  void operator()(ibv_mr* p) const { ibv_dereg_mr(p); }
};
struct CompChannelDeleter {
  void operator()(ibv_comp_channel* p) const {
    retire([p] { ibv_destroy_comp_channel(p); });
  }
};
struct CqDeleter {
  void operator()(ibv_cq* p) const {
    retire([p] { ibv_destroy_cq(p); });
  }
};
// Queue pairs and memory windows count themselves out of their device's gauge once destroyed.
using Gauge = std::shared_ptr<std::atomic<uint64_t>>;
struct QpDeleter {
  Gauge live;
  void operator()(ibv_qp* p) const {
    retire([p, live = live] {
      ibv_destroy_qp(p);
      if (live) live->fetch_sub(1, std::memory_order_relaxed);
    });
  }
};
// Memory windows too, released at once (see above).
template <typename T, int (*Release)(T*)>
struct CountedDeleter {
  Gauge live;
  void operator()(T* p) const {
    Release(p);
    if (live) live->fetch_sub(1, std::memory_order_relaxed);
  }
};
inline int dealloc_mw(ibv_mw* mw) { return ibv_dealloc_mw(mw); }  // static inline in verbs.h
// Grant registrations also add the time their ibv_dereg_mr took to `ns`.
struct GrantMrDeleter {
  Gauge live;
  std::shared_ptr<std::atomic<uint64_t>> ns;
  void operator()(ibv_mr* p) const;
};

using ContextHandle = std::unique_ptr<ibv_context, ContextDeleter>;
using PdHandle = std::unique_ptr<ibv_pd, PdDeleter>;
using MrHandle = std::unique_ptr<ibv_mr, MrDeleter>;
using CompChannelHandle = std::unique_ptr<ibv_comp_channel, CompChannelDeleter>;
using CqHandle = std::unique_ptr<ibv_cq, CqDeleter>;
using QpHandle = std::unique_ptr<ibv_qp, QpDeleter>;
using MwHandle = std::unique_ptr<ibv_mw, CountedDeleter<ibv_mw, dealloc_mw>>;
using GrantMrHandle = std::unique_ptr<ibv_mr, GrantMrDeleter>;

// Work-completion statuses as error codes (category "ibv_wc"); messages from
// ibv_wc_status_str. Their failure scope is the peer: the queue pair is in error after one.
const std::error_category& wc_category() noexcept;
inline std::error_code make_wc_error(ibv_wc_status status) {
  return {static_cast<int>(status), wc_category()};
}

// ibv_reg_mr, timed: adds the nanoseconds it took to `ns`. Null with errno set on failure.
ibv_mr* reg_mr_timed(ibv_pd* pd, const void* addr, size_t len, int access, uint64_t& ns);
// Logs a warning when registering `bytes` took `ns` of a second or more: the fetches or serves
// that need the memory waited that long (on a registrar thread, ferry/rdma/registrar.h, unless
// the memory was small).
void warn_if_slow_registration(uint64_t bytes, uint64_t ns);
// Deregisters `mr` (ibv_dereg_mr through its handle) and returns the nanoseconds it took.
uint64_t dereg_mr_timed(MrHandle mr);

// Sleeps for `delay_ms` milliseconds when it is above zero: the test hook slow_registrations
// (ferry/rdma/rdma.h) in front of a registration.
void sleep_for_test_delay(const std::atomic<int64_t>& delay_ms);

// errno after a failed verbs call, as an error code.
std::error_code last_errno();

// "::ffff:a.b.c.d" GIDs (RoCE v2 over IPv4) as "a.b.c.d"; other GIDs as IPv6 text.
std::string gid_to_ip(const ibv_gid& gid);

}  // namespace ferry::rdma
