// ServeTable over a fake SessionLink and a real ObjectStore: what is served and what refused,
// fetches parked by name, cancels, the owner's aborts, and failed serves settled later.
#include "ferry/net/session/serve_table.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "fake_session_link.h"
#include "tests/failing_allocation.h"

namespace ferry {
namespace {

using fakes::FakeSessionLink;
using fakes::FakeTransport;
using test::fails_within;
using namespace std::chrono_literals;

// The accepting side's table: the peer connected, so its request ids are odd.
struct ServeTableTest : ::testing::Test {
  ServeTableTest() { link.add_transport(transport, true); }

  ObjectId put(size_t n = 16) {
    auto mem = std::make_shared<std::vector<std::byte>>(n);
    return store.put({Tensor::bytes(*mem)}, mem, "T");
  }
  // The peer's Fetch of object `id` (`n` bytes) over transport T.
  static wire::Fetch fetch_of(ObjectId id, uint64_t n = 16) {
    wire::Fetch msg;
    msg.set_object_id(id);
    msg.set_transport("T");
    msg.add_sizes(n);
    return msg;
  }
  // The peer's Fetch of the object named `name`, waiting at most `wait_ms` for it.
  static wire::Fetch named(const std::string& name, uint64_t wait_ms) {
    wire::Fetch msg;
    msg.set_name(name);
    msg.set_transport("T");
    msg.set_wait_ms(wait_ms);
    msg.add_sizes(16);
    return msg;
  }
  Stats stats() const { return recorder.snapshot(); }

