#include "ferry/store/object_store.h"

#include <algorithm>
#include <cstring>
#include <utility>

namespace ferry {

struct ObjectStore::State {
  struct Entry {
    std::shared_ptr<StoredObject> object;
    uint32_t local = 0;
    uint32_t pins = 0;
    std::unordered_map<HolderId, uint32_t> remote;

    // No one refers to it: only transfers under way keep it, and no new one starts.
    bool released() const { return local == 0 && remote.empty(); }
    bool collectable() const { return released() && pins == 0; }
  };

  mutable std::mutex mu;
  std::unordered_map<ObjectId, Entry> objects;
  ObjectId next_id = 1;
  uint64_t bytes = 0;
  GcHook hook;

  // Removes `id` if nothing holds it any more. Returns the object to collect, if any; the
  // caller runs the hook after dropping the lock.
  std::shared_ptr<StoredObject> take_if_collectable(ObjectId id) {
    auto it = objects.find(id);
    if (it == objects.end() || !it->second.collectable()) return nullptr;
    auto object = std::move(it->second.object);
    objects.erase(it);
    bytes -= object->total_bytes();
    return object;
  }

  void collect(std::shared_ptr<StoredObject> object) {
    if (!object) return;
    GcHook h;
    {
      std::lock_guard lock(mu);
      h = hook;
    }
    if (h) h(*object);
    // The object (and the memory its owner handle keeps) goes when the last shared_ptr does.
  }

