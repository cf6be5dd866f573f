#include "ferry/net/fetch.h"

#include <sched.h>

#include <algorithm>

#include "ferry/net/completion.h"
#include "ferry/net/errors.h"
#include "ferry/net/stats.h"

namespace ferry::detail {

FetchState::FetchState(uint64_t id, boost::asio::any_io_executor io_executor,
                       std::chrono::microseconds wait_spin, std::shared_ptr<LoopGate> loop_gate)
    : id_(id),
      io_executor_(std::move(io_executor)),
      wait_spin_(wait_spin),
      loop_gate_(std::move(loop_gate)) {}

bool FetchState::complete(std::error_code ec) {
  std::optional<FetchHandler> handler;
  {
    std::lock_guard lock(mu_);
    if (done_) return false;
    done_ = true;
    ec_ = ec;
    if (!ec) landed_.store(result_.bytes, std::memory_order_relaxed);
    handler.swap(handler_);
    abort_hook_ = nullptr;
  }
  if (stats_) {
    try {
      stats_->fetch_done(ec, result_.bytes, result_.transport,
                         std::chrono::steady_clock::now() - started_);
    } catch (const std::bad_alloc&) {  // a count is lost under memory pressure, not the completion
    }
  }
  cv_.notify_all();
  if (handler) {
    post_completion(loop_gate_, io_executor_, std::move(*handler), boost::system::error_code(ec),
                    std::move(result_));
  }
  return true;
}

std::error_code FetchState::wait(std::chrono::milliseconds timeout) {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  if (wait_spin_.count() > 0 && timeout.count() != 0) {
    const Clock::duration spin = timeout.count() > 0
                                     ? std::min<Clock::duration>(wait_spin_, timeout)
                                     : Clock::duration(wait_spin_);
    while (Clock::now() - start < spin) {
      if (auto o = outcome()) return *o;
      sched_yield();
    }
  }
  std::unique_lock lock(mu_);
  if (timeout.count() < 0) {
    cv_.wait(lock, [&] { return done_; });
  } else if (!cv_.wait_until(lock, start + timeout, [&] { return done_; })) {
    return make_error_code(errc::timed_out);
  }
  return ec_;
}

bool FetchState::done() const {
  std::lock_guard lock(mu_);
  return done_;
}

std::optional<std::error_code> FetchState::outcome() const {
  std::lock_guard lock(mu_);
  if (!done_) return std::nullopt;
  return ec_;
}

void FetchState::set_stats(std::shared_ptr<StatsRecorder> stats,
                           std::chrono::steady_clock::time_point started) {
  std::lock_guard lock(mu_);
  stats_ = std::move(stats);
  started_ = started;
  if (stats_) stats_->fetch_started();
}

void FetchState::set_handler(FetchHandler handler) {
  std::lock_guard lock(mu_);
  handler_.emplace(std::move(handler));
}

void FetchState::set_abort_hook(std::function<void()> hook) {
  std::lock_guard lock(mu_);
  if (!done_) abort_hook_ = std::move(hook);
}

void FetchState::request_abort() {
  std::function<void()> hook;
  {
    std::lock_guard lock(mu_);
    if (done_) return;
    hook = abort_hook_;
  }
  if (hook) hook();
}

}  // namespace ferry::detail

namespace ferry {

std::error_code FetchRequest::wait(std::chrono::milliseconds timeout) const {
  if (!state_) return make_error_code(errc::invalid_argument);
  return state_->wait(timeout);
}

std::optional<std::error_code> FetchRequest::outcome() const {
  if (!state_) return make_error_code(errc::invalid_argument);
  return state_->outcome();
}

void FetchRequest::abort() const {
  if (state_) state_->request_abort();
}

}  // namespace ferry
