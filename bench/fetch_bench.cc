#include "bench/fetch_bench.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <thread>
#include <vector>

#include "bench/client.h"
#include "bench/measure.h"
#include "ferry/ferry.h"

namespace ferry::bench {
using namespace std::chrono_literals;

namespace {

// Connected and idle: what waiting costs both sides (heartbeats only).
int run_idle(const FetchArgs& args, Peer& peer) {
  const CpuSince since(args.server_pid);
  const auto t0 = Clock::now();
  std::this_thread::sleep_for(std::chrono::duration<double>(args.seconds));
  const double secs = seconds_between(t0, Clock::now());
  const WindowCpu cpu = since.taken();
  JsonLine out;
  out.add("tool", "ferry")
      .add("bench", "idle")
      .add("transport", peer.transport())
      .add("busy_poll", args.busy_poll ? 1 : 0)
      .add("seconds", secs)
      .add("cpu_client_s", cpu.client_s)
      .add("cpu_server_s", cpu.server_s);
  std::printf("%s\n", out.str().c_str());
  return 0;
}

// The measured part of a fetch line: `fetches` of `size` bytes in `secs`, their latencies and the
// CPU both processes took.
void add_measured(JsonLine& out, uint64_t size, double fetches, double secs,
                  std::vector<double>& latencies_us, const WindowCpu& cpu) {
  const double bytes = fetches * static_cast<double>(size);
  out.add("seconds", secs)
      .add("gbps", bytes / secs / 1e9)
      .add("fetches_per_s", fetches / secs)
      .add("p50_us", quantile(latencies_us, 0.5))
      .add("p99_us", quantile(latencies_us, 0.99))
      .add("cpu_client_s", cpu.client_s)
      .add("cpu_server_s", cpu.server_s);
  if (bytes > 0) {
    out.add("cpu_s_per_gb", (cpu.client_s + std::max(0.0, cpu.server_s)) / (bytes / 1e9));
  }
}

// One fetch at a time from this thread, each peer.fetch() then wait(): the plainest code's
// latency (the completion hands over to a waiting thread, where a window reissues from the io
// thread). Into one buffer, or into ferry's memory.
int run_wait_loop(const FetchArgs& args, Peer& peer, const ObjectRef& ref) {
  std::vector<std::byte> buffer(args.ferry_allocates ? 0 : args.size);
  std::vector<double> latencies;
  std::string transport;
  const auto once = [&]() -> std::error_code {
    const auto t0 = Clock::now();
    std::vector<MutableBuffer> targets;
    if (!args.ferry_allocates) targets.push_back(MutableBuffer(buffer));
    auto req = peer.fetch(ref, std::move(targets));
    if (auto ec = req.wait(30s)) return ec;
    latencies.push_back(seconds_between(t0, Clock::now()) * 1e6);
    transport = req.result().transport;
    return {};
  };
  const auto run_for = [&](double seconds) -> std::error_code {
    const auto until = Clock::now() + std::chrono::duration<double>(seconds);
    while (Clock::now() < until) {
      if (auto ec = once()) return ec;
    }
    return {};
  };
  if (auto ec = run_for(args.warmup)) return report_failure("fetch", "", ec);
  latencies.clear();
  const CpuSince since(args.server_pid);
  const auto t0 = Clock::now();
  if (auto ec = run_for(args.seconds)) return report_failure("fetch", "", ec);
  const double secs = seconds_between(t0, Clock::now());
  const WindowCpu cpu = since.taken();
  const double fetches = static_cast<double>(latencies.size());
  JsonLine out;
  out.add("tool", "ferry")
      .add("bench", "wait")
      .add("transport", transport)
      .add("size", args.size)
      .add("inflight", 1)
      .add("ferry_allocates", args.ferry_allocates ? 1 : 0)
      .add("fetches", fetches);
  add_measured(out, args.size, fetches, secs, latencies, cpu);
  std::printf("%s\n", out.str().c_str());
  return 0;
}

}  // namespace

int run_fetch(const FetchArgs& args) {
  auto ctx = Context::create(bench_options("ferry-bench-fetch", args.threads, args.busy_poll));
  if (!ctx) return report_failure("fetch", "", ctx.error());
  auto peer = (*ctx)->connect(args.from);
  if (!peer) return report_failure("fetch", "connect " + args.from, peer.error());
  auto ref = find_ref_of_size(*peer, args.size, 10s);
  if (!ref) {
    std::fprintf(stderr, "ferry-bench fetch: the server has no object of %llu bytes\n",
                 static_cast<unsigned long long>(args.size));
    return 1;
  }
  if (args.inflight == 0) return run_idle(args, *peer);
  if (args.wait) return run_wait_loop(args, *peer, *ref);
  Window window({*peer}, *ref, std::max(1, args.inflight), args.size, args.ferry_allocates);
  window.start();
  std::this_thread::sleep_for(std::chrono::duration<double>(args.warmup));
  const WindowCpu cpu = measure_window(window, args.seconds, args.server_pid, 30s, "fetch");
  if (window.error()) return report_failure("fetch", "", window.error());
  const double secs = window.measured_seconds();
  const double fetches = window.measured_fetches();
  JsonLine out;
  out.add("tool", "ferry")
      .add("transport", window.transport())
      .add("size", args.size)
      .add("inflight", args.inflight)
      .add("ferry_allocates", args.ferry_allocates ? 1 : 0)
      .add("busy_poll", args.busy_poll ? 1 : 0)
      .add("fetches", fetches)
      .add("reissued", window.reissued());
  add_measured(out, args.size, fetches, secs, window.latencies_us(), cpu);
  const auto pool = (*ctx)->pool_stats();
  out.add("pool_hits", pool.hits)
      .add("pool_misses", pool.misses)
      .add("pool_fallbacks", pool.fallbacks)
      .add("pool_held_bytes", pool.held_bytes);
  std::printf("%s\n", out.str().c_str());
  return 0;
}

}  // namespace ferry::bench
