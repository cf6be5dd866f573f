#include "bench/client.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <thread>

namespace ferry::bench {

ContextOptions bench_options(const std::string& name, int threads, bool busy_poll) {
  ContextOptions options = ContextOptions::from_environment();
  options.name = name;
  options.threads = threads;
  options.transport_options_for<rdma::RdmaOptions>(rdma::kRdmaTransportName).busy_poll = busy_poll;
  return options;
}

int report_failure(const char* mode, const std::string& what, std::error_code ec) {
  std::fprintf(stderr, "ferry-bench %s: %s%s%s\n", mode, what.c_str(), what.empty() ? "" : ": ",
               ec.message().c_str());
  return 1;
}

std::optional<ObjectRef> find_ref_of_size(Peer& peer, uint64_t size,
                                          std::chrono::milliseconds timeout) {
  auto refs = peer.list(timeout);
  if (!refs) return std::nullopt;
  for (auto& ref : *refs) {
    if (ref.metadata.total_bytes() == size) return ref;
  }
  return std::nullopt;
}

namespace {

// A fetch that failed while its peer's connection lives (its data channel broke: a queue pair
// that rxe left without completions for the stall timeout, say) is issued again, at most 3 times.
bool worth_reissuing(std::error_code ec, Peer& peer, int tries) {
  return ec && tries < 3 && scope_of(ec) == Scope::peer && peer.is_open();
}

}  // namespace

// ---------------------------------------------------------------- Window

Window::Window(std::vector<Peer> peers, ObjectRef ref, int slots, uint64_t size,
               bool ferry_allocates)
    : peers_(std::move(peers)), ref_(std::move(ref)), size_(size), slots_(std::max(1, slots)) {
  if (!ferry_allocates) {
    buffers_.resize(static_cast<size_t>(slots_));
    for (auto& b : buffers_) {
      b.reset(new std::byte[std::max<uint64_t>(size, 1)]);
      std::memset(b.get(), 0, size);  // faulted in before the clock starts
    }
  }
}

Window::~Window() = default;

void Window::start() {
  std::lock_guard lock(mu_);
  outstanding_ = slots_;
  for (int i = 0; i < slots_; ++i) launch(i, 0);
}

void Window::begin_measuring() {
  std::lock_guard lock(mu_);
  measure_from_ = Clock::now();
  measuring_ = true;
  spans_.clear();
  latencies_.clear();
}

bool Window::stop(std::chrono::seconds limit) {
  std::unique_lock lock(mu_);
  measure_to_ = Clock::now();
  stopping_ = true;
  if (!cv_.wait_for(lock, limit, [this] { return outstanding_ == 0; })) return false;
  // Each fetch moved its bytes over its whole span, evenly as far as we know: the window gets
  // the share of each span that lies inside it.
  measured_fetches_ = 0;
  for (const auto& [from, to] : spans_) {
    const auto lo = std::max(from, measure_from_);
    const auto hi = std::min(to, measure_to_);
    if (hi <= lo) continue;
    measured_fetches_ += to > from ? seconds_between(lo, hi) / seconds_between(from, to) : 1.0;
  }
  return true;
}

double Window::measured_seconds() const { return seconds_between(measure_from_, measure_to_); }

void Window::launch(int slot, int tries) {
  std::vector<MutableBuffer> targets;
  if (!buffers_.empty()) targets.push_back({buffers_[static_cast<size_t>(slot)].get(), size_});
  const auto started = Clock::now();
  // Never completes inline, so holding mu_ here is safe.
  peers_[static_cast<size_t>(slot) % peers_.size()].async_fetch(
      ref_, std::move(targets),
      [this, slot, started, tries](boost::system::error_code ec, FetchResult r) {
        on_done(slot, tries, started, ec, r);
      });
}

void Window::on_done(int slot, int tries, Clock::time_point started, boost::system::error_code ec,
                     const FetchResult& r) {
  const auto now = Clock::now();
  std::lock_guard lock(mu_);
  if (!error_ && !stopping_ &&
      worth_reissuing(ec, peers_[static_cast<size_t>(slot) % peers_.size()], tries)) {
    ++reissued_;
    launch(slot, tries + 1);
    return;
  }
  if (ec && !error_) error_ = std::error_code(ec);
  if (!ec && transport_.empty()) transport_ = r.transport;
  if (!ec && measuring_) spans_.emplace_back(started, now);  // those of the drain too
  if (!ec && measuring_ && !stopping_) {
    if (started >= measure_from_) {
      latencies_.push_back(std::chrono::duration<double, std::micro>(now - started).count());
    }
  }
  if (ec || stopping_) {
    if (--outstanding_ == 0) cv_.notify_all();
    return;
  }
  launch(slot, 0);
}

CpuSince::CpuSince(pid_t server_pid)
    : server_pid_(server_pid),
      client0_(self_cpu_seconds()),
      server0_(server_pid ? process_cpu_seconds(server_pid) : -1) {}

WindowCpu CpuSince::taken() const {
  WindowCpu cpu;
  cpu.client_s = self_cpu_seconds() - client0_;
  if (server_pid_) cpu.server_s = process_cpu_seconds(server_pid_) - server0_;
  return cpu;
}

WindowCpu measure_window(Window& window, double seconds, pid_t server_pid,
                         std::chrono::seconds drain_limit, const char* who,
                         const std::function<void()>& at_end) {
  const CpuSince since(server_pid);
  window.begin_measuring();
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  const WindowCpu cpu = since.taken();
  if (at_end) at_end();
  if (!window.stop(drain_limit)) {
    std::fprintf(stderr, "ferry-bench %s: fetches still in flight %lld s after the end\n", who,
                 static_cast<long long>(drain_limit.count()));
    std::fflush(stderr);
    std::_Exit(1);
  }
  return cpu;
}

// ---------------------------------------------------------------- fetch_each

Result<double> fetch_each(Peer& peer, const std::vector<ObjectRef>& refs,
                          const std::vector<MutableBuffer>& targets, int inflight,
                          std::chrono::seconds limit, uint64_t* reissued) {
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    size_t next = 0;
    size_t done = 0;
    size_t outstanding = 0;
    uint64_t reissued = 0;
    std::error_code error;
  };
  auto st = std::make_shared<State>();
  const size_t n = refs.size();
  // Issues fetch i for the `tries`-th time (0: the first); mu held.
  std::function<void(size_t, int)> launch;
  launch = [&, st](size_t i, int tries) {
    ++st->outstanding;
    peer.async_fetch(
        refs[i],
        targets.empty() ? std::vector<MutableBuffer>{} : std::vector<MutableBuffer>{targets[i]},
        [&, st, i, tries](boost::system::error_code ec, FetchResult) {
          std::lock_guard lock(st->mu);
          --st->outstanding;
          const std::error_code e(ec);
          if (!st->error && worth_reissuing(e, peer, tries)) {
            ++st->reissued;
            launch(i, tries + 1);
            return;
          }
          ++st->done;
          if (e && !st->error) st->error = e;
          if (!st->error && st->next < n) launch(st->next++, 0);
          if (st->outstanding == 0) st->cv.notify_all();
        });
  };
  const auto t0 = Clock::now();
  std::unique_lock lock(st->mu);
  while (st->next < n && st->outstanding < static_cast<size_t>(std::max(1, inflight))) {
    launch(st->next++, 0);
  }
  const bool ok = st->cv.wait_for(lock, limit, [&] { return st->outstanding == 0; });
  const double secs = seconds_between(t0, Clock::now());
  if (reissued) *reissued += st->reissued;
  if (!ok) {
    std::fprintf(stderr, "ferry-bench: %zu fetches still in flight after %lld s\n", st->outstanding,
                 static_cast<long long>(limit.count()));
    std::fflush(stderr);
    std::_Exit(1);  // handlers still reference this frame
  }
  if (st->error) return st->error;
  return secs;
}

}  // namespace ferry::bench
