/// @file
/// TransportManager: the interface every transport implements (TCP, RDMA, a user's own),
/// method for method after Ray's TensorTransportManager, plus the per-peer hooks a transport
/// needs to set up its data channel.
///
/// Thread model (see docs/threading.md): ferry calls every method that takes a PeerLink on that
/// peer's strand, so per-peer state needs no locks. name(), is_one_sided(), can_abort(),
/// local_info(), peer_has_transport(), extract_metadata() and garbage_collect() may be called from
/// any thread and must be thread-safe. No method may block.
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

/// A transport's per-peer data channel (a TCP connection, an RC queue pair, ...).
class TransportChannel {
 public:
  virtual ~TransportChannel() = default;
  /// Stops all I/O, drops every posted receive and send without touching their buffers again,
  /// releases the channel's resources. Called once, on the peer strand, when the session closes.
  virtual void close(std::error_code ec) = 0;
};

/// The fetcher side's description of one fetch, handed to the transport.
struct FetchOp {
  uint64_t request_id = 0;  ///< the fetch's id on this session (PeerLink::complete_fetch takes it)
  ObjectRef ref;            ///< what to fetch
  std::vector<MutableBuffer> targets;  ///< one per tensor, sizes already checked against the ref
  FetchRequest request;                ///< the handle the caller holds; completed by the core
  /// FetchOptions::combine, for a transport that combines() (else empty: the core does it).
  CombineFn combine;
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
  /// again fewer than kMaxFetchRestarts times; otherwise it completes it with `ec`, as
  /// complete_fetch would. Unknown or completed ids are ignored. Call it before dropping the
  /// channel (drop_channel): the restart waits for a new one.
  virtual void restart_fetch(uint64_t request_id, std::error_code ec) = 0;

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

/// Called by the owner's transport when it has finished serving a request (any error ends it).
using SendDone = std::function<void(std::error_code)>;
/// Completion of TransportManager::async_open_channel(): the channel for the peer, or the error
/// that kept it from being made (the fetches waiting for it then fail with that error).
using ChannelOpenHandler = std::function<void(std::error_code, std::shared_ptr<TransportChannel>)>;

/// The interface every transport implements: one instance per Context, made by the factory it
/// registered (register_transport) and held by the Context and its sessions through shared_ptr.
/// Which side calls what, on which thread: this file's comment and each method's;
/// docs/custom-transport.md walks through a whole transport.
class TransportManager {
 public:
  virtual ~TransportManager() = default;

  /// The name it is registered under ("TCP", "RDMA", "SHM", ...).
  virtual std::string name() const = 0;
  /// One-sided: the fetcher pulls bytes without the owner's CPU (fetch_multiple); two-sided: the
  /// owner sends (send_multiple) into receives the fetcher posted (recv_multiple).
  virtual bool is_one_sided() const = 0;
  /// Whether recv_multiple() honours FetchOp::combine (streams arriving bytes through it). If
  /// not, the core fetches into a buffer of its own and combines on success. Any thread.
  virtual bool combines() const { return false; }
  /// Whether abort() can stop a transfer in flight (otherwise abort waits for the transfer).
  virtual bool can_abort() const = 0;

  /// What this side advertises in Hello.
  virtual TransportInfo local_info() const = 0;
  /// Whether the peer can be reached over this transport (default: the peer advertised it).
  virtual bool peer_has_transport(const PeerInfo& peer) const;

  /// Owner side, at put(): adds this transport's fields to an object's metadata. Any thread.
  virtual std::error_code extract_metadata(const StoredObject& object, TransportMetadata& metadata);

  /// Initiator side: sets up the per-peer data channel. `done` runs on the strand, exactly once.
  virtual void async_open_channel(std::shared_ptr<PeerLink> link, ChannelOpenHandler done) = 0;
  /// Acceptor side: a side connection the peer opened for this transport (see PeerLink). The
  /// transport returns the channel it built on it, or an error (the socket is then closed).
  virtual std::error_code accept_side_connection(std::shared_ptr<PeerLink> link,
                                                 boost::asio::ip::tcp::socket socket,
                                                 std::shared_ptr<TransportChannel>& channel);

  /// Fetcher side, one-sided transports: start pulling `op`'s bytes into its targets and return
  /// the request (op.request); finish it with link.complete_fetch(). An error fails it at once.
  virtual Result<FetchRequest> fetch_multiple(PeerLink& link, const FetchOp& op);
  /// Fetcher side, two-sided transports: post receives for `op` into its targets and return the
  /// request (op.request); the owner's send_multiple() fills them; finish with
  /// link.complete_fetch(). An error fails it at once.
  virtual Result<FetchRequest> recv_multiple(PeerLink& link, const FetchOp& op);
  /// Waits for a fetch with a timeout (Ray's wait_fetch_complete). The default waits on the
  /// request itself; any thread but a completion handler.
  virtual std::error_code wait_fetch_complete(const FetchRequest& request,
                                              std::chrono::milliseconds timeout);

  /// Owner side, two-sided transports: send the pinned object for `request_id`; the pin keeps it
  /// alive until `done` runs (exactly once, on the strand). One-sided transports grant access here.
  /// `done` with success means the transport is done with the bytes (StoredObject::on_sent, which
  /// ferry then runs), and the fetcher has them when the object counts its serves
  /// (StoredObject::on_served, run next): a two-sided transport then waits for the fetcher's word,
  /// a one-sided one always waits for the release that says its reads succeeded.
  virtual void send_multiple(PeerLink& link, uint64_t request_id, ObjectStore::Pin object,
                             SendDone done) = 0;

  /// Either side: stop everything for `request_id`. Returns true when the transport has let go of
  /// the request's buffers (it never touches them again). Returns false on the fetcher side when
  /// operations already handed to hardware (posted RDMA READs) still target them: the transport
  /// then calls link.complete_fetch(request_id, {}) once they have drained, and ferry completes
  /// the fetch with the error it was aborted for only then; the owner hears of the abort (and its
  /// abort() runs) only then too, so an owner may revoke a one-sided grant at once. On the owner
  /// side a pending SendDone still runs (with errc::aborted).
  virtual bool abort(PeerLink& link, uint64_t request_id) = 0;

  /// Owner side: the object was collected (last local and remote reference gone); release what
  /// the transport holds for it. Runs exactly once per object of this transport. Any thread.
  virtual void garbage_collect(const StoredObject& object) = 0;

  /// A TransportMessage from the peer addressed to this transport.
  virtual void on_transport_message(PeerLink& link, uint64_t request_id, std::string_view payload);
};

}  // namespace ferry
