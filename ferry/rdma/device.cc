#include "ferry/rdma/device.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>
#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>

#include "ferry/net/errors.h"
#include "ferry/net/log.h"
#include "ferry/net/system/thread_name.h"

namespace ferry::rdma {

namespace {

// Owner registrations' access. With windows they open nothing remotely by themselves: only a
// window bound to one peer's queue pair, over one granted range, opens memory to READs. With
// per-grant registrations the cache serves no owner memory at all.
int remote_access(RdmaGrants grants) {
  switch (grants) {
    case RdmaGrants::windows:
      return IBV_ACCESS_MW_BIND;
    case RdmaGrants::regions:
      return IBV_ACCESS_REMOTE_READ;
    default:
      return 0;
  }
}

// Soft-RoCE: rxe, vendor id 0xffffff.
bool is_soft(const std::string& name, const ibv_device_attr& attr) {
  return attr.vendor_id == 0xffffff || name.rfind("rxe", 0) == 0;
}

// The grant mode a device uses for `requested` (never automatic); logs what it chose when that
// is not what was asked for, or is weaker than per-peer.
RdmaGrants resolve_grants(RdmaGrants requested, const std::string& name,
                          const ibv_device_attr& attr) {
  // Soft-RoCE (rxe: vendor id 0xffffff) stalls READs through memory windows under load and
  // checks window accesses against the registration's range, not the window's.
  const bool soft = is_soft(name, attr);
  const bool has_windows = (attr.device_cap_flags & IBV_DEVICE_MEM_WINDOW_TYPE_2B) != 0;
  switch (requested) {
    case RdmaGrants::automatic:
      if (has_windows && !soft) return RdmaGrants::windows;
      FERRY_LOG_INFO(
          "rdma: {}{}: grants are registrations per grant, in each peer's own "
          "protection domain",
          name, soft ? " is soft-RoCE" : " has no type-2 memory windows");
      return RdmaGrants::registrations;
    case RdmaGrants::windows:
      if (has_windows) return RdmaGrants::windows;
      FERRY_LOG_WARN(
          "rdma: {} has no type-2 memory windows: grants are registrations per "
          "grant instead",
          name);
      return RdmaGrants::registrations;
    case RdmaGrants::regions:
      FERRY_LOG_WARN(
          "rdma: {}: grants are region rkeys, which any peer connected to this "
          "process can use while the region is registered (docs/security.md)",
          name);
      return RdmaGrants::regions;
    case RdmaGrants::registrations:
      break;
  }
  return RdmaGrants::registrations;
}

// The largest registration `requested` allows on a device (0: its own limit), rounded up to a
// whole number of pages. Soft-RoCE advertises no limit (max_mr_size is all ones) but, on Linux
// 6.12, keeps 16 bytes per page of a registration in one kmalloc, which cannot exceed 4 MiB: a
// registration over 1 GiB fails with ENOMEM, and one near it fails too once the guest's memory
// is fragmented. 256 MiB asks for 1 MiB.
size_t resolve_max_registration(size_t requested, bool soft, const ibv_device_attr& attr) {
  static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  size_t limit = requested;
  if (limit == 0) limit = soft ? size_t{256} << 20 : static_cast<size_t>(attr.max_mr_size);
  if (limit == 0) limit = SIZE_MAX;  // a device that says nothing
  limit = std::max(limit - limit % page, page);
  return limit;
}

}  // namespace

Device::Device(std::string name, ContextHandle ctx, PdHandle pd, const ibv_device_attr& attr,
               RdmaGrants grants, size_t max_registration)
    : name_(std::move(name)),
      ctx_(std::move(ctx)),
      pd_(std::move(pd)),
      attr_(attr),
      grants_(grants),
      max_registration_(max_registration),
      remote_cache_(pd_.get(), remote_access(grants), max_registration),
      local_cache_(pd_.get(), IBV_ACCESS_LOCAL_WRITE, max_registration) {}

Device::~Device() {
  if (async_events_.joinable()) {
    const uint64_t one = 1;
    if (::write(stop_fd_, &one, sizeof one) != sizeof one) {
      FERRY_LOG_WARN("rdma: {}: cannot stop the async-event thread", name_);
    }
    async_events_.join();
  }
  if (stop_fd_ >= 0) ::close(stop_fd_);
}

void Device::watch_async_events() {
  const int fd = ctx_->async_fd;
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  stop_fd_ = ::eventfd(0, EFD_CLOEXEC);
  if (stop_fd_ < 0) {
    FERRY_LOG_WARN("rdma: {}: no eventfd: async events (QP errors) are not logged", name_);
    return;
  }
  async_events_ = std::thread([this, fd] {
    for (;;) {
      pollfd p[2] = {{fd, POLLIN, 0}, {stop_fd_, POLLIN, 0}};
      if (::poll(p, 2, -1) < 0) {
        if (errno == EINTR) continue;
        FERRY_LOG_WARN("rdma: {}: async events no longer watched: poll: {}", name_,
                       std::strerror(errno));
        return;
      }
      if (p[1].revents) return;  // the destructor
      if (!p[0].revents) continue;
      ibv_async_event e{};
      if (ibv_get_async_event(ctx_.get(), &e) != 0) continue;
      const bool qp_event =
          e.event_type == IBV_EVENT_QP_FATAL || e.event_type == IBV_EVENT_QP_REQ_ERR ||
          e.event_type == IBV_EVENT_QP_ACCESS_ERR || e.event_type == IBV_EVENT_COMM_EST ||
          e.event_type == IBV_EVENT_SQ_DRAINED || e.event_type == IBV_EVENT_QP_LAST_WQE_REACHED;
      if (e.event_type == IBV_EVENT_COMM_EST) {
        FERRY_LOG_DEBUG("rdma: {}: {}", name_, ibv_event_type_str(e.event_type));
      } else if (qp_event) {
        FERRY_LOG_WARN("rdma: {}: {} on queue pair {}", name_, ibv_event_type_str(e.event_type),
                       e.element.qp ? e.element.qp->qp_num : 0);
      } else {
        FERRY_LOG_WARN("rdma: {}: {}", name_, ibv_event_type_str(e.event_type));
      }
      ibv_ack_async_event(&e);
    }
  });
  name_thread(async_events_, "ferry-rdma-evt");
}

MwHandle Device::alloc_window() {
  MwHandle mw(ibv_alloc_mw(pd_.get(), IBV_MW_TYPE_2), MwHandle::deleter_type{windows_live_});
  if (mw) windows_live_->fetch_add(1, std::memory_order_relaxed);
  return mw;
}

QpHandle Device::create_qp(ibv_pd* pd, ibv_qp_init_attr& init) {
  QpHandle qp(ibv_create_qp(pd, &init), QpDeleter{queue_pairs_live_});
  if (qp) queue_pairs_live_->fetch_add(1, std::memory_order_relaxed);
  return qp;
}

PdHandle Device::alloc_pd() { return PdHandle(ibv_alloc_pd(ctx_.get())); }

void Device::slow_registrations(std::chrono::milliseconds delay) {
  grant_delay_ms_.store(delay.count(), std::memory_order_relaxed);
  remote_cache_.slow_down(delay);
  local_cache_.slow_down(delay);
}

Result<GrantMrHandle> Device::register_grant(ibv_pd* pd, const void* addr, size_t len) {
  sleep_for_test_delay(grant_delay_ms_);
  uint64_t ns = 0;
  GrantMrHandle mr(reg_mr_timed(pd, addr, len, IBV_ACCESS_REMOTE_READ, ns),
                   GrantMrDeleter{grant_mrs_live_, grant_deregistration_ns_});
  if (!mr) {
    FERRY_LOG_WARN("rdma: {}: registering {} granted bytes failed: {}", name_, len,
                   last_errno().message());
    return make_error_code(errc::device_error);
  }
  warn_if_slow_registration(len, ns);
  grant_mrs_live_->fetch_add(1, std::memory_order_relaxed);
  grant_registrations_.fetch_add(1, std::memory_order_relaxed);
  grant_registration_ns_.fetch_add(ns, std::memory_order_relaxed);
  return mr;
}

Device::GrantCounters Device::grant_counters() const {
  GrantCounters c;
  c.registrations = grant_registrations_.load(std::memory_order_relaxed);
  c.registration_ns = grant_registration_ns_.load(std::memory_order_relaxed);
  c.live = grant_mrs_live_->load(std::memory_order_relaxed);
  c.deregistration_ns = grant_deregistration_ns_->load(std::memory_order_relaxed);
  return c;
}

const Address* Device::find(const std::string& ip) const {
  for (const auto& a : addresses_) {
    if (a.ip == ip) return &a;
  }
  return nullptr;
}

std::vector<std::shared_ptr<Device>> Device::open_all(RdmaGrants requested,
                                                      size_t max_registration) {
  std::vector<std::shared_ptr<Device>> out;
  int n = 0;
  std::unique_ptr<ibv_device*, decltype(&ibv_free_device_list)> list(ibv_get_device_list(&n),
                                                                     &ibv_free_device_list);
  if (!list) return out;
  for (int i = 0; i < n; ++i) {
    const std::string name = ibv_get_device_name(list.get()[i]);
    ContextHandle ctx(ibv_open_device(list.get()[i]));
    if (!ctx) {
      FERRY_LOG_INFO("rdma: cannot open {}: {}", name, last_errno().message());
      continue;
    }
    PdHandle pd(ibv_alloc_pd(ctx.get()));
    if (!pd) {
      FERRY_LOG_INFO("rdma: cannot allocate a PD on {}: {}", name, last_errno().message());
      continue;
    }
    ibv_device_attr attr{};
    if (ibv_query_device(ctx.get(), &attr) != 0) continue;
    const RdmaGrants grants = resolve_grants(requested, name, attr);
    const size_t max_mr = resolve_max_registration(max_registration, is_soft(name, attr), attr);
    std::shared_ptr<Device> dev(
        new Device(name, std::move(ctx), std::move(pd), attr, grants, max_mr));
    dev->watch_async_events();
    for (uint8_t port = 1; port <= dev->attr_.phys_port_cnt; ++port) {
      ibv_port_attr pa{};
      if (ibv_query_port(dev->context(), port, &pa) != 0 || pa.state != IBV_PORT_ACTIVE) continue;
      for (int g = 0; g < pa.gid_tbl_len; ++g) {
        ibv_gid_entry entry{};
        if (ibv_query_gid_ex(dev->context(), port, g, &entry, 0) != 0) continue;
        if (entry.gid_type != IBV_GID_TYPE_ROCE_V2) continue;
        Address a;
        a.ip = gid_to_ip(entry.gid);
        a.port = port;
        a.gid_index = g;
        a.gid = entry.gid;
        a.mtu = pa.active_mtu;
        if (pa.max_msg_sz) a.max_msg = pa.max_msg_sz;
        dev->addresses_.push_back(a);
      }
    }
    if (dev->addresses_.empty()) {
      FERRY_LOG_INFO("rdma: {} has no active RoCE v2 address; not used", name);
      continue;
    }
    out.push_back(std::move(dev));
  }
  return out;
}

}  // namespace ferry::rdma
