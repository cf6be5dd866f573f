// ferry's error codes (std::error_code, category "ferry") and their failure scopes.
//
// The scope tells a caller what broke and so what to do: retry the operation, reconnect the
// peer, fall back from a device, or rebuild the context (after UCX's error grouping).
#pragma once

#include <string_view>
#include <system_error>

namespace ferry {

enum class errc {
  ok = 0,
  // operation scope: this request failed, the peer is fine
  timed_out = 1,
  aborted = 2,
  object_not_found = 3,
  size_mismatch = 4,
  invalid_argument = 5,
  stale_ref = 6,
  unknown_message = 7,
  overloaded = 8,  // the peer has too many requests in flight with us: retry later
  // this process cannot get the memory the request needs (it asks for more than the machine
  // has, or an allocation failed): smaller requests may still succeed
  resource_exhausted = 9,
  // peer scope: the connection to this peer is gone or unusable
  peer_closed = 20,
  connection_failed = 21,
  protocol_error = 22,
  frame_too_large = 23,
  version_mismatch = 24,
  handshake_failed = 25,
  peer_unresponsive = 26,
  transport_unavailable = 27,
  auth_failed = 28,
  tls_failed = 29,    // TLS handshake failed: certificate not trusted, or the peer has no TLS
  tls_required = 30,  // the peer accepts only TLS on the metadata channel
  // Connecting: nothing listens at that address (the system refused the connection), and the
  // host name does not resolve. Other connect failures (unreachable, reset) are
  // connection_failed; every one is logged with the system's own message.
  connection_refused = 31,
  host_unresolved = 32,
  // registry (operation scope at the call site)
  transport_unknown = 40,
  transport_duplicate = 41,
  // device scope
  device_error = 60,
  // context scope
  context_closed = 80,
};

enum class Scope { none, operation, peer, device, context };

const std::error_category& ferry_category() noexcept;
std::error_code make_error_code(errc e) noexcept;

// The enumerator's name ("timed_out", "peer_closed", ...); "unknown" for a value outside the enum.
std::string_view errc_name(errc e) noexcept;

// The failure scope of any error code (system and Asio errors from sockets are peer scope).
Scope scope_of(const std::error_code& ec) noexcept;
std::string_view scope_name(Scope s) noexcept;

}  // namespace ferry

template <>
struct std::is_error_code_enum<ferry::errc> : std::true_type {};
