// Shared helpers for ferry's tests: byte patterns, bounded waits, a fake transport.
#pragma once

#include <gtest/gtest.h>
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "ferry/ferry.h"

namespace ferry::test {

using namespace std::chrono_literals;

// Deterministic bytes: a different pattern per (seed, position), cheap to check.
inline std::shared_ptr<std::vector<std::byte>> make_pattern(size_t size, uint64_t seed) {
  auto v = std::make_shared<std::vector<std::byte>>(size);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (size_t i = 0; i < size; ++i) {
    if ((i & 7) == 0) {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
    }
    (*v)[i] = static_cast<std::byte>((x >> ((i & 7) * 8)) & 0xff);
  }
  return v;
}

inline bool same_bytes(std::span<const std::byte> a, std::span<const std::byte> b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size()) == 0);
}

// Where `got` differs from `want`, for a failure message: the sizes when they differ, else the
// first and last differing byte and how many of the differing bytes of `got` are zero (all of
// them: the bytes never landed).
inline std::string describe_difference(std::span<const std::byte> got,
                                       std::span<const std::byte> want) {
  if (got.size() != want.size()) {
    return "got " + std::to_string(got.size()) + " bytes, want " + std::to_string(want.size());
  }
  size_t first = got.size(), last = 0, differing = 0, zeros = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] == want[i]) continue;
    first = std::min(first, i);
    last = i;
    ++differing;
    zeros += got[i] == std::byte{0};
  }
  if (differing == 0) return "the same bytes";
  return std::to_string(differing) + " of " + std::to_string(got.size()) +
         " bytes differ, from byte " + std::to_string(first) + " to byte " + std::to_string(last) +
         "; " + std::to_string(zeros) + " of them are zero";
}

// The metric `name` that `ctx`'s transport `transport` reports now (TransportManager::metrics),
// or -1 when it reports none (or the transport did not start).
inline double transport_metric(const Context& ctx, std::string_view transport,
                               std::string_view name) {
  const auto stats = ctx.stats();
  auto it = stats.transport_metrics.find(std::string(transport));
  if (it == stats.transport_metrics.end()) return -1;
  for (const auto& m : it->second) {
    if (m.name == name) return m.value;
  }
  return -1;
}

// How much slower than a quiet machine this one runs, so that no test fails because the machine
// is busy: every fixed window of the harness (a child's start, a bound on how long something may
// take) is multiplied by it. $FERRY_TEST_TIME_SCALE when set (a number >= 1); otherwise 3 inside
// the soft-RoCE guest (QEMU emulation, $FERRY_VM), times the load per core above 1 when the
// suite starts (a busy laptop, a CI runner doing other work). Read once per process.
inline double time_scale() {
  static const double scale = [] {
    if (const char* v = std::getenv("FERRY_TEST_TIME_SCALE"); v && *v) {
      const double s = std::strtod(v, nullptr);
      if (s >= 1) return s;
    }
    double s = std::getenv("FERRY_VM") ? 3.0 : 1.0;
    double load = 0;
    std::ifstream("/proc/loadavg") >> load;
    const double cores = std::max(1u, std::thread::hardware_concurrency());
    return s * std::max(1.0, load / cores);
  }();
  return scale;
}

// The CPU time this process has used, user and system, every thread, in seconds.
inline double cpu_seconds() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
         static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

// `d` times time_scale(): a window that grows on a slow machine.
template <typename Rep, typename Period>
std::chrono::milliseconds scaled(std::chrono::duration<Rep, Period> d) {
  return std::chrono::milliseconds(
      static_cast<int64_t>(std::chrono::duration<double, std::milli>(d).count() * time_scale()));
}

// The transport the suite runs over: $FERRY_TEST_TRANSPORT ("TCP" when unset). The same tests
// run over TCP on the host and over RDMA in the soft-RoCE guest.
inline std::string test_transport() {
  const char* t = std::getenv("FERRY_TEST_TRANSPORT");
  return t && *t ? t : "TCP";
}

// Where servers listen: $FERRY_TEST_HOST when set; else loopback for TCP, and for RDMA the
// guest's second RoCE address ($FERRY_RDMA_PEER_IP, rxe1), so clients (rxe0, $FERRY_RDMA_IP)
// cross the veth pair.
inline std::string test_host() {
  if (const char* host = std::getenv("FERRY_TEST_HOST"); host && *host) return host;  // override
  if (test_transport() == "RDMA") {
    const char* ip = std::getenv("FERRY_RDMA_PEER_IP");
    return ip ? ip : "";
  }
  return "127.0.0.1";
}

// Skips the current test (loudly) when it is meant for RDMA but runs outside the guest.
#define FERRY_REQUIRE_TEST_HOST()                                           \
  do {                                                                      \
    if (::ferry::test::test_host().empty()) {                               \
      GTEST_SKIP() << "SKIPPED: RDMA tests run inside the soft-RoCE guest " \
                      "(FERRY_RDMA_PEER_IP is not set here)";               \
    }                                                                       \
  } while (0)

