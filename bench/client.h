// Client-side helpers shared by ferry-bench's modes: finding objects, a window of fetches kept
// in flight for a while, and a pass over many distinct objects.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <system_error>
#include <vector>

#include "bench/measure.h"
#include "ferry/ferry.h"

namespace ferry::bench {

// A mode's context options: the environment's (ContextOptions::from_environment), named `name`,
// with `threads` io threads and RDMA's busy polling as asked.
ContextOptions bench_options(const std::string& name, int threads, bool busy_poll);

// Says on stderr that ferry-bench's `mode` failed: "ferry-bench MODE: WHAT: ERROR" (no "WHAT: "
// when `what` is empty). Returns 1, the exit status of a run that failed.
int report_failure(const char* mode, const std::string& what, std::error_code ec);

// The first ref in the peer's store whose object has exactly `size` bytes, or nullopt.
std::optional<ObjectRef> find_ref_of_size(Peer& peer, uint64_t size,
                                          std::chrono::milliseconds timeout);

// Keeps `slots` fetches of one object in flight, slot i on peers[i % peers.size()]; each
// completion is counted and its slot reissued from the completion handler until stop(). A fetch
// whose data channel broke is issued again (as in fetch_each; counted in reissued()); the time
// it lost stays in the measured window.
// Targets are preallocated and touched (one per slot) unless ferry_allocates.
class Window {
 public:
  Window(std::vector<Peer> peers, ObjectRef ref, int slots, uint64_t size, bool ferry_allocates);
  ~Window();
  Window(const Window&) = delete;
  Window& operator=(const Window&) = delete;

  // Issues every slot's first fetch.
  void start();
  // Zeroes the counters: what completes from now on is measured.
  void begin_measuring();
  // Stops reissuing and waits up to `limit` for the window to drain; false if it did not (the
  // process must then exit without destroying the window).
  bool stop(std::chrono::seconds limit);

  // Fetches moved in the window, from begin_measuring() to stop(): each fetch that overlaps it
  // counts with the share of its span (issue to completion) inside it, so a window that holds
  // only a few large fetches, or fetches that complete in bunches, is not quantized to whole
  // fetches. Valid after a stop() that drained.
  double measured_fetches() const { return measured_fetches_; }
  double measured_seconds() const;
  // Latency of every measured fetch, microseconds (sorted by the quantile calls).
  std::vector<double>& latencies_us() { return latencies_; }
  std::error_code error() const { return error_; }
  std::string transport() const { return transport_; }
  uint64_t reissued() const { return reissued_; }

 private:
  void launch(int slot, int tries);  // mu_ held
  void on_done(int slot, int tries, Clock::time_point started, boost::system::error_code ec,
               const FetchResult& r);

  std::vector<Peer> peers_;
  ObjectRef ref_;
  uint64_t size_;
  int slots_;
  std::vector<std::unique_ptr<std::byte[]>> buffers_;
  std::mutex mu_;
  std::condition_variable cv_;
  int outstanding_ = 0;
  bool measuring_ = false;
  bool stopping_ = false;
  Clock::time_point measure_from_;
  Clock::time_point measure_to_;
  std::vector<std::pair<Clock::time_point, Clock::time_point>> spans_;  // issued, completed
  double measured_fetches_ = 0;
  uint64_t reissued_ = 0;
  std::vector<double> latencies_;
  std::error_code error_;
  std::string transport_;
};

// CPU seconds a measured window cost this process and the server (-1 without its pid).
struct WindowCpu {
  double client_s = 0;
  double server_s = -1;
};

// The CPU this process and the server (no pid: none) have taken since construction.
class CpuSince {
 public:
  explicit CpuSince(pid_t server_pid);
  WindowCpu taken() const;

 private:
  pid_t server_pid_;
  double client0_;
  double server0_;
};

// One measured stretch of a started window: begin_measuring(), `seconds`, the CPU taken (the
// window only, not the drain after it), `at_end` run (it may sample more), then stop(). A window
// that does not drain within `drain_limit` ends the process (its handlers reference it), with a
// message naming `who`.
WindowCpu measure_window(Window& window, double seconds, pid_t server_pid,
                         std::chrono::seconds drain_limit, const char* who,
                         const std::function<void()>& at_end = {});

// Fetches refs[i] into targets[i] for every i, `inflight` at a time, from `peer`. A fetch that
// fails while the peer's connection lives (its data channel broke: a queue pair that rxe left
// without completions for the stall timeout, say) is issued again, at most 3 times; `reissued`
// (optional) counts them. Returns the wall time in seconds, or the first error that stays
// (errc::timed_out after `limit`).
Result<double> fetch_each(Peer& peer, const std::vector<ObjectRef>& refs,
                          const std::vector<MutableBuffer>& targets, int inflight,
                          std::chrono::seconds limit, uint64_t* reissued = nullptr);

}  // namespace ferry::bench
