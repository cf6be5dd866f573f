// Reading ferry's settings from the environment ($FERRY_*), for the defaults of its options.
#pragma once

#include <charconv>
#include <cstdlib>
#include <string>

#include "ferry/net/log.h"

namespace ferry {

// The environment variable's text, "" when it is unset. Any thread (getenv: nothing in ferry
// sets the environment).
inline std::string env_text(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

// The environment variable as a whole number from `lo` to `hi`; `fallback` when it is unset, and
// when it holds anything else (logged, with the value kept).
inline long env_integer(const char* name, long lo, long hi, long fallback) {
  const std::string v = env_text(name);
  if (v.empty()) return fallback;
  long n = 0;
  const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
  if (ec != std::errc() || end != v.data() + v.size() || n < lo || n > hi) {
    FERRY_LOG_WARN("{}={} is not {} to {}: {}", name, v, lo, hi, fallback);
    return fallback;
  }
  return n;
}

// The environment variable as a switch: "1", "true" or "yes" is true, "0", "false" or "no"
// false; `fallback` when it is unset, and when it holds anything else (logged, with the value
// kept).
inline bool env_flag(const char* name, bool fallback) {
  const std::string v = env_text(name);
  if (v == "1" || v == "true" || v == "yes") return true;
  if (v == "0" || v == "false" || v == "no") return false;
  if (!v.empty()) {
    FERRY_LOG_WARN("{}={} is not 1/true/yes or 0/false/no: {}", name, v,
                   fallback ? "true" : "false");
  }
  return fallback;
}

}  // namespace ferry
