// Context::Impl (internal): the state behind a Context, shared with its sessions.
#pragma once

#include <atomic>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>

#include <vector>
#include "ferry/store/object_store.h"

#include <array>
#include <boost/asio/steady_timer.hpp>

#include "ferry/mem/pool.h"
#include "ferry/net/connection/dialer.h"
#include "ferry/net/connection/greeter.h"
#include "ferry/net/connection/meta_stream.h"
#include "ferry/net/context.h"
#include "ferry/net/loop_gate.h"
#include "ferry/net/security/tls.h"
#include "ferry/net/stats.h"

namespace ferry {

class Session;

namespace detail {

// Held by a thread around a post to the context's loop whose work must complete (see
// Context::Impl::drained). Hold it only for the post itself: close() waits for it.
class PostGate {
 public:
  explicit PostGate(Context::Impl& impl);
  ~PostGate();
  PostGate(const PostGate&) = delete;
  PostGate& operator=(const PostGate&) = delete;
  // Whether work posted to the loop while this gate is held will run. When it is not, the
  // caller completes the operation itself, off the loop (errc::context_closed).
  bool open() const { return open_; }
  // Where an operation's completion is posted: the context's loop while the gate is open, the
  // system executor otherwise (never inline either way).
  boost::asio::any_io_executor completion_executor() const;

 private:
  Context::Impl& impl_;
  bool open_;
};

}  // namespace detail

struct Context::Impl : std::enable_shared_from_this<Context::Impl> {
  explicit Impl(ContextOptions opts);

  ContextOptions options;
  TlsContexts tls;  // from options.tls
  boost::asio::io_context io;
  std::optional<boost::asio::executor_work_guard<boost::asio::io_context::executor_type>> work;
  std::vector<std::thread> threads;
  ObjectStore store;
  // The receive pool (ContextOptions::pool_bytes); shared with the transports (TransportEnv) and
  // kept alive by every block it handed out.
  std::shared_ptr<mem::Pool> pool;
  // Gives the pool's idle regions back every pool_idle_trim / 2 (at least every 100 ms, at most
  // every 10 s); cancelled by close(), under mu.
  boost::asio::steady_timer pool_timer{io};
  void arm_pool_trim();
  using TransportList = std::vector<std::shared_ptr<TransportManager>>;
  // The transports instantiated so far, best first. Replaced (never changed in place) when a
  // transport registered later is added; read it through transport_list().
  std::shared_ptr<const TransportList> transports_ = std::make_shared<TransportList>();
  mutable std::mutex transports_mu;
  // The same transports, held weakly, for the store's garbage-collection hook: it tells each
  // one still alive of every object collected, also once this Impl is gone (a transport may
  // outlive its Context holding pins, and its garbage_collect must still run). Updated with
  // transports_.
  struct GcTransports {
    std::mutex mu;
    std::vector<std::weak_ptr<TransportManager>> list;
  };
  const std::shared_ptr<GcTransports> gc_transports = std::make_shared<GcTransports>();
  std::vector<std::string> tried;  // registry entries already instantiated or refused
  uint64_t registry_listener = 0;

  std::shared_ptr<const TransportList> transport_list() const;
  // Instantiates registry entries this context has not tried yet (all wanted ones, or those in
  // options.transports). Returns true when one was added. `strict`: a failure throws.
  bool add_registered_transports(bool strict);
  // Tells every open peer this side's transports (after one was added).
  void broadcast_capabilities();
  // Forgets the name of object `id`, collected. Any thread.
  void forget_name(ObjectId id);
  const uint64_t instance;

