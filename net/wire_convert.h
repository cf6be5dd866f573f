// Conversions between ferry's structs and their protobuf wire forms (internal).
#pragma once

#include "net/object_ref.h"
#include "net/proto/ferry.pb.h"
#include "net/transport.h"

namespace ferry {

void to_wire(const TransportInfo& in, wire::TransportInfo& out);
TransportInfo from_wire(const wire::TransportInfo& in);
void to_wire(const ObjectRef& in, wire::ObjectRef& out);
// False when the message is not a usable ref (bad dtype, size overflow, ...).
bool from_wire(const wire::ObjectRef& in, ObjectRef& out);

}  // namespace ferry
