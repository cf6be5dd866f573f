/// @file
/// Declarative collectives: a driver runs collectives over objects already in the ranks' stores
/// and gets the results back as refs, without touching the tensor bytes itself.
///
/// Every rank runs a Service over its joined Group; the driver (any process with a Context)
/// makes a Driver for the ranks' addresses and calls allreduce(refs, ...) and the like, where
/// refs[r] is an object in rank r's store. Each call is one command: the driver offers it as a
/// named object in its own store, every Service fetches it (waiting on the driver until it
/// exists), runs the same engine the imperative calls use (Group), puts its result in its own
/// store under a name, and offers a "done" marker the driver waits for. The results are named
/// refs (ObjectRef::named), fetchable by anyone; they stay in the ranks' stores until
/// Driver::release.
///
/// Threading: a Service runs its commands on a thread of its own; a Driver is used by one thread
/// at a time. Commands run in submission order on every rank.
#pragma once

#include <atomic>
#include <condition_variable>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "ferry/collective/group.h"

namespace ferry::collective {

/// A rank's side of the declarative collectives (see this file's comment): runs the commands of one
/// driver on its own thread until destroyed. Not copyable.
class Service {
 public:
  /// Serves the commands of the driver listening at `driver_address` for this rank of `group`
  /// (both outlive the Service). `name` tells several drivers of the same ranks apart.
  Service(Context& ctx, Group& group, std::string driver_address, std::string name = "default");
  /// Stops after the command in progress (a collective call: bounded by the Group's timeout); an
  /// idle Service, waiting for its driver's next command, stops at once (its long poll is
  /// aborted). Results it holds are released.
  ~Service();
  Service(const Service&) = delete;
  Service& operator=(const Service&) = delete;

 private:
  void run();
  Context& ctx_;
  Group& group_;
  std::string driver_;
  std::string name_;
  std::atomic<bool> stop_{false};
  std::mutex stop_mu_;
  std::condition_variable stop_cv_;  // wakes a reconnect's pause when the destructor stops run()
  std::mutex poll_mu_;
  FetchRequest poll_;                      // the long poll for the next command, while in flight
  std::map<uint64_t, ObjectRef> results_;  // by command, until released
  std::thread thread_;
};

/// A collective submitted by a Driver: the results as refs (results[r] in rank r's store), and
/// the outcome, ready once every rank has finished (or failed; the Status names the rank).
struct Submitted {
  uint64_t id = 0;                  ///< the command's number on its Driver (from 1)
  std::vector<ObjectRef> results;   ///< named refs: results[r] is rank r's result
  std::shared_future<Status> done;  ///< ready when every rank has finished, bounded by the timeout
};

/// The driver's side of the declarative collectives (see this file's comment): submits commands to
/// the ranks' Services and hands back their results as refs. Its Context must outlive it. Not
/// copyable; one thread at a time.
class Driver {
 public:
  /// `ctx` must be listening (the Services fetch commands from it); rank_addresses[r] is rank
  /// r's listen address. Connects to every rank (bounded by `timeout`).
  static Result<std::unique_ptr<Driver>> create(
      Context& ctx, std::vector<std::string> ranks, std::string name = "default",
      std::chrono::milliseconds timeout = std::chrono::seconds(60));
  /// Releases the commands this side still offers. Results stay in the ranks' stores until
  /// released: release() them first.
  ~Driver();

  /// refs[r]: a one-tensor object in rank r's store, the same size (whole elements of dtype) on
  /// every rank. Results are new objects; the inputs are left as they are. Not one ref per rank,
  /// or a root that is not a rank: `done` is ready at once with errc::invalid_argument and
  /// nothing is sent.
  Submitted allreduce(const std::vector<ObjectRef>& refs, DType dtype, ReduceOp op);
  /// Every rank's result is a copy of rank `root`'s object (refs[root]); one ref per rank, but
  /// only the root's is read.
  Submitted broadcast(const std::vector<ObjectRef>& refs, int root);
  /// Every rank's result is the concatenation of every rank's object, in rank order (all the same
  /// size).
  Submitted allgather(const std::vector<ObjectRef>& refs);
  /// The objects (as in allreduce()) reduced with `op`; rank r's result is its chunk of the
  /// reduction, Group::chunk_range's elements for r.
  Submitted reduce_scatter(const std::vector<ObjectRef>& refs, DType dtype, ReduceOp op);
  /// Drops the results of `s` from the ranks' stores (asynchronously, in command order).
  void release(const Submitted& s);

 private:
  // Why these refs (and root) cannot be submitted, or ok.
  Status check(const std::vector<ObjectRef>& refs, int root) const;
  // Why these refs cannot be reduced as `dtype` (not a dtype the reductions cover, or an object
  // that is not whole elements of it), or ok: refused here, not by each rank's Group.
  Status check_reducible(const std::vector<ObjectRef>& refs, DType dtype) const;
  Driver(Context& ctx, std::vector<std::string> ranks, std::string name,
         std::chrono::milliseconds timeout);
  Submitted submit(int kind, const std::vector<ObjectRef>& refs, DType dtype, ReduceOp op, int root,
                   std::vector<size_t> result_sizes);
  Context& ctx_;
  std::vector<std::string> ranks_;
  std::string name_;
  std::chrono::milliseconds timeout_;
  std::vector<Peer> peers_;
  uint64_t next_ = 0;
  // Commands offered and not yet known to be fetched by every rank. The Services fetch commands
  // in order, so once every rank has reported command `id` done, every command up to `id` can
  // go (done from the thread that waits for the reports; `ctx` is null once the Driver is gone).
  struct Commands {
    std::mutex mu;
    Context* ctx;
    std::map<uint64_t, ObjectRef> offered;
    void release_through(uint64_t id);
  };
  std::shared_ptr<Commands> commands_;
};

}  // namespace ferry::collective
