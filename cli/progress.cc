#include "cli/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "cli/units.h"

namespace ferry::cli {
namespace {

// "ETA 1m05s" for `remaining` bytes at `rate` GB/s; "done" with nothing left, "ETA ?" before the
// rate is known.
std::string eta_text(double rate, uint64_t remaining) {
  if (remaining == 0) return "done";
  if (rate <= 0) return "ETA ?";
  const double seconds = static_cast<double>(remaining) / (rate * 1e9);
  if (!std::isfinite(seconds) || seconds > 359999) return "ETA ?";
  const auto s = static_cast<unsigned long long>(std::ceil(seconds));
  char text[32];
  if (s >= 3600) {
    std::snprintf(text, sizeof(text), "ETA %lluh%02llum", s / 3600, s % 3600 / 60);
  } else if (s >= 60) {
    std::snprintf(text, sizeof(text), "ETA %llum%02llus", s / 60, s % 60);
  } else {
    std::snprintf(text, sizeof(text), "ETA %llus", s);
  }
  return text;
}

}  // namespace

ProgressMode parse_progress_mode(const std::string& text) {
  if (text == "always") return ProgressMode::kAlways;
  if (text == "never") return ProgressMode::kNever;
  return ProgressMode::kAuto;
}

Progress::Progress(ProgressMode mode, uint64_t total_objects, uint64_t total_bytes)
    : total_objects_(total_objects),
      total_bytes_(total_bytes),
      start_(std::chrono::steady_clock::now()) {
  switch (mode) {
    case ProgressMode::kNever:
      style_ = Style::kNone;
      break;
    case ProgressMode::kAlways:
      style_ = Style::kBar;
      break;
    case ProgressMode::kAuto:
      style_ = isatty(STDERR_FILENO) ? Style::kBar : Style::kLines;
      break;
  }
}

void Progress::update(uint64_t objects, uint64_t bytes) {
  objects_ = objects;
  bytes_ = bytes;
  if (style_ == Style::kNone || finished_) return;
  const bool complete = objects_ >= total_objects_;
  if (style_ == Style::kLines) {
    const int decile = total_bytes_ ? static_cast<int>(bytes_ * 10 / total_bytes_) : 10;
    if (decile <= last_decile_ && !complete) return;
    last_decile_ = decile;
  } else {
    const auto now = std::chrono::steady_clock::now();
    if (now - last_draw_ < std::chrono::milliseconds(100) && !complete) return;
    last_draw_ = now;
  }
  draw();
}

void Progress::clear() {
  if (style_ != Style::kBar || !drawn_ || finished_) return;
  std::fputs("\r\x1b[K", stderr);
  drawn_ = false;
  last_draw_ = {};
}

void Progress::finish() {
  if (finished_ || style_ == Style::kNone) return;
  finished_ = true;
  if (style_ == Style::kBar && drawn_) {
    draw();
    std::fputc('\n', stderr);
  }
}

void Progress::draw() {
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const double rate = seconds > 0 ? static_cast<double>(bytes_) / seconds / 1e9 : 0;
  const double fraction =
      total_bytes_ ? static_cast<double>(bytes_) / static_cast<double>(total_bytes_) : 1.0;
  const std::string done = format_bytes(bytes_), total = format_bytes(total_bytes_);
  const std::string eta = eta_text(rate, total_bytes_ - std::min(bytes_, total_bytes_));
  if (style_ == Style::kLines) {
    std::fprintf(stderr, "fetched %llu/%llu objects, %s of %s (%.0f%%), %.2f GB/s, %s\n",
                 static_cast<unsigned long long>(objects_),
                 static_cast<unsigned long long>(total_objects_), done.c_str(), total.c_str(),
                 100 * fraction, rate, eta.c_str());
  } else {
    constexpr int kWidth = 30;
    const int filled = static_cast<int>(fraction * kWidth);
    std::string bar(static_cast<size_t>(filled), '#');
    bar.append(static_cast<size_t>(kWidth - filled), '.');
    std::fprintf(stderr, "\r[%s] %llu/%llu objects  %s / %s  %.2f GB/s  %s\x1b[K", bar.c_str(),
                 static_cast<unsigned long long>(objects_),
                 static_cast<unsigned long long>(total_objects_), done.c_str(), total.c_str(), rate,
                 eta.c_str());
  }
  std::fflush(stderr);
  drawn_ = true;
}

}  // namespace ferry::cli
