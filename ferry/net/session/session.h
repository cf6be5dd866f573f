// Session: the core's per-peer state (internal). One metadata connection, the transports'
// data channels, the fetches this side runs against the peer and the requests it serves.
// Everything mutable is touched only on the session's strand.
//
// The session keeps its state (handshaking, open, draining, closed), dispatches the peer's
// messages, holds the data channels and RPCs, and closes; each other job is a piece of its own
// in ferry/net/session/, which it owns and which never includes this file: the handshake
// (Handshake), the metadata connection's framing, write queue and heartbeat (ControlStream),
// the data channels (Channels), the fetches this side runs (FetchTable) and the requests it
// serves (ServeTable).
#pragma once

#include <atomic>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "ferry/net/connection/meta_stream.h"
#include "ferry/net/core/context_impl.h"
#include "ferry/net/fetch.h"
#include "ferry/net/proto/ferry.pb.h"
#include "ferry/net/security/attach.h"
#include "ferry/net/session/channels.h"
#include "ferry/net/session/control_stream.h"
#include "ferry/net/session/fetch_table.h"
#include "ferry/net/session/handshake.h"
#include "ferry/net/session/serve_table.h"
#include "ferry/net/session/session_link.h"
#include "ferry/net/transport.h"

namespace ferry {

// Session implements PeerLink for the transports and Channels, SessionLink for its tables
// (FetchTable, ServeTable), ControlStream::Owner for its metadata connection and Handshake::Link
// for its handshake, all of which it owns.
class Session final : public PeerLink,
                      private SessionLink,
                      private ControlStream::Owner,
                      private Handshake::Link,
                      public std::enable_shared_from_this<Session> {
 public:
  using tcp = boost::asio::ip::tcp;
  using Clock = std::chrono::steady_clock;
  using RpcHandler = std::function<void(std::error_code, const wire::Envelope&)>;

  Session(std::shared_ptr<Context::Impl> ctx, MetaStream stream, bool initiator,
          std::string address);
  ~Session() override;

  // Initiator: Hello, HelloAnswer, open the chosen transport's channel. `done` runs once, on
  // the strand.
  void start_client(std::string requested_transport, std::function<void(std::error_code)> done);
  // Acceptor: the Hello was read by the accept path (exactly one frame); answer it and serve.
  // Strand.
  void start_server(const wire::Hello& hello);
  // Acceptor: a side connection authenticated for this session. Strand.
  void attach_side_connection(const std::string& transport, tcp::socket socket);

  // Any thread. Without targets, while other fetches of the context run, the receive memory is
  // taken from the pool on this thread: faulting a new region in stalls the caller, not them.
  // Completes once, through the loop; with errc::context_closed through the system executor
  // when the context's close() has already run the loop for the last time.
  FetchRequest fetch(ObjectRef ref, std::vector<MutableBuffer> targets, FetchOptions options,
                     FetchHandler handler);
  // Any thread. Sends `request` and calls `done` once: on the strand with the answer, the
  // peer's error, errc::timed_out after `timeout` or the session's close reason; inline with
  // errc::context_closed when the context's close() has already run the loop for the last time.
  void rpc(wire::Envelope request, std::chrono::milliseconds timeout, RpcHandler done);
  void close(std::error_code ec);
  // Sends this side's current transports to the peer (after one was registered). Any thread.
  void announce_transports();
  // An object was put under `name`: serve the fetches parked waiting for it. Any thread.
  void on_named(const std::string& name);
  // The owner aborts its serves of `object` to this peer: each fails at the fetcher with
  // errc::aborted. A two-sided transport stops sending at once; a one-sided one keeps its grant
  // until the fetcher has stopped reading (its Cancel) or the lease ends, so that no grant is
  // revoked under posted READs. Any thread; returns at once.
  void abort_serving(ObjectId object);
  // A copy of the peer's description, safe from any thread.
  PeerInfo info_snapshot() const;

  uint64_t local_id() const { return local_id_; }
  uint64_t wire_session_id() const { return info_.session_id; }
  // Accepting side: whether `attach` proves this session's token (auth::attach_proof) with an
  // attach number not accepted before (a recorded frame replayed is refused). Any thread, once
  // the session is open.
  bool accept_attach(const wire::AttachChannel& attach);
  std::string chosen_transport() const;
  // Whether the chosen transport streams FetchOptions::combine (TransportManager::combines()).
  bool chosen_combines() const;
  // Whether Context::close() has begun: nothing posted to the strand may run any more. Any
  // thread.
  bool context_closed() const;

  // The callback guard's view (ferry/net/core/guard.h; strand() is PeerLink's). out_of_memory
  // closes the session with resource_exhausted.
  std::shared_ptr<void> keep_alive() override { return shared_from_this(); }
  bool closed() const { return state_.load() == State::closed; }
  void out_of_memory();

  // PeerLink
  PeerStrand& strand() override { return strand_; }
  std::shared_ptr<PeerLink> shared_link() override { return shared_from_this(); }
  const PeerInfo& info() const override { return info_; }
  bool is_open() const override { return state_.load() == State::open; }
  std::shared_ptr<TransportChannel> channel(std::string_view transport) const override;
  void complete_fetch(uint64_t request_id, std::error_code ec) override;
  void restart_fetch(uint64_t request_id, std::error_code ec, uint64_t landed) override;
  void fail(std::error_code ec) override;
  void send_transport_message(std::string_view transport, uint64_t request_id,
                              std::string payload) override;
  void settle(uint64_t request_id) override;
  void async_open_side_connection(std::string_view transport, SideConnectionHandler done) override;
  bool install_channel(std::string_view transport,
                       std::shared_ptr<TransportChannel> channel) override;
  void drop_channel(std::string_view transport, std::error_code ec) override;

 private:
  // draining: the peer closed its metadata connection while fetches of ours over a two-sided
  // transport were pending; their bytes may still be on the way over the data channel, which
  // the peer closes after its last byte. Nothing is sent or started; the session closes when
  // they have completed, when that channel ends, or after kDrainBound.
  enum class State { handshaking, open, draining, closed };
  static constexpr std::chrono::milliseconds kDrainBound{1000};
  struct PendingRpc {
    RpcHandler done;
    std::unique_ptr<boost::asio::steady_timer> timer;
  };

  // ControlStream::Owner (strand).
  const PeerInfo& peer_info() const override { return info_; }
  std::error_code on_envelope(const wire::Envelope& env) override { return dispatch(env); }
  // Closes the session with `ec`, or, when the peer ended its connection while fetches of ours
  // wait for bytes it sent over a data channel, drains.
  void on_end(std::error_code ec, bool peer_eof) override;
  std::error_code dispatch(const wire::Envelope& env);

  // Handshake::Link (strand; send, send_error, fail, pick_transport, ensure_channel and
  // peer_info are shared with the other interfaces).
  std::vector<TransportInfo> local_infos() const override { return ctx_->local_infos(); }
  std::shared_ptr<TransportManager> find_transport(std::string_view name) const override {
    return ctx_->find_transport(name);
  }
  void set_peer(Handshake::Peer peer) override;
  // Opens the session (or closes it with `ec`) and runs start_client's `done`.
  void opened(std::error_code ec) override;

  // A TransportMessage for `transport`: to the peer's channel of that transport when one is
  // installed and takes it (TransportChannel::on_message), else to the transport itself.
  void deliver_transport_message(TransportManager& transport, uint64_t rid,
                                 std::string_view payload);
  void handle_error(uint64_t rid, const wire::Error& err);
  void handle_ref(uint64_t rid, ObjectId id, bool add);
  void handle_list(uint64_t rid);
  void finish_rpc(uint64_t rid, std::error_code ec, const wire::Envelope& env);

  // Fetch `state`'s first step on the strand: fails it at once when the session is not open or
  // `ref` is from another instance of the peer, else hands it to fetches_ (`storage`: as
  // FetchTable::start's).
  void do_fetch(std::shared_ptr<detail::FetchState> state, ObjectRef ref,
                std::vector<MutableBuffer> targets, std::shared_ptr<std::byte[]> storage,
                FetchOptions options);

  // SessionLink (for fetches_ and serves_; strand).
  PeerLink& peer() override { return *this; }
  std::error_code close_reason() const override { return close_reason_; }
  Clock::time_point now() const override { return Clock::now(); }
  void post(std::function<void()> fn) override;
  uint64_t next_request_id() override { return next_request_id_.fetch_add(2); }
  std::shared_ptr<TransportManager> fallback_transport(
      const TransportManager& failed) const override;
  void fetch_completed() override;
  ObjectId wait_for_name(const std::string& name) override;
  void forget_name_wait(const std::string& name) override;
  void ensure_channel(const std::shared_ptr<TransportManager>& transport,
                      std::function<void(std::error_code)> done) override;
  std::shared_ptr<TransportManager> pick_transport(const std::string& requested,
                                                   const std::string& ref_transport,
                                                   std::error_code& ec) const override;

  // One timer serves every deadline of fetches_ and serves_ (not one timer per request, which
  // costs an allocation, a timer-queue insertion and a cancelled handler per fetch): armed for
  // the earliest, on_deadline() ends what is due when it fires and arms it for the next.
  void arm_deadline(Clock::time_point at) override;
  void on_deadline();

  // ControlStream::send and send_error. Strand.
  void send(const wire::Envelope& env) override;
  void send_error(uint64_t rid, std::error_code ec, const std::string& message,
                  bool fatal) override;
  void do_close(std::error_code ec);
  // Completes the launched fetches with the close reason once every transport says none of its
  // channels to the peer can still write into their targets (TransportManager::when_quiet).
  // Strand.
  void close_fetches_when_quiet();

  std::shared_ptr<Context::Impl> ctx_;
  const uint64_t local_id_;
  PeerStrand strand_;
  ControlStream control_;
  PeerInfo info_;  // written on the strand, under info_mu_
  mutable std::mutex info_mu_;
  std::string token_;
  uint64_t attach_seq_ = 0;           // initiator: the last attach number used (strand)
  auth::AttachWindow attach_window_;  // acceptor: the attach numbers taken
  uint64_t peer_instance_ = 0;
  Handshake handshake_;
  mutable std::set<std::string> fallback_logged_;  // transports whose fallback was reported
  std::atomic<State> state_{State::handshaking};
  std::error_code close_reason_;

  boost::asio::steady_timer handshake_timer_;
  boost::asio::steady_timer drain_timer_;
  boost::asio::steady_timer deadline_timer_;
  Clock::time_point deadline_armed_ = Clock::time_point::max();  // max: not armed
  std::function<void(std::error_code)> on_ready_;

  // Odd on the connecting side, even on the accepting side: our ids and the peer's never
  // collide in a transport's per-request tables.
  std::atomic<uint64_t> next_request_id_;
  FetchTable fetches_;
  ServeTable serves_;
  std::unordered_map<uint64_t, PendingRpc> rpcs_;
  Channels channels_;
};

}  // namespace ferry
