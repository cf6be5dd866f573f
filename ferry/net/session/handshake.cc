#include "ferry/net/session/handshake.h"

#include "ferry/net/context.h"
#include "ferry/net/errors.h"
#include "ferry/net/log.h"
#include "ferry/net/proto/wire_convert.h"
#include "ferry/net/security/auth.h"

namespace ferry {

Handshake::Handshake(Link& link, Options options) : link_(link), options_(std::move(options)) {}

// ---------------------------------------------------------------- initiator

wire::Envelope Handshake::hello(const std::string& requested_transport) {
  wire::Envelope env;
  auto* hello = env.mutable_hello();
  hello->set_protocol_version(kProtocolVersion);
  hello->set_name(options_.name);
  hello->set_instance(options_.instance);
  requested_ = requested_transport;
  if (requested_transport != "auto") hello->set_requested_transport(requested_transport);
  if (!options_.secret.empty()) {
    nonce_ours_ = auth::nonce();
    hello->set_auth_nonce(nonce_ours_);
  }
  for (const auto& t : link_.local_infos()) to_wire(t, *hello->add_transports());
  step_ = Step::hello_sent;
  return env;
}

std::error_code Handshake::on_hello_answer(const wire::HelloAnswer& answer) {
  if (answer.protocol_version() != kProtocolVersion) return errc::version_mismatch;
  if (!within_wire_limits(answer.transports())) return errc::protocol_error;
  Peer peer{answer.name(), answer.session_id(), answer.instance(), answer.session_token(), {}};
  for (const auto& t : answer.transports()) peer.transports.push_back(from_wire(t));
  link_.set_peer(std::move(peer));
  auto transport = link_.find_transport(answer.chosen_transport());
  if (!transport) return errc::transport_unavailable;
  chosen_ = transport->name();
  const std::string& secret = options_.secret;
  if (secret.empty()) {
    open_channel(std::move(transport));
    return {};
  }
  // Mutual: the acceptor proves it knows the secret before we prove it.
  const auto expected = auth::proof(secret, auth::kServerLabel, nonce_ours_, answer.auth_nonce());
  if (answer.auth_proof().empty() || !auth::same(answer.auth_proof(), expected)) {
    FERRY_LOG_WARN("{} did not prove the shared secret", link_.peer_info().address);
    step_ = Step::failed;
    link_.fail(errc::auth_failed);
    return {};
  }
  wire::Envelope env;
  env.mutable_auth()->set_proof(
      auth::proof(secret, auth::kClientLabel, answer.auth_nonce(), nonce_ours_));
  link_.send(env);
  proof_for_ = std::move(transport);  // the acceptor's Ack continues in open_channel()
  step_ = Step::proof_sent;
  return {};
}

void Handshake::open_channel(std::shared_ptr<TransportManager> transport) {
  step_ = Step::opening_channel;
  link_.ensure_channel(transport, [this, transport](std::error_code ec) {
    // The acceptor's choice cannot carry bytes from here (a same-host transport the kernel does
    // not let us use, say): unless this side asked for it, once, the next one both sides have.
    std::shared_ptr<TransportManager> next;
    if (ec && requested_ == "auto" && !fell_back_) next = link_.fallback_transport(*transport);
    if (next) {
      FERRY_LOG_WARN("peer '{}': no {} channel ({}); the connection uses {}",
                     link_.peer_info().name, transport->name(), ec.message(), next->name());
      fell_back_ = true;
      chosen_ = next->name();
      return open_channel(std::move(next));
    }
    step_ = ec ? Step::failed : Step::open;
    link_.opened(ec);
  });
}

// ---------------------------------------------------------------- acceptor

void Handshake::on_hello(const wire::Hello& hello) {
  std::vector<TransportInfo> transports;
  for (const auto& t : hello.transports()) transports.push_back(from_wire(t));
  const std::string token = auth::nonce();  // 16 random bytes
  link_.set_peer(Peer{hello.name(), options_.session_id, hello.instance(), token, transports});
  const std::string& peer_name = link_.peer_info().name;
  if (hello.protocol_version() != kProtocolVersion) {
    step_ = Step::failed;
    link_.send_error(0, errc::version_mismatch,
                     "protocol version " + std::to_string(hello.protocol_version()) +
                         " is not supported; this side speaks " + std::to_string(kProtocolVersion),
                     true);
    return;
  }
  std::error_code ec;
  auto chosen = link_.pick_transport(hello.requested_transport(), {}, ec);
  if (!chosen) {
    step_ = Step::failed;
    link_.send_error(0, errc::transport_unavailable,
                     hello.requested_transport().empty()
                         ? "no transport in common with peer '" + peer_name + "'"
                         : "transport '" + hello.requested_transport() + "' is not available on '" +
                               options_.name + "' for peer '" + peer_name + "'",
                     true);
    return;
  }
  chosen_ = chosen->name();
  wire::Envelope env;
  auto* answer = env.mutable_hello_answer();
  answer->set_protocol_version(kProtocolVersion);
  answer->set_name(options_.name);
  answer->set_chosen_transport(chosen_);
  answer->set_session_id(options_.session_id);
  answer->set_session_token(token);
  answer->set_instance(options_.instance);
  for (const auto& t : link_.local_infos()) to_wire(t, *answer->add_transports());
  const std::string& secret = options_.secret;
  if (secret.empty()) {
    // Open before the answer leaves: the initiator attaches its data channel as soon as it reads
    // the answer, and the acceptor checks that this session is open on another thread.
    step_ = Step::open;
    link_.opened({});
    link_.send(env);
    return;
  }
  if (hello.auth_nonce().empty()) {
    step_ = Step::failed;
    link_.send_error(0, errc::auth_failed, "'" + options_.name + "' requires a shared secret",
                     true);
    return;
  }
  // Prove we know the secret, then wait (bounded, by the session) for the peer's proof before
  // anything else.
  nonce_theirs_ = hello.auth_nonce();
  nonce_ours_ = auth::nonce();
  answer->set_auth_nonce(nonce_ours_);
  answer->set_auth_proof(auth::proof(secret, auth::kServerLabel, nonce_theirs_, nonce_ours_));
  step_ = Step::proof_awaited;
  link_.send(env);
}

void Handshake::on_auth(const wire::Auth& msg) {
  const auto expected =
      auth::proof(options_.secret, auth::kClientLabel, nonce_ours_, nonce_theirs_);
  if (step_ != Step::proof_awaited || !auth::same(msg.proof(), expected)) {
    const PeerInfo& peer = link_.peer_info();
    FERRY_LOG_WARN("peer '{}' ({}) failed the shared-secret handshake", peer.name, peer.address);
    step_ = Step::failed;
    link_.send_error(0, errc::auth_failed, "wrong shared secret", true);
    return;
  }
  wire::Envelope ack;
  ack.mutable_ack();
  step_ = Step::open;
  link_.opened({});  // before the Ack leaves, as in on_hello()
  link_.send(ack);
}

// ---------------------------------------------------------------- either side

std::error_code Handshake::on_envelope(const wire::Envelope& env) {
  if (env.has_hello_answer() && step_ == Step::hello_sent) {
    return on_hello_answer(env.hello_answer());
  }
  if (env.has_auth()) {  // acceptor: the initiator's proof
    on_auth(env.auth());
    return {};
  }
  if (env.has_ack() && step_ == Step::proof_sent) {  // initiator: the acceptor took our proof
    open_channel(std::move(proof_for_));
    return {};
  }
  if (env.has_error()) {
    auto ec = error_from_wire(env.error().code());
    FERRY_LOG_WARN("peer {} refused the handshake: {} ({})", link_.peer_info().address,
                   env.error().message(), ec.message());
    step_ = Step::failed;
    link_.fail(ec);
    return {};
  }
  return errc::protocol_error;
}

}  // namespace ferry
