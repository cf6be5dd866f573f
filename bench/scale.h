// `ferry-bench scale`: one server, many peers. Opens 1, 16, 256, 1,024 sessions (one process,
// one connection each) to a `ferry-bench serve`, and for each count measures throughput and
// latency with 1 and 4,096 fetches in flight (spread over the sessions) and both processes'
// resident memory.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>

namespace ferry::bench {

struct ScaleArgs {
  std::string from;
  uint64_t size = 64 * 1024;
  std::string peers = "1,16,256,1024";
  std::string inflight = "1,4096";
  double seconds = 2.0;
  pid_t server_pid = 0;
};

// Prints one JSON line per (peers, inflight); returns an exit code.
int run_scale(const ScaleArgs& args);

}  // namespace ferry::bench
