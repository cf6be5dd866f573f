// ObjectRegions: the owner's registrations of each object's tensors, per device (internal to the
// RDMA transport). With region grants (RdmaGrants::regions, and windows bound to them) an
// object's tensors are registered at its first grant on a device and stay registered until the
// store collects the object. The transport and its channels share one table: a channel looks
// regions up when it grants, the transport releases them in garbage_collect(). Thread-safe.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <vector>

#include "ferry/net/result.h"
#include "ferry/rdma/device.h"
#include "ferry/store/object_store.h"

namespace ferry::rdma {

class ObjectRegions {
 public:
  // The registrations of `object`'s tensors on `device` (null for empty tensors), made now if
  // this is the object's first grant there. device_error when a registration fails. The caller
  // pins the object meanwhile (so it is not collected before its registrations are recorded).
  // Registers without the table's lock: a registrar thread (ferry/rdma/registrar.h).
  Result<std::vector<std::shared_ptr<Region>>> acquire(Device& device, const StoredObject& object);
  // Those registrations if they are made already, else nullopt. Registers nothing: cheap enough
  // for an io thread.
  std::optional<std::vector<std::shared_ptr<Region>>> find(const Device& device,
                                                           const StoredObject& object);
  // Forgets `object`'s registrations; the last reference to each deregisters it (outside the
  // table's lock), before the store releases the memory. Unknown objects are ignored.
  void release(ObjectId object);

 private:
  std::mutex mu_;
  std::unordered_map<ObjectId, std::map<const Device*, std::vector<std::shared_ptr<Region>>>>
      objects_;
};

}  // namespace ferry::rdma
