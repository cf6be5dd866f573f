// Fork safety (internal to the RDMA transport): whether a fork() of this process can corrupt
// its RDMA transfers, and libibverbs' protection against it when asked for.
//
// Registered memory is pinned: the device keeps the physical pages it was given. After fork()
// parent and child share those pages copy-on-write. On a kernel that does not copy pinned pages
// for the child at fork, the first process to write such a page gets a new copy; when that is
// the parent, the device goes on using the old page, now the child's: a READ serves bytes the
// parent has since overwritten, a fetch lands where the parent never sees it, and nothing
// reports an error. A kernel that copies pinned pages at fork (libibverbs reports
// IBV_FORK_UNNEEDED) leaves the parent's pages where the device has them. Elsewhere libibverbs'
// protection (ibv_fork_init(), or RDMAV_FORK_SAFE / IBV_FORK_SAFE in the environment) marks
// every registered range MADV_DONTFORK: the child gets no mapping of it at all (it faults if it
// touches one), and each registration costs a madvise. It can only be turned on before this
// process registers any memory, and never off.
#pragma once

#include <functional>
#include <mutex>
#include <optional>

namespace ferry::rdma {

enum class ForkSafety {
  kernel_copies,        // the kernel copies pinned pages for the child at fork: nothing to do
  libibverbs_protects,  // libibverbs' protection is on (ibv_fork_init, RDMAV_FORK_SAFE)
  unprotected,          // a fork() of this process can corrupt its transfers
};

// What libibverbs says now (ibv_is_fork_initialized()), changing nothing. Any thread.
ForkSafety fork_safety_now();

// What libibverbs is asked, as functions (tests pass their own). `status` answers as
// ibv_is_fork_initialized() does, mapped onto ForkSafety; `enable` is ibv_fork_init() (0 or an
// errno: EINVAL once memory has been registered in this process).
struct ForkVerbs {
  std::function<ForkSafety()> status;
  std::function<int()> enable;
};

// What a process knows of its fork safety. The process has one (settle_fork_safety); tests make
// their own.
class ForkSafetyState {
 public:
  // Where the process stands, asking for libibverbs' protection when `protect` and the kernel
  // does not copy pinned pages. Logs once what a fork can do when the answer is unprotected (a
  // warning saying what to do instead, or why protection could not be turned on). Any thread,
  // serialized. The first answer other than unprotected holds from then on: later calls return
  // it without asking again (protection cannot be turned off, nor the kernel change).
  ForkSafety settle(bool protect, const ForkVerbs& verbs);

 private:
  std::mutex mu_;
  std::optional<ForkSafety> safe_;  // once the answer is not unprotected
  bool warned_ = false;
};

// The process's own ForkSafetyState, settled with libibverbs' functions. The RDMA transport
// calls it before it opens a device, so that protection asked for comes before any of its
// registrations.
ForkSafety settle_fork_safety(bool protect);

}  // namespace ferry::rdma
