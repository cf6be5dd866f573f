#include "python/src/fetch.h"

#include <pybind11/numpy.h>

#include <algorithm>
#include <optional>
#include <utility>

#include <sched.h>

#include "ferry/net/errors.h"
#include "ferry/net/peer.h"
#include "python/src/bindings.h"
#include "python/src/errors.h"

namespace py = pybind11;

namespace ferry::python {
namespace {

// A zero-copy uint8 view of `bytes` inside ferry's `storage`, keeping `storage` alive.
py::array_t<uint8_t> view_of(const std::shared_ptr<std::byte[]>& storage, MutableBuffer bytes) {
  if (bytes.empty()) return py::array_t<uint8_t>(0);
  auto* owner = new std::shared_ptr<std::byte[]>(storage);
  py::capsule base(owner, [](void* p) { delete static_cast<std::shared_ptr<std::byte[]>*>(p); });
  return py::array_t<uint8_t>({static_cast<py::ssize_t>(bytes.size())}, {1},
                              reinterpret_cast<const uint8_t*>(bytes.data()), base);
}

// Set while this thread runs a context's loop inside PendingFetch::wait(): the fetches its
// handlers finish with no thread waiting for them are collected here.
thread_local std::vector<Completion>* t_collecting = nullptr;

// Resolves `c`'s future with its outcome (`future._ferry_complete(outcome)`). GIL held. A Python
// exception that leaves it before the future is resolved (a signal handler's, raised as the call
// began) does not lose the outcome: the call is made again (a few times at most), and the first
// such exception is returned for the caller to raise once every future it holds is resolved. One
// that cannot be made (no memory for the outcome's Python object) goes to the completion queue.
std::optional<py::error_already_set> resolve_one(Completion& c) {
  auto future = py::reinterpret_steal<py::object>(std::exchange(c.future, nullptr));
  py::object outcome;
  try {
    outcome = py::cast(std::move(c.outcome));
  } catch (const std::exception&) {
    if (c.outcome) queue_completion(future.release().ptr(), std::move(c.outcome));
    return std::nullopt;
  }
  std::optional<py::error_already_set> error;
  for (int tries = 0; tries < 3; ++tries) {
    try {
      future.attr("_ferry_complete")(outcome);
      return error;
    } catch (py::error_already_set& e) {
      if (!error) error = std::move(e);
      // An instance attribute: reading it runs no Python code (no signal handler).
      if (py::str(future.attr("_state")).equal(py::str("FINISHED"))) return error;
    }
  }
  // Still unresolved (signals again and again): the completion thread, which runs no signal
  // handlers, resolves it with a copy of the outcome.
  try {
    queue_completion(future.release().ptr(),
                     std::make_unique<FetchOutcome>(outcome.cast<const FetchOutcome&>()));
  } catch (const std::exception&) {
  }
  return error;
}

// resolve_one() for each; the first exception one returned.
std::optional<py::error_already_set> resolve(std::vector<Completion>& completions) {
  std::optional<py::error_already_set> first;
  for (auto& c : completions) {
    if (auto e = resolve_one(c); e && !first) first = std::move(e);
  }
  completions.clear();
  return first;
}

}  // namespace

bool PendingFetch::finish(std::error_code ec, FetchResult result) {
  auto outcome = std::make_unique<FetchOutcome>(FetchOutcome{ec, std::move(result)});
  PyObject* future = nullptr;
  {
    std::lock_guard lock(mu_);
    if (finished_) return false;
    finished_ = true;
    if (waiters_ > 0) {
      outcome_ = std::move(outcome);
    } else {
      future = future_.release();
    }
  }
  if (future) {
    if (t_collecting) {
      try {
        t_collecting->push_back({future, std::move(outcome)});
        return true;
      } catch (const std::bad_alloc&) {
        // `outcome` is still ours (push_back left it): the queue takes it
      }
    }
    queue_completion(future, std::move(outcome));
  } else {
    cv_.notify_all();
  }
  return true;
}

bool PendingFetch::run_loop_until_finished(Context& context, std::chrono::microseconds linger,
                                           std::chrono::steady_clock::time_point deadline,
                                           const std::vector<Completion>& others) {
  // A slice bounds how long this thread sleeps in the reactor when another thread (a second
  // waiter, or an io thread still in its handler when the hold began) finishes this fetch.
  constexpr std::chrono::microseconds kSlice = std::chrono::milliseconds(1);
  Context::BusyPoll hold(context, linger);
  auto& io = context.io_context();
  // As an io thread would (ContextOptions::idle_spin): polls, yielding the core when nothing was
  // ready, until the spin has passed since the last handler ran, and only then sleeps in the
  // reactor.
  const auto spin = context.options().idle_spin;
  auto spin_until = std::chrono::steady_clock::now() + spin;
  for (;;) {
    {
      std::lock_guard lock(mu_);
      if (finished_) return true;
    }
    if (!others.empty()) return true;
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) return true;
    size_t ran;
    if (now < spin_until) {
      ran = hold.poll();
      if (ran == 0 && !io.stopped()) sched_yield();
    } else {
      const auto left = std::chrono::duration_cast<std::chrono::microseconds>(deadline - now);
      ran = hold.poll_or_wait(std::clamp(left, std::chrono::microseconds(1), kSlice));
    }
    if (ran > 0) {
      spin_until = std::chrono::steady_clock::now() + spin;
    } else if (io.stopped()) {
      return false;
    }
  }
}