  std::mutex mu;
  std::optional<boost::asio::ip::tcp::acceptor> acceptor;
  std::string listen_address;
  std::string advertise_address;
  // Named objects (PutOptions::name) and the sessions with fetches waiting for a name; under mu.
  std::unordered_map<std::string, ObjectId> names;
  std::unordered_map<ObjectId, std::string> name_of;
  std::unordered_multimap<std::string, std::weak_ptr<Session>> name_waiters;
  // The object named `name`, or 0 after registering `waiter` to hear of it (Session::on_named).
  ObjectId find_or_wait_name(const std::string& name, const std::shared_ptr<Session>& waiter);
  // Forgets one wait of `waiter` for `name` (its request was cancelled or expired, or its session
  // ended), and any wait whose session is gone: waits never outlive their requests.
  void forget_name_wait(const std::string& name, const Session* waiter);
  // Binds `name` to `id` and wakes its waiters; false if the name is taken.
  bool bind_name(const std::string& name, ObjectId id);
  std::unordered_map<uint64_t, std::weak_ptr<Session>> sessions;  // by local id
  std::atomic<uint64_t> next_session_id{1};
  std::atomic<bool> closed{false};
  std::atomic<bool> closing_done{false};  // close() has closed the sessions and let go of `work`
  std::atomic<bool> joined{false};        // a close() from outside the loop stops and joins it
  // Once close() has closed the sessions: waits (at most 5 s) for the loop to run out of work,
  // stops it, joins the io threads and runs the loop one last time with the gates closed. Not
  // on an io thread; the first call does it, later ones return at once.
  void stop_and_join();
  // Work posted to the loop from outside it (a Peer's fetches and requests, a connect's answer)
  // must run, or its caller must learn that it will not: close() sets `drained` once the io
  // threads have stopped, waits until no PostGate is held, and then runs the loop one last time.
  // A post made under an open gate therefore runs in that last run; a gate taken later is closed.
  std::atomic<bool> drained{false};
  std::atomic<int> posting{0};     // PostGates held
  std::atomic<int> busy_polls{0};  // Context::BusyPoll held
  // What PostGate is for the Peer's callers, this is for threads of the transports' own, which
  // may post after close (a handler queued then would hold the context alive in a loop that never
  // runs again): closed with `drained`, before the last run. Shared with the transports
  // (TransportEnv) and the fetches.
  std::shared_ptr<LoopGate> loop_gate = std::make_shared<LoopGate>();
  // While a BusyPoll is held, and until `linger_until` after the last one ended (BusyPoll's
  // linger), the io threads park here (the holders run the io_context); notified when the last
  // holder without linger ends, when park_slice shrinks, and on close. `parked` (under
  // park_mu): io threads parked.
  std::mutex park_mu;
  std::condition_variable park_cv;
  int parked = 0;
  std::atomic<std::chrono::steady_clock::rep> linger_until{0};  // steady_clock ticks
  // How long a parked io thread sleeps at a time while a BusyPoll is held: the shortest linger
  // any holder has had (1 ms at least; 1 s while none had one). A holder that ends with linger
  // notifies no one, and a thread that went to sleep before that end wakes by the end's
  // linger_until, so the wait is never longer than the linger; shorter slices only wake the
  // thread more often on a core the holders keep busy.
  std::atomic<std::chrono::steady_clock::rep> park_slice{
      std::chrono::steady_clock::duration(std::chrono::seconds(1)).count()};
  std::chrono::steady_clock::time_point linger_end() const {
    return std::chrono::steady_clock::time_point(
        std::chrono::steady_clock::duration(linger_until.load()));
  }
  void park_while_busy();
  // After a handler ran on the io thread: polls the io_context for up to options.idle_spin more
  // (from the last handler that ran), parking instead if a BusyPoll is taken meanwhile. Returns
  // at once when idle_spin is 0 or there is more than one io thread. The io thread.
  void spin_while_idle();
  void unpark();
  std::map<std::string, uint64_t> negotiated;  // under mu
  // Context::stats()'s counters (fetches count themselves through FetchState).
  std::shared_ptr<detail::StatsRecorder> stats = std::make_shared<detail::StatsRecorder>();

  // Counts the transport a new peer connection chose and says so once, loudly when it is not
  // the best this side has (the peer, or the route to it, lacks it).
  void note_negotiated(const PeerInfo& peer, const std::string& transport);

  std::shared_ptr<TransportManager> find_transport(std::string_view name) const;
  std::vector<TransportInfo> local_infos() const;
  std::string owner_address();
  ObjectRef make_ref(const StoredObject& object);

  // Dials through async_dial (ferry/net/connection/dialer.h), keeping its canceller while it
  // runs: close() cancels every dial in progress, whose handler then runs with errc::aborted, so
  // that neither a connect nor a side connection outlives the context's loop. Any thread.
  void dial(boost::asio::any_io_executor executor, HostPort target, DialOptions options,
            DialHandler done);
  std::map<uint64_t, std::function<void()>> dials;  // in progress, by id (null while starting)
  uint64_t next_dial = 0;                           // under mu, as `dials`
  // Adds a session to those close() ends; false (and nothing added) once close() has begun.
  bool add_session(const std::shared_ptr<Session>& s);
  void remove_session(uint64_t local_id);
  std::shared_ptr<Session> find_session(uint64_t local_id);
  // Every session still alive (a snapshot, taken under mu).
  std::vector<std::shared_ptr<Session>> live_sessions();

  // What the connections that have not said who they are yet may buffer
  // (ferry/net/connection/greeter.h).
  std::shared_ptr<GreetingBudget> greeting_budget = std::make_shared<GreetingBudget>();
  // Accepts the next connection. After a failed accept (out of file descriptors: EMFILE, ENFILE,
  // ENOBUFS) it waits kAcceptRetry before trying again, instead of spinning on a listen queue it
  // cannot empty; the first failure of a run is logged, and the count when accepting works again.
  void accept_next();
  static constexpr std::chrono::milliseconds kAcceptRetry{50};
  boost::asio::steady_timer accept_retry{io};  // under mu
  uint64_t accept_failures = 0;                // in a row; under mu
  // Greets a new connection (ferry/net/connection/greeter.h); its first frame says what it is: a
  // Hello (a peer) or an AttachChannel (a data channel of an existing session).
  void on_accepted(boost::asio::ip::tcp::socket socket);
  void on_first_frame(const std::shared_ptr<Greeting>& g);
};

}  // namespace ferry
