// RdmaChannel: one peer's RC queue pair and completion queue (internal to the RDMA transport).
//
// Completions are event-driven: the completion channel's fd sits on the io_context; on wake-up
// the channel collects the events, acks them in batches, re-arms, then drains the CQ. A slow
// safety-net timer drains too while READs are in flight; busy_poll replaces the fd wait with a
// polling loop on the strand. When the send queue is full, READs wait in a queue.
//
// Fetcher side: a fetch waits for the owner's grant, then becomes READs straight into the
// target buffers (split at kReadChunk); the last completion resolves it and a release message
// ends the owner's lease. Owner side: a lease pins the object until the release, an abort, the
// lease timeout or the channel's end.
#pragma once

#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <deque>
#include <memory>
#include <unordered_map>
#include <vector>

#include "net/transport.h"
#include "rdma/device.h"
#include "rdma/proto/rdma.pb.h"

namespace ferry::rdma {

inline constexpr const char* kTransportName = "RDMA";

struct ChannelOptions {
  bool busy_poll = false;
  std::chrono::milliseconds lease_timeout{60000};
};

class RdmaChannel final : public TransportChannel,
                          public std::enable_shared_from_this<RdmaChannel> {
 public:
  RdmaChannel(std::shared_ptr<Device> device, Address address, std::shared_ptr<PeerLink> link,
              ChannelOptions options);
  ~RdmaChannel() override;

  // Creates the CQ (with its completion channel) and the QP, in INIT.
  std::error_code init();
  wire::QpInfo local_info() const;
  // RTR then RTS against the peer's QP, and starts watching the CQ. Strand.
  std::error_code connect(const wire::QpInfo& remote);

  Device& device() { return *device_; }

  // Fetcher side. Strand.
  void add_fetch(const FetchOp& op, std::vector<std::shared_ptr<Region>> regions);
  void on_grant(uint64_t request_id, const wire::Grant& grant);
  // True when nothing is in flight for it any more (see TransportManager::abort).
  bool abort_fetch(uint64_t request_id);

  // Owner side. Strand.
  void add_lease(uint64_t request_id, ObjectStore::Pin pin, SendDone done);
  // Ends a lease (release, abort, timeout); false if there was none.
  bool end_lease(uint64_t request_id, std::error_code ec);

  void close(std::error_code ec) override;
  // Fault injection: to the error state, then drain (flushed READs fail the channel). Any
  // thread: it runs on the strand.
  void post_inject_error();

 private:
  struct Read {
    uint64_t local;
    uint32_t lkey;
    uint64_t remote;
    uint32_t rkey;
    uint32_t length;
  };
  struct Fetch {
    FetchOp op;
    std::vector<std::shared_ptr<Region>> regions;  // per tensor; null for empty tensors
    std::deque<Read> reads;                        // not yet posted
    uint32_t posted = 0;                           // handed to the QP, not yet completed
    bool granted = false;
    bool aborted = false;
    std::error_code error;
  };
  struct Lease {
    ObjectStore::Pin pin;
    SendDone done;
    std::unique_ptr<boost::asio::steady_timer> timer;
  };

  void watch();
  void on_cq_event();
  void drain();
  void busy_loop();
  void arm_safety_net();
  void post_reads();
  void maybe_finish(uint64_t request_id);
  void send_release(uint64_t request_id);
  // A completion error or a failed post: the QP is unusable. Fails this channel's fetches and
  // leases and has the session drop it (the next fetch sets up a new one).
  void fail(std::error_code ec);
  void to_error_state();

  std::shared_ptr<Device> device_;
  Address address_;
  std::weak_ptr<PeerLink> link_;
  PeerStrand strand_;
  ChannelOptions options_;

  CompChannelHandle comp_channel_;
  CqHandle cq_;
  QpHandle qp_;
  boost::asio::posix::stream_descriptor cq_fd_;
  boost::asio::steady_timer safety_timer_;
  uint32_t psn_ = 0;
  uint32_t sq_depth_ = 0;
  uint32_t max_rd_ = 0;
  unsigned unacked_events_ = 0;
  bool connected_ = false;
  bool closed_ = false;
  bool busy_running_ = false;
  bool safety_armed_ = false;

  uint32_t in_flight_ = 0;
  std::deque<uint64_t> ready_;  // fetches with READs to post, served round-robin
  std::unordered_map<uint64_t, Fetch> fetches_;
  std::unordered_map<uint64_t, Lease> leases_;
};

}  // namespace ferry::rdma
