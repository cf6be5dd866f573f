/// @file
/// FetchRequest and FetchResult: the two ways to hold a fetch in flight.
///
/// A fetch completes exactly once: with success, an error, a timeout (its own deadline) or
/// operation aborted. Once it has completed, ferry never touches its target buffers again.
#pragma once

#include <atomic>
#include <boost/asio/any_completion_handler.hpp>
#include <boost/asio/any_io_executor.hpp>
#include <boost/system/error_code.hpp>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "ferry/net/loop_gate.h"
#include "ferry/net/object_ref.h"
#include "ferry/store/tensor.h"

namespace ferry {

/// What a fetch produced. On failure the handler still gets ref, transport and elapsed; the
/// tensors must not be read then.
struct FetchResult {
  ObjectRef ref;                       ///< the ref that was fetched
  std::vector<MutableBuffer> tensors;  ///< where each tensor landed
  /// owns the memory when ferry allocated it; null otherwise
  std::shared_ptr<std::byte[]> storage;
  std::string transport;                ///< the transport that moved the bytes
  uint64_t bytes = 0;                   ///< the object's size: every tensor's bytes
  std::chrono::nanoseconds elapsed{0};  ///< from the fetch's start to its completion
  /// Times the fetch was started again because its data channel broke under it
  /// (PeerLink::restart_fetch; at most kMaxFetchRestarts in a row that brought no new bytes):
  /// 0 for almost every fetch.
  uint32_t restarts = 0;
};

/// How many times in a row one fetch is started again over a new data channel when its channel
/// broke while its peer lives (a one-sided transport's queue pair flushed, stalled or reset)
/// without having landed a byte more than the attempt before. An attempt that made progress
/// resumes where it stopped and starts the count again.
inline constexpr uint32_t kMaxFetchRestarts = 3;

/// FetchOptions::combine: gets a piece of a target and the bytes that arrived for it (the same
/// size) and stores what the piece should hold.
using CombineFn =
    std::function<void(std::span<std::byte> target, std::span<const std::byte> arrived)>;

/// How one fetch runs (Peer::fetch, Peer::async_fetch); the defaults suit most fetches.
struct FetchOptions {
  std::string transport;  ///< "" = the ref's transport if both sides have it,
                          ///< else the one negotiated for the peer
  /// fetch deadline; 0 = none (peer liveness still bounds it)
  std::chrono::milliseconds timeout{0};
  /// Optional: combine the arriving bytes into the targets instead of overwriting them (CombineFn);
  /// it runs on the peer's strand, once per
  /// piece, every byte of each target exactly once, in order within a tensor. A transport that
  /// streams (TCP) calls it as the bytes arrive, from a small buffer, so the bytes never land
  /// whole anywhere; others land them in a buffer of their own and call it once per non-empty
  /// tensor when the fetch succeeds. On failure the targets may hold a partial combination (TCP).
  CombineFn combine;
  /// How long FetchRequest::wait() polls before it sleeps; unset: the context's
  /// ContextOptions::idle_spin.
  std::optional<std::chrono::microseconds> wait_spin;
  /// Checks the bytes that landed against the checksums the ref carries (PutOptions::checksum) on
  /// success, before the fetch completes, on the peer's strand (a pass over the bytes, about as
  /// fast as copying them where the CPU has a crc32 instruction), and fails the fetch with
  /// errc::data_corrupted on a difference (the log names the tensor). A ref without checksums is
  /// not checked. false: never check.
  bool verify = true;
};

/// Completion signature of async_fetch. The error_code wraps a std::error_code of ferry's category
/// (std::error_code(ec) recovers it), so Asio's use_future / use_awaitable throw
/// boost::system::system_error on failure and as_tuple(...) delivers it without throwing.
using FetchSignature = void(boost::system::error_code, FetchResult);
/// A type-erased completion handler of FetchSignature (Peer::fetch with a handler): move-only, run
/// once.
using FetchHandler = boost::asio::any_completion_handler<FetchSignature>;

namespace detail {

class StatsRecorder;

// Shared by the FetchRequest handle, the session that runs the fetch and the handler.
class FetchState {
 public:
  // `wait_spin`: how long wait() polls before it sleeps (the fetch's FetchOptions::wait_spin, else
  // the context's idle_spin). `loop_gate`: the gate of `io_executor`'s loop, when it is a
  // context's (a handler whose fetch completes after that loop's last run is then delivered by
  // the system executor); null for an executor that always runs.
  FetchState(uint64_t id, boost::asio::any_io_executor io_executor,
             std::chrono::microseconds wait_spin = {},
             std::shared_ptr<LoopGate> loop_gate = nullptr);

  uint64_t id() const { return id_; }

  // First call wins; later ones return false. Wakes waiters and posts the handler, if any
  // (never runs it inline).
  bool complete(std::error_code ec);

