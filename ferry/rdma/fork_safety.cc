#include "ferry/rdma/fork_safety.h"

#include <infiniband/verbs.h>

#include <cstring>

#include "ferry/net/log.h"

namespace ferry::rdma {

ForkSafety fork_safety_now() {
  switch (ibv_is_fork_initialized()) {
    case IBV_FORK_UNNEEDED:
      return ForkSafety::kernel_copies;
    case IBV_FORK_ENABLED:
      return ForkSafety::libibverbs_protects;
    case IBV_FORK_DISABLED:
      break;
  }
  return ForkSafety::unprotected;
}

ForkSafety ForkSafetyState::settle(bool protect, const ForkVerbs& verbs) {
  std::lock_guard lock(mu_);
  if (safe_) return *safe_;
  ForkSafety now = verbs.status();
  if (now == ForkSafety::unprotected && protect) {
    if (const int rc = verbs.enable(); rc == 0) {
      now = ForkSafety::libibverbs_protects;
      FERRY_LOG_INFO(
          "rdma: libibverbs' fork protection is on (FERRY_RDMA_FORK_PROTECTION): a child of "
          "this process has no mapping of memory registered for RDMA");
    } else if (!warned_) {
      warned_ = true;
      FERRY_LOG_WARN(
          "rdma: cannot turn libibverbs' fork protection on ({}): memory was registered in this "
          "process before ferry's RDMA transport started. Set RDMAV_FORK_SAFE=1 in its "
          "environment instead; until then a fork() of this process can corrupt its RDMA "
          "transfers without an error",
          std::strerror(rc));
    }
  } else if (now == ForkSafety::unprotected && !warned_) {
    warned_ = true;
    FERRY_LOG_WARN(
        "rdma: this kernel does not copy pinned pages at fork(): once this process forks "
        "(multiprocessing's 'fork' start method, for one), RDMA transfers can read or land in "
        "pages it no longer sees, without an error. Start children with 'spawn' or exec, or set "
        "FERRY_RDMA_FORK_PROTECTION=1 (libibverbs' protection: children then have no mapping of "
        "registered memory)");
  }
  if (now != ForkSafety::unprotected) safe_ = now;
  return now;
}

ForkSafety settle_fork_safety(bool protect) {
  static ForkSafetyState process;
  return process.settle(protect, {&fork_safety_now, [] { return ibv_fork_init(); }});
}

}  // namespace ferry::rdma
