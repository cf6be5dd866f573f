// The summary `ferry fetch` prints at the end: a small table, or a JSON document.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "ferry/net/context.h"

namespace ferry::cli {

struct FetchSummary {
  enum class Verified { kYes, kNotChecked, kFailed };

  uint64_t objects = 0;
  uint64_t tensors = 0;
  uint64_t bytes = 0;
  std::string transport;
  std::chrono::nanoseconds wall{0};
  std::vector<std::chrono::nanoseconds> latencies;  // one per fetch, in any order
  Verified verified = Verified::kNotChecked;
  uint64_t mismatched = 0;  // objects whose bytes differ from the manifest
  PoolStats pool;           // the receive pool the fetched bytes landed in, at the end
};

// Latency percentile `p` (0..100, nearest rank) in milliseconds; 0 when there are none.
double latency_ms(std::vector<std::chrono::nanoseconds> latencies, double p);

// Writes the summary as an aligned two-column table.
void print_table(std::FILE* out, const FetchSummary& summary);

// The summary as a JSON document (throughput in GB/s and Gbit/s, latencies in ms), with "error":
// the first failure reported (cli/status.h), or null.
std::string summary_json(const FetchSummary& summary);

}  // namespace ferry::cli
