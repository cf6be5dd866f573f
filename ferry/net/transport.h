/// @file
/// The interface every transport implements (TCP, RDMA, a user's own), in two halves after Ray's
/// TensorTransportManager: the per-process TransportManager (identity, what it advertises,
/// metadata, opening and accepting channels, garbage collection) and the per-peer
/// TransportChannel (fetch, receive, send, abort, the transport's messages). The core's side of
/// a peer, as a transport sees it, is a PeerLink.
///
/// Thread model (see docs/threading.md): ferry calls every TransportChannel method, and every
/// TransportManager method that takes a PeerLink, on that peer's strand, so per-peer state
/// needs no locks. The other TransportManager methods (name(), is_one_sided(), combines(),
/// can_abort(), local_info(), peer_has_transport(), extract_metadata(), wait_fetch_complete(),
/// garbage_collect()) may be called from any thread and must be thread-safe. No method may
/// block (but wait_fetch_complete, which is for the application's threads).
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/strand.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "ferry/net/fetch.h"
#include "ferry/net/object_ref.h"
#include "ferry/net/result.h"
#include "ferry/store/object_store.h"

namespace ferry {

struct ContextOptions;

/// What one side advertises about a transport in Hello.
struct TransportInfo {
  std::string name;                  ///< the name the transport is registered under
  std::vector<std::string> devices;  ///< the devices it uses on this side
  std::string descriptor;            ///< transport-defined: how to reach this side over it
  uint32_t priority = 0;             ///< higher wins when both sides could use several
};

/// What we know of a connected peer.
struct PeerInfo {
  std::string name;       ///< the peer's ContextOptions::name
  std::string address;    ///< host:port we reached it at, or where it came from
  std::string local_ip;   ///< this side's address on the metadata connection
  std::string remote_ip;  ///< the peer's address on the metadata connection
  /// This side's id of the connection (unique within its Context).
  uint64_t session_id = 0;
  bool initiator = false;                 ///< true on the side that connected
  std::vector<TransportInfo> transports;  ///< what the peer advertises (Hello, then announcements)

  /// The peer's entry for transport `name`, or null when it did not advertise one. Valid while this
  /// PeerInfo is unchanged.
  const TransportInfo* find_transport(std::string_view name) const;
};

/// The strand that serializes everything ferry and the transports do for one peer
/// (PeerLink::strand()).
using PeerStrand = boost::asio::strand<boost::asio::io_context::executor_type>;

/// The fetcher side's description of one fetch, handed to the transport.
struct FetchOp {
  uint64_t request_id = 0;  ///< the fetch's id on this session (PeerLink::complete_fetch takes it)
  ObjectRef ref;            ///< what to fetch
  std::vector<MutableBuffer> targets;  ///< one per tensor, sizes already checked against the ref
  FetchRequest request;                ///< the handle the caller holds; completed by the core
  /// FetchOptions::combine, for a transport that combines() (else empty: the core does it).
  CombineFn combine;
  /// Bytes at the start of the object (its tensors in order) that an earlier attempt of this
  /// fetch over the same transport left whole in the targets (PeerLink::restart_fetch's
  /// `landed`): the transport reads only what follows them. 0 for a first attempt.
  uint64_t resume_at = 0;
};

/// Called by the owner's channel when it has finished serving a request (any error ends it).
using SendDone = std::function<void(std::error_code)>;

/// A transport's per-peer object (a TCP data connection, an RC queue pair, ...): every transfer
/// with that peer runs through it. The transport builds it (TransportManager::async_open_channel
/// on the side that connected, accept_side_connection or PeerLink::install_channel on the other)
/// and keeps in it the PeerLink it needs; the session holds it, hands it the peer's fetches,
/// serves, aborts and messages, and closes it once.
///
/// Thread model: every method runs on the peer strand (PeerLink::strand()) and must not block.
/// Between methods only the channel itself and its own callbacks (posted to that strand) touch
/// its state, so it needs no lock.
class TransportChannel {
 public:
  virtual ~TransportChannel() = default;

