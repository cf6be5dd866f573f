// Context::stats (ferry/net/stats.h): fetches and serves counted with their bytes and errors, the
// latency histogram, the Prometheus text a scraper reads; and the log sink (ferry/net/log.h). Over
// the suite's transport: TCP here, RDMA in the soft-RoCE guest.
#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <string>
#include <vector>

#include "ferry/net/log.h"
#include "ferry/net/registry.h"
#include "ferry/net/stats.h"
#include "tests/test_util.h"

namespace ferry::test {
namespace {

uint64_t at(const std::map<std::string, uint64_t>& m, const std::string& key) {
  auto it = m.find(key);
  return it == m.end() ? 0 : it->second;
}

TEST(Stats, FetchesAndServesAreCountedWithBytesErrorsAndLatency) {
  FERRY_REQUIRE_TEST_HOST();
  Server server;
  auto bytes = make_pattern(100000, 3);
  const auto ref = server.put(bytes);
  Context client(client_options("client"));
  auto peer = connect_or_fail(client, server.address());
  constexpr int kFetches = 5;
  for (int i = 0; i < kFetches; ++i) ASSERT_FALSE(peer.fetch(ref).wait(scaled(30s)));
  // One the owner refuses: a ref to an object it never had.
  auto missing = ref;
  missing.object_id += 1000;
  auto failed = peer.fetch(missing);
  EXPECT_EQ(failed.wait(scaled(30s)), errc::object_not_found);

  const auto c = client.stats();
  EXPECT_EQ(c.fetches_succeeded, uint64_t{kFetches});
  EXPECT_EQ(c.fetches_failed, 1u);
  EXPECT_EQ(at(c.fetch_errors, "object_not_found"), 1u);
  EXPECT_EQ(c.bytes_fetched, uint64_t{kFetches} * bytes->size());
  EXPECT_EQ(at(c.bytes_fetched_by_transport, peer.transport()), c.bytes_fetched);
  EXPECT_EQ(c.fetch_latency.count, uint64_t{kFetches});
  uint64_t in_buckets = 0;
  for (auto n : c.fetch_latency.counts) in_buckets += n;
  EXPECT_EQ(in_buckets, uint64_t{kFetches});
  EXPECT_GT(c.fetch_latency.sum_seconds, 0.0);
  EXPECT_EQ(c.peers, 1u);
  EXPECT_EQ(at(c.connections_by_transport, peer.transport()), 1u);

  // The owner counts its serves as they end (a serve over TCP ends once written).
  EXPECT_TRUE(eventually([&] { return server.ctx.stats().serves_succeeded == kFetches; }));
  const auto s = server.ctx.stats();
  EXPECT_EQ(s.bytes_served, uint64_t{kFetches} * bytes->size());
  EXPECT_EQ(s.serves_failed, 1u);
  EXPECT_EQ(at(s.serve_errors, "object_not_found"), 1u);
}

// Stats::fetches_in_flight counts a fetch from its issue to its completion, whatever the
// completion: fetches of a name nobody put yet stay in flight until it is put.
TEST(Stats, FetchesInFlightCountsFetchesUntilTheyComplete) {
  FERRY_REQUIRE_TEST_HOST();
  Server server;
  Context client(client_options("client"));
  auto peer = connect_or_fail(client, server.address());
  auto bytes = make_pattern(200000, 8);
  auto ref = ObjectRef::named(server.address(), "later", {TensorMeta::bytes(bytes->size())});
  std::vector<std::byte> into(bytes->size());
  auto a = peer.fetch(ref, {}, {.timeout = 60s});
  auto b = peer.fetch(ref, {into}, {.timeout = 60s});
  auto c = peer.fetch(ref, {}, {.timeout = 60s});
  EXPECT_EQ(client.stats().fetches_in_flight, 3u);
  c.abort();
  EXPECT_EQ(c.wait(scaled(30s)), errc::aborted);
  EXPECT_EQ(client.stats().fetches_in_flight, 2u);
  PutOptions o;
  o.name = "later";
  ASSERT_TRUE(server.ctx.put({Tensor::bytes(*bytes)}, bytes, o).ok());
  ASSERT_FALSE(a.wait(scaled(30s)));
  ASSERT_FALSE(b.wait(scaled(30s)));
  EXPECT_TRUE(same_bytes(a.result().tensors.at(0), *bytes));
  EXPECT_TRUE(same_bytes(into, *bytes));
  EXPECT_EQ(client.stats().fetches_in_flight, 0u);
  EXPECT_EQ(client.stats().fetches_succeeded, 2u);
}

TEST(Stats, PrometheusTextHasEveryFamilyWithHelpTypeAndLabels) {
  Stats s;
  s.fetches_succeeded = 7;
  s.fetches_in_flight = 3;
  s.fetch_errors["timed_out"] = 2;
  s.bytes_fetched_by_transport["TCP"] = 1234;
  s.fetch_latency.add(std::chrono::microseconds(3));    // bucket le=4us
  s.fetch_latency.add(std::chrono::milliseconds(100));  // le=0.131072
  s.pool.held_bytes = 4096;
  s.transport_metrics["RDMA"] = {{"registrations_total", "registrations.", false, 3},
                                 {"queue_pairs", "queue pairs now.\nPer peer.", true, 2}};
  s.transport_metrics["My-SHM"] = {{"Segments_total", "segments made.", false, 5}};
  const auto text = prometheus_text(s, "ferry", "instance=\"a\"");
  for (const char* line : {
           "# TYPE ferry_fetches_succeeded_total counter\n",
           "ferry_fetches_succeeded_total{instance=\"a\"} 7\n",
           "ferry_fetch_errors_total{instance=\"a\",error=\"timed_out\"} 2\n",
           "ferry_fetched_bytes_by_transport_total{instance=\"a\",transport=\"TCP\"} 1234\n",
           "# TYPE ferry_fetch_latency_seconds histogram\n",
           "ferry_fetch_latency_seconds_bucket{instance=\"a\",le=\"2e-06\"} 0\n",
           "ferry_fetch_latency_seconds_bucket{instance=\"a\",le=\"4e-06\"} 1\n",
           "ferry_fetch_latency_seconds_bucket{instance=\"a\",le=\"0.131072\"} 2\n",
           "ferry_fetch_latency_seconds_bucket{instance=\"a\",le=\"+Inf\"} 2\n",
           "ferry_fetch_latency_seconds_count{instance=\"a\"} 2\n",
           "ferry_pool_held_bytes{instance=\"a\"} 4096\n",
           "# TYPE ferry_fetches_in_flight gauge\n",
           "ferry_fetches_in_flight{instance=\"a\"} 3\n",
           "# TYPE ferry_rdma_registrations_total counter\n",
           "ferry_rdma_registrations_total{instance=\"a\"} 3\n",
           "# HELP ferry_rdma_queue_pairs RDMA: queue pairs now. Per peer.\n",
           "# TYPE ferry_rdma_queue_pairs gauge\n",
           "ferry_rdma_queue_pairs{instance=\"a\"} 2\n",
           "ferry_my_shm_segments_total{instance=\"a\"} 5\n",
       }) {
    EXPECT_NE(text.find(line), std::string::npos) << "missing: " << line << "in:\n" << text;
  }
  // Every sample line belongs to a family announced by # TYPE before it.
  std::string family;
  size_t pos = 0;
  while (pos < text.size()) {
    const auto end = text.find('\n', pos);
    const auto line = text.substr(pos, end - pos);
    pos = end + 1;
    if (line.rfind("# TYPE ", 0) == 0) {
      family = line.substr(7, line.find(' ', 7) - 7);
    } else if (line[0] != '#') {
      EXPECT_EQ(line.rfind(family, 0), 0u) << line << " outside its family " << family;
    }
  }
}

// A transport's own metrics (TransportManager::metrics()) reach Context::stats() and the
// Prometheus text, a user's transport's as the built-ins'.
class CountingTransport final : public TransportManager {
 public:
  std::string name() const override { return "COUNTING"; }
  bool is_one_sided() const override { return false; }
  bool can_abort() const override { return true; }
  TransportInfo local_info() const override { return {"COUNTING", {"cpu"}, "", 1}; }
  void async_open_channel(std::shared_ptr<PeerLink>, ChannelOpenHandler done) override {
    done(make_error_code(errc::transport_unavailable), nullptr);
  }
  void garbage_collect(const StoredObject&) override {}
  std::vector<TransportMetric> metrics() const override {
    return {{"widgets_total", "widgets made.", false, static_cast<double>(++calls_)},
            {"widgets_live", "widgets held now.", true, 4}};
  }

