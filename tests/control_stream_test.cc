// ControlStream on a loopback connection whose other end the test reads and writes by hand:
// framing both ways, writes started at once and frames queued behind one, fatal errors, the frame
// limits before and after the handshake, the peer's end, the heartbeat, and the queue bound.
#include "ferry/net/session/control_stream.h"

#include <gtest/gtest.h>

#include <boost/asio/write.hpp>
#include <thread>

#include "ferry/net/errors.h"
#include "test_util.h"

namespace ferry {
namespace {

using namespace std::chrono_literals;
using tcp = boost::asio::ip::tcp;

struct Ended {
  std::error_code ec;
  bool peer_eof;
};

// The session's part: records what the stream hands up, and closes the stream when it ends, as
// Session does.
struct RecordingOwner : ControlStream::Owner {
  std::shared_ptr<void> keep_alive() override { return nullptr; }
  const PeerInfo& peer_info() const override { return info; }
  std::error_code on_envelope(const wire::Envelope& env) override {
    if (out_of_memory) throw std::bad_alloc();
    received.push_back(env);
    return answer;
  }
  void on_end(std::error_code ec, bool peer_eof) override {
    ended.push_back({ec, peer_eof});
    if (!peer_eof || !drain_on_eof) stream->close();
  }

  PeerInfo info;
  ControlStream* stream = nullptr;
  std::error_code answer;      // what on_envelope returns
  bool out_of_memory = false;  // on_envelope throws std::bad_alloc
  bool drain_on_eof = false;
  std::vector<wire::Envelope> received;
  std::vector<Ended> ended;
};

struct ControlStreamTest : ::testing::Test {
  ControlStreamTest() {
    tcp::acceptor acceptor(io, tcp::endpoint(boost::asio::ip::address_v4::loopback(), 0));
    ours_.connect(acceptor.local_endpoint());
    acceptor.accept(peer);
    options.handshake_frame_bytes = 1024;
    options.max_frame_bytes = 4096;
  }
  // The stream under test, made once the test has set `options`.
  ControlStream& stream() {
    if (!stream_) {
      stream_.emplace(owner, strand, io, MetaStream(std::move(ours_)), options);
      owner.stream = &*stream_;
    }
    return *stream_;
  }
  // Runs the io until `done` holds or `limit` (scaled) passes; whether it holds.
  template <typename Pred>
  bool run_until(Pred done, std::chrono::milliseconds limit = 2000ms) {
    const auto deadline = std::chrono::steady_clock::now() + test::scaled(limit);
    while (!done() && std::chrono::steady_clock::now() < deadline) {
      io.restart();
      io.run_for(5ms);
      collect();
    }
    return done();
  }
  // Decodes what the peer's end has received so far into `at_peer`.
  void collect() {
    boost::system::error_code ec;
    while (peer.available(ec) > 0 && !ec) {
      std::array<char, 4096> buf;
      const size_t n = peer.read_some(boost::asio::buffer(buf), ec);
      if (ec) return;
      peer_decoder.feed(std::string_view(buf.data(), n), [this](std::string_view body) {
        wire::Envelope env;
        EXPECT_FALSE(parse_envelope(body, env));
        at_peer.push_back(env);
        return std::error_code();
      });
    }
  }
  // The peer writes `bytes` as they are.
  void peer_writes(const std::string& bytes) {
    boost::asio::write(peer, boost::asio::buffer(bytes));
  }
  static wire::Envelope ping(uint64_t nonce) {
    wire::Envelope env;
    env.mutable_ping()->set_nonce(nonce);
    return env;
  }
  // A frame header announcing a body of `n` bytes.
  static std::string header(uint32_t n) {
    return {static_cast<char>(n >> 24), static_cast<char>(n >> 16), static_cast<char>(n >> 8),
            static_cast<char>(n)};
  }

