// async_dial against a loopback listener whose accepted end the test drives by hand: the first
// frame and its answer, the stream handed over, an Error answer, an oversized answer, a silent
// listener past the deadline, a refused port, and the caller's executor.
#include "ferry/net/connection/dialer.h"

#include <gtest/gtest.h>

#include <sys/socket.h>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/write.hpp>
#include <future>
#include <optional>
#include <thread>

#include "ferry/net/errors.h"
#include "ferry/net/frame.h"
#include "ferry/net/proto/wire_convert.h"
#include "test_util.h"

namespace ferry {
namespace {

using namespace std::chrono_literals;
using tcp = boost::asio::ip::tcp;

// The dial runs on an io thread; the test drives the accepted end with blocking calls, each
// bounded (a receive timeout on the socket, a polled accept).
struct DialerTest : ::testing::Test {
  DialerTest() : acceptor(io, tcp::endpoint(boost::asio::ip::address_v4::loopback(), 0)) {
    acceptor.non_blocking(true);
    io_thread = std::thread([this] { io.run(); });
  }
  ~DialerTest() override {
    work.reset();
    io.stop();
    io_thread.join();
  }

  HostPort target() const {
    return {"127.0.0.1", std::to_string(acceptor.local_endpoint().port())};
  }
  // Dials `to` from the io thread; outcome() waits for the result.
  void dial(DialOptions options, HostPort to) {
    async_dial(io, io.get_executor(), std::move(to), std::move(options),
               [this](Result<Dialed> r) { promise.set_value(std::move(r)); });
  }
  // The dial's result, once it completed within `limit` (scaled); fails the test otherwise.
  Result<Dialed> outcome(std::chrono::milliseconds limit = 5000ms) {
    auto future = promise.get_future();
    if (future.wait_for(test::scaled(limit)) != std::future_status::ready) {
      ADD_FAILURE() << "the dial did not complete";
      return errc::aborted;
    }
    return future.get();
  }
  // Accepts the dial's connection within 5 s (scaled).
  void accept_peer() {
    const auto deadline = std::chrono::steady_clock::now() + test::scaled(5s);
    boost::system::error_code ec = boost::asio::error::would_block;
    while (ec && std::chrono::steady_clock::now() < deadline) {
      acceptor.accept(peer, ec);
      if (ec) std::this_thread::sleep_for(5ms);
    }
    ASSERT_FALSE(ec) << ec.message();
    const timeval limit{static_cast<time_t>(test::scaled(5s).count() / 1000), 0};
    setsockopt(peer.native_handle(), SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof(limit));
  }
  // Reads one frame from the dialled side at the peer's end.
  wire::Envelope read_frame_at_peer() {
    std::array<unsigned char, kFrameHeaderBytes> header{};
    boost::asio::read(peer, boost::asio::buffer(header));
    std::string body(decode_frame_length(header.data()), '\0');
    boost::asio::read(peer, boost::asio::buffer(body));
    wire::Envelope env;
    EXPECT_FALSE(parse_envelope(body, env));
    return env;
  }
  static DialOptions attach_options() {
    wire::Envelope env;
    env.mutable_attach_channel()->set_transport("TCP");
    DialOptions o;
    o.deadline = test::scaled(5s);
    o.first_frame = encode_frame(env);
    return o;
  }

  boost::asio::io_context io;
  std::optional<boost::asio::executor_work_guard<boost::asio::io_context::executor_type>> work{
      io.get_executor()};
  tcp::acceptor acceptor;
  tcp::socket peer{io};
  std::promise<Result<Dialed>> promise;
  std::thread io_thread;
};

TEST_F(DialerTest, TheFirstFrameIsAnsweredAndTheStreamHandedOver) {
  dial(attach_options(), target());
  accept_peer();
  EXPECT_EQ(read_frame_at_peer().attach_channel().transport(), "TCP");
  wire::Envelope ack;
  ack.mutable_ack();
  boost::asio::write(peer, boost::asio::buffer(encode_frame(ack)));
  auto dialed = outcome();
  ASSERT_TRUE(dialed.ok()) << dialed.error().message();
  EXPECT_TRUE(dialed->answer.has_ack());
  // The stream is connected to the peer and reads what it writes next.
  boost::asio::write(peer, boost::asio::buffer(std::string("after")));
  std::string got(5, '\0');
  boost::asio::read(dialed->stream.socket(), boost::asio::buffer(got));
  EXPECT_EQ(got, "after");
}

TEST_F(DialerTest, WithoutAFirstFrameNothingIsSentOrAwaited) {
  dial(DialOptions{.deadline = test::scaled(5s)}, target());
  accept_peer();
  auto dialed = outcome();
  ASSERT_TRUE(dialed.ok()) << dialed.error().message();
  boost::system::error_code ec;
  EXPECT_EQ(peer.available(ec), 0u);
  EXPECT_FALSE(ec);
}

TEST_F(DialerTest, AnErrorAnswerEndsTheDialWithItsCode) {
  dial(attach_options(), target());
  accept_peer();
  read_frame_at_peer();
  wire::Envelope err;
  err.mutable_error()->set_code(error_to_wire(errc::handshake_failed));
  err.mutable_error()->set_fatal(true);
  boost::asio::write(peer, boost::asio::buffer(encode_frame(err)));
  EXPECT_EQ(outcome().error(), errc::handshake_failed);
}

TEST_F(DialerTest, AnAnswerLargerThanTheLimitIsAProtocolError) {
  auto options = attach_options();
  options.max_answer_bytes = 64;
  dial(options, target());
  accept_peer();
  read_frame_at_peer();
  const uint32_t announced = 65;  // one byte over; never sent
  std::array<unsigned char, 4> header{
      static_cast<unsigned char>(announced >> 24), static_cast<unsigned char>(announced >> 16),
      static_cast<unsigned char>(announced >> 8), static_cast<unsigned char>(announced)};
  ASSERT_EQ(decode_frame_length(header.data()), announced);
  boost::asio::write(peer, boost::asio::buffer(header));
  EXPECT_EQ(outcome().error(), errc::protocol_error);
}

TEST_F(DialerTest, AListenerThatNeverAnswersEndsTheDialAtTheDeadline) {
  auto options = attach_options();
  options.deadline = 200ms;
  const auto start = std::chrono::steady_clock::now();
  dial(options, target());
  accept_peer();
  EXPECT_EQ(outcome(10s).error(), errc::timed_out);
  EXPECT_GE(std::chrono::steady_clock::now() - start, 200ms);
}

TEST_F(DialerTest, APortNobodyListensOnIsRefused) {
  const auto port = acceptor.local_endpoint().port();
  acceptor.close();
  dial(attach_options(), {"127.0.0.1", std::to_string(port)});
  EXPECT_EQ(outcome().error(), errc::connection_refused);
}

TEST_F(DialerTest, TheHandlerRunsOnTheCallersExecutor) {
  auto strand = boost::asio::make_strand(io);
  bool on_strand = false;
  const auto port = acceptor.local_endpoint().port();
  acceptor.close();
  async_dial(io, strand, {"127.0.0.1", std::to_string(port)}, attach_options(),
             [&](Result<Dialed> r) {
               on_strand = strand.running_in_this_thread();
               promise.set_value(std::move(r));
             });
  EXPECT_FALSE(outcome().ok());
  EXPECT_TRUE(on_strand);
}

}  // namespace
}  // namespace ferry
