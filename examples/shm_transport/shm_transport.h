// ShmTransport: a complete user-written ferry transport that moves tensors between processes on
// one host through POSIX shared memory. It uses only ferry's installed public headers.
//
// One-sided: at an object's first grant the owner copies it into a shared-memory segment
// (once: "registration"); every fetcher then maps the segment and copies the tensors out on
// its own, without the owner's CPU. A grant is a lease: the owner keeps the object pinned until
// the fetcher's release. garbage_collect() unlinks the segment.
//
// Two halves, as ferry's interface has them: ShmTransport, one per Context (identity, opening
// channels, the segments), and ShmChannel, one per peer (fetches, grants, leases, aborts).
// See docs/custom-transport.md for the walk-through.
#pragma once

#include <cstddef>
#include <cstdint>
#include <istream>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include <boost/asio/steady_timer.hpp>

#include "ferry/ferry.h"

namespace shm_example {

inline constexpr const char* kName = "SHM";

// [options]
// SHM's own options. An application sets them in its ContextOptions, under the transport's name:
//   options.transport_options_for<shm_example::ShmOptions>(shm_example::kName).copy_step = ...;
// ferry hands them to the factory (register_shm_transport) and never looks inside.
struct ShmOptions {
  // Bytes a fetch copies per turn of the peer's strand: an abort gets a say between steps, and
  // the peer's other work waits at most one step. 0: the default.
  size_t copy_step = 8u << 20;

  // The defaults with what the environment sets: copy_step from $SHM_COPY_STEP (bytes).
  // ContextOptions::from_environment() calls it once SHM is registered.
  static ShmOptions from_environment();
};
// [options]

// The segments this process created, one per object granted over SHM: shared by the transport
// (which unlinks them) and its channels (which make them at a first grant). Thread-safe.
class Segments {
 public:
  Segments() = default;
  Segments(const Segments&) = delete;
  Segments& operator=(const Segments&) = delete;
  ~Segments();  // unlinks every segment still here

  // The name of `object`'s segment, made now (the tensors copied in) if it has none; "" with
  // `ec` set when it cannot be made.
  std::string ensure(const ferry::StoredObject& object, std::error_code& ec);
  // Unlinks `object`'s segment, if it has one.
  void remove(ferry::ObjectId object);
  // Segments made and not unlinked yet.
  size_t size() const;

 private:
  mutable std::mutex mu_;
  std::map<ferry::ObjectId, std::string> names_;  // object -> segment name
};

// [channel]
// One peer's SHM state: fetches waiting for a grant, fetches copying, the leases this side
// granted. Everything runs on the peer's strand, so it needs no lock.
class ShmChannel final : public ferry::TransportChannel,
                         public std::enable_shared_from_this<ShmChannel> {
 public:
  ShmChannel(std::shared_ptr<ferry::PeerLink> link, std::shared_ptr<Segments> segments,
             size_t copy_step)
      : link_(std::move(link)), segments_(std::move(segments)), copy_step_(copy_step) {}

  ferry::Result<ferry::FetchRequest> fetch_multiple(const ferry::FetchOp& op) override;
  void send_multiple(uint64_t request_id, ferry::ObjectStore::Pin object,
                     ferry::SendDone done) override;
  bool abort(uint64_t request_id) override;
  bool on_message(uint64_t request_id, std::string_view payload) override;
  void close(std::error_code ec) override;

 private:
  struct Copy {
    ferry::FetchOp op;
    const std::byte* base = nullptr;  // the mapped segment
    size_t mapped = 0;
    std::vector<uint64_t> offsets;  // of each tensor in the segment
    size_t tensor = 0;
    uint64_t done = 0;  // bytes of `tensor` copied
  };

  void on_grant(uint64_t request_id, std::istream& in);
  void copy_step(uint64_t request_id);  // copies one step, posts the next
  void send(uint64_t request_id, const std::string& message);

  std::weak_ptr<ferry::PeerLink> link_;
  std::shared_ptr<Segments> segments_;
  size_t copy_step_;                            // ShmOptions::copy_step
  std::map<uint64_t, ferry::FetchOp> waiting_;  // fetches waiting for their grant
  std::map<uint64_t, Copy> copying_;            // fetches copying out of a segment
  std::map<uint64_t, std::pair<ferry::ObjectStore::Pin, ferry::SendDone>> leases_;  // owner side
};
// [channel]

// The per-process half: what SHM is, and the opening of channels.
class ShmTransport final : public ferry::TransportManager {
 public:
  ShmTransport(const ferry::TransportEnv& env, const ShmOptions& options);

  // [identity]
  std::string name() const override { return kName; }
  bool is_one_sided() const override { return true; }
  bool can_abort() const override { return true; }
  bool reaches_other_hosts() const override { return false; }  // one host's memory only
  ferry::TransportInfo local_info() const override;
  bool peer_has_transport(const ferry::PeerInfo& peer) const override;
  // [identity]

  void async_open_channel(std::shared_ptr<ferry::PeerLink> link,
                          ferry::ChannelOpenHandler done) override;
  void on_transport_message(ferry::PeerLink& link, uint64_t request_id,
                            std::string_view payload) override;
  void garbage_collect(const ferry::StoredObject& object) override;

  // Segments this process created and has not unlinked yet.
  size_t live_segments() const { return segments_->size(); }

 private:
  std::string host_id_;
  std::chrono::milliseconds open_timeout_;
  size_t copy_step_;  // ShmOptions::copy_step, for the channels
  std::shared_ptr<Segments> segments_ = std::make_shared<Segments>();
  std::mutex mu_;
  struct Opening {
    ferry::ChannelOpenHandler done;
    std::shared_ptr<boost::asio::steady_timer> timer;  // bounds the wait for the answer
  };
  std::map<const ferry::PeerLink*, Opening> opening_;
};

// Registers "SHM" (devices {"cpu"}) with ferry's registry, with its options. Idempotent.
bool register_shm_transport();

// Unlinks segments left behind by owners that died without cleaning up (their pid is gone).
// Returns how many it removed.
size_t remove_orphaned_segments();

}  // namespace shm_example
