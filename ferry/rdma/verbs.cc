#include "ferry/rdma/verbs.h"

#include <arpa/inet.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include "ferry/net/log.h"

namespace ferry::rdma {
namespace {

class WcCategory final : public std::error_category {
 public:
  const char* name() const noexcept override { return "ibv_wc"; }
  std::string message(int ev) const override {
    return ibv_wc_status_str(static_cast<ibv_wc_status>(ev));
  }
};

uint64_t ns_since(std::chrono::steady_clock::time_point t0) {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0)
          .count());
}

}  // namespace

const std::error_category& wc_category() noexcept {
  static const WcCategory category;
  return category;
}

ibv_mr* reg_mr_timed(ibv_pd* pd, const void* addr, size_t len, int access, uint64_t& ns) {
  const auto t0 = std::chrono::steady_clock::now();
  ibv_mr* mr = ibv_reg_mr(pd, const_cast<void*>(addr), len, access);
  ns += ns_since(t0);
  return mr;
}

void warn_if_slow_registration(uint64_t bytes, uint64_t ns) {
  if (ns < 1'000'000'000) return;
  FERRY_LOG_WARN(
      "rdma: registering {} MiB took {:.1f} s (the fetches and serves that need this memory "
      "waited for it)",
      bytes >> 20, static_cast<double>(ns) / 1e9);
}

uint64_t dereg_mr_timed(MrHandle mr) {
  const auto t0 = std::chrono::steady_clock::now();
  mr.reset();
  return ns_since(t0);
}

void GrantMrDeleter::operator()(ibv_mr* p) const {
  const auto t0 = std::chrono::steady_clock::now();
  ibv_dereg_mr(p);
  if (ns) ns->fetch_add(ns_since(t0), std::memory_order_relaxed);
  if (live) live->fetch_sub(1, std::memory_order_relaxed);
}

void sleep_for_test_delay(const std::atomic<int64_t>& delay_ms) {
  const auto ms = delay_ms.load(std::memory_order_relaxed);
  if (ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(ms));
}

std::error_code last_errno() { return {errno ? errno : EIO, std::system_category()}; }

std::string gid_to_ip(const ibv_gid& gid) {
  static constexpr unsigned char kMapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  char text[INET6_ADDRSTRLEN] = {};
  if (std::memcmp(gid.raw, kMapped, sizeof(kMapped)) == 0) {
    inet_ntop(AF_INET, gid.raw + 12, text, sizeof(text));
  } else {
    inet_ntop(AF_INET6, gid.raw, text, sizeof(text));
  }
  return text;
}

}  // namespace ferry::rdma
