// ferry-bench: ferry's side of the benchmark that bench/run.py runs beside iperf3, ucx_perftest,
// qperf, sockperf, perftest, Gloo and Open MPI. This file only wires the subcommands to their
// runners.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <exception>
#include <string>

#include "bench/allreduce_bench.h"
#include "bench/fetch_bench.h"
#include "bench/measure.h"
#include "bench/memcpy_bench.h"
#include "bench/pingpong.h"
#include "bench/reduce_bench.h"
#include "bench/registration.h"
#include "bench/scale.h"
#include "bench/serve.h"

namespace ferry::bench {
namespace {

uint64_t one_size(const std::string& text) {
  auto v = parse_size_list(text);
  if (v.size() != 1) throw CLI::ValidationError("size", "expected one size such as 8, 64K or 1M");
  return v[0];
}

const CLI::IsMember kGrants({"auto", "windows", "registrations", "regions"});

}  // namespace
}  // namespace ferry::bench

int main(int argc, char** argv) {
  using namespace ferry::bench;
  CLI::App app{"ferry-bench: ferry's side of `make bench` (see bench/README.md)"};
  app.require_subcommand(1);

  ServeArgs serve;
  auto* s = app.add_subcommand("serve", "Put one object per size and serve until SIGTERM");
  s->add_option("--listen", serve.listen, "HOST:PORT (port 0: any)")->capture_default_str();
  s->add_option("--sizes", serve.sizes, "Object sizes, e.g. 8,4K,1M")->capture_default_str();
  s->add_option("--threads", serve.threads, "io_context threads")->capture_default_str();
  s->add_flag("--busy-poll", serve.busy_poll, "Poll RDMA completion queues");
  s->add_option("--max-requests", serve.max_requests, "Requests one peer may have served at once");
  s->add_option("--grants", serve.grants, "RDMA grants: rdma::RdmaOptions::grants")
      ->check(kGrants)
      ->capture_default_str();
  std::string chunk = "0";
  s->add_option("--tcp-chunk", chunk, "TCP data channel chunk size (0: the default)");

  FetchArgs fetch;
  std::string fetch_size = "1M";
  auto* f = app.add_subcommand("fetch", "Fetch one object size for a while; print a JSON line");
  f->add_option("--from", fetch.from, "The server's HOST:PORT")->required();
  f->add_option("--size", fetch_size, "Object size")->capture_default_str();
  f->add_option("--inflight", fetch.inflight, "Fetches in flight")->capture_default_str();
  f->add_option("--seconds", fetch.seconds, "Measured seconds")->capture_default_str();
  f->add_option("--warmup", fetch.warmup, "Unmeasured seconds first")->capture_default_str();
  f->add_option("--server-pid", fetch.server_pid, "Server process, for its CPU time");
  f->add_flag("--ferry-allocates", fetch.ferry_allocates, "No targets: ferry allocates");
  f->add_flag("--wait", fetch.wait,
              "One at a time from the main thread, each fetch().wait() (not a callback window)");
  f->add_option("--threads", fetch.threads, "io_context threads")->capture_default_str();
  f->add_flag("--busy-poll", fetch.busy_poll, "Poll RDMA completion queues");

  std::string memcpy_size = "64M";
  double memcpy_seconds = 1.0;
  auto* mc = app.add_subcommand("memcpy", "Single-core memcpy bandwidth (the loopback bound)");
  mc->add_option("--size", memcpy_size, "Buffer size")->capture_default_str();
  mc->add_option("--seconds", memcpy_seconds, "Measured seconds")->capture_default_str();

  std::string reduce_size = "4M";
  double reduce_seconds = 0.5;
  auto* rd = app.add_subcommand(
      "reduce", "Single-core reduction kernels (sum, max) per dtype and place of the result");
  rd->add_option("--size", reduce_size, "Buffer size")->capture_default_str();
  rd->add_option("--seconds", reduce_seconds, "Measured seconds per line")->capture_default_str();

  PingPongArgs pp;
  std::string pp_size = "8";
  auto* ps = app.add_subcommand("pingpong-serve", "Raw-socket baseline server");
  ps->add_option("--listen", pp.address, "HOST:PORT")->capture_default_str();
  auto* pc = app.add_subcommand("pingpong", "Raw-socket baseline client; prints a JSON line");
  pc->add_option("--to", pp.address, "HOST:PORT")->required();
  pc->add_option("--size", pp_size, "Answer size")->capture_default_str();
  pc->add_option("--seconds", pp.seconds, "Measured seconds")->capture_default_str();
  pc->add_option("--warmup", pp.warmup, "Unmeasured seconds first")->capture_default_str();
  pc->add_option("--inflight", pp.inflight,
                 "Answers asked for at a time, each into a buffer of its own")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();

  RegistrationArgs reg;
  std::string view_bytes = "200K";
  std::string tensor_bytes = "2M";
  auto* r = app.add_subcommand("registration", "Views of one allocation vs separate tensors");
  r->add_option("--host", reg.host, "Owner's listen address")->capture_default_str();
  r->add_option("--views", reg.views, "Views of one allocation (0: skip)")->capture_default_str();
  r->add_option("--view-bytes", view_bytes, "Bytes per view")->capture_default_str();
  r->add_option("--tensors", reg.tensors, "Separate tensors (0: skip)")->capture_default_str();
  r->add_option("--tensor-bytes", tensor_bytes, "Bytes per tensor")->capture_default_str();
  r->add_option("--inflight", reg.inflight, "Fetches in flight")->capture_default_str();
  r->add_flag("!--no-pool", reg.pool, "Skip the views fetched into ferry's receive pool");
  r->add_option("--grants", reg.grants, "The owner's rdma::RdmaOptions::grants")
      ->check(kGrants)
      ->capture_default_str();

  ScaleArgs scale;
  std::string scale_size = "64K";
  auto* sc = app.add_subcommand("scale", "Many peers on one server; prints JSON lines");
  sc->add_option("--from", scale.from, "The server's HOST:PORT")->required();
  sc->add_option("--size", scale_size, "Object size")->capture_default_str();
  sc->add_option("--peers", scale.peers, "Peer counts")->capture_default_str();
  sc->add_option("--inflight", scale.inflight, "Fetches in flight")->capture_default_str();
  sc->add_option("--seconds", scale.seconds, "Measured seconds")->capture_default_str();
  sc->add_option("--server-pid", scale.server_pid, "Server process, for CPU and memory");

  AllreduceArgs ar;
  std::string ar_sizes = "4K,16K,64K,256K,1M,4M,16M,64M";
  auto* a = app.add_subcommand("allreduce", "One rank of a Group allreduce sweep (JSON lines)");
  a->add_option("--rank", ar.rank, "This process's rank")->required();
  a->add_option("--ranks", ar.ranks, "Number of ranks")->capture_default_str();
  a->add_option("--rendezvous", ar.rendezvous, "Directory where ranks publish their addresses")
      ->required();
  a->add_option("--host", ar.host, "Address to listen on (any port)")->capture_default_str();
  a->add_option("--sizes", ar_sizes, "Bytes per allreduce (float32)")->capture_default_str();
  a->add_option("--reps", ar.reps, "Timed samples per size")->capture_default_str();
  a->add_option("--calls", ar.calls, "Back-to-back calls per sample")->capture_default_str();
  a->add_option("--warmup", ar.warmup, "Untimed calls per size first")->capture_default_str();
  a->add_option("--threads", ar.threads, "io_context threads")->capture_default_str();
  a->add_option("--join-timeout", ar.join_timeout_s, "Seconds for rendezvous + join")
      ->capture_default_str();
  a->add_option("--timeout", ar.call_timeout_s, "Seconds per collective call")
      ->capture_default_str();
  std::string ar_doubling = "0";
  a->add_option("--doubling-threshold", ar_doubling,
                "GroupOptions::doubling_threshold (0: default)");
  std::string ar_ring = "0";
  a->add_option("--ring-threshold", ar_ring, "GroupOptions::ring_threshold (0: default)");
  std::string ar_segment = "0";
  a->add_option("--segment", ar_segment, "GroupOptions::segment_bytes (0: default)");
  a->add_option("--busy-spin", ar.busy_spin_us, "GroupOptions::busy_spin in us (-1: default)")
      ->capture_default_str();
  a->add_flag("!--no-busy-wait", ar.busy_wait,
              "GroupOptions::busy_wait off: the io threads (--threads) run the calls");
  std::string ar_busy_below = "0";
  a->add_option("--busy-wait-below", ar_busy_below,
                "GroupOptions::busy_wait_below: calls from this size do not poll (0: default)");

  try {
    app.parse(argc, argv);
    if (*s) {
      if (chunk != "0") serve.tcp_chunk_bytes = one_size(chunk);
      return run_serve(serve);
    }
    if (*f) {
      fetch.size = one_size(fetch_size);
      return run_fetch(fetch);
    }
    if (*ps) return run_pingpong_serve(pp);
    if (*mc) return run_memcpy(one_size(memcpy_size), memcpy_seconds);
    if (*rd) return run_reduce(one_size(reduce_size), reduce_seconds);
    if (*pc) {
      pp.size = one_size(pp_size);
      return run_pingpong(pp);
    }
    if (*r) {
      reg.view_bytes = one_size(view_bytes);
      reg.tensor_bytes = one_size(tensor_bytes);
      return run_registration(reg);
    }
    if (*sc) {
      scale.size = one_size(scale_size);
      return run_scale(scale);
    }
    if (*a) {
      ar.sizes = parse_size_list(ar_sizes);
      if (ar.sizes.empty()) throw CLI::ValidationError("--sizes", "expected e.g. 4K,1M,64M");
      if (ar_doubling != "0") ar.doubling_threshold = one_size(ar_doubling);
      if (ar_segment != "0") ar.segment_bytes = one_size(ar_segment);
      if (ar_ring != "0") ar.ring_threshold = one_size(ar_ring);
      if (ar_busy_below != "0") ar.busy_wait_below = one_size(ar_busy_below);
      return run_allreduce(ar);
    }
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ferry-bench: %s\n", e.what());
    return 1;
  }
  return 2;
}
