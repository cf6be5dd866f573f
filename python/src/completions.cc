#include "python/src/completions.h"

#include <pthread.h>
#include <sched.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>

#include "ferry/net/system/cpus.h"
#include "ferry/net/system/env.h"
#include "ferry/net/system/thread_name.h"
#include "python/src/bindings.h"

namespace py = pybind11;

namespace ferry::python {
namespace {

class CompletionQueue {
 public:
  void push(Completion item) noexcept {
    {
      std::lock_guard lock(mu_);
      items_.push_back(std::move(item));
      ++pushed_;
      ready_.store(true, std::memory_order_release);
    }
    cv_.notify_one();
  }

  // Blocks (call without the GIL) until there is something to hand over or stop() was called.
  // Returns everything queued; empty only once stopped. It first spins for spin_us(), yielding
  // the core at each turn, so that a completion that follows soon (a callback's next fetch)
  // costs no sleep and wake-up.
  std::deque<Completion> take() {
    if (const auto spin = spin_us(); spin.count() > 0) {
      const auto until = std::chrono::steady_clock::now() + spin;
      while (!ready_.load(std::memory_order_acquire) && std::chrono::steady_clock::now() < until) {
        sched_yield();
      }
    }
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return !items_.empty() || stopped_; });
    ready_.store(false, std::memory_order_relaxed);
    return std::exchange(items_, {});
  }

  void stop() {
    {
      std::lock_guard lock(mu_);
      stopped_ = true;
    }
    cv_.notify_all();
  }

  std::pair<size_t, uint64_t> counts() const {
    std::lock_guard lock(mu_);
    return {items_.size(), pushed_};
  }

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  // $FERRY_COMPLETION_SPIN_US (0 to 10000), read once; unset or not such a number: 50 where
  // this process may run on at least 4 cores, else 0 (with fewer the spin takes time the io
  // threads and the peer's copies need: 1 MiB bandwidth on 2 cores moved either way with it).
  static std::chrono::microseconds spin_us() {
    static const std::chrono::microseconds spin(
        env_integer("FERRY_COMPLETION_SPIN_US", 0, 10000, usable_cores() >= 4 ? 50 : 0));
    return spin;
  }

  std::deque<Completion> items_;
  std::atomic<bool> ready_{false};  // items_ not empty, for the spin to read without the lock
  uint64_t pushed_ = 0;
  bool stopped_ = false;
};

// Never destroyed: io threads may still push while the process exits (static destructors
// running), and the references queued then are leaked on purpose (Python is gone). A forked
// child gets a fresh one (the parent's lock may have been held by a thread the child lacks;
// what it held is leaked).
CompletionQueue* g_queue = [] {
  pthread_atfork(nullptr, nullptr, [] { g_queue = new CompletionQueue; });
  return new CompletionQueue;
}();

CompletionQueue& queue() { return *g_queue; }

// Blocks without the GIL until there is work; returns [(target, outcome), ...] for completions
// (drops are done here, with the GIL held), or None once stopped and drained.
py::object wait_completions() {
  std::deque<Completion> items;
  {
    NativeCall nogil;
    items = queue().take();
  }
  if (items.empty()) return py::none();
  py::list out;
  for (auto& item : items) {
    auto obj = py::reinterpret_steal<py::object>(item.future);
    if (item.outcome) out.append(py::make_tuple(obj, py::cast(std::move(item.outcome))));
    // otherwise `obj` is dropped here, with the GIL held
  }
  return out;
}

}  // namespace

void queue_drop(PyObject* obj) noexcept {
  if (obj) queue().push({obj, nullptr});
}

void queue_completion(PyObject* target, std::unique_ptr<FetchOutcome> outcome) noexcept {
  if (target) queue().push({target, std::move(outcome)});
}

void bind_completions(py::module_& m) {
  m.def("_wait_completions", &wait_completions,
        "Completion thread only: waits (GIL released) and returns [(future, FetchOutcome)], "
        "or None once _stop_completions() was called and the queue is drained.");
  m.def(
      "_name_this_thread", [](const std::string& name) { name_this_thread(name.c_str()); },
      "Names the calling thread for the OS (top -H, gdb, perf): 15 characters at most.");
  m.def(
      "_stop_completions", [] { queue().stop(); },
      "Makes _wait_completions() return None once drained (interpreter exit).");
  m.def(
      "_completion_counts", [] { return queue().counts(); },
      "(items queued now, items queued since start): for tests.");
  m.def(
      "_threads_in_native", [] { return threads_in_native.load(); },
      "Threads now inside a ferry call that let the GIL go (the exit hook waits for none).");
}

}  // namespace ferry::python
