/// @file
/// Context: one io_context, its threads, the local store, the transports, the listener and the
/// peers. Everything in ferry hangs off a Context.
#pragma once

#include <any>
#include <boost/asio/async_result.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/system/error_code.hpp>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/net/object_ref.h"
#include "ferry/net/peer.h"
#include "ferry/net/result.h"
#include "ferry/net/transport.h"
#include "ferry/store/object_store.h"

namespace ferry {

/// The metadata channel's protocol version, sent in Hello: a peer speaking another one is refused
/// with errc::version_mismatch.
inline constexpr uint32_t kProtocolVersion = 2;

/// TLS for the metadata channel (Boost.Asio SSL over OpenSSL, TLS 1.2+). Data channels stay plain
/// TCP or RDMA: TLS protects the control messages (object ids, sizes, grants and their rkeys,
/// session tokens), not the tensor bytes (docs/security.md). Off when all three are empty.
struct TlsOptions {
  std::string certificate;  ///< PEM chain this side presents; needed to accept TLS connections
  std::string private_key;  ///< PEM key of `certificate`
  /// PEM CAs the peer's certificate must chain to. Needed to connect (the server is always
  /// verified, by IP or host name against its certificate's names); on a server it also makes
  /// client certificates mandatory (mutual TLS).
  std::string ca;
  /// Whether any of the three is set (TLS is then on for the metadata channel).
  bool enabled() const;
  /// From $FERRY_TLS_CERT, $FERRY_TLS_KEY and $FERRY_TLS_CA.
  static TlsOptions from_environment();
};

/// Everything a Context is configured with, fixed at construction (Context::options()): the
/// core's settings, and each transport's own options in transport_options. A `ContextOptions{}`
/// reads nothing from the environment; from_environment() is the one place that does
/// (docs/configuration.md lists every variable).
struct ContextOptions {
  std::string name = "ferry";           ///< shown to peers and in logs
  int threads = 1;                      ///< threads running the io_context
  std::vector<std::string> transports;  ///< registered transports to use; empty = all
  /// For connections we make: "auto" or a registered transport's name; from_environment() takes
  /// $FERRY_TRANSPORT (where "rdma", "tcp" and "cma" in any case mean the built-in "RDMA", "TCP"
  /// and "CMA").
  std::string transport = "auto";
  uint32_t max_frame_bytes = 4u << 20;          ///< metadata frames above this end the connection
  size_t max_queued_control_bytes = 64u << 20;  ///< a peer that does not read its control frames
  size_t max_requests_per_peer = 4096;          ///< fetches one peer may have us serve at once
  /// Connecting's deadline: resolving, the TCP connect and the TLS handshake of the metadata
  /// channel.
  std::chrono::milliseconds connect_timeout{10000};
  /// The handshake's deadline: Hello / HelloAnswer and the shared secret's proofs (and an
  /// accepted connection's first frame).
  std::chrono::milliseconds handshake_timeout{5000};
  /// A ping to each open peer this often; peer_timeout is checked at each.
  std::chrono::milliseconds heartbeat_interval{1000};
  std::chrono::milliseconds peer_timeout{10000};   ///< silence after which a peer is declared dead
  std::chrono::milliseconds lease_timeout{60000};  ///< one-sided grants: pin held at most this long
  /// Shared secret for the metadata channel (from_environment(): $FERRY_SECRET). When set, both
  /// sides prove knowledge of it (HMAC-SHA256 challenge-response; it is never sent) before
  /// anything else; a peer without it, or with another, is refused with errc::auth_failed.
  std::string secret;
  /// TLS on the metadata channel (see TlsOptions; from_environment(): $FERRY_TLS_*). When
  /// enabled, a listening context refuses plain-TCP peers (errc::tls_required) and a connecting
  /// one speaks only TLS. A file that cannot be loaded makes the Context constructor throw
  /// std::system_error.
  TlsOptions tls;
  /// The receive pool (ferry/mem/pool.h): memory ferry allocates for fetches without targets, for
  /// the collectives' receive space and for allocate(), recycled instead of freed and registered
  /// with each RDMA device once. At most this many bytes are held (default_pool_bytes();
  /// from_environment(): $FERRY_POOL_BYTES, e.g. "4G"); beyond it allocations get plain memory
  /// and are counted as fallbacks, never refused. 0 turns the pool off.
  size_t pool_bytes = default_pool_bytes();
  /// A region of the pool wholly free this long is given back to the system.
  std::chrono::milliseconds pool_idle_trim{10000};
  /// Threads that fault a new pool region in together (mem::PoolOptions::populate_threads; at
  /// most one per core and per 4 MiB of the region; from_environment():
  /// $FERRY_POOL_POPULATE_THREADS). Fresh memory costs what zeroing it costs, and more where a
  /// hypervisor backs guest memory on first touch: more threads fault it in faster.
  unsigned pool_populate_threads = 4;
  /// How long an io thread keeps polling the io_context after it ran a handler, before it sleeps
  /// in the reactor again (from_environment(): $FERRY_IO_SPIN_US, 0 to 10000). Work posted from
  /// another thread (a fetch issued by the application, a Python callback's next fetch) and
  /// the next packet then find the thread awake: no wake-up, which costs tens of microseconds
  /// where idle CPUs halt (virtual machines), at the price of up to this much CPU after each
  /// burst of work. Only with one io thread (`threads` 1, the default): with more, one of them
  /// sleeps in the reactor anyway and wakes for every event. Parked threads (BusyPoll) do not
  /// spin; 0: never. Default: default_idle_spin().
  std::chrono::microseconds idle_spin = default_idle_spin();
  /// Each transport's own options, by the name it is registered under: tcp::TcpOptions under
  /// "TCP" (ferry/tcp/options.h), rdma::RdmaOptions under "RDMA" (ferry/rdma/options.h), a user
  /// transport's own type under its name. The core never looks inside: it hands each transport's
  /// factory its entry (register_transport); a transport with no entry gets its type's defaults.
  /// Set them with transport_options_for().
  std::map<std::string, std::any, std::less<>> transport_options;

