#include "bench/allreduce_bench.h"

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "bench/allreduce_loop.h"
#include "bench/client.h"
#include "bench/measure.h"
#include "ferry/collective/group.h"
#include "ferry/ferry.h"

namespace ferry::bench {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

// Every rank's address from `dir`/ferry-R, waiting until `deadline`; empty if one never came.
std::vector<std::string> wait_for_addresses(const fs::path& dir, int n,
                                            Clock::time_point deadline) {
  std::vector<std::string> addresses(n);
  for (int r = 0; r < n; ++r) {
    const auto file = dir / ("ferry-" + std::to_string(r));
    while (!fs::exists(file)) {
      if (Clock::now() > deadline) {
        std::fprintf(stderr, "ferry-bench allreduce: rank %d never published %s\n", r,
                     file.c_str());
        return {};
      }
      std::this_thread::sleep_for(5ms);
    }
    std::ifstream(file) >> addresses[r];
  }
  return addresses;
}

std::string status_text(const collective::Status& s) {
  return s.message.empty() ? s.ec.message() : s.message;
}

}  // namespace

int run_allreduce(const AllreduceArgs& args) {
  if (args.rank < 0 || args.rank >= args.ranks || args.rendezvous.empty()) {
    std::fprintf(stderr, "ferry-bench allreduce: need 0 <= --rank < --ranks and --rendezvous\n");
    return 2;
  }
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(args.join_timeout_s));
  ContextOptions options = ContextOptions::from_environment();
  options.name = "allreduce-rank" + std::to_string(args.rank);
  options.threads = args.threads;
  auto ctx = Context::create(options);
  if (!ctx) return report_failure("allreduce", "", ctx.error());
  auto port = (*ctx)->listen(args.host + ":0");
  if (!port) return report_failure("allreduce", "listen", port.error());
  const fs::path dir(args.rendezvous);
  {
    const auto tmp = dir / (".ferry-" + std::to_string(args.rank));
    std::ofstream(tmp) << args.host << ":" << *port << "\n";
    fs::rename(tmp, dir / ("ferry-" + std::to_string(args.rank)));  // whole or not at all
  }
  auto addresses = wait_for_addresses(dir, args.ranks, deadline);
  if (addresses.empty()) return 1;

  collective::GroupOptions group_options;
  group_options.name = "bench-allreduce";
  group_options.join_timeout = std::chrono::duration_cast<std::chrono::milliseconds>(
      std::max(Clock::duration(0), deadline - Clock::now()));
  group_options.timeout =
      std::chrono::milliseconds(static_cast<int64_t>(args.call_timeout_s * 1e3));
  if (args.doubling_threshold) group_options.doubling_threshold = args.doubling_threshold;
  if (args.segment_bytes) group_options.segment_bytes = args.segment_bytes;
  if (args.ring_threshold) group_options.ring_threshold = args.ring_threshold;
  group_options.busy_wait = args.busy_wait;
  if (args.busy_wait_below) group_options.busy_wait_below = args.busy_wait_below;
  if (args.busy_spin_us >= 0)
    group_options.busy_spin = std::chrono::microseconds(args.busy_spin_us);
  collective::Status why;
  auto group = collective::Group::join(**ctx, addresses, args.rank, group_options, &why);
  if (!group) {
    std::fprintf(stderr, "ferry-bench allreduce: rank %d: join: %s\n", args.rank,
                 status_text(why).c_str());
    return 1;
  }
  collective::Group& g = **group;

  // The barrier: an allgather of one byte per rank, which no rank leaves before every rank has
  // entered it (it needs every rank's byte). A broadcast from rank 0 would let the others leave
  // once rank 0 had entered.
  std::byte token{0};
  std::vector<std::byte> tokens(static_cast<size_t>(args.ranks));
  AllreduceOps ops;
  ops.allreduce = [&](std::span<float> data) -> std::string {
    auto s = g.allreduce(std::as_writable_bytes(data), DType::kFloat32, collective::ReduceOp::kSum);
    return s ? std::string() : status_text(s);
  };
  ops.barrier = [&]() -> std::string {
    auto s = g.allgather(std::span<const std::byte>(&token, 1), tokens);
    return s ? std::string() : status_text(s);
  };
  AllreduceLoopArgs loop;
  loop.tool = "ferry";
  loop.rank = args.rank;
  loop.ranks = args.ranks;
  loop.sizes = args.sizes;
  loop.reps = args.reps;
  loop.calls = args.calls;
  loop.warmup = args.warmup;
  const int rc = run_allreduce_loop(loop, ops);
  group->reset();  // before the Context it uses
  return rc;
}

}  // namespace ferry::bench
