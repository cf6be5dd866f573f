#include "cli/units.h"

#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>

namespace ferry::cli {

std::optional<uint64_t> parse_size(std::string_view text) {
  double value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || !(value >= 0)) return std::nullopt;
  std::string suffix;
  for (const char* p = end; p != text.data() + text.size(); ++p) {
    suffix += static_cast<char>(std::toupper(static_cast<unsigned char>(*p)));
  }
  if (suffix.ends_with("B")) suffix.pop_back();                   // "KB", "KiB", "B"
  if (suffix.size() == 2 && suffix[1] == 'I') suffix.pop_back();  // "Ki"
  static constexpr std::string_view kUnits = "KMGT";
  int power = 0;
  if (suffix.size() == 1 && kUnits.find(suffix[0]) != std::string_view::npos) {
    power = static_cast<int>(kUnits.find(suffix[0])) + 1;
  } else if (!suffix.empty()) {
    return std::nullopt;
  }
  const double scale = std::ldexp(1.0, 10 * power);
  const double bytes = std::ceil(value * scale);
  if (bytes >= 18446744073709551616.0) return std::nullopt;
  return static_cast<uint64_t>(bytes);
}

std::optional<uint64_t> parse_count(std::string_view text) {
  uint64_t value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return value;
}

std::optional<std::pair<uint64_t, uint64_t>> parse_range(
    std::string_view text, std::optional<uint64_t> (*parse)(std::string_view)) {
  const auto dash = text.find('-');
  auto lo = parse(text.substr(0, dash));
  auto hi = dash == std::string_view::npos ? lo : parse(text.substr(dash + 1));
  if (!lo || !hi || *lo > *hi) return std::nullopt;
  return std::pair{*lo, *hi};
}

std::string format_bytes(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024 && unit < 6) {
    value /= 1024;
    ++unit;
  }
  char buf[32];
  if (unit == 0) {
    std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(bytes));
  } else {
    std::snprintf(buf, sizeof buf, "%.2f %s", value, kUnits[unit]);
  }
  return buf;
}

}  // namespace ferry::cli
