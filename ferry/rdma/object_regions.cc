#include "ferry/rdma/object_regions.h"

namespace ferry::rdma {

Result<std::vector<std::shared_ptr<Region>>> ObjectRegions::acquire(Device& device,
                                                                    const StoredObject& object) {
  std::lock_guard lock(mu_);
  auto& per_device = objects_[object.id];
  auto it = per_device.find(&device);
  if (it != per_device.end()) return it->second;
  std::vector<std::shared_ptr<Region>> regions;
  for (const auto& t : object.tensors) {
    if (t.data.empty()) {
      regions.push_back(nullptr);
      continue;
    }
    auto region = device.remote_cache().acquire(t.data.data(), t.data.size(), object.region);
    if (!region) return region.error();
    regions.push_back(std::move(region.value()));
  }
  per_device[&device] = regions;
  return regions;
}

void ObjectRegions::release(ObjectId object) {
  std::map<const Device*, std::vector<std::shared_ptr<Region>>> regions;
  {
    std::lock_guard lock(mu_);
    auto it = objects_.find(object);
    if (it == objects_.end()) return;
    regions = std::move(it->second);
    objects_.erase(it);
  }
  // Dropped here, outside the lock: the last reference to a region deregisters it.
}

}  // namespace ferry::rdma
