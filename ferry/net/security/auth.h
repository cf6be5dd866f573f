// Shared-secret authentication of the metadata channel (internal): HMAC-SHA256 over nonces.
#pragma once

#include <string>
#include <string_view>

namespace ferry::auth {

// Initialises OpenSSL now (its configuration included), registering its exit-time cleanup. A
// Context calls it as it is made: exit handlers run in the reverse order of registration, so
// the destructor of a static that holds a Context then runs before OpenSSL's cleanup, and the
// io threads, which hold OpenSSL's per-thread state (a proof or nonce made there), end and free
// it first.
void init();
// 16 random bytes.
std::string nonce();
// HMAC-SHA256(secret, label || a || b). The secret itself never leaves the process.
std::string proof(std::string_view secret, std::string_view label, std::string_view a,
                  std::string_view b);
// Constant-time comparison of two proofs.
bool same(std::string_view a, std::string_view b);

inline constexpr std::string_view kServerLabel = "ferry-auth-v1-server";
inline constexpr std::string_view kClientLabel = "ferry-auth-v1-client";

}  // namespace ferry::auth
