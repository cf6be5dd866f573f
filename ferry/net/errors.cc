#include "ferry/net/errors.h"

#include <string>

namespace ferry {
namespace {

class FerryCategory final : public std::error_category {
 public:
  const char* name() const noexcept override { return "ferry"; }
  std::string message(int ev) const override {
    switch (static_cast<errc>(ev)) {
      case errc::ok:
        return "success";
      case errc::timed_out:
        return "operation timed out";
      case errc::aborted:
        return "operation aborted";
      case errc::object_not_found:
        return "object not found on its owner";
      case errc::size_mismatch:
        return "target buffers do not match the object's tensors";
      case errc::invalid_argument:
        return "invalid argument";
      case errc::stale_ref:
        return "object reference is from an earlier instance of its owner";
      case errc::unknown_message:
        return "unknown message";
      case errc::overloaded:
        return "too many requests in flight from this peer";
      case errc::resource_exhausted:
        return "not enough memory for the request";
      case errc::data_corrupted:
        return "the fetched bytes do not match the owner's checksum";
      case errc::peer_closed:
        return "peer closed the connection";
      case errc::connection_failed:
        return "could not connect to the peer";
      case errc::protocol_error:
        return "protocol error";
      case errc::frame_too_large:
        return "frame exceeds the maximum size";
      case errc::version_mismatch:
        return "protocol version mismatch";
      case errc::handshake_failed:
        return "handshake failed";
      case errc::peer_unresponsive:
        return "peer unresponsive past the peer timeout";
      case errc::transport_unavailable:
        return "transport not available on both sides";
      case errc::auth_failed:
        return "authentication failed (shared secret missing or wrong)";
      case errc::tls_failed:
        return "TLS handshake failed (certificate not trusted or not matching, or no TLS there)";
      case errc::tls_required:
        return "the peer requires TLS on the metadata channel (ContextOptions::tls)";
      case errc::connection_refused:
        return "connection refused: nothing listens at that address";
      case errc::host_unresolved:
        return "the peer's host name could not be resolved";
      case errc::transport_unknown:
        return "no transport registered under that name";
      case errc::transport_duplicate:
        return "a transport is already registered under that name";
      case errc::device_error:
        return "device error";
      case errc::context_closed:
        return "context closed";
    }
    return "unknown ferry error " + std::to_string(ev);
  }
};

}  // namespace

const std::error_category& ferry_category() noexcept {
  static const FerryCategory category;
  return category;
}

std::error_code make_error_code(errc e) noexcept { return {static_cast<int>(e), ferry_category()}; }

std::string_view errc_name(errc e) noexcept {
  switch (e) {
    case errc::ok:
      return "ok";
    case errc::timed_out:
      return "timed_out";
    case errc::aborted:
      return "aborted";
    case errc::object_not_found:
      return "object_not_found";
    case errc::size_mismatch:
      return "size_mismatch";
    case errc::invalid_argument:
      return "invalid_argument";
    case errc::stale_ref:
      return "stale_ref";
    case errc::unknown_message:
      return "unknown_message";
    case errc::overloaded:
      return "overloaded";
    case errc::resource_exhausted:
      return "resource_exhausted";
    case errc::data_corrupted:
      return "data_corrupted";
    case errc::peer_closed:
      return "peer_closed";
    case errc::connection_failed:
      return "connection_failed";
    case errc::protocol_error:
      return "protocol_error";
    case errc::frame_too_large:
      return "frame_too_large";
    case errc::version_mismatch:
      return "version_mismatch";
    case errc::handshake_failed:
      return "handshake_failed";
    case errc::peer_unresponsive:
      return "peer_unresponsive";
    case errc::transport_unavailable:
      return "transport_unavailable";
    case errc::auth_failed:
      return "auth_failed";
    case errc::tls_failed:
      return "tls_failed";
    case errc::tls_required:
      return "tls_required";
    case errc::connection_refused:
      return "connection_refused";
    case errc::host_unresolved:
      return "host_unresolved";
    case errc::transport_unknown:
      return "transport_unknown";
    case errc::transport_duplicate:
      return "transport_duplicate";
    case errc::device_error:
      return "device_error";
    case errc::context_closed:
      return "context_closed";
  }
  return "unknown";
}

Scope scope_of(const std::error_code& ec) noexcept {
  if (!ec) return Scope::none;
  if (ec.category() != ferry_category()) {
    // Socket and system errors come from a connection: the peer is what failed.
    return Scope::peer;
  }
  int v = ec.value();
  if (v < 20) return Scope::operation;
  if (v < 40) return Scope::peer;
  if (v < 60) return Scope::operation;
  if (v < 80) return Scope::device;
  return Scope::context;
}

std::string_view scope_name(Scope s) noexcept {
  switch (s) {
    case Scope::none:
      return "none";
    case Scope::operation:
      return "operation";
    case Scope::peer:
      return "peer";
    case Scope::device:
      return "device";
    case Scope::context:
      return "context";
  }
  return "unknown";
}

}  // namespace ferry