  /// Fetcher side, one-sided transports (Ray's fetch_multiple_tensors): starts pulling `op`'s
  /// bytes into op.targets and returns op.request; the transport finishes it with
  /// PeerLink::complete_fetch (or restart_fetch). Returning an error fails the fetch at once,
  /// with nothing of it left in the channel. The default returns invalid_argument: two-sided
  /// channels receive with recv_multiple().
  virtual Result<FetchRequest> fetch_multiple(const FetchOp& op);
  /// Fetcher side, two-sided transports (Ray's recv_multiple_tensors): posts receives for `op`
  /// into op.targets, which the owner's send_multiple() fills, and returns op.request; same
  /// contract as fetch_multiple(). The default returns invalid_argument: one-sided channels pull
  /// with fetch_multiple().
  virtual Result<FetchRequest> recv_multiple(const FetchOp& op);
  /// Owner side (Ray's send_multiple_tensors): serves `request_id`, the peer's fetch of the
  /// pinned object. Two-sided: sends its bytes; one-sided: grants the peer access. The pin keeps
  /// the object alive until `done` runs: exactly once, on the strand, possibly from inside this
  /// call when the serve fails at once. `done` with success means the transport is done with
  /// the bytes (StoredObject::on_sent, which ferry then runs), and the fetcher has them when the
  /// object counts its serves (StoredObject::on_served, run next): a two-sided transport then
  /// waits for the fetcher's word, a one-sided one always waits for the release that says its
  /// reads succeeded. Any error ends the serve and is reported to the fetcher. It may throw
  /// std::bad_alloc: ferry then ends the serve with errc::resource_exhausted, and a copy of
  /// `done` the transport kept is a no-op when it runs; what it kept of the serve (the pin) it
  /// must still let go, by running that `done`'s path or by holding nothing after the throw.
  virtual void send_multiple(uint64_t request_id, ObjectStore::Pin object, SendDone done) = 0;
  /// Either side (Ray's abort_transport): stops everything for `request_id`; unknown ids are not
  /// an error. Returns true when the channel has let go of the request's buffers (it never
  /// touches them again). Returns false on the fetcher side when operations already handed to
  /// hardware (posted RDMA READs) still target them: the channel then calls
  /// PeerLink::complete_fetch(request_id, {}) once they have drained, and ferry completes the
  /// fetch with the error it was aborted for only then; the owner hears of the abort (and its
  /// abort() runs) only then too, so an owner may revoke a one-sided grant at once. On the owner
  /// side a pending SendDone still runs (with errc::aborted).
  virtual bool abort(uint64_t request_id) = 0;
  /// A TransportMessage from the peer for this channel's transport. Returns true when the channel
  /// took it; false when it belongs to the transport's channel setup rather than to this channel
  /// (the peer asks for a new channel, say): ferry then hands it to
  /// TransportManager::on_transport_message. Malformed input: PeerLink::fail(protocol_error),
  /// and true. The default takes none.
  virtual bool on_message(uint64_t request_id, std::string_view payload);
  /// Stops all I/O, drops every posted receive and send without touching their buffers again
  /// (pending SendDones run with `ec`), releases the channel's resources. Called once, when the
  /// session closes or drops the channel (PeerLink::drop_channel); no other method runs after it.
  virtual void close(std::error_code ec) = 0;
};

/// The core's per-peer session, as a transport sees it. Every method runs on (and is only to be
/// called from) the peer strand unless noted.
class PeerLink {
 public:
  virtual ~PeerLink() = default;

  virtual PeerStrand& strand() = 0;  ///< any thread
  /// This link as a shared_ptr, for transports that keep a (weak) handle to it. Any thread.
  virtual std::shared_ptr<PeerLink> shared_link() = 0;
  /// What the core knows of the peer. Strand.
  virtual const PeerInfo& info() const = 0;
  /// False once the session is closing or closed: no new work should start on it. Any thread.
  virtual bool is_open() const = 0;

  /// The channel this transport installed for the peer, or null.
  virtual std::shared_ptr<TransportChannel> channel(std::string_view transport) const = 0;

