#include "bench/scale.h"

#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include "bench/client.h"
#include "bench/measure.h"
#include "ferry/ferry.h"

namespace ferry::bench {

using namespace std::chrono_literals;

int run_scale(const ScaleArgs& args) {
  const auto peer_counts = parse_size_list(args.peers);
  const auto depths = parse_size_list(args.inflight);
  if (peer_counts.empty() || depths.empty()) {
    std::fprintf(stderr, "ferry-bench scale: bad --peers or --inflight\n");
    return 2;
  }
  raise_fd_limit();
  ContextOptions options = ContextOptions::from_environment();
  options.name = "ferry-bench-scale";
  auto ctx = Context::create(options);
  if (!ctx) return report_failure("scale", "", ctx.error());
  std::vector<Peer> peers;
  std::optional<ObjectRef> ref;
  const uint64_t rss_empty = rss_bytes(args.server_pid);
  for (uint64_t want : peer_counts) {
    const auto t_connect = Clock::now();
    while (peers.size() < want) {
      auto peer = (*ctx)->connect(args.from);
      if (!peer) {
        return report_failure("scale", "connect #" + std::to_string(peers.size() + 1),
                              peer.error());
      }
      peers.push_back(std::move(*peer));
    }
    const double connect_s = seconds_between(t_connect, Clock::now());
    if (!ref) ref = find_ref_of_size(peers[0], args.size, 10s);
    if (!ref) {
      std::fprintf(stderr, "ferry-bench scale: no object of %llu bytes on the server\n",
                   static_cast<unsigned long long>(args.size));
      return 1;
    }
    const uint64_t server_rss_idle = rss_bytes(args.server_pid);
    const uint64_t client_rss_idle = rss_bytes();
    for (uint64_t depth : depths) {
      Window window(peers, *ref, static_cast<int>(depth), args.size, false);
      window.start();
      std::this_thread::sleep_for(300ms);
      uint64_t server_rss = 0;
      uint64_t client_rss = 0;
      const WindowCpu cpu =
          measure_window(window, args.seconds, args.server_pid, 60s, "scale", [&] {
            server_rss = rss_bytes(args.server_pid);
            client_rss = rss_bytes();
          });
      if (window.error()) return report_failure("scale", "", window.error());
      const double secs = window.measured_seconds();
      const double bytes = window.measured_fetches() * static_cast<double>(args.size);
      auto& lat = window.latencies_us();
      JsonLine out;
      out.add("tool", "ferry")
          .add("bench", "scale")
          .add("transport", window.transport())
          .add("peers", static_cast<uint64_t>(peers.size()))
          .add("inflight", depth)
          .add("size", args.size)
          .add("connect_s", connect_s)
          .add("gbps", bytes / secs / 1e9)
          .add("fetches_per_s", window.measured_fetches() / secs)
          .add("p50_us", quantile(lat, 0.5))
          .add("p99_us", quantile(lat, 0.99))
          .add("cpu_client_s", cpu.client_s)
          .add("cpu_server_s", cpu.server_s)
          .add("server_rss_start", rss_empty)
          .add("server_rss_idle", server_rss_idle)
          .add("server_rss_busy", server_rss)
          .add("client_rss_idle", client_rss_idle)
          .add("client_rss_busy", client_rss);
      std::printf("%s\n", out.str().c_str());
      std::fflush(stdout);
    }
  }
  for (auto& p : peers) p.close();
  return 0;
}

}  // namespace ferry::bench
