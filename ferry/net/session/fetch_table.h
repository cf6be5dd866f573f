// FetchTable: the fetches this side runs against one peer (internal). It picks each fetch's
// transport, makes sure its channel exists (falling back to another transport when it cannot
// be built), lands combined fetches in slots of its own, launches the fetch at the transport and
// asks the peer for it, starts it again when its channel broke, ends it at its deadline, and
// completes it exactly once.
//
// Thread model: every method runs on the peer strand. It depends only on SessionLink.
#pragma once

#include <cstdint>
#include <memory>
#include <system_error>
#include <unordered_map>
#include <vector>

#include "ferry/mem/pool.h"
#include "ferry/net/fetch.h"
#include "ferry/net/session/session_link.h"

namespace ferry {

class FetchTable {
 public:
  using Clock = SessionLink::Clock;

  // `link` and `pool` (where fetches without targets, and combined ones, land) outlive the table.
  FetchTable(SessionLink& link, mem::Pool& pool);
  FetchTable(const FetchTable&) = delete;
  FetchTable& operator=(const FetchTable&) = delete;

  // One block of `pool` with a 64-byte aligned slot of each of `sizes`, in order: the memory
  // (which owns the slots) and the slots. Null, with nothing allocated, when the sizes add up to
  // more than the machine's memory (a forged or corrupt ref: sizes up to 2^48 parse) or no memory
  // can be had: the caller fails its fetch with errc::resource_exhausted. Any thread; may fault
  // a new region in (PoolOptions::populate_threads). Never throws.
  static std::shared_ptr<std::byte[]> allocate_slots(mem::Pool& pool,
                                                     const std::vector<size_t>& sizes,
                                                     std::vector<MutableBuffer>& slots) noexcept;
  // The same, a slot for each tensor of `ref`.
  static std::shared_ptr<std::byte[]> allocate_slots(mem::Pool& pool, const ObjectRef& ref,
                                                     std::vector<MutableBuffer>& slots) noexcept;

  // Starts the fetch `state` stands for (its id is the request id it starts under): `ref` into
  // `targets` (one per tensor, sizes as in the ref), which are slots of `storage` when that is
  // set (receive memory the caller took from the pool: allocate_slots); with neither, into memory
  // taken from the pool here. The result owns that memory. The session is open. Every path
  // completes `state` exactly once: with success, the transport's or the peer's error,
  // errc::transport_unavailable / transport_unknown (no transport), size_mismatch,
  // resource_exhausted (no memory), timed_out (options.timeout), aborted (abort()), or the
  // session's close reason. May throw std::bad_alloc before anything started (the caller then calls
  // fail()).
  void start(std::shared_ptr<detail::FetchState> state, ObjectRef ref,
             std::vector<MutableBuffer> targets, std::shared_ptr<std::byte[]> storage,
             FetchOptions options);
  // Completes a fetch that failed wherever it stands: through complete() once launched (the
  // transport lets go of its targets first), else at once with `ec`.
  void fail(detail::FetchState& state, std::error_code ec);
  // The caller aborts fetch `id` (FetchRequest::id): once launched, through complete() with
  // errc::aborted; otherwise (its channel is opening, or it is between two channels) `state`, if
  // it still lives, completes with errc::aborted at once and the pending step finds it done.
  void abort(uint64_t id, const std::weak_ptr<detail::FetchState>& state);

  // PeerLink::complete_fetch: completes launched fetch `request_id` with `ec` (the transport
  // lets go of the targets first; when it cannot yet, the completion waits for its second call).
  // An abort or a timeout tells the peer (Cancel) while the session is open. Unknown ids are
  // ignored.
  void complete(uint64_t request_id, std::error_code ec);
  // PeerLink::restart_fetch: launches fetch `request_id` again as a new request once a new
  // channel opened, resuming after the `landed` bytes its attempts left in the targets (from 0
  // for a ref by name), within kMaxFetchRestarts in a row without progress, its deadline and the
  // session's life; otherwise completes it with `ec`. Unknown ids are ignored.
  void restart(uint64_t request_id, std::error_code ec, uint64_t landed);

  // Whether `request_id` is a launched fetch of this table.
  bool contains(uint64_t request_id) const { return fetches_.count(request_id) != 0; }
  // Launched fetches.
  size_t size() const { return fetches_.size(); }
  // Whether a launched fetch waits for bytes the peer sends over an installed channel (a
  // two-sided transport).
  bool awaits_peer_bytes() const;

