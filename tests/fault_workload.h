// The fault workload behind the fault-injection tests and `make soak`: real processes killed at
// random points of many transfers of random sizes, aborts and deadlines racing completion, an
// honest peer throughout, checksums on every byte, and leak counts (fds, sessions, pins, memory
// registrations, memory windows, queue pairs, /dev/shm entries) before and after.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace ferry::test {

struct WorkloadOptions {
  // Stop after this many transfers by the killed sides (fetcher children's verified fetches plus
  // fetches this process issues to owner children), or after `duration` when it is set.
  size_t transfers = 1000;
  std::chrono::seconds duration{0};
  // A run that completes no transfer for this long (scaled: tests/test_util.h time_scale) has
  // hung, and fails; otherwise it runs until its count is met, however slow the machine.
  std::chrono::seconds stall{60};
  bool kill_fetchers = true;   // fetching children of our server, SIGKILLed at random
  bool kill_owners = true;     // serving children we fetch from, SIGKILLed at random
  bool aborts = false;         // our own fetches with random aborts and 1-5 ms deadlines
  int fetcher_children = 1;    // fetching children alive at once
  size_t max_size = 4u << 20;  // object sizes: log-uniform in [0, max_size]
  size_t kill_every = 60;      // a kill after a random number of transfers in [0, kill_every)
  std::chrono::milliseconds max_kill_delay{2000};  // ... or after a random time up to this
  uint64_t seed = 1;
};

struct WorkloadReport {
  size_t child_transfers = 0;  // verified fetches the fetching children reported
  size_t fetcher_kills = 0;
  size_t owner_kills = 0;
  size_t owner_fetches = 0;  // fetches this process issued to owner children
  size_t owner_fetches_ok = 0;
  size_t abort_fetches = 0;  // fetches with random aborts or deadlines
  size_t aborted = 0;
  size_t timed_out = 0;
  size_t honest_fetches = 0;
  uint64_t bytes_checked = 0;
  double seconds = 0;
  std::vector<std::string> problems;  // hangs, corruption, leaks, unexpected errors

  size_t transfers() const { return child_transfers + owner_fetches; }
  std::string summary() const;
};

// Runs the workload (see WorkloadOptions); never waits without a deadline. The transport is the
// test transport (tests/test_util.h): TCP on the host, RDMA in the soft-RoCE guest.
WorkloadReport run_fault_workload(const WorkloadOptions& options);

}  // namespace ferry::test
