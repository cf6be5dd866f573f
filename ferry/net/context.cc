#include "ferry/net/context.h"

#include <algorithm>
#include <boost/asio/ip/host_name.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/system_executor.hpp>
#include <boost/asio/write.hpp>
#include <cctype>
#include <cstdlib>
#include <future>
#include <random>

#include <sched.h>

#include "ferry/net/address.h"
#include "ferry/net/completion.h"
#include "ferry/net/connection/dialer.h"
#include "ferry/net/connection/greeter.h"
#include "ferry/net/core/context_impl.h"
#include "ferry/net/errors.h"
#include "ferry/net/log.h"
#include "ferry/net/proto/wire_convert.h"
#include "ferry/net/registry.h"
#include "ferry/net/security/auth.h"
#include "ferry/net/security/tls.h"
#include "ferry/net/session/session.h"
#include "ferry/net/system/cpus.h"
#include "ferry/net/system/env.h"
#include "ferry/net/system/socket_util.h"
#include "ferry/net/system/system_memory.h"
#include "ferry/net/system/thread_name.h"
#include "ferry/store/checksum.h"

namespace ferry {
namespace asio = boost::asio;
using tcp = asio::ip::tcp;

namespace {

uint64_t random_instance() {
  std::random_device rd;
  uint64_t v = 0;
  while (v == 0) v = (uint64_t{rd()} << 32) ^ rd();
  return v;
}

// TransportManager::garbage_collect for `object`, collected, on each transport in `gc` that is
// alive and collects it: its own, or every one when it has none, and each that served it.
void tell_transports(Context::Impl::GcTransports& gc, const StoredObject& object) {
  std::vector<std::shared_ptr<TransportManager>> alive;
  {
    std::lock_guard lock(gc.mu);
    for (const auto& w : gc.list) {
      if (auto t = w.lock()) alive.push_back(std::move(t));
    }
  }
  const auto& over = object.served_over;
  for (const auto& t : alive) {
    if (object.transport.empty() || t->name() == object.transport ||
        std::find(over.begin(), over.end(), t->name()) != over.end()) {
      t->garbage_collect(object);
    }
  }
}

}  // namespace

// ---------------------------------------------------------------- Impl

detail::PostGate::PostGate(Context::Impl& impl) : impl_(impl) {
  // Sequentially consistent, as close()'s store of `drained` and load of `posting`: either
  // close() sees this gate and waits for it, or this gate sees `drained`.
  impl_.posting.fetch_add(1);
  open_ = !impl_.drained.load();
}

detail::PostGate::~PostGate() { impl_.posting.fetch_sub(1); }

asio::any_io_executor detail::PostGate::completion_executor() const {
  if (open_) return impl_.io.get_executor();
  return asio::system_executor();
}

Context::Impl::Impl(ContextOptions opts) : options(std::move(opts)), instance(random_instance()) {
  auth::init();
  if (options.threads < 1) options.threads = 1;
  pool = std::make_shared<mem::Pool>(
      mem::PoolOptions{options.pool_bytes, options.pool_idle_trim, options.pool_populate_threads});
  tls = make_tls_contexts(options.tls);
  add_registered_transports(true);
  for (const auto& name : options.transports) {
    if (!find_transport(name)) {
      throw std::system_error(make_error_code(errc::transport_unknown),
                              "transport '" + name + "' is not registered");
    }
  }
}

void Context::Impl::forget_name(ObjectId id) {
  std::lock_guard lock(mu);
  if (auto it = name_of.find(id); it != name_of.end()) {
    names.erase(it->second);
    name_of.erase(it);
  }
}

ObjectId Context::Impl::find_or_wait_name(const std::string& name,
                                          const std::shared_ptr<Session>& waiter) {
  std::lock_guard lock(mu);
  if (auto it = names.find(name); it != names.end()) return it->second;
  name_waiters.emplace(name, waiter);
  return 0;
}

void Context::Impl::forget_name_wait(const std::string& name, const Session* waiter) {
  std::lock_guard lock(mu);
  auto [b, e] = name_waiters.equal_range(name);
  bool forgotten = false;
  for (auto it = b; it != e;) {
    const auto session = it->second.lock();
    if (!session || (!forgotten && session.get() == waiter)) {
      forgotten = forgotten || session;
      it = name_waiters.erase(it);
    } else {
      ++it;
    }
  }
}

bool Context::Impl::bind_name(const std::string& name, ObjectId id) {
  std::vector<std::shared_ptr<Session>> wake;
  {
    std::lock_guard lock(mu);
    if (!names.emplace(name, id).second) return false;
    name_of[id] = name;
    auto [b, e] = name_waiters.equal_range(name);
    for (auto it = b; it != e; ++it) {
      if (auto s = it->second.lock()) wake.push_back(std::move(s));
    }
    name_waiters.erase(b, e);
  }
  for (auto& s : wake) s->on_named(name);
  return true;
}

std::shared_ptr<const Context::Impl::TransportList> Context::Impl::transport_list() const {
  std::lock_guard lock(transports_mu);
  return transports_;
}

bool Context::Impl::add_registered_transports(bool strict) {
  std::lock_guard lock(transports_mu);
  auto list = std::make_shared<TransportList>(*transports_);
  bool added = false;
  for (auto& entry : detail::registry_snapshot()) {
    const bool wanted = options.transports.empty() ||
                        std::find(options.transports.begin(), options.transports.end(),
                                  entry.name) != options.transports.end();
    if (!wanted || std::find(tried.begin(), tried.end(), entry.name) != tried.end()) continue;
    tried.push_back(entry.name);
    const auto own = options.transport_options.find(entry.name);
    static const std::any kNone;
    auto made = entry.factory(TransportEnv{
        io, store, options, own == options.transport_options.end() ? kNone : own->second, pool,
        loop_gate});
    if (!made) {
      if (strict && !options.transports.empty()) throw std::system_error(made.error(), entry.name);
      FERRY_LOG_INFO("transport {} not available here: {}", entry.name, made.error().message());
      continue;
    }
    list->push_back(std::move(made.value()));
    added = true;
  }
  if (!added) return false;
  std::stable_sort(list->begin(), list->end(), [](const auto& a, const auto& b) {
    return a->local_info().priority > b->local_info().priority;
  });
  transports_ = std::move(list);
  std::lock_guard gc_lock(gc_transports->mu);
  gc_transports->list.assign(transports_->begin(), transports_->end());
  return true;
}

void Context::Impl::broadcast_capabilities() {
  for (auto& s : live_sessions()) s->announce_transports();
}

std::shared_ptr<TransportManager> Context::Impl::find_transport(std::string_view name) const {
  for (const auto& t : *transport_list()) {
    if (t->name() == name) return t;
  }
  return nullptr;
}

std::vector<TransportInfo> Context::Impl::local_infos() const {
  std::vector<TransportInfo> out;
  for (const auto& t : *transport_list()) out.push_back(t->local_info());
  return out;
}

std::string Context::Impl::owner_address() {
  std::lock_guard lock(mu);
  return advertise_address.empty() ? listen_address : advertise_address;
}

ObjectRef Context::Impl::make_ref(const StoredObject& object) {
  ObjectRef ref;
  ref.owner = owner_address();
  ref.object_id = object.id;
  ref.owner_instance = instance;
  ref.metadata.transport = object.transport;
  ref.metadata.extension = object.extension;
  ref.metadata.exclusive = object.exclusive;
  for (const auto& t : object.tensors) ref.metadata.tensors.push_back(t.meta);
  return ref;
}

void Context::Impl::note_negotiated(const PeerInfo& peer, const std::string& transport) {
  {
    std::lock_guard lock(mu);
    ++negotiated[transport];
  }
  // The best transport this side has for the peer: one that reaches only this host does not
  // count for a peer elsewhere.
  std::shared_ptr<TransportManager> best;
  for (const auto& t : *transport_list()) {
    if (t->reaches_other_hosts() || t->peer_has_transport(peer)) {
      best = t;
      break;
    }
  }
  if (!best || transport == best->name()) {
    FERRY_LOG_INFO("peer '{}' ({}): using {}", peer.name, peer.address, transport);
  } else if (best->peer_has_transport(peer)) {
    // Both sides have it, and the handshake settled on another (asked for, or the acceptor's
    // order): this side's fetches still pick their transport by its own order.
    FERRY_LOG_INFO("peer '{}' ({}): using {} for the connection ({} is available too)", peer.name,
                   peer.address, transport, best->name());
  } else {
    FERRY_LOG_WARN("peer '{}' ({}): using {}; {} is not available to both sides over {} -> {}",
                   peer.name, peer.address, transport, best->name(), peer.local_ip, peer.remote_ip);
  }
}

bool Context::Impl::add_session(const std::shared_ptr<Session>& s) {
  // Under mu, as close() takes its snapshot: a session added before it is closed by it, and one
  // after it sees `closed` set.
  std::lock_guard lock(mu);
  if (closed) return false;
  sessions[s->local_id()] = s;
  return true;
}

void Context::Impl::dial(asio::any_io_executor executor, HostPort target, DialOptions options,
                         DialHandler done) {
  uint64_t id = 0;
  {
    std::unique_lock lock(mu);
    if (closed) {
      // The loop may have stopped: nothing is started or posted, and the handler runs here (it
      // says the context closed).
      lock.unlock();
      done(errc::aborted);
      return;
    }
    id = ++next_dial;
    dials.emplace(id, nullptr);  // before it starts: its handler may run before this returns
  }
  auto cancel = async_dial(
      io, std::move(executor), std::move(target), std::move(options),
      [self = shared_from_this(), id, done = std::move(done)](Result<Dialed> dialed) mutable {
        {
          std::lock_guard lock(self->mu);
          self->dials.erase(id);
        }
        done(std::move(dialed));
      });
  std::unique_lock lock(mu);
  auto it = dials.find(id);
  if (closed) {
    // close() began meanwhile and may have passed over this dial's empty entry: cancel it here
    // (a no-op for a dial that has ended).
    if (it != dials.end()) dials.erase(it);
    lock.unlock();
    cancel();
    return;
  }
  if (it != dials.end()) it->second = std::move(cancel);  // else: over already
}

void Context::Impl::remove_session(uint64_t local_id) {
  std::lock_guard lock(mu);
  sessions.erase(local_id);
}

std::shared_ptr<Session> Context::Impl::find_session(uint64_t local_id) {
  std::lock_guard lock(mu);
  auto it = sessions.find(local_id);
  return it == sessions.end() ? nullptr : it->second.lock();
}

std::vector<std::shared_ptr<Session>> Context::Impl::live_sessions() {
  std::vector<std::shared_ptr<Session>> out;
  std::lock_guard lock(mu);
  for (auto& [id, weak] : sessions) {
    if (auto s = weak.lock()) out.push_back(std::move(s));
  }
  return out;
}

void Context::Impl::accept_next() {
  std::lock_guard lock(mu);
  if (!acceptor || closed) return;
  acceptor->async_accept([self = shared_from_this()](boost::system::error_code ec,
                                                     tcp::socket socket) {
    if (ec == asio::error::operation_aborted || self->closed) return;
    if (!ec) {
      uint64_t failed = 0;
      {
        std::lock_guard lock(self->mu);
        failed = std::exchange(self->accept_failures, 0);
      }
      if (failed) FERRY_LOG_WARN("accepting again after {} failed accepts", failed);
      self->on_accepted(std::move(socket));
      return self->accept_next();
    }
    std::lock_guard lock(self->mu);
    if (!self->acceptor || self->closed) return;
    if (self->accept_failures++ == 0) {
      FERRY_LOG_WARN("accept failed: {}; retrying every {} ms", ec.message(), kAcceptRetry.count());
    }
    self->accept_retry.expires_after(kAcceptRetry);
    self->accept_retry.async_wait([self](boost::system::error_code tec) {
      if (!tec) self->accept_next();
    });
  });
}

void Context::Impl::on_accepted(tcp::socket socket) {
  GreetOptions greet;
  greet.tls = tls.server.get();
  greet.deadline = options.handshake_timeout;
  greet.max_frame_bytes = std::min(kMaxHandshakeFrameBytes, options.max_frame_bytes);
  greet.budget = greeting_budget;
  async_greet(
      std::move(socket), std::move(greet),
      [self = shared_from_this()](std::shared_ptr<Greeting> g) { self->on_first_frame(g); });
}

void Context::Impl::on_first_frame(const std::shared_ptr<Greeting>& g) {
  auto self = shared_from_this();
  const wire::Envelope& env = g->frame();
  if (closed) return g->reject(errc::context_closed, "shutting down");
  if (env.has_hello()) {
    if (options.tls.enabled() && !g->is_tls()) {
      return g->reject(errc::tls_required,
                       "this server accepts peers only over TLS (its ContextOptions::tls is set)");
    }
    if (!within_wire_limits(env.hello().transports())) {
      return g->reject(errc::protocol_error, "Hello lists too many transports or devices");
    }
    auto session = std::make_shared<Session>(self, g->take(), false, g->peer());
    if (!add_session(session)) return;  // closing: the connection ends with the session
    asio::post(session->strand(), [session, hello = env.hello()] { session->start_server(hello); });
    return;
  }
  if (env.has_attach_channel()) {
    const auto& a = env.attach_channel();
    auto session = find_session(a.session_id());
    if (!session || session->info().initiator || !session->is_open() ||
        !session->accept_attach(a)) {
      return g->reject(errc::handshake_failed, "unknown session, bad proof or a replayed attach");
    }
    if (g->is_tls()) {
      return g->reject(errc::protocol_error, "data channels are plain TCP, not TLS");
    }
    if (!find_transport(a.transport())) {
      return g->reject(errc::transport_unknown, "no transport '" + a.transport() + "'");
    }
    // On the session's strand, the Ack and then the attach: the peer fetches as soon as it
    // reads the Ack, and its Fetch, handled on the same strand, must find the channel.
    asio::post(session->strand(),
               [session, stream = g->take(), transport = a.transport()]() mutable {
                 wire::Envelope ack;
                 ack.mutable_ack();
                 // The socket is fresh and the frame tiny: this write completes at once.
                 boost::system::error_code wec;
                 asio::write(stream.socket(), asio::buffer(encode_frame(ack)), wec);
                 if (wec) return stream.close();
                 session->attach_side_connection(transport, stream.release_plain());
               });
    return;
  }
  g->reject(errc::protocol_error, "expected Hello or AttachChannel as the first frame");
}

// ---------------------------------------------------------------- Context

size_t ContextOptions::default_pool_bytes() {
  return std::min<uint64_t>(uint64_t{2} << 30, physical_memory_bytes() / 4);
}

std::chrono::microseconds ContextOptions::default_idle_spin() {
  return std::chrono::microseconds(usable_cores() >= 4 ? 50 : 0);
}

namespace {

// $FERRY_TRANSPORT: "auto" when unset; "rdma", "tcp" and "cma" in any case name the built-ins.
std::string transport_from_environment() {
  const std::string v = env_text("FERRY_TRANSPORT");
  if (v.empty()) return "auto";
  std::string upper;
  for (char c : v) upper.push_back(static_cast<char>(std::toupper(static_cast<unsigned char>(c))));
  if (upper == "AUTO") return "auto";
  if (upper == "RDMA" || upper == "TCP" || upper == "CMA") return upper;
  return v;
}

// $FERRY_POOL_BYTES (mem::pool_cap_from_env: digits with an optional K, M or G), else `fallback`;
// a value that is not a byte count is logged.
size_t pool_bytes_from_environment(size_t fallback) {
  const std::string v = env_text("FERRY_POOL_BYTES");
  const size_t bytes = mem::pool_cap_from_env(fallback);
  if (!v.empty() && bytes == fallback && v != std::to_string(fallback)) {
    FERRY_LOG_WARN("FERRY_POOL_BYTES={} is not a byte count (such as 1073741824 or 1G): {} bytes",
                   v, fallback);
  }
  return bytes;
}

}  // namespace

ContextOptions ContextOptions::from_environment() {
  ContextOptions o;
  o.transport = transport_from_environment();
  o.secret = env_text("FERRY_SECRET");
  o.tls = TlsOptions::from_environment();
  o.pool_bytes = pool_bytes_from_environment(o.pool_bytes);
  o.pool_populate_threads = static_cast<unsigned>(
      env_integer("FERRY_POOL_POPULATE_THREADS", 1, 256, o.pool_populate_threads));
  o.idle_spin = std::chrono::microseconds(
      env_integer("FERRY_IO_SPIN_US", 0, 10000, default_idle_spin().count()));
  for (const auto& entry : detail::registry_snapshot()) {
    if (entry.from_environment) o.transport_options[entry.name] = entry.from_environment();
  }
  return o;
}

void Context::Impl::arm_pool_trim() {
  const auto period = std::clamp<std::chrono::milliseconds>(
      options.pool_idle_trim / 2, std::chrono::milliseconds(100), std::chrono::milliseconds(10000));
  std::lock_guard lock(mu);
  if (closed) return;
  pool_timer.expires_after(period);
  pool_timer.async_wait([weak = weak_from_this()](boost::system::error_code ec) {
    auto self = weak.lock();
    if (ec || !self) return;
    self->pool->trim();
    self->arm_pool_trim();
  });
}

Result<std::shared_ptr<std::byte[]>> Context::allocate(size_t bytes) {
  if (bytes > physical_memory_bytes()) return errc::resource_exhausted;
  auto block = impl_->pool->allocate(bytes);
  if (!block) return errc::resource_exhausted;
  return block;
}

PoolStats Context::pool_stats() const {
  const auto c = impl_->pool->counters();
  return {c.held_bytes,     c.in_use_bytes,    c.hits,           c.misses, c.fallbacks,
          c.fallback_bytes, c.regions_created, c.regions_trimmed};
}

Context::Context(ContextOptions options) : impl_(std::make_shared<Impl>(std::move(options))) {
  // A pin can outlive the Impl (a transport instance may outlive its Context and hold one): the
  // hook reaches the Impl only while it lives, and the transports (that live) through their own
  // list.
  impl_->store.set_gc_hook(
      [weak = std::weak_ptr<Impl>(impl_), gc = impl_->gc_transports](const StoredObject& object) {
        if (auto impl = weak.lock()) impl->forget_name(object.id);
        tell_transports(*gc, object);
      });
  // A transport registered later is instantiated here too, and peers hear of it.
  impl_->registry_listener = detail::add_registry_listener([weak = std::weak_ptr<Impl>(impl_)] {
    auto impl = weak.lock();
    if (impl && !impl->closed && impl->add_registered_transports(false)) {
      impl->broadcast_capabilities();
    }
  });
  impl_->work.emplace(asio::make_work_guard(impl_->io));
  impl_->arm_pool_trim();
  for (int i = 0; i < impl_->options.threads; ++i) {
    auto& thread = impl_->threads.emplace_back([impl = impl_.get()] {
      for (;;) {
        try {
          // Sleeps in the reactor between events (after idle_spin of polling); parks while a
          // BusyPoll's holder runs the loop.
          while (impl->io.run_one() > 0) {
            impl->park_while_busy();
            impl->spin_while_idle();
          }
          return;
        } catch (const std::exception& e) {
          FERRY_LOG_ERROR("exception escaped a completion handler: {}", e.what());
        }
      }
    });
    name_thread(thread, "ferry-io");
  }
}

Result<std::unique_ptr<Context>> Context::create(ContextOptions options) {
  try {
    return std::make_unique<Context>(std::move(options));
  } catch (const std::system_error& e) {
    // The code alone ("invalid argument") cannot say which setting is wrong; the text does.
    FERRY_LOG_ERROR("cannot create a context: {}", e.what());
    return e.code();
  }
}

void Context::Impl::park_while_busy() {
  using Clock = std::chrono::steady_clock;
  const auto lingering = [this] { return Clock::now() < linger_end(); };
  if (busy_polls.load() == 0 && !lingering()) return;
  std::unique_lock lock(park_mu);
  ++parked;
  while (!closed.load() && (busy_polls.load() > 0 || lingering())) {
    // Timed: a holder that lets go with linger does not notify (see park_slice).
    park_cv.wait_until(lock, busy_polls.load() > 0
                                 ? Clock::now() + Clock::duration(park_slice.load())
                                 : linger_end());
  }
  --parked;
}

void Context::Impl::spin_while_idle() {
  using Clock = std::chrono::steady_clock;
  if (options.idle_spin.count() <= 0 || options.threads != 1) return;
  auto until = Clock::now() + options.idle_spin;
  for (;;) {
    if (closed.load() || io.stopped()) return;
    if (busy_polls.load() > 0 || Clock::now() < linger_end()) {
      park_while_busy();
      return;
    }
    if (io.poll_one() > 0) {
      until = Clock::now() + options.idle_spin;
    } else if (Clock::now() >= until) {
      return;
    } else {
      sched_yield();  // a thread that needs this core (the peer, the application) gets it
    }
  }
}

void Context::Impl::unpark() {
  std::lock_guard lock(park_mu);
  park_cv.notify_all();
}

Context::BusyPoll::BusyPoll(Context& ctx, std::chrono::microseconds linger)
    : impl_(ctx.impl_), linger_(linger) {
  if (linger.count() > 0) {
    const auto slice =
        std::chrono::steady_clock::duration(
            std::max<std::chrono::microseconds>(linger, std::chrono::milliseconds(1)))
            .count();
    auto prev = impl_->park_slice.load();
    while (slice < prev && !impl_->park_slice.compare_exchange_weak(prev, slice)) {
    }
    if (slice < prev) impl_->unpark();  // a parked thread may sleep longer than this linger
  }
  // Wakes every io thread not parked yet (the one in the reactor and the idle ones), so that
  // each parks and leaves the reactor to the holder. Threads still parked from an earlier
  // holder's linger stay so (they check busy_polls under park_mu before they leave).
  if (impl_->busy_polls.fetch_add(1) == 0) {
    int parked;
    {
      std::lock_guard lock(impl_->park_mu);
      parked = impl_->parked;
    }
    for (size_t i = parked; i < impl_->threads.size(); ++i) asio::post(impl_->io, [] {});
  }
}

Context::BusyPoll::~BusyPoll() { end(); }

void Context::BusyPoll::resume(Context& ctx) {
  auto& impl = *ctx.impl_;
  if (impl.linger_until.load() == 0) return;
  impl.linger_until.store(0);
  impl.unpark();
}

void Context::BusyPoll::end() {
  if (!impl_) return;
  if (linger_.count() > 0) {
    const auto until = (std::chrono::steady_clock::now() + linger_).time_since_epoch().count();
    auto prev = impl_->linger_until.load();
    while (prev < until && !impl_->linger_until.compare_exchange_weak(prev, until)) {
    }
  }
  if (impl_->busy_polls.fetch_sub(1) == 1 && linger_.count() == 0) impl_->unpark();
  impl_.reset();
}

Context::BusyPoll& Context::BusyPoll::operator=(BusyPoll&& other) noexcept {
  if (this != &other) {
    end();
    impl_ = std::move(other.impl_);
    linger_ = other.linger_;
  }
  return *this;
}

size_t Context::BusyPoll::poll() { return poll_or_wait(std::chrono::microseconds(0)); }

size_t Context::BusyPoll::poll_or_wait(std::chrono::microseconds timeout) {
  if (!impl_) return 0;
  try {
    if (size_t n = impl_->io.poll(); n > 0 || timeout.count() <= 0) return n;
    return impl_->io.run_one_for(timeout);
  } catch (const std::exception& e) {
    FERRY_LOG_ERROR("exception escaped a completion handler: {}", e.what());
    return 1;
  }
}

Context::~Context() {
  close();
  if (impl_->io.get_executor().running_in_this_thread()) {
    // Destroyed by a completion handler (or a BusyPoll holder's poll): the loop can stop only
    // once this thread has left the handler, so a thread of its own waits for that, joins the
    // io threads and lets the Impl go (the io threads use it until they return).
    auto impl = std::move(impl_);
    try {
      std::thread closer([impl] { impl->stop_and_join(); });
      name_thread(closer, "ferry-close").detach();
    } catch (const std::system_error& e) {
      // Letting the Impl go here would destroy the loop this thread runs in: it stays.
      FERRY_LOG_ERROR("context '{}' destroyed on its io thread: no thread to join it ({})",
                      impl->options.name, e.what());
      new std::shared_ptr<Impl>(std::move(impl));
    }
    return;
  }
  impl_.reset();
}

void Context::close() {
  if (!impl_->closed.exchange(true)) {
    impl_->unpark();  // the io threads run the loop again, held BusyPolls or not
    detail::remove_registry_listener(impl_->registry_listener);
    {
      std::lock_guard lock(impl_->mu);
      if (impl_->acceptor) {
        boost::system::error_code ignored;
        impl_->acceptor->close(ignored);
      }
      impl_->accept_retry.cancel();
      impl_->pool_timer.cancel();
    }
    std::map<uint64_t, std::function<void()>> dials;
    {
      std::lock_guard lock(impl_->mu);
      dials.swap(impl_->dials);
    }
    for (auto& [id, cancel] : dials) {
      if (cancel) cancel();  // a null one is starting: it sees `closed` and cancels itself
    }
    auto sessions = impl_->live_sessions();
    for (auto& s : sessions) s->close(errc::context_closed);
    sessions.clear();
    impl_->work.reset();
    impl_->closing_done.store(true);
  }
  // From an io thread the loop cannot be joined: the next close() from outside it, or the
  // destructor (from outside it, or through a thread of its own), stops and joins it.
  if (impl_->io.get_executor().running_in_this_thread()) return;
  impl_->stop_and_join();
}

void Context::Impl::stop_and_join() {
  if (joined.exchange(true)) return;
  // After the sessions' closes are posted (by this call or one that runs on another thread and
  // never waits), so that the loop runs them.
  while (!closing_done.load()) std::this_thread::yield();
  // Closing sessions cancels their I/O, so the loop runs out of work; bounded all the same.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (!io.stopped() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (!io.stopped()) {
    FERRY_LOG_WARN("context '{}': work still pending 5 s after close; stopping the loop",
                   options.name);
  }
  io.stop();
  for (auto& t : threads) {
    if (t.joinable()) t.join();
  }
  // No post from outside lands after the run below: wait out those under way (each holds its
  // gate for one post), refuse later ones.
  drained.store(true);
  while (posting.load() > 0) std::this_thread::yield();
  loop_gate->close();
  // Run what is left (handlers of cancelled operations, work posted meanwhile) so nothing holds
  // a session and every operation has completed.
  io.restart();
  io.poll();
}

