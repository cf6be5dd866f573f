// Conversions between ferry's structs and their protobuf wire forms (internal).
#pragma once

#include <cstdint>
#include <string>
#include <system_error>

#include "ferry/net/errors.h"
#include "ferry/net/object_ref.h"
#include "ferry/net/proto/ferry.pb.h"
#include "ferry/net/transport.h"

namespace ferry {

// The most transports one side may list, and devices one transport may list, in a Hello,
// HelloAnswer or Capabilities: far above any real machine's, and small enough that a peer's list
// costs little to keep and scan.
inline constexpr int kMaxWireTransports = 16;
inline constexpr int kMaxWireDevices = 64;
// False when `transports` lists more than those limits allow.
bool within_wire_limits(const google::protobuf::RepeatedPtrField<wire::TransportInfo>& transports);

// The code an Error frame carries for `ec`: a ferry error's own, peer_closed for any other.
inline uint32_t error_to_wire(std::error_code ec) {
  if (ec.category() == ferry_category()) return static_cast<uint32_t>(ec.value());
  return static_cast<uint32_t>(errc::peer_closed);
}
// An Error frame for request `rid` (0: none) carrying `ec` (as error_to_wire), `message` and
// whether the sender ends the connection after it.
inline wire::Envelope error_envelope(uint64_t rid, std::error_code ec, const std::string& message,
                                     bool fatal) {
  wire::Envelope env;
  env.set_request_id(rid);
  auto* err = env.mutable_error();
  err->set_code(error_to_wire(ec));
  err->set_message(message);
  err->set_fatal(fatal);
  return env;
}
// The error an Error frame's code stands for; protocol_error for a code that is no ferry error.
inline std::error_code error_from_wire(uint32_t code) {
  if (code == 0 || code > static_cast<uint32_t>(errc::context_closed)) return errc::protocol_error;
  return make_error_code(static_cast<errc>(code));
}

void to_wire(const TransportInfo& in, wire::TransportInfo& out);
TransportInfo from_wire(const wire::TransportInfo& in);
void to_wire(const ObjectRef& in, wire::ObjectRef& out);
// False when the message is not a usable ref (bad dtype, size overflow, ...).
bool from_wire(const wire::ObjectRef& in, ObjectRef& out);

}  // namespace ferry
