#include "ferry/rdma/reaper.h"

#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "ferry/net/system/thread_name.h"

namespace ferry::rdma {
namespace {

class Reaper {
 public:
  Reaper() {
    std::thread thread([this] { run(); });
    name_thread(thread, "ferry-reaper").detach();
  }

  void retire(std::function<void()> destroy) {
    {
      std::lock_guard lock(mu_);
      queue_.push_back(std::move(destroy));
      ++retired_;
    }
    cv_.notify_all();
  }

  bool drain(std::chrono::milliseconds timeout) {
    std::unique_lock lock(mu_);
    const uint64_t target = retired_;
    return cv_.wait_for(lock, timeout, [&] { return destroyed_ >= target; });
  }

 private:
  void run() {
    std::unique_lock lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return !queue_.empty(); });
      auto destroy = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      destroy();
      lock.lock();
      ++destroyed_;
      cv_.notify_all();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  uint64_t retired_ = 0;
  uint64_t destroyed_ = 0;
};

// Never destroyed: the detached thread may still use it while the process exits.
Reaper& reaper() {
  static Reaper* r = new Reaper();
  return *r;
}

}  // namespace

void retire(std::function<void()> destroy) { reaper().retire(std::move(destroy)); }

bool drain_retired(std::chrono::milliseconds timeout) { return reaper().drain(timeout); }

}  // namespace ferry::rdma