PendingFetch::WaitResult PendingFetch::wait(std::chrono::steady_clock::time_point deadline,
                                            const WaitMode& mode) {
  using Clock = std::chrono::steady_clock;
  WaitResult out;
  std::unique_lock lock(mu_);
  if (!finished_) {
    ++waiters_;
    bool waited = false;
    // A poll (deadline now or past) only looks: it parks no io thread.
    auto context = deadline > Clock::now() ? mode.context.lock() : nullptr;
    if (context && !context->io_context().stopped()) {
      lock.unlock();
      auto* outer = std::exchange(t_collecting, &out.others);
      waited = run_loop_until_finished(*context, mode.linger, deadline, out.others);
      t_collecting = outer;
      context.reset();  // the last reference may be this one: the context ends here, unlocked
      lock.lock();
    }
    if (!waited) {
      auto done = [&] { return finished_; };
      if (deadline == Clock::time_point::max()) {
        cv_.wait(lock, done);
      } else {
        cv_.wait_until(lock, deadline, done);
      }
    }
    --waiters_;
  }
  if (outcome_) {
    out.how = Waited::mine;
    out.mine = Completion{future_.release(), std::move(outcome_)};
  } else if (finished_) {
    out.how = Waited::elsewhere;
  } else {
    out.how = out.others.empty() ? Waited::timed_out : Waited::collected;
  }
  return out;
}

uint64_t InflightFetches::add(std::shared_ptr<PendingFetch> fetch) {
  std::lock_guard lock(mu_);
  const uint64_t key = next_++;
  fetches_.emplace(key, std::move(fetch));
  return key;
}

void InflightFetches::remove(uint64_t key) {
  std::shared_ptr<PendingFetch> gone;  // destroyed outside the lock
  std::lock_guard lock(mu_);
  if (auto it = fetches_.find(key); it != fetches_.end()) {
    gone = std::move(it->second);
    fetches_.erase(it);
  }
}

void InflightFetches::fail_all(std::error_code ec) {
  std::unordered_map<uint64_t, std::shared_ptr<PendingFetch>> all;
  {
    std::lock_guard lock(mu_);
    all.swap(fetches_);
  }
  for (auto& [key, fetch] : all) fetch->finish(ec, FetchResult{});
}

size_t InflightFetches::size() const {
  std::lock_guard lock(mu_);
  return fetches_.size();
}

NativeFetch start_fetch(const Peer& peer, const std::shared_ptr<InflightFetches>& inflight,
                        ObjectRef ref, std::vector<MutableBuffer> targets, FetchOptions options,
                        py::object future, WaitMode wait_mode) {
  auto pending = std::make_shared<PendingFetch>(PyRef(std::move(future)));
  if (!peer.valid()) {
    pending->finish(make_error_code(errc::peer_closed), FetchResult{.ref = std::move(ref)});
    return NativeFetch{FetchRequest(), pending, {}};
  }
  const uint64_t key = inflight->add(pending);
  // Runs on an io thread: no GIL, no Python; the queue takes it from here.
  auto handler = [pending, weak = std::weak_ptr<InflightFetches>(inflight), key](
                     boost::system::error_code ec, FetchResult result) {
    pending->finish(std::error_code(ec), std::move(result));
    if (auto in = weak.lock()) in->remove(key);
  };
  try {
    std::optional<NativeCall> nogil;
    if (targets.empty()) nogil.emplace();  // taking the receive memory may fault a new region in
    auto request = peer.fetch(std::move(ref), std::move(targets), std::move(options),
                              FetchHandler(std::move(handler)));
    nogil.reset();
    return NativeFetch{std::move(request), pending, std::move(wait_mode)};
  } catch (...) {
    inflight->remove(key);
    throw;
  }
}

