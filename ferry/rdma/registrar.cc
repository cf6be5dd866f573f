#include "ferry/rdma/registrar.h"

#include <condition_variable>
#include <deque>
#include <thread>

#include "ferry/net/errors.h"
#include "ferry/net/system/thread_name.h"

namespace ferry::rdma {
namespace {

// Up to kThreads registrations at once: one large registration (seconds) must not hold back
// every other peer's small one, nor a process's serves behind its own fetches. Large ones take
// kThreads - 1 at most, so one thread is always there for the small ones.
constexpr int kThreads = 4;
constexpr int kLargeAtOnce = kThreads - 1;

class Registrar {
 public:
  void submit(uint64_t bytes, std::function<void()> job) {
    bool spawn = false;
    {
      std::lock_guard lock(mu_);
      auto& lane = bytes >= kLargeRegistration ? large_ : small_;
      lane.push_back({next_seq_++, std::move(job)});
      if (small_.size() + large_.size() > static_cast<size_t>(idle_) && threads_ < kThreads) {
        ++threads_;
        spawn = true;
      }
    }
    if (spawn) {
      std::thread thread([this] { run(); });
      name_thread(thread, "ferry-register").detach();
    } else {
      cv_.notify_all();  // the idle thread woken first may not be allowed a large job
    }
  }

 private:
  struct Job {
    uint64_t seq;  // submission order, across both lanes
    std::function<void()> run;
  };

  // Under mu_.
  bool large_allowed() const { return !large_.empty() && large_running_ < kLargeAtOnce; }
  bool runnable() const { return !small_.empty() || large_allowed(); }

  void run() {
    std::unique_lock lock(mu_);
    for (;;) {
      ++idle_;
      cv_.wait(lock, [&] { return runnable(); });
      --idle_;
      // The older of the two lanes' first jobs, a large one only while fewer than kLargeAtOnce
      // run.
      const bool large =
          large_allowed() && (small_.empty() || large_.front().seq < small_.front().seq);
      auto& lane = large ? large_ : small_;
      auto job = std::move(lane.front().run);
      lane.pop_front();
      if (large) ++large_running_;
      lock.unlock();
      job();
      job = nullptr;  // its captures go before the next job runs
      lock.lock();
      if (large) {
        --large_running_;
        if (!large_.empty()) cv_.notify_all();  // a large job queued may run now
      }
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> small_;
  std::deque<Job> large_;
  uint64_t next_seq_ = 0;
  int large_running_ = 0;
  int threads_ = 0;  // started so far (they never end)
  int idle_ = 0;     // waiting for a job
};

// Never destroyed: the detached thread may still use it while the process exits.
Registrar& registrar() {
  static Registrar* r = new Registrar();
  return *r;
}

}  // namespace

void submit_registration(uint64_t bytes, std::function<void()> job) {
  registrar().submit(bytes, std::move(job));
}

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
