#include "ferry/net/log.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace ferry::log {

namespace {

constexpr int kFromEnvironment = -1;
std::atomic<int> level_override{kFromEnvironment};

std::mutex& sink_mu() {
  static std::mutex mu;
  return mu;
}
Sink& sink() {
  static Sink s;
  return s;
}

}  // namespace

void set_level(Level level) { level_override.store(static_cast<int>(level)); }

std::string_view level_name(Level level) {
  static constexpr std::string_view kNames[] = {"error", "warn", "info", "debug"};
  return kNames[static_cast<int>(level)];
}

void set_sink(Sink s) {
  std::lock_guard lock(sink_mu());
  sink() = std::move(s);
}

Level current_level() {
  if (const int o = level_override.load(std::memory_order_relaxed); o != kFromEnvironment) {
    return static_cast<Level>(o);
  }
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
  std::lock_guard lock(sink_mu());
  if (sink()) {
    try {
      sink()(level, message);
      return;
    } catch (...) {  // the application's sink failed: the line goes to stderr instead
    }
  }
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
  std::fprintf(stderr, "ferry[%s]: %.*s\n", level_name(level).data(),
               static_cast<int>(message.size()), message.data());
}

void write_dropped(Level level) noexcept {
  try {
    write(level, "(a log line was dropped: it could not be formatted)");
  } catch (...) {
  }
}

}  // namespace ferry::log
