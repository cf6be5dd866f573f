// `ferry-bench serve`: the owner side. Puts one object per size and serves them until SIGINT or
// SIGTERM; fetchers find them with Peer::list().
#pragma once

#include <string>

namespace ferry::bench {

struct ServeArgs {
  std::string listen = "127.0.0.1:0";
  std::string sizes = "1M";  // one object of each size
  int threads = 1;
  bool busy_poll = false;       // rdma::RdmaOptions::busy_poll
  size_t max_requests = 0;      // ContextOptions::max_requests_per_peer; 0 = the default
  size_t tcp_chunk_bytes = 0;   // tcp::TcpOptions::chunk_bytes; 0 = the default
  std::string grants = "auto";  // rdma::RdmaOptions::grants (rdma::parse_rdma_grants)
};

// Prints "ready HOST:PORT" on stdout once listening, then serves. Returns an exit code.
int run_serve(const ServeArgs& args);

}  // namespace ferry::bench
