/// @file
/// Group: N processes (ranks) running collectives over ferry's stores and transports.
///
/// Every rank has a Context listening at its address; Group::join connects it to every other
/// rank. A collective moves data the way every fetch does: a rank offers the bytes others need
/// as *named* objects in its own store (views of the caller's memory: no serialisation, no
/// staging copy), and the others fetch them by name (ObjectRef::named), straight into their
/// destination buffers, over RDMA (one-sided READs) or the TCP fallback. A fetch of a name not
/// yet offered waits on the owner (a rendezvous), so no extra round trip announces readiness.
///
/// Algorithms (docs/collectives.md): allreduce below `doubling_threshold` bytes, recursive
/// doubling (log2(N) steps, each a whole-tensor exchange with one partner; the ranks beyond a
/// power of two fold into a partner first); up to
/// `ring_threshold`, for a power-of-two size recursive halving then doubling (Rabenseifner's:
/// 2 log2(N) steps, each with one partner), else an exchange (reduce-scatter then allgather,
/// each one round of direct fetches); above it, a ring (the same two phases around the ring,
/// 2(N-1)/N of the tensor per rank either way), pipelined in segments of `segment_bytes` reduced
/// and passed on as they land. Allgather: recursive doubling for a power-of-two size, else every
/// rank fetches every other's input; broadcast: every rank fetches the root's buffer;
/// reduce-scatter: the ring from `ring_threshold`, else one round of direct fetches. Every rank
/// gets bit-identical results. Each offer is for one rank, which fetches it once; a call ends when
/// this rank's fetches are done and every offer has been sent (PutOptions::on_sent; no barrier, no
/// acknowledgement), and returns once its offers are collected: the caller may reuse its buffers at
/// once.
///
/// Threading: a Group is used by one thread at a time; every rank calls the same collectives in
/// the same order (like MPI). Calls block until done, never longer than `timeout`.
///
/// Failure: a rank that dies (or a fetch that fails) fails the call with a Status naming that
/// rank; the Group then closes its connections, so every other rank's pending fetches fail at
/// once too instead of waiting for their deadline. A failed Group stays failed. To form it again,
/// destroy it on every rank before any joins again, or join under a new name (the old Group's
/// markers, named by the group's name, are offered while it lives).
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "ferry/collective/reduce.h"
#include "ferry/net/context.h"
#include "ferry/net/fetch.h"
#include "ferry/net/peer.h"

