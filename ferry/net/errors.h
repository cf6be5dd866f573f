/// @file
/// ferry's error codes (std::error_code, category "ferry") and their failure scopes.
///
/// The scope tells a caller what broke and so what to do: retry the operation, reconnect the
/// peer, fall back from a device, or rebuild the context (after UCX's error grouping).
#pragma once

#include <string_view>
#include <system_error>

namespace ferry {

/// ferry's error codes: the values of ferry_category(), usable as std::error_code (make_error_code,
/// std::is_error_code_enum). Each range is one failure scope (scope_of): 1-19 operation, 20-39
/// peer, 40-59 operation, 60-79 device, 80 and up context. The values travel on the wire (a
/// peer's error replies): never renumber.
enum class errc {
  ok = 0,  ///< success: no call reports it as an error (test an error_code with `!ec`)
  // operation scope: this request failed, the peer is fine
  timed_out = 1,  ///< a deadline passed: the fetch's own, a blocking call's or a wait's
  aborted = 2,    ///< the operation was aborted before it completed (e.g. FetchRequest::abort())
  object_not_found = 3,  ///< the owner has no such object (never put, released or collected)
  size_mismatch = 4,     ///< target buffers do not match the object's tensors
  invalid_argument = 5,  ///< the caller's arguments are not valid for the call
  stale_ref = 6,  ///< the ref is from an earlier instance of its owner (ObjectRef::owner_instance)
  unknown_message = 7,  ///< the peer sent a message type this side does not know
  overloaded = 8,       ///< the peer has too many requests in flight with us: retry later
  /// this process cannot get the memory the request needs (it asks for more than the machine
  /// has, or an allocation failed): smaller requests may still succeed
  resource_exhausted = 9,
  /// the bytes that landed differ from the checksum the owner put the object with
  /// (PutOptions::checksum): the transfer corrupted them, or the owner changed the memory after
  /// the put. The targets hold the bytes as they landed; fetching again may succeed
  data_corrupted = 10,
  // peer scope: the connection to this peer is gone or unusable
  peer_closed = 20,        ///< the connection is closed (by either side, or it broke)
  connection_failed = 21,  ///< connecting failed (unreachable, reset, timed out; the log says why)
  protocol_error = 22,     ///< the peer sent something malformed or out of order
  frame_too_large = 23,    ///< a metadata frame exceeded ContextOptions::max_frame_bytes
  version_mismatch = 24,   ///< the peer speaks another protocol version (kProtocolVersion)
  handshake_failed = 25,   ///< the handshake (Hello / HelloAnswer, a side connection's) did not
                           ///< complete in time or was refused
  /// the peer stopped responding for longer than ContextOptions::peer_timeout: no heartbeat
  /// answered, its control channel not read, or an RDMA queue pair's READs not completing
  peer_unresponsive = 26,
  transport_unavailable = 27,  ///< no transport both sides have (or the one asked for is missing)
  auth_failed = 28,   ///< shared secret missing or wrong on one side (ContextOptions::secret)
  tls_failed = 29,    ///< TLS handshake failed: certificate not trusted, or the peer has no TLS
  tls_required = 30,  ///< the peer accepts only TLS on the metadata channel
  // Connecting: nothing listens at that address (the system refused the connection), and the
  // host name does not resolve. Other connect failures (unreachable, reset) are
  // connection_failed; every one is logged with the system's own message.
  connection_refused = 31,  ///< connecting: nothing listens at that address
  host_unresolved = 32,     ///< connecting: the host name does not resolve
  // registry (operation scope at the call site)
  transport_unknown = 40,    ///< no transport registered under that name
  transport_duplicate = 41,  ///< a transport is already registered under that name
  // device scope
  device_error = 60,  ///< an RDMA device failed or has none usable; other transports may still work
  // context scope
  context_closed = 80,  ///< the Context is closed (or closing): nothing more can run on it
};

/// What an error broke, and so what to do about it (scope_of()).
enum class Scope {
  none,       ///< no error
  operation,  ///< this request failed, the peer is fine: retry it (or not)
  peer,       ///< the connection to this peer is gone or unusable: reconnect
  device,     ///< a device failed: fall back to another transport or device
  context     ///< the Context is closed: make a new one
};

/// The error category of errc (name "ferry"; message() gives a sentence per code). One object for
/// the process; any thread.
const std::error_category& ferry_category() noexcept;
/// `e` as a std::error_code of ferry_category(); lets errc convert to std::error_code implicitly.
std::error_code make_error_code(errc e) noexcept;

/// The enumerator's name ("timed_out", "peer_closed", ...); "unknown" for a value outside the enum.
std::string_view errc_name(errc e) noexcept;

/// The failure scope of any error code (system and Asio errors from sockets are peer scope).
Scope scope_of(const std::error_code& ec) noexcept;
/// "none", "operation", "peer", "device", "context"; "unknown" for a value outside the enum.
std::string_view scope_name(Scope s) noexcept;

}  // namespace ferry

/// Makes errc convert to std::error_code (through ferry::make_error_code) and compare with one.
template <>
struct std::is_error_code_enum<ferry::errc> : std::true_type {};
