#include "ferry/net/session.h"

#include <algorithm>
#include <boost/asio/bind_executor.hpp>
#include <boost/asio/connect.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>
#include <random>

#include "ferry/net/auth.h"
#include "ferry/net/errors.h"
#include "ferry/net/log.h"
#include "ferry/net/socket_util.h"
#include "ferry/net/system_memory.h"
#include "ferry/net/wire_convert.h"

namespace ferry {
namespace asio = boost::asio;

namespace {

// One block of the receive pool with a 64-byte aligned slot of each of `sizes`, in order: the
// memory (which owns the slots) and the slots. Null, with nothing allocated, when the sizes add
// up to more than the machine's memory (a forged or corrupt ref: sizes up to 2^48 parse) or no
// memory can be had: the caller fails its fetch with errc::resource_exhausted. Never throws.
std::shared_ptr<std::byte[]> allocate_slots(mem::Pool& pool, const std::vector<size_t>& sizes,
                                            std::vector<MutableBuffer>& slots) noexcept {
  try {
    const uint64_t limit = physical_memory_bytes();
    uint64_t total = 0;
    std::vector<size_t> offsets;
    offsets.reserve(sizes.size());
    for (size_t n : sizes) {
      if (n > limit || total > limit - n) return nullptr;  // also keeps the sum from wrapping
      offsets.push_back(total);
      total += (n + 63) & ~size_t{63};
    }
    auto memory = pool.allocate(total);
    if (!memory) return nullptr;
    slots.clear();
    slots.reserve(sizes.size());
    for (size_t i = 0; i < sizes.size(); ++i) {
      slots.emplace_back(memory.get() + offsets[i], sizes[i]);
    }
    return memory;
  } catch (const std::bad_alloc&) {  // the bookkeeping itself
    return nullptr;
  }
}

std::string random_token() {
  std::random_device rd;
  std::string t(16, '\0');
  for (auto& c : t) c = static_cast<char>(rd() & 0xff);
  return t;
}

std::error_code from_wire_code(uint32_t code) {
  if (code == 0 || code > static_cast<uint32_t>(errc::context_closed)) return errc::protocol_error;
  return make_error_code(static_cast<errc>(code));
}

uint32_t to_wire_code(std::error_code ec) {
  if (ec.category() == ferry_category()) return static_cast<uint32_t>(ec.value());
  return static_cast<uint32_t>(errc::peer_closed);
}

}  // namespace

Session::Session(std::shared_ptr<Context::Impl> ctx, MetaStream stream, bool initiator,
                 std::string address)
    : ctx_(std::move(ctx)),
      local_id_(ctx_->next_session_id++),
      strand_(asio::make_strand(ctx_->io)),
      stream_(std::move(stream)),
      decoder_(std::min(kMaxHandshakeFrameBytes, ctx_->options.max_frame_bytes)),
      handshake_timer_(ctx_->io),
      heartbeat_timer_(ctx_->io),
      drain_timer_(ctx_->io),
      deadline_timer_(ctx_->io) {
  info_.address = std::move(address);
  info_.initiator = initiator;
  next_request_id_ = initiator ? 1 : 2;
  boost::system::error_code ignored;
  stream_.socket().set_option(tcp::no_delay(true), ignored);
  auto local = stream_.socket().local_endpoint(ignored);
  if (!ignored) info_.local_ip = local.address().to_string();
  auto remote = stream_.socket().remote_endpoint(ignored);
  if (!ignored) info_.remote_ip = remote.address().to_string();
}

Session::~Session() = default;

std::string Session::chosen_transport() const { return chosen_; }

bool Session::chosen_combines() const {
  const auto t = ctx_->find_transport(chosen_);
  return t && t->combines();
}

// ---------------------------------------------------------------- handshake

void Session::start_client(std::string requested_transport,
                           std::function<void(std::error_code)> done) {
  on_ready_ = std::move(done);
  wire::Envelope env;
  auto* hello = env.mutable_hello();
  hello->set_protocol_version(kProtocolVersion);
  hello->set_name(ctx_->options.name);
  hello->set_instance(ctx_->instance);
  if (requested_transport != "auto") hello->set_requested_transport(requested_transport);
  if (!ctx_->options.secret.empty()) {
    auth_ours_ = auth::nonce();
    hello->set_auth_nonce(auth_ours_);
  }
  for (const auto& t : ctx_->local_infos()) to_wire(t, *hello->add_transports());
  handshake_timer_.expires_after(ctx_->options.handshake_timeout);
  handshake_timer_.async_wait(
      asio::bind_executor(strand_, [self = shared_from_this()](boost::system::error_code ec) {
        if (!ec && self->state_ == State::handshaking) self->do_close(errc::handshake_failed);
      }));
  last_rx_ = Clock::now();
  send(env);
  start_reading();
}

void Session::start_server(const wire::Hello& hello) {
  last_rx_ = Clock::now();
  std::unique_lock info_lock(info_mu_);
  info_.name = hello.name();
  peer_instance_ = hello.instance();
  info_.session_id = local_id_;
  token_ = random_token();
  for (const auto& t : hello.transports()) info_.transports.push_back(from_wire(t));
  info_lock.unlock();
  start_reading();
  if (hello.protocol_version() != kProtocolVersion) {
    send_error(0, errc::version_mismatch,
               "protocol version " + std::to_string(hello.protocol_version()) +
                   " is not supported; this side speaks " + std::to_string(kProtocolVersion),
               true);
    return;
  }
  std::error_code ec;
  auto chosen = pick_transport(hello.requested_transport(), {}, ec);
  if (!chosen) {
    send_error(0, errc::transport_unavailable,
               hello.requested_transport().empty()
                   ? "no transport in common with peer '" + info_.name + "'"
                   : "transport '" + hello.requested_transport() + "' is not available on '" +
                         ctx_->options.name + "' for peer '" + info_.name + "'",
               true);
    return;
  }
  chosen_ = chosen->name();
  wire::Envelope env;
  auto* answer = env.mutable_hello_answer();
  answer->set_protocol_version(kProtocolVersion);
  answer->set_name(ctx_->options.name);
  answer->set_chosen_transport(chosen_);
  answer->set_session_id(local_id_);
  answer->set_session_token(token_);
  answer->set_instance(ctx_->instance);
  for (const auto& t : ctx_->local_infos()) to_wire(t, *answer->add_transports());
  const std::string& secret = ctx_->options.secret;
  if (!secret.empty()) {
    if (hello.auth_nonce().empty()) {
      send_error(0, errc::auth_failed, "'" + ctx_->options.name + "' requires a shared secret",
                 true);
      return;
    }
    // Prove we know the secret, then wait (bounded) for the peer's proof before anything else.
    auth_theirs_ = hello.auth_nonce();
    auth_ours_ = auth::nonce();
    answer->set_auth_nonce(auth_ours_);
    answer->set_auth_proof(auth::proof(secret, auth::kServerLabel, auth_theirs_, auth_ours_));
    send(env);
    handshake_timer_.expires_after(ctx_->options.handshake_timeout);
    handshake_timer_.async_wait(
        asio::bind_executor(strand_, [self = shared_from_this()](boost::system::error_code ec) {
          if (!ec && self->state_ == State::handshaking) self->do_close(errc::auth_failed);
        }));
  } else {
    // Open before the answer leaves: the initiator attaches its data channel as soon as it reads
    // the answer, and the acceptor checks that this session is open on another thread.
    open_server();
    send(env);
  }
}

void Session::open_server() {
  state_ = State::open;
  decoder_.set_max_frame_bytes(ctx_->options.max_frame_bytes);
  ctx_->note_negotiated(info_, chosen_);
  arm_heartbeat();
}

void Session::on_auth(const wire::Auth& msg) {
  const auto expected =
      auth::proof(ctx_->options.secret, auth::kClientLabel, auth_ours_, auth_theirs_);
  if (info_.initiator || ctx_->options.secret.empty() || !auth::same(msg.proof(), expected)) {
    FERRY_LOG_WARN("peer '{}' ({}) failed the shared-secret handshake", info_.name, info_.address);
    send_error(0, errc::auth_failed, "wrong shared secret", true);
    return;
  }
  handshake_timer_.cancel();
  wire::Envelope ack;
  ack.mutable_ack();
  open_server();  // before the Ack leaves, as in start_server()
  send(ack);
}

std::error_code Session::on_hello_answer(const wire::HelloAnswer& answer) {
  if (answer.protocol_version() != kProtocolVersion) return errc::version_mismatch;
  if (!within_wire_limits(answer.transports())) return errc::protocol_error;
  {
    std::lock_guard lock(info_mu_);
    info_.name = answer.name();
    info_.session_id = answer.session_id();
    for (const auto& t : answer.transports()) info_.transports.push_back(from_wire(t));
  }
  token_ = answer.session_token();
  peer_instance_ = answer.instance();
  auto transport = ctx_->find_transport(answer.chosen_transport());
  if (!transport) return errc::transport_unavailable;
  chosen_ = transport->name();
  const std::string& secret = ctx_->options.secret;
  if (!secret.empty()) {
    // Mutual: the acceptor proves it knows the secret before we prove it.
    const auto expected = auth::proof(secret, auth::kServerLabel, auth_ours_, answer.auth_nonce());
    if (answer.auth_proof().empty() || !auth::same(answer.auth_proof(), expected)) {
      FERRY_LOG_WARN("{} did not prove the shared secret", info_.address);
      do_close(errc::auth_failed);
      return {};
    }
    wire::Envelope env;
    env.mutable_auth()->set_proof(
        auth::proof(secret, auth::kClientLabel, answer.auth_nonce(), auth_ours_));
    send(env);
    awaiting_auth_ = transport;  // the acceptor's Ack continues in finish_handshake()
    return {};
  }
  finish_handshake(std::move(transport));
  return {};
}

void Session::finish_handshake(std::shared_ptr<TransportManager> transport) {
  ensure_channel(transport, [self = shared_from_this()](std::error_code ec) {
    self->handshake_timer_.cancel();
    if (!ec && self->state_ == State::handshaking) {
      self->state_ = State::open;
      self->decoder_.set_max_frame_bytes(self->ctx_->options.max_frame_bytes);
      self->arm_heartbeat();
      self->ctx_->note_negotiated(self->info_, self->chosen_);
    }
    if (ec) self->do_close(ec);
    if (auto done = std::move(self->on_ready_)) done(ec ? ec : self->close_reason_);
  });
}

// ---------------------------------------------------------------- reading and dispatch

void Session::start_reading() {
  stream_.async_read_some(asio::buffer(read_buf_),
                          asio::bind_executor(strand_, [self = shared_from_this()](
                                                           boost::system::error_code ec, size_t n) {
                            self->on_read(ec, n);
                          }));
}

void Session::on_read(const boost::system::error_code& ec, size_t n) {
  if (state_ == State::closed) return;
  if (ec == asio::error::eof && state_ == State::open && awaits_peer_bytes()) {
    // A peer that ends right after sending (a collective rank leaving after its last call)
    // closes this connection and its data channel alike: what it wrote before is still
    // delivered on the data channel, ahead of that channel's end.
    state_ = State::draining;
    FERRY_LOG_DEBUG("peer '{}' closed its connection; draining its data channel", info_.name);
    drain_timer_.expires_after(kDrainBound);
    drain_timer_.async_wait(
        asio::bind_executor(strand_, [self = shared_from_this()](boost::system::error_code e) {
          if (!e) self->do_close(errc::peer_closed);
        }));
    return;
  }
  if (ec) {
    do_close(ec == asio::error::eof ? std::error_code(errc::peer_closed) : std::error_code(ec));
    return;
  }
  last_rx_ = Clock::now();
  auto err = decoder_.feed(std::string_view(read_buf_.data(), n),
                           [this](std::string_view body) { return on_frame(body); });
  if (err && state_ == State::handshaking) {
    do_close(errc::handshake_failed);  // whatever answered is not a ferry peer
    return;
  }
  if (err) {
    FERRY_LOG_WARN("peer '{}' ({}): {}; closing its connection", info_.name, info_.address,
                   err.message());
    send_error(0, err,
               err == errc::frame_too_large
                   ? "frame length exceeds the maximum of " +
                         std::to_string(ctx_->options.max_frame_bytes) + " bytes"
                   : "malformed frame",
               true);
    return;  // stop reading: the connection ends once the error frame is out
  }
  if (state_ != State::closed && !close_after_write_) start_reading();
}

std::error_code Session::on_frame(std::string_view body) {
  if (close_after_write_ || state_ == State::closed) return {};
  wire::Envelope env;
  if (auto ec = parse_envelope(body, env)) return ec;
  return dispatch(env);
}

std::error_code Session::dispatch(const wire::Envelope& env) {
  const uint64_t rid = env.request_id();
  if (state_ == State::handshaking) {
    if (env.has_hello_answer() && info_.initiator && chosen_.empty()) {
      return on_hello_answer(env.hello_answer());
    }
    if (env.has_auth()) {  // acceptor: the initiator's proof
      on_auth(env.auth());
      return {};
    }
    if (env.has_ack() && awaiting_auth_) {  // initiator: the acceptor took our proof
      finish_handshake(std::move(awaiting_auth_));
      awaiting_auth_.reset();
      return {};
    }
    // After the answer, the chosen transport sets up its channel with its own messages.
    if (env.has_transport_message() && !chosen_.empty() && info_.initiator) {
      const auto& m = env.transport_message();
      if (auto t = ctx_->find_transport(m.transport())) {
        t->on_transport_message(*this, rid, m.payload());
        return {};
      }
    }
    if (env.has_error()) {
      auto ec = from_wire_code(env.error().code());
      FERRY_LOG_WARN("peer {} refused the handshake: {} ({})", info_.address, env.error().message(),
                     ec.message());
      do_close(ec);
      return {};
    }
    return errc::protocol_error;
  }
  switch (env.body_case()) {
    case wire::Envelope::kFetch:
      handle_fetch(rid, env.fetch());
      return {};
    case wire::Envelope::kCancel:
      handle_cancel(rid);
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
        t->on_transport_message(*this, rid, m.payload());
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

// A request this side will not serve: counted (Context::stats) and answered with the error.
void Session::refuse(uint64_t rid, std::error_code ec, const std::string& text, bool fatal) {
  ctx_->stats->serve_done(ec, 0, {});
  send_error(rid, ec, text, fatal);
}

void Session::handle_fetch(uint64_t rid, const wire::Fetch& msg) {
  if (serving_.count(rid) || parked_.count(rid) || rid % 2 == next_request_id_ % 2) {
    refuse(rid, errc::invalid_argument, "request id in use, or not one the peer may use", false);
    return;
  }
  if (serving_.size() + parked_.size() >= ctx_->options.max_requests_per_peer) {
    // Bounded: a peer that floods requests (or never reads what it asked for) gets errors, not
    // an ever-growing share of this process.
    refuse(
        rid, errc::overloaded,
        "more than " + std::to_string(ctx_->options.max_requests_per_peer) + " requests in flight",
        false);
    return;
  }
  if (msg.owner_instance() != 0 && msg.owner_instance() != ctx_->instance) {
    refuse(rid, errc::stale_ref, "ref is from an earlier instance of this owner", false);
    return;
  }
  std::error_code ec;
  auto transport = pick_transport(msg.transport(), {}, ec);
  if (!transport) {
    refuse(rid, ec, "transport '" + msg.transport() + "' is not available", false);
    return;
  }
  ObjectId id = msg.object_id();
  if (id == 0 && !msg.name().empty()) {
    id = ctx_->find_or_wait_name(msg.name(), shared_from_this());
    if (id == 0) {
      // Not put yet: wait for it, at most what the fetcher allows and our lease timeout.
      const auto wait = std::min<uint64_t>(msg.wait_ms(), ctx_->options.lease_timeout.count());
      const auto deadline = Clock::now() + std::chrono::milliseconds(wait);
      parked_[rid] = Parked{msg, deadline};
      arm_deadline(deadline);
      FERRY_LOG_DEBUG("peer '{}': request {} waits for the name '{}'", info_.name, rid, msg.name());
      return;
    }
  }
  auto pin = ctx_->store.pin(id);
  if (!pin) {
    refuse(rid, errc::object_not_found,
           msg.name().empty()
               ? "object " + std::to_string(id) + " not found on '" + ctx_->options.name + "'"
               : "object named '" + msg.name() + "' is gone from '" + ctx_->options.name + "'",
           false);
    return;
  }
  if (pin.object().exclusive && pin.object().transport != transport->name()) {
    refuse(rid, errc::transport_unavailable,
           "object " + std::to_string(msg.object_id()) + " is offered only over " +
               pin.object().transport + ", not " + transport->name(),
           false);
    return;
  }
  const auto& tensors = pin.object().tensors;
  bool sizes_ok = static_cast<size_t>(msg.sizes_size()) == tensors.size();
  for (size_t i = 0; sizes_ok && i < tensors.size(); ++i) {
    sizes_ok = msg.sizes(static_cast<int>(i)) == tensors[i].data.size();
  }
  if (!sizes_ok) {
    refuse(rid, errc::size_mismatch, "requested sizes do not match the object", false);
    return;
  }
  if (!channel(transport->name())) {
    refuse(rid, errc::transport_unavailable,
           "no " + transport->name() + " data channel to this peer", false);
    return;
  }
  serving_.emplace(rid, Serving{transport, id});
  ctx_->stats->serve_started();
  FERRY_LOG_DEBUG("peer '{}': request {} served: object {} '{}' over {}", info_.name, rid, id,
                  msg.name(), transport->name());
  ServeHooks hooks{pin.object().on_sent, pin.object().on_served};
  uint64_t bytes = 0;
  for (const auto& t : tensors) bytes += t.data.size();
  transport->send_multiple(
      *this, rid, std::move(pin),
      [self = shared_from_this(), rid, hooks = std::move(hooks), bytes,
       name = transport->name()](std::error_code ec) {
        self->serving_.erase(rid);
        self->ctx_->stats->serve_ended(ec, bytes, name);
        if (!ec) {
          if (hooks) hooks();
          return;
        }
        if (ec == errc::aborted || !self->is_open()) return;
        if (hooks) {  // the fetcher may confirm every byte yet (PeerLink::settle)
          if (self->unsettled_.size() >= self->ctx_->options.max_requests_per_peer) {
            self->unsettled_.pop_front();
          }
          self->unsettled_.emplace_back(rid, hooks);
        }
        self->refuse(rid, ec, "send failed", false);
      });
}

void Session::settle(uint64_t request_id) {
  auto it = std::find_if(unsettled_.begin(), unsettled_.end(),
                         [&](const auto& u) { return u.first == request_id; });
  if (it == unsettled_.end()) return;
  auto hooks = std::move(it->second);
  unsettled_.erase(it);
  FERRY_LOG_DEBUG("peer '{}': request {} served after all (the fetcher has every byte)", info_.name,
                  request_id);
  hooks();
}

void Session::on_named(const std::string& name) {
  asio::post(strand_, [self = shared_from_this(), name] {
    std::vector<std::pair<uint64_t, wire::Fetch>> ready;
    for (auto it = self->parked_.begin(); it != self->parked_.end();) {
      if (it->second.msg.name() == name) {
        ready.emplace_back(it->first, std::move(it->second.msg));
        it = self->parked_.erase(it);
      } else {
        ++it;
      }
    }
    for (auto& [rid, msg] : ready) {
      if (self->is_open()) self->handle_fetch(rid, msg);
    }
  });
}

void Session::handle_cancel(uint64_t rid) {
  if (auto parked = parked_.find(rid); parked != parked_.end()) {
    ctx_->forget_name_wait(parked->second.msg.name(), this);
    parked_.erase(parked);
    return;  // waiting for a name: nothing started
  }
  auto it = serving_.find(rid);
  if (it == serving_.end()) return;  // already finished: nothing to stop
  auto transport = it->second.transport;
  transport->abort(*this, rid);
}

void Session::abort_serving(ObjectId object) {
  asio::post(strand_, [self = shared_from_this(), object] {
    std::vector<uint64_t> rids;
    for (auto& [rid, serve] : self->serving_) {
      if (serve.object != object || serve.aborted) continue;
      serve.aborted = true;
      rids.push_back(rid);
    }
    for (uint64_t rid : rids) {
      self->send_error(rid, errc::aborted,
                       "owner '" + self->ctx_->options.name + "' aborted serving object " +
                           std::to_string(object),
                       false);
      // A transport's abort may end the serve at once (its SendDone erases the entry).
      auto it = self->serving_.find(rid);
      if (it == self->serving_.end() || it->second.transport->is_one_sided()) continue;
      auto transport = it->second.transport;
      transport->abort(*self, rid);
    }
  });
}

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
  auto ec = from_wire_code(err.code());
  if (rid != 0 && fetches_.count(rid)) {
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

// ---------------------------------------------------------------- fetcher side

FetchRequest Session::fetch(ObjectRef ref, std::vector<MutableBuffer> targets, FetchOptions options,
                            FetchHandler handler) {
  const uint64_t id = next_request_id_.fetch_add(2);
  auto state = std::make_shared<detail::FetchState>(id, ctx_->io.get_executor());
  state->set_stats(ctx_->stats, Clock::now());
  if (handler) state->set_handler(std::move(handler));
  state->set_abort_hook([weak = weak_from_this(), weak_state = std::weak_ptr(state), id] {
    auto self = weak.lock();
    if (!self) {
      if (auto s = weak_state.lock()) s->complete(errc::aborted);
      return;
    }
    asio::post(self->strand_, [self, weak_state, id] {
      if (const uint64_t wire = self->wire_id(id); self->fetches_.count(wire)) {
        self->complete_fetch(wire, errc::aborted);
      } else if (auto s = weak_state.lock()) {
        s->complete(errc::aborted);  // not started yet (channel opening): nothing to undo
      }
    });
  });
  asio::post(strand_, [self = shared_from_this(), state, ref = std::move(ref),
                       targets = std::move(targets), options = std::move(options)]() mutable {
    try {
      self->do_fetch(state, std::move(ref), std::move(targets), std::move(options));
    } catch (const std::bad_alloc&) {
      // Out of memory for the fetch's bookkeeping: it still completes, exactly once.
      self->fail_fetch(*state, errc::resource_exhausted);
    }
  });
  return FetchRequest(state);
}

void Session::fail_fetch(detail::FetchState& state, std::error_code ec) {
  if (const uint64_t wire = wire_id(state.id()); fetches_.count(wire)) {
    complete_fetch(wire, ec);  // launched: the transport lets go of the targets first
  } else {
    state.complete(ec);
  }
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
                     info_.name, ref_transport, chosen_, t ? "the peer's" : "this");
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
  if (!chosen_.empty()) return ctx_->find_transport(chosen_);
  ec = errc::transport_unavailable;
  return nullptr;
}

void Session::do_fetch(std::shared_ptr<detail::FetchState> state, ObjectRef ref,
                       std::vector<MutableBuffer> targets, FetchOptions options) {
  auto& result = state->result();
  if (state_ != State::open) {
    state->complete(close_reason_ ? close_reason_ : std::error_code(errc::peer_closed));
    return;
  }
  if (ref.owner_instance != 0 && peer_instance_ != 0 && ref.owner_instance != peer_instance_) {
    state->complete(errc::stale_ref);
    return;
  }
  std::error_code ec;
  const auto& md = ref.metadata;
  std::shared_ptr<TransportManager> transport;
  if (md.exclusive && !options.transport.empty() && options.transport != "auto" &&
      options.transport != md.transport) {
    ec = errc::transport_unavailable;  // the caller insists on another transport
  } else if (md.exclusive) {
    transport = pick_transport(md.transport, {}, ec);
    if (!transport) ec = errc::transport_unavailable;  // unknown here is unavailable to both
  } else {
    transport = pick_transport(options.transport, md.transport, ec);
  }
  if (!transport) {
    if (md.exclusive) {
      FERRY_LOG_WARN(
          "fetch from '{}': object {} is offered only over {}, which this side and "
          "the peer do not share",
          info_.name, ref.object_id, md.transport);
    } else {
      FERRY_LOG_WARN("fetch from '{}': transport '{}': {}", info_.name, options.transport,
                     ec.message());
    }
    state->complete(ec);
    return;
  }
  const auto& tensors = ref.metadata.tensors;
  if (targets.empty()) {
    std::vector<size_t> sizes;
    for (const auto& t : tensors) sizes.push_back(t.nbytes);
    result.storage = allocate_slots(*ctx_->pool, sizes, targets);
    if (!result.storage) {
      FERRY_LOG_WARN(
          "fetch from '{}': object {} announces {} bytes, more than this process can "
          "allocate",
          info_.name, ref.object_id, ref.metadata.total_bytes());
      state->complete(errc::resource_exhausted);
      return;
    }
  } else {
    bool ok = targets.size() == tensors.size();
    for (size_t i = 0; ok && i < tensors.size(); ++i) ok = targets[i].size() == tensors[i].nbytes;
    if (!ok) {
      state->complete(errc::size_mismatch);
      return;
    }
  }
  result.ref = std::move(ref);
  result.tensors = targets;
  result.transport = transport->name();
  result.bytes = result.ref.metadata.total_bytes();
  const bool forced = !options.transport.empty() && options.transport != "auto";
  ensure_channel(
      transport, [self = shared_from_this(), state, transport, forced, targets = std::move(targets),
                  options = std::move(options)](std::error_code ec) mutable {
        if (!ec) {
          self->start_transfer(std::move(state), std::move(transport), std::move(targets),
                               std::move(options));
          return;
        }
        // The transport's channel cannot be (re)built: unless the caller insisted on it, fall back
        // to the next transport both sides have, and say so.
        std::shared_ptr<TransportManager> fallback;
        if (!forced && self->state_ == State::open) {
          for (const auto& t : *self->ctx_->transport_list()) {
            if (t != transport && t->peer_has_transport(self->info_)) {
              fallback = t;
              break;
            }
          }
        }
        if (!fallback) {
          state->complete(ec);
          return;
        }
        FERRY_LOG_WARN("peer '{}': no {} channel ({}); this fetch falls back to {}",
                       self->info_.name, transport->name(), ec.message(), fallback->name());
        state->result().transport = fallback->name();
        self->ensure_channel(fallback, [self, state, fallback, targets = std::move(targets),
                                        options = std::move(options)](std::error_code ec) mutable {
          if (ec) {
            state->complete(ec);
            return;
          }
          self->start_transfer(std::move(state), std::move(fallback), std::move(targets),
                               std::move(options));
        });
      });
}

void Session::start_transfer(std::shared_ptr<detail::FetchState> state,
                             std::shared_ptr<TransportManager> transport,
                             std::vector<MutableBuffer> targets, FetchOptions options) {
  if (state->done()) return;  // aborted while the channel was opening
  if (state_ != State::open) {
    state->complete(close_reason_ ? close_reason_ : std::error_code(errc::peer_closed));
    return;
  }
  PendingFetch pending{state, transport, Clock::now()};
  if (options.timeout.count() > 0) pending.deadline = pending.started + options.timeout;
  CombineFn stream;
  if (options.combine && transport->combines()) {
    stream = std::move(options.combine);
    pending.streams = true;
  } else if (options.combine) {
    // The transport lands the bytes whole: in slots of ours, combined on success.
    std::vector<size_t> sizes;
    for (const auto& t : targets) sizes.push_back(t.size());
    pending.combine = std::move(options.combine);
    pending.targets = std::move(targets);
    pending.landed = allocate_slots(*ctx_->pool, sizes, targets);
    if (!pending.landed) {
      state->complete(errc::resource_exhausted);
      return;
    }
    pending.slots = targets;
  }
  launch(state->id(), std::move(pending), std::move(targets), std::move(stream));
}

void Session::launch(uint64_t id, PendingFetch pending, std::vector<MutableBuffer> targets,
                     CombineFn stream) {
  const auto state = pending.state;
  const auto transport = pending.transport;
  const auto deadline = pending.deadline;
  const auto& ref = state->result().ref;
  if (deadline != Clock::time_point::max()) arm_deadline(deadline);
  FetchOp op{id, ref, std::move(targets), FetchRequest(state), std::move(stream)};
  fetches_.emplace(id, std::move(pending));
  auto started = transport->is_one_sided() ? transport->fetch_multiple(*this, op)
                                           : transport->recv_multiple(*this, op);
  if (!started) {
    complete_fetch(id, started.error());
    return;
  }
  wire::Envelope env;
  env.set_request_id(id);
  auto* f = env.mutable_fetch();
  f->set_object_id(ref.object_id);
  f->set_transport(transport->name());
  f->set_owner_instance(ref.owner_instance);
  for (const auto& t : ref.metadata.tensors) f->add_sizes(t.nbytes);
  if (!ref.name.empty()) {
    f->set_name(ref.name);
    // The owner waits for the name at most the time left to the deadline (and at most its lease
    // timeout); the clock is read only when there is a deadline.
    uint64_t wait_ms = ~uint64_t{0};
    if (deadline != Clock::time_point::max()) {
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
      wait_ms = static_cast<uint64_t>(std::max<int64_t>(left.count(), 1));
    }
    f->set_wait_ms(wait_ms);
  }
  FERRY_LOG_DEBUG("peer '{}': fetch {} of object {} '{}' requested over {}", info_.name, id,
                  ref.object_id, ref.name, transport->name());
  send(env);
}

uint64_t Session::wire_id(uint64_t id) const {
  auto it = restarted_.find(id);
  return it == restarted_.end() ? id : it->second;
}

void Session::restart_fetch(uint64_t request_id, std::error_code ec) {
  auto it = fetches_.find(request_id);
  if (it == fetches_.end()) return;
  auto& p = it->second;
  auto& restarts = p.state->result().restarts;
  if (p.releasing || p.streams || restarts >= kMaxFetchRestarts || state_ != State::open ||
      Clock::now() >= p.deadline) {
    return complete_fetch(request_id, ec);
  }
  // The transport has let go of the targets: the fetch waits for a new channel, outside fetches_
  // (an abort completes it at once; a deadline is looked at again when it is launched).
  ++restarts;
  auto pending = std::move(p);
  fetches_.erase(it);
  const uint64_t original = pending.state->id();
  const uint64_t id = next_request_id_.fetch_add(2);
  restarted_[original] = id;
  FERRY_LOG_INFO(
      "peer '{}': fetch {} lost its {} channel ({}): fetching it again as request {} "
      "({} of {})",
      info_.name, original, pending.transport->name(), ec.message(), id, restarts,
      kMaxFetchRestarts);
  // Posted: the transport drops the broken channel after this call, and the restart must not
  // find it still installed.
  asio::post(strand_, [self = shared_from_this(), id, ec, pending = std::move(pending)]() mutable {
    if (self->state_ != State::open) return self->relaunch(id, std::move(pending), ec, {});
    auto transport = pending.transport;
    self->ensure_channel(
        transport, [self, id, ec, pending = std::move(pending)](std::error_code open_ec) mutable {
          self->relaunch(id, std::move(pending), ec, open_ec);
        });
  });
}

void Session::relaunch(uint64_t id, PendingFetch pending, std::error_code ec,
                       std::error_code open_ec) {
  auto state = pending.state;
  std::error_code failed;
  if (state_ != State::open) {
    failed = close_reason_ ? close_reason_ : ec;  // the session ended: its reason
  } else if (open_ec) {
    failed = ec;  // no new channel: the broken channel's error
  }
  if (state->done() || failed) {
    restarted_.erase(state->id());
    if (state->done()) return;  // aborted meanwhile
    FERRY_LOG_WARN("peer '{}': fetch {} cannot start again: {}", info_.name, state->id(),
                   (open_ec ? open_ec : failed).message());
    state->result().elapsed = Clock::now() - pending.started;
    state->complete(failed);
    return;
  }
  auto targets = pending.combine ? pending.slots : state->result().tensors;
  state->reset_landed();  // every byte lands again
  launch(id, std::move(pending), std::move(targets), {});
}

void Session::complete_fetch(uint64_t request_id, std::error_code ec) {
  auto it = fetches_.find(request_id);
  if (it == fetches_.end()) return;
  if (it->second.releasing) {
    // The transport has drained what it had posted for an aborted fetch: report the abort now.
    ec = it->second.releasing;
  } else if (ec) {
    // The transport lets go of the targets before the caller hears of the failure.
    if (!it->second.transport->abort(*this, request_id)) {
      it->second.releasing = ec;  // it calls complete_fetch() again once they are free
      it->second.deadline = Clock::time_point::max();
      return;
    }
  }
  // Only now may the owner stop: a one-sided grant revoked while our READs were still posted
  // failed them with a remote access error and broke the queue pair under every other fetch on
  // it (found by the soak with per-peer grants on rxe).
  if ((ec == errc::aborted || ec == errc::timed_out) && state_ == State::open) {
    wire::Envelope env;
    env.set_request_id(request_id);
    env.mutable_cancel();
    send(env);
  }
  FERRY_LOG_DEBUG("peer '{}': fetch {} completes: {}", info_.name, request_id,
                  ec ? ec.message() : "ok");
  auto pending = std::move(it->second);
  fetches_.erase(it);
  if (!restarted_.empty()) restarted_.erase(pending.state->id());
  if (!ec && pending.combine) {
    for (size_t i = 0; i < pending.targets.size(); ++i) {
      if (!pending.targets[i].empty()) pending.combine(pending.targets[i], pending.slots[i]);
    }
  }
  pending.state->result().elapsed = Clock::now() - pending.started;
  pending.state->complete(ec);
  if (state_ == State::draining && !awaits_peer_bytes()) {
    // Not from inside the channel's handler that completed it: it may go on reading.
    asio::post(strand_, [self = shared_from_this()] { self->do_close(errc::peer_closed); });
  }
}

void Session::arm_deadline(Clock::time_point at) {
  if (at >= deadline_armed_ || state_ == State::closed) return;
  deadline_armed_ = at;
  deadline_timer_.expires_at(at);  // a wait armed for later ends as cancelled
  deadline_timer_.async_wait(
      asio::bind_executor(strand_, [self = shared_from_this()](boost::system::error_code ec) {
        if (!ec) self->on_deadline();
      }));
}

void Session::on_deadline() {
  deadline_armed_ = Clock::time_point::max();
  if (state_ == State::closed) return;
  const auto now = Clock::now();
  std::vector<uint64_t> due;
  for (const auto& [id, f] : fetches_) {
    if (f.deadline <= now) due.push_back(id);
  }
  for (uint64_t id : due) complete_fetch(id, errc::timed_out);
  for (auto it = parked_.begin(); it != parked_.end();) {
    if (it->second.deadline > now) {
      ++it;
      continue;
    }
    if (is_open()) {
      // The same error as the fetcher's own deadline, which this wait ends with: a name that
      // never appears fails with timed_out, whichever side's clock ends it.
      send_error(it->first, errc::timed_out,
                 "no object was put under the name '" + it->second.msg.name() + "' in time", false);
    }
    ctx_->forget_name_wait(it->second.msg.name(), this);
    it = parked_.erase(it);
  }
  // Whatever is left is due later (completing the due ones may have started more).
  auto next = Clock::time_point::max();
  for (const auto& [id, f] : fetches_) next = std::min(next, f.deadline);
  for (const auto& [rid, p] : parked_) next = std::min(next, p.deadline);
  if (next != Clock::time_point::max()) arm_deadline(next);
}

bool Session::awaits_peer_bytes() const {
  return std::any_of(fetches_.begin(), fetches_.end(), [this](const auto& f) {
    return !f.second.transport->is_one_sided() && channel(f.second.transport->name());
  });
}

void Session::ensure_channel(const std::shared_ptr<TransportManager>& transport,
                             std::function<void(std::error_code)> done) {
  auto& slot = channels_[transport->name()];
  if (slot.channel) {
    done({});
    return;
  }
  slot.waiters.push_back(std::move(done));
  if (slot.opening) return;
  if (!info_.initiator) {
    // Channels are opened by the side that connected; it did so for the negotiated transport.
    auto waiters = std::move(slot.waiters);
    channels_.erase(transport->name());
    for (auto& w : waiters) w(errc::transport_unavailable);
    return;
  }
  slot.opening = true;
  transport->async_open_channel(shared_from_this(),
                                [self = shared_from_this(), name = transport->name()](
                                    std::error_code ec, std::shared_ptr<TransportChannel> ch) {
                                  auto& slot = self->channels_[name];
                                  auto waiters = std::move(slot.waiters);
                                  slot.opening = false;
                                  if (!ec && self->state_ == State::closed) {
                                    ch->close(self->close_reason_);
                                    ec = self->close_reason_;
                                  }
                                  if (ec) {
                                    self->channels_.erase(name);
                                  } else {
                                    slot.channel = std::move(ch);
                                  }
                                  for (auto& w : waiters) w(ec);
                                });
}

bool Session::install_channel(std::string_view transport,
                              std::shared_ptr<TransportChannel> channel) {
  auto& slot = channels_[std::string(transport)];
  if (slot.channel || state_ == State::closed) return false;
  slot.channel = std::move(channel);
  auto waiters = std::move(slot.waiters);
  slot.opening = false;
  for (auto& w : waiters) w({});
  return true;
}

void Session::drop_channel(std::string_view transport, std::error_code ec) {
  auto it = channels_.find(std::string(transport));
  if (it == channels_.end() || !it->second.channel) return;
  auto channel = std::move(it->second.channel);
  channels_.erase(it);
  FERRY_LOG_WARN("peer '{}': {} channel dropped: {}", info_.name, transport, ec.message());
  channel->close(ec);
}

std::shared_ptr<TransportChannel> Session::channel(std::string_view transport) const {
  auto it = channels_.find(std::string(transport));
  return it == channels_.end() ? nullptr : it->second.channel;
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
  channels_[transport_name].channel = std::move(ch);
}

void Session::async_open_side_connection(std::string_view transport_name,
                                         SideConnectionHandler done) {
  struct Op {
    tcp::socket socket;
    asio::steady_timer timer;
    std::string out;
    std::array<unsigned char, 4> header{};
    std::string body;
    SideConnectionHandler done;
    bool finished = false;
    void finish(std::error_code ec) {
      if (finished) return;
      finished = true;
      timer.cancel();
      if (ec) {
        boost::system::error_code ignored;
        socket.close(ignored);
      }
      auto d = std::move(done);
      d(ec, std::move(socket));
    }
  };
  boost::system::error_code err;
  auto endpoint = stream_.socket().remote_endpoint(err);
  if (err || !info_.initiator) {
    done(err ? std::error_code(err) : std::error_code(errc::invalid_argument),
         tcp::socket(ctx_->io));
    return;
  }
  auto op = std::make_shared<Op>(
      Op{tcp::socket(ctx_->io), asio::steady_timer(ctx_->io), {}, {}, {}, std::move(done)});
  wire::Envelope env;
  auto* attach = env.mutable_attach_channel();
  attach->set_session_id(info_.session_id);
  attach->set_session_token(token_);
  attach->set_transport(std::string(transport_name));
  op->out = encode_frame(env);
  op->timer.expires_after(ctx_->options.connect_timeout);
  op->timer.async_wait(asio::bind_executor(strand_, [op](boost::system::error_code ec) {
    if (!ec && !op->finished) {
      boost::system::error_code ignored;
      op->socket.close(ignored);
    }
  }));
  auto self = shared_from_this();
  op->socket.async_connect(
      endpoint, asio::bind_executor(strand_, [self, op](boost::system::error_code ec) {
        if (ec) return op->finish(errc::connection_failed);
        close_on_exec(op->socket.native_handle());
        boost::system::error_code ignored;
        op->socket.set_option(tcp::no_delay(true), ignored);
        asio::async_write(
            op->socket, asio::buffer(op->out),
            asio::bind_executor(self->strand_, [self, op](boost::system::error_code ec, size_t) {
              if (ec) return op->finish(errc::connection_failed);
              asio::async_read(
                  op->socket, asio::buffer(op->header),
                  asio::bind_executor(
                      self->strand_, [self, op](boost::system::error_code ec, size_t) {
                        if (ec) return op->finish(errc::handshake_failed);
                        const uint32_t len = decode_frame_length(op->header.data());
                        if (len > 4096) return op->finish(errc::protocol_error);
                        op->body.resize(len);
                        asio::async_read(
                            op->socket, asio::buffer(op->body),
                            asio::bind_executor(
                                self->strand_, [self, op](boost::system::error_code ec, size_t) {
                                  if (ec) return op->finish(errc::handshake_failed);
                                  wire::Envelope reply;
                                  if (parse_envelope(op->body, reply))
                                    return op->finish(errc::protocol_error);
                                  if (reply.has_error())
                                    return op->finish(from_wire_code(reply.error().code()));
                                  if (!reply.has_ack()) return op->finish(errc::protocol_error);
                                  op->finish({});
                                }));
                      }));
            }));
      }));
}

// ---------------------------------------------------------------- control requests

void Session::rpc(wire::Envelope request, std::chrono::milliseconds timeout, RpcHandler done) {
  const uint64_t id = next_request_id_.fetch_add(2);
  request.set_request_id(id);
  asio::post(strand_, [self = shared_from_this(), id, request = std::move(request), timeout,
                       done = std::move(done)]() mutable {
    if (self->state_ != State::open) {
      done(self->close_reason_ ? self->close_reason_ : std::error_code(errc::peer_closed), {});
      return;
    }
    PendingRpc pending{std::move(done), std::make_unique<asio::steady_timer>(self->ctx_->io)};
    pending.timer->expires_after(timeout);
    pending.timer->async_wait(
        asio::bind_executor(self->strand_, [self, id](boost::system::error_code ec) {
          if (!ec) self->finish_rpc(id, errc::timed_out, {});
        }));
    self->rpcs_.emplace(id, std::move(pending));
    self->send(request);
  });
}

// ---------------------------------------------------------------- writing

void Session::send(const wire::Envelope& env) {
  if (state_ == State::closed || state_ == State::draining || close_after_write_) return;
  auto frame = encode_frame(env);
  queued_bytes_ += frame.size();
  write_queue_.push_back(std::move(frame));
  if (queued_bytes_ > ctx_->options.max_queued_control_bytes) {
    // The peer does not read what we send it: it cannot be served, and must not cost memory.
    FERRY_LOG_WARN("peer '{}' ({}) is not reading its control channel; closing it", info_.name,
                   info_.address);
    do_close(errc::peer_unresponsive);
    return;
  }
  // An idle connection writes at once (a lone request costs no trip through the loop); frames
  // queued while a write is in flight go out together after it, in one system call and one read
  // at the peer (a collective's fetches of one call, posted back to back, cost two request
  // writes per peer instead of one per fetch).
  write_more();
}

void Session::send_error(uint64_t rid, std::error_code ec, const std::string& message, bool fatal) {
  wire::Envelope env;
  env.set_request_id(rid);
  auto* err = env.mutable_error();
  err->set_code(to_wire_code(ec));
  err->set_message(message);
  err->set_fatal(fatal);
  send(env);
  if (fatal) {
    write_more();  // now: the connection ends once this frame is out
    close_after_write_ = true;
    close_after_write_ec_ = ec;
    // Bounded: a peer that never reads the error does not keep the connection.
    handshake_timer_.expires_after(std::chrono::seconds(1));
    handshake_timer_.async_wait(
        asio::bind_executor(strand_, [self = shared_from_this()](boost::system::error_code e) {
          if (!e) self->do_close(self->close_after_write_ec_);
        }));
    if (writing_.empty()) do_close(ec);
  }
}

void Session::write_more() {
  if (!writing_.empty() || write_queue_.empty() || state_ == State::closed) return;
  std::vector<asio::const_buffer> buffers;
  while (!write_queue_.empty() && writing_.size() < 64) {
    writing_.push_back(std::move(write_queue_.front()));
    write_queue_.pop_front();
  }
  for (const auto& f : writing_) buffers.emplace_back(asio::buffer(f));
  stream_.async_write(
      buffers, asio::bind_executor(
                   strand_, [self = shared_from_this()](boost::system::error_code ec, size_t n) {
                     self->queued_bytes_ -= n;
                     self->writing_.clear();
                     if (self->state_ == State::closed) return;
                     if (ec) {
                       // Draining: the peer is gone already; its data channel decides.
                       if (self->state_ != State::draining) self->do_close(errc::peer_closed);
                       return;
                     }
                     if (self->close_after_write_ && self->write_queue_.empty()) {
                       self->do_close(self->close_after_write_ec_);
                       return;
                     }
                     self->write_more();
                   }));
}

// ---------------------------------------------------------------- liveness and closing

void Session::arm_heartbeat() {
  heartbeat_timer_.expires_after(ctx_->options.heartbeat_interval);
  heartbeat_timer_.async_wait(
      asio::bind_executor(strand_, [self = shared_from_this()](boost::system::error_code ec) {
        if (ec || self->state_ != State::open) return;
        if (Clock::now() - self->last_rx_ > self->ctx_->options.peer_timeout) {
          FERRY_LOG_WARN("peer '{}' ({}) silent for {} ms; closing", self->info_.name,
                         self->info_.address, self->ctx_->options.peer_timeout.count());
          self->do_close(errc::peer_unresponsive);
          return;
        }
        wire::Envelope ping;
        ping.mutable_ping()->set_nonce(0);
        self->send(ping);
        self->arm_heartbeat();
      }));
}

void Session::fail(std::error_code ec) { do_close(ec); }

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
  asio::post(strand_, [self = shared_from_this()] {
    if (self->state_ != State::open) return;
    wire::Envelope env;
    auto* caps = env.mutable_capabilities();
    for (const auto& t : self->ctx_->local_infos()) to_wire(t, *caps->add_transports());
    self->send(env);
  });
}

PeerInfo Session::info_snapshot() const {
  std::lock_guard lock(info_mu_);
  return info_;
}

void Session::close(std::error_code ec) {
  asio::post(strand_, [self = shared_from_this(), ec] { self->do_close(ec); });
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
  heartbeat_timer_.cancel();
  drain_timer_.cancel();
  deadline_timer_.cancel();
  stream_.close();
  // Channels first: they drop their hold on every target buffer and pinned object.
  for (const auto& [rid, parked] : parked_) ctx_->forget_name_wait(parked.msg.name(), this);
  parked_.clear();
  auto channels = std::move(channels_);
  channels_.clear();
  for (auto& [name, slot] : channels) {
    if (slot.channel) slot.channel->close(close_reason_);
    for (auto& w : slot.waiters) w(close_reason_);
  }
  auto fetches = std::move(fetches_);
  fetches_.clear();
  for (auto& [id, pending] : fetches) {
    pending.state->result().elapsed = Clock::now() - pending.started;
    pending.state->complete(close_reason_);
  }
  serving_.clear();
  unsettled_.clear();
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

}  // namespace ferry
