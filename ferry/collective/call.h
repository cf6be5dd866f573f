// Call: one collective call of a Group (internal). It holds what this rank offers the others for
// the call and the fetches it makes of their offers, under one deadline; it waits for them
// (polling the context itself when the call is small: GroupOptions::busy_wait), ends the call
// once no rank needs anything more from this one, and fails it for the whole group. The
// algorithms (algorithms/) are written against it and see nothing else of the Group.
//
// Names: rank r's offer `tag` for rank q is "ferry.collective/<group>/<call>/<tag>/<r>>q", so
// a tag need only be unique within its call, per pair of ranks. A fetch of an offer not made
// yet waits on its owner (the rendezvous), so an algorithm posts its fetches up front.
//
// Thread model: the thread that called the Group's collective, for the call's lifetime; the
// offers' hooks run on io threads and reach only the shared Offers, under its mutex.
#pragma once

#include <chrono>
#include <memory>
#include <span>
#include <string>
#include <system_error>
#include <vector>

#include "ferry/collective/group.h"

namespace ferry::collective {

// Rank q's chunk (Group::chunk_range) of `count` elements of `esize` bytes.
template <typename Byte>
std::span<Byte> chunk_of(std::span<Byte> data, size_t count, size_t esize, int q, int n) {
  auto [first, last] = Group::chunk_range(count, q, n);
  return data.subspan(first * esize, (last - first) * esize);
}

// Copies `from` into the start of `to`; nothing when it is empty (an empty span's data() may be
// null, and memcpy of a null pointer is undefined even for 0 bytes).
void copy_into(std::span<std::byte> to, std::span<const std::byte> from);

// The time left until `deadline`, in whole milliseconds, at least 0.
std::chrono::milliseconds left_until(std::chrono::steady_clock::time_point deadline);

class Call {
 public:
  using Clock = std::chrono::steady_clock;

  // Starts call `what` (a name for messages: "allreduce") on `group`, which outlives it, with
  // the deadline GroupOptions::timeout from now; `bytes`, the call's tensor, decides whether it
  // polls (GroupOptions::busy_wait_below). Starts the Group's watches if they are not yet.
  Call(Group& group, std::string what, size_t bytes);
  // The same with an explicit deadline (join: the join deadline).
  Call(Group& group, std::string what, size_t bytes, Clock::time_point deadline);
  // Withdraws the offers and returns once the store has collected them (leases end by the
  // context's lease_timeout at the latest), so the caller may reuse the memory they view.
  ~Call();
  Call(const Call&) = delete;
  Call& operator=(const Call&) = delete;

  // The Group's rank, size and options.
  int rank() const;
  int size() const;
  const GroupOptions& options() const;
  // Every rank but this one: who fetches what a rank offers to all.
  std::vector<int> others() const;
  // Whether the connection to rank q combines a fetch's bytes as they arrive
  // (Peer::combines_as_it_arrives).
  bool combines_as_it_arrives(int q) const;
  // At least `bytes` of receive space (contents unspecified), or the allocation's error. The
  // Group keeps it across calls and grows it to the largest need; it comes from the Context's
  // receive pool, registered with every RDMA device already, so fetches into it register
  // nothing. Each call gets the same memory: ask once per call.
  Result<std::span<std::byte>> scratch(size_t bytes);

  // Offers `bytes` as `tag` to each of `ranks` (one object each, fetched once): a view, which
  // must stay unchanged until they have fetched it; `memory` (optional) owns the bytes and is
  // freed once the store has collected every one. A failed put fails the call.
  Status offer(const std::string& tag, std::span<const std::byte> bytes,
               const std::vector<int>& ranks, std::shared_ptr<void> memory = {});
  // Starts fetching what rank `from` offers this rank as `tag` into `into` (exactly its size);
  // with `combine`, combined into `into` (FetchOptions::combine). The fetch gets the next index
  // (taken() before the call) for wait().
  void take(int from, const std::string& tag, std::span<std::byte> into, CombineFn combine = {});
  // How many fetches the call holds: the index the next take() gets.
  size_t taken() const;
  // Waits for fetch `i` (taken() when it was started), but fails at once when any other fetch
  // of the call has failed for good or a watched rank has failed: a rank that gave up offers
  // nothing more, and waiting on it in order would hide the failure behind the deadline. Fails
  // the call on any error, and with errc::timed_out a second after the deadline.
  Status wait(size_t i);
  // Forgets the fetches from index `first` on, every one of them waited for: finish() waits
  // only for the rest.
  void forget(size_t first);
  // Whether every offer made as `tag` has been sent (true when there is none): the memory it
  // views is read no more, and the caller may write into it before finish(). Never blocks.
  bool sent(const std::string& tag);
  // Ends the call once this rank's fetches are done: waits until every offer has been sent to
  // the rank that fetches it, so that no rank needs anything more from this one (~Call then
  // withdraws them). No barrier: a rank that is done goes on while the others still fetch from
  // each other. A rank that closes while it still has to fetch an offer, or a watched rank's
  // failure, fails the call at once; a rank that never fetches, at the deadline.
  Status finish();
  // Fails the call and the Group for good, and returns the Status (naming `rank`, -1 for this
  // one, and what this rank was `doing`). Fails fast everywhere: offers this rank's fail marker
  // (which completes the other ranks' watches), ends this rank's watches, closes its
  // connections (which fails the others' fetches over them at once), and aborts the call's
  // fetches, waiting until each has ended, since a transport may still write into their targets.
  Status fail(int rank, std::error_code ec, const std::string& doing);

  // Offers marker `tag` to anyone (kept while the Group lives) and fetches every other rank's,
  // within the deadline. Returns the ranks whose marker did not arrive.
  std::vector<int> meet(const std::string& tag);
  // Waits until `req` has completed or `until`, running the context meanwhile if the call polls.
  void settle(const FetchRequest& req, Clock::time_point until);

 private:
  struct Offers;
  struct Pending {
    int from;
    FetchRequest req;
  };

  // The name of what `owner` offers as `tag`: to rank `to` alone, or to anyone (markers: -1).
  std::string name(const std::string& tag, int owner, int to = -1) const;
  // Starts a fetch of `object`, offered by rank `from`, into `into`.
  void take_named(int from, const std::string& object, std::span<std::byte> into,
                  CombineFn combine);
  // Offers a one-byte marker named `object` to anyone, kept while the Group lives.
  std::error_code mark_as(const std::string& object);
  // Fails the call if a watched rank has failed (Group::failed_watch).
  Status check_watches();
  // Adds the data-channel restarts of `req`, which succeeded, to Group::refetches.
  void count_restarts(const FetchRequest& req);
  // wait() for every fetch the call holds, in order; then forgets them.
  Status wait_all();
  // Waits until `ready` or for up to 5 ms, polling when the call polls, else through `sleep`.
  template <typename Ready, typename Sleep>
  void pause(Ready ready, Sleep sleep);
  // Whether `ready()`, a condition on the offers, holds (read under their lock).
  template <typename Ready>
  bool offers_are(Ready ready);
  // pause() until `ready()` holds of the offers (their hooks notify when they change).
  template <typename Ready>
  void pause_on_offers(Ready ready);

  Group& group_;
  std::string what_;
  uint64_t seq_;
  Clock::time_point deadline_;
  std::vector<ObjectRef> offered_;
  std::vector<Pending> pending_;
  std::shared_ptr<Offers> offers_;
  Context::BusyPoll busy_;  // while the call runs, when it polls (GroupOptions::busy_wait)
};

}  // namespace ferry::collective
