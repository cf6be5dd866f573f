/// @file
/// ObjectStore: the owner-side table of objects that peers may fetch.
///
/// An object is a list of tensors whose bytes the store keeps alive (through an owner handle or
/// a copy it made) until garbage collection. An object is collected exactly once, when all of the
/// following are zero: local references (put() gives one), remote references (held by peers,
/// per holder) and pins (in-flight transfers). The store knows nothing about sockets or verbs.
///
/// Thread model: every method may be called from any thread. The GC hook runs on the thread that
/// dropped the last reference or pin, with no store lock held.
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

/// A store's id of an object: assigned by put(), from 1, never reused within a store; 0 is no
/// object.
using ObjectId = uint64_t;
/// Identifies a holder of remote references (a connected peer session).
using HolderId = uint64_t;

/// An object as the store holds it: immutable once put (but for the setters of ObjectStore, used
/// before anyone can fetch it), shared with transfers through Pins and with the GC hook.
struct StoredObject {
  ObjectId id = 0;              ///< its id in the store
  std::vector<Tensor> tensors;  ///< views of its bytes, in order
  std::string transport;        ///< the transport that garbage-collects it ("": every one)
  /// Other transports that served it (a fetcher's fallback when it is not exclusive): their
  /// garbage_collect runs too, since they may hold registrations of its memory. Set under the
  /// store's lock (ObjectStore::served_over); read by the collection hook.
  std::vector<std::string> served_over;
  bool exclusive = false;       ///< only `transport` may move it
  std::string extension;        ///< transport-defined metadata fields, opaque to the store
  std::shared_ptr<void> owner;  ///< keeps the tensors' memory alive until collection
  /// The allocation the tensors live in, when known: a transport registers it once for all the
  /// views inside.
  std::span<const std::byte> region;
  std::function<void()> on_sent;    ///< PutOptions::on_sent: after each serve this side ended well
  std::function<void()> on_served;  ///< PutOptions::on_served: after each successful serve

  /// The sum of the tensors' sizes in bytes.
  uint64_t total_bytes() const;
};

/// The owner-side table of objects that peers may fetch (see this file's comment for the reference
/// counting and thread model). Each Context has one (Context::store()). Pins share its state, so
/// they may outlive it.
class ObjectStore {
  struct State;

 public:
  /// Runs exactly once per object, when it is collected; the object's memory is released when
  /// the hook returns. Must not call back into the store for the same object.
  using GcHook = std::function<void(const StoredObject&)>;

  /// Keeps an object from being collected while a transfer reads it. Move-only; releasing the
  /// last pin of an object whose references are gone collects it.
  class Pin {
   public:
    Pin() = default;
    /// Takes over `other`'s pin; `other` is left empty.
    Pin(Pin&& other) noexcept;
    /// Drops this pin (as reset()), then takes over `other`'s; `other` is left empty.
    Pin& operator=(Pin&& other) noexcept;
    Pin(const Pin&) = delete;
    Pin& operator=(const Pin&) = delete;
    ~Pin();

    /// Whether it pins an object (false when empty, moved from or reset).
    explicit operator bool() const { return object_ != nullptr; }
    /// The pinned object; only while the Pin is non-empty.
    const StoredObject& object() const { return *object_; }
    /// Drops the pin now (idempotent).
    void reset();

   private:
    friend class ObjectStore;
    Pin(std::shared_ptr<State> state, std::shared_ptr<const StoredObject> object);
    std::shared_ptr<State> state_;
    std::shared_ptr<const StoredObject> object_;
  };

  /// What holds an object (counts()): it is collected when all three are zero.
  struct Counts {
    uint32_t local = 0;   ///< local references (put() gives one; add_ref, release)
    uint32_t remote = 0;  ///< remote references, summed over the holders
    uint32_t pins = 0;    ///< transfers reading it now
  };

  ObjectStore();
  ~ObjectStore();
  ObjectStore(const ObjectStore&) = delete;
  ObjectStore& operator=(const ObjectStore&) = delete;

  /// Installs the hook that runs when objects are collected (replaces any earlier one).
  void set_gc_hook(GcHook hook);

  /// Adds an object whose tensors point into memory that `owner` keeps alive (may be null when
  /// the caller guarantees the memory outlives the object). Returns its id with one local
  /// reference.
  ObjectId put(std::vector<Tensor> tensors, std::shared_ptr<void> owner, std::string transport,
               std::string extension = {}, std::span<const std::byte> region = {});
  /// Like put(), but copies the bytes into memory the store owns.
  ObjectId put_copy(const std::vector<Tensor>& tensors, std::string transport,
                    std::string extension = {});

  /// Local references. Return false for an unknown (or already collected) id.
  bool add_ref(ObjectId id);
  /// Drops one local reference; false for an unknown id or one with no local reference left.
  /// Collects the object on this thread (the GC hook runs) when nothing else holds it.
  bool release(ObjectId id);

  /// Remote references, counted per holder so a peer that goes away can be dropped at once.
  bool add_remote_ref(ObjectId id, HolderId holder);
  /// Drops one of `holder`'s remote references; false when `holder` has none on `id` (or `id` is
  /// unknown). Collects as release().
  bool release_remote_ref(ObjectId id, HolderId holder);
  /// Drops every remote reference `holder` has; returns how many it had.
  size_t release_holder(HolderId holder);

  /// Pins the object for a transfer; an empty Pin when the id is unknown, or when no local or
  /// remote reference is left (the object waits only for the transfers that pin it: a released
  /// object is not served anew, so a release followed by an abort of its serves leaves no window).
  Pin pin(ObjectId id);

  /// Sets the transport-defined metadata after put (for transports that learn it late).
  bool set_extension(ObjectId id, std::string extension);
  /// Notes that `transport` serves object `id`: unless it is the object's own transport (or the
  /// object has none: every transport collects it), it joins StoredObject::served_over. Call with
  /// the object pinned. Any thread.
  void served_over(ObjectId id, const std::string& transport);
  /// Sets StoredObject::on_sent and on_served; before anyone can fetch the object (they are read
  /// unlocked).
  bool set_serve_hooks(ObjectId id, std::function<void()> on_sent, std::function<void()> on_served);
  /// Marks the object as movable only by its transport.
  bool set_exclusive(ObjectId id);

  /// The object, or null for an unknown (or collected) id. Holding the pointer keeps the object's
  /// description, not its collection from happening: pin() for a transfer.
  std::shared_ptr<const StoredObject> find(ObjectId id) const;
  /// What holds the object now; nullopt for an unknown (or collected) id.
  std::optional<Counts> counts(ObjectId id) const;
  /// The ids of every object in the store, ascending.
  std::vector<ObjectId> ids() const;
  /// How many objects the store holds.
  size_t size() const;
  /// The sum of their total_bytes().
  uint64_t bytes() const;

 private:
  std::shared_ptr<State> state_;
};

}  // namespace ferry
