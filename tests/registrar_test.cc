// The registrar's threads (ferry/rdma/registrar.h): large registrations take three of its four
// threads at most, so a small one runs however many large ones are queued. Jobs stand in for
// registrations here: what is checked is which thread runs what when, not the verbs.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <mutex>

#include "ferry/rdma/registrar.h"
#include "tests/test_util.h"

namespace ferry::rdma {
namespace {

using namespace std::chrono_literals;
using test::eventually;
using test::scaled;

// Opened once: by open() or, should an assertion end the test first, by the destructor.
class Gate {
 public:
  ~Gate() { open(); }
  void open() {
    std::call_once(once_, [&] { promise_.set_value(); });
  }
  std::shared_future<void> opened() const { return opened_; }

 private:
  std::promise<void> promise_;
  std::shared_future<void> opened_ = promise_.get_future().share();
  std::once_flag once_;
};

TEST(Registrar, ASmallRegistrationRunsWhileLargeOnesHoldTheThreadsAndMoreWait) {
  Gate gate;
  auto started = std::make_shared<std::atomic<int>>(0);
  auto finished = std::make_shared<std::atomic<int>>(0);
  // Five large jobs that hold their threads until the gate opens (bounded, so a failing test
  // ends).
  constexpr int kLarge = 5;
  for (int i = 0; i < kLarge; ++i) {
    submit_registration(kLargeRegistration, [=, opened = gate.opened()] {
      started->fetch_add(1);
      opened.wait_for(scaled(30s));
      finished->fetch_add(1);
    });
  }
  ASSERT_TRUE(eventually([&] { return started->load() == 3; }, 10s))
      << started->load() << " large registrations started, 3 expected";
  auto small_ran = std::make_shared<std::promise<void>>();
  auto small = small_ran->get_future();
  submit_registration(kLargeRegistration - 1, [small_ran] { small_ran->set_value(); });
  EXPECT_EQ(small.wait_for(scaled(10s)), std::future_status::ready)
      << "a small registration waited behind large ones";
  EXPECT_EQ(started->load(), 3) << "more large registrations ran at once than allowed";
  // Once the first ones end, the queued large ones run too.
  gate.open();
  EXPECT_TRUE(eventually([&] { return finished->load() == kLarge; }, 10s))
      << finished->load() << " of " << kLarge << " large registrations ran";
}

}  // namespace
}  // namespace ferry::rdma