Result<uint16_t> Context::listen(std::string_view host_port) {
  auto hp = parse_host_port(host_port);
  if (!hp) return errc::invalid_argument;
  boost::system::error_code ec;
  tcp::resolver resolver(impl_->io);
  auto results = resolver.resolve(hp->host, hp->port, tcp::resolver::passive, ec);
  if (ec || results.empty()) return errc::invalid_argument;
  tcp::endpoint endpoint = results.begin()->endpoint();
  if (impl_->options.tls.enabled() && !impl_->tls.server) {
    FERRY_LOG_WARN(
        "listen: TLS is configured without a certificate and key: this context can "
        "connect over TLS but not accept");
    return errc::invalid_argument;
  }
  tcp::acceptor acceptor(impl_->io);
  acceptor.open(endpoint.protocol(), ec);
  if (!ec) close_on_exec(acceptor.native_handle());
  if (!ec) acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) acceptor.bind(endpoint, ec);
  if (!ec) acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) return std::error_code(ec);
  const uint16_t port = acceptor.local_endpoint().port();
  {
    std::lock_guard lock(impl_->mu);
    impl_->acceptor.emplace(std::move(acceptor));
    std::string host = hp->host;
    if (host == "0.0.0.0" || host == "::") host = asio::ip::host_name();
    impl_->listen_address = format_host_port(host, port);
  }
  impl_->accept_next();
  return port;
}

