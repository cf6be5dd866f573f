// Handshake: how the two sides of a session agree to talk (internal). The initiator sends
// Hello; the acceptor answers with HelloAnswer (the transport it chose, its session id and
// token) or refuses with a fatal Error. With a shared secret each side proves it knows it: the
// acceptor in its answer, the initiator in Auth, which the acceptor takes with an Ack. The
// initiator then opens the chosen transport's data channel, and the session is open.
//
// Thread model: every method runs on the peer strand. It depends only on its Link, never on
// Session.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "ferry/net/proto/ferry.pb.h"
#include "ferry/net/transport.h"

namespace ferry {

class Handshake {
 public:
  // Where the handshake stands; each message it takes is valid in one step only.
  enum class Step {
    start,            // nothing sent or taken yet
    hello_sent,       // initiator: Hello out, HelloAnswer awaited
    proof_sent,       // initiator: our Auth out, the acceptor's Ack awaited
    opening_channel,  // initiator: the chosen transport's data channel is being opened
    proof_awaited,    // acceptor: its answer, with its proof, out; the initiator's Auth awaited
    open,             // done: the session is open
    failed,           // refused or failed: the session is closing
  };

  struct Options {
    bool initiator = false;
    std::string name;         // this side's name (ContextOptions::name)
    std::string secret;       // the shared secret; empty: none
    uint64_t instance = 0;    // this side's Context instance
    uint64_t session_id = 0;  // acceptor: the id this side gives the session
  };

  // What the peer says of itself (Hello, HelloAnswer) and of the session.
  struct Peer {
    std::string name;
    uint64_t session_id = 0;  // the acceptor's id of the session
    uint64_t instance = 0;    // the peer's Context instance
    std::string token;        // the acceptor's secret for the session's side connections
    std::vector<TransportInfo> transports;
  };

  // What the handshake needs of its session. Every call is on the strand.
  class Link {
   public:
    virtual ~Link() = default;
    // The peer, for log lines.
    virtual const PeerInfo& peer_info() const = 0;
    virtual void send(const wire::Envelope& env) = 0;
    // With `fatal`, the session closes once the Error is out.
    virtual void send_error(uint64_t rid, std::error_code ec, const std::string& message,
                            bool fatal) = 0;
    // Closes the session with `ec`.
    virtual void fail(std::error_code ec) = 0;
    // The transports this side advertises.
    virtual std::vector<TransportInfo> local_infos() const = 0;
    // The transport registered here under `name`, or null.
    virtual std::shared_ptr<TransportManager> find_transport(std::string_view name) const = 0;
    // As SessionLink::pick_transport.
    virtual std::shared_ptr<TransportManager> pick_transport(const std::string& requested,
                                                             const std::string& ref_transport,
                                                             std::error_code& ec) const = 0;
    // As SessionLink::ensure_channel.
    virtual void ensure_channel(const std::shared_ptr<TransportManager>& transport,
                                std::function<void(std::error_code)> done) = 0;
    // Where the initiator's chosen transport's channel could not be opened: as
    // SessionLink::fallback_transport, the next transport both sides have after `failed`.
    virtual std::shared_ptr<TransportManager> fallback_transport(
        const TransportManager& failed) const = 0;
    // The peer described itself; the session records it before anything else happens.
    virtual void set_peer(Peer peer) = 0;
    // The handshake ended: success opens the session (before the message that tells the peer
    // leaves, so that the peer's next step finds it open); an error (the initiator's channel
    // could not be opened) closes it.
    virtual void opened(std::error_code ec) = 0;
  };

  Handshake(Link& link, Options options);
  Handshake(const Handshake&) = delete;
  Handshake& operator=(const Handshake&) = delete;

  Step step() const { return step_; }
  // The transport the acceptor chose; empty until it is known.
  const std::string& chosen() const { return chosen_; }

  // Initiator: the Hello to send, asking for `requested_transport` ("auto": the acceptor picks).
  wire::Envelope hello(const std::string& requested_transport);
  // Acceptor: the peer's Hello (the connection's first frame). Answers it, or refuses it with a
  // fatal Error: version_mismatch, transport_unavailable, auth_failed (no nonce while a secret
  // is set). Without a secret the session is open when it returns.
  void on_hello(const wire::Hello& hello);
  // A frame while the session is not open: HelloAnswer, Auth, Ack or the peer's Error (which
  // closes the session with its code). It returns the error that ends the connection for a
  // message out of step or of another kind (protocol_error), an answer of another protocol
  // version (version_mismatch) or naming a transport unknown here (transport_unavailable). An
  // acceptor refuses an Auth that is not the proof it awaits with a fatal auth_failed; an
  // initiator fails the session with auth_failed when the acceptor's proof is wrong.
  std::error_code on_envelope(const wire::Envelope& env);

 private:
  std::error_code on_hello_answer(const wire::HelloAnswer& answer);
  void on_auth(const wire::Auth& auth);
  // Initiator: opens `transport`'s channel; the session opens once it is.
  void open_channel(std::shared_ptr<TransportManager> transport);

  Link& link_;
  const Options options_;
  Step step_ = Step::start;
  std::string chosen_;
  std::string requested_;     // the initiator's Hello asked for it ("auto": any)
  bool fell_back_ = false;    // the initiator's chosen transport's channel could not be opened
  std::string nonce_ours_;    // our nonce in the shared-secret handshake
  std::string nonce_theirs_;  // the peer's
  std::shared_ptr<TransportManager> proof_for_;  // initiator: proof sent, Ack awaited
};

}  // namespace ferry