/// Collectives over ferry's stores and transports: Group (imperative calls), Service and Driver
/// (declarative, over refs), and the element-wise reductions.
namespace ferry::collective {

/// How a Group joins and runs its collectives (Group::join). Every rank must pass the same name,
/// thresholds and segment_bytes: they choose the algorithm.
struct GroupOptions {
  std::string name = "group";                     ///< tells groups of the same processes apart
  std::chrono::milliseconds join_timeout{30000};  ///< join(): every rank connected and joined
  std::chrono::milliseconds timeout{60000};       ///< each collective call
  /// Bytes: allreduce by recursive doubling below. It is the latency algorithm: log2(N) steps
  /// where halving takes 2 log2(N), but each moves the whole tensor (where the threshold was
  /// measured: bench/README.md, "Many cores").
  size_t doubling_threshold = 128u << 10;
  /// Bytes: below, exchange (RS + AG), or recursive halving for a power-of-two size; the ring from
  /// here. All three move the same bytes; halving and the exchange in fewer steps, the ring
  /// pipelined between neighbours, which pays only for the largest tensors (docs/collectives.md,
  /// "Algorithms").
  size_t ring_threshold = 128u << 20;
  size_t segment_bytes = 512u << 10;  ///< ring pipeline unit (each a fetch of its own)
  /// During a call of fewer than busy_wait_below bytes, poll instead of sleeping: the calling
  /// thread runs the context itself (Context::BusyPoll; its io threads park) and yields the core
  /// when nothing was ready, like Open MPI's progress engine, so each step costs no wake-up and no
  /// thread hand-off. Costs up to a core per rank while a call runs; between calls (after
  /// busy_linger) the io threads sleep.
  bool busy_wait = true;
  /// Bytes (the call's tensor): from here a call does not poll. The Context's io threads move
  /// the bytes (each connection's reads and writes on its own strand, the first halving step
  /// reduced as it lands) while the calling thread reduces the rest and sleeps in between: with
  /// cores to spare the socket copies and reductions overlap, where one polling thread did them
  /// in turn. It pays with 2 io threads (ContextOptions::threads) and from about 1 MiB; below,
  /// the wake-ups cost more than the overlap gains, and without cores to spare the overlap has
  /// nothing to run on, so polling wins. Unset (the default): 256 KiB per rank of the group and
  /// at least 1 MiB (1 MiB for 4 ranks, 2 MiB for 8) where this process may run on (its affinity
  /// mask) at least 2 cores per rank of the group on its host (ranks whose address has this
  /// rank's host), else SIZE_MAX (always poll). Measurements: docs/collectives.md, "Large calls".
  std::optional<size_t> busy_wait_below;
  /// With busy_wait, how long a waiting rank polls with nothing arriving before it sleeps in the
  /// reactor until the next event (and then polls again). Spinning for good keeps every core
  /// busy, so the scheduler never finds one idle and more ranks than cores can stay crowded on
  /// one core for a whole run (docs/collectives.md, "Waiting"); 200 us covers a step's usual gaps.
  std::chrono::microseconds busy_spin{200};
  /// With busy_wait, how long the io threads stay parked after a polling call (BusyPoll's
  /// linger; a call that does not poll ends it at once, as it needs them): a call
  /// that follows within it starts and ends without waking them (two wake-ups and a thread
  /// hand-off of the reactor saved per call: docs/collectives.md, "Waiting").
  /// Meanwhile nothing runs the context, so other work on it (another thread's fetch) waits up
  /// to this long. 0: they resume when the call returns.
  std::chrono::microseconds busy_linger{2000};
};

/// The outcome of a collective: ok, or the error, the rank it came from (-1: local) and a
/// message naming it.
struct Status {
  std::error_code ec;   ///< the error; empty on success
  int rank = -1;        ///< the rank it came from; -1: this one (or none)
  std::string message;  ///< what failed, naming the rank; empty on success
  /// True on success.
  bool ok() const { return !ec; }
  /// ok().
  explicit operator bool() const { return ok(); }
};

class Call;  // one collective call (internal: call.h)

/// N ranks joined for collectives (see this file's comment): join() makes one, connected to every
/// other rank through the Context, which must outlive it. Not copyable; one thread at a time.
class Group {
 public:
  /// Joins group `options.name` as rank `rank` of addresses.size(); `ctx` must be listening at
  /// addresses[rank]. Connects to every other rank (retrying while they start) and returns once
  /// all of them have joined, or after join_timeout with errc::timed_out and a message naming
  /// the ranks that did not. Blocking; not from an io_context thread. `why`, when given, gets the
  /// failure's Status (the rank and a message).
  static Result<std::unique_ptr<Group>> join(Context& ctx, std::vector<std::string> addresses,
                                             int rank, GroupOptions options = {}, Status* why = {});
  /// Stops watching the other ranks (waiting, up to the lease timeout, for those fetches to end)
  /// and releases this rank's markers. Blocking; not from an io_context thread.
  ~Group();
  Group(const Group&) = delete;
  Group& operator=(const Group&) = delete;

  /// This process's rank, as joined. Any thread.
  int rank() const { return rank_; }
  /// Fetches started again because their data channel broke while the peer's connection lived
  /// (a queue pair flushed, stalled or reset), by ferry itself (FetchResult::restarts, at most
  /// kMaxFetchRestarts in a row without progress per fetch, within its deadline); and watches of
  /// other ranks started again after theirs broke. Any thread.
  uint64_t refetches() const { return refetches_.load(std::memory_order_relaxed); }
  /// The number of ranks. Any thread.
  int size() const { return static_cast<int>(addresses_.size()); }

  /// In place: every rank's `data` becomes op over all ranks' `data` (same size and dtype on
  /// every rank).
  Status allreduce(std::span<std::byte> data, DType dtype, ReduceOp op);
  /// `data` of `root` is copied into every other rank's `data` (same size everywhere).
  Status broadcast(std::span<std::byte> data, int root);
  /// out = concatenation of every rank's `in`, in rank order; out.size() == size() * in.size().
  Status allgather(std::span<const std::byte> in, std::span<std::byte> out);
  /// `in` (same size and dtype on every rank) is reduced with op, and this rank gets its chunk:
  /// elements [rank*count/N, (rank+1)*count/N) (chunk_range), so any count works.
  Status reduce_scatter(std::span<const std::byte> in, std::span<std::byte> out, DType dtype,
                        ReduceOp op);