std::string Context::address() const { return impl_->owner_address(); }

void Context::set_advertise_address(std::string host_port) {
  std::lock_guard lock(impl_->mu);
  impl_->advertise_address = std::move(host_port);
}

void Context::start_connect(std::shared_ptr<Impl> impl, std::string address,
                            ConnectHandler handler) {
  auto io_ex = impl->io.get_executor();
  // Through the loop while it will still run; once close() has run it for the last time,
  // through the system executor, as a closed Peer's fetches complete.
  auto deliver = [impl](ConnectHandler h, std::error_code ec, Peer peer) {
    detail::PostGate gate(*impl);
    detail::post_completion(gate.completion_executor(), std::move(h), boost::system::error_code(ec),
                            std::move(peer));
  };
  auto hp = parse_host_port(address);
  if (!hp || impl->closed) {
    deliver(std::move(handler), impl->closed ? errc::context_closed : errc::invalid_argument, {});
    return;
  }
  if (impl->options.tls.enabled() && !impl->tls.client) {
    FERRY_LOG_WARN("TLS to {}: no CA configured to verify the server (TlsOptions::ca)", address);
    deliver(std::move(handler), errc::tls_failed, {});
    return;
  }
  auto pending = std::make_shared<ConnectHandler>(std::move(handler));
  DialOptions dial;
  dial.deadline = impl->options.connect_timeout;
  dial.tls = impl->options.tls.enabled() ? impl->tls.client.get() : nullptr;
  impl->dial(io_ex, std::move(*hp), std::move(dial),
             [impl, pending, deliver, address](Result<Dialed> dialed) {
               if (!dialed) {
                 const std::error_code ec = impl->closed ? errc::context_closed : dialed.error();
                 return deliver(std::move(*pending), ec, {});
               }
               auto session =
                   std::make_shared<Session>(impl, std::move(dialed->stream), true, address);
               if (!impl->add_session(session)) {
                 return deliver(std::move(*pending), errc::context_closed, {});
               }
               asio::post(session->strand(), [impl, pending, session, deliver] {
                 session->start_client(
                     impl->options.transport, [pending, session, deliver](std::error_code ec) {
                       deliver(std::move(*pending), ec, ec ? Peer() : Peer(session));
                     });
               });
             });
}