  /// Transport `name`'s entry in transport_options as a T, made T{} first when there is none.
  /// Throws std::bad_any_cast when the entry holds another type.
  template <typename T>
  T& transport_options_for(std::string_view name) {
    auto it = transport_options.find(name);
    if (it == transport_options.end()) it = transport_options.emplace(std::string(name), T{}).first;
    return std::any_cast<T&>(it->second);
  }
  /// Transport `name`'s entry in transport_options as a T, or T{} when there is none. Throws
  /// std::bad_any_cast when the entry holds another type.
  template <typename T>
  T transport_options_for(std::string_view name) const {
    auto it = transport_options.find(name);
    return it == transport_options.end() ? T{} : std::any_cast<const T&>(it->second);
  }

  /// The defaults with what the environment sets: the one place ferry reads its $FERRY_*
  /// variables ($FERRY_LOG aside, read once per process by the log). $FERRY_TRANSPORT,
  /// $FERRY_SECRET, $FERRY_TLS_CERT / _KEY / _CA (TlsOptions::from_environment()) and
  /// $FERRY_POOL_BYTES, $FERRY_POOL_POPULATE_THREADS and $FERRY_IO_SPIN_US set the core's fields;
  /// each transport registered now that reads variables of its own (register_transport's
  /// `from_environment`) gets its entry in transport_options from them ($FERRY_TCP_CONGESTION,
  /// $FERRY_RDMA_GRANTS). A value that cannot be used is logged and the default kept. Any thread.
  static ContextOptions from_environment();
  /// A quarter of physical memory, at most 2 GiB.
  static size_t default_pool_bytes();
  /// 50 us where this process may run on 4 cores or more (usable_cores()), else 0: with fewer,
  /// a spinning io thread takes the core its peer on the same machine needs.
  static std::chrono::microseconds default_idle_spin();
};

struct Stats;  // ferry/net/stats.h

/// What the receive pool (ContextOptions::pool_bytes) holds and has done; Context::pool_stats().
struct PoolStats {
  uint64_t held_bytes = 0;       ///< bytes of regions mapped now
  uint64_t in_use_bytes = 0;     ///< bytes of live blocks (at their size-class size)
  uint64_t hits = 0;             ///< allocations served from memory already held
  uint64_t misses = 0;           ///< allocations that mapped a new region or grew a free one
  uint64_t fallbacks = 0;        ///< allocations served with plain memory (cap reached, or no pool)
  uint64_t fallback_bytes = 0;   ///< bytes those asked for, in total
  uint64_t regions_created = 0;  ///< regions mapped so far
  uint64_t regions_trimmed = 0;  ///< regions given back to the system so far
};

/// How put() stores one object; the defaults suit most objects.
struct PutOptions {
  std::string transport;   ///< the transport preferred for it ("" = the best both sides share)
  bool exclusive = false;  ///< only `transport` may move it: other fetches get an error
  bool copy = false;       ///< copy the bytes into the store instead of referencing them
  /// Computes each tensor's CRC-32C here, on the calling thread (one pass over the bytes, about
  /// as fast as copying them where the CPU has a crc32 instruction), and puts it in the ref
  /// (TensorMeta::checksum): every fetch of the object then checks what landed against it and
  /// fails with errc::data_corrupted on a difference (FetchOptions::verify). The memory must then
  /// not change while the object may be fetched; a fetch after a change fails. A fetch by name
  /// (ObjectRef::named) knows only the metas its caller gives, so it checks nothing.
  bool checksum = false;
  /// The allocation the tensors are views of, when the caller knows it: one memory registration
  /// then serves every object inside it (10,000 views of one buffer cost one ibv_reg_mr).
  std::span<const std::byte> region;
  /// A name peers can fetch it by (ObjectRef::named), even before it is put: their fetches wait
  /// on this side until it is. Unique among this context's live objects (a taken name is
  /// errc::invalid_argument); freed when the object is collected.
  std::string name;
  /// Runs on a thread running the context (an io thread, or a Context::BusyPoll holder) each time
  /// a serve of this object has ended well on this side: the transport is done with the bytes
  /// (over TCP they are all written to the data socket; over RDMA the fetcher's release says its
  /// reads succeeded), so a caller that reuses the memory once every expected serve has run is
  /// safe. Over TCP written bytes can still be lost with the connection: the fetcher then fails
  /// (its fetch of an object collected meanwhile cannot be made again). Asks for no
  /// acknowledgement: it costs no message. Also runs, late, for a serve that failed on this side
  /// when the fetcher then confirms every byte (over RDMA: its release saying the reads succeeded
  /// arrives after this side's queue pair broke). Not for failed or aborted serves (the fetcher
  /// fetches those again: the object must stay until it has). Must not block (the
  /// collectives count their offers' sends with it: a call ends when its sends are done, as an
  /// MPI send completes).
  std::function<void()> on_sent;
  /// Runs like on_sent, after it, each time a fetch of this object has been served: once the
  /// fetcher has every byte (over TCP its acknowledgement, a message on the metadata channel the
  /// fetcher sends only for objects with this hook; over RDMA its release saying the reads
  /// succeeded). Also runs, late, when the fetcher confirms every byte of a serve that failed on
  /// this side (the data channel broke after the last write). Not for failed or aborted serves.
  /// Must not block.
  std::function<void()> on_served;
};

/// The root of ferry in a process (see this file's comment): its io threads run every connection,
/// its store holds what it put, its transports move the bytes, and its listener takes peers in. Not
/// copyable; the application owns it (directly, or through create()). Its methods may be called
/// from any thread unless their comment says otherwise.
class Context {
 public:
  /// Starts `options.threads` threads running the io_context and instantiates the transports,
  /// each with its entry of options.transport_options. Reads nothing from the environment: pass
  /// ContextOptions::from_environment() for $FERRY_*. Throws std::system_error for options naming
  /// an unknown transport (use create() to get a Result instead).
  explicit Context(ContextOptions options = {});
  /// As the constructor, but reports what it would throw as an error (logged with the reason):
  /// errc::transport_unknown for an unknown transport in `options.transports`, and the error of a
  /// TLS file that cannot be loaded.
  static Result<std::unique_ptr<Context>> create(ContextOptions options = {});
  /// close(), then joins the threads. Destroyed on one of its io threads (by a completion
  /// handler), it closes and a thread of its own joins them once that handler has returned.
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  /// Listens for peers on "host:port" (port 0 = any). Returns the bound port. Refs made by put()
  /// name this address as their owner (set advertise_address() when peers must use another).
  Result<uint16_t> listen(std::string_view host_port);
  /// The address refs name as their owner: the advertise address if set, else the listen address (a
  /// wildcard host replaced by this host's name); "" before listen(). Any thread.
  std::string address() const;
  /// Makes refs put from now on name `host_port` as their owner instead of the listen address (for
  /// peers behind NAT, a proxy or another interface). Not checked; any thread.
  void set_advertise_address(std::string host_port);