  // Blocks until completion or `timeout` (negative: no limit; zero: poll), polling for up to
  // wait_spin first (yielding the core at each turn), so that a fetch done soon hands over
  // without a wake-up. Returns the fetch's error, or errc::timed_out when the wait itself ran out
  // (the fetch goes on).
  std::error_code wait(std::chrono::milliseconds timeout);
  bool done() const;
  // std::nullopt while in flight; then the fetch's own result (empty on success).
  std::optional<std::error_code> outcome() const;

  // The result is filled by the session before completion; read it only after done().
  FetchResult& result() { return result_; }

  void set_handler(FetchHandler handler);
  // Counts this fetch in `stats`: in flight from now, and when it completes its outcome, bytes,
  // transport and the time since `started`. Once, before the fetch can complete; the session's
  // thread.
  void set_stats(std::shared_ptr<StatsRecorder> stats,
                 std::chrono::steady_clock::time_point started);
  // Asks the running side to abort (set by the session). Safe from any thread, any time.
  void set_abort_hook(std::function<void()> hook);
  void request_abort();
  // Bytes landed in the targets so far: transports add as they land (any thread), a restart
  // starts again from what its new attempt resumes at, success sets the total.
  void add_landed(uint64_t bytes) { landed_.fetch_add(bytes, std::memory_order_relaxed); }
  void set_landed(uint64_t bytes) { landed_.store(bytes, std::memory_order_relaxed); }
  uint64_t landed() const { return landed_.load(std::memory_order_relaxed); }

 private:
  const uint64_t id_;
  boost::asio::any_io_executor io_executor_;
  const std::chrono::microseconds wait_spin_;
  const std::shared_ptr<LoopGate> loop_gate_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::error_code ec_;
  FetchResult result_;
  // optional: Boost 1.81's any_completion_handler cannot be moved while empty.
  std::optional<FetchHandler> handler_;
  std::function<void()> abort_hook_;
  std::shared_ptr<StatsRecorder> stats_;
  std::atomic<uint64_t> landed_{0};
  std::chrono::steady_clock::time_point started_;
};

}  // namespace detail

/// The TransportManager-style handle of one fetch (Ray's FetchRequest). Copyable; all copies
/// refer to the same fetch. Methods are thread-safe.
class FetchRequest {
 public:
  FetchRequest() = default;
  /// A handle on `state`: how ferry's sessions and transports make one (applications get theirs
  /// from Peer::fetch).
  explicit FetchRequest(std::shared_ptr<detail::FetchState> state) : state_(std::move(state)) {}

  /// False for a default-constructed request, which no fetch stands behind.
  bool valid() const { return state_ != nullptr; }
  /// The fetch's request id on its peer's session (as in logs); 0 for an invalid request.
  uint64_t id() const { return state_ ? state_->id() : 0; }

  /// -1 (any negative) waits without limit, 0 polls, a positive timeout returns errc::timed_out
  /// when it expires (the fetch itself continues). Otherwise returns the fetch's own result:
  /// success, or the error it completed with. It polls for the context's
  /// ContextOptions::idle_spin before it sleeps, so a fetch that completes soon is handed over
  /// without a wake-up. Do not call from a ferry completion handler.
  std::error_code wait(std::chrono::milliseconds timeout) const;
  /// Whether the fetch has completed (false for an invalid request). Never blocks.
  bool done() const { return state_ && state_->done(); }
  /// Non-blocking and unambiguous: std::nullopt while the fetch is in flight, then its own result
  /// (an empty error_code on success). Unlike wait(), a timeout here is always the fetch's own.
  /// An invalid (default-constructed) request reports errc::invalid_argument.
  std::optional<std::error_code> outcome() const;

  /// The result, valid once done() and successful.
  FetchResult& result() const { return state_->result(); }

  /// Bytes of this fetch that have landed in its targets so far: for progress displays. The
  /// built-in transports report as bytes land (TCP per chunk received, RDMA per completed READ);
  /// a transport that does not report shows 0 until success. The total once the fetch succeeded;
  /// back to 0 when a fetch restarts on a new channel. 0 for an invalid request. Any thread;
  /// never blocks.
  uint64_t bytes_landed() const { return state_ ? state_->landed() : 0; }
  /// For transports: `bytes` more of this fetch have landed in its targets (bytes_landed()).
  /// Any thread; never blocks.
  void report_landed(uint64_t bytes) const {
    if (state_) state_->add_landed(bytes);
  }

  /// Asks for the fetch to stop. Completes it with errc::aborted unless it completed first;
  /// asynchronous: wait() observes it. The peer stays usable.
  void abort() const;

 private:
  std::shared_ptr<detail::FetchState> state_;
};

}  // namespace ferry
