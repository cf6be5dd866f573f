#include "ferry/net/coverage.h"

#include <iterator>

namespace ferry {

bool Coverage::add(uint64_t offset, uint64_t length) {
  if (offset > size_ || length > size_ - offset) return false;
  if (length == 0) return true;
  const uint64_t end = offset + length;
  // The first range that begins after `offset`, and the one before it.
  auto next = ranges_.upper_bound(offset);
  auto prev = next == ranges_.begin() ? ranges_.end() : std::prev(next);
  if (prev != ranges_.end() && prev->second > offset) return false;  // overlaps the one before
  if (next != ranges_.end() && next->first < end) return false;      // overlaps the one after
  const bool joins_prev = prev != ranges_.end() && prev->second == offset;
  const bool joins_next = next != ranges_.end() && next->first == end;
  if (joins_prev && joins_next) {
    prev->second = next->second;
    ranges_.erase(next);
  } else if (joins_prev) {
    prev->second = end;
  } else if (joins_next) {
    const uint64_t next_end = next->second;
    ranges_.erase(next);
    ranges_.emplace(offset, next_end);
  } else {
    if (ranges_.size() >= kMaxRanges) return false;
    ranges_.emplace(offset, end);
  }
  written_ += length;
  return true;
}

}  // namespace ferry
