/// @file
/// ObjectRef: the small, serializable handle to an object in some process's store.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/net/result.h"
#include "ferry/store/object_store.h"
#include "ferry/store/tensor.h"

namespace ferry {

/// Per-object metadata carried in refs and over the wire. A transport extends it with its own
/// fields in `extension` (bytes it defines and parses, e.g. a serialized protobuf of its own).
struct TransportMetadata {
  /// the object's tensors, in order: what a fetch's targets must match
  std::vector<TensorMeta> tensors;
  std::string transport;   ///< the transport the owner put the object for ("" = any)
  std::string extension;   ///< transport-defined bytes (TransportManager::extract_metadata), opaque
                           ///< to the core
  bool exclusive = false;  ///< only `transport` may move it (otherwise it is a preference)

  /// The sum of the tensors' nbytes.
  uint64_t total_bytes() const;
  /// Field by field.
  bool operator==(const TransportMetadata&) const = default;
};

/// The small, serializable handle to an object in some process's store: who owns it, which object,
/// and what it holds. put() makes one; any process can send it on (serialize(), to_string()) and
/// fetch the object with it (Peer::fetch). A plain value: copy it freely, from any thread. It does
/// not keep the object alive: the owner's references do (Context::release, Peer::hold).
struct ObjectRef {
  std::string owner;            ///< host:port of the owner's listener
  ObjectId object_id = 0;       ///< the owner's id of the object; 0 for a named ref
  uint64_t owner_instance = 0;  ///< changes when the owner restarts: stale refs are detected
  TransportMetadata metadata;   ///< the tensors' descriptions and the transport preference
  /// Named refs (object_id 0) stand for an object the owner puts under this name
  /// (PutOptions::name), possibly later: a fetch of one waits on the owner until it exists.
  std::string name;

  /// A ref to the object `owner` puts (or will put) under `name`, with these tensors.
  static ObjectRef named(std::string owner, std::string name, std::vector<TensorMeta> tensors);

  /// Binary form (protobuf). parse() rejects anything that is not a well-formed ref.
  std::string serialize() const;
  /// The ref serialize() made. errc::invalid_argument for anything that is not a well-formed ref
  /// (an unknown dtype, an implausible size, neither id nor name).
  static Result<ObjectRef> parse(std::string_view bytes);
  /// Text form for command lines and logs: "ferry1:" + base64url(serialize()).
  std::string to_string() const;
  /// The ref to_string() made. errc::invalid_argument without the "ferry1:" prefix, for text that
  /// is not base64url, or as parse().
  static Result<ObjectRef> from_string(std::string_view text);

  /// Field by field: the same object on the same owner instance, with the same metadata.
  bool operator==(const ObjectRef&) const = default;
};

}  // namespace ferry
