// `ferry-bench allreduce`: one rank of a ferry::collective::Group over TCP on one machine,
// timing Group::allreduce (float32 sum, in place) for each size with the loop the peer programs
// share (bench/allreduce_loop.h), beside Gloo's ring allreduce and Open MPI's MPI_Allreduce.
//
// run.py starts `ranks` of these processes. Each listens on `host`:0 (any port), publishes its
// address as the file `rendezvous`/ferry-RANK (written whole, then renamed into place), waits
// for every other rank's file (bounded by join_timeout_s), joins the group and runs the sweep.
// Rank 0 prints one JSON line per size. The barrier before each timed sample is an allgather of
// one byte per rank.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ferry::bench {

struct AllreduceArgs {
  int rank = 0;
  int ranks = 4;
  std::string rendezvous;  // a directory every rank can write
  std::string host = "127.0.0.1";
  std::vector<uint64_t> sizes;
  int reps = 5;    // timed samples per size (AllreduceLoopArgs)
  int calls = 10;  // back-to-back calls per sample
  int warmup = 3;
  // io_context threads of the rank's Context: 2, as docs/collectives.md advises for calls of
  // MiBs (GroupOptions::busy_wait_below: the io threads move their bytes).
  int threads = 2;
  double join_timeout_s = 30;       // rendezvous + Group::join
  double call_timeout_s = 60;       // GroupOptions::timeout: each collective call
  uint64_t doubling_threshold = 0;  // 0: GroupOptions' default
  uint64_t segment_bytes = 0;       // 0: GroupOptions' default
  uint64_t ring_threshold = 0;      // 0: GroupOptions' default
  int64_t busy_spin_us = -1;        // GroupOptions::busy_spin (-1: its default)
  bool busy_wait = true;            // GroupOptions::busy_wait
  uint64_t busy_wait_below = 0;     // GroupOptions::busy_wait_below (0: its default)
};

// Returns an exit code; rank 0's result lines go to stdout.
int run_allreduce(const AllreduceArgs& args);

}  // namespace ferry::bench
