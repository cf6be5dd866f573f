// The registrar: memory registrations off the io threads (internal to the RDMA transport).
//
// Registering memory pins its pages, which takes seconds for large memory (1 GiB has taken over
// 10 s on soft-RoCE in the emulated guest beside a busy host). On a peer's io thread that would
// stall every peer of the thread (no heartbeat leaves, no completion is reaped, a peer timeout
// shorter than the registration reads the stall as a dead peer). So a fetch whose targets miss the
// registration cache, and a serve whose memory is not registered yet, hand the registration to a
// registrar thread and go on when its result is posted back to their strand. Cache hits stay on the
// strand: they cost a lookup.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "ferry/net/result.h"
#include "ferry/net/transport.h"
#include "ferry/rdma/mr_cache.h"

namespace ferry::rdma {

// Registrations of less memory than this run where they are needed (a peer's strand): a few
// pages pin in microseconds, less than the hop to a registrar thread and back would add to a
// small fetch or serve. Larger ones go to a registrar thread.
inline constexpr uint64_t kRegisterOnTheStrandBelow = 1u << 20;

// Registrations of this much memory or more are large: they pin for long (tens of milliseconds
// on a NIC, seconds on soft-RoCE), and fewer of them run at once than registrar threads exist.
inline constexpr uint64_t kLargeRegistration = 64u << 20;

// Queues `job`, the registration of `bytes` of memory, to run on a registrar thread (up to four,
// started as jobs need them and never joined, as the reaper's: at exit the kernel releases what
// is left). Jobs start in the order they were submitted, except that large ones
// (kLargeRegistration) take three threads at most: a smaller registration never waits behind
// large ones, however many are queued, only behind other small ones. Any thread; never blocks.
void submit_registration(uint64_t bytes, std::function<void()> job);

// The registrations one fetch's targets lack, made on the registrar thread. The fetch's channel
// holds it while they are made and cancels it when the fetch ends first.
//
// Why cancel matters: once the fetch has completed, its caller may free a target and map other
// memory at the same address. A registration made for the old memory must then never be found
// by another fetch (it would place bytes into the old pages). A region is published to the cache
// only under this object's lock and only while it is not cancelled, and cancel() takes back what
// was published, so after cancel() returns nothing of this registration is in the cache or held
// here (a region another live fetch found in the cache meanwhile is that fetch's, over memory it
// keeps alive). Thread-safe.
class TargetRegistration {
 public:
  // For `targets`, with the regions of those that hit the cache already (null entries: to be
  // made; empty targets stay null).
  TargetRegistration(std::vector<MutableBuffer> targets,
                     std::vector<std::shared_ptr<Region>> regions);

  // Registers in `cache` every non-empty target whose region is null, publishing each unless
  // cancelled; stops at the first failure. Once, on the registrar thread.
  void run(MrCache& cache);

  // Ends it: nothing more is published, and what was is dropped (deregistered unless another
  // fetch holds it). Idempotent. Any thread; never waits for a registration.
  void cancel();

  // After run(): the regions of every target (null for empty targets), or device_error when a
  // registration failed, or aborted when cancelled. Once; any thread.
  Result<std::vector<std::shared_ptr<Region>>> take();

 private:
  const std::vector<MutableBuffer> targets_;
  std::mutex mu_;
  bool cancelled_ = false;
  std::error_code error_;
  std::vector<std::shared_ptr<Region>> regions_;  // under mu_
};

}  // namespace ferry::rdma
