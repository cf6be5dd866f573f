#include "ferry/cma/lease_board.h"

#include <random>

namespace ferry::cma {

// Tokens start at a random point, so that a word read from a board that is gone (the owner's
// context closed, its memory reused) matches a fetcher's token only by a 1 in 2^64 chance.
LeaseBoard::LeaseBoard() {
  std::random_device rd;
  next_token_ = (static_cast<uint64_t>(rd()) << 32) | rd();
}

LeaseBoard::Slot LeaseBoard::acquire() {
  std::lock_guard lock(mu_);
  if (free_.empty()) {
    // Every allocation before the board changes: one that throws leaves it as it was (no slot
    // in free_ whose chunk was freed). Room in free_ for every slot: revoke() never allocates.
    chunks_.reserve(chunks_.size() + 1);
    free_.reserve((chunks_.size() + 1) * kChunk);
    chunks_.push_back(std::make_unique<std::atomic<uint64_t>[]>(kChunk));
    auto& chunk = chunks_.back();
    for (size_t i = 0; i < kChunk; ++i) free_.push_back(&chunk[kChunk - 1 - i]);
  }
  Slot slot{free_.back(), next_token_++};
  if (slot.token == 0) slot.token = next_token_++;
  free_.pop_back();
  slot.word->store(slot.token, std::memory_order_release);
  return slot;
}

void LeaseBoard::revoke(Slot slot) noexcept {
  if (!slot) return;
  slot.word->store(0, std::memory_order_seq_cst);  // before the caller lets the object go
  std::lock_guard lock(mu_);
  free_.push_back(slot.word);
}

}  // namespace ferry::cma
