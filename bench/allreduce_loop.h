// The allreduce benchmark loop that ferry-bench's `allreduce` and the peer programs
// (bench/peers/gloo_allreduce.cc, bench/peers/mpi_allreduce.cc) share, so that every tool is
// measured the same way: float32 sum, in place, for each size. Timed as NCCL's tests time them:
// each sample is `calls` calls back to back (after a refill of the buffer and a barrier, outside
// the clock), its time per call the mean over the ranks of each rank's time over `calls`. The
// buffer is checked after every warm-up call and every sample. Rank 0 prints one JSON line per
// size: every sample and the median of seconds per allreduce, and algbw / busbw as NCCL's tests
// define them (algbw = bytes / time, busbw = algbw * 2(n-1)/n), in GB/s (10^9 B/s), and per
// call of the timed samples, the mean over ranks of the process's CPU time (every thread, user
// and system: cpu_us_per_call) and context switches (voluntary: it slept; involuntary: it was
// preempted). Nothing in here depends on ferry.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

namespace ferry::bench {

// Back-to-back calls sum the tensor again and again (in place): values grow by n per call.
inline constexpr int kMaxCallsPerSample = 32;

struct AllreduceLoopArgs {
  std::string tool;  // "ferry", "gloo", "mpi": the JSON lines' "tool"
  int rank = 0;
  int ranks = 1;
  std::vector<uint64_t> sizes;  // bytes; each a multiple of 4 (float32 elements)
  int reps = 5;                 // timed samples per size
  int calls = 10;               // back-to-back calls per sample, 1..kMaxCallsPerSample
  int warmup = 3;               // untimed single calls per size before them
};

// What a tool provides. Each returns "" on success, else a message (the loop then stops and
// returns an error). `allreduce` sums `data` in place across all ranks; `barrier` returns once
// every rank has entered it. Both are called by every rank in the same order.
struct AllreduceOps {
  std::function<std::string(std::span<float> data)> allreduce;
  std::function<std::string()> barrier;
};

// Runs the sweep; returns an exit code (0: every size measured and every result right). Rank 0
// writes the JSON lines to stdout; every rank writes failures to stderr.
int run_allreduce_loop(const AllreduceLoopArgs& args, const AllreduceOps& ops);

}  // namespace ferry::bench
