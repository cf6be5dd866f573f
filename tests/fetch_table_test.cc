// FetchTable over a fake SessionLink: launch, completion, deadlines, aborts, restarts,
// combining and fallback, each fetch completed exactly once.
#include "ferry/net/session/fetch_table.h"

#include <gtest/gtest.h>

#include <cstring>

#include "fake_session_link.h"
#include "tests/failing_allocation.h"

namespace ferry {
namespace {

using fakes::FakeSessionLink;
using fakes::FakeTransport;
using test::fails_within;
using namespace std::chrono_literals;

struct FetchTableTest : ::testing::Test {
  FetchTableTest() {
    one_sided = std::make_shared<FakeTransport>("ONE", true);
    two_sided = std::make_shared<FakeTransport>("TWO", false);
  }

  // A fetch state under the link's next request id (1, 3, ...), as Session::fetch makes it.
  std::shared_ptr<detail::FetchState> state() {
    return std::make_shared<detail::FetchState>(link.next_request_id(), link.io_.get_executor());
  }
  // A ref to object 7 of one tensor of `n` bytes.
  static ObjectRef ref(uint64_t n = 16) {
    ObjectRef r;
    r.object_id = 7;
    r.metadata.tensors.push_back(TensorMeta::bytes(n));
    return r;
  }
  // Starts fetch `s` of ref() into `target`.
  void start(const std::shared_ptr<detail::FetchState>& s, std::vector<std::byte>& target,
             FetchOptions options = {}) {
    table.start(s, ref(target.size()), {MutableBuffer(target)}, nullptr, std::move(options));
  }
  // Starts fetch `s` of ref() into `into` over transport `name` only.
  void start_over(const std::string& name, const std::shared_ptr<detail::FetchState>& s,
                  std::vector<std::byte>& into) {
    FetchOptions options;
    options.transport = name;
    start(s, into, std::move(options));
  }
  // Starts fetch 1 into `target` over the one-sided transport, whose channel does not exist yet:
  // its opening waits in link.opening (open_channel() ends it).
  std::shared_ptr<detail::FetchState> start_while_channel_opens(FetchOptions options = {}) {
    link.add_transport(one_sided, false);
    link.hold_channel_opens = true;
    auto s = state();
    start(s, target, std::move(options));
    EXPECT_EQ(link.opening.size(), 1u);
    return s;
  }
  // The channel start_while_channel_opens() waits for opens.
  void open_channel() {
    link.channels["ONE"] = std::make_shared<fakes::FakeChannel>(one_sided.get());
    link.opening.at(0).done({});
  }
  // The channel opens after the fetch completed: nothing is launched.
  void opens_too_late() {
    open_channel();
    EXPECT_TRUE(one_sided->fetches.empty());
    EXPECT_EQ(table.size(), 0u);
  }
  // Fetch `s` times out at `at`: armed and announced as the next deadline, not over a moment
  // before it, timed out at it.
  void expect_times_out_at(const std::shared_ptr<detail::FetchState>& s,
                           SessionLink::Clock::time_point at) {
    EXPECT_EQ(link.armed, at);
    EXPECT_EQ(table.next_deadline(), at);
    table.expire(at - 1ms);
    EXPECT_FALSE(s->done());
    table.expire(at);
    EXPECT_EQ(s->outcome(), std::error_code(errc::timed_out));
  }
  static FetchOptions within(std::chrono::milliseconds timeout) {
    FetchOptions options;
    options.timeout = timeout;
    return options;
  }
  // Launches fetch 1 into `target` over the one-sided transport, then its channel breaks: the
  // restart runs once `meanwhile` has changed what the link answers.
  std::shared_ptr<detail::FetchState> launch_then_restart(const std::function<void()>& meanwhile) {
    link.add_transport(one_sided, true);
    auto s = state();
    start(s, target);
    s->add_landed(8);
    table.restart(1, errc::device_error, 0);
    EXPECT_FALSE(s->done());
    EXPECT_EQ(table.size(), 0u);  // between channels
    meanwhile();
    link.run_posted();
    return s;
  }