  /// Completes fetch `request_id` (fetcher side) once every byte landed, or with the error the
  /// transport saw. Unknown or already completed ids are ignored.
  virtual void complete_fetch(uint64_t request_id, std::error_code ec) = 0;
  /// The transport's channel broke under fetch `request_id` (a queue pair flushed, stalled or
  /// reset by the owner) and fetching it again is harmless: the fetch's own requests did not fail
  /// and nothing was combined into its targets (the transport does not combine it, or has not
  /// started to). The transport has let go of the targets and ended the owner's lease (or the
  /// channel's end does). The session starts it again as a new request, over a new channel,
  /// while the peer's session is open, the fetch's deadline has not passed and it was started
  /// again fewer than kMaxFetchRestarts times in a row without progress; otherwise it completes
  /// it with `ec`, as complete_fetch would. `landed`: bytes at the start of the object (its
  /// tensors in order, counted from the start of the object, not of this attempt) that are whole
  /// in the targets and that nothing of the broken channel will touch again; the new attempt
  /// gets them as FetchOp::resume_at and reads only the rest (0: everything again). A fetch of a
  /// ref by name starts from 0 whatever `landed` says: the name may stand for another object by
  /// then. Unknown or completed ids are ignored. Call it before dropping the channel
  /// (drop_channel): the restart waits for a new one.
  virtual void restart_fetch(uint64_t request_id, std::error_code ec, uint64_t landed) = 0;

  /// A peer-scope failure seen by the transport: closes the session; pending fetches fail.
  virtual void fail(std::error_code ec) = 0;

  /// Acceptor side: installs the channel a transport built from its own control messages (e.g.
  /// an RDMA queue pair set up over TransportMessages). Replaces nothing: false if one exists.
  virtual bool install_channel(std::string_view transport,
                               std::shared_ptr<TransportChannel> channel) = 0;
  /// The transport's channel broke but the peer is fine: the session forgets it (closing it with
  /// `ec`); the next fetch over that transport opens a new one (initiator side). The transport
  /// fails that channel's own pending fetches first.
  virtual void drop_channel(std::string_view transport, std::error_code ec) = 0;

  /// Owner side: the fetcher says every byte of `request_id` arrived, after the transport had
  /// already ended that serve with an error (its channel broke after the bytes had gone): the
  /// object counts it as served now (StoredObject::on_sent, then on_served). Unknown ids are
  /// ignored. Strand.
  virtual void settle(uint64_t request_id) = 0;

  /// Sends a transport-private control message on the metadata channel.
  virtual void send_transport_message(std::string_view transport, uint64_t request_id,
                                      std::string payload) = 0;

  /// Completion of async_open_side_connection(): the connected socket, or the error that kept it
  /// from being made (then the socket is not open).
  using SideConnectionHandler = std::function<void(std::error_code, boost::asio::ip::tcp::socket)>;
  /// Opens a side connection to the peer's listener for `transport` (initiator side only): a new
  /// TCP connection that the peer's core authenticates as belonging to this session and hands to
  /// that transport's accept_side_connection(). Completes on the strand.
  virtual void async_open_side_connection(std::string_view transport,
                                          SideConnectionHandler done) = 0;
};

/// A channel's peer-scope failure: the session fails with `ec` (PeerLink::fail, which closes every
/// channel, `channel` included), or, once the session is gone, `channel` closes alone. On the
/// channel's strand.
void fail_peer(const std::weak_ptr<PeerLink>& link, TransportChannel& channel, std::error_code ec);

/// Completion of TransportManager::async_open_channel(): the channel for the peer, or the error
/// that kept it from being made (the fetches waiting for it then fail with that error).
using ChannelOpenHandler = std::function<void(std::error_code, std::shared_ptr<TransportChannel>)>;

/// The per-process half of a transport: one instance per Context, made by the factory it
/// One number a transport reports about itself (TransportManager::metrics()): in Stats::
/// transport_metrics and, through prometheus_text, as `<prefix>_<transport>_<name>`.
struct TransportMetric {
  std::string name;    ///< snake_case, unique within the transport; a counter's ends in `_total`
  std::string help;    ///< one sentence for people (Prometheus' # HELP)
  bool gauge = false;  ///< a level now (true) or a count since the transport started (false)
  double value = 0;    ///< the count, or the level
};

/// registered (register_transport) and held by the Context and its sessions through shared_ptr.
/// It says what the transport is (identity, what it advertises, whom it can reach), adds its
/// fields to an object's metadata, opens and accepts the per-peer TransportChannels that carry
/// every transfer, and releases what it holds for an object when the store collects it.
/// Which side calls what, on which thread: this file's comment and each method's;
/// docs/custom-transport.md walks through a whole transport and maps it onto Ray's
/// TensorTransportManager.
class TransportManager {
 public:
  virtual ~TransportManager() = default;

