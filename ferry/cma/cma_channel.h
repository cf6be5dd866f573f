// CmaChannel: one peer's CMA state (internal to the CMA transport).
//
// Fetcher side: a fetch waits for the owner's grant (the address and length of each tensor),
// then copies them into its targets with process_vm_readv, a step per turn of the strand, and
// sends a release; the owner answers whether its lease still held the object, and only then is
// the fetch complete: bytes copied after an owner let the object go (an abort, the lease
// timeout, the channel's end) are never reported as the object's. Owner side: a lease pins the
// object from the grant until the release, an abort, the lease timeout or the channel's end.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string_view>
#include <vector>

#include "ferry/cma/cma_transport.h"
#include "ferry/cma/copier.h"
#include "ferry/cma/proto/cma.pb.h"
#include "ferry/net/core/guard.h"
#include "ferry/net/transport.h"

namespace ferry::cma {

struct CmaTransport::Counters {
  std::atomic<uint64_t> bytes{0};    // copied into targets
  std::atomic<uint64_t> fetches{0};  // completed with every byte confirmed
  std::atomic<uint64_t> refused{0};  // channels not opened: the kernel refused the probe read
};

class CmaChannel final : public TransportChannel, public StrandGuarded<CmaChannel, PeerStrand> {
 public:
  // What a channel is configured with (from CmaOptions) and shares with the transport.
  struct Config {
    size_t copy_step = 0;                            // bytes per step
    size_t inline_bytes = 0;                         // objects up to this size travel in the grant
    std::chrono::milliseconds lease_timeout{60000};  // ContextOptions::lease_timeout
    std::shared_ptr<Copier> copier;
    std::shared_ptr<CmaTransport::Counters> counters;
  };
  // `peer_pid`: the process to read from.
  CmaChannel(std::shared_ptr<PeerLink> link, pid_t peer_pid, Config config);

  // TransportChannel, on the strand. fetch_multiple waits for the owner's grant; send_multiple
  // grants (pins the object and sends its addresses); abort ends a fetch or a lease; on_message
  // takes grants, releases and their answers.
  Result<FetchRequest> fetch_multiple(const FetchOp& op) override;
  void send_multiple(uint64_t request_id, ObjectStore::Pin object, SendDone done) override;
  bool abort(uint64_t request_id) override;
  bool on_message(uint64_t request_id, std::string_view payload) override;
  void close(std::error_code ec) override;

 private:
  struct Copy {
    FetchOp op;
    std::vector<uint64_t> addrs;  // in the owner, one per target
    size_t tensor = 0;            // the target being copied
    uint64_t done = 0;            // bytes of it copied
  };
  struct Lease {
    ObjectStore::Pin pin;
    SendDone done;
    bool with_bytes = false;  // the grant carried the bytes: the release needs no answer
    std::chrono::steady_clock::time_point granted;
  };

  void on_grant(uint64_t request_id, const wire::Grant& grant);
  // Copies one step of `request_id` and posts the next; at the end sends the release.
  void copy_step(uint64_t request_id);
  // Owner: the fetcher's release; answers release(true) with whether the lease held.
  void on_release(uint64_t request_id, bool copied);
  // Fetcher: a grant that carries the bytes: copies them and releases.
  void take_bytes(uint64_t request_id, const FetchOp& op, const wire::Grant& grant);
  // Fetcher: the owner's answer to our release(true).
  void on_kept(uint64_t request_id, bool kept);
  // Owner: ends the leases older than the lease timeout (timed_out) and waits for the next.
  void arm_lease_timer();
  void expire_leases();
  void send(uint64_t request_id, const wire::Message& m);
  void send_release(uint64_t request_id, bool copied);
  void complete(uint64_t request_id, std::error_code ec);

  std::weak_ptr<PeerLink> link_;
  pid_t peer_pid_;
  Config config_;
  boost::asio::steady_timer lease_timer_;
  bool lease_timer_armed_ = false;
  std::map<uint64_t, FetchOp> waiting_;  // fetches waiting for their grant
  std::map<uint64_t, Copy> copying_;     // fetches copying
  std::set<uint64_t> confirming_;        // copied, waiting for the owner's answer
  std::map<uint64_t, Lease> leases_;     // owner side
};

}  // namespace ferry::cma
