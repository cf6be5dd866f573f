// The background worker `ferry fetch` verifies and writes objects on: order, the bound on jobs
// held, and that drain() returns only once every job ran and let go of what it held.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <thread>
#include <vector>

#include "cli/background.h"

namespace ferry::cli {
namespace {

using namespace std::chrono_literals;

TEST(Background, RunsJobsInOrderAndDrainWaitsForThem) {
  std::vector<int> ran;  // only the worker writes; drain() orders it before the reads
  Background worker(4);
  for (int i = 0; i < 100; ++i) worker.submit([&ran, i] { ran.push_back(i); });
  worker.drain();
  ASSERT_EQ(ran.size(), 100u);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(ran[i], i);
}

TEST(Background, SubmitWaitsWhileCapacityJobsAreHeld) {
  std::promise<void> release;
  auto released = release.get_future().share();
  std::atomic<int> done{0};
  Background worker(2);
  worker.submit([released, &done] {
    released.wait();
    ++done;
  });
  worker.submit([&done] { ++done; });  // queued: 2 held, the capacity
  auto third = std::async(std::launch::async, [&] { worker.submit([&done] { ++done; }); });
  // Held back while the first job runs, however long it takes to get here.
  EXPECT_EQ(third.wait_for(50ms), std::future_status::timeout);
  EXPECT_EQ(done.load(), 0);
  release.set_value();
  ASSERT_EQ(third.wait_for(60s), std::future_status::ready);
  worker.drain();
  EXPECT_EQ(done.load(), 3);
}

TEST(Background, AJobLetsGoOfWhatItHoldsBeforeDrainReturns) {
  auto memory = std::make_shared<int>(7);
  std::weak_ptr<int> watch = memory;
  {
    Background worker(1);
    worker.submit([held = std::move(memory)] { EXPECT_EQ(*held, 7); });
    worker.drain();
    EXPECT_TRUE(watch.expired());  // an object's memory goes back once it is checked
  }
}

TEST(Background, DestructionRunsWhatIsQueued) {
  std::atomic<int> done{0};
  {
    Background worker(8);
    for (int i = 0; i < 8; ++i) worker.submit([&done] { ++done; });
  }
  EXPECT_EQ(done.load(), 8);
}

}  // namespace
}  // namespace ferry::cli
