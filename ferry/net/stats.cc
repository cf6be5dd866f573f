#include "ferry/net/stats.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>

#include "ferry/net/errors.h"

namespace ferry {
namespace {

std::string error_name(const std::error_code& ec) {
  if (ec.category() == ferry_category())
    return std::string(errc_name(static_cast<errc>(ec.value())));
  return std::string(ec.category().name()) + ":" + std::to_string(ec.value());
}

// A label value as the exposition format wants it (\, " and newline escaped).
std::string escaped(std::string_view v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

// A transport's name or metric name as a part of a metric name: lower case, every character but
// [a-z0-9_] replaced by '_' ("RDMA" -> "rdma").
std::string metric_name(std::string_view v) {
  std::string out;
  for (char c : v) {
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    out += (std::isalnum(static_cast<unsigned char>(c)) || c == '_') ? c : '_';
  }
  return out;
}

class Writer {
 public:
  Writer(std::string_view prefix, std::string_view labels) : prefix_(prefix), labels_(labels) {}
  void head(std::string_view name, std::string_view type, std::string_view help) {
    out_ += "# HELP " + prefix_ + "_" + std::string(name) + " " + std::string(help) + "\n";
    out_ += "# TYPE " + prefix_ + "_" + std::string(name) + " " + std::string(type) + "\n";
  }
  // One sample; `label` is `key="value"` or empty.
  void sample(std::string_view name, std::string_view label, double value) {
    out_ += prefix_ + "_" + std::string(name);
    std::string all = labels_;
    if (!label.empty()) all += (all.empty() ? "" : ",") + std::string(label);
    if (!all.empty()) out_ += "{" + all + "}";
    char text[64];
    if (std::isinf(value)) {
      out_ += " +Inf\n";
      return;
    }
    std::snprintf(text, sizeof(text), " %.17g\n", value);
    out_ += text;
  }
  void counter(std::string_view name, std::string_view help, double value) {
    head(name, "counter", help);
    sample(name, {}, value);
  }
  void gauge(std::string_view name, std::string_view help, double value) {
    head(name, "gauge", help);
    sample(name, {}, value);
  }
  void by(std::string_view name, std::string_view type, std::string_view help, std::string_view key,
          const std::map<std::string, uint64_t>& values) {
    head(name, type, help);
    for (const auto& [k, v] : values) {
      sample(name, std::string(key) + "=\"" + escaped(k) + "\"", static_cast<double>(v));
    }
  }
  std::string take() { return std::move(out_); }

 private:
  std::string prefix_;
  std::string labels_;
  std::string out_;
};

}  // namespace

double LatencyHistogram::upper_bound_seconds(int i) {
  if (i >= kBuckets - 1) return std::numeric_limits<double>::infinity();
  return std::ldexp(1e-6, i);
}

void LatencyHistogram::add(std::chrono::nanoseconds latency) {
  const double us = std::chrono::duration<double, std::micro>(latency).count();
  int i = 0;
  while (i < kBuckets - 1 && us > std::ldexp(1.0, i)) ++i;
  ++counts[i];
  ++count;
  sum_seconds += us * 1e-6;
}

namespace {

// The receive pool's figures in the exposition, in this order.
struct PoolMetric {
  const char* name;
  const char* help;
  bool gauge;  // else a counter
  uint64_t PoolStats::*field;
};
constexpr PoolMetric kPoolMetrics[] = {
    {"pool_held_bytes", "Receive pool: bytes of regions mapped.", true, &PoolStats::held_bytes},
    {"pool_in_use_bytes", "Receive pool: bytes of live blocks.", true, &PoolStats::in_use_bytes},
    {"pool_hits_total", "Receive pool: allocations served from memory already held.", false,
     &PoolStats::hits},
    {"pool_misses_total", "Receive pool: allocations that mapped a new region.", false,
     &PoolStats::misses},
    {"pool_fallbacks_total", "Receive pool: allocations beyond its cap (plain memory).", false,
     &PoolStats::fallbacks},
    {"pool_regions_trimmed_total", "Receive pool: idle regions given back.", false,
     &PoolStats::regions_trimmed},
};

}  // namespace

std::string prometheus_text(const Stats& s, std::string_view prefix, std::string_view labels) {
  Writer w(prefix, labels);
  w.counter("fetches_succeeded_total", "Fetches that completed with every byte.",
            static_cast<double>(s.fetches_succeeded));
  w.counter("fetches_failed_total", "Fetches that failed.", static_cast<double>(s.fetches_failed));
  w.by("fetch_errors_total", "counter", "Failed fetches by error.", "error", s.fetch_errors);
  w.counter("fetched_bytes_total", "Bytes fetched.", static_cast<double>(s.bytes_fetched));
  w.by("fetched_bytes_by_transport_total", "counter", "Bytes fetched, by transport.", "transport",
       s.bytes_fetched_by_transport);
  // The histogram's buckets are cumulative in the exposition format.
  w.head("fetch_latency_seconds", "histogram",
         "Latency of successful fetches, issue to completion.");
  uint64_t cumulative = 0;
  const std::string bucket = "fetch_latency_seconds_bucket";
  for (int i = 0; i < LatencyHistogram::kBuckets; ++i) {
    cumulative += s.fetch_latency.counts[i];
    const double le = LatencyHistogram::upper_bound_seconds(i);
    char label[48];
    if (std::isinf(le)) {
      std::snprintf(label, sizeof(label), "le=\"+Inf\"");
    } else {
      std::snprintf(label, sizeof(label), "le=\"%.6g\"", le);
    }
    w.sample(bucket, label, static_cast<double>(cumulative));
  }
  w.sample("fetch_latency_seconds_sum", {}, s.fetch_latency.sum_seconds);
  w.sample("fetch_latency_seconds_count", {}, static_cast<double>(s.fetch_latency.count));
  w.counter("serves_succeeded_total", "Requests served with every byte sent.",
            static_cast<double>(s.serves_succeeded));
  w.counter("serves_failed_total", "Requests refused or failed while served.",
            static_cast<double>(s.serves_failed));
  w.by("serve_errors_total", "counter", "Refused or failed serves by error.", "error",
       s.serve_errors);
  w.counter("served_bytes_total", "Bytes served.", static_cast<double>(s.bytes_served));
  w.by("served_bytes_by_transport_total", "counter", "Bytes served, by transport.", "transport",
       s.bytes_served_by_transport);
  w.gauge("fetches_in_flight", "Fetches issued and not yet completed.",
          static_cast<double>(s.fetches_in_flight));
  w.gauge("serves_in_flight", "Requests being served now.",
          static_cast<double>(s.serves_in_flight));
  w.by("connections_total", "counter", "Peer connections, by the transport they negotiated.",
       "transport", s.connections_by_transport);
  w.gauge("peers", "Peers connected now.", static_cast<double>(s.peers));
  for (const auto& m : kPoolMetrics) {
    const double value = static_cast<double>(s.pool.*m.field);
    if (m.gauge) {
      w.gauge(m.name, m.help, value);
    } else {
      w.counter(m.name, m.help, value);
    }
  }
  for (const auto& [transport, metrics] : s.transport_metrics) {
    for (const auto& m : metrics) {
      const auto name = metric_name(transport) + "_" + metric_name(m.name);
      auto help = transport + ": " + m.help;
      std::replace(help.begin(), help.end(), '\n', ' ');  // one # HELP line
      if (m.gauge) {
        w.gauge(name, help, m.value);
      } else {
        w.counter(name, help, m.value);
      }
    }
  }
  return w.take();
}

namespace detail {

namespace {

// Where one direction's outcomes are counted in Stats: fetches or serves.
struct OutcomeCounters {
  uint64_t Stats::*succeeded;
  uint64_t Stats::*failed;
  uint64_t Stats::*bytes;
  std::map<std::string, uint64_t> Stats::*errors;
  std::map<std::string, uint64_t> Stats::*bytes_by_transport;
};
constexpr OutcomeCounters kFetchCounters{&Stats::fetches_succeeded, &Stats::fetches_failed,
                                         &Stats::bytes_fetched, &Stats::fetch_errors,
                                         &Stats::bytes_fetched_by_transport};
constexpr OutcomeCounters kServeCounters{&Stats::serves_succeeded, &Stats::serves_failed,
                                         &Stats::bytes_served, &Stats::serve_errors,
                                         &Stats::bytes_served_by_transport};

// Counts one outcome into `c`'s fields of `s`: a failure by its error's name, a success with its
// bytes, in all and by transport. Returns whether it succeeded.
bool count_outcome(Stats& s, const OutcomeCounters& c, const std::error_code& ec, uint64_t bytes,
                   const std::string& transport) {
  if (ec) {
    ++(s.*c.failed);
    ++(s.*c.errors)[error_name(ec)];
    return false;
  }
  ++(s.*c.succeeded);
  s.*c.bytes += bytes;
  (s.*c.bytes_by_transport)[transport] += bytes;
  return true;
}

}  // namespace

void StatsRecorder::fetch_started() { fetches_in_flight_.fetch_add(1, std::memory_order_relaxed); }

void StatsRecorder::fetch_done(const std::error_code& ec, uint64_t bytes,
                               const std::string& transport, std::chrono::nanoseconds latency) {
  fetches_in_flight_.fetch_sub(1, std::memory_order_relaxed);
  std::lock_guard lock(mu_);
  if (count_outcome(s_, kFetchCounters, ec, bytes, transport)) s_.fetch_latency.add(latency);
}

void StatsRecorder::serve_done(const std::error_code& ec, uint64_t bytes,
                               const std::string& transport) {
  std::lock_guard lock(mu_);
  count_outcome(s_, kServeCounters, ec, bytes, transport);
}

void StatsRecorder::serve_started() {
  std::lock_guard lock(mu_);
  ++s_.serves_in_flight;
}

void StatsRecorder::serve_ended(const std::error_code& ec, uint64_t bytes,
                                const std::string& transport) {
  std::lock_guard lock(mu_);
  --s_.serves_in_flight;
  count_outcome(s_, kServeCounters, ec, bytes, transport);
}

Stats StatsRecorder::snapshot() const {
  std::lock_guard lock(mu_);
  Stats s = s_;
  s.fetches_in_flight = fetches_in_flight();
  return s;
}

}  // namespace detail
}  // namespace ferry
