// Conversions between ferry's structs and their protobuf wire forms (internal).
#pragma once

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

void to_wire(const TransportInfo& in, wire::TransportInfo& out);
TransportInfo from_wire(const wire::TransportInfo& in);
void to_wire(const ObjectRef& in, wire::ObjectRef& out);
// False when the message is not a usable ref (bad dtype, size overflow, ...).
bool from_wire(const wire::ObjectRef& in, ObjectRef& out);

}  // namespace ferry
