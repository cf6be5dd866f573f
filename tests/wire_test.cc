// Framing, ObjectRef encodings, error codes and scopes, the registry, FetchState.
#include <gtest/gtest.h>

#include <boost/asio/io_context.hpp>
#include <functional>
#include <future>
#include <thread>

#include "ferry/net/frame.h"
#include "ferry/net/loop_gate.h"
#include "ferry/net/proto/ferry.pb.h"
#include "ferry/net/stats.h"
#include "tests/failing_allocation.h"
#include "tests/test_util.h"

namespace ferry {
namespace {

using namespace std::chrono_literals;

std::string frame_with(uint64_t rid) {
  wire::Envelope env;
  env.set_request_id(rid);
  env.mutable_ping()->set_nonce(rid);
  return encode_frame(env);
}

TEST(FrameDecoder, SplitsAndJoinsFramesFedInAnyPieces) {
  std::string stream;
  for (uint64_t i = 1; i <= 50; ++i) stream += frame_with(i);
  for (size_t piece : {1u, 3u, 7u, 64u, 4096u}) {
    FrameDecoder decoder;
    std::vector<uint64_t> seen;
    for (size_t pos = 0; pos < stream.size(); pos += piece) {
      auto ec = decoder.feed(std::string_view(stream).substr(pos, piece), [&](std::string_view b) {
        wire::Envelope env;
        EXPECT_FALSE(parse_envelope(b, env));
        seen.push_back(env.request_id());
        return std::error_code{};
      });
      ASSERT_FALSE(ec);
    }
    ASSERT_EQ(seen.size(), 50u) << "piece " << piece;
    for (uint64_t i = 0; i < 50; ++i) EXPECT_EQ(seen[i], i + 1);
    EXPECT_EQ(decoder.pending_bytes(), 0u);
  }
}

TEST(FrameDecoder, RejectsOversizeLengthBeforeBuffering) {
  FrameDecoder decoder(1024);
  const char header[4] = {'\xff', '\xff', '\xff', '\xff'};
  int frames = 0;
  auto ec = decoder.feed(std::string_view(header, 4), [&](std::string_view) {
    ++frames;
    return std::error_code{};
  });
  EXPECT_EQ(ec, errc::frame_too_large);
  EXPECT_EQ(frames, 0);
  EXPECT_EQ(decoder.pending_bytes(), 0u);
  // Unusable afterwards.
  EXPECT_EQ(decoder.feed(frame_with(1), [](std::string_view) { return std::error_code{}; }),
            errc::protocol_error);
}

TEST(FrameDecoder, GarbageBodyIsAProtocolError) {
  wire::Envelope env;
  EXPECT_EQ(parse_envelope("\xff\xff\xff\xff\xff", env), errc::protocol_error);
}

TEST(ObjectRef, RoundTripsInBinaryAndText) {
  ObjectRef ref;
  ref.owner = "10.0.0.1:7000";
  ref.object_id = 42;
  ref.owner_instance = 99;
  ref.metadata.transport = "TCP";
  ref.metadata.extension = std::string("\x00\x01rkey", 6);
  ref.metadata.tensors.push_back(TensorMeta::dense({4, 5}, DType::kBFloat16, "cpu"));
  ref.metadata.tensors.push_back(TensorMeta::bytes(0));
  auto parsed = ObjectRef::parse(ref.serialize());
  ASSERT_TRUE(parsed.ok());
  EXPECT_EQ(*parsed, ref);
  auto text = ref.to_string();
  EXPECT_EQ(text.rfind("ferry1:", 0), 0u);
  auto back = ObjectRef::from_string(text);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, ref);
  EXPECT_EQ(back->metadata.total_bytes(), 40u);
}

TEST(ObjectRef, RejectsMalformedInput) {
  EXPECT_EQ(ObjectRef::from_string("nope").error(), errc::invalid_argument);
  EXPECT_EQ(ObjectRef::from_string("ferry1:***").error(), errc::invalid_argument);
  EXPECT_EQ(ObjectRef::parse("\xff\xff\xff").error(), errc::invalid_argument);
  ObjectRef zero;  // object id 0 is never valid
  EXPECT_FALSE(ObjectRef::parse(zero.serialize()).ok());
}

TEST(Errors, CarryScopes) {
  EXPECT_EQ(scope_of(make_error_code(errc::timed_out)), Scope::operation);
  EXPECT_EQ(scope_of(make_error_code(errc::aborted)), Scope::operation);
  EXPECT_EQ(scope_of(make_error_code(errc::peer_closed)), Scope::peer);
  EXPECT_EQ(scope_of(make_error_code(errc::frame_too_large)), Scope::peer);
  EXPECT_EQ(scope_of(make_error_code(errc::transport_unknown)), Scope::operation);
  EXPECT_EQ(scope_of(make_error_code(errc::device_error)), Scope::device);
  EXPECT_EQ(scope_of(make_error_code(errc::context_closed)), Scope::context);
  EXPECT_EQ(scope_of(std::make_error_code(std::errc::connection_reset)), Scope::peer);
  EXPECT_EQ(scope_of(std::error_code{}), Scope::none);
  EXPECT_EQ(make_error_code(errc::object_not_found).message(), "object not found on its owner");
  // The Asio completion form keeps the category and compares equal to the enum.
  boost::system::error_code bec(make_error_code(errc::aborted));
  EXPECT_TRUE(bec == errc::aborted);
  EXPECT_EQ(std::error_code(bec), errc::aborted);
}

TEST(Registry, TypedErrorsForBadRegistrations) {
  auto factory = [](const TransportEnv&) -> Result<std::shared_ptr<TransportManager>> {
    return std::shared_ptr<TransportManager>(std::make_shared<test::FakeTransport>("REG"));
  };
  EXPECT_EQ(register_transport("", {"cpu"}, factory), errc::invalid_argument);
  EXPECT_EQ(register_transport("REG", {"cpu"}, nullptr), errc::invalid_argument);
  EXPECT_FALSE(register_transport("REG", {"cpu"}, factory));
  EXPECT_EQ(register_transport("REG", {"cpu"}, factory), errc::transport_duplicate);
  EXPECT_EQ(register_transport("TCP", {"cpu"}, factory), errc::transport_duplicate);
  bool listed = false;
  for (const auto& t : registered_transports()) listed |= t.name == "REG";
  EXPECT_TRUE(listed);
  EXPECT_FALSE(unregister_transport("REG"));
  EXPECT_EQ(unregister_transport("REG"), errc::transport_unknown);
}

TEST(Registry, ContextRejectsUnknownTransportNames) {
  auto ctx = Context::create({.transports = {"TCP", "NO-SUCH"}});
  ASSERT_FALSE(ctx.ok());
  EXPECT_EQ(ctx.error(), errc::transport_unknown);
  auto ok = Context::create({.transports = {"TCP"}});
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ((*ok)->transports(), std::vector<std::string>{"TCP"});
}

// wait() answers timed_out both for a wait that ran out and for a fetch that timed out;
// outcome() tells them apart (the collectives once took a fetch that succeeded as it was
// being waited on for one that timed out).
TEST(FetchState, OutcomeSeparatesTheFetchsResultFromTheWaits) {
  boost::asio::io_context io;
  auto ok = std::make_shared<detail::FetchState>(1, io.get_executor());
  FetchRequest req(ok);
  EXPECT_EQ(req.wait(0ms), errc::timed_out);  // the wait ran out...
  EXPECT_FALSE(req.outcome().has_value());    // ...the fetch is still in flight
  ok->complete({});
  ASSERT_TRUE(req.outcome().has_value());
  EXPECT_FALSE(*req.outcome());  // success
  auto late = std::make_shared<detail::FetchState>(3, io.get_executor());
  late->complete(make_error_code(errc::timed_out));
  EXPECT_EQ(FetchRequest(late).outcome(), std::error_code(errc::timed_out));  // its own deadline
  EXPECT_EQ(FetchRequest().outcome(), std::error_code(errc::invalid_argument));
}

// Out of memory as a fetch completes: whichever allocation fails, walked one by one, the handler
// runs exactly once with the fetch's outcome and waiters wake; a count may be lost, nothing else.
// (Asio allocates the queued handler with aligned_alloc, not operator new, so the walk does not
// reach it; post_completion runs the handler inline when that fails.)
TEST(FetchState, ItsHandlerRunsOnceWhicheverAllocationOfItsCompletionFails) {
  size_t failures = 0;
  for (size_t n = 0;; ++n) {
    SCOPED_TRACE(::testing::Message() << "allocation " << n);
    boost::asio::io_context io;
    auto stats = std::make_shared<detail::StatsRecorder>();
    auto s = std::make_shared<detail::FetchState>(1, io.get_executor());
    s->set_stats(stats, std::chrono::steady_clock::now());
    s->result().transport = "TCP";
    int calls = 0;
    boost::system::error_code got;
    s->set_handler([&](boost::system::error_code ec, FetchResult) {
      ++calls;
      got = ec;
    });
    size_t left = n;
    bool completed = false;
    const bool fired = test::fails_within(
        left,
        [&] { completed = s->complete(errc::size_mismatch); },  // counted by name: a map entry
        [] { ADD_FAILURE() << "complete() threw"; });
    EXPECT_TRUE(completed);
    EXPECT_EQ(FetchRequest(s).wait(0ms), errc::size_mismatch);
    io.run();
    EXPECT_EQ(calls, 1);
    EXPECT_EQ(std::error_code(got), errc::size_mismatch);
    EXPECT_FALSE(s->complete({}));  // once
    if (!fired) {
      EXPECT_EQ(stats->snapshot().fetch_errors.at("size_mismatch"), 1u);
      break;
    }
    ++failures;
  }
  EXPECT_GT(failures, 0u) << "the walk saw no allocation: the count was not made";
}

// With a wait spin (the context's idle_spin), wait() polls before it sleeps: a poll still only
// looks, a wait still ends at its timeout (the spin does not extend it), and a completion from
// another thread during the spin or after it is seen.
TEST(FetchState, AWaitThatSpinsFirstKeepsItsTimeoutAndSeesTheCompletion) {
  boost::asio::io_context io;
  auto state = std::make_shared<detail::FetchState>(1, io.get_executor(), 300ms);
  FetchRequest req(state);
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(req.wait(0ms), errc::timed_out);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, test::scaled(100ms));  // a poll does not spin
  t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(req.wait(40ms), errc::timed_out);
  const auto waited = std::chrono::steady_clock::now() - t0;
  EXPECT_GE(waited, 40ms);
  EXPECT_LT(waited, 40ms + test::scaled(200ms)) << "the spin outlasted the wait's timeout";
  for (auto delay : {10ms, 400ms}) {  // during the spin, and after it (asleep)
    auto spinning = std::make_shared<detail::FetchState>(2, io.get_executor(), 300ms);
    std::thread completer([&] {
      std::this_thread::sleep_for(delay);
      spinning->complete(make_error_code(errc::aborted));
    });
    EXPECT_EQ(FetchRequest(spinning).wait(-1ms), errc::aborted) << delay.count();
    completer.join();
  }
}