  /// Connects to a peer's listener: TCP connect, Hello / HelloAnswer (transport negotiation),
  /// data channel set up. Completes with void(boost::system::error_code, Peer) on the context's
  /// executor, never inline; bounded by connect_timeout + handshake_timeout. close() ends a
  /// connect in progress at once with errc::context_closed, and a connect on a closed context
  /// completes with it through the system executor (the context's loop has stopped).
  template <typename Token>
  auto async_connect(std::string address, Token&& token) {
    return boost::asio::async_initiate<Token, void(boost::system::error_code, Peer)>(
        [impl = impl_](auto handler, std::string address) {
          start_connect(impl, std::move(address), ConnectHandler(std::move(handler)));
        },
        token, std::move(address));
  }
  /// Blocking convenience: async_connect, waited with the connect and handshake timeouts.
  /// Not from an io_context thread.
  Result<Peer> connect(std::string address);

  /// Puts tensors into the store and returns their ref (one local reference held by this side;
  /// drop it with release()). The memory `owner` keeps alive must not change until collection.
  /// Refs name this context's listen (or advertise) address as their owner: listen() first.
  Result<ObjectRef> put(std::vector<Tensor> tensors, std::shared_ptr<void> owner = nullptr,
                        PutOptions options = {});
  /// `bytes` of memory from the receive pool (ContextOptions::pool_bytes), 64-byte aligned,
  /// contents unspecified: fetch into it (already registered with every RDMA device, so a fetch
  /// registers nothing) or put() it (pass the pointer as `owner`). It returns to the pool when the
  /// last reference goes, from any thread, also after the Context is gone. Beyond the pool's cap it
  /// is plain memory (PoolStats::fallbacks). errc::resource_exhausted when no memory can be had
  /// (more than the machine has, or the system refuses). Any thread.
  Result<std::shared_ptr<std::byte[]>> allocate(size_t bytes);
  /// The receive pool's gauges and counters. Any thread.
  PoolStats pool_stats() const;

