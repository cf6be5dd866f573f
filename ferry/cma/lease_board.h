// LeaseBoard: words in the owner's memory that say whether a CMA grant still holds (internal to
// the CMA transport).
//
// An owner gives each grant a slot holding a fresh token and sends the slot's address and the
// token with the grant; it clears the slot before it lets the object go (release, abort, lease
// timeout, the channel's end). The fetcher reads the slot with process_vm_readv after its copy:
// its token still there means the owner held the object while every byte was read, so the fetch
// completes without a round trip to ask. A token is never handed out twice by one board, so a
// late reader never takes a slot's next grant for its own.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

namespace ferry::cma {

class LeaseBoard {
 public:
  // One grant's slot: where its word is (an address a fetcher reads) and what it holds while the
  // grant does. A default Slot is no slot.
  struct Slot {
    std::atomic<uint64_t>* word = nullptr;
    uint64_t token = 0;
    explicit operator bool() const { return word != nullptr; }
  };

  LeaseBoard();
  LeaseBoard(const LeaseBoard&) = delete;
  LeaseBoard& operator=(const LeaseBoard&) = delete;

  // A free slot, its word set to a fresh token (never 0). Any thread; allocates a chunk of slots
  // when none is free (std::bad_alloc then).
  Slot acquire();
  // Clears the slot's word (0: no grant) and frees the slot. Everything the caller does after it
  // (unpinning the object) is ordered after the clear. Any thread; `slot` from acquire(), once.
  void revoke(Slot slot) noexcept;

  // Whether a word read from a fetcher's slot means its grant still held. Any thread.
  static bool holds(uint64_t word, uint64_t token) { return token != 0 && word == token; }

 private:
  static constexpr size_t kChunk = 512;  // slots allocated at a time

  std::mutex mu_;
  std::vector<std::unique_ptr<std::atomic<uint64_t>[]>> chunks_;  // freed with the board
  std::vector<std::atomic<uint64_t>*> free_;
  uint64_t next_token_;
};

}  // namespace ferry::cma