  // Completes every fetch whose deadline is at or before `now` with errc::timed_out: launched
  // ones, and those waiting for their channel to open.
  void expire(Clock::time_point now);
  // The earliest deadline of a fetch; Clock::time_point::max() when none has one.
  Clock::time_point next_deadline() const;
  // The session ended: completes every launched fetch with `reason`, without telling the
  // transports (their channels are closed by then) or the peer.
  void close(std::error_code reason);

 private:
  struct PendingFetch {
    std::shared_ptr<detail::FetchState> state;
    std::shared_ptr<TransportManager> transport;
    Clock::time_point started;
    Clock::time_point deadline = Clock::time_point::max();  // none while releasing
    std::error_code releasing;  // set while the transport drains hardware work of an abort
    bool streams = false;       // FetchOptions::combine handed to a transport that combines()
    // FetchOptions::combine over a transport that does not combine: the bytes land in `slots`
    // (memory: `landed`), one per target, and are combined into `targets` on success.
    CombineFn combine;
    std::vector<MutableBuffer> targets, slots;
    std::shared_ptr<std::byte[]> landed;
    uint64_t resume_at = 0;  // FetchOp::resume_at of its next attempt
    uint32_t fruitless = 0;  // restarts in a row that landed nothing new
    // FetchOptions::verify, and the ref carries checksums: what landed is checked on success.
    bool verify = false;
    // With a combine the transport streams: the CRC-32C of the bytes that arrived for each target
    // so far (the targets hold the combination, not those bytes). Null otherwise.
    std::shared_ptr<std::vector<uint32_t>> streamed;
  };

  // Checks fetch `f`, which succeeded, against its ref's checksums: the landed bytes (the slots
  // of a combine, before combining), or what a streamed combine summed. data_corrupted, logged
  // with the first tensor that differs, or success.
  std::error_code verify(const PendingFetch& f) const;

  // Once `transport`'s channel exists: builds the pending fetch (deadline, combine slots) and
  // launches it, unless it was aborted or the session ended meanwhile. Out of memory on the way
  // completes the fetch with resource_exhausted.
  void start_transfer(std::shared_ptr<detail::FetchState> state,
                      std::shared_ptr<TransportManager> transport,
                      std::vector<MutableBuffer> targets, FetchOptions options);
  // start_transfer's allocating part: `pending` gets its checksum and combine state, then
  // launch(). May throw std::bad_alloc before launch().
  void prepare_transfer(const std::shared_ptr<detail::FetchState>& state,
                        std::shared_ptr<TransportManager> transport,
                        std::vector<MutableBuffer> targets, FetchOptions options,
                        PendingFetch pending);
  // Hands fetch `id` to its transport's channel and asks the peer for it; without the channel
  // (it broke meanwhile) the fetch fails with transport_unavailable, without memory for it with
  // resource_exhausted. `targets`: where the transport lands the bytes; `stream`: the combine of
  // a transport that combines.
  void launch(uint64_t id, PendingFetch pending, std::vector<MutableBuffer> targets,
              CombineFn stream);
  // Sends the peer the Fetch for request `id` of `ref` over `transport` (with the time left to
  // `deadline` as the owner's wait for a name). May throw std::bad_alloc.
  void request(uint64_t id, const TransportManager& transport, const ObjectRef& ref,
               Clock::time_point deadline);
  // The second half of restart(), once the new channel is open (`open_ec`: or not): launches
  // fetch `pending` again as request `id`, unless it was aborted meanwhile; fails it with `ec`
  // (the broken channel's error) if no channel could be opened, or with the session's if it ended.
  void relaunch(uint64_t id, PendingFetch pending, std::error_code ec, std::error_code open_ec);
  // The request id that fetch `id` (FetchRequest::id) runs under now: a restart gives it a new one.
  uint64_t wire_id(uint64_t id) const;

  SessionLink& link_;
  mem::Pool& pool_;
  std::unordered_map<uint64_t, PendingFetch> fetches_;
  // Fetches with a deadline that wait for their transport's channel (a first open, or a new one
  // after a restart), by FetchRequest::id: their deadline runs from their start all the same.
  struct Waiting {
    std::weak_ptr<detail::FetchState> state;
    Clock::time_point started, deadline;
  };
  std::unordered_map<uint64_t, Waiting> waiting_;
  // Fetches started again (restart()): FetchRequest::id -> the request id they run under.
  std::unordered_map<uint64_t, uint64_t> restarted_;
};

}  // namespace ferry