void bind_fetch(py::module_& m) {
  py::class_<NativeFetch>(m, "Fetch", "One fetch in flight: abort it, or wait for it")
      .def_property_readonly("id", [](const NativeFetch& f) { return f.request.id(); })
      .def("done", [](const NativeFetch& f) { return f.request.done(); })
      .def_property_readonly(
          "bytes_landed", [](const NativeFetch& f) { return f.request.bytes_landed(); },
          "Bytes landed in the targets so far (ferry::FetchRequest::bytes_landed)")
      .def(
          "abort", [](NativeFetch& f) { f.request.abort(); },
          "Asks the fetch to stop: it completes with errc::aborted unless it completed first. "
          "Never blocks.")
      .def(
          "wait",
          [](NativeFetch& f, int64_t timeout_ms) -> py::object {
            using Clock = std::chrono::steady_clock;
            // Saturated: a timeout past what the clock can hold waits without limit.
            const auto now = Clock::now();
            const auto room = std::chrono::duration_cast<std::chrono::milliseconds>(
                Clock::time_point::max() - now);
            const auto deadline = timeout_ms < 0 || timeout_ms >= room.count()
                                      ? Clock::time_point::max()
                                      : now + std::chrono::milliseconds(timeout_ms);
            for (;;) {
              PendingFetch::WaitResult r;
              {
                NativeCall nogil;
                r = f.pending->wait(deadline, f.wait_mode);
              }
              // Other fetches' callbacks run here, on this thread; then this one's. An
              // exception (a signal's) is raised once every future is resolved.
              auto error = resolve(r.others);
              if (r.how == PendingFetch::Waited::mine) {
                if (auto e = resolve_one(r.mine); e && !error) error = std::move(e);
              }
              if (error) throw std::move(*error);
              switch (r.how) {
                case PendingFetch::Waited::mine:
                case PendingFetch::Waited::elsewhere:
                  return py::bool_(true);
                case PendingFetch::Waited::collected:
                  continue;  // resolved them: wait on
                case PendingFetch::Waited::timed_out:
                  return py::bool_(false);
              }
            }
          },
          py::arg("timeout_ms"),
          "Waits (GIL released) up to timeout_ms (negative: no limit) for the fetch to end. "
          "Returns True once it has ended: resolved here (when the outcome came to this "
          "thread) or by the completion thread (or another waiter); False on timeout. Other "
          "fetches that this thread finishes meanwhile (it runs the loop) are resolved here, "
          "their done-callbacks run on this thread. A signal handler's exception is raised "
          "after every future this thread was handed is resolved.");

  py::class_<FetchOutcome>(m, "FetchOutcome", "What one fetch ended with")
      .def_property_readonly("error",
                             [](const FetchOutcome& o) -> py::object {
                               if (!o.ec) return py::none();
                               return error_info(o.ec);
                             })
      .def_property_readonly("transport", [](const FetchOutcome& o) { return o.result.transport; })
      .def_property_readonly("nbytes", [](const FetchOutcome& o) { return o.result.bytes; })
      .def_property_readonly(
          "elapsed", [](const FetchOutcome& o) { return o.result.elapsed.count() / 1e9; },
          "seconds from issue to completion")
      .def_property_readonly("restarts", [](const FetchOutcome& o) { return o.result.restarts; })
      .def_property_readonly("allocated",
                             [](const FetchOutcome& o) { return o.result.storage != nullptr; })
      .def(
          "views",
          [](const FetchOutcome& o) {
            py::list out;
            if (!o.result.storage) return out;
            for (const auto& t : o.result.tensors) out.append(view_of(o.result.storage, t));
            return out;
          },
          "Success with ferry's memory: one writable uint8 array per tensor, viewing that memory "
          "(zero copy) and keeping it alive. Empty when the fetch landed in given targets.");
}

}  // namespace ferry::python