Result<Peer> Context::connect(std::string address) {
  // Shared with the handler: should the guard below give up first, the handler still has a
  // promise to complete.
  auto promise = std::make_shared<std::promise<std::pair<std::error_code, Peer>>>();
  auto future = promise->get_future();
  start_connect(impl_, std::move(address), [promise](boost::system::error_code ec, Peer peer) {
    promise->set_value({std::error_code(ec), std::move(peer)});
  });
  // Both phases carry their own deadlines; this one only guards against a bug.
  const auto limit =
      impl_->options.connect_timeout + impl_->options.handshake_timeout + std::chrono::seconds(5);
  if (future.wait_for(limit) != std::future_status::ready) return errc::timed_out;
  auto [ec, peer] = future.get();
  if (ec) return ec;
  return peer;
}

Result<ObjectRef> Context::put(std::vector<Tensor> tensors, std::shared_ptr<void> owner,
                               PutOptions options) {
  for (auto& t : tensors) {
    if (t.meta.nbytes == 0 && t.meta.shape.empty()) t.meta = TensorMeta::bytes(t.data.size());
    if (t.meta.nbytes != t.data.size()) return errc::size_mismatch;
    t.meta.checksum = options.checksum ? std::optional(crc32c(t.data)) : std::nullopt;
  }
  if (!options.transport.empty() && !impl_->find_transport(options.transport)) {
    return errc::transport_unknown;
  }
  auto& store = impl_->store;
  const ObjectId id = options.copy ? store.put_copy(tensors, options.transport)
                                   : store.put(std::move(tensors), std::move(owner),
                                               options.transport, {}, options.region);
  auto object = store.find(id);
  TransportMetadata md;
  for (const auto& t : *impl_->transport_list()) {
    if (!options.transport.empty() && t->name() != options.transport) continue;
    if (auto ec = t->extract_metadata(*object, md)) {
      store.release(id);
      return ec;
    }
  }
  if (!md.extension.empty()) store.set_extension(id, md.extension);
  if (options.on_sent || options.on_served) {
    store.set_serve_hooks(id, std::move(options.on_sent), std::move(options.on_served));
  }
  if (options.exclusive) {
    if (options.transport.empty()) {
      store.release(id);
      return errc::invalid_argument;  // exclusive to which transport?
    }
    store.set_exclusive(id);
  }
  if (!options.name.empty() && !impl_->bind_name(options.name, id)) {
    store.release(id);
    return errc::invalid_argument;  // the name is taken
  }
  return impl_->make_ref(*store.find(id));
}

