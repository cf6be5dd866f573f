// QuiesceBoard: queue pairs that failed or closed with READs outstanding and are not destroyed
// yet, per peer (internal to the RDMA transport). A new queue pair to that peer is set up, and
// the fetches a session's close ended complete (RdmaTransport::when_quiet), only once they are.
//
// The error state takes no new work and flushes what is outstanding, but the memory a posted
// READ writes stays the queue pair's until the pair has completed that READ or been destroyed:
// rxe goes on placing response data it had already taken in. A fetch started again over a new
// pair writes the same targets, so the new pair waits until the reaper has destroyed the failed
// one (RdmaChannel's destructor retires the callback add() returns right after its queue pair),
// or until a bound has passed (the reaper may be busy with the queue pairs of a dead peer; a pair
// that stalled places nothing). Thread-safe; the transport and its channels share one board.
#pragma once

#include <boost/asio/any_io_executor.hpp>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "ferry/net/loop_gate.h"
#include "ferry/net/transport.h"

namespace ferry::rdma {

class QuiesceBoard : public std::enable_shared_from_this<QuiesceBoard> {
 public:
  // Posts from the reaper's thread go through `loop_gate` (TransportEnv::loop_gate; null:
  // straight): once the context's loop has run its last, what they would have run is dropped
  // on that thread instead (a closed context's waiters, the cancel of a timer that went with its
  // loop). Nothing here keeps an executor of the loop past that: the reaper may run long after
  // the context, and its io_context, are gone.
  explicit QuiesceBoard(std::shared_ptr<LoopGate> loop_gate = nullptr)
      : loop_gate_(std::move(loop_gate)) {}

  // A failed or closed queue pair of `peer` with READs outstanding. Returns the callback that says
  // it is destroyed (once; any thread). Without that callback, the pair counts as quiet `bound`
  // after this call (a timer on `executor`, logged). Any thread.
  std::function<void()> add(const void* peer, const boost::asio::any_io_executor& executor,
                            std::chrono::milliseconds bound);
  // Runs `then` on `link`'s strand once no failed queue pair of that peer is still to be
  // destroyed: inline when none is and this thread runs in the strand, else posted to it (from
  // here, the reaper's thread or the bound's executor). Dropped, on that thread, once the loop
  // has run its last or the session is gone (`then` is for a peer that no longer has one; a
  // `then` that needs the session holds it). Any thread.
  void when_quiet(PeerLink& link, std::function<void()> then);

 private:
  // One failed pair of `peer` is quiet.
  void quiet(const void* peer);

  struct Peer {
    int pending = 0;  // failed pairs not yet quiet
    std::vector<std::function<void()>> waiters;
  };
  const std::shared_ptr<LoopGate> loop_gate_;
  std::mutex mu_;
  std::unordered_map<const void*, Peer> peers_;
};

}  // namespace ferry::rdma
