#include "net/log.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace ferry::log {

Level current_level() {
  static const Level level = [] {
    const char* v = std::getenv("FERRY_LOG");
    if (!v) return Level::warn;
    if (!std::strcmp(v, "error")) return Level::error;
    if (!std::strcmp(v, "info")) return Level::info;
    if (!std::strcmp(v, "debug")) return Level::debug;
    return Level::warn;
  }();
  return level;
}

void write(Level level, std::string_view message) {
  static std::mutex mu;
  static constexpr const char* kNames[] = {"error", "warn", "info", "debug"};
  std::lock_guard lock(mu);
  if (level == Level::debug) {
    // Debug lines carry the time (s since the first line) and the thread: they are read to
    // follow one operation across threads and processes.
    using Clock = std::chrono::steady_clock;
    static const Clock::time_point start = Clock::now();
    const double t = std::chrono::duration<double>(Clock::now() - start).count();
    std::fprintf(stderr, "ferry[debug %.6f %ld]: %.*s\n", t, static_cast<long>(gettid()),
                 static_cast<int>(message.size()), message.data());
    return;
  }
  std::fprintf(stderr, "ferry[%s]: %.*s\n", kNames[static_cast<int>(level)],
               static_cast<int>(message.size()), message.data());
}

}  // namespace ferry::log