TEST(FetchState, CompletesExactlyOnceAndWaitsAreBounded) {
  boost::asio::io_context io;
  auto state = std::make_shared<detail::FetchState>(1, io.get_executor());
  FetchRequest req(state);
  EXPECT_EQ(req.wait(0ms), errc::timed_out);  // poll
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(req.wait(50ms), errc::timed_out);
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 50ms);
  int calls = 0;
  std::error_code seen;
  state->set_handler(FetchHandler([&](boost::system::error_code ec, FetchResult) {
    ++calls;
    seen = ec;
  }));
  EXPECT_TRUE(state->complete(make_error_code(errc::aborted)));
  EXPECT_FALSE(state->complete({}));  // too late: the first completion stands
  EXPECT_EQ(calls, 0);                // never inline
  io.run();
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(seen, errc::aborted);
  EXPECT_EQ(req.wait(-1ms), errc::aborted);
}

// A post through a LoopGate lands in its loop until the gate closes; after that the gate refuses
// and leaves the work with the caller, and a fetch that completes then (a session destroyed after
// its context's last loop run) is delivered by the system executor, once, instead of sitting in
// a loop that never runs again.
TEST(LoopGate, PostsLandUntilItClosesThenTheCallerKeepsTheWork) {
  boost::asio::io_context io;
  auto gate = std::make_shared<LoopGate>();
  int ran = 0;
  std::function<void()> fn = [&] { ++ran; };
  EXPECT_TRUE(gate->post(io.get_executor(), fn));
  EXPECT_FALSE(fn) << "a post that landed took the work";
  gate->close();
  EXPECT_FALSE(gate->is_open());
  fn = [&] { ++ran; };
  EXPECT_FALSE(gate->post(io.get_executor(), fn));
  ASSERT_TRUE(fn) << "a refused post took the work";
  io.run();
  EXPECT_EQ(ran, 1) << "only the post before the close reached the loop";

  auto late = std::make_shared<detail::FetchState>(1, io.get_executor(), 0us, gate);
  std::promise<std::error_code> delivered;
  late->set_handler(
      FetchHandler([&](boost::system::error_code ec, FetchResult) { delivered.set_value(ec); }));
  EXPECT_TRUE(late->complete(make_error_code(errc::context_closed)));
  auto got = delivered.get_future();
  ASSERT_EQ(got.wait_for(test::scaled(10s)), std::future_status::ready)
      << "a completion after the loop's last run was never delivered";
  EXPECT_EQ(got.get(), errc::context_closed);
  io.restart();
  EXPECT_EQ(io.poll(), 0u) << "the completion also went to the loop";
}

TEST(FetchState, RacingCompletionsProduceOneWinner) {
  boost::asio::io_context io;
  for (int round = 0; round < 500; ++round) {
    auto state = std::make_shared<detail::FetchState>(round, io.get_executor());
    std::atomic<int> winners{0};
    std::thread a([&] { winners += state->complete({}); });
    std::thread b([&] { winners += state->complete(make_error_code(errc::aborted)); });
    a.join();
    b.join();
    ASSERT_EQ(winners, 1);
  }
}

}  // namespace
}  // namespace ferry
