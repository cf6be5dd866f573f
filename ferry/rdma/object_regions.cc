#include "ferry/rdma/object_regions.h"

namespace ferry::rdma {

Result<std::vector<std::shared_ptr<Region>>> ObjectRegions::acquire(Device& device,
                                                                    const StoredObject& object) {
  if (auto made = find(device, object)) return std::move(*made);
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
  std::lock_guard lock(mu_);
  // Another grant may have recorded them meanwhile: the cache gave both the same regions.
  auto& held = objects_[object.id][&device];
  if (held.empty()) held = regions;
  return held;
}

std::optional<std::vector<std::shared_ptr<Region>>> ObjectRegions::find(
    const Device& device, const StoredObject& object) {
  std::lock_guard lock(mu_);
  auto it = objects_.find(object.id);
  if (it == objects_.end()) return std::nullopt;
  auto per_device = it->second.find(&device);
  if (per_device == it->second.end()) return std::nullopt;
  return per_device->second;
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
