#include "ferry/rdma/registrar.h"

#include <condition_variable>
#include <deque>
#include <thread>

#include "ferry/net/errors.h"

namespace ferry::rdma {
namespace {

// Up to kThreads registrations at once: one large registration (seconds) must not hold back
// every other peer's small one, nor a process's serves behind its own fetches.
constexpr int kThreads = 4;

class Registrar {
 public:
  void submit(std::function<void()> job) {
    bool spawn = false;
    {
      std::lock_guard lock(mu_);
      queue_.push_back(std::move(job));
      if (queue_.size() > static_cast<size_t>(idle_) && threads_ < kThreads) {
        ++threads_;
        spawn = true;
      }
    }
    if (spawn) {
      std::thread([this] { run(); }).detach();
    } else {
      cv_.notify_one();
    }
  }

 private:
  void run() {
    std::unique_lock lock(mu_);
    for (;;) {
      ++idle_;
      cv_.wait(lock, [&] { return !queue_.empty(); });
      --idle_;
      auto job = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      job();
      job = nullptr;  // its captures go before the next job runs
      lock.lock();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  int threads_ = 0;  // started so far (they never end)
  int idle_ = 0;     // waiting for a job
};

// Never destroyed: the detached thread may still use it while the process exits.
Registrar& registrar() {
  static Registrar* r = new Registrar();
  return *r;
}

}  // namespace

void submit_registration(std::function<void()> job) { registrar().submit(std::move(job)); }

TargetRegistration::TargetRegistration(std::vector<MutableBuffer> targets,
                                       std::vector<std::shared_ptr<Region>> regions)
    : targets_(std::move(targets)), regions_(std::move(regions)) {}

void TargetRegistration::run(MrCache& cache) {
  for (size_t i = 0; i < targets_.size(); ++i) {
    const auto& t = targets_[i];
    {
      std::lock_guard lock(mu_);
      if (cancelled_ || error_) return;
      if (t.empty() || regions_[i]) continue;
    }
    auto made = cache.make(t.data(), t.size());
    std::lock_guard lock(mu_);
    if (cancelled_) return;  // `made` is dropped after the lock, deregistered
    if (!made) {
      error_ = made.error();
      return;
    }
    regions_[i] = cache.publish(*made);
  }
}

void TargetRegistration::cancel() {
  std::vector<std::shared_ptr<Region>> dropped;
  std::lock_guard lock(mu_);
  cancelled_ = true;
  dropped.swap(regions_);
  // `dropped` goes after the lock: the last reference to a region deregisters it.
}

Result<std::vector<std::shared_ptr<Region>>> TargetRegistration::take() {
  std::lock_guard lock(mu_);
  if (cancelled_) return make_error_code(errc::aborted);
  if (error_) return error_;
  cancelled_ = true;  // taken: nothing more is published
  return std::move(regions_);
}

}  // namespace ferry::rdma
