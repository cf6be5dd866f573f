/// @file
/// Minimal leveled logging: to stderr, or to the host application's sink (set_sink).
/// FERRY_LOG=error|warn|info|debug (default warn), or set_level().
#pragma once

#include <fmt/format.h>

#include <functional>
#include <string_view>

/// ferry's leveled logging: to stderr or the application's sink.
namespace ferry::log {

/// Log levels, least verbose first: a line is written when its level <= current_level().
enum class Level {
  error = 0,  ///< failures
  warn = 1,   ///< something unexpected that ferry handled or worked around (the default)
  info = 2,   ///< events of a connection's life: peers closing, fetches failing
  debug = 3   ///< per-request detail: each fetch and serve
};

/// The most verbose level written: set_level()'s, else $FERRY_LOG's, else warn. Any thread.
Level current_level();
/// Overrides $FERRY_LOG from now on. Any thread.
void set_level(Level level);
/// "error", "warn", "info", "debug".
std::string_view level_name(Level level);
/// Writes one line (the level check is the caller's): to the sink if one is set, else stderr.
void write(Level level, std::string_view message);

/// Where ferry's log lines go instead of stderr: the host application's logger. Called with the
/// level and the message (no prefix, no newline) for every line current_level() lets through,
/// one at a time (under a lock), on whichever ferry thread logs: it must return promptly and
/// must not call into ferry. An empty Sink restores stderr. Any thread; lines being written
/// while it changes go to the old or the new one.
using Sink = std::function<void(Level, std::string_view)>;
/// Installs `sink` (see Sink) for every ferry thread from now on; an empty one restores stderr. Any
/// thread.
void set_sink(Sink sink);

/// Writes what at() does when a line cannot be formatted (out of memory): a fixed line in its
/// place. Never throws.
void write_dropped(Level level) noexcept;

template <typename... Args>
/// Formats and writes one line at `level` when current_level() lets it through (fmt syntax, checked
/// at compile time). The arguments are evaluated either way: FERRY_LOG_AT evaluates them only when
/// the level is on. Never throws: a line that cannot be formatted or written is dropped (said in
/// a fixed line), so that logging never ends an operation halfway. Any thread.
void at(Level level, fmt::format_string<Args...> f, Args&&... args) noexcept {
  if (level > current_level()) return;
  try {
    write(level, fmt::format(f, std::forward<Args>(args)...));
  } catch (...) {
    write_dropped(level);
  }
}

}  // namespace ferry::log

/// The arguments are evaluated only when the level is on: debug lines on the fetch path cost a
/// level check, not their formatting (an error_code's message() is a string per call).
#define FERRY_LOG_AT(level, ...)                    \
  do {                                              \
    if ((level) <= ::ferry::log::current_level()) { \
      ::ferry::log::at(level, __VA_ARGS__);         \
    }                                               \
  } while (0)
/// FERRY_LOG_AT at Level::error: `FERRY_LOG_ERROR("connect {}: {}", addr, ec.message())`.
#define FERRY_LOG_ERROR(...) FERRY_LOG_AT(::ferry::log::Level::error, __VA_ARGS__)
/// FERRY_LOG_AT at Level::warn.
#define FERRY_LOG_WARN(...) FERRY_LOG_AT(::ferry::log::Level::warn, __VA_ARGS__)
/// FERRY_LOG_AT at Level::info.
#define FERRY_LOG_INFO(...) FERRY_LOG_AT(::ferry::log::Level::info, __VA_ARGS__)
/// FERRY_LOG_AT at Level::debug.
#define FERRY_LOG_DEBUG(...) FERRY_LOG_AT(::ferry::log::Level::debug, __VA_ARGS__)
