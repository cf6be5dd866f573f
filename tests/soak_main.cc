// ferry_soak: the fault workload (tests/fault_workload.h) for a long while. `make soak` runs it
// for ten minutes: fetching children and owner children SIGKILLed at random, fetches racing
// aborts and deadlines, an honest peer throughout, checksums on every byte. It prints what it
// did every ten seconds and at the end, and exits 1 on any hang, corruption or leak.
//   ferry_soak [SECONDS] [SEED]
#include <cstdio>
#include <cstdlib>
#include <random>

#include "tests/fault_workload.h"

int main(int argc, char** argv) {
  ferry::test::WorkloadOptions o;
  o.duration = std::chrono::seconds(argc > 1 ? std::atoi(argv[1]) : 600);
  o.seed = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : std::random_device{}();
  o.aborts = true;
  o.fetcher_children = 3;
  o.max_size = 16u << 20;
  std::printf("soak: %lld s, seed %llu (rerun: ferry_soak %lld %llu)\n",
              static_cast<long long>(o.duration.count()), static_cast<unsigned long long>(o.seed),
              static_cast<long long>(o.duration.count()), static_cast<unsigned long long>(o.seed));
  const auto r = ferry::test::run_fault_workload(o);
  std::printf("soak: done in %.0f s: %s\n", r.seconds, r.summary().c_str());
  for (const auto& p : r.problems) std::printf("soak: PROBLEM: %s\n", p.c_str());
  std::printf("soak: %s\n", r.problems.empty() ? "PASSED" : "FAILED");
  return r.problems.empty() ? 0 : 1;
}