  void unpin(ObjectId id) {
    std::shared_ptr<StoredObject> victim;
    {
      std::lock_guard lock(mu);
      auto it = objects.find(id);
      if (it == objects.end() || it->second.pins == 0) return;
      --it->second.pins;
      victim = take_if_collectable(id);
    }
    collect(std::move(victim));
  }
};

uint64_t StoredObject::total_bytes() const {
  uint64_t n = 0;
  for (const auto& t : tensors) n += t.data.size();
  return n;
}

ObjectStore::Pin::Pin(std::shared_ptr<State> state, std::shared_ptr<const StoredObject> object)
    : state_(std::move(state)), object_(std::move(object)) {}

ObjectStore::Pin::Pin(Pin&& other) noexcept
    : state_(std::move(other.state_)), object_(std::move(other.object_)) {}

ObjectStore::Pin& ObjectStore::Pin::operator=(Pin&& other) noexcept {
  if (this != &other) {
    reset();
    state_ = std::move(other.state_);
    object_ = std::move(other.object_);
  }
  return *this;
}

ObjectStore::Pin::~Pin() { reset(); }

void ObjectStore::Pin::reset() {
  if (state_ && object_) state_->unpin(object_->id);
  state_.reset();
  object_.reset();
}

ObjectStore::ObjectStore() : state_(std::make_shared<State>()) {}

ObjectStore::~ObjectStore() = default;

void ObjectStore::set_gc_hook(GcHook hook) {
  std::lock_guard lock(state_->mu);
  state_->hook = std::move(hook);
}

ObjectId ObjectStore::put(std::vector<Tensor> tensors, std::shared_ptr<void> owner,
                          std::string transport, std::string extension,
                          std::span<const std::byte> region) {
  auto object = std::make_shared<StoredObject>();
  object->tensors = std::move(tensors);
  object->owner = std::move(owner);
  object->transport = std::move(transport);
  object->extension = std::move(extension);
  object->region = region;
  std::lock_guard lock(state_->mu);
  object->id = state_->next_id++;
  state_->bytes += object->total_bytes();
  State::Entry entry;
  entry.object = object;
  entry.local = 1;
  state_->objects.emplace(object->id, std::move(entry));
  return object->id;
}

ObjectId ObjectStore::put_copy(const std::vector<Tensor>& tensors, std::string transport,
                               std::string extension) {
  // One allocation for all tensors, 64-byte aligned slots.
  std::vector<size_t> offsets;
  size_t cursor = 0;
  for (const auto& t : tensors) {
    offsets.push_back(cursor);
    cursor += (t.data.size() + 63) & ~size_t{63};
  }
  std::shared_ptr<std::byte[]> memory(new std::byte[std::max<size_t>(cursor, 1)]);
  std::vector<Tensor> copies;
  copies.reserve(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    std::byte* dst = memory.get() + offsets[i];
    if (!tensors[i].data.empty()) std::memcpy(dst, tensors[i].data.data(), tensors[i].data.size());
    copies.push_back(Tensor{{dst, tensors[i].data.size()}, tensors[i].meta});
  }
  std::span<const std::byte> region(memory.get(), std::max<size_t>(cursor, 1));
  return put(std::move(copies), std::move(memory), std::move(transport), std::move(extension),
             region);
}

bool ObjectStore::add_ref(ObjectId id) {
  std::lock_guard lock(state_->mu);
  auto it = state_->objects.find(id);
  if (it == state_->objects.end()) return false;
  ++it->second.local;
  return true;
}

bool ObjectStore::release(ObjectId id) {
  std::shared_ptr<StoredObject> victim;
  {
    std::lock_guard lock(state_->mu);
    auto it = state_->objects.find(id);
    if (it == state_->objects.end() || it->second.local == 0) return false;
    --it->second.local;
    victim = state_->take_if_collectable(id);
  }
  state_->collect(std::move(victim));
  return true;
}

bool ObjectStore::add_remote_ref(ObjectId id, HolderId holder) {
  std::lock_guard lock(state_->mu);
  auto it = state_->objects.find(id);
  if (it == state_->objects.end()) return false;
  ++it->second.remote[holder];
  return true;
}

bool ObjectStore::release_remote_ref(ObjectId id, HolderId holder) {
  std::shared_ptr<StoredObject> victim;
  {
    std::lock_guard lock(state_->mu);
    auto it = state_->objects.find(id);
    if (it == state_->objects.end()) return false;
    auto h = it->second.remote.find(holder);
    if (h == it->second.remote.end()) return false;
    if (--h->second == 0) it->second.remote.erase(h);
    victim = state_->take_if_collectable(id);
  }
  state_->collect(std::move(victim));
  return true;
}

size_t ObjectStore::release_holder(HolderId holder) {
  std::vector<std::shared_ptr<StoredObject>> victims;
  size_t dropped = 0;
  {
    std::lock_guard lock(state_->mu);
    std::vector<ObjectId> touched;
    for (auto& [id, entry] : state_->objects) {
      auto h = entry.remote.find(holder);
      if (h == entry.remote.end()) continue;
      dropped += h->second;
      entry.remote.erase(h);
      touched.push_back(id);
    }
    for (ObjectId id : touched) {
      if (auto v = state_->take_if_collectable(id)) victims.push_back(std::move(v));
    }
  }
  for (auto& v : victims) state_->collect(std::move(v));
  return dropped;
}

ObjectStore::Pin ObjectStore::pin(ObjectId id) {
  std::lock_guard lock(state_->mu);
  auto it = state_->objects.find(id);
  if (it == state_->objects.end() || it->second.released()) return Pin{};
  ++it->second.pins;
  return Pin(state_, it->second.object);
}

void ObjectStore::served_over(ObjectId id, const std::string& transport) {
  std::lock_guard lock(state_->mu);
  auto it = state_->objects.find(id);
  if (it == state_->objects.end()) return;
  auto& object = *it->second.object;
  if (object.transport.empty() || object.transport == transport) return;
  auto& over = object.served_over;
  if (std::find(over.begin(), over.end(), transport) == over.end()) over.push_back(transport);
}

bool ObjectStore::set_extension(ObjectId id, std::string extension) {
  std::lock_guard lock(state_->mu);
  auto it = state_->objects.find(id);
  if (it == state_->objects.end()) return false;
  it->second.object->extension = std::move(extension);
  return true;
}

bool ObjectStore::set_serve_hooks(ObjectId id, std::function<void()> on_sent,
                                  std::function<void()> on_served) {
  std::lock_guard lock(state_->mu);
  auto it = state_->objects.find(id);
  if (it == state_->objects.end()) return false;
  it->second.object->on_sent = std::move(on_sent);
  it->second.object->on_served = std::move(on_served);
  return true;
}

bool ObjectStore::set_exclusive(ObjectId id) {
  std::lock_guard lock(state_->mu);
  auto it = state_->objects.find(id);
  if (it == state_->objects.end()) return false;
  it->second.object->exclusive = true;
  return true;
}

std::shared_ptr<const StoredObject> ObjectStore::find(ObjectId id) const {
  std::lock_guard lock(state_->mu);
  auto it = state_->objects.find(id);
  return it == state_->objects.end() ? nullptr : it->second.object;
}

std::optional<ObjectStore::Counts> ObjectStore::counts(ObjectId id) const {
  std::lock_guard lock(state_->mu);
  auto it = state_->objects.find(id);
  if (it == state_->objects.end()) return std::nullopt;
  Counts c;
  c.local = it->second.local;
  c.pins = it->second.pins;
  for (const auto& [holder, n] : it->second.remote) c.remote += n;
  return c;
}

std::vector<ObjectId> ObjectStore::ids() const {
  std::lock_guard lock(state_->mu);
  std::vector<ObjectId> out;
  out.reserve(state_->objects.size());
  for (const auto& [id, entry] : state_->objects) out.push_back(id);
  std::sort(out.begin(), out.end());
  return out;
}

size_t ObjectStore::size() const {
  std::lock_guard lock(state_->mu);
  return state_->objects.size();
}

uint64_t ObjectStore::bytes() const {
  std::lock_guard lock(state_->mu);
  return state_->bytes;
}

}  // namespace ferry
