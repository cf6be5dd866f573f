// Progress of a run on stderr: a redrawn bar on a terminal, occasional plain lines otherwise.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace ferry::cli {

enum class ProgressMode {
  kAuto,    // a bar when stderr is a terminal, plain lines every 10% otherwise
  kAlways,  // a bar even when stderr is not a terminal
  kNever,
};

// Parses "auto", "always" or "never"; kAuto for anything else.
ProgressMode parse_progress_mode(const std::string& text);

class Progress {
 public:
  // Starts tracking `total_objects` objects of `total_bytes` bytes; draws nothing yet.
  Progress(ProgressMode mode, uint64_t total_objects, uint64_t total_bytes);

  // Records that `objects` objects and `bytes` bytes are done so far (cumulative). Redraws at
  // most 10 times a second, and always when everything is done.
  void update(uint64_t objects, uint64_t bytes);
  // Erases a drawn bar so other text can go to stderr; the next update draws it again.
  void clear();
  // Ends the display (a bar gets its final state and a newline). Idempotent.
  void finish();

 private:
  void draw();

  enum class Style { kNone, kBar, kLines };
  Style style_;
  uint64_t total_objects_;
  uint64_t total_bytes_;
  uint64_t objects_ = 0;
  uint64_t bytes_ = 0;
  int last_decile_ = 0;
  bool drawn_ = false;
  bool finished_ = false;
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_draw_{};
};

}  // namespace ferry::cli
