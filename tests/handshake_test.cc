// Handshake over fake links: each side's steps on its own, and the two sides talking to each
// other, with and without a shared secret. No sockets.
#include "ferry/net/session/handshake.h"

#include <gtest/gtest.h>

#include "fake_session_link.h"
#include "ferry/net/context.h"
#include "ferry/net/errors.h"
#include "ferry/net/security/attach.h"
#include "ferry/net/security/auth.h"

namespace ferry {
namespace {

using fakes::FakeTransport;
using Step = Handshake::Step;

// One side's session: records what the handshake asks of it, in order (`events`).
struct FakeHandshakeLink : Handshake::Link {
  explicit FakeHandshakeLink(std::string transport) {
    transports.push_back(std::make_shared<FakeTransport>(std::move(transport), false));
  }
  const PeerInfo& peer_info() const override { return info; }
  void send(const wire::Envelope& env) override {
    events.push_back("send");
    sent.push_back(env);
  }
  void send_error(uint64_t rid, std::error_code ec, const std::string& message,
                  bool fatal) override {
    events.push_back("error");
    error = ec;
    error_fatal = fatal;
  }
  void fail(std::error_code ec) override { failed = ec; }
  std::vector<TransportInfo> local_infos() const override {
    std::vector<TransportInfo> out;
    for (const auto& t : transports) out.push_back(t->local_info());
    return out;
  }
  std::shared_ptr<TransportManager> find_transport(std::string_view name) const override {
    for (const auto& t : transports) {
      if (t->name() == name) return t;
    }
    return nullptr;
  }
  std::shared_ptr<TransportManager> pick_transport(const std::string& requested, const std::string&,
                                                   std::error_code& ec) const override {
    for (const auto& t : transports) {
      if ((requested.empty() || t->name() == requested) && info.find_transport(t->name())) {
        return t;
      }
    }
    ec = errc::transport_unavailable;
    return nullptr;
  }
  std::shared_ptr<TransportManager> fallback_transport(
      const TransportManager& failed) const override {
    for (const auto& t : transports) {
      if (t.get() != &failed && info.find_transport(t->name())) return t;
    }
    return nullptr;
  }
  void ensure_channel(const std::shared_ptr<TransportManager>& transport,
                      std::function<void(std::error_code)> done) override {
    channel_for = transport->name();
    channel_done = std::move(done);
  }
  void set_peer(Handshake::Peer peer) override {
    info.name = peer.name;
    info.session_id = peer.session_id;
    info.transports = peer.transports;
    token = peer.token;
    instance = peer.instance;
  }
  void opened(std::error_code ec) override {
    events.push_back("opened");
    opened_with = ec;
  }

  std::vector<std::shared_ptr<FakeTransport>> transports;
  PeerInfo info;
  std::string token;
  uint64_t instance = 0;
  std::vector<std::string> events;
  std::vector<wire::Envelope> sent;
  std::optional<std::error_code> error, failed, opened_with;
  bool error_fatal = false;
  std::string channel_for;
  std::function<void(std::error_code)> channel_done;
};

struct HandshakeTest : ::testing::Test {
  // The two sides, with `secret` on the initiator and `acceptor_secret` on the acceptor.
  void make(const std::string& secret = {}, std::optional<std::string> acceptor_secret = {}) {
    initiator.emplace(a, Handshake::Options{true, "alice", secret, 11, 0});
    acceptor.emplace(b, Handshake::Options{false, "bob", acceptor_secret.value_or(secret), 22, 5});
  }
  // make(), both sides having a transport "SAME" that they prefer to TCP.
  void make_with_same_first() {
    for (auto* side : {&a, &b}) {
      side->transports.insert(side->transports.begin(),
                              std::make_shared<FakeTransport>("SAME", true));
    }
    make();
  }
  // Hands every frame one side sent and the other has not seen yet to the other side: the
  // Hello through on_hello, the rest through on_envelope. Stops when nothing is left.
  void exchange() {
    size_t from_a = 0, from_b = 0;
    while (from_a < a.sent.size() || from_b < b.sent.size()) {
      while (from_a < a.sent.size()) {
        const auto& env = a.sent[from_a++];
        if (env.has_hello()) {
          acceptor->on_hello(env.hello());
        } else {
          EXPECT_FALSE(acceptor->on_envelope(env));
        }
      }
      while (from_b < b.sent.size()) EXPECT_FALSE(initiator->on_envelope(b.sent[from_b++]));
    }
  }

