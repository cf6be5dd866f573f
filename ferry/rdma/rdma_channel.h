// RdmaChannel: one peer's RC queue pair and completion queue (internal to the RDMA transport).
//
// Completions are event-driven: the completion channel's fd sits on the io_context; on wake-up
// the channel collects the events, acks them in batches, re-arms, then drains the CQ. A slow
// safety-net timer drains too while READs are in flight; busy_poll replaces the fd wait with a
// polling loop on the strand.
//
// Fetcher side: a fetch waits for the owner's grant (and for its targets' registrations, when they
// miss the cache and are made on a registrar thread meanwhile), then becomes READs straight
// into the target buffers (split at kReadChunk), posted oldest fetch first within a bound on the
// bytes in flight (a fetch that one READ finishes goes ahead); the last completion resolves it
// and a release message ends the owner's lease. Owner side: a lease pins the object until the
// release, an abort, the lease timeout or the channel's end; memory the grant needs registered
// first is registered on a registrar thread, and the grant leaves once it is.
#pragma once

#include <atomic>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <vector>

#include "ferry/net/transport.h"
#include "ferry/rdma/device.h"
#include "ferry/rdma/object_regions.h"
#include "ferry/rdma/proto/rdma.pb.h"
#include "ferry/rdma/quiesce.h"
#include "ferry/rdma/rdma.h"
#include "ferry/rdma/registrar.h"

