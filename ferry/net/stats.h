/// @file
/// What a Context has done since it started: fetches and serves, bytes, errors by code, fetch
/// latency, connections by transport, the receive pool, each transport's own counters.
/// Context::stats() takes a snapshot; prometheus_text() formats one for a scraper (`ferry serve
/// --metrics` serves it).
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <system_error>

#include "ferry/net/context.h"

namespace ferry {

/// Fetch latency (issue to completion), in buckets of upper bounds 2^i microseconds, i = 0 to
/// kBuckets - 2 (1 us to about 67 s), and one for everything slower.
struct LatencyHistogram {
  /// Buckets in counts: 27 bounded ones and the last, unbounded.
  static constexpr int kBuckets = 28;
  std::array<uint64_t, kBuckets> counts{};  ///< per bucket, not cumulative
  uint64_t count = 0;                       ///< latencies added (the sum of counts)
  double sum_seconds = 0;                   ///< their sum, in seconds
  /// Bucket i's upper bound in seconds (infinity for the last).
  static double upper_bound_seconds(int i);
  /// Counts `latency` in the first bucket whose bound it does not exceed. No locking: the owner of
  /// the histogram serializes (StatsRecorder does).
  void add(std::chrono::nanoseconds latency);
};

/// What a Context has done since it started (see this file's comment): Context::stats() returns a
/// snapshot, a plain value to read or format (prometheus_text) on any thread.
struct Stats {
  // Fetches this side issued on a connected peer (each counted once, when it completes).
  uint64_t fetches_succeeded = 0;  ///< fetches that completed with every byte
  uint64_t fetches_failed = 0;     ///< fetches that completed with an error (aborts included)
  uint64_t bytes_fetched = 0;      ///< bytes of the successful fetches
  std::map<std::string, uint64_t> fetch_errors;  ///< by errc name ("timed_out", ...)
  /// bytes_fetched, by the transport that moved them.
  std::map<std::string, uint64_t> bytes_fetched_by_transport;
  LatencyHistogram fetch_latency;  ///< successful fetches
  uint64_t fetches_in_flight = 0;  ///< fetches issued and not yet completed
  // Requests this side served (ended: every byte sent, or failed).
  uint64_t serves_succeeded = 0;                 ///< requests served with every byte sent
  uint64_t serves_failed = 0;                    ///< requests refused, or failed while served
  uint64_t bytes_served = 0;                     ///< bytes of the successful serves
  std::map<std::string, uint64_t> serve_errors;  ///< by errc name, refusals included
  /// bytes_served, by the transport that moved them.
  std::map<std::string, uint64_t> bytes_served_by_transport;
  uint64_t serves_in_flight = 0;  ///< requests being served now (started, not ended)
  // Peer connections that negotiated each transport; peers connected now.
  std::map<std::string, uint64_t> connections_by_transport;  ///< since the context started
  uint64_t peers = 0;  ///< connected now, both directions (Context::peer_count())
  PoolStats pool;      ///< the receive pool (Context::pool_stats())
  /// What each transport reports about itself (TransportManager::metrics()), by transport name;
  /// transports that report nothing are absent. RDMA: registrations, time spent registering,
  /// live registrations, memory windows, queue pairs (docs/metrics.md).
  std::map<std::string, std::vector<TransportMetric>> transport_metrics;
};

/// `stats` in Prometheus' text exposition format (version 0.0.4), every metric named
/// `<prefix>_...` with # HELP and # TYPE lines; `labels` (e.g. `instance="a"`, may be empty) is
/// added to every sample.
std::string prometheus_text(const Stats& stats, std::string_view prefix = "ferry",
                            std::string_view labels = {});

namespace detail {

// The counters behind Context::stats(), shared with every session and fetch of the context
// (they may outlive it). Thread-safe: one mutex, taken once per fetch or serve.
class StatsRecorder {
 public:
  // A fetch was issued; it counts in flight until its fetch_done.
  void fetch_started();
  void fetch_done(const std::error_code& ec, uint64_t bytes, const std::string& transport,
                  std::chrono::nanoseconds latency);
  // Stats::fetches_in_flight now, without the lock (a fetch reads it as it is issued).
  uint64_t fetches_in_flight() const { return fetches_in_flight_.load(std::memory_order_relaxed); }
  // A refusal (never started), or a serve that started (serve_started) and ended.
  void serve_done(const std::error_code& ec, uint64_t bytes, const std::string& transport);
  void serve_started();
  void serve_ended(const std::error_code& ec, uint64_t bytes, const std::string& transport);
  // The counters; the fields of Stats the recorder does not count (connections, peers, the pool,
  // the transports' metrics) are left as a default Stats has them.
  Stats snapshot() const;

 private:
  mutable std::mutex mu_;
  Stats s_;
  std::atomic<uint64_t> fetches_in_flight_{0};
};

}  // namespace detail
}  // namespace ferry