  boost::asio::io_context io;
  PeerStrand strand{boost::asio::make_strand(io)};
  tcp::socket peer{io};
  tcp::socket ours_{io};
  RecordingOwner owner;
  ControlStream::Options options;
  std::optional<ControlStream> stream_;
  FrameDecoder peer_decoder;
  std::vector<wire::Envelope> at_peer;
};

TEST_F(ControlStreamTest, HandsUpEachFrameInOrderHoweverTheBytesArrive) {
  stream().start();
  const std::string a = encode_frame(ping(1)), b = encode_frame(ping(2));
  peer_writes(a + b.substr(0, 3));
  ASSERT_TRUE(run_until([&] { return owner.received.size() == 1; }));
  peer_writes(b.substr(3));
  ASSERT_TRUE(run_until([&] { return owner.received.size() == 2; }));
  EXPECT_EQ(owner.received[0].ping().nonce(), 1u);
  EXPECT_EQ(owner.received[1].ping().nonce(), 2u);
  EXPECT_TRUE(owner.ended.empty());
}

TEST_F(ControlStreamTest, AnIdleConnectionWritesAtOnceAndFramesQueuedBehindFollowInOrder) {
  stream().start();
  for (uint64_t i = 1; i <= 3; ++i) stream().send(ping(i));
  // The first frame's write started inside send(): it reaches the peer with the io not running.
  const size_t first = encode_frame(ping(1)).size();
  const auto deadline = std::chrono::steady_clock::now() + test::scaled(1000ms);
  boost::system::error_code ec;
  while (peer.available(ec) < first && !ec && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(1ms);
  }
  EXPECT_GE(peer.available(ec), first) << "the first frame was not written from send()";
  // The two queued behind it leave once that write completes, in the order they were sent.
  ASSERT_TRUE(run_until([&] { return at_peer.size() == 3; }));
  for (uint64_t i = 0; i < 3; ++i) EXPECT_EQ(at_peer[i].ping().nonce(), i + 1);
  EXPECT_TRUE(owner.ended.empty());
}

TEST_F(ControlStreamTest, AFatalErrorIsWrittenThenTheConnectionEnds) {
  stream().start();
  stream().send_error(7, errc::stale_ref, "too old", true);
  stream().send(ping(1));  // after a fatal error: dropped
  ASSERT_TRUE(run_until([&] { return !owner.ended.empty(); }));
  EXPECT_EQ(owner.ended[0].ec, std::error_code(errc::stale_ref));
  ASSERT_TRUE(run_until([&] { return !at_peer.empty(); }));
  run_until([] { return false; }, 50ms);
  ASSERT_EQ(at_peer.size(), 1u);
  EXPECT_EQ(at_peer[0].request_id(), 7u);
  EXPECT_EQ(at_peer[0].error().code(), static_cast<uint32_t>(errc::stale_ref));
  EXPECT_TRUE(at_peer[0].error().fatal());
  EXPECT_EQ(owner.ended.size(), 1u);
}

TEST_F(ControlStreamTest, BeforeOpenAnOversizedFrameEndsItWithHandshakeFailedAndNoAnswer) {
  stream().start();
  peer_writes(header(options.handshake_frame_bytes + 1));
  ASSERT_TRUE(run_until([&] { return !owner.ended.empty(); }));
  EXPECT_EQ(owner.ended[0].ec, std::error_code(errc::handshake_failed));
  EXPECT_FALSE(owner.ended[0].peer_eof);
  run_until([] { return false; }, 50ms);
  EXPECT_TRUE(at_peer.empty());
}

TEST_F(ControlStreamTest, OnceOpenAnOversizedFrameIsAnsweredThenTheConnectionEnds) {
  stream().start();
  stream().open();
  wire::Envelope big;  // above the handshake's limit: accepted now
  big.mutable_transport_message()->set_payload(std::string(options.handshake_frame_bytes, 'x'));
  peer_writes(encode_frame(big) + header(options.max_frame_bytes + 1));
  ASSERT_TRUE(run_until([&] { return !owner.ended.empty() && !at_peer.empty(); }));
  EXPECT_EQ(owner.received.size(), 1u);
  EXPECT_EQ(owner.ended[0].ec, std::error_code(errc::frame_too_large));
  EXPECT_EQ(at_peer[0].error().code(), static_cast<uint32_t>(errc::frame_too_large));
  EXPECT_TRUE(at_peer[0].error().fatal());
}

TEST_F(ControlStreamTest, AnEnvelopeTheOwnerRejectsEndsTheConnectionAsAMalformedFrame) {
  stream().start();
  stream().open();
  owner.answer = errc::protocol_error;
  peer_writes(encode_frame(ping(1)));
  ASSERT_TRUE(run_until([&] { return !owner.ended.empty() && !at_peer.empty(); }));
  EXPECT_EQ(owner.ended[0].ec, std::error_code(errc::protocol_error));
  EXPECT_EQ(at_peer[0].error().code(), static_cast<uint32_t>(errc::protocol_error));
}

// The session runs out of memory handling a frame: the connection ends at once with
// resource_exhausted (everything on it fails promptly), rather than no longer being read.
TEST_F(ControlStreamTest, OutOfMemoryHandlingAFrameEndsTheConnection) {
  stream().start();
  stream().open();
  owner.out_of_memory = true;
  peer_writes(encode_frame(ping(1)));
  ASSERT_TRUE(run_until([&] { return !owner.ended.empty(); }));
  EXPECT_EQ(owner.ended[0].ec, std::error_code(errc::resource_exhausted));
  EXPECT_FALSE(owner.ended[0].peer_eof);
  EXPECT_TRUE(owner.received.empty());
}

TEST_F(ControlStreamTest, ThePeersEndIsReportedAsItsEofAndDrainingSendsNothing) {
  owner.drain_on_eof = true;
  stream().start();
  stream().open();
  peer.shutdown(tcp::socket::shutdown_send);
  ASSERT_TRUE(run_until([&] { return !owner.ended.empty(); }));
  EXPECT_EQ(owner.ended[0].ec, std::error_code(errc::peer_closed));
  EXPECT_TRUE(owner.ended[0].peer_eof);
  stream().drain();
  stream().send(ping(1));
  run_until([] { return false; }, 50ms);
  EXPECT_TRUE(at_peer.empty());
  EXPECT_EQ(owner.ended.size(), 1u);
}

TEST_F(ControlStreamTest, TheHeartbeatPingsAndEndsAPeerSilentPastItsTimeout) {
  options.heartbeat_interval = 10ms;
  options.peer_timeout = test::scaled(100ms);
  stream().start();
  stream().open();
  ASSERT_TRUE(run_until([&] { return !at_peer.empty(); }));
  EXPECT_TRUE(at_peer[0].has_ping());
  EXPECT_TRUE(owner.ended.empty());
  ASSERT_TRUE(run_until([&] { return !owner.ended.empty(); }));
  EXPECT_EQ(owner.ended[0].ec, std::error_code(errc::peer_unresponsive));
}

TEST_F(ControlStreamTest, APeerThatDoesNotReadItsQueueEndsTheConnection) {
  options.max_queued_bytes = 256;
  stream().start();
  wire::Envelope big;
  big.mutable_transport_message()->set_payload(std::string(200, 'x'));
  stream().send(big);
  EXPECT_TRUE(owner.ended.empty());
  stream().send(big);  // past the bound before any write: the peer is not reading
  // Not from inside send(): its caller may be walking tables that the owner's close clears.
  EXPECT_TRUE(owner.ended.empty());
  stream().send(ping(1));  // dropped: the connection is ending
  ASSERT_TRUE(run_until([&] { return !owner.ended.empty(); }));
  ASSERT_EQ(owner.ended.size(), 1u);
  EXPECT_EQ(owner.ended[0].ec, std::error_code(errc::peer_unresponsive));
  run_until([] { return false; }, 50ms);
  for (const auto& env : at_peer) EXPECT_FALSE(env.has_ping()) << "a frame sent after the end";
}

}  // namespace
}  // namespace ferry
