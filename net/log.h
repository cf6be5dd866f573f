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

#define FERRY_LOG_ERROR(...) ::ferry::log::at(::ferry::log::Level::error, __VA_ARGS__)
#define FERRY_LOG_WARN(...) ::ferry::log::at(::ferry::log::Level::warn, __VA_ARGS__)
#define FERRY_LOG_INFO(...) ::ferry::log::at(::ferry::log::Level::info, __VA_ARGS__)
#define FERRY_LOG_DEBUG(...) ::ferry::log::at(::ferry::log::Level::debug, __VA_ARGS__)