  /// The balanced split the collectives use: elements [first, last) of `count` for `rank`.
  static std::pair<size_t, size_t> chunk_range(size_t count, int rank, int size);

  /// Fails the Group for every rank as a failed call does (the other ranks' calls fail at once,
  /// naming this one; later calls here return the failure): for a rank that cannot make a call
  /// the others make, such as a declarative command whose input is missing here, so that their
  /// call does not pair with this rank's next one (calls are matched by their number). `what`
  /// names the call, `why` says what kept this rank out. Returns the Group's failure (the earlier
  /// one if it had failed already). Blocking, bounded by the call timeout; not from an io_context
  /// thread.
  Status abandon(const std::string& what, std::error_code ec, const std::string& why);

 private:
  friend class Call;  // one call's machinery (call.h) runs on the Group's connections and state
  using Clock = std::chrono::steady_clock;

  Group(Context& ctx, std::vector<std::string> addresses, int rank, GroupOptions options);
  // Connects to every other rank, retrying while they start, until `deadline`.
  Status connect_all(Clock::time_point deadline);
  // Starts a fetch of what rank q offers under the name `object` into `into` (exactly its size),
  // combined into it with `combine` if set (FetchOptions::combine).
  FetchRequest fetch_named(int q, const std::string& object, std::span<std::byte> into,
                           std::chrono::milliseconds timeout, CombineFn combine = {});
  // The name of rank q's fail marker, offered once that rank's Group has failed (for good).
  std::string fail_marker(int q) const;
  // Starts a fetch of rank q's fail marker, parked on that rank until it fails.
  FetchRequest start_watch(int q);
  // Starts the watches (watches_) unless they are already: every call does, as it starts.
  void start_watches();
  // A watched rank that has failed (its fail marker arrived), if any. Starts again a watch that
  // ran out of time, and one whose data channel broke (up to 8 times); drops one whose rank is
  // gone.
  std::optional<int> failed_watch();
  // Aborts the watches and waits, through `call` (which may be polling the context), until each
  // has ended or `until`.
  void end_watches(Call& call, Clock::time_point until);

  Context& ctx_;
  std::vector<std::string> addresses_;
  int rank_;
  GroupOptions options_;
  size_t busy_wait_below_ = 0;      // options_.busy_wait_below, or what unset means on this machine
  std::vector<Peer> peers_;         // by rank; invalid for this rank
  uint64_t seq_ = 0;                // collectives started
  std::vector<ObjectRef> markers_;  // join, fail and leave markers, kept while it lives
  // The algorithms' receive space (Call::scratch), from the Context's receive pool, kept across
  // calls and grown to the largest need: a fresh buffer per call would pay its page faults and
  // zeroing on every large call. No call uses it after it returns: its offers are collected by
  // then.
  std::shared_ptr<std::byte[]> scratch_;
  size_t scratch_bytes_ = 0;
  std::atomic<uint64_t> refetches_{0};
  std::optional<Status> failed_;  // why the Group failed, for good: every later call returns it
  // A fetch of every other rank's fail marker, parked on it while the Group lives (started by
  // the first call, join's; renewed at its timeout): a rank that fails offers its marker, which
  // completes them at once, so a failure travels the group in one hop instead of rank by rank
  // at the deadline, and reaches a rank that fetches from only some others (the ring, recursive
  // halving, a broadcast's root). Calls check them while they wait.
  struct Watch {
    int rank;
    FetchRequest req;
    int restarts = 0;  // after its data channel broke
  };
  std::vector<Watch> watches_;
  bool watching_ = false;  // watches_ were started
  std::byte watch_sink_{};
  // The byte every marker offers: writable memory (RDMA cannot register read-only pages), owned
  // with the store (each marker's owner): a peer may still be fetching a marker when the Group
  // is destroyed (its watch of a failed Group's fail marker), and the store serves it from here.
  std::shared_ptr<std::byte> marker_ = std::make_shared<std::byte>(std::byte{1});
};

}  // namespace ferry::collective
