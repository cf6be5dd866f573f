// Minimal leveled logging to stderr. FERRY_LOG=error|warn|info|debug (default warn).
#pragma once

#include <fmt/format.h>

#include <string_view>

namespace ferry::log {

enum class Level { error = 0, warn = 1, info = 2, debug = 3 };

Level current_level();
void write(Level level, std::string_view message);

template <typename... Args>
void at(Level level, fmt::format_string<Args...> f, Args&&... args) {
  if (level <= current_level()) write(level, fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace ferry::log

// The arguments are evaluated only when the level is on: debug lines on the fetch path cost a
// level check, not their formatting (an error_code's message() is a string per call).
#define FERRY_LOG_AT(level, ...)                    \
  do {                                              \
    if ((level) <= ::ferry::log::current_level()) { \
      ::ferry::log::at(level, __VA_ARGS__);         \
    }                                               \
  } while (0)
#define FERRY_LOG_ERROR(...) FERRY_LOG_AT(::ferry::log::Level::error, __VA_ARGS__)
#define FERRY_LOG_WARN(...) FERRY_LOG_AT(::ferry::log::Level::warn, __VA_ARGS__)
#define FERRY_LOG_INFO(...) FERRY_LOG_AT(::ferry::log::Level::info, __VA_ARGS__)
#define FERRY_LOG_DEBUG(...) FERRY_LOG_AT(::ferry::log::Level::debug, __VA_ARGS__)
