// Proof that a side connection (a transport's data channel) belongs to a session, without the
// session's token on the wire (internal).
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>

namespace ferry::auth {

inline constexpr std::string_view kAttachLabel = "ferry-attach-v1";

// HMAC-SHA256(token, label || session id || seq || transport): what AttachChannel carries for
// the session's attach number `seq`. Whoever records it learns nothing that attaches again.
std::string attach_proof(std::string_view token, uint64_t session_id, uint64_t seq,
                         std::string_view transport);

// The attach numbers an accepting session has taken, so that each is accepted once and a
// recorded AttachChannel cannot be replayed. Remembers the highest and the 63 below it; older
// ones are refused (the initiator numbers its attaches from 1 in order and has at most a few
// in flight at once). Thread-safe: attaches are checked off the session's strand.
class AttachWindow {
 public:
  // True the first time `seq` is offered; false for 0, for a repeat, and for a number more than
  // 63 below the highest accepted.
  bool accept(uint64_t seq);

 private:
  std::mutex mu_;
  uint64_t highest_ = 0;
  uint64_t taken_ = 0;  // bit i: highest_ - i was accepted
};

}  // namespace ferry::auth