  FakeSessionLink link;
  mem::Pool pool;
  FetchTable table{link, pool};
  std::shared_ptr<FakeTransport> one_sided, two_sided;
  std::vector<std::byte> target = std::vector<std::byte>(16);
};

TEST_F(FetchTableTest, LaunchesAtTheTransportAndAsksThePeer) {
  link.add_transport(one_sided, true);
  auto s = state();
  start(s, target);
  ASSERT_EQ(one_sided->fetches.size(), 1u);
  EXPECT_EQ(one_sided->fetches[0].request_id, 1u);
  EXPECT_EQ(one_sided->fetches[0].targets[0].data(), target.data());
  ASSERT_EQ(link.sent.size(), 1u);
  const auto& f = link.sent[0].fetch();
  EXPECT_EQ(link.sent[0].request_id(), 1u);
  EXPECT_EQ(f.object_id(), 7u);
  EXPECT_EQ(f.transport(), "ONE");
  ASSERT_EQ(f.sizes_size(), 1);
  EXPECT_EQ(f.sizes(0), 16u);
  EXPECT_TRUE(f.name().empty());
  EXPECT_TRUE(table.contains(1));
  EXPECT_EQ(link.armed, SessionLink::Clock::time_point::max());  // no deadline asked for

  table.complete(1, {});
  EXPECT_EQ(s->outcome(), std::error_code());
  EXPECT_EQ(s->result().transport, "ONE");
  EXPECT_EQ(table.size(), 0u);
  EXPECT_EQ(link.completed, 1);
  table.complete(1, errc::peer_closed);  // a second completion finds nothing
  EXPECT_EQ(s->outcome(), std::error_code());
  EXPECT_EQ(link.completed, 1);
}

TEST_F(FetchTableTest, WithoutTargetsTheBytesLandInPoolMemoryTheResultOwns) {
  link.add_transport(one_sided, true);
  auto s = state();
  table.start(s, ref(100), {}, nullptr, {});
  ASSERT_EQ(one_sided->fetches.size(), 1u);
  ASSERT_NE(s->result().storage, nullptr);
  EXPECT_EQ(one_sided->fetches[0].targets[0].size(), 100u);
  EXPECT_EQ(one_sided->fetches[0].targets[0].data(), s->result().storage.get());
}

TEST_F(FetchTableTest, MemoryTheCallerTookIsWhereTheBytesLand) {
  link.add_transport(one_sided, true);
  auto s = state();
  const auto r = ref(100);
  std::vector<MutableBuffer> slots;
  auto storage = FetchTable::allocate_slots(pool, r, slots);
  ASSERT_NE(storage, nullptr);
  ASSERT_EQ(slots.size(), 1u);
  const auto before = pool.counters();
  table.start(s, r, slots, storage, {});
  ASSERT_EQ(one_sided->fetches.size(), 1u);
  EXPECT_EQ(s->result().storage, storage);
  EXPECT_EQ(one_sided->fetches[0].targets[0].data(), storage.get());
  EXPECT_EQ(one_sided->fetches[0].targets[0].size(), 100u);
  EXPECT_EQ(pool.counters().hits + pool.counters().misses, before.hits + before.misses)
      << "the table took memory of its own as well";
}

// A transport out of memory as the fetch is launched (after it took the fetch): the fetch ends
// once, with resource_exhausted, the transport is told to let go, and the peer is never asked.
TEST_F(FetchTableTest, ATransportOutOfMemoryAtLaunchEndsTheFetchOnce) {
  link.add_transport(one_sided, true);
  one_sided->launch_throws = true;
  auto s = state();
  start(s, target);
  EXPECT_EQ(s->outcome(), std::error_code(errc::resource_exhausted));
  EXPECT_EQ(link.completed, 1);
  EXPECT_EQ(table.size(), 0u);
  EXPECT_EQ(one_sided->aborts, (std::vector<uint64_t>{s->id()}));
  EXPECT_TRUE(link.sent.empty());
  one_sided->launch_throws = false;
  auto next = state();
  start(next, target);
  EXPECT_EQ(table.size(), 1u);
}

TEST_F(FetchTableTest, TargetsThatDoNotMatchTheRefFailAtOnce) {
  link.add_transport(one_sided, true);
  auto s = state();
  std::vector<std::byte> small(8);
  table.start(s, ref(16), {MutableBuffer(small)}, nullptr, {});
  EXPECT_EQ(s->outcome(), std::error_code(errc::size_mismatch));
  EXPECT_TRUE(one_sided->fetches.empty());
  EXPECT_TRUE(link.sent.empty());
}

TEST_F(FetchTableTest, AnUnknownRequestedTransportFailsAtOnce) {
  link.add_transport(one_sided, true);
  auto s = state();
  start_over("NOPE", s, target);
  EXPECT_EQ(s->outcome(), std::error_code(errc::transport_unknown));
}

TEST_F(FetchTableTest, ALaunchTheTransportRefusesCompletesWithItsError) {
  link.add_transport(one_sided, true);
  one_sided->fail_launch = errc::resource_exhausted;
  auto s = state();
  start(s, target);
  EXPECT_EQ(s->outcome(), std::error_code(errc::resource_exhausted));
  EXPECT_EQ(table.size(), 0u);
  EXPECT_TRUE(link.sent.empty());  // the peer was never asked
}

TEST_F(FetchTableTest, TheDeadlineEndsTheFetchWithTimedOutAndACancel) {
  link.add_transport(one_sided, true);
  auto s = state();
  start(s, target, within(100ms));
  expect_times_out_at(s, link.clock + 100ms);
  EXPECT_EQ(one_sided->aborts, std::vector<uint64_t>{1});  // the transport let go first
  ASSERT_EQ(link.sent.size(), 2u);
  EXPECT_TRUE(link.sent[1].has_cancel());
  EXPECT_EQ(link.sent[1].request_id(), 1u);
  EXPECT_EQ(table.next_deadline(), SessionLink::Clock::time_point::max());
}

TEST_F(FetchTableTest, AnAbortWaitsUntilTheTransportHasLetGoOfTheTargets) {
  link.add_transport(one_sided, true);
  one_sided->abort_lets_go = false;  // READs still posted
  auto s = state();
  FetchOptions options;
  options.timeout = 100ms;
  start(s, target, options);
  table.abort(1, s);
  EXPECT_FALSE(s->done());
  EXPECT_EQ(link.sent.size(), 1u);  // no Cancel yet: the owner must keep its grant
  EXPECT_EQ(table.next_deadline(), SessionLink::Clock::time_point::max());  // none while releasing

  table.complete(1, {});  // the transport has drained
  EXPECT_EQ(s->outcome(), std::error_code(errc::aborted));
  ASSERT_EQ(link.sent.size(), 2u);
  EXPECT_TRUE(link.sent[1].has_cancel());
}

TEST_F(FetchTableTest, AnAbortBeforeTheChannelOpensCompletesAtOnce) {
  auto s = start_while_channel_opens();
  table.abort(1, s);
  EXPECT_EQ(s->outcome(), std::error_code(errc::aborted));
  opens_too_late();
}

TEST_F(FetchTableTest, TheDeadlineRunsWhileTheChannelOpens) {
  auto s = start_while_channel_opens(within(100ms));
  expect_times_out_at(s, link.clock + 100ms);
  EXPECT_EQ(link.sent.size(), 0u);  // nothing was asked of the peer
  EXPECT_EQ(table.next_deadline(), SessionLink::Clock::time_point::max());
  opens_too_late();
}

TEST_F(FetchTableTest, AFetchLaunchedAfterItsChannelOpenedKeepsTheDeadlineFromItsStart) {
  const auto started = link.clock;
  auto s = start_while_channel_opens(within(100ms));
  link.clock += 60ms;  // the channel takes 60 ms to open
  open_channel();
  ASSERT_EQ(one_sided->fetches.size(), 1u);
  expect_times_out_at(s, started + 100ms);
}

TEST_F(FetchTableTest, ARestartRelaunchesUnderANewRequestIdOnceTheChannelIsBack) {
  auto s = launch_then_restart([] {});
  ASSERT_EQ(one_sided->fetches.size(), 2u);
  EXPECT_EQ(one_sided->fetches[1].request_id, 3u);  // the link's next id of this side
  EXPECT_EQ(one_sided->fetches[1].targets[0].data(), target.data());
  EXPECT_EQ(s->result().restarts, 1u);
  EXPECT_EQ(s->landed(), 0u);  // every byte lands again
  EXPECT_EQ(link.sent.back().request_id(), 3u);

  table.abort(1, s);  // the caller's id still reaches the relaunched request
  EXPECT_EQ(s->outcome(), std::error_code(errc::aborted));
  EXPECT_EQ(one_sided->aborts, std::vector<uint64_t>{3});
}

TEST_F(FetchTableTest, ARestartWithoutANewChannelFailsWithTheBrokenChannelsError) {
  // The transport dropped the channel, and no new one opens.
  auto s = launch_then_restart([&] { link.channels.clear(); });
  EXPECT_EQ(s->outcome(), std::error_code(errc::device_error));
}

TEST_F(FetchTableTest, ARestartAfterTheSessionEndedFailsWithItsReason) {
  auto s = launch_then_restart([&] {
    link.open = false;
    link.reason = errc::peer_unresponsive;
  });
  EXPECT_EQ(s->outcome(), std::error_code(errc::peer_unresponsive));
}

// A restart whose channel open throws (out of memory: the session then ends) loses nothing: the
// session's end completes the fetch waiting for that channel, though no channel's end will.
TEST_F(FetchTableTest, ARestartWhoseChannelOpenThrowsIsCompletedWhenTheSessionEnds) {
  link.add_transport(one_sided, true);
  auto s = state();
  start(s, target);
  table.restart(1, errc::device_error, 0);
  link.channels.clear();
  link.channel_open_throws = true;
  EXPECT_THROW(link.run_posted(), std::bad_alloc);
  EXPECT_FALSE(s->done());
  table.close(errc::resource_exhausted);
  EXPECT_EQ(s->outcome(), std::error_code(errc::resource_exhausted));
}

TEST_F(FetchTableTest, RestartsAreBounded) {
  link.add_transport(one_sided, true);
  auto s = state();
  start(s, target);
  for (uint32_t i = 0; i < kMaxFetchRestarts; ++i) {
    table.restart(one_sided->fetches.back().request_id, errc::device_error, 0);
    link.run_posted();
  }
  EXPECT_EQ(s->result().restarts, kMaxFetchRestarts);
  ASSERT_FALSE(s->done());
  table.restart(one_sided->fetches.back().request_id, errc::device_error, 0);
  EXPECT_EQ(s->outcome(), std::error_code(errc::device_error));
}

TEST_F(FetchTableTest, ACombinedFetchLandsInSlotsAndCombinesOnSuccess) {
  link.add_transport(two_sided, true);
  auto s = state();
  std::vector<std::byte> acc(16, std::byte{1});
  FetchOptions options;
  options.combine = [](std::span<std::byte> into, std::span<const std::byte> arrived) {
    for (size_t i = 0; i < into.size(); ++i) into[i] = into[i] | arrived[i];
  };
  start(s, acc, options);
  ASSERT_EQ(two_sided->fetches.size(), 1u);
  const auto slot = two_sided->fetches[0].targets[0];
  EXPECT_NE(slot.data(), acc.data());  // the transport does not combine: our slot
  EXPECT_FALSE(two_sided->fetches[0].combine);
  std::memset(slot.data(), 2, slot.size());
  table.complete(1, {});
  EXPECT_EQ(s->outcome(), std::error_code());
  EXPECT_EQ(acc, std::vector<std::byte>(16, std::byte{3}));
}

TEST_F(FetchTableTest, ATransportThatCombinesGetsTheCombineAndIsNotRestarted) {
  auto streaming = std::make_shared<FakeTransport>("STREAM", false, true);
  link.add_transport(streaming, true);
  auto s = state();
  FetchOptions options;
  options.combine = [](std::span<std::byte>, std::span<const std::byte>) {};
  start(s, target, options);
  ASSERT_EQ(streaming->fetches.size(), 1u);
  EXPECT_TRUE(streaming->fetches[0].combine);
  EXPECT_EQ(streaming->fetches[0].targets[0].data(), target.data());
  table.restart(1, errc::device_error, 0);  // bytes may have been combined already
  EXPECT_EQ(s->outcome(), std::error_code(errc::device_error));
}

TEST_F(FetchTableTest, AFetchFallsBackWhenItsTransportsChannelCannotBeBuilt) {
  link.add_transport(one_sided, false);
  link.add_transport(two_sided, true);
  auto s = state();
  start(s, target);
  EXPECT_TRUE(one_sided->fetches.empty());
  ASSERT_EQ(two_sided->fetches.size(), 1u);
  EXPECT_EQ(s->result().transport, "TWO");
  EXPECT_EQ(link.sent[0].fetch().transport(), "TWO");
}

TEST_F(FetchTableTest, AFetchThatInsistsOnItsTransportDoesNotFallBack) {
  link.add_transport(one_sided, false);
  link.add_transport(two_sided, true);
  auto s = state();
  start_over("ONE", s, target);
  EXPECT_EQ(s->outcome(), std::error_code(errc::transport_unavailable));
  EXPECT_TRUE(two_sided->fetches.empty());
}

TEST_F(FetchTableTest, ANamedFetchTellsTheOwnerHowLongToWait) {
  link.add_transport(one_sided, true);
  auto s = state();
  ObjectRef r = ref(16);
  r.object_id = 0;
  r.name = "weights";
  FetchOptions options;
  options.timeout = 2500ms;
  table.start(s, r, {MutableBuffer(target)}, nullptr, options);
  ASSERT_EQ(link.sent.size(), 1u);
  EXPECT_EQ(link.sent[0].fetch().name(), "weights");
  EXPECT_EQ(link.sent[0].fetch().wait_ms(), 2500u);
}

TEST_F(FetchTableTest, OnlyTwoSidedFetchesAwaitThePeersBytes) {
  link.add_transport(one_sided, true);
  link.add_transport(two_sided, true);
  auto a = state();
  start(a, target);
  EXPECT_FALSE(table.awaits_peer_bytes());
  std::vector<std::byte> other(16);
  auto b = state();
  start_over("TWO", b, other);
  EXPECT_TRUE(table.awaits_peer_bytes());
  link.channels.erase("TWO");  // its channel ended: nothing more comes
  EXPECT_FALSE(table.awaits_peer_bytes());
}

TEST_F(FetchTableTest, CloseCompletesEveryLaunchedFetchWithTheReason) {
  link.add_transport(one_sided, true);
  auto a = state();
  auto b = state();
  std::vector<std::byte> other(16);
  start(a, target);
  start(b, other);
  table.close(errc::peer_closed);
  EXPECT_EQ(a->outcome(), std::error_code(errc::peer_closed));
  EXPECT_EQ(b->outcome(), std::error_code(errc::peer_closed));
  EXPECT_TRUE(one_sided->aborts.empty());  // the channels are closed by then
  EXPECT_EQ(table.size(), 0u);
}

// One fetch's table on a fresh link with one two-sided transport "TWO" (with its channel, or
// without: opening it then waits in link.opening), for the walks over allocations below.
struct OneFetch {
  OneFetch(bool combines, bool channel_open)
      : transport(std::make_shared<FakeTransport>("TWO", false, combines)),
        s(std::make_shared<detail::FetchState>(link.next_request_id(), link.io_.get_executor())) {
    link.add_transport(transport, channel_open);
    link.hold_channel_opens = !channel_open;
  }
  FakeSessionLink link;
  mem::Pool pool;
  FetchTable table{link, pool};
  std::shared_ptr<FakeTransport> transport;
  std::shared_ptr<detail::FetchState> s;
  std::vector<std::byte> target = std::vector<std::byte>(64);
  ObjectRef ref = FetchTableTest::ref(target.size());
};

// Out of memory anywhere on a fetch's way to its transport: in Session::fetch's step (which then
// fails the fetch) or in the step that runs once the channel opens (a posted one: the session
// then ends, closing the table). Whichever allocation fails, walked one by one until the fetch
// makes no more, the fetch completes: with resource_exhausted, or launched and ended by the
// session's end. Into targets and into pool memory, with and without a deadline, combining in
// slots or as the bytes stream, with checksums to check.
TEST(FetchTableAllocations, AFetchCompletesWhicheverAllocationOnItsWayFails) {
  enum class Combine { no, in_slots, streamed };
  struct Case {
    bool channel_open;  // else it opens after start()
    bool into_targets;
    bool deadline;
    Combine combine;
    bool checksum;
  };
  const Case cases[] = {
      {true, true, false, Combine::no, false},      {true, false, true, Combine::no, true},
      {false, true, false, Combine::no, false},     {false, false, false, Combine::no, true},
      {false, true, true, Combine::no, false},      {true, true, false, Combine::in_slots, false},
      {false, true, true, Combine::in_slots, true}, {true, true, false, Combine::streamed, true},
      {false, true, false, Combine::streamed, true}};
  for (const auto& c : cases) {
    SCOPED_TRACE(::testing::Message()
                 << "channel open " << c.channel_open << ", targets " << c.into_targets
                 << ", deadline " << c.deadline << ", combine " << static_cast<int>(c.combine)
                 << ", checksum " << c.checksum);
    size_t failures = 0;
    for (size_t n = 0;; ++n) {
      SCOPED_TRACE(::testing::Message() << "allocation " << n);
      OneFetch f(c.combine == Combine::streamed, c.channel_open);
      auto& [link, pool, table, transport, s, target, ref] = f;
      auto channel = std::make_shared<fakes::FakeChannel>(transport.get());
      if (c.checksum) ref.metadata.tensors[0].checksum = 0x1234;
      std::vector<MutableBuffer> targets;
      if (c.into_targets) targets.emplace_back(target);
      FetchOptions options;
      if (c.deadline) options.timeout = 5s;
      if (c.combine != Combine::no) {
        options.combine = [](std::span<std::byte>, std::span<const std::byte>) {};
      }
      size_t left = n;  // allocations to let through before the one that fails
      bool fired = fails_within(
          left, [&] { table.start(s, ref, targets, nullptr, options); },
          [&] { table.fail(*s, errc::resource_exhausted); });  // as Session::fetch's step does
      if (!fired && !c.channel_open) {
        ASSERT_EQ(link.opening.size(), 1u);
        auto done = std::move(link.opening.front().done);
        link.channels["TWO"] = channel;
        // As the session's end on out of memory does.
        fired = fails_within(
            left, [&] { done({}); }, [&] { table.close(errc::resource_exhausted); });
      }
      table.close(errc::peer_closed);  // the session ends: whatever is left completes
      ASSERT_TRUE(s->done()) << "a fetch was lost";
      if (!fired) {
        // No allocation failed: the fetch was launched, and the session's end completed it.
        EXPECT_EQ(transport->fetches.size(), 1u);
        EXPECT_EQ(s->outcome(), std::error_code(errc::peer_closed));
        break;
      }
      EXPECT_EQ(s->outcome(), std::error_code(errc::resource_exhausted));
      ++failures;
    }
    EXPECT_GT(failures, 3u) << "the walk saw too few allocations to mean anything";
  }
}

// A completion that logs (a checksum that differs), and one that fails (a timeout: the channel
// aborts the fetch and the owner is told to cancel): whichever allocation on its way fails, the
// fetch completes, with its own outcome or resource_exhausted when the session ended first. A
// log line that cannot be formatted is dropped, not thrown.
TEST(FetchTableAllocations, ACompletionCompletesWhicheverAllocationOnItsWayFails) {
  for (const std::error_code ends_with : {std::error_code(), make_error_code(errc::timed_out)}) {
    SCOPED_TRACE(ends_with ? "a timeout" : "success with another checksum");
    const std::error_code outcome = ends_with ? ends_with : make_error_code(errc::data_corrupted);
    size_t failures = 0;
    for (size_t n = 0;; ++n) {
      SCOPED_TRACE(::testing::Message() << "allocation " << n);
      OneFetch f(false, true);
      auto& [link, pool, table, transport, s, target, ref] = f;
      ref.metadata.tensors[0].checksum = 0x1234;  // not the CRC-32C of 64 zeros
      table.start(s, ref, {MutableBuffer(target)}, nullptr, {});
      ASSERT_EQ(transport->fetches.size(), 1u);
      size_t left = n;
      const bool fired = fails_within(
          left, [&] { table.complete(s->id(), ends_with); },
          [&] { table.close(errc::resource_exhausted); });
      table.close(errc::peer_closed);
      ASSERT_TRUE(s->done()) << "a fetch was lost";
      if (!fired) {
        EXPECT_EQ(s->outcome(), outcome);
        if (ends_with) EXPECT_TRUE(link.sent.back().has_cancel());
        break;
      }
      EXPECT_TRUE(s->outcome() == outcome || s->outcome() == errc::resource_exhausted)
          << s->outcome()->message();
      ++failures;
    }
    EXPECT_GT(failures, 0u) << "the walk saw no allocation";
  }
}

}  // namespace
}  // namespace ferry
