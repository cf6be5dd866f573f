// The RDMA transport's fork-safety decision (ferry/rdma/fork_safety.h) over libibverbs answers
// the test gives: what a kernel that copies pinned pages, RDMAV_FORK_SAFE, and a kernel that
// does neither, with and without protection asked for, come to, and what is asked when.
#include "ferry/rdma/fork_safety.h"

#include <gtest/gtest.h>

#include <cerrno>

namespace ferry::rdma {
namespace {

// libibverbs as the test describes it; counts what it is asked.
struct Verbs {
  ForkSafety status = ForkSafety::unprotected;
  int enable_result = 0;
  int status_calls = 0;
  int enable_calls = 0;

  ForkVerbs functions() {
    return {[this] {
              ++status_calls;
              return status;
            },
            [this] {
              ++enable_calls;
              if (enable_result == 0) status = ForkSafety::libibverbs_protects;
              return enable_result;
            }};
  }
};

TEST(ForkSafety, AKernelThatCopiesPinnedPagesNeedsNoProtectionEvenWhenAskedFor) {
  ForkSafetyState state;
  Verbs verbs{.status = ForkSafety::kernel_copies};
  EXPECT_EQ(state.settle(true, verbs.functions()), ForkSafety::kernel_copies);
  EXPECT_EQ(verbs.enable_calls, 0);
  // Settled: not asked again.
  EXPECT_EQ(state.settle(false, verbs.functions()), ForkSafety::kernel_copies);
  EXPECT_EQ(verbs.status_calls, 1);
}

TEST(ForkSafety, ProtectionTheEnvironmentTurnedOnIsKept) {
  ForkSafetyState state;
  Verbs verbs{.status = ForkSafety::libibverbs_protects};  // RDMAV_FORK_SAFE
  EXPECT_EQ(state.settle(false, verbs.functions()), ForkSafety::libibverbs_protects);
  EXPECT_EQ(verbs.enable_calls, 0);
}

TEST(ForkSafety, WithoutProtectionAskedForAnUnsafeKernelIsReportedAndLeftAlone) {
  ForkSafetyState state;
  Verbs verbs;
  EXPECT_EQ(state.settle(false, verbs.functions()), ForkSafety::unprotected);
  EXPECT_EQ(verbs.enable_calls, 0);
  // Unsettled: a later transport that asks for protection still gets it.
  EXPECT_EQ(state.settle(true, verbs.functions()), ForkSafety::libibverbs_protects);
  EXPECT_EQ(verbs.enable_calls, 1);
  EXPECT_EQ(state.settle(false, verbs.functions()), ForkSafety::libibverbs_protects);
  EXPECT_EQ(verbs.enable_calls, 1);
}

TEST(ForkSafety, ProtectionAskedForTooLateLeavesTheProcessUnprotected) {
  ForkSafetyState state;
  Verbs verbs{.enable_result = EINVAL};  // memory was registered before the transport started
  EXPECT_EQ(state.settle(true, verbs.functions()), ForkSafety::unprotected);
  EXPECT_EQ(verbs.enable_calls, 1);
  EXPECT_EQ(state.settle(true, verbs.functions()), ForkSafety::unprotected);
  EXPECT_EQ(verbs.enable_calls, 2);
}

}  // namespace
}  // namespace ferry::rdma
