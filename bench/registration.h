// `ferry-bench registration`: what it costs to make many tensors fetchable and to fetch them.
// Two contexts in one process (owner and fetcher, over the transport $FERRY_TRANSPORT picks):
//   views:   N views of one allocation, put with PutOptions::region (one registration for all);
//   tensors: M separate allocations, one registration each.
// For each: put time, the first fetch (which registers the owner's memory lazily), and two full
// passes over every object (the first pays every remaining registration, the second none on the
// owner side), plus the registration counters of both sides.
#pragma once

#include <cstdint>
#include <string>

namespace ferry::bench {

struct RegistrationArgs {
  std::string host = "127.0.0.1";  // where the owner listens
  uint64_t views = 10000;
  uint64_t view_bytes = 200 * 1024;
  uint64_t tensors = 1000;
  uint64_t tensor_bytes = 2 * 1024 * 1024;
  int inflight = 16;
  std::string grants = "auto";  // the owner's rdma::RdmaOptions::grants (rdma::parse_rdma_grants)
  bool pool = true;             // also the views fetched into ferry's receive pool (case "pool")
};

// Prints one JSON line per case; returns an exit code.
int run_registration(const RegistrationArgs& args);

}  // namespace ferry::bench