  /// Drops the local reference put() gave; collection follows when no peer holds the object.
  bool release(const ObjectRef& ref);
  /// Aborts every fetch of `ref`'s object this context is serving now: each fetcher's fetch fails
  /// with errc::aborted ("owner ... aborted serving object N"). Over TCP the owner stops sending at
  /// once; over RDMA the fetcher stops posting READs, and the grant ends once the posted ones have
  /// drained (or the lease expires), so the memory stays valid under them. Fetches that arrive
  /// later are served as usual: release() the object as well to refuse them (release first, then
  /// abort, leaves no window). Returns false (and does nothing) for a ref this context did not
  /// put. Any thread; returns at once, the fetchers hear of it within one round trip.
  bool abort_serving(const ObjectRef& ref);
  /// Refs of every object in the store.
  std::vector<ObjectRef> refs() const;
  /// The local store: what this context serves. Lives as long as the Context.
  ObjectStore& store();

  /// Names of the transports this context instantiated, best first.
  std::vector<std::string> transports() const;
  /// The instance of transport `name`, or null when this context has none by that name. Any thread.
  std::shared_ptr<TransportManager> transport(std::string_view name) const;

  /// Number of connected peers (both directions).
  size_t peer_count() const;
  /// How many peer connections negotiated each transport since the context started.
  std::map<std::string, uint64_t> transport_counts() const;
  /// What this context has done since it started (ferry/net/stats.h): fetches and serves, bytes and
  /// errors by code, fetch latency, connections, the receive pool. A snapshot; any thread.
  Stats stats() const;