// Options for a client in this suite: it asks for the suite's transport (CMA: preferred, so
// that every fetch picks it and falls back to TCP where it cannot be had, as an application
// that prefers it would).
inline ContextOptions client_options(std::string name) {
  ContextOptions o;
  o.name = std::move(name);
  o.transport = test_transport();
  if (o.transport == cma::kTransportName) {
    o.transport = "auto";
    o.transport_options_for<cma::CmaOptions>(cma::kTransportName).preferred = true;
  }
  if (o.transport == "RDMA") {
    // Emulated RDMA (QEMU TCG) can be slow to set up queue pairs under load: no tight deadlines.
    o.connect_timeout = std::chrono::seconds(30);
    o.handshake_timeout = std::chrono::seconds(30);
    o.peer_timeout = std::chrono::seconds(30);
  }
  return o;
}

// `options`, preferring CMA when the suite runs over it (so connections negotiate it).
inline ContextOptions server_options(ContextOptions options) {
  if (test_transport() == cma::kTransportName) {
    options.transport_options_for<cma::CmaOptions>(cma::kTransportName).preferred = true;
  }
  return options;
}

// A server Context listening on the suite's host with a port chosen by the kernel.
struct Server {
  explicit Server(ContextOptions options = {}) : ctx(server_options(std::move(options))) {
    auto p = ctx.listen(test_host() + ":0");
    EXPECT_TRUE(p.ok()) << p.error().message();
    port = p.ok() ? *p : 0;
  }
  std::string address() const { return test_host() + ":" + std::to_string(port); }
  // Puts `bytes` (kept alive by the returned ref's object) and returns its ref.
  ObjectRef put(std::shared_ptr<std::vector<std::byte>> bytes) {
    auto ref = ctx.put({Tensor::bytes(*bytes)}, bytes);
    EXPECT_TRUE(ref.ok());
    return *ref;
  }
  Context ctx;
  uint16_t port = 0;
};

// Patterns put on a server: their bytes, kept to compare fetches with, and their refs, in the
// order put.
struct PutPatterns {
  void put(Server& server, size_t size, uint64_t seed) {
    data.push_back(make_pattern(size, seed));
    refs.push_back(server.put(data.back()));
  }
  std::vector<std::shared_ptr<std::vector<std::byte>>> data;
  std::vector<ObjectRef> refs;
};

// Polls `done` every 10 ms until it holds or `limit` (scaled) passes (what the other side does in
// its own time: a one-way release arriving, a collection). Returns its last value.
template <typename Pred>
bool eventually(Pred done, std::chrono::milliseconds limit = std::chrono::seconds(5)) {
  const auto deadline = std::chrono::steady_clock::now() + scaled(limit);
  while (!done()) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

inline Peer connect_or_fail(Context& ctx, const std::string& address) {
  auto peer = ctx.connect(address);
  EXPECT_TRUE(peer.ok()) << "connect " << address << ": " << peer.error().message();
  return peer.ok() ? *peer : Peer();
}

// Fetches `ref` from `peer`: a failure unless the fetch succeeds within `limit` (scaled); once it
// has, expects its first tensor to hold `expected`. For ASSERT_TRUE: the caller stops on a fetch
// that failed, and goes on past bytes that differ (reported here).
inline testing::AssertionResult fetch_completes(Peer& peer, const ObjectRef& ref,
                                                std::span<const std::byte> expected,
                                                std::chrono::milliseconds limit) {
  auto req = peer.fetch(ref);
  if (auto ec = req.wait(scaled(limit))) {
    return testing::AssertionFailure() << "the fetch failed: " << ec.message();
  }
  EXPECT_TRUE(same_bytes(req.result().tensors[0], expected));
  return testing::AssertionSuccess();
}

// Counts collections; opens no channel, so it moves nothing. Used to test the registry and
// transport selection without a second real transport.
class FakeTransport final : public TransportManager {
 public:
  explicit FakeTransport(std::string name, uint32_t priority = 1)
      : name_(std::move(name)), priority_(priority) {}
  std::string name() const override { return name_; }
  bool is_one_sided() const override { return false; }
  bool can_abort() const override { return true; }
  TransportInfo local_info() const override { return {name_, {"cpu"}, "", priority_}; }
  void async_open_channel(std::shared_ptr<PeerLink>, ChannelOpenHandler done) override {
    done(make_error_code(errc::transport_unavailable), nullptr);
  }
  void garbage_collect(const StoredObject&) override { ++collected; }
  std::atomic<int> collected{0};

 private:
  std::string name_;
  uint32_t priority_;
};

}  // namespace ferry::test
