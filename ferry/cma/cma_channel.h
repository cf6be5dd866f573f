// CmaChannel: one peer's CMA state (internal to the CMA transport).
//
// Fetcher side: a fetch waits for the owner's grant (the address and length of each tensor, and
// where the grant's lease word is), copies the tensors into its targets with process_vm_readv, a
// step per turn of the strand, then reads the lease word: only when it still holds the grant's
// token is the fetch complete, so bytes copied after an owner let the object go (an abort, the
// lease timeout, the channel's end) are never reported as the object's. The release that follows
// needs no answer. Owner side: a lease pins the object from the grant until the release, an
// abort, the lease timeout or the channel's end, and clears its word before unpinning.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string_view>
#include <vector>

#include "ferry/cma/cma_transport.h"
#include "ferry/cma/copier.h"
#include "ferry/cma/lease_board.h"
#include "ferry/cma/proto/cma.pb.h"
#include "ferry/net/core/guard.h"
#include "ferry/net/transport.h"

namespace ferry::cma {

struct CmaTransport::Counters {
  std::atomic<uint64_t> bytes{0};    // copied into targets
  std::atomic<uint64_t> fetches{0};  // completed, the lease word confirming the copy
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
    std::shared_ptr<LeaseBoard> board;  // the owner side's lease words
    std::shared_ptr<CmaTransport::Counters> counters;
  };
  // `peer_pid`: the process to read from.
  CmaChannel(std::shared_ptr<PeerLink> link, pid_t peer_pid, Config config);

  // TransportChannel, on the strand. fetch_multiple waits for the owner's grant; send_multiple
  // grants (pins the object and sends its addresses); abort ends a fetch or a lease; on_message
  // takes grants and releases.
  Result<FetchRequest> fetch_multiple(const FetchOp& op) override;
  void send_multiple(uint64_t request_id, ObjectStore::Pin object, SendDone done) override;
  bool abort(uint64_t request_id) override;
  bool on_message(uint64_t request_id, std::string_view payload) override;
  void close(std::error_code ec) override;
  // The callback guard's: fails the session (and this channel with it) with resource_exhausted.
  void out_of_memory();

 private:
  struct Copy {
    FetchOp op;
    std::vector<uint64_t> addrs;  // in the owner, one per target
    uint64_t lease = 0;           // the lease word's address in the owner
    uint64_t token = 0;           // what it holds while the grant does
    size_t tensor = 0;            // the target being copied
    uint64_t done = 0;            // bytes of it copied
  };
  struct Lease {
    ObjectStore::Pin pin;
    SendDone done;
    LeaseBoard::Slot slot;  // none when the grant carried the bytes
    std::chrono::steady_clock::time_point granted;
  };

  void on_grant(uint64_t request_id, const wire::Grant& grant);
  // Copies one step of `request_id` and posts the next; at the end checks the lease word,
  // completes the fetch and sends the release.
  void copy_step(uint64_t request_id);
  // Fetcher: the copy is done: completes it when the word at `lease` in the owner still holds
  // `token` (the grant held throughout), and releases.
  void confirm(uint64_t request_id, uint64_t lease, uint64_t token);
  // Owner: the fetcher's release (true: it copied every byte).
  void on_release(uint64_t request_id, bool copied);
  // Owner: clears the lease's word, then unpins the object and reports `ec` to the session.
  void end_lease(std::map<uint64_t, Lease>::iterator it, std::error_code ec);
  // Fetcher: a grant that carries the bytes: copies them and releases.
  void take_bytes(uint64_t request_id, const FetchOp& op, const wire::Grant& grant);
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
  std::map<uint64_t, Lease> leases_;     // owner side
};

}  // namespace ferry::cma
