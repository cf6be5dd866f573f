// `ferry serve`: put objects into a Context, listen, and serve them until told to stop.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ferry/net/context.h"

namespace ferry::cli {

struct ServeArgs {
  std::string listen = "127.0.0.1:7070";
  uint64_t objects = 0;
  std::string tensors = "1-3";   // MIN-MAX tensors per random object
  std::string sizes = "4K-64M";  // MIN-MAX bytes per tensor (log-uniform)
  std::string total;             // minimum total bytes of the random objects ("" = none)
  uint64_t seed = 1;
  std::vector<std::string> files;  // each file becomes one object of one tensor
  std::string manifest;            // where to write the manifest ("" = nowhere)
  bool json = false;
  double duration = 0;  // seconds; 0 = until SIGINT/SIGTERM
  int threads = 1;
  std::string metrics;  // IP:PORT to serve Prometheus metrics at (GET /metrics); "" = none
};

// Runs the server: listens, puts the objects, prints them and "ready <address>", then serves
// until SIGINT/SIGTERM or `duration`. Expects the range and size strings to be valid (the
// command line checks them). `options`: what its context starts from (main's
// ContextOptions::from_environment()). Returns the process exit code.
int run_serve(const ServeArgs& args, ContextOptions options);

}  // namespace ferry::cli