namespace ferry::rdma {

inline constexpr const char* kTransportName = "RDMA";

// Test hooks of one transport instance, shared with its channels.
struct Hooks {
  std::atomic<bool> armed{false};  // a tamper is set: the fetch path looks only at this
  std::mutex mu;
  GrantTamper tamper;  // see set_grant_tamper in ferry/rdma/rdma.h
  // See lose_read_completions_after in ferry/rdma/rdma.h: READs the next pair completes before it
  // loses the rest; kNever when off. The pair that takes it sets it back to kNever.
  static constexpr uint32_t kNever = UINT32_MAX;
  std::atomic<uint32_t> lose_after{kNever};
};

struct ChannelOptions {
  bool busy_poll = false;
  std::chrono::milliseconds lease_timeout{60000};
  std::shared_ptr<Hooks> hooks;
  // Work requests outstanding and no completion at all for this long: the queue pair is broken
  // (ContextOptions::peer_timeout).
  std::chrono::milliseconds stall_timeout{10000};
  // The transport's registrations of whole objects, for region grants (shared by its channels).
  std::shared_ptr<ObjectRegions> objects;
  // Failed queue pairs a new one to the same peer waits for (shared by the transport's channels).
  std::shared_ptr<QuiesceBoard> quiesce;
  // How long a pair on `quiesce` counts as not yet quiet at most (RdmaOptions::quiesce_timeout).
  std::chrono::milliseconds quiesce_timeout{5000};
  // How a registrar thread posts back to the strand (TransportEnv::loop_gate); null: straight.
  std::shared_ptr<LoopGate> loop_gate;
};

class RdmaChannel final : public TransportChannel,
                          public std::enable_shared_from_this<RdmaChannel> {
 public:
  RdmaChannel(std::shared_ptr<Device> device, Address address, std::shared_ptr<PeerLink> link,
              ChannelOptions options);
  ~RdmaChannel() override;

  // Creates the CQ (with its completion channel) and the QP, in INIT. `serves`: this side
  // answers the peer's fetches (the session's acceptor); with per-grant registrations its QP
  // then lives in a protection domain of its own, where only this peer's grants are registered.
  std::error_code init(bool serves);
  wire::QpInfo local_info() const;
  // RTR then RTS against the peer's QP, and starts watching the CQ. Strand.
  std::error_code connect(const wire::QpInfo& remote);

  // TransportChannel, on the strand. fetch_multiple looks the targets up in the local cache,
  // has those it misses registered on a registrar thread, and waits for them and for the
  // owner's grant, which becomes READs; a registration that fails completes the fetch with
  // device_error. send_multiple grants: it looks up (or has the registrar make) the object's
  // registrations as the device's grant mode says and leases the object to the peer until its
  // release, an abort, the lease timeout or the channel's end. abort ends a lease (owner) or a
  // fetch (fetcher): false while READs of the fetch are still posted (a registration under way
  // is cancelled, not waited for).
  // on_message takes grants, releases and resets; queue pair setup goes to the transport.
  Result<FetchRequest> fetch_multiple(const FetchOp& op) override;
  void send_multiple(uint64_t request_id, ObjectStore::Pin object, SendDone done) override;
  bool abort(uint64_t request_id) override;
  bool on_message(uint64_t request_id, std::string_view payload) override;
  void close(std::error_code ec) override;
  // To the error state and fails the channel, and its fetches with it, at once (new fetches
  // set up a new pair). Any thread: it runs on the strand. For fault injection.
  void post_inject_error();

  // The callback guard's view (ferry/net/core/guard.h). Strand. out_of_memory fails the
  // session (and this channel with it) with resource_exhausted: the channel's own fail() would
  // start its fetches again over a new pair, which needs memory too.
  PeerStrand& strand() { return strand_; }
  std::shared_ptr<void> keep_alive() { return shared_from_this(); }
  bool closed() const { return closed_; }
  void out_of_memory();

 private:
  struct Read {
    uint64_t local;
    uint32_t lkey;
    uint64_t remote;
    uint32_t rkey;
    uint32_t length;
  };
  // A fetch's TargetRegistration while it is made; cancels it when dropped (the fetch ended).
  class Registering {
   public:
    Registering() = default;
    explicit Registering(std::shared_ptr<TargetRegistration> r) : r_(std::move(r)) {}
    Registering(Registering&& other) noexcept : r_(std::move(other.r_)) {}
    Registering& operator=(Registering&& other) noexcept {
      if (this != &other) {
        reset();
        r_ = std::move(other.r_);
      }
      return *this;
    }
    ~Registering() { reset(); }
    void reset() {
      if (r_) std::exchange(r_, nullptr)->cancel();
    }
    TargetRegistration* get() const { return r_.get(); }
    explicit operator bool() const { return r_ != nullptr; }

   private:
    std::shared_ptr<TargetRegistration> r_;
  };
  struct Fetch {
    FetchOp op;
    std::vector<std::shared_ptr<Region>> regions;  // per tensor; null for empty tensors
    // Set while the registrar makes the registrations `regions` lacks (on_registered).
    Registering registering;
    std::optional<wire::Grant> grant;     // the owner's, when it came before the registrations
    std::deque<Read> reads;               // not yet posted
    uint32_t posted = 0;                  // handed to the QP, not yet completed
    std::deque<uint32_t> posted_lengths;  // of those, in posting (= completion) order
    // Bytes of its READs that completed: they follow op.resume_at without a gap, since its
    // READs are posted in the object's order and a queue pair completes them in posting order.
    uint64_t landed = 0;
    bool granted = false;
    bool aborted = false;
    std::error_code error;
  };
  // A memory window to bind over one extent of a lease's grant (post_binds).
  struct Bind {
    int segment;
    int piece;   // -1: the segment's own rkey
    ibv_mr* mr;  // the registration of the object's memory it is bound over
    uint64_t addr;
    uint64_t length;
  };
  struct Lease {
    ObjectStore::Pin pin;  // empty while registering: the registrar's job holds it then
    SendDone done;
    std::unique_ptr<boost::asio::steady_timer> timer;  // from the grant on
    bool registering = false;  // the registrar makes what the grant needs (on_serve_registered)
    std::vector<std::shared_ptr<Region>> regions;  // per segment; null for empty tensors
    wire::Grant grant;                             // sent once every window is bound
    std::vector<Bind> binds;                       // with windows: one per extent
    std::vector<MwHandle> windows;                 // one per bind
    std::vector<GrantMrHandle> registrations;      // per-grant registrations, if any
    size_t next_bind = 0;                          // binds posted
    uint32_t binding = 0;                          // binds posted, not yet completed
  };
  // What the registrar's job for a serve hands back to its lease (on_serve_registered). Members go
  // in reverse order: registrations before their protection domain, everything before the pin.
  struct ServeRegistration {
    ObjectStore::Pin pin;  // the object's memory stays while it is registered
    std::error_code error;
    std::vector<std::shared_ptr<Region>> regions;  // region and window grants: per segment
    std::shared_ptr<ibv_pd> pd;                    // per-grant registrations: this channel's
    std::vector<GrantMrHandle> registrations;      // per-grant registrations, if any
    wire::Grant grant;                             // with their rkeys
  };
  // A lease that ended while binds of its windows were in flight: kept until those complete,
  // then freed windows first, then the registrations and regions they may be bound over, then
  // the pin (members go in the reverse of this order), as end_lease() does for a lease with none.
  struct Retired {
    uint32_t binding = 0;
    ObjectStore::Pin pin;
    std::vector<std::shared_ptr<Region>> regions;
    std::vector<GrantMrHandle> registrations;
    std::vector<MwHandle> windows;
  };

  // Posts one signalled READ of `r` for fetch `request_id`; ibv_post_send's result (0 posted,
  // ENOMEM the send queue is full, anything else the queue pair is broken).
  int post_read(uint64_t request_id, const Read& r);
  // Posts one signalled READ of `r` with work request id `wr_id` (post_read's and the probe's).
  int post_read_wr(uint64_t wr_id, const Read& r);
  void on_grant(uint64_t request_id, const wire::Grant& grant);
  // The fetch's targets are registered and its grant came: its READs.
  void read_granted(uint64_t request_id, Fetch& f, const wire::Grant& grant);
  // The registrar is done with fetch `request_id`'s targets (`registration`, unless the fetch
  // has moved on from it).
  void on_registered(uint64_t request_id, TargetRegistration* registration);
  // The registrar is done with what serve `request_id` needed: its lease grants, or ends.
  void on_serve_registered(uint64_t request_id, ServeRegistration& done);
  // Registers `bytes` of memory with `job`, then runs `then` on this channel's strand: both at
  // once, here, below kRegisterOnTheStrandBelow; otherwise `job` on a registrar thread, after
  // the fault-injection delay, and `then` posted back (dropped if the channel has closed by
  // then). The channel, its session and the context's loop are held until then; the loop counts
  // it as outstanding work, so a context that closes meanwhile waits for it (within its close
  // bound).
  void off_strand(uint64_t bytes, std::function<void()> job, std::function<void()> then);
  // True when nothing is in flight for it any more (see TransportChannel::abort).
  bool abort_fetch(uint64_t request_id);
  // Pins the object for the lease and sends `grant` (one segment per tensor; region rkeys
  // filled in with region grants). With memory windows, first binds one window per extent to
  // this queue pair; with per-grant registrations, registers each segment in this queue pair's
  // protection domain; either way the grant carries their rkeys: the peer can READ only the
  // granted ranges, only over this queue pair, only until the lease ends. `done` runs once,
  // when the lease ends (with device_error, at once, when a window or registration fails).
  void grant(uint64_t request_id, ObjectStore::Pin pin,
             std::vector<std::shared_ptr<Region>> regions, wire::Grant grant, SendDone done);
  // grant() for the lease of `request_id`, which has its pin and done already: its timer, then
  // the binds (windows) or the grant itself. `registrations`: per-grant registrations made for
  // it, their rkeys in `grant`.
  void start_lease(uint64_t request_id, std::vector<std::shared_ptr<Region>> regions,
                   wire::Grant grant, std::vector<GrantMrHandle> registrations);
  // Ends a lease (release, abort, timeout); false if there was none.
  bool end_lease(uint64_t request_id, std::error_code ec);
  // Fetcher side. The owner says its queue pair is gone (a reset): to the error state and fails
  // the channel now, so that its fetches start again over a new pair. Now and not posted: the
  // owner's errors for this pair's leases follow the reset on the metadata channel, and a fetch
  // still here when its error is read would fail with it instead of starting again.
  void on_peer_reset();

  // Fetcher side, when READs are outstanding and nothing completed for kProbeAfter: posts one
  // READ of a byte, from the start of the newest posted READ's remote range into probe_byte_.
  // The queue pair completes its work in posting order, so if the probe completes while READs
  // posted before it have not, the device lost their completions (rxe under load): fail() at
  // once instead of after the whole stall timeout. One probe at a time.
  void post_probe();
  // The probe's completion (drain); false when it failed the pair.
  bool on_probe(const ibv_wc& wc);
  void watch();
  void on_cq_event();
  void drain();
  void busy_loop();
  void arm_safety_net();
  // After posting work requests: the safety net, and the polling loop in busy_poll mode.
  void watch_posted();
  void post_reads();
  void maybe_finish(uint64_t request_id);
  // Ends the owner's lease; `read` says whether every READ of the fetch succeeded.
  void send_release(uint64_t request_id, bool read);
  void post_binds();
  void on_bound(uint64_t request_id);
  void send_grant(uint64_t request_id, const wire::Grant& grant);
  // A completion error or a failed post: the QP is unusable. Fails this channel's fetches and
  // leases and has the session drop it (the next fetch sets up a new one, once this QP is
  // destroyed if READs were outstanding: QuiesceBoard).
  void fail(std::error_code ec);
  // fail() for fetch `id`, which ended (aborted, or a READ of it failed) with READs of it still
  // posted on this failed pair: `link` completes it with `ec` once the pair is destroyed
  // (QuiesceBoard::when_quiet), and `f`'s regions are let go then, on the peer strand. Until
  // then rxe may still place those READs' responses into its targets, which the completion
  // hands back to the caller.
  void complete_when_quiet(std::shared_ptr<PeerLink> link, uint64_t id, std::error_code ec,
                           Fetch f);
  // fail() and close(), before they let go of fetches_: when READs of them are posted, puts this
  // pair on options_.quiesce (once) for `link`'s peer. Returns whether it is on it.
  bool quiesce_if_reading(const PeerLink* link);
  void to_error_state();
  // Fault injection (Hooks::lose_after): whether to drop this successful READ completion.
  bool lose_completion();

  std::shared_ptr<Device> device_;
  Address address_;
  std::weak_ptr<PeerLink> link_;
  PeerStrand strand_;
  ChannelOptions options_;

  // See init(): null when the QP is in the device's PD. Shared with the registrar's jobs, which
  // register grants in it.
  std::shared_ptr<ibv_pd> own_pd_;
  ibv_pd* pd_ = nullptr;  // the QP's
  CompChannelHandle comp_channel_;
  CqHandle cq_;
  QpHandle qp_;
  // Set by fail() or close() when READs were outstanding: tells options_.quiesce that the QP is
  // destroyed (the destructor retires it right after the QP).
  std::function<void()> quiet_;
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

  // Fetcher side: the byte a probe READ lands in, registered in pd_ (init), and the newest
  // posted READ's remote end, where a probe reads.
  std::unique_ptr<std::byte[]> probe_byte_;
  MrHandle probe_mr_;
  uint64_t newest_remote_ = 0;
  uint32_t newest_rkey_ = 0;
  bool probing_ = false;       // a probe is posted
  uint64_t reads_posted_ = 0;  // READs handed to the QP so far
  uint64_t reads_done_ = 0;    // READ completions polled so far (success or not)
  uint64_t probe_behind_ = 0;  // reads_posted_ when the probe was posted
  uint32_t in_flight_ = 0;
  uint64_t posted_bytes_ = 0;  // of the READs in flight
  uint64_t completions_ = 0;   // polled so far
  unsigned idle_ticks_ = 0;    // safety-net ticks in a row without a completion
  // Hooks::lose_after taken by this pair: READ completions it reports before losing the rest.
  uint32_t lose_after_ = Hooks::kNever;
  std::deque<uint64_t> ready_;  // fetches with READs to post, oldest first (post_reads)
  std::unordered_map<uint64_t, Fetch> fetches_;
  std::unordered_map<uint64_t, Lease> leases_;
  std::deque<uint64_t> binds_waiting_;  // leases with windows still to bind (send queue full)
  std::unordered_map<uint64_t, Retired> retired_;
};

}  // namespace ferry::rdma
