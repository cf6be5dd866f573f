// ShmTransport: a complete user-written ferry transport that moves tensors between processes on
// one host through POSIX shared memory. It uses only ferry's installed public headers.
//
// One-sided: at an object's first grant the owner copies it into a shared-memory segment
// (once: "registration"); every fetcher then maps the segment and copies the tensors out on
// its own, without the owner's CPU. A grant is a lease: the owner keeps the object pinned until
// the fetcher's release. garbage_collect() unlinks the segment.
// See docs/custom-transport.md for the walk-through.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>

#include <boost/asio/steady_timer.hpp>

#include "ferry/ferry.h"

namespace shm_example {

inline constexpr const char* kName = "SHM";

class ShmTransport final : public ferry::TransportManager {
 public:
  explicit ShmTransport(const ferry::TransportEnv& env);
  ~ShmTransport() override;  // unlinks every segment it created

  // [identity]
  std::string name() const override { return kName; }
  bool is_one_sided() const override { return true; }
  bool can_abort() const override { return true; }
  ferry::TransportInfo local_info() const override;
  bool peer_has_transport(const ferry::PeerInfo& peer) const override;
  // [identity]

  void async_open_channel(std::shared_ptr<ferry::PeerLink> link,
                          ferry::ChannelOpenHandler done) override;
  ferry::Result<ferry::FetchRequest> fetch_multiple(ferry::PeerLink& link,
                                                    const ferry::FetchOp& op) override;
  void send_multiple(ferry::PeerLink& link, uint64_t request_id, ferry::ObjectStore::Pin object,
                     ferry::SendDone done) override;
  bool abort(ferry::PeerLink& link, uint64_t request_id) override;
  void garbage_collect(const ferry::StoredObject& object) override;
  void on_transport_message(ferry::PeerLink& link, uint64_t request_id,
                            std::string_view payload) override;

  // Segments this process created and has not unlinked yet.
  size_t live_segments() const;

 private:
  std::string ensure_segment(const ferry::StoredObject& object, std::error_code& ec);

  std::string host_id_;
  std::chrono::milliseconds open_timeout_;
  mutable std::mutex mu_;
  std::map<ferry::ObjectId, std::string> segments_;  // object -> segment name
  struct Opening {
    ferry::ChannelOpenHandler done;
    std::shared_ptr<boost::asio::steady_timer> timer;  // bounds the wait for the answer
  };
  std::map<const ferry::PeerLink*, Opening> opening_;
};

// Registers "SHM" (devices {"cpu"}) with ferry's registry. Idempotent.
bool register_shm_transport();

// Unlinks segments left behind by owners that died without cleaning up (their pid is gone).
// Returns how many it removed.
size_t remove_orphaned_segments();

}  // namespace shm_example
