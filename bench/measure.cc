#include "bench/measure.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

namespace ferry::bench {

double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

Repeated repeat_for(double seconds, const std::function<void()>& step) {
  const auto t0 = Clock::now();
  Repeated r;
  do {
    step();
    ++r.times;
    r.seconds = seconds_between(t0, Clock::now());
  } while (r.seconds < seconds);
  return r;
}

double self_cpu_seconds() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  auto tv = [](const timeval& t) { return static_cast<double>(t.tv_sec) + t.tv_usec / 1e6; };
  return tv(ru.ru_utime) + tv(ru.ru_stime);
}

double process_cpu_seconds(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(in, line)) return -1;
  // The command name (field 2) may contain spaces; fields after its closing ')' are plain.
  const auto close = line.rfind(')');
  if (close == std::string::npos) return -1;
  std::istringstream rest(line.substr(close + 2));
  std::string field;
  unsigned long long utime = 0;
  unsigned long long stime = 0;
  for (int i = 3; i <= 15 && rest >> field; ++i) {
    if (i == 14) utime = std::stoull(field);
    if (i == 15) stime = std::stoull(field);
  }
  return static_cast<double>(utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

namespace {
uint64_t status_kib(pid_t pid, std::string_view key) {
  std::ifstream in(pid ? "/proc/" + std::to_string(pid) + "/status" : "/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.starts_with(key)) return std::strtoull(line.c_str() + key.size(), nullptr, 10);
  }
  return 0;
}
}  // namespace

uint64_t rss_bytes(pid_t pid) { return status_kib(pid, "VmRSS:") * 1024; }
uint64_t peak_rss_bytes(pid_t pid) { return status_kib(pid, "VmHWM:") * 1024; }

double quantile(std::vector<double>& values, double q) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const double rank = std::ceil(q * static_cast<double>(values.size()));
  const size_t i = rank < 1 ? 0 : static_cast<size_t>(rank) - 1;
  return values[std::min(i, values.size() - 1)];
}

void JsonLine::key(std::string_view k) {
  if (!body_.empty()) body_ += ", ";
  body_ += '"';
  body_ += k;
  body_ += "\": ";
}

JsonLine& JsonLine::add(std::string_view k, double value) {
  key(k);
  if (!std::isfinite(value)) {
    body_ += "null";
    return *this;
  }
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.9g", value);
  body_ += buf;
  return *this;
}

JsonLine& JsonLine::add(std::string_view k, uint64_t value) {
  key(k);
  body_ += std::to_string(value);
  return *this;
}

JsonLine& JsonLine::add(std::string_view k, std::string_view value) {
  key(k);
  body_ += '"';
  for (char c : value) {
    if (c == '"' || c == '\\') body_ += '\\';
    if (static_cast<unsigned char>(c) < 0x20) continue;
    body_ += c;
  }
  body_ += '"';
  return *this;
}

JsonLine& JsonLine::add_raw(std::string_view k, std::string_view json) {
  key(k);
  body_ += json;
  return *this;
}

std::vector<uint64_t> parse_size_list(std::string_view text) {
  std::vector<uint64_t> out;
  while (!text.empty()) {
    const auto comma = text.find(',');
    std::string_view item = text.substr(0, comma);
    text = comma == std::string_view::npos ? std::string_view() : text.substr(comma + 1);
    uint64_t n = 0;
    auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), n);
    if (ec != std::errc() || n == 0) return {};
    std::string_view suffix(end, item.data() + item.size() - end);
    if (suffix == "K" || suffix == "k") {
      n <<= 10;
    } else if (suffix == "M" || suffix == "m") {
      n <<= 20;
    } else if (suffix == "G" || suffix == "g") {
      n <<= 30;
    } else if (!suffix.empty()) {
      return {};
    }
    out.push_back(n);
  }
  return out;
}

void raise_fd_limit() {
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
  }
}

}  // namespace ferry::bench
