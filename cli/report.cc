#include "cli/report.h"

#include <algorithm>
#include <cmath>

#include <boost/json/object.hpp>
#include <boost/json/value.hpp>

#include "cli/pretty_json.h"
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
  boost::json::value verified = nullptr;
  if (s.verified != FetchSummary::Verified::kNotChecked) {
    verified = s.verified == FetchSummary::Verified::kYes;
  }
  return pretty_json(boost::json::object{{"objects", s.objects},
                                         {"tensors", s.tensors},
                                         {"bytes", s.bytes},
                                         {"transport", s.transport},
                                         {"wall_s", seconds(s.wall)},
                                         {"throughput_gb_s", gbps},
                                         {"throughput_gbit_s", gbps * 8},
                                         {"latency_ms",
                                          {{"p50", latency_ms(s.latencies, 50)},
                                           {"p99", latency_ms(s.latencies, 99)},
                                           {"max", latency_ms(s.latencies, 100)}}},
                                         {"verified", verified},
                                         {"mismatched_objects", s.mismatched},
                                         {"receive_pool",
                                          {{"held_bytes", s.pool.held_bytes},
                                           {"in_use_bytes", s.pool.in_use_bytes},
                                           {"hits", s.pool.hits},
                                           {"misses", s.pool.misses},
                                           {"fallbacks", s.pool.fallbacks},
                                           {"fallback_bytes", s.pool.fallback_bytes},
                                           {"regions_created", s.pool.regions_created},
                                           {"regions_trimmed", s.pool.regions_trimmed}}},
                                         {"error", failure_value()}});
}

}  // namespace ferry::cli