bool Context::release(const ObjectRef& ref) {
  if (ref.owner_instance != impl_->instance) return false;
  return impl_->store.release(ref.object_id);
}

bool Context::abort_serving(const ObjectRef& ref) {
  if (ref.owner_instance != impl_->instance) return false;
  for (auto& s : impl_->live_sessions()) s->abort_serving(ref.object_id);
  return true;
}

std::vector<ObjectRef> Context::refs() const {
  std::vector<ObjectRef> out;
  for (ObjectId id : impl_->store.ids()) {
    if (auto object = impl_->store.find(id)) out.push_back(impl_->make_ref(*object));
  }
  return out;
}

ObjectStore& Context::store() { return impl_->store; }

std::vector<std::string> Context::transports() const {
  std::vector<std::string> out;
  for (const auto& t : *impl_->transport_list()) out.push_back(t->name());
  return out;
}

std::shared_ptr<TransportManager> Context::transport(std::string_view name) const {
  return impl_->find_transport(name);
}

size_t Context::peer_count() const {
  std::lock_guard lock(impl_->mu);
  size_t n = 0;
  for (const auto& [id, weak] : impl_->sessions) {
    if (auto s = weak.lock(); s && s->is_open()) ++n;
  }
  return n;
}

std::map<std::string, uint64_t> Context::transport_counts() const {
  std::lock_guard lock(impl_->mu);
  return impl_->negotiated;
}

Stats Context::stats() const {
  Stats s = impl_->stats->snapshot();
  s.connections_by_transport = transport_counts();
  s.peers = peer_count();
  s.pool = pool_stats();
  for (const auto& t : *impl_->transport_list()) {
    if (auto metrics = t->metrics(); !metrics.empty())
      s.transport_metrics[t->name()] = std::move(metrics);
  }
  return s;
}

boost::asio::io_context& Context::io_context() { return impl_->io; }
const ContextOptions& Context::options() const { return impl_->options; }
uint64_t Context::instance() const { return impl_->instance; }

}  // namespace ferry
