// ObjectStore: the owner-side table of objects that peers may fetch.
//
// An object is a list of tensors whose bytes the store keeps alive (through an owner handle or
// a copy it made) until garbage collection. An object is collected exactly once, when all of the
// following are zero: local references (put() gives one), remote references (held by peers,
// per holder) and pins (in-flight transfers). The store knows nothing about sockets or verbs.
//
// Thread model: every method may be called from any thread. The GC hook runs on the thread that
// dropped the last reference or pin, with no store lock held.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "ferry/store/tensor.h"

namespace ferry {

using ObjectId = uint64_t;
// Identifies a holder of remote references (a connected peer session).
using HolderId = uint64_t;

struct StoredObject {
  ObjectId id = 0;
  std::vector<Tensor> tensors;
  std::string transport;        // the transport that garbage-collects it
  bool exclusive = false;       // only `transport` may move it
  std::string extension;        // transport-defined metadata fields, opaque to the store
  std::shared_ptr<void> owner;  // keeps the tensors' memory alive until collection
  // The allocation the tensors live in, when known: a transport registers it once for all the
  // views inside.
  std::span<const std::byte> region;
  std::function<void()> on_sent;    // PutOptions::on_sent: after each serve this side ended well
  std::function<void()> on_served;  // PutOptions::on_served: after each successful serve

  uint64_t total_bytes() const;
};

class ObjectStore {
  struct State;

 public:
  // Runs exactly once per object, when it is collected; the object's memory is released when
  // the hook returns. Must not call back into the store for the same object.
  using GcHook = std::function<void(const StoredObject&)>;

  // Keeps an object from being collected while a transfer reads it. Move-only; releasing the
  // last pin of an object whose references are gone collects it.
  class Pin {
   public:
    Pin() = default;
    Pin(Pin&& other) noexcept;
    Pin& operator=(Pin&& other) noexcept;
    Pin(const Pin&) = delete;
    Pin& operator=(const Pin&) = delete;
    ~Pin();

    explicit operator bool() const { return object_ != nullptr; }
    const StoredObject& object() const { return *object_; }
    // Drops the pin now (idempotent).
    void reset();

   private:
    friend class ObjectStore;
    Pin(std::shared_ptr<State> state, std::shared_ptr<const StoredObject> object);
    std::shared_ptr<State> state_;
    std::shared_ptr<const StoredObject> object_;
  };

  struct Counts {
    uint32_t local = 0;
    uint32_t remote = 0;
    uint32_t pins = 0;
  };

  ObjectStore();
  ~ObjectStore();
  ObjectStore(const ObjectStore&) = delete;
  ObjectStore& operator=(const ObjectStore&) = delete;

  // Installs the hook that runs when objects are collected (replaces any earlier one).
  void set_gc_hook(GcHook hook);

  // Adds an object whose tensors point into memory that `owner` keeps alive (may be null when
  // the caller guarantees the memory outlives the object). Returns its id with one local reference.
  ObjectId put(std::vector<Tensor> tensors, std::shared_ptr<void> owner, std::string transport,
               std::string extension = {}, std::span<const std::byte> region = {});
  // Like put(), but copies the bytes into memory the store owns.
  ObjectId put_copy(const std::vector<Tensor>& tensors, std::string transport,
                    std::string extension = {});

  // Local references. Return false for an unknown (or already collected) id.
  bool add_ref(ObjectId id);
  bool release(ObjectId id);

  // Remote references, counted per holder so a peer that goes away can be dropped at once.
  bool add_remote_ref(ObjectId id, HolderId holder);
  bool release_remote_ref(ObjectId id, HolderId holder);
  // Drops every remote reference `holder` has; returns how many it had.
  size_t release_holder(HolderId holder);

  // Pins the object for a transfer; an empty Pin when the id is unknown.
  Pin pin(ObjectId id);

  // Sets the transport-defined metadata after put (for transports that learn it late).
  bool set_extension(ObjectId id, std::string extension);
  // Sets StoredObject::on_sent and on_served; before anyone can fetch the object (they are read
  // unlocked).
  bool set_serve_hooks(ObjectId id, std::function<void()> on_sent, std::function<void()> on_served);
  // Marks the object as movable only by its transport.
  bool set_exclusive(ObjectId id);

  std::shared_ptr<const StoredObject> find(ObjectId id) const;
  std::optional<Counts> counts(ObjectId id) const;
  std::vector<ObjectId> ids() const;
  size_t size() const;
  uint64_t bytes() const;

 private:
  std::shared_ptr<State> state_;
};

}  // namespace ferry
