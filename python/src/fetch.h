// Fetches started from Python: each resolves its Python future exactly once, through the
// completion queue, from ferry's completion handler or, when a context closes with the handler
// never run, from the context's sweep.
#pragma once

#include <pybind11/pybind11.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "ferry/net/context.h"
#include "ferry/net/fetch.h"
#include "ferry/net/object_ref.h"
#include "ferry/net/peer.h"
#include "python/src/completions.h"

namespace ferry::python {

// How a thread blocked in PendingFetch::wait() waits: by running the context's loop itself
// (Context::BusyPoll: its io threads park, the waiting thread reads the sockets and runs the
// handlers, its own fetch's completion among them, with no thread woken and no hand-off; it sleeps
// in the reactor when nothing is ready), or, with `context` empty or gone, on a condition variable
// that the io thread's completion handler notifies. `linger`: how long the io threads stay parked
// after the wait, so that a fetch started soon after (a loop of fetch().result()) is picked up by
// the next wait without waking them; meanwhile nothing else runs the context.
struct WaitMode {
  std::weak_ptr<Context> context;
  std::chrono::microseconds linger{};
};

// One fetch's Python future. finish() hands the outcome to a Python thread blocked in wait() on
// this fetch, when there is one (no other thread wakes); else, when it runs on a thread that is
// running the loop inside wait() for another fetch, to that thread (it resolves the future once
// it holds the GIL again: the completion thread does not wake); else to the completion queue.
// The first call wins.
class PendingFetch {
 public:
  explicit PendingFetch(PyRef future) : future_(std::move(future)) {}
  // Any thread; never takes the GIL.
  bool finish(std::error_code ec, FetchResult result);

  // What wait() found: the outcome is this thread's to resolve the future with (`mine` set), the
  // completion queue or another waiter has it, the time ran out first, or (`collected`) the loop
  // this thread ran finished other fetches, whose futures it is now to resolve (then wait again).
  enum class Waited { mine, elsewhere, timed_out, collected };
  struct WaitResult {
    Waited how = Waited::timed_out;
    Completion mine;
    std::vector<Completion> others;  // fetches this thread finished while it ran the loop
  };
  // Blocks until finish(), `deadline` (max(): no limit) or, when this thread runs the loop, until
  // that has finished other fetches, as `mode` says. Call without the GIL, from a thread that is
  // not one of the context's io threads.
  WaitResult wait(std::chrono::steady_clock::time_point deadline, const WaitMode& mode);

 private:
  // wait()'s part when the waiting thread runs the loop (polling for the context's idle_spin after
  // each handler, then sleeping in its reactor): returns with finished_ set, at
  // `deadline` or when `others` is not empty, or early (false) when the context stopped running
  // (closed): the rest of the wait is on cv_. mu_ not held.
  bool run_loop_until_finished(Context& context, std::chrono::microseconds linger,
                               std::chrono::steady_clock::time_point deadline,
                               const std::vector<Completion>& others);

  std::mutex mu_;
  std::condition_variable cv_;
  bool finished_ = false;
  int waiters_ = 0;
  std::unique_ptr<FetchOutcome> outcome_;  // finished while a thread waited, not yet taken
  PyRef future_;
};

// A fetch as Python's Future holds it: abort() through the request, wait() through the pending
// state.
struct NativeFetch {
  FetchRequest request;
  std::shared_ptr<PendingFetch> pending;
  WaitMode wait_mode;
};

// The fetches in flight of one context, so that close() can fail those whose completion
// handler will never run (the io_context stopped with it queued). Thread-safe.
class InflightFetches {
 public:
  uint64_t add(std::shared_ptr<PendingFetch> fetch);
  void remove(uint64_t key);
  // Finishes every fetch still registered with `ec`.
  void fail_all(std::error_code ec);
  size_t size() const;

 private:
  mutable std::mutex mu_;
  uint64_t next_ = 1;
  std::unordered_map<uint64_t, std::shared_ptr<PendingFetch>> fetches_;
};

// Starts fetching `ref` from `peer` into `targets` (empty: ferry allocates); `future` gets
// `_ferry_complete(FetchOutcome)` on the completion thread, unless a thread waiting in
// NativeFetch::pending->wait() takes the outcome. GIL held (for `future`); does not block,
// except that without targets taking the receive memory may fault a new pool region in (with the
// GIL released meanwhile).
NativeFetch start_fetch(const Peer& peer, const std::shared_ptr<InflightFetches>& inflight,
                        ObjectRef ref, std::vector<MutableBuffer> targets, FetchOptions options,
                        pybind11::object future, WaitMode wait_mode);

}  // namespace ferry::python
