// ObjectRef: the small, serializable handle to an object in some process's store.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/net/result.h"
#include "ferry/store/object_store.h"
#include "ferry/store/tensor.h"

namespace ferry {

// Per-object metadata carried in refs and over the wire. A transport extends it with its own
// fields in `extension` (bytes it defines and parses, e.g. a serialized protobuf of its own).
struct TransportMetadata {
  std::vector<TensorMeta> tensors;
  std::string transport;  // the transport the owner put the object for ("" = any)
  std::string extension;
  bool exclusive = false;  // only `transport` may move it (otherwise it is a preference)

  uint64_t total_bytes() const;
  bool operator==(const TransportMetadata&) const = default;
};

struct ObjectRef {
  std::string owner;  // host:port of the owner's listener
  ObjectId object_id = 0;
  uint64_t owner_instance = 0;  // changes when the owner restarts: stale refs are detected
  TransportMetadata metadata;
  // Named refs (object_id 0) stand for an object the owner puts under this name
  // (PutOptions::name), possibly later: a fetch of one waits on the owner until it exists.
  std::string name;

  // A ref to the object `owner` puts (or will put) under `name`, with these tensors.
  static ObjectRef named(std::string owner, std::string name, std::vector<TensorMeta> tensors);

  // Binary form (protobuf). parse() rejects anything that is not a well-formed ref.
  std::string serialize() const;
  static Result<ObjectRef> parse(std::string_view bytes);
  // Text form for command lines and logs: "ferry1:" + base64url(serialize()).
  std::string to_string() const;
  static Result<ObjectRef> from_string(std::string_view text);

  bool operator==(const ObjectRef&) const = default;
};

}  // namespace ferry
