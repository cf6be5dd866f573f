/// @file
/// Coverage: which bytes of one target buffer a receive path has written, from offsets a peer
/// sent. A fetch may succeed only when every byte of every target was written exactly once: a
/// chunk that overlaps bytes already written, or falls outside the target, is refused as it
/// arrives; a gap shows at the end (complete() is false).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>

namespace ferry {

/// The written ranges of one target buffer of `size` bytes (see this file's comment). A value type
/// with no locking: one per target, used by the one thread (strand) that receives into it.
class Coverage {
 public:
  /// The most disjoint written ranges one target may have at once. A sender that writes in order
  /// keeps one; a peer that scatters tiny chunks is refused past this, so the bookkeeping stays
  /// small whatever it sends.
  static constexpr size_t kMaxRanges = 1024;

  /// Nothing written yet of a target of `size` bytes.
  explicit Coverage(uint64_t size = 0) : size_(size) {}

  /// Records that [offset, offset + length) was written. False, recording nothing, when the range
  /// leaves the target, overlaps a range already written, or would be one range too many: the
  /// caller treats that as a protocol error. An empty range inside the target is accepted.
  bool add(uint64_t offset, uint64_t length);

  /// Every byte written (exactly once, given that add() refused every overlap).
  bool complete() const { return written_ == size_; }
  /// The target's size in bytes, as constructed.
  uint64_t size() const { return size_; }
  /// Bytes recorded so far (the sum of the accepted ranges' lengths).
  uint64_t written() const { return written_; }

 private:
  uint64_t size_;
  uint64_t written_ = 0;
  std::map<uint64_t, uint64_t> ranges_;  // begin -> end; disjoint, adjacent ones merged
};

}  // namespace ferry