  /// The io_context its threads run: post work there to run beside ferry's handlers (never block in
  /// it).
  boost::asio::io_context& io_context();
  /// The options it was made with (threads raised to at least 1).
  const ContextOptions& options() const;
  /// A random non-zero id of this Context, new for each one: refs carry it
  /// (ObjectRef::owner_instance), so refs to an earlier instance at the same address are refused
  /// (errc::stale_ref).
  uint64_t instance() const;

  /// Stops listening, closes every peer (their pending fetches fail with context_closed), stops
  /// the io_context and joins its threads. Idempotent; any thread. On an io_context thread (a
  /// completion handler) it closes but cannot join: the next close() from another thread, or the
  /// destructor, does.
  void close();

  struct Impl;

  /// While one is held, the holder's thread runs the context instead of its io threads, which
  /// park: the holder calls poll() between its own checks, so a message is handled by the thread
  /// that waits for it as soon as it arrives, with no wake-up (tens of microseconds on a virtual
  /// machine whose idle CPUs halt) and no hand-off between threads (Open MPI's progress engine
  /// works so). For latency-bound stretches: the collectives hold one during each call
  /// (GroupOptions::busy_wait). Contract: the holder calls poll() at least every few
  /// milliseconds and never blocks on anything that needs the context (FetchRequest::wait, a
  /// future of a fetch) while it holds one, or nothing of this context progresses meanwhile
  /// (other threads' fetches included); completion handlers, user callbacks among them, run on the
  /// holder's thread. Several holders (threads) may poll at once. Move-only; any thread but an io
  /// thread.
  ///
  /// `linger`: when the last holder lets go, the io threads stay parked for up to this long more
  /// (0: they resume at once), so that a holder that takes another BusyPoll soon (back-to-back
  /// collective calls) finds them parked and wakes nothing: no thread leaves the reactor or
  /// returns to it per call. Meanwhile nothing runs the context: a fetch another thread waits for
  /// is delayed up to `linger`. close() ends it at once.
  class BusyPoll {
   public:
    BusyPoll() = default;
    /// Starts holding `ctx`: its io threads park (they finish the handler they are in) and the
    /// calling thread runs it through poll(); `linger` as above.
    explicit BusyPoll(Context& ctx, std::chrono::microseconds linger = {});
    ~BusyPoll();
    /// Takes over `other`'s hold; `other` is left empty.
    BusyPoll(BusyPoll&& other) noexcept : impl_(std::move(other.impl_)), linger_(other.linger_) {}
    /// Ends this one's hold (with its linger), then takes over `other`'s.
    BusyPoll& operator=(BusyPoll&& other) noexcept;
    /// Whether it holds a context (false when default-constructed or moved from).
    explicit operator bool() const { return impl_ != nullptr; }
    /// Ends what earlier holders' linger left: io threads parked only for a linger resume now (a
    /// caller about to wait for them: a collective call that does not poll). Threads parked for a
    /// live holder stay parked. Any thread but an io thread.
    static void resume(Context& ctx);

    /// Runs the context's ready handlers on the calling thread (reading its sockets first); returns
    /// how many ran (0: nothing was ready, or this one is empty). Never blocks. An exception from a
    /// handler is logged, as on the io threads. The holder's thread.
    size_t poll();
    /// Like poll(), but when nothing is ready blocks in the context's reactor until a handler has
    /// run or `timeout` has passed (the thread sleeps meanwhile: its core is free for others).
    /// Returns how many ran. The holder's thread.
    size_t poll_or_wait(std::chrono::microseconds timeout);

   private:
    void end();
    std::shared_ptr<Impl> impl_;
    std::chrono::microseconds linger_{};
  };

 private:
  using ConnectHandler = boost::asio::any_completion_handler<void(boost::system::error_code, Peer)>;
  static void start_connect(std::shared_ptr<Impl> impl, std::string address,
                            ConnectHandler handler);
  std::shared_ptr<Impl> impl_;
};

}  // namespace ferry
