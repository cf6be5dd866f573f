// Measurement helpers shared by ferry-bench's modes: clocks, CPU time, resident memory,
// percentiles and one-line JSON results.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace ferry::bench {

using Clock = std::chrono::steady_clock;

// Seconds between two steady_clock points.
double seconds_between(Clock::time_point a, Clock::time_point b);

// Runs `step` back to back, at least once, until `seconds` have passed: how many times, in how
// many seconds. For single-core loops (memcpy, reduction kernels).
struct Repeated {
  uint64_t times = 0;
  double seconds = 0;
  // Bytes per second when each step moves `bytes`.
  double rate(uint64_t bytes) const { return static_cast<double>(times * bytes) / seconds; }
};
Repeated repeat_for(double seconds, const std::function<void()>& step);

// CPU time (user + system, all threads) this process has used so far, in seconds.
double self_cpu_seconds();
// CPU time of process `pid` from /proc/PID/stat (clock-tick resolution); -1 when unreadable.
double process_cpu_seconds(pid_t pid);
// Resident set size of `pid` (0 = this process) in bytes, and its peak; 0 when unreadable.
uint64_t rss_bytes(pid_t pid = 0);
uint64_t peak_rss_bytes(pid_t pid = 0);

// The q-quantile (0..1, nearest rank) of `values`, which it sorts. 0 for an empty vector.
double quantile(std::vector<double>& values, double q);

// Builds one JSON object on one line: {"key": value, ...}. Keys are trusted identifiers.
class JsonLine {
 public:
  JsonLine& add(std::string_view key, double value);
  JsonLine& add(std::string_view key, uint64_t value);
  JsonLine& add(std::string_view key, int value) { return add(key, static_cast<double>(value)); }
  JsonLine& add(std::string_view key, std::string_view value);
  // A value that is already JSON text (an array, a nested object).
  JsonLine& add_raw(std::string_view key, std::string_view json);
  std::string str() const { return "{" + body_ + "}"; }

 private:
  void key(std::string_view k);
  std::string body_;
};

// Parses "8,64,4K,1M" (suffixes K, M, G are powers of 1024) into byte counts; empty on error.
std::vector<uint64_t> parse_size_list(std::string_view text);

// Raises RLIMIT_NOFILE to its hard limit (many peers need many descriptors).
void raise_fd_limit();

}  // namespace ferry::bench
