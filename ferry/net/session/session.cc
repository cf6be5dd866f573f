#include "ferry/net/session/session.h"

#include <algorithm>
#include <boost/asio/post.hpp>

#include "ferry/net/connection/dialer.h"
#include "ferry/net/core/guard.h"
#include "ferry/net/errors.h"
#include "ferry/net/log.h"
#include "ferry/net/proto/wire_convert.h"
#include "ferry/net/security/auth.h"
#include "ferry/net/system/socket_util.h"

namespace ferry {
namespace asio = boost::asio;

Session::Session(std::shared_ptr<Context::Impl> ctx, MetaStream stream, bool initiator,
                 std::string address)
    : ctx_(std::move(ctx)),
      local_id_(ctx_->next_session_id++),
      strand_(asio::make_strand(ctx_->io)),
      control_(
          *this, strand_, ctx_->io, std::move(stream),
          ControlStream::Options{
              std::min(kMaxHandshakeFrameBytes, ctx_->options.max_frame_bytes),
              ctx_->options.max_frame_bytes, ctx_->options.max_queued_control_bytes,
              ctx_->options.heartbeat_interval, ctx_->options.peer_timeout, ctx_->greeting_budget}),
      handshake_(*this, Handshake::Options{initiator, ctx_->options.name, ctx_->options.secret,
                                           ctx_->instance, local_id_}),
      handshake_timer_(ctx_->io),
      drain_timer_(ctx_->io),
      deadline_timer_(ctx_->io),
      fetches_(*this, *ctx_->pool),
      serves_(
          *this, ctx_->store, *ctx_->stats,
          ServeTable::Options{ctx_->options.name, ctx_->instance,
                              ctx_->options.max_requests_per_peer, ctx_->options.lease_timeout}),
      channels_(*this) {
  info_.address = std::move(address);
  info_.initiator = initiator;
  next_request_id_ = initiator ? 1 : 2;
  boost::system::error_code ignored;
  control_.socket().set_option(tcp::no_delay(true), ignored);
  auto local = control_.socket().local_endpoint(ignored);
  if (!ignored) info_.local_ip = local.address().to_string();
  auto remote = control_.socket().remote_endpoint(ignored);
  if (!ignored) info_.remote_ip = remote.address().to_string();
}

Session::~Session() {
  // A close whose quiet wait never ran (the loop stopped first) still completes every fetch.
  fetches_.close(close_reason_ ? close_reason_ : std::error_code(errc::peer_closed));
}

std::string Session::chosen_transport() const { return handshake_.chosen(); }

bool Session::chosen_combines() const {
  const auto t = ctx_->find_transport(handshake_.chosen());
  return t && t->combines();
}

// ---------------------------------------------------------------- handshake

void Session::start_client(std::string requested_transport,
                           std::function<void(std::error_code)> done) {
  on_ready_ = std::move(done);
  const auto hello = handshake_.hello(requested_transport);
  handshake_timer_.expires_after(ctx_->options.handshake_timeout);
  handshake_timer_.async_wait(on_expiry(*this, [this] {
    if (state_ == State::handshaking) do_close(errc::handshake_failed);
  }));
  send(hello);
  control_.start();
}

void Session::start_server(const wire::Hello& hello) {
  control_.start();
  handshake_.on_hello(hello);
  if (handshake_.step() == Handshake::Step::proof_awaited) {
    // Bounded: the peer's proof comes before anything else, or the session ends.
    handshake_timer_.expires_after(ctx_->options.handshake_timeout);
    handshake_timer_.async_wait(on_expiry(*this, [this] {
      if (state_ == State::handshaking) do_close(errc::auth_failed);
    }));
  }
}

void Session::set_peer(Handshake::Peer peer) {
  std::lock_guard lock(info_mu_);
  info_.name = std::move(peer.name);
  info_.session_id = peer.session_id;
  for (auto& t : peer.transports) info_.transports.push_back(std::move(t));
  token_ = std::move(peer.token);
  peer_instance_ = peer.instance;
}

void Session::opened(std::error_code ec) {
  handshake_timer_.cancel();
  if (!ec && state_ == State::handshaking) {
    state_ = State::open;
    control_.open();
    ctx_->note_negotiated(info_, handshake_.chosen());
  }
  if (ec) do_close(ec);
  if (auto done = std::move(on_ready_)) done(ec ? ec : close_reason_);
}

// ---------------------------------------------------------------- the connection, dispatch

void Session::on_end(std::error_code ec, bool peer_eof) {
  if (peer_eof && state_ == State::open && fetches_.awaits_peer_bytes()) {
    // A peer that ends right after sending (a collective rank leaving after its last call)
    // closes this connection and its data channel alike: what it wrote before is still
    // delivered on the data channel, ahead of that channel's end.
    state_ = State::draining;
    control_.drain();
    FERRY_LOG_DEBUG("peer '{}' closed its connection; draining its data channel", info_.name);
    drain_timer_.expires_after(kDrainBound);
    drain_timer_.async_wait(on_expiry(*this, [this] { do_close(errc::peer_closed); }));
    return;
  }
  do_close(ec);
}

std::error_code Session::dispatch(const wire::Envelope& env) {
  const uint64_t rid = env.request_id();
  // The acceptor opens its session before its answer leaves, so while this side (the initiator)
  // still sets up its data channel the acceptor may already ping it, or announce a transport it
  // registered: both are what an open session answers.
  const bool answered =
      state_ == State::handshaking && info_.initiator && !handshake_.chosen().empty();
  const bool liveness = env.has_ping() || env.has_pong() || env.has_capabilities();
  if (state_ == State::handshaking && !(answered && liveness)) {
    // After the answer, the chosen transport sets up its channel with its own messages.
    if (env.has_transport_message() && answered) {
      const auto& m = env.transport_message();
      if (auto t = ctx_->find_transport(m.transport())) {
        deliver_transport_message(*t, rid, m.payload());
        return {};
      }
    }
    return handshake_.on_envelope(env);
  }
  switch (env.body_case()) {
    case wire::Envelope::kFetch:
      serves_.serve(rid, env.fetch());
      return {};
    case wire::Envelope::kCancel:
      serves_.cancel(rid);
      return {};
    case wire::Envelope::kError:
      handle_error(rid, env.error());
      return {};
    case wire::Envelope::kAddRef:
      handle_ref(rid, env.add_ref().object_id(), true);
      return {};
    case wire::Envelope::kReleaseRef:
      handle_ref(rid, env.release_ref().object_id(), false);
      return {};
    case wire::Envelope::kListObjects:
      handle_list(rid);
      return {};
    case wire::Envelope::kAck:
    case wire::Envelope::kObjectList:
      finish_rpc(rid, {}, env);
      return {};
    case wire::Envelope::kPing: {
      wire::Envelope pong;
      pong.mutable_pong()->set_nonce(env.ping().nonce());
      send(pong);
      return {};
    }
    case wire::Envelope::kPong:
      return {};
    case wire::Envelope::kCapabilities: {
      if (!within_wire_limits(env.capabilities().transports())) return errc::protocol_error;
      std::vector<TransportInfo> transports;
      for (const auto& t : env.capabilities().transports()) transports.push_back(from_wire(t));
      std::lock_guard lock(info_mu_);
      info_.transports = std::move(transports);
      return {};
    }
    case wire::Envelope::kTransportMessage: {
      const auto& m = env.transport_message();
      if (auto t = ctx_->find_transport(m.transport())) {
        deliver_transport_message(*t, rid, m.payload());
      } else {
        send_error(rid, errc::transport_unknown, "no transport '" + m.transport() + "'", false);
      }
      return {};
    }
    case wire::Envelope::kHello:
    case wire::Envelope::kHelloAnswer:
    case wire::Envelope::kAttachChannel:
    case wire::Envelope::kAuth:
      return errc::protocol_error;  // only valid as a connection's first frames
    case wire::Envelope::BODY_NOT_SET:
      break;
  }
  // A well-formed frame with a message this version does not know: say so, keep serving.
  send_error(rid, errc::unknown_message, "unknown message type", false);
  return {};
}

// ---------------------------------------------------------------- owner side

void Session::settle(uint64_t request_id) { serves_.settle(request_id); }

void Session::on_named(const std::string& name) {
  asio::post(guarded(*this, [this, name] { serves_.on_named(name); }));
}

void Session::abort_serving(ObjectId object) {
  asio::post(guarded(*this, [this, object] { serves_.abort_object(object); }));
}

ObjectId Session::wait_for_name(const std::string& name) {
  return ctx_->find_or_wait_name(name, shared_from_this());
}

void Session::forget_name_wait(const std::string& name) { ctx_->forget_name_wait(name, this); }

void Session::handle_ref(uint64_t rid, ObjectId id, bool add) {
  bool ok = add ? ctx_->store.add_remote_ref(id, local_id_)
                : ctx_->store.release_remote_ref(id, local_id_);
  if (!ok) {
    send_error(rid, errc::object_not_found,
               add ? "object " + std::to_string(id) + " not found"
                   : "no reference to object " + std::to_string(id) + " held by this peer",
               false);
    return;
  }
  wire::Envelope env;
  env.set_request_id(rid);
  env.mutable_ack();
  send(env);
}

void Session::handle_list(uint64_t rid) {
  wire::Envelope env;
  env.set_request_id(rid);
  auto* list = env.mutable_object_list();
  for (ObjectId id : ctx_->store.ids()) {
    if (auto object = ctx_->store.find(id)) to_wire(ctx_->make_ref(*object), *list->add_refs());
  }
  send(env);
}

void Session::handle_error(uint64_t rid, const wire::Error& err) {
  auto ec = error_from_wire(err.code());
  if (rid != 0 && fetches_.contains(rid)) {
    FERRY_LOG_INFO("fetch {} from '{}' failed: {} ({})", rid, info_.name, err.message(),
                   ec.message());
    complete_fetch(rid, ec);
    return;
  }
  if (rid != 0 && rpcs_.count(rid)) {
    finish_rpc(rid, ec, wire::Envelope{});
    return;
  }
  if (rid != 0 && !err.fatal()) {
    // A late answer to a request that already ended here (aborted, timed out): nothing to do.
    FERRY_LOG_INFO("peer '{}': late error for request {}: {}", info_.name, rid, err.message());
    return;
  }
  FERRY_LOG_WARN("peer '{}' ({}) reports: {} ({})", info_.name, info_.address, err.message(),
                 ec.message());
  if (err.fatal()) do_close(ec);
}

void Session::finish_rpc(uint64_t rid, std::error_code ec, const wire::Envelope& env) {
  auto it = rpcs_.find(rid);
  if (it == rpcs_.end()) return;
  auto done = std::move(it->second.done);
  if (it->second.timer) it->second.timer->cancel();
  rpcs_.erase(it);
  done(ec, env);
}

bool Session::context_closed() const { return ctx_->closed.load(); }

// ---------------------------------------------------------------- fetcher side

FetchRequest Session::fetch(ObjectRef ref, std::vector<MutableBuffer> targets, FetchOptions options,
                            FetchHandler handler) {
  const uint64_t id = next_request_id_.fetch_add(2);
  // Taken here, on the caller's thread, while other fetches run: a new region's page faults then
  // run beside the io thread, which goes on receiving them. With none running, the strand takes
  // it, after the last completion has let its memory go (so a fetch-and-drop loop reuses it).
  std::shared_ptr<std::byte[]> storage;
  if (targets.empty() && ctx_->stats->fetches_in_flight() > 0) {
    storage = FetchTable::allocate_slots(*ctx_->pool, ref, targets);
  }
  // Held until the post: should close() have run the loop for the last time, the fetch fails
  // here and completes through the system executor (as a closed Peer's fetches do).
  detail::PostGate gate(*ctx_);
  auto state = std::make_shared<detail::FetchState>(
      id, gate.completion_executor(), options.wait_spin.value_or(ctx_->options.idle_spin),
      ctx_->loop_gate);
  state->set_stats(ctx_->stats, Clock::now());
  if (handler) state->set_handler(std::move(handler));
  if (!gate.open()) {
    state->complete(errc::context_closed);
    return FetchRequest(state);
  }
  state->set_abort_hook([weak = weak_from_this(), weak_state = std::weak_ptr(state), id] {
    auto self = weak.lock();
    if (!self) {
      if (auto s = weak_state.lock()) s->complete(errc::aborted);
      return;
    }
    asio::post(self->strand_, [self, weak_state, id] { self->fetches_.abort(id, weak_state); });
  });
  asio::post(strand_,
             [self = shared_from_this(), state, ref = std::move(ref), targets = std::move(targets),
              storage = std::move(storage), options = std::move(options)]() mutable {
               try {
                 self->do_fetch(state, std::move(ref), std::move(targets), std::move(storage),
                                std::move(options));
               } catch (const std::bad_alloc&) {
                 // Out of memory for the fetch's bookkeeping: it still completes, exactly once.
                 self->fetches_.fail(*state, errc::resource_exhausted);
               }
             });
  return FetchRequest(state);
}

std::shared_ptr<TransportManager> Session::pick_transport(const std::string& requested,
                                                          const std::string& ref_transport,
                                                          std::error_code& ec) const {
  if (!requested.empty() && requested != "auto") {
    auto t = ctx_->find_transport(requested);
    if (!t) {
      ec = errc::transport_unknown;
      return nullptr;
    }
    if (!t->peer_has_transport(info_)) {
      ec = errc::transport_unavailable;
      return nullptr;
    }
    return t;
  }
  if (!ref_transport.empty()) {
    auto t = ctx_->find_transport(ref_transport);
    if (t && t->peer_has_transport(info_)) return t;
    // The object prefers a transport these two sides do not share: say so, once per peer.
    if (fallback_logged_.insert(ref_transport).second) {
      FERRY_LOG_WARN("peer '{}': objects that prefer {} fall back to {} ({} side lacks it)",
                     info_.name, ref_transport, handshake_.chosen(), t ? "the peer's" : "this");
    }
  }
  // The best transport both sides have now (one registered after connecting counts), among
  // those with a channel or that this side can open one for.
  for (const auto& t : *ctx_->transport_list()) {  // best first
    if (t->peer_has_transport(info_) &&
        (info_.initiator || channel(t->name()) || state_ == State::handshaking)) {
      return t;
    }
  }
  if (!handshake_.chosen().empty()) return ctx_->find_transport(handshake_.chosen());
  ec = errc::transport_unavailable;
  return nullptr;
}

std::shared_ptr<TransportManager> Session::fallback_transport(
    const TransportManager& failed) const {
  for (const auto& t : *ctx_->transport_list()) {  // best first
    if (t.get() != &failed && t->peer_has_transport(info_)) return t;
  }
  return nullptr;
}

void Session::do_fetch(std::shared_ptr<detail::FetchState> state, ObjectRef ref,
                       std::vector<MutableBuffer> targets, std::shared_ptr<std::byte[]> storage,
                       FetchOptions options) {
  if (state_ != State::open) {
    state->complete(close_reason_ ? close_reason_ : std::error_code(errc::peer_closed));
    return;
  }
  if (ref.owner_instance != 0 && peer_instance_ != 0 && ref.owner_instance != peer_instance_) {
    state->complete(errc::stale_ref);
    return;
  }
  fetches_.start(std::move(state), std::move(ref), std::move(targets), std::move(storage),
                 std::move(options));
}

void Session::restart_fetch(uint64_t request_id, std::error_code ec, uint64_t landed) {
  fetches_.restart(request_id, ec, landed);
}

void Session::complete_fetch(uint64_t request_id, std::error_code ec) {
  fetches_.complete(request_id, ec);
}

void Session::fetch_completed() {
  if (state_ == State::draining && !fetches_.awaits_peer_bytes()) {
    // Not from inside the channel's handler that completed it: it may go on reading.
    asio::post(guarded(*this, [this] { do_close(errc::peer_closed); }));
  }
}

void Session::post(std::function<void()> fn) {
  asio::post(strand_, [self = shared_from_this(), fn = std::move(fn)] {
    try {
      fn();
    } catch (const std::bad_alloc&) {
      // As guarded() does: work stopped halfway would wait for good; the session ends instead,
      // failing what it holds.
      if (!self->closed()) self->out_of_memory();
    }
  });
}

void Session::arm_deadline(Clock::time_point at) {
  if (at >= deadline_armed_ || state_ == State::closed) return;
  deadline_armed_ = at;
  deadline_timer_.expires_at(at);  // a wait armed for later ends as cancelled
  deadline_timer_.async_wait(on_expiry(*this, [this] { on_deadline(); }));
}

void Session::deliver_transport_message(TransportManager& transport, uint64_t rid,
                                        std::string_view payload) {
  // Held here: the channel may drop itself while it handles the message.
  if (auto channel = channels_.find(transport.name());
      channel && channel->on_message(rid, payload)) {
    return;
  }
  transport.on_transport_message(*this, rid, payload);
}

void Session::on_deadline() {
  deadline_armed_ = Clock::time_point::max();
  if (state_ == State::closed) return;
  const auto now = Clock::now();
  fetches_.expire(now);
  serves_.expire(now);
  // Whatever is left is due later (completing the due ones may have started more).
  const auto next = std::min(fetches_.next_deadline(), serves_.next_deadline());
  if (next != Clock::time_point::max()) arm_deadline(next);
}

void Session::ensure_channel(const std::shared_ptr<TransportManager>& transport,
                             std::function<void(std::error_code)> done) {
  channels_.ensure(transport, std::move(done));
}

bool Session::install_channel(std::string_view transport,
                              std::shared_ptr<TransportChannel> channel) {
  return channels_.install(transport, std::move(channel));
}

void Session::drop_channel(std::string_view transport, std::error_code ec) {
  channels_.drop(transport, ec);
}

std::shared_ptr<TransportChannel> Session::channel(std::string_view transport) const {
  return channels_.find(transport);
}

void Session::attach_side_connection(const std::string& transport_name, tcp::socket socket) {
  auto transport = ctx_->find_transport(transport_name);
  if (state_ != State::open || !transport || channel(transport_name)) {
    boost::system::error_code ignored;
    socket.close(ignored);
    return;
  }
  std::shared_ptr<TransportChannel> ch;
  if (auto ec = transport->accept_side_connection(shared_from_this(), std::move(socket), ch)) {
    FERRY_LOG_WARN("peer '{}': {} refused its data channel: {}", info_.name, transport_name,
                   ec.message());
    return;
  }
  channels_.install(transport_name, std::move(ch));  // none is: checked above
}

bool Session::accept_attach(const wire::AttachChannel& attach) {
  // The context found this session by attach.session_id().
  const auto expected =
      auth::attach_proof(token_, attach.session_id(), attach.attach_seq(), attach.transport());
  // The proof first: a frame without it must not use up an attach number.
  return auth::same(expected, attach.proof()) && attach_window_.accept(attach.attach_seq());
}

void Session::async_open_side_connection(std::string_view transport_name,
                                         SideConnectionHandler done) {
  boost::system::error_code err;
  auto endpoint = control_.socket().remote_endpoint(err);
  if (err || !info_.initiator) {
    done(err ? std::error_code(err) : std::error_code(errc::invalid_argument),
         tcp::socket(ctx_->io));
    return;
  }
  wire::Envelope env;
  auto* attach = env.mutable_attach_channel();
  attach->set_session_id(info_.session_id);
  attach->set_attach_seq(++attach_seq_);
  attach->set_transport(std::string(transport_name));
  attach->set_proof(auth::attach_proof(token_, info_.session_id, attach_seq_, transport_name));
  DialOptions dial;
  dial.deadline = ctx_->options.connect_timeout;
  dial.first_frame = encode_frame(env);
  ctx_->dial(strand_, {endpoint.address().to_string(), std::to_string(endpoint.port())},
             std::move(dial),
             [self = shared_from_this(), done = std::move(done)](Result<Dialed> dialed) {
               if (!dialed) {
                 // Cancelled by the context's close: say so, as every other fetch then does.
                 const std::error_code ec =
                     self->ctx_->closed ? std::error_code(errc::context_closed) : dialed.error();
                 return done(ec, tcp::socket(self->ctx_->io));
               }
               if (!dialed->answer.has_ack()) {
                 return done(errc::protocol_error, tcp::socket(self->ctx_->io));
               }
               done({}, dialed->stream.release_plain());
             });
}

// ---------------------------------------------------------------- control requests

void Session::rpc(wire::Envelope request, std::chrono::milliseconds timeout, RpcHandler done) {
  const uint64_t id = next_request_id_.fetch_add(2);
  request.set_request_id(id);
  detail::PostGate gate(*ctx_);
  if (!gate.open()) return done(errc::context_closed, {});
  asio::post(strand_, [self = shared_from_this(), id, request = std::move(request), timeout,
                       done = std::move(done)]() mutable {
    if (self->state_ != State::open) {
      done(self->close_reason_ ? self->close_reason_ : std::error_code(errc::peer_closed), {});
      return;
    }
    PendingRpc pending{std::move(done), std::make_unique<asio::steady_timer>(self->ctx_->io)};
    pending.timer->expires_after(timeout);
    pending.timer->async_wait(
        on_expiry(*self, [s = self.get(), id] { s->finish_rpc(id, errc::timed_out, {}); }));
    self->rpcs_.emplace(id, std::move(pending));
    self->send(request);
  });
}

void Session::send(const wire::Envelope& env) { control_.send(env); }

void Session::send_error(uint64_t rid, std::error_code ec, const std::string& message, bool fatal) {
  control_.send_error(rid, ec, message, fatal);
}

// ---------------------------------------------------------------- liveness and closing

void Session::fail(std::error_code ec) { do_close(ec); }

void Session::out_of_memory() {
  FERRY_LOG_ERROR("peer '{}': out of memory handling its session; closing it", info_.name);
  do_close(errc::resource_exhausted);
}

void Session::send_transport_message(std::string_view transport, uint64_t request_id,
                                     std::string payload) {
  wire::Envelope env;
  env.set_request_id(request_id);
  auto* m = env.mutable_transport_message();
  m->set_transport(std::string(transport));
  m->set_payload(std::move(payload));
  send(env);
}

void Session::announce_transports() {
  asio::post(guarded(*this, [this] {
    if (state_ != State::open) return;
    wire::Envelope env;
    auto* caps = env.mutable_capabilities();
    for (const auto& t : ctx_->local_infos()) to_wire(t, *caps->add_transports());
    send(env);
  }));
}

PeerInfo Session::info_snapshot() const {
  std::lock_guard lock(info_mu_);
  return info_;
}

void Session::close(std::error_code ec) {
  asio::post(guarded(*this, [this, ec] { do_close(ec); }));
}

void Session::do_close(std::error_code ec) {
  if (state_ == State::closed) return;
  const bool was_open = state_ == State::open || state_ == State::draining;
  state_ = State::closed;
  close_reason_ = ec ? ec : std::error_code(errc::peer_closed);
  if (was_open) {
    FERRY_LOG_INFO("peer '{}' ({}) closed: {}", info_.name, info_.address, close_reason_.message());
  }
  handshake_timer_.cancel();
  drain_timer_.cancel();
  deadline_timer_.cancel();
  control_.close();
  // Channels first: they drop their hold on every target buffer and pinned object.
  serves_.close();
  channels_.close(close_reason_);
  close_fetches_when_quiet();
  auto rpcs = std::move(rpcs_);
  rpcs_.clear();
  for (auto& [id, pending] : rpcs) {
    if (pending.timer) pending.timer->cancel();
    pending.done(close_reason_, {});
  }
  ctx_->store.release_holder(local_id_);
  ctx_->remove_session(local_id_);
  if (auto done = std::move(on_ready_)) done(close_reason_);
}

void Session::close_fetches_when_quiet() {
  // Each transport says when none of its channels to the peer can still write into a target
  // (TransportManager::when_quiet): inline for most, later for a queue pair that had READs
  // posted. The fetches complete after the last, so their callers get their targets back then.
  auto transports = ctx_->transport_list();
  auto left = std::make_shared<size_t>(transports->size() + 1);
  auto self = shared_from_this();
  const auto one_quiet = [self, left] {
    if (--*left == 0) self->fetches_.close(self->close_reason_);
  };
  for (const auto& t : *transports) t->when_quiet(*this, one_quiet);
  one_quiet();
}

}  // namespace ferry
