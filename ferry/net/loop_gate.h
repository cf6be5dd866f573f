/// @file
/// LoopGate: how a thread that does not run a context's loop (a transport's registration
/// worker, its reaper, a completion delivered from a destructor) hands work to that loop,
/// whenever it gets there.
///
/// Context::close stops the loop, runs it one last time and never again. Work posted to it after
/// that last run would never run: its handler would sit in the queue, and a handler that holds a
/// session holds the context (and with it the queue) alive, so nothing would ever free either.
/// And once the context is gone its io_context is too, and a post to it is a use after free.
/// The gate is shared (held by the context and by whoever posts for it, as long as they like)
/// and closes just before that last run: a post through it either lands before the last run
/// (and runs there at the latest) or is refused, and the caller keeps its work.
#pragma once

#include <boost/asio/post.hpp>
#include <mutex>
#include <utility>

namespace ferry {

/// The gate of one Context's loop (TransportEnv::loop_gate): open until Context::close runs the
/// loop for the last time, closed for good after. Shared by the context and whoever posts for it;
/// it outlives both as long as it is held, so a worker may call it after the context is gone.
/// Thread-safe.
class LoopGate {
 public:
  /// Posts `fn` (moved from) to `executor`, an executor of the gate's loop (the io_context
  /// itself or a strand of it), and returns true: it runs on that loop, at the latest in the
  /// last run Context::close makes. Once the gate has closed, returns false and leaves `fn` as
  /// it was: the caller runs it elsewhere or destroys it (off the loop, which has stopped for
  /// good). Any thread, the loop's own included; never waits beyond a short lock.
  template <typename Executor, typename Fn>
  bool post(const Executor& executor, Fn& fn) {
    std::lock_guard lock(mu_);
    if (!open_) return false;
    boost::asio::post(executor, std::move(fn));
    return true;
  }

  /// Runs `f()` under the gate's lock and returns true while the gate is open; false (not run)
  /// once it has closed. For what must touch the loop's own objects (a timer, an executor of it)
  /// from another thread: the context cannot pass its close, and so cannot destroy the loop,
  /// while `f` runs. `f` is short and does not use this gate. Any thread.
  template <typename Fn>
  bool while_open(Fn&& f) {
    std::lock_guard lock(mu_);
    if (!open_) return false;
    f();
    return true;
  }

  /// Whether posts still land (a snapshot: the gate may close right after). Any thread.
  bool is_open() const {
    std::lock_guard lock(mu_);
    return open_;
  }

  /// Refuses every later post; returns once posts under way have landed. Idempotent. The
  /// context's close, before the loop's last run.
  void close() {
    std::lock_guard lock(mu_);
    open_ = false;
  }

 private:
  mutable std::mutex mu_;
  bool open_ = true;
};

}  // namespace ferry