 private:
  mutable std::atomic<int> calls_{0};
};

TEST(Stats, ATransportsOwnMetricsAreInTheSnapshotAndTheText) {
  ASSERT_FALSE(register_transport(
      "COUNTING", {"cpu"}, [](const TransportEnv&) -> Result<std::shared_ptr<TransportManager>> {
        return std::shared_ptr<TransportManager>(std::make_shared<CountingTransport>());
      }));
  {
    Context ctx({.name = "metrics"});
    const auto s = ctx.stats();
    ASSERT_EQ(s.transport_metrics.count("COUNTING"), 1u);
    const auto& m = s.transport_metrics.at("COUNTING");
    ASSERT_EQ(m.size(), 2u);
    EXPECT_EQ(m[0].name, "widgets_total");
    EXPECT_EQ(m[0].value, 1.0);
    EXPECT_FALSE(m[0].gauge);
    EXPECT_TRUE(m[1].gauge);
    // A transport that reports nothing (TCP) has no entry.
    EXPECT_EQ(s.transport_metrics.count("TCP"), 0u);
    const auto text = prometheus_text(ctx.stats());
    EXPECT_NE(
        text.find("# TYPE ferry_counting_widgets_total counter\nferry_counting_widgets_total 2\n"),
        std::string::npos)
        << text;
    EXPECT_NE(
        text.find("# TYPE ferry_counting_widgets_live gauge\nferry_counting_widgets_live 4\n"),
        std::string::npos)
        << text;
  }
  EXPECT_FALSE(unregister_transport("COUNTING"));
}

TEST(LogSink, TheApplicationsSinkGetsEveryLineInsteadOfStderr) {
  std::mutex mu;
  std::vector<std::pair<log::Level, std::string>> lines;
  log::set_sink([&](log::Level level, std::string_view message) {
    std::lock_guard lock(mu);
    lines.emplace_back(level, std::string(message));
  });
  FERRY_LOG_WARN("sink test {}", 42);
  FERRY_LOG_DEBUG("not at the default level");  // filtered before the sink (unless FERRY_LOG)
  log::set_sink({});
  FERRY_LOG_WARN("after the sink is gone: stderr");
  std::lock_guard lock(mu);
  ASSERT_GE(lines.size(), 1u);
  EXPECT_EQ(lines[0].first, log::Level::warn);
  EXPECT_EQ(lines[0].second, "sink test 42");
  for (const auto& [level, text] : lines) EXPECT_NE(text, "after the sink is gone: stderr");
}

}  // namespace
}  // namespace ferry::test
