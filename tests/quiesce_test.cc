// The quiesce board's waiters (ferry/rdma/quiesce.h) as the reaper's thread releases them: posted
// to the peer's strand while the context's loop will still run, dropped on the reaper's thread
// once it has run its last (LoopGate) or the session is gone, never queued into a loop that no
// longer runs. Over a fake link and a real io_context; the queue pairs themselves run in the
// soft-RoCE guest (rdma_test.cc).
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <thread>

#include "ferry/net/loop_gate.h"
#include "ferry/rdma/quiesce.h"
#include "tests/fake_session_link.h"

namespace ferry::rdma {
namespace {

using fakes::FakeSessionLink;
using namespace std::chrono_literals;

struct Quiesce : ::testing::Test {
  std::shared_ptr<LoopGate> gate = std::make_shared<LoopGate>();
  std::shared_ptr<QuiesceBoard> board = std::make_shared<QuiesceBoard>(gate);
  // Held by shared_ptr, as a real session is: the board keeps only a weak handle.
  std::shared_ptr<FakeSessionLink> link = std::make_shared<FakeSessionLink>();

  // A pair of `link` to be destroyed, its bound far off; returns what the reaper calls.
  // Keyed as RdmaChannel keys it: by the PeerLink's address.
  std::function<void()> failed_pair() {
    return board->add(static_cast<PeerLink*>(link.get()), link->strand(), 1h);
  }
  // Calls `quiet` from another thread, as the reaper does once the pair is destroyed.
  static void from_the_reaper(const std::function<void()>& quiet) { std::thread(quiet).join(); }
};

TEST_F(Quiesce, AWaiterRunsOnTheStrandOnceThePairIsDestroyed) {
  auto quiet = failed_pair();
  bool ran = false;
  board->when_quiet(*link, [&] {
    EXPECT_TRUE(link->strand().running_in_this_thread());
    ran = true;
  });
  EXPECT_FALSE(ran) << "it ran before the pair was destroyed";
  from_the_reaper(quiet);
  EXPECT_FALSE(ran) << "it ran on the reaper's thread";
  // The waiter, then the cancel of the bound's timer: the loop runs out of work long before 1 h.
  const auto t0 = std::chrono::steady_clock::now();
  link->io_.run_for(60s);
  EXPECT_TRUE(ran);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 30s) << "the bound's timer was not cancelled";
}

TEST_F(Quiesce, AWaiterReleasedAfterTheLoopsLastRunIsDroppedThereNotQueued) {
  auto quiet = failed_pair();
  auto held = std::make_shared<int>(0);  // what the waiter holds (a session, a fetch's regions)
  std::weak_ptr<int> watch = held;
  bool ran = false;
  board->when_quiet(*link, [&ran, held = std::move(held)] { ran = true; });
  gate->close();  // the context's close, before its loop's last run
  from_the_reaper(quiet);
  EXPECT_FALSE(ran);
  EXPECT_TRUE(watch.expired()) << "the refused waiter was kept";
  link->io_.restart();
  EXPECT_EQ(link->io_.poll(), 0u) << "something was queued into the loop after its last run";
}

TEST_F(Quiesce, AWaiterWhoseSessionIsGoneIsDropped) {
  auto quiet = failed_pair();
  auto held = std::make_shared<int>(0);
  std::weak_ptr<int> watch = held;
  bool ran = false;
  board->when_quiet(*link, [&ran, held = std::move(held)] { ran = true; });
  std::weak_ptr<FakeSessionLink> session = link;
  link.reset();  // the session, and with it (in this fake) its loop
  ASSERT_TRUE(session.expired());
  from_the_reaper(quiet);
  EXPECT_FALSE(ran);
  EXPECT_TRUE(watch.expired()) << "the waiter of a session that is gone was kept";
}

}  // namespace
}  // namespace ferry::rdma