  FakeSessionLink link{false};
  std::shared_ptr<FakeTransport> transport = std::make_shared<FakeTransport>("T", false);
  ObjectStore store;
  detail::StatsRecorder recorder;
  ServeTable table{link, store, recorder, ServeTable::Options{"owner", 42, 4, 1000ms}};
};

TEST_F(ServeTableTest, ServesAPutObjectOverTheTransportItAsksFor) {
  const ObjectId id = put();
  int sent = 0, served = 0;
  ASSERT_TRUE(store.set_serve_hooks(
      id, [&] { ++sent; }, [&] { ++served; }));
  table.serve(1, fetch_of(id));
  ASSERT_EQ(transport->sends.size(), 1u);
  EXPECT_EQ(transport->pins.at(1).object().id, id);
  EXPECT_EQ(table.serving(), 1u);
  EXPECT_EQ(store.counts(id)->pins, 1u);
  EXPECT_TRUE(link.errors().empty());

  transport->finish_send(1, {});
  EXPECT_EQ(table.serving(), 0u);
  EXPECT_EQ(sent, 1);
  EXPECT_EQ(served, 1);
  EXPECT_EQ(store.counts(id)->pins, 0u);
  EXPECT_TRUE(link.errors().empty());
}

// A transport that runs out of memory in send_multiple, before it called `done`: the serve
// ends there, once, with resource_exhausted for the fetcher; the `done` it kept is a no-op.
TEST_F(ServeTableTest, ATransportOutOfMemoryEndsTheServeOnce) {
  const ObjectId id = put();
  transport->send_throws = true;
  table.serve(1, fetch_of(id));
  using Errors = std::vector<std::pair<uint64_t, std::error_code>>;
  EXPECT_EQ(link.errors(), (Errors{{1, errc::resource_exhausted}}));
  EXPECT_EQ(table.serving(), 0u);
  EXPECT_EQ(store.counts(id)->pins, 0u);
  EXPECT_EQ(stats().serves_failed, 1u);
  transport->finish_send(1, {});  // the copy it kept, run late
  EXPECT_EQ(link.errors().size(), 1u);
  EXPECT_EQ(stats().serves_failed, 1u);
  EXPECT_EQ(stats().serves_succeeded, 0u);
  // The next request is served as usual.
  transport->send_throws = false;
  table.serve(3, fetch_of(id));
  EXPECT_EQ(table.serving(), 1u);
  transport->finish_send(3, {});
  EXPECT_EQ(stats().serves_succeeded, 1u);
  // One the transport fails is reported to the fetcher and counted once.
  table.serve(5, fetch_of(id));
  transport->finish_send(5, errc::peer_closed);
  EXPECT_EQ(link.errors(), (Errors{{1, errc::resource_exhausted}, {5, errc::peer_closed}}));
  EXPECT_EQ(stats().serves_failed, 2u);
}

TEST_F(ServeTableTest, RefusesIdsOfThisSidesParityAndIdsInUse) {
  const ObjectId id = put();
  table.serve(2, fetch_of(id));  // even: this side's own ids
  table.serve(1, fetch_of(id));
  table.serve(1, fetch_of(id));           // in use
  const uint64_t top = (1ull << 63) + 1;  // the top bit is the transports' (RDMA tags binds)
  table.serve(top, fetch_of(id));
  using Errors = std::vector<std::pair<uint64_t, std::error_code>>;
  EXPECT_EQ(link.errors(), (Errors{{2, errc::invalid_argument},
                                   {1, errc::invalid_argument},
                                   {top, errc::invalid_argument}}));
  EXPECT_EQ(table.serving(), 1u);
}

TEST_F(ServeTableTest, RefusesMoreThanMaxRequestsAtOnce) {
  const ObjectId id = put();
  for (uint64_t rid = 1; rid <= 9; rid += 2) table.serve(rid, fetch_of(id));
  EXPECT_EQ(table.serving(), 4u);
  using Errors = std::vector<std::pair<uint64_t, std::error_code>>;
  EXPECT_EQ(link.errors(), (Errors{{9, errc::overloaded}}));
}

TEST_F(ServeTableTest, RefusalsSayWhyAndAreCounted) {
  const ObjectId id = put();
  auto stale = fetch_of(id);
  stale.set_owner_instance(41);
  table.serve(1, stale);
  table.serve(3, fetch_of(id + 100));
  table.serve(5, fetch_of(id, 8));
  auto unknown = fetch_of(id);
  unknown.set_transport("NOPE");
  table.serve(7, unknown);
  link.channels.clear();
  table.serve(9, fetch_of(id));
  using Errors = std::vector<std::pair<uint64_t, std::error_code>>;
  EXPECT_EQ(link.errors(), (Errors{{1, errc::stale_ref},
                                   {3, errc::object_not_found},
                                   {5, errc::size_mismatch},
                                   {7, errc::transport_unknown},
                                   {9, errc::transport_unavailable}}));
  EXPECT_EQ(table.serving(), 0u);
  EXPECT_TRUE(transport->sends.empty());
  EXPECT_EQ(store.counts(id)->pins, 0u);
  EXPECT_EQ(stats().serves_failed, 5u);
}

TEST_F(ServeTableTest, AnExclusiveObjectIsServedOnlyOverItsTransport) {
  auto other = std::make_shared<FakeTransport>("U", false);
  link.add_transport(other, true);
  auto mem = std::make_shared<std::vector<std::byte>>(16);
  const ObjectId id = store.put({Tensor::bytes(*mem)}, mem, "T");
  ASSERT_TRUE(store.set_exclusive(id));
  auto msg = fetch_of(id);
  msg.set_transport("U");
  table.serve(1, msg);
  using Errors = std::vector<std::pair<uint64_t, std::error_code>>;
  EXPECT_EQ(link.errors(), (Errors{{1, errc::transport_unavailable}}));
}

TEST_F(ServeTableTest, AFetchByNameWaitsForThePut) {
  table.serve(1, named("weights", 5000));
  EXPECT_EQ(table.parked(), 1u);
  EXPECT_EQ(link.name_waits, 1);
  EXPECT_EQ(link.armed, link.clock + 1000ms);  // the lease timeout bounds the fetcher's wait
  EXPECT_EQ(table.next_deadline(), link.clock + 1000ms);

  table.on_named("other");
  EXPECT_EQ(table.parked(), 1u);
  link.names["weights"] = put();
  table.on_named("weights");
  EXPECT_EQ(table.parked(), 0u);
  EXPECT_EQ(table.serving(), 1u);
  EXPECT_TRUE(link.errors().empty());
  EXPECT_EQ(table.next_deadline(), SessionLink::Clock::time_point::max());
}

TEST_F(ServeTableTest, AParkedFetchEndsWithTimedOutWhenItsWaitEnds) {
  table.serve(1, named("weights", 200));
  EXPECT_EQ(link.armed, link.clock + 200ms);
  table.expire(link.clock + 199ms);
  EXPECT_EQ(table.parked(), 1u);
  table.expire(link.clock + 200ms);
  EXPECT_EQ(table.parked(), 0u);
  using Errors = std::vector<std::pair<uint64_t, std::error_code>>;
  EXPECT_EQ(link.errors(), (Errors{{1, errc::timed_out}}));
  EXPECT_EQ(link.forgotten, std::vector<std::string>{"weights"});
}

TEST_F(ServeTableTest, ACancelForgetsAParkedFetchAndAbortsAServe) {
  table.serve(1, named("weights", 5000));
  table.cancel(1);
  EXPECT_EQ(table.parked(), 0u);
  EXPECT_EQ(link.forgotten, std::vector<std::string>{"weights"});
  EXPECT_TRUE(transport->aborts.empty());

  const ObjectId id = put();
  table.serve(3, fetch_of(id));
  table.cancel(3);
  EXPECT_EQ(transport->aborts, std::vector<uint64_t>{3});
  table.cancel(5);  // unknown: nothing to stop
  EXPECT_EQ(transport->aborts, std::vector<uint64_t>{3});
  EXPECT_TRUE(link.errors().empty());
}

// An object that prefers another transport but is not exclusive to it, served over T anyway (a
// fetcher's fallback): T is named among those that collect it, since it may hold registrations
// of the object's memory (RDMA does); its own transport is not repeated there.
TEST_F(ServeTableTest, AnObjectServedOverAnotherTransportIsCollectedByItToo) {
  std::vector<std::string> over;
  store.set_gc_hook([&](const StoredObject& object) { over = object.served_over; });
  auto mem = std::make_shared<std::vector<std::byte>>(16);
  const ObjectId id = store.put({Tensor::bytes(*mem)}, mem, "OTHER");
  table.serve(1, fetch_of(id));
  table.serve(3, fetch_of(id));
  ASSERT_EQ(transport->sends.size(), 2u);
  transport->finish_send(1, {});
  transport->finish_send(3, {});
  store.release(id);
  EXPECT_EQ(over, std::vector<std::string>{"T"});
  const ObjectId own = store.put({Tensor::bytes(*mem)}, mem, "T");
  table.serve(5, fetch_of(own));
  transport->finish_send(5, {});
  store.release(own);
  EXPECT_TRUE(over.empty());
}

// Fetches waiting for a name hold copies of their requests: bounded in bytes, past which they
// are refused (overloaded) with their wait forgotten; a wait that ends makes room again.
TEST_F(ServeTableTest, FetchesWaitingForANameHoldBoundedBytes) {
  ServeTable small{link, store, recorder, ServeTable::Options{"owner", 42, 4, 1000ms, 1000}};
  const std::string long_name(300, 'n');
  small.serve(1, named(long_name + "1", 5000));
  EXPECT_EQ(small.parked(), 1u);
  small.serve(3, named(long_name + "3", 5000));  // about 660 bytes each: past the bound
  EXPECT_EQ(small.parked(), 1u);
  using Errors = std::vector<std::pair<uint64_t, std::error_code>>;
  EXPECT_EQ(link.errors(), (Errors{{3, errc::overloaded}}));
  EXPECT_EQ(link.forgotten, std::vector<std::string>{long_name + "3"});
  small.cancel(1);
  small.serve(5, named(long_name + "5", 5000));
  EXPECT_EQ(small.parked(), 1u);
  EXPECT_EQ(link.errors().size(), 1u);
  small.close();
}

TEST_F(ServeTableTest, TheOwnersAbortFailsEachServeOfTheObjectOnce) {
  const ObjectId id = put();
  const ObjectId other = put();
  table.serve(1, fetch_of(id));
  table.serve(3, fetch_of(id));
  table.serve(5, fetch_of(other));
  table.abort_object(id);
  table.abort_object(id);  // already aborted: no second word
  auto errors = link.errors();
  std::sort(errors.begin(), errors.end());
  using Errors = std::vector<std::pair<uint64_t, std::error_code>>;
  EXPECT_EQ(errors, (Errors{{1, errc::aborted}, {3, errc::aborted}}));
  auto aborts = transport->aborts;
  std::sort(aborts.begin(), aborts.end());
  EXPECT_EQ(aborts, (std::vector<uint64_t>{1, 3}));  // two-sided: stopped at once

  transport->finish_send(1, errc::aborted);  // the transport ends it: no further word
  EXPECT_EQ(link.errors().size(), 2u);
  EXPECT_EQ(table.unsettled(), 0u);
}

TEST_F(ServeTableTest, AOneSidedServeKeepsItsGrantWhenTheOwnerAborts) {
  auto one_sided = std::make_shared<FakeTransport>("R", true);
  link.add_transport(one_sided, true);
  const ObjectId id = put();
  auto msg = fetch_of(id);
  msg.set_transport("R");
  table.serve(1, msg);
  table.abort_object(id);
  using Errors = std::vector<std::pair<uint64_t, std::error_code>>;
  EXPECT_EQ(link.errors(), (Errors{{1, errc::aborted}}));
  EXPECT_TRUE(one_sided->aborts.empty());  // until the fetcher's Cancel or the lease
}

TEST_F(ServeTableTest, AServeThatFailedHereIsCountedWhenTheFetcherSettlesIt) {
  const ObjectId id = put();
  int served = 0;
  ASSERT_TRUE(store.set_serve_hooks(id, nullptr, [&] { ++served; }));
  table.serve(1, fetch_of(id));
  transport->finish_send(1, errc::peer_closed);
  EXPECT_EQ(table.unsettled(), 1u);
  using Errors = std::vector<std::pair<uint64_t, std::error_code>>;
  EXPECT_EQ(link.errors(), (Errors{{1, errc::peer_closed}}));
  EXPECT_EQ(served, 0);
  table.settle(3);  // unknown
  EXPECT_EQ(served, 0);
  table.settle(1);
  EXPECT_EQ(served, 1);
  EXPECT_EQ(table.unsettled(), 0u);
  table.settle(1);  // once
  EXPECT_EQ(served, 1);
}

TEST_F(ServeTableTest, AServeThatFailsAfterTheSessionEndedIsNotReported) {
  const ObjectId id = put();
  int served = 0;
  ASSERT_TRUE(store.set_serve_hooks(id, nullptr, [&] { ++served; }));
  table.serve(1, fetch_of(id));
  link.open = false;
  transport->finish_send(1, errc::peer_closed);
  EXPECT_TRUE(link.errors().empty());
  EXPECT_EQ(table.unsettled(), 0u);
  EXPECT_EQ(served, 0);
}

TEST_F(ServeTableTest, CloseForgetsEverything) {
  const ObjectId id = put();
  table.serve(1, named("weights", 5000));
  table.serve(3, fetch_of(id));
  table.close();
  EXPECT_EQ(table.parked(), 0u);
  EXPECT_EQ(table.serving(), 0u);
  EXPECT_EQ(link.forgotten, std::vector<std::string>{"weights"});
  EXPECT_EQ(table.next_deadline(), SessionLink::Clock::time_point::max());
  EXPECT_TRUE(link.errors().empty());
}

// Out of memory anywhere in a serve, as it starts or as the transport ends it (successfully, or
// failing it, which tells the fetcher): the session's post then ends the session, closing the
// table, and the transport ends what it still sends when its channel closes. Whichever
// allocation fails, walked one by one, the object is left unpinned, its hooks run at most once
// and the fetcher hears at most one error; with none failing the serve ends as it would.
TEST(ServeTableAllocations, AServeLeavesNothingPinnedWhicheverAllocationFails) {
  for (const auto& [by_name, send_fails] :
       {std::pair{false, false}, std::pair{false, true}, std::pair{true, false}}) {
    SCOPED_TRACE(::testing::Message()
                 << (by_name ? "by name, parked until the put; " : "")
                 << (send_fails ? "the transport fails the send" : "the send succeeds"));
    const std::error_code send_result = send_fails ? errc::peer_closed : std::error_code();
    size_t failures = 0;
    for (size_t n = 0;; ++n) {
      SCOPED_TRACE(::testing::Message() << "allocation " << n);
      FakeSessionLink link{false};
      auto transport = std::make_shared<FakeTransport>("T", false);
      link.add_transport(transport, true);
      ObjectStore store;
      detail::StatsRecorder recorder;
      ServeTable table{link, store, recorder, ServeTable::Options{"owner", 42, 4, 1000ms}};
      auto mem = std::make_shared<std::vector<std::byte>>(16);
      const ObjectId id = store.put({Tensor::bytes(*mem)}, mem, "T");
      int sent = 0, served = 0;
      ASSERT_TRUE(store.set_serve_hooks(
          id, [&] { ++sent; }, [&] { ++served; }));
      auto session_ends = [&] {  // Session::out_of_memory
        link.open = false;
        table.close();
      };
      size_t left = n;
      bool fired = fails_within(
          left,
          [&] {
            table.serve(
                1, by_name ? ServeTableTest::named("weights", 5000) : ServeTableTest::fetch_of(id));
          },
          session_ends);
      if (by_name && !fired && link.open) {
        EXPECT_EQ(table.parked(), 1u);
        link.names["weights"] = id;  // put under that name
        fired = fails_within(
            left, [&] { table.on_named("weights"); }, session_ends);
      }
      if (!fired && transport->sends.count(1) && link.open) {
        fired = fails_within(
            left, [&] { transport->finish_send(1, send_result); }, session_ends);
      }
      // The channel closes with the session: the transport fails what it still sends.
      if (fired) {
        while (!transport->sends.empty()) {
          transport->finish_send(transport->sends.begin()->first, errc::peer_closed);
        }
      }
      EXPECT_EQ(store.counts(id)->pins, 0u) << "the object stays pinned";
      EXPECT_LE(sent, 1);
      EXPECT_LE(served, 1);
      EXPECT_LE(link.errors().size(), 1u);
      EXPECT_EQ(table.parked(), 0u);
      if (!fired) {
        EXPECT_EQ(sent, send_fails ? 0 : 1);
        EXPECT_EQ(served, send_fails ? 0 : 1);
        EXPECT_EQ(link.errors().size(), send_fails ? 1u : 0u);
        break;
      }
      ++failures;
    }
    EXPECT_GT(failures, 3u) << "the walk saw too few allocations to mean anything";
  }
}

}  // namespace
}  // namespace ferry
