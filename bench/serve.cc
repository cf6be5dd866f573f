#include "bench/serve.h"

#include <signal.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include "bench/client.h"
#include "bench/measure.h"
#include "ferry/ferry.h"

namespace ferry::bench {

int run_serve(const ServeArgs& args) {
  const auto sizes = parse_size_list(args.sizes);
  if (sizes.empty()) {
    std::fprintf(stderr, "ferry-bench serve: bad --sizes '%s'\n", args.sizes.c_str());
    return 2;
  }
  // The stop signals are blocked before the context starts its threads, so they inherit the
  // mask and this thread alone takes them with sigwait.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);
  raise_fd_limit();

  ContextOptions options = bench_options("ferry-bench-serve", args.threads, args.busy_poll);
  if (args.max_requests) options.max_requests_per_peer = args.max_requests;
  options.transport_options_for<rdma::RdmaOptions>(rdma::kRdmaTransportName).grants =
      rdma::parse_rdma_grants(args.grants).value_or(rdma::RdmaGrants::automatic);
  if (args.tcp_chunk_bytes) {
    options.transport_options_for<tcp::TcpOptions>(tcp::kTransportName).chunk_bytes =
        args.tcp_chunk_bytes;
  }
  auto ctx = Context::create(options);
  if (!ctx) return report_failure("serve", "", ctx.error());
  auto port = (*ctx)->listen(args.listen);
  if (!port) return report_failure("serve", "listen " + args.listen, port.error());
  for (uint64_t size : sizes) {
    auto bytes = std::shared_ptr<std::byte[]>(new std::byte[size]);
    std::memset(bytes.get(), static_cast<int>(size & 0xff) | 1, size);  // touched, not zero
    Tensor t = Tensor::bytes({bytes.get(), size});
    auto ref = (*ctx)->put({t}, bytes);
    if (!ref) {
      std::fprintf(stderr, "ferry-bench serve: put %llu bytes: %s\n",
                   static_cast<unsigned long long>(size), ref.error().message().c_str());
      return 1;
    }
  }
  std::printf("ready %s\n", (*ctx)->address().c_str());
  std::fflush(stdout);
  int sig = 0;
  sigwait(&stop, &sig);
  (*ctx)->close();
  return 0;
}

}  // namespace ferry::bench