  FakeHandshakeLink a{"TCP"}, b{"TCP"};
  std::optional<Handshake> initiator, acceptor;
};

TEST_F(HandshakeTest, WithoutASecretTheAcceptorOpensBeforeItsAnswerLeaves) {
  make();
  a.sent.push_back(initiator->hello("auto"));
  EXPECT_EQ(initiator->step(), Step::hello_sent);
  const auto& hello = a.sent[0].hello();
  EXPECT_EQ(hello.protocol_version(), kProtocolVersion);
  EXPECT_EQ(hello.name(), "alice");
  EXPECT_EQ(hello.instance(), 11u);
  EXPECT_TRUE(hello.requested_transport().empty());
  EXPECT_TRUE(hello.auth_nonce().empty());
  exchange();

  EXPECT_EQ(acceptor->step(), Step::open);
  EXPECT_EQ(b.events, (std::vector<std::string>{"opened", "send"}));
  EXPECT_EQ(b.info.name, "alice");
  EXPECT_EQ(b.instance, 11u);
  EXPECT_EQ(b.info.session_id, 5u);  // its own id of the session
  EXPECT_EQ(b.token.size(), 16u);
  EXPECT_EQ(acceptor->chosen(), "TCP");

  // The initiator knows the acceptor now, and opens the chosen transport's channel.
  EXPECT_EQ(a.info.name, "bob");
  EXPECT_EQ(a.info.session_id, 5u);
  EXPECT_EQ(a.instance, 22u);
  EXPECT_EQ(a.token, b.token);
  EXPECT_EQ(initiator->chosen(), "TCP");
  EXPECT_EQ(initiator->step(), Step::opening_channel);
  EXPECT_EQ(a.channel_for, "TCP");
  EXPECT_FALSE(a.opened_with);
  a.channel_done({});
  EXPECT_EQ(initiator->step(), Step::open);
  EXPECT_EQ(a.opened_with, std::error_code());
}

// Asked for by name, a transport whose channel cannot be opened fails the initiator: it does not
// fall back (SAME is there to fall back to).
TEST_F(HandshakeTest, AChannelThatCannotBeOpenedFailsTheInitiator) {
  make_with_same_first();
  a.sent.push_back(initiator->hello("TCP"));
  EXPECT_EQ(a.sent[0].hello().requested_transport(), "TCP");
  exchange();
  a.channel_done(errc::connection_failed);
  EXPECT_EQ(initiator->step(), Step::failed);
  EXPECT_EQ(a.opened_with, std::error_code(errc::connection_failed));
  EXPECT_EQ(a.channel_for, "TCP");  // no second channel was asked for
}

TEST_F(HandshakeTest, AnUnopenableChoiceFallsBackOnceToTheNextTransportBothHave) {
  make_with_same_first();
  a.sent.push_back(initiator->hello("auto"));
  exchange();
  EXPECT_EQ(acceptor->chosen(), "SAME");
  EXPECT_EQ(a.channel_for, "SAME");
  a.channel_done(errc::transport_unavailable);  // e.g. the kernel refuses the same-host reads
  EXPECT_EQ(initiator->step(), Step::opening_channel);
  EXPECT_EQ(a.channel_for, "TCP");
  EXPECT_EQ(initiator->chosen(), "TCP");
  EXPECT_FALSE(a.opened_with);
  a.channel_done(errc::connection_failed);  // the second failure ends it: no third try
  EXPECT_EQ(initiator->step(), Step::failed);
  EXPECT_EQ(a.opened_with, std::error_code(errc::connection_failed));
}

TEST_F(HandshakeTest, WithTheSameSecretBothSidesProveItAndOpen) {
  make("s3cret");
  a.sent.push_back(initiator->hello("auto"));
  EXPECT_FALSE(a.sent[0].hello().auth_nonce().empty());
  exchange();
  EXPECT_EQ(acceptor->step(), Step::open);
  EXPECT_EQ(b.events, (std::vector<std::string>{"send", "opened", "send"}));  // answer, Ack
  EXPECT_TRUE(b.sent[1].has_ack());
  ASSERT_EQ(a.sent.size(), 2u);
  EXPECT_TRUE(a.sent[1].has_auth());
  EXPECT_EQ(initiator->step(), Step::opening_channel);
  a.channel_done({});
  EXPECT_EQ(a.opened_with, std::error_code());
  EXPECT_FALSE(a.failed);
  EXPECT_FALSE(b.error);
}

TEST_F(HandshakeTest, TheInitiatorLeavesAnAcceptorThatCannotProveTheSecret) {
  make("s3cret", "other");
  a.sent.push_back(initiator->hello("auto"));
  exchange();
  EXPECT_EQ(acceptor->step(), Step::proof_awaited);
  EXPECT_EQ(initiator->step(), Step::failed);
  EXPECT_EQ(a.failed, std::error_code(errc::auth_failed));
  EXPECT_EQ(a.sent.size(), 1u);  // it never proves its own
  EXPECT_FALSE(b.opened_with);
}

TEST_F(HandshakeTest, TheAcceptorRefusesAWrongProof) {
  make("s3cret");
  a.sent.push_back(initiator->hello("auto"));
  acceptor->on_hello(a.sent[0].hello());
  wire::Envelope auth;
  auth.mutable_auth()->set_proof("not the proof");
  EXPECT_FALSE(acceptor->on_envelope(auth));
  EXPECT_EQ(acceptor->step(), Step::failed);
  EXPECT_EQ(b.error, std::error_code(errc::auth_failed));
  EXPECT_TRUE(b.error_fatal);
  EXPECT_FALSE(b.opened_with);
}

TEST_F(HandshakeTest, AnAcceptorWithASecretRefusesAHelloWithoutANonce) {
  make({}, "s3cret");
  a.sent.push_back(initiator->hello("auto"));
  acceptor->on_hello(a.sent[0].hello());
  EXPECT_EQ(acceptor->step(), Step::failed);
  EXPECT_EQ(b.error, std::error_code(errc::auth_failed));
  EXPECT_TRUE(b.error_fatal);
  EXPECT_TRUE(b.sent.empty());
}

TEST_F(HandshakeTest, AnAcceptorWithoutASecretRefusesAnAuth) {
  make();
  a.sent.push_back(initiator->hello("auto"));
  wire::Envelope auth;
  auth.mutable_auth()->set_proof("x");
  EXPECT_FALSE(acceptor->on_envelope(auth));
  EXPECT_EQ(b.error, std::error_code(errc::auth_failed));
}

TEST_F(HandshakeTest, TheAcceptorRefusesAnotherVersionOrNoCommonTransport) {
  make();
  wire::Hello hello = initiator->hello("auto").hello();
  hello.set_protocol_version(kProtocolVersion + 1);
  acceptor->on_hello(hello);
  EXPECT_EQ(b.error, std::error_code(errc::version_mismatch));
  EXPECT_TRUE(b.error_fatal);

  FakeHandshakeLink c{"RDMA"};
  Handshake other(c, Handshake::Options{false, "carol", {}, 33, 6});
  other.on_hello(initiator->hello("auto").hello());  // the initiator offers TCP only
  EXPECT_EQ(c.error, std::error_code(errc::transport_unavailable));
  EXPECT_EQ(other.step(), Step::failed);
}

TEST_F(HandshakeTest, TheInitiatorTakesOnlyAValidAnswerInStep) {
  make();
  wire::Envelope ack;
  ack.mutable_ack();
  EXPECT_EQ(initiator->on_envelope(ack), std::error_code(errc::protocol_error));  // no proof sent
  a.sent.push_back(initiator->hello("auto"));
  wire::Envelope answer;
  answer.mutable_hello_answer()->set_protocol_version(kProtocolVersion + 1);
  EXPECT_EQ(initiator->on_envelope(answer), std::error_code(errc::version_mismatch));
  answer.mutable_hello_answer()->set_protocol_version(kProtocolVersion);
  answer.mutable_hello_answer()->set_chosen_transport("NOPE");
  EXPECT_EQ(initiator->on_envelope(answer), std::error_code(errc::transport_unavailable));
  wire::Envelope fetch;
  fetch.mutable_fetch();
  EXPECT_EQ(initiator->on_envelope(fetch), std::error_code(errc::protocol_error));
}

TEST_F(HandshakeTest, ThePeersErrorEndsTheHandshakeWithItsCode) {
  make();
  a.sent.push_back(initiator->hello("auto"));
  wire::Envelope refusal;
  refusal.mutable_error()->set_code(static_cast<uint32_t>(errc::version_mismatch));
  refusal.mutable_error()->set_fatal(true);
  EXPECT_FALSE(initiator->on_envelope(refusal));
  EXPECT_EQ(a.failed, std::error_code(errc::version_mismatch));
  EXPECT_EQ(initiator->step(), Step::failed);
}

// A data channel's attach proves the token for one session, attach number and transport: change
// any of them (or the token) and the proof differs.
TEST(AttachProof, BindsTheTokenSessionNumberAndTransport) {
  const std::string token = auth::nonce();
  const auto p = auth::attach_proof(token, 7, 1, "TCP");
  EXPECT_EQ(p.size(), 32u);
  EXPECT_EQ(p, auth::attach_proof(token, 7, 1, "TCP"));
  EXPECT_NE(p, auth::attach_proof(auth::nonce(), 7, 1, "TCP"));
  EXPECT_NE(p, auth::attach_proof(token, 8, 1, "TCP"));
  EXPECT_NE(p, auth::attach_proof(token, 7, 2, "TCP"));
  EXPECT_NE(p, auth::attach_proof(token, 7, 1, "CMA"));
  EXPECT_EQ(p.find(token), std::string::npos);
}

// Each attach number is accepted once, also out of order within the window; 0, repeats and
// numbers that fell out of the window are refused.
TEST(AttachProof, TheWindowAcceptsEachNumberOnce) {
  auth::AttachWindow w;
  EXPECT_FALSE(w.accept(0));
  EXPECT_TRUE(w.accept(1));
  EXPECT_FALSE(w.accept(1));
  EXPECT_TRUE(w.accept(3));  // 2 still in flight
  EXPECT_TRUE(w.accept(2));
  EXPECT_FALSE(w.accept(2));
  EXPECT_FALSE(w.accept(3));
  EXPECT_TRUE(w.accept(66));  // 3 is now 63 below: still remembered
  EXPECT_FALSE(w.accept(3));
  EXPECT_TRUE(w.accept(4));
  EXPECT_FALSE(w.accept(2));    // 64 below the highest: out of the window
  EXPECT_TRUE(w.accept(1000));  // a jump past the window forgets it
  EXPECT_FALSE(w.accept(66));
  EXPECT_TRUE(w.accept(999));
  EXPECT_FALSE(w.accept(1000));
}

}  // namespace
}  // namespace ferry