  /// The name it is registered under ("TCP", "RDMA", "SHM", ...). Any thread.
  virtual std::string name() const = 0;
  /// One-sided: the fetcher pulls bytes without the owner's CPU (TransportChannel::fetch_multiple);
  /// two-sided: the owner sends (send_multiple) into receives the fetcher posted (recv_multiple).
  /// Any thread.
  virtual bool is_one_sided() const = 0;
  /// Whether TransportChannel::recv_multiple() honours FetchOp::combine (streams arriving bytes
  /// through it). If not, the core fetches into a buffer of its own and combines on success. Any
  /// thread.
  virtual bool combines() const { return false; }
  /// Whether TransportChannel::abort() can stop a transfer in flight (otherwise abort waits for
  /// the transfer). Any thread.
  virtual bool can_abort() const = 0;
  /// Whether it can reach processes on other hosts (default true). A same-host transport (CMA, a
  /// shared-memory one) returns false: a peer elsewhere that connects over another transport is
  /// then expected, and not logged as a fallback from it. Any thread.
  virtual bool reaches_other_hosts() const { return true; }

  /// What this side advertises in Hello and Capabilities. Any thread.
  virtual TransportInfo local_info() const = 0;
  /// Whether the peer can be reached over this transport (default: the peer advertised it). Any
  /// thread.
  virtual bool peer_has_transport(const PeerInfo& peer) const;

  /// Owner side, at put(): adds this transport's fields to an object's metadata (default: none).
  /// An error fails the put. Any thread.
  virtual std::error_code extract_metadata(const StoredObject& object, TransportMetadata& metadata);

  /// Initiator side: sets up the per-peer channel. `done` runs on the strand, exactly once, with
  /// the channel or the error that kept it from being made (transport_unavailable,
  /// handshake_failed, device_error, ...). Strand.
  virtual void async_open_channel(std::shared_ptr<PeerLink> link, ChannelOpenHandler done) = 0;
  /// Acceptor side: a side connection the peer opened for this transport (see PeerLink). The
  /// transport returns the channel it built on it, or an error (the socket is then closed; the
  /// default refuses with transport_unavailable). Strand.
  virtual std::error_code accept_side_connection(std::shared_ptr<PeerLink> link,
                                                 boost::asio::ip::tcp::socket socket,
                                                 std::shared_ptr<TransportChannel>& channel);
  /// A TransportMessage from the peer addressed to this transport that no channel took: the
  /// messages that set a channel up (the peer has none installed for this transport yet, or its
  /// channel declined the message: TransportChannel::on_message), and any that arrives while
  /// the peer has no channel for it. Bad input: link.fail(protocol_error). Strand. The default
  /// ignores it.
  virtual void on_transport_message(PeerLink& link, uint64_t request_id, std::string_view payload);

  /// Runs `then` once no channel of this transport to `link`'s peer, open, closed or failed, can
  /// still write into a fetch's targets; the session completes the fetches a close ended only
  /// then, so that a caller never gets back a target a transport may still write. On the
  /// link's strand: inline when nothing can (the default: a transport whose channels stop
  /// writing when they close), else posted there later, within a bound the transport keeps.
  /// Strand.
  virtual void when_quiet(PeerLink& link, std::function<void()> then);

  /// Waits for a fetch with a timeout (Ray's wait_fetch_complete): the fetch's error, or
  /// timed_out when `timeout` passes first (the fetch goes on). The default waits on the request
  /// itself; any thread but a completion handler.
  virtual std::error_code wait_fetch_complete(const FetchRequest& request,
                                              std::chrono::milliseconds timeout);

  /// What the transport has done and holds now (registrations, queue pairs, ...), for
  /// Context::stats() and the metrics exporter. Called per snapshot: cheap, and it must not block
  /// on transfers. Any thread. The default reports nothing.
  virtual std::vector<TransportMetric> metrics() const { return {}; }

  /// Owner side: the object was collected (its last local and remote reference and its last pin
  /// gone); release what the transport holds for it, before its memory goes. Runs exactly once
  /// per object of this transport. Any thread.
  virtual void garbage_collect(const StoredObject& object) = 0;
};

}  // namespace ferry
