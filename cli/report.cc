#include "cli/report.h"

#include <algorithm>
#include <cmath>

#include "cli/json.h"
#include "cli/status.h"
#include "cli/units.h"

namespace ferry::cli {
namespace {

double seconds(std::chrono::nanoseconds d) { return std::chrono::duration<double>(d).count(); }

double gigabytes_per_second(const FetchSummary& s) {
  return s.wall.count() > 0 ? static_cast<double>(s.bytes) / seconds(s.wall) / 1e9 : 0;
}

std::string verified_text(const FetchSummary& s) {
  switch (s.verified) {
    case FetchSummary::Verified::kYes:
      return "yes (every byte, against the manifest)";
    case FetchSummary::Verified::kNotChecked:
      return "no (no manifest to check against)";
    case FetchSummary::Verified::kFailed:
      return "FAILED (" + std::to_string(s.mismatched) + " of " + std::to_string(s.objects) +
             " objects differ)";
  }
  return "";
}

}  // namespace

double latency_ms(std::vector<std::chrono::nanoseconds> latencies, double p) {
  if (latencies.empty()) return 0;
  std::sort(latencies.begin(), latencies.end());
  const auto rank = static_cast<size_t>(std::ceil(p / 100 * static_cast<double>(latencies.size())));
  const size_t index = std::clamp<size_t>(rank, 1, latencies.size()) - 1;
  return seconds(latencies[index]) * 1e3;
}

void print_table(std::FILE* out, const FetchSummary& s) {
  const double gbps = gigabytes_per_second(s);
  auto row = [out](const char* name, const std::string& value) {
    std::fprintf(out, "  %-12s %s\n", name, value.c_str());
  };
  char buf[128];
  row("objects", std::to_string(s.objects));
  row("tensors", std::to_string(s.tensors));
  row("bytes", format_bytes(s.bytes) + " (" + std::to_string(s.bytes) + ")");
  row("transport", s.transport.empty() ? "-" : s.transport);
  std::snprintf(buf, sizeof buf, "%.3f s", seconds(s.wall));
  row("wall time", buf);
  std::snprintf(buf, sizeof buf, "%.2f GB/s (%.1f Gbit/s)", gbps, gbps * 8);
  row("throughput", buf);
  std::snprintf(buf, sizeof buf, "p50 %.2f ms, p99 %.2f ms, max %.2f ms",
                latency_ms(s.latencies, 50), latency_ms(s.latencies, 99),
                latency_ms(s.latencies, 100));
  row("latency", buf);
  row("verified", verified_text(s));
  std::snprintf(buf, sizeof buf, "%s held, %llu hits, %llu misses, %llu fallbacks",
                format_bytes(s.pool.held_bytes).c_str(),
                static_cast<unsigned long long>(s.pool.hits),
                static_cast<unsigned long long>(s.pool.misses),
                static_cast<unsigned long long>(s.pool.fallbacks));
  row("memory", std::string(buf) + " (receive pool)");
}

std::string summary_json(const FetchSummary& s) {
  const double gbps = gigabytes_per_second(s);
  JsonWriter w;
  w.begin_object();
  w.key("objects").value(s.objects).key("tensors").value(s.tensors).key("bytes").value(s.bytes);
  w.key("transport").value(s.transport).key("wall_s").value(seconds(s.wall));
  w.key("throughput_gb_s").value(gbps).key("throughput_gbit_s").value(gbps * 8);
  w.key("latency_ms").begin_object();
  w.key("p50").value(latency_ms(s.latencies, 50)).key("p99").value(latency_ms(s.latencies, 99));
  w.key("max").value(latency_ms(s.latencies, 100)).end_object();
  w.key("verified");
  if (s.verified == FetchSummary::Verified::kNotChecked) {
    w.null();
  } else {
    w.value(s.verified == FetchSummary::Verified::kYes);
  }
  w.key("mismatched_objects").value(s.mismatched);
  w.key("receive_pool").begin_object();
  w.key("held_bytes").value(s.pool.held_bytes).key("in_use_bytes").value(s.pool.in_use_bytes);
  w.key("hits").value(s.pool.hits).key("misses").value(s.pool.misses);
  w.key("fallbacks").value(s.pool.fallbacks).key("fallback_bytes").value(s.pool.fallback_bytes);
  w.key("regions_created").value(s.pool.regions_created);
  w.key("regions_trimmed").value(s.pool.regions_trimmed).end_object();
  write_failure(w);
  w.end_object();
  return w.str();
}

}  // namespace ferry::cli
