// `ferry collective`: N local processes form a group and run every collective, verified.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "ferry/net/context.h"

namespace ferry::cli {

struct CollectiveArgs {
  int ranks = 4;
  std::vector<std::string> sizes{"1K", "1M", "16M"};  // allreduce/reduce-scatter tensor sizes
  int iterations = 3;                                 // timed allreduces per size
  std::string host = "127.0.0.1";                     // every rank listens here
  std::string transport = "auto";
  int timeout_s = 120;  // the whole run; ranks still running then are killed
  bool json = false;    // one JSON document on stdout instead of the table
};

// Forks `ranks` processes; each joins the group and runs allreduce (float32 sum and int64 sum,
// both checked against a locally computed reference), broadcast from every root, allgather and
// reduce-scatter at each size, and times `iterations` allreduces. The parent prints one line
// per collective and size (time, algorithm and bus bandwidth for allreduce), or with `json` one
// JSON document (rank 0's rows, every rank's failures, the error if any), and returns an
// ExitCode: ok only if every rank verified everything; kExitTimeout if one did not finish.
// Each rank's context starts from `options` (main's ContextOptions::from_environment()).
// Blocking; call from main only (it forks).
int run_collective(const CollectiveArgs& args, const ContextOptions& options);

}  // namespace ferry::cli
