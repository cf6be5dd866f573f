#include "ferry/net/security/attach.h"

#include "ferry/net/security/auth.h"

namespace ferry::auth {

namespace {

std::string big_endian(uint64_t v) {
  std::string out(8, '\0');
  for (int i = 7; i >= 0; --i, v >>= 8) out[i] = static_cast<char>(v & 0xff);
  return out;
}

}  // namespace

std::string attach_proof(std::string_view token, uint64_t session_id, uint64_t seq,
                         std::string_view transport) {
  // The numbers have fixed widths, so the variable-length name at the end is unambiguous.
  return proof(token, kAttachLabel, big_endian(session_id) + big_endian(seq), transport);
}

bool AttachWindow::accept(uint64_t seq) {
  std::lock_guard lock(mu_);
  if (seq == 0) return false;
  if (seq > highest_) {
    const uint64_t shift = seq - highest_;
    taken_ = shift >= 64 ? 0 : taken_ << shift;
    taken_ |= 1;
    highest_ = seq;
    return true;
  }
  const uint64_t back = highest_ - seq;
  if (back >= 64) return false;
  const uint64_t bit = uint64_t{1} << back;
  if (taken_ & bit) return false;
  taken_ |= bit;
  return true;
}

}  // namespace ferry::auth
