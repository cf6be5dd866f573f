// `ferry-bench pingpong-serve` / `ferry-bench pingpong`: the raw-socket baseline of a small
// fetch. The client sends an 8-byte request naming a size; the server answers with that many
// bytes from memory; blocking sockets, TCP_NODELAY and the congestion control ferry's data
// channels get (ferry/tcp/congestion.h). With one request in flight each answer is a round trip
// (the latency baseline); with `inflight` > 1 the client keeps that many asked for and reads each
// answer into the next of `inflight` buffers of `size` bytes, as a fetch window lands in as many
// targets (the bandwidth baseline, with the same working set). What a fetch over TCP costs
// beyond this is ferry's overhead.
#pragma once

#include <cstdint>
#include <string>

namespace ferry::bench {

struct PingPongArgs {
  std::string address = "127.0.0.1:0";  // serve: where to listen; client: where to connect
  uint64_t size = 8;
  uint64_t inflight = 1;  // answers asked for at a time (client)
  double seconds = 2.0;
  double warmup = 0.3;
};

// Prints "ready HOST:PORT", then answers connections one after another until killed.
int run_pingpong_serve(const PingPongArgs& args);
// Prints one JSON line: p50_us, p99_us (per answer; a round trip when inflight is 1), gbps.
int run_pingpong(const PingPongArgs& args);

}  // namespace ferry::bench
