// `ferry-bench fetch`: the fetcher side of the size sweep. Connects to a `ferry-bench serve`,
// keeps a window of fetches of one object in flight for a fixed time, and prints one JSON line:
// bandwidth, fetches per second, latency percentiles, CPU time per GB (both processes).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>

namespace ferry::bench {

struct FetchArgs {
  std::string from;  // HOST:PORT of the server
  uint64_t size = 1 << 20;
  int inflight = 1;      // fetches kept in flight (1 = latency: each issued when the last ended;
                         // 0 = idle: connected, no fetches, CPU of both sides measured)
  double seconds = 2.0;  // measured window
  double warmup = 0.3;   // not measured
  pid_t server_pid = 0;  // for the server's CPU time (same machine); 0 = not measured
  bool ferry_allocates = false;  // no targets: ferry allocates each result (first-touch cost)
  bool wait = false;  // one at a time, each issued and waited for (FetchRequest::wait) on the
                      // main thread, as the plainest code does, instead of a callback window
  int threads = 1;
  bool busy_poll = false;  // rdma::RdmaOptions::busy_poll
};

// Returns an exit code; the result line goes to stdout.
int run_fetch(const FetchArgs& args);

}  // namespace ferry::bench
