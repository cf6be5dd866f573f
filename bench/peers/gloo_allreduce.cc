// gloo-allreduce: one rank of Gloo's ring allreduce over Gloo's TCP transport, the peer of
// `ferry-bench allreduce` (same loop: bench/allreduce_loop.h, same sizes, repetitions and JSON
// lines, "tool": "gloo").
//
// run.py starts `ranks` of these processes. They meet through a gloo::rendezvous::FileStore in
// --rendezvous (a fresh directory per run), connect a full mesh over gloo::transport::tcp on
// --host, and each call is gloo::allreduce with AllreduceOptions::Algorithm::RING (the
// reduce-scatter + allgather ring of libgloo 0.0~git20220518, segments of at most 1 MiB, two in
// flight; what PyTorch's ProcessGroupGloo calls) and gloo::sum<float>. The barrier before each
// timed sample is gloo::barrier. Every Gloo wait is bounded by --timeout.
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <exception>
#include <memory>
#include <string>

#include "bench/allreduce_loop.h"
#include "bench/measure.h"

namespace {
// Runs `call`; "" or what a Gloo exception said (the loop reports it and stops).
template <typename F>
std::string error_of(F&& call) {
  try {
    call();
  } catch (const std::exception& e) {
    return e.what();
  }
  return {};
}
}  // namespace

int main(int argc, char** argv) {
  using namespace ferry::bench;
  CLI::App app{"gloo-allreduce: Gloo's ring allreduce beside `ferry-bench allreduce`"};
  AllreduceLoopArgs loop;
  loop.tool = "gloo";
  std::string rendezvous, host = "127.0.0.1", sizes = "4K,16K,64K,256K,1M,4M,16M,64M";
  double timeout_s = 60;
  app.add_option("--rank", loop.rank, "This process's rank")->required();
  app.add_option("--ranks", loop.ranks, "Number of ranks")->capture_default_str();
  app.add_option("--rendezvous", rendezvous, "Directory for Gloo's FileStore")->required();
  app.add_option("--host", host, "Address the TCP transport binds")->capture_default_str();
  app.add_option("--sizes", sizes, "Bytes per allreduce (float32)")->capture_default_str();
  app.add_option("--reps", loop.reps, "Timed samples per size")->capture_default_str();
  app.add_option("--calls", loop.calls, "Back-to-back calls per sample")->capture_default_str();
  app.add_option("--warmup", loop.warmup, "Untimed calls per size first")->capture_default_str();
  app.add_option("--timeout", timeout_s, "Seconds: rendezvous and each call")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  loop.sizes = parse_size_list(sizes);
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1e3));
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = host;
    auto device = gloo::transport::tcp::CreateDevice(attr);
    gloo::rendezvous::FileStore file_store(rendezvous);
    gloo::rendezvous::PrefixStore store("gloo-allreduce", file_store);
    auto context = std::make_shared<gloo::rendezvous::Context>(loop.rank, loop.ranks);
    context->setTimeout(timeout);  // also bounds the FileStore's waits for the other ranks
    context->connectFullMesh(store, device);

    AllreduceOps ops;
    ops.allreduce = [&](std::span<float> data) -> std::string {
      gloo::AllreduceOptions opts(context);
      opts.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
      opts.setOutput(data.data(), data.size());  // in place: the output is also the input
      opts.setReduceFunction(
          static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
      opts.setTimeout(timeout);
      return error_of([&] { gloo::allreduce(opts); });
    };
    ops.barrier = [&]() -> std::string {
      gloo::BarrierOptions opts(context);
      opts.setTimeout(timeout);
      return error_of([&] { gloo::barrier(opts); });
    };
    return run_allreduce_loop(loop, ops);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gloo-allreduce rank %d: %s\n", loop.rank, e.what());
    return 1;
  }
}
